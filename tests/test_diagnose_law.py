"""What a diagnosis may claim (issue 43): the code table is the law, the evidence decides both
ways, one cluster is one cause, and an issue stays inside its set. Pure functions, no model
call: the conductor's checks against their statement, for random evidence and random replies.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalloop.diagnose import agent, bounds, claims, conductor
from pytest_evalloop.diagnose import evidence as ev
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import vocabulary as vocab
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing.fake_diagnoser import render_turn
from tests.test_diagnose_agent import obj

DOCS = Path(__file__).resolve().parents[1] / "docs" / "diagnose.md"
ENTITIES = ["measure:order_items:total_sales", "dimension:products:brand", "join:a:b", "source:b:b"]


# --- the table -------------------------------------------------------------------------------


def docs_table() -> list[tuple[str, ...]]:
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(r"<!-- code-table -->\n(.*?)<!-- /code-table -->", text, re.S)
    assert block is not None, "docs/diagnose.md lost its <!-- code-table --> block"
    rows = []
    for line in block.group(1).strip().splitlines()[2:]:  # past the head and the rule
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        rows.append(tuple(cells))
    return rows


def test_the_docs_table_of_codes_and_owners_is_the_one_the_code_reads() -> None:
    code = [(c.component, c.code, " or ".join(c.owners), c.claim, c.when) for c in vocab.CODE_TABLE]
    assert docs_table() == code
    # And the vocabulary every check reads is derived from it, nothing typed twice.
    assert {(c, k) for c, codes in vocab.CODES.items() for k in codes} == {
        (c.component, c.code) for c in vocab.CODE_TABLE
    }
    assert set(vocab.OWNERS) == {o for c in vocab.CODE_TABLE for o in c.owners}


def test_the_agent_is_shown_the_table_it_is_held_to_without_the_judges_row() -> None:
    shown = agent.render_doctrine()
    for c in vocab.CODE_TABLE:
        line = f"| `{c.component}` | `{c.code}` | {' or '.join(c.owners)} | {c.claim} |"
        assert (line in shown) == (c.component != vocab.JUDGE), line
    assert "{{CODE_TABLE}}" not in shown


@pytest.mark.parametrize("row", vocab.CODE_TABLE, ids=lambda c: f"{c.component}:{c.code}")
def test_every_code_takes_exactly_the_owners_the_table_gives(row: vocab.Code) -> None:
    sufficiency = "sufficient" if row.component == "construction" else "unknown"
    for owner in vocab.OWNERS:
        problems = vocab.issue_problems(row.component, owner, row.code, [], sufficiency)
        assert (problems == []) == (owner in row.owners), (owner, problems)


# --- the evidence decides, both ways ------------------------------------------------------


@st.composite
def evidences(draw: st.DrawFn) -> ev.Evidence:
    """Evidence as `evidence.gather` builds it: its eligibility and sufficiency follow from
    what came back (and whether the transcript was kept), judge_suspect from the rows."""
    ids = draw(st.lists(st.sampled_from(ENTITIES), unique=True, max_size=4))
    needed = []
    for entity in ids:
        back = draw(st.booleans())
        needed.append(
            ev.Needed(
                id=entity,
                group=draw(st.sampled_from([None, 0, 1])),
                delivery=draw(st.sampled_from(["exact", "sibling_source"])) if back else "missing",
                rank=draw(st.integers(1, 20)) if back else None,
                asked_by=None,
                used=draw(st.booleans()),
            )
        )
    kept = draw(st.booleans())
    gaps = [n for n in needed if n.group is None and n.delivery == "missing"]
    groups = {n.group for n in needed if n.group is not None}
    gaps += [
        g
        for g in groups
        if all(n.delivery == "missing" for n in needed if n.group == g)  # type: ignore[misc]
    ]
    complete = None if not needed else not gaps
    rows_match = draw(st.sampled_from([True, False, None]))
    verdict = draw(st.sampled_from(["no_match", None]))
    settled_by = draw(st.sampled_from([None, "Rita"]))
    return ev.Evidence(
        qid="q",
        sample=None,
        verdict=verdict,
        judge_why="off",
        gold_status="verified",
        submitted=verdict is not None,
        needed=needed,
        rows_match=rows_match,
        settled_by=settled_by,
        judge_suspect=ev.judge_suspect(rows_match, verdict, settled_by),
        eligible=complete is True,
        sufficiency="insufficient"
        if complete is False
        else ("sufficient" if complete and kept else "unknown"),
    )


@st.composite
def replies(draw: st.DrawFn, named: tuple[str, ...] = ()) -> dict[str, Any]:
    """A reply: mostly in the table's words (so many are accepted), sometimes not; its entity
    mostly one of `named` (the evidence's needed entities, whose claims the ledger checks)."""
    component = draw(st.sampled_from([*vocab.ALL_COMPONENTS, "C1"]))
    codes = vocab.CODES.get(component) or ("MADE-UP",)
    code = draw(st.sampled_from(codes) | st.sampled_from(sorted(vocab.ALL_CODES)))
    row = vocab.code_of(component, code)
    owners = row.owners if row is not None else vocab.OWNERS
    owner = draw(st.sampled_from(owners) | st.sampled_from([*vocab.OWNERS, "environment"]))
    return obj(
        component,
        code,
        owner,
        draw(st.sampled_from(["sufficient", "insufficient", "unknown"])),
        draw(
            (st.sampled_from(named) if named else st.nothing())
            | st.sampled_from([*ENTITIES, "the rate convention"])
        ),
    )


def agrees(reply: dict[str, Any], e: ev.Evidence) -> bool:
    """The issue's statement of what a diagnosis may claim, written out on its own."""
    component, code, owner = reply["component"], reply["primary_code"], reply["owner"]
    sufficiency = reply["sufficiency"]
    row = vocab.code_of(component, code)
    if row is None or owner not in row.owners:
        return False  # the code table is the law
    if component == "construction" and sufficiency != "sufficient":
        return False
    suspect = e.rows_match is True and e.verdict == "no_match" and e.settled_by is None
    if suspect != (component == "judge"):
        return False  # rows that match are the judge's, and only they are
    singles_missing = any(n.group is None and n.delivery == "missing" for n in e.needed)
    group_missing = any(
        all(m.delivery == "missing" for m in e.needed if m.group == n.group)
        for n in e.needed
        if n.group is not None
    )
    if component in ("construction", "model-definition") and (singles_missing or group_missing):
        return False  # a late rung while something needed never came back
    if sufficiency == "sufficient" and e.sufficiency != "sufficient":
        return False
    if sufficiency == "insufficient" and e.eligible:
        return False  # every needed entity came back
    named = [n for n in e.needed if n.id == reply["entity"]]
    if named:
        back, used = named[0].delivery != "missing", named[0].used
        if row.claim == "absent" and back:
            return False
        if row.claim == "returned" and not back:
            return False
        if row.claim == "returned-unused" and (not back or used):
            return False
        if row.claim == "unused" and used:
            return False
    return True


@settings(max_examples=500)
@given(evidence=evidences(), data=st.data())
def test_no_accepted_diagnosis_contradicts_its_evidence(
    evidence: ev.Evidence, data: st.DataObject
) -> None:
    reply = data.draw(replies(tuple(n.id for n in evidence.needed)))
    text = str(render_turn(reply)[1])
    accepted, problems = agent.check_case(text, evidence)
    # Accepted exactly when it agrees: nothing the evidence contradicts gets through, and
    # nothing it allows is refused.
    assert (accepted is not None) == agrees(reply, evidence), problems
    assert (accepted is None) == bool(problems)


def member(qid: str, reply: dict[str, Any], evidence: ev.Evidence) -> ledger.DiagnosisEvent:
    return ledger.DiagnosisEvent(
        qid=qid,
        sample=None,
        phase="baseline",
        status="diagnosed",
        component=reply["component"],
        primary_code=reply["primary_code"],
        owner=reply["owner"],
        sufficiency=reply["sufficiency"],
        severity="high",
        confidence="low",
        diagnosis="d",
        entity=reply["entity"],
        evidence=evidence.model_dump(mode="json"),
    )


@settings(max_examples=200)
@given(st.lists(st.tuples(evidences(), replies()), min_size=1, max_size=5))
def test_a_cluster_line_never_prints_a_sufficiency_its_eligibility_contradicts(
    cases: list[tuple[ev.Evidence, dict[str, Any]]],
) -> None:
    accepted = [(e, r) for e, r in cases if agrees(r, e)]
    if not accepted:
        return
    # A cluster the conductor would accept: one cause.
    accepted = [
        (e, r) for e, r in accepted if claims.cause_key(r) == claims.cause_key(accepted[0][1])
    ]
    by_qid = {f"q{i}": member(f"q{i}", r, e) for i, (e, r) in enumerate(accepted)}
    gathered = {f"q{i}": e for i, (e, _) in enumerate(accepted)}
    issue = conductor._issue("r", "c", list(by_qid), "root", "why", by_qid, gathered)
    eligible, total = (int(x) for x in (issue.eligibility or "").split(" / "))
    assert not claims.sufficiency_contradicts(issue.sufficiency, eligible, total), issue


# --- one cluster, one cause -------------------------------------------------------------------

KEYS = [
    ("get_context/model", "model", "COVERAGE", "dimension:products:brand"),
    ("get_context/model", "model", "COVERAGE", "the rate convention"),
    ("get_context/model", "model", "NOT-RETURNED", "dimension:products:brand"),
    ("agent-call", "model", "ASSUMED", "the rate convention"),
]


@given(
    keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6),
    partition=st.lists(st.integers(0, 3), min_size=6, max_size=6),
    spelling=st.lists(st.sampled_from(["", " ", "`"]), min_size=6, max_size=6),
)
def test_an_accepted_clustering_joins_only_cases_of_one_cause(
    keys: list[tuple[str, str, str, str]], partition: list[int], spelling: list[str]
) -> None:
    diagnosed = {
        f"q{i}": {
            "component": c,
            "owner": o,
            "primary_code": k,
            # The same entity written with other spacing, case or backticks is the same cause.
            "entity": f"{spelling[i]}{e.upper() if i % 2 else e}{spelling[i]}",
        }
        for i, (c, o, k, e) in enumerate(keys)
    }
    groups: dict[int, list[str]] = {}
    for i, qid in enumerate(diagnosed):
        groups.setdefault(partition[i], []).append(qid)
    clusters = [
        {
            "cluster_id": f"c{n}",
            "qids": qids,
            "owner": diagnosed[qids[0]]["owner"],
            "component": diagnosed[qids[0]]["component"],
            "rootCause": "one thing",
        }
        for n, qids in groups.items()
    ]
    text = str(render_turn({"clusters": clusters, "reasoning": "r"})[1])
    reply, problems = agent.check_clusters(text, diagnosed)
    one_cause = all(
        len({(c, o, k, e.casefold()) for c, o, k, e in (keys[int(q[1:])] for q in qids)}) == 1
        for qids in groups.values()
    )
    assert (reply is not None) == one_cause, problems
    if not one_cause:
        assert any("joins different causes" in p for p in problems)


# --- bounds -------------------------------------------------------------------------------------


def case(qid: str, split: str) -> sets.Case:
    return sets.Case.model_validate({"qid": qid, "question": f"{qid}?", "split": split})


@given(
    splits=st.dictionaries(st.sampled_from("abcdef"), st.sampled_from(["dev", "holdout"])),
    qids=st.lists(st.sampled_from("abcdefxyz"), min_size=1, max_size=4, unique=True),
    owner=st.sampled_from(vocab.OWNERS),
)
def test_an_issue_rests_on_cases_of_its_set_and_a_model_issue_on_a_dev_case(
    splits: dict[str, str], qids: list[str], owner: str
) -> None:
    cases = {q: case(q, s) for q, s in splits.items()}
    problems = bounds.issue_bounds(qids, owner, cases)
    unknown = [q for q in qids if q not in cases]
    known = [q for q in qids if q in cases]
    holdout_only = owner == "model" and bool(known) and all(cases[q].split != "dev" for q in known)
    assert len(problems) == bool(unknown) + holdout_only
    if unknown:
        assert all(q in problems[0] for q in unknown)
    if holdout_only:
        assert all(q in problems[-1] for q in known) and "holdout" in problems[-1]


CLAIMS = [c for c in vocab.CODE_TABLE if c.claim != "-"]


@pytest.mark.parametrize("row", CLAIMS, ids=lambda c: f"{c.component}:{c.code}:{c.claim}")
@settings(max_examples=150)
@given(evidence=evidences(), data=st.data())
def test_what_a_code_says_of_its_entity_is_what_the_ledger_shows(
    row: vocab.Code, evidence: ev.Evidence, data: st.DataObject
) -> None:
    # The same property, aimed: every code that says something of its entity, naming one the
    # case needs (the random replies above reach each such row only now and then).
    if not evidence.needed:
        return
    reply = {
        **data.draw(replies()),
        "component": row.component,
        "primary_code": row.code,
        "owner": row.owners[0],
        "entity": data.draw(st.sampled_from([n.id for n in evidence.needed])),
    }
    accepted, problems = agent.check_case(str(render_turn(reply)[1]), evidence)
    assert (accepted is not None) == agrees(reply, evidence), problems


def brand_back() -> ev.Evidence:
    brand = ev.Needed(
        id="dimension:products:brand",
        group=None,
        delivery="exact",
        rank=10,
        asked_by=1,
        used=True,
    )
    return ev.Evidence(
        qid="q",
        sample=None,
        verdict="no_match",
        judge_why="off",
        gold_status="verified",
        submitted=True,
        needed=[brand],
        rows_match=False,
        eligible=True,
        sufficiency="sufficient",
    )


@pytest.mark.parametrize(
    "entity",
    [
        "dimension:products:brand",
        "`Dimension:Products:Brand`",
        "products.brand",
        "the doc of products.brand and of users.age",
    ],
)
def test_an_entity_named_any_checkable_way_is_checked(entity: str) -> None:
    coverage = {**COVERAGE_REPLY, "entity": entity}
    reply, problems = agent.check_case(str(render_turn(coverage)[1]), brand_back())
    assert reply is None
    assert problems == [
        "COVERAGE says dimension:products:brand never came back; the evidence: "
        "dimension:products:brand (exact, rank 10, used)"
    ]


def test_an_entity_named_in_prose_only_is_no_reference_the_ledger_can_check() -> None:
    # The documented limit: prose is not checked against the ledger (a missing join, a
    # convention), though the sufficiency and judge rules still hold.
    coverage = {**COVERAGE_REPLY, "entity": "the brand doc"}
    reply, _ = agent.check_case(str(render_turn(coverage)[1]), brand_back())
    assert reply is not None


@pytest.mark.parametrize("entity", ["", "   ", "\n\t"])
def test_an_empty_entity_is_refused(entity: str) -> None:
    reply, problems = agent.check_case(
        str(render_turn({**COVERAGE_REPLY, "entity": entity})[1]), brand_back()
    )
    assert reply is None and "entity" in problems[0]


COVERAGE_REPLY = obj("get_context/model", "COVERAGE", "model", "sufficient", "x")


def test_an_issue_without_cases_rests_on_nothing() -> None:
    assert bounds.issue_bounds([], "dataset", {}) == [
        "it names no case (an issue rests on the cases it names)"
    ]


def test_the_review_queue_page_keeps_run_text_inert() -> None:
    from pytest_evalloop.review.review import Queued
    from pytest_evalloop.review.view import queue_page

    evil = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    page = queue_page([Queued(f"r{evil}", f"q{evil}", None, f"i{evil}", evil, evil)])
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "default-src 'none'" in page  # and no script of ours to allow
