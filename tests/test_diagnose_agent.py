"""`evalloop diagnose` end to end: a real run of a small copy of the example set, then the
diagnose agent and the clustering call scripted on the loopback fake, through the real SDK.

Covers the vocabulary check, the retry-then-undiagnosed path, a reply that skips the ladder, a
probe that errors, dev-only (a holdout question never reaches a diagnose request), no diagnosis
of contaminated, harness-error or gold_wrong attempts, --max-cases, re-runs, statuses.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop import cli
from pytest_evalloop.diagnose import agent, claims
from pytest_evalloop.diagnose import evidence as ev
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic, FakeRequest, ScriptSpec
from pytest_evalloop.testing.fake_diagnoser import render_turn
from tests.reportruns import example_rows, run_pytest
from tests.sealing import closed_as_is
from tests.test_run import ORACLE, make_set
from tests.test_view import Served

FAILING = ["ecom_department_sales_2022", "ecom_cancellation_rate", "ecom_order_count"]
JUDGE_WRONG = "ecom_top_brands_2022"
GOLD_WRONG = "ecom_accounts_never_ordered"
HOLDOUT = "ecom_top_countries"
PASSING = "ecom_customer_accounts"
QIDS = [*FAILING, JUDGE_WRONG, GOLD_WRONG, HOLDOUT, PASSING]
WRONG_SQL = {
    # every year, not 2022: the same departments, other figures
    FAILING[0]: "SELECT products.department AS department, round(sum(order_items.sale_price), "
    "2) AS total_sales FROM order_items JOIN products ON order_items.product_id = products.id "
    "GROUP BY 1 ORDER BY 1",
    # the share of lines, not of orders: 14.83 against 14.93
    FAILING[1]: "SELECT round(100.0 * count(*) FILTER (WHERE status = 'Cancelled') / count(*), "
    "2) AS cancelled_order_pct FROM order_items",
    # lines, not orders
    FAILING[2]: "SELECT count(*) AS orders FROM order_items",
    HOLDOUT: "SELECT 1 AS x",
}
OFF_TARGET = {FAILING[2]: "customer age"}
"""What the answerer asked the context tool instead of the question: its needed measure never
came back, so that case's sufficiency is `insufficient` (the others' every entity came back)."""
CONVENTION = "the default reporting convention (which year, orders or lines)"


def wrong(qid: str) -> list[dict[str, Any]]:
    sql = WRONG_SQL[qid]
    return [
        {"tool": "get_context", "input": {"query": OFF_TARGET.get(qid, "{question}")}},
        {"tool": "execute_query", "input": {"sql": sql}},
        {"text": f"The answer follows.\n\nFinal query:\n```sql\n{sql}\n```"},
    ]


def obj(
    component: str,
    code: str,
    owner: str,
    sufficiency: str = "sufficient",
    entity: str = CONVENTION,
) -> dict[str, Any]:
    return {
        "probes": [{"why": "the figure", "query": "SELECT 1", "result": "1"}],
        "reasoning": "ruled out the dataset and the ask",
        "component": component,
        "primary_code": code,
        "contributing_codes": [],
        "owner": owner,
        "sufficiency": sufficiency,
        "severity": "high",
        "confidence": "medium",
        "diagnosis": f"{code} on {component}",
        "entity": entity,
        "sharedWith": "the reporting convention",
    }


ASSUMED = obj("agent-call", "ASSUMED", "model")
NEVER_ASKED = obj(
    "agent-call", "NEVER-ASKED", "agent-skill", "insufficient", "measure:orders:order_count"
)
CLUSTERS = {
    "clusters": [
        {
            "cluster_id": "unstated-convention",
            "qids": FAILING[:2],
            "owner": "model",
            "component": "agent-call",
            "codes": ["ASSUMED"],
            "rootCause": "No doc states the default reporting convention.",
            "evidence": "both picked a convention nothing stated",
            "confidence": "high",
        },
        {
            "cluster_id": "never-asked-orders",
            "qids": FAILING[2:],
            "owner": "agent-skill",
            "component": "agent-call",
            "codes": ["NEVER-ASKED"],
            "rootCause": "Asked for customer age, not orders.",
            "evidence": "one case",
            "confidence": "low",
        },
    ],
    "reasoning": "kept never-asked-orders apart: another owner",
}


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run: three dev failures, a judge-wrong dev case (its rows are the golden's),
    a gold_wrong, a failing holdout, a pass."""
    root = tmp_path_factory.mktemp("diagnose")
    set_dir = make_set(root, QIDS)
    rows = example_rows()
    judge: dict[str, Any] = {
        "default": {"verdict": "match", "confidence": 9},
        "by_question": {
            rows[q]["question"]: {"verdict": "no_match", "confidence": 9, "why": f"off on {q}"}
            for q in [*FAILING, JUDGE_WRONG, HOLDOUT]
        },
    }
    judge["by_question"][rows[GOLD_WRONG]["question"]] = {
        "verdict": "no_match",
        "confidence": 9,
        "why": "golden wrong",
        "gold_status": "verified_wrong",
        "gold_note": "4712 against 4711",
    }
    spec = ScriptSpec.model_validate(
        {
            "cases_file": str(set_dir / "cases.jsonl"),
            "answerer": {
                "default": ORACLE,
                "by_question": {rows[q]["question"]: wrong(q) for q in WRONG_SQL},
            },
            "judge": judge,
        }
    )
    with FakeAnthropic(spec.policy()) as fake:
        done = run_pytest(fake, set_dir, "--eval-label=r1")
    run_dir = set_dir / "runs" / "r1"
    assert (run_dir / "run.json").is_file(), done.stdout + done.stderr
    return run_dir


@pytest.fixture
def run_dir(stored_run: Path, tmp_path: Path) -> Path:
    """A private copy of the stored run's set, its run inside."""
    set_copy = tmp_path / "shop"
    shutil.copytree(stored_run.parent.parent, set_copy)
    return set_copy / "runs" / "r1"


def script(
    fake: FakeAnthropic, cases: dict[str, list[Any]], cluster: list[Any] | None = None
) -> list[FakeRequest]:
    """Script the diagnoser; returns the requests it receives as the policy saw them (with
    their messages: what each retry was told)."""
    by = {f"Case {q}.": turns for q, turns in cases.items()}
    policy = ScriptSpec.model_validate(
        {"diagnoser": {"by_substring": by, "cluster": cluster or [CLUSTERS]}}
    ).policy()
    seen: list[FakeRequest] = []

    def spy(request: FakeRequest) -> Any:
        seen.append(request)
        return policy(request)

    fake.policy = spy
    return seen


def diagnose(run_dir: Path, *args: str) -> int:
    return cli.main(["diagnose", str(run_dir), "--no-probes", *args])


def valid_script() -> dict[str, list[Any]]:
    return {FAILING[0]: [ASSUMED], FAILING[1]: [ASSUMED], FAILING[2]: [NEVER_ASKED]}


JUDGE_ISSUE = "r1:judge-ecom-top-brands-2022"
MODEL_ISSUE = "r1:unstated-convention"
SKILL_ISSUE = "r1:never-asked-orders"


def test_diagnose_writes_one_issue_per_cluster_in_the_seeds_words(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    out = capsys.readouterr().out
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    issues = read.issues()
    assert list(issues) == [
        MODEL_ISSUE,
        f"r1:golden-{GOLD_WRONG}",
        JUDGE_ISSUE,
        SKILL_ISSUE,
    ]  # most cases first; model before other owners at equal size
    model = issues[MODEL_ISSUE]
    assert (model.component, model.owner, model.primary_code, model.entity) == (
        "agent-call",
        "model",
        "ASSUMED",
        CONVENTION,
    )
    assert sorted(model.qids) == sorted(FAILING[:2])
    assert (model.sufficiency, model.eligibility) == ("sufficient", "2 / 2")
    dataset = issues[f"r1:golden-{GOLD_WRONG}"]
    assert (dataset.owner, dataset.primary_code) == ("dataset", "BAD-REFERENCE")
    judge = issues[JUDGE_ISSUE]
    assert (judge.component, judge.owner, judge.primary_code) == ("judge", "judge", "JUDGE-SUSPECT")
    assert {s.status for s in read.issue_statuses().values()} == {"open"}
    # Dev only, never the gold_wrong case nor the judge's: the three dev failures, one clustering.
    requests = fake.calls("diagnoser")
    assert len(requests) == 4
    asked = " ".join((r.question or "") for r in requests)
    rows = example_rows()
    assert rows[HOLDOUT]["question"] not in asked and HOLDOUT not in asked
    assert rows[GOLD_WRONG]["question"] not in asked
    assert f"Case {JUDGE_WRONG}." not in asked
    info = json.loads((run_dir / "run.json").read_text())
    assert info["diagnoserModel"] and info["costs"]["diagnoser"]["input_tokens"] > 0
    assert "components:" in out and "agent-call               3" in out
    assert "judge                    1" in out
    assert "codes: ASSUMED; sufficiency sufficient; eligibility 2 / 2" in out
    assert "kept apart: kept never-asked-orders apart" in out
    assert "model: evalloop improve" in out and "dataset: the golden side door" in out
    assert "judge: a person's review in evalloop view" in out
    assert cli.main(["validate", str(run_dir)]) == cli.EXIT_OK


def test_an_unknown_code_is_asked_again_once(fake: FakeAnthropic, run_dir: Path) -> None:
    turns = valid_script()
    turns[FAILING[2]] = [{**NEVER_ASKED, "primary_code": "C1"}, NEVER_ASKED]
    script(fake, turns)
    assert diagnose(run_dir) == cli.EXIT_OK
    read = ledger_reader.read_run(run_dir)
    [d] = [d for d in read.of_kind("diagnosis") if d.qid == FAILING[2]]
    assert (d.status, d.primary_code, d.attempts) == ("diagnosed", "NEVER-ASKED", 2)
    assert "refused once: primary_code 'C1'" in (d.reason or "")
    seen = [r.turn for r in fake.calls("diagnoser") if f"Case {FAILING[2]}." in (r.question or "")]
    assert seen == [1, 2]  # the refusal is answered in the same fresh conversation


def test_refused_twice_is_undiagnosed_with_why(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    turns = valid_script()
    turns[FAILING[2]] = [
        obj("environment", "X", "environment"),
        obj("agent-call", "MADE-UP", "agent-skill"),
    ]
    script(fake, turns, [{**CLUSTERS, "clusters": CLUSTERS["clusters"][:1]}])
    assert diagnose(run_dir) == cli.EXIT_OK
    read = ledger_reader.read_run(run_dir)
    [d] = [d for d in read.of_kind("diagnosis") if d.qid == FAILING[2]]
    assert d.status == "undiagnosed" and "MADE-UP" in (d.reason or "")
    assert FAILING[2] not in {q for i in read.issues().values() for q in i.qids}
    assert f"undiagnosed: {FAILING[2]}" in capsys.readouterr().out
    assert read.errors == []


def test_a_reply_that_skips_the_ladder_is_refused(fake: FakeAnthropic, run_dir: Path) -> None:
    # The transcript is gone: sufficiency is unknown, so construction cannot be proven.
    for transcript in (run_dir / "artifacts").glob(f"{FAILING[0]}/transcript.json"):
        transcript.unlink()
    closed_as_is(run_dir)  # a run that closed without it
    construction = obj("construction", "GRAIN", "agent-skill", "sufficient")
    turns = valid_script()
    turns[FAILING[0]] = [construction, construction]
    script(fake, turns)
    assert diagnose(run_dir) == cli.EXIT_OK
    read = ledger_reader.read_run(run_dir)
    [d] = [d for d in read.of_kind("diagnosis") if d.qid == FAILING[0]]
    assert d.status == "undiagnosed"
    assert "sufficiency 'sufficient' where the evidence says 'unknown'" in (d.reason or "")
    assert d.evidence["sufficiency"] == "unknown"


def test_a_probe_that_errors_is_recorded(fake: FakeAnthropic, run_dir: Path) -> None:
    turns = valid_script()
    bad = {"probe": "execute_query", "input": {"sql": "SELECT nope FROM nowhere"}}
    turns[FAILING[0]] = [bad, ASSUMED]
    script(fake, turns)
    assert cli.main(["diagnose", str(run_dir)]) == cli.EXIT_OK
    read = ledger_reader.read_run(run_dir)
    [d] = [d for d in read.of_kind("diagnosis") if d.qid == FAILING[0]]
    assert d.status == "diagnosed"
    [probe] = [p for p in d.probes if p.get("tool") == "execute_query"]
    assert probe["input"] == bad["input"] and probe["error"]
    offered = set(fake.calls("diagnoser")[0].tools)
    assert offered == {"get_context", "execute_query"}


def test_contaminated_and_harness_error_attempts_are_never_diagnosed(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    events = run_dir / "events.jsonl"
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    for e in lines:
        if e.get("qid") == FAILING[0] and e["kind"] in ("attempt", "score"):
            e["contaminated"] = True
            if e["kind"] == "score":
                e["verdict"], e["reason"] = None, "contaminated"
    lines = [e for e in lines if not (e.get("qid") == FAILING[1] and e["kind"] == "score")]
    events.write_text("".join(json.dumps(e) + "\n" for e in lines))
    closed_as_is(run_dir)  # a run that closed so
    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    asked = " ".join((r.question or "") for r in fake.calls("diagnoser"))
    assert f"Case {FAILING[0]}." not in asked and f"Case {FAILING[1]}." not in asked
    out = capsys.readouterr().out
    assert "1 contaminated" in out and "1 harness error" in out


def test_max_cases_bounds_the_spend(fake: FakeAnthropic, run_dir: Path, capsys: Any) -> None:
    script(fake, valid_script())
    assert diagnose(run_dir, "--max-cases", "1") == cli.EXIT_OK
    cases = [r for r in fake.calls("diagnoser") if "Case " in (r.question or "")]
    assert len(cases) == 1
    assert "beyond --max-cases 1" in capsys.readouterr().out


def test_a_rerun_replaces_its_own_lines_and_a_persons_status_stands(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    issue_id = SKILL_ISSUE
    assert (
        cli.main(["issue", str(run_dir), issue_id, "--status", "deferred", "--note", "later"]) == 0
    )
    others = [
        x
        for x in (run_dir / "events.jsonl").read_text().splitlines()
        if json.loads(x)["kind"] in ("attempt", "tool_call", "score", "retrieval_score")
    ]
    assert diagnose(run_dir) == cli.EXIT_OK
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    assert len(read.of_kind("issue")) == 4 and len(read.of_kind("clustering")) == 1
    assert len(read.of_kind("diagnosis")) == 5
    assert read.issue_statuses()[issue_id].status == "deferred"
    after = [
        x
        for x in (run_dir / "events.jsonl").read_text().splitlines()
        if json.loads(x)["kind"] in ("attempt", "tool_call", "score", "retrieval_score")
    ]
    assert after == others
    capsys.readouterr()
    assert cli.main(["issues", str(run_dir)]) == 0
    listed = capsys.readouterr().out
    assert f"deferred  {issue_id}" in listed and f"open      {MODEL_ISSUE}" in listed
    assert cli.main(["issue", str(run_dir), "r1:nothing", "--status", "fixed"]) == 2


def test_the_doctrine_is_pinned_by_its_version() -> None:
    from importlib import resources

    from pytest_evalloop.diagnose import agent

    pins = json.loads(
        resources.files("pytest_evalloop.diagnose").joinpath("doctrine_versions.json").read_text()
    )
    # A changed doctrine without a DIAGNOSE_VERSION bump (and a new line here) fails.
    assert pins[agent.DIAGNOSE_VERSION] == agent.doctrine_sha()
    assert agent.render_doctrine().startswith(f"DIAGNOSE_VERSION: {agent.DIAGNOSE_VERSION}")


def test_the_report_shows_each_diagnosis_and_the_clusters(
    fake: FakeAnthropic, run_dir: Path
) -> None:
    from pytest_evalloop.report import html, report

    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    built = report.build(run_dir)
    [case] = [c for c in built.cases if c.qid == FAILING[0]]
    assert case.diagnosis is not None
    assert (case.diagnosis["component"], case.diagnosis["primary_code"]) == (
        "agent-call",
        "ASSUMED",
    )
    assert [i["issue_id"] for i in built.issues][0] == MODEL_ISSUE
    page = html.write_report(run_dir).read_text(encoding="utf-8")
    assert 'id="clusters"' in page and MODEL_ISSUE in page
    assert "kept apart: kept never-asked-orders apart" in page


# --- issue 43: the evidence decides, one cluster one cause, the code table is the law --------


def diagnosis_of(run_dir: Path, qid: str) -> Any:
    [d] = [d for d in ledger_reader.read_run(run_dir).of_kind("diagnosis") if d.qid == qid]
    return d


def reply_text(turn: dict[str, Any]) -> str:
    return str(render_turn(turn)[1])


def test_a_case_the_judge_got_wrong_is_a_judge_suspect_never_a_model_gap(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    # Issue 43, repro 1: the case answered with its own modelQuery, the judge scripted no_match;
    # the reply the repro scripted for it is never even asked for.
    repro = obj("get_context/model", "COVERAGE", "model", "insufficient")
    script(fake, {**valid_script(), JUDGE_WRONG: [repro]})
    assert diagnose(run_dir) == cli.EXIT_OK
    out = capsys.readouterr().out
    d = diagnosis_of(run_dir, JUDGE_WRONG)
    assert (d.status, d.component, d.primary_code, d.owner) == (
        "judge",
        "judge",
        "JUDGE-SUSPECT",
        "judge",
    )
    assert d.evidence["rows_match"] is True and d.evidence["shapes"] == []
    assert d.sufficiency == d.evidence["sufficiency"] == "sufficient"
    asked = " ".join((r.question or "") for r in fake.calls("diagnoser"))
    assert f"Case {JUDGE_WRONG}." not in asked
    assert f"judge suspect: {JUDGE_WRONG}: the re-executed rows match the golden" in out
    assert "codes: JUDGE-SUSPECT; sufficiency sufficient; eligibility 1 / 1" in out
    # Had an agent said what the repro scripted, the evidence refuses it, quoting itself.
    evidence = ev.Evidence.model_validate(d.evidence)
    reply, problems = agent.check_case(reply_text(repro), evidence)
    assert reply is None
    said = " | ".join(problems)
    assert "get_context/model on a judge suspect" in said
    assert "sufficiency 'insufficient' where every needed entity came back" in said
    assert "dimension:products:brand (exact, rank 10, used)" in said
    # Never offered to improve: refused before any request.
    assert cli.main(["improve", str(run_dir), "--issue", JUDGE_ISSUE, "--no-probes"]) == 2
    err = capsys.readouterr().err
    assert "owned by 'judge'" in err and "a person's review in evalloop view" in err
    assert fake.calls("improver") == []


def test_insufficient_with_every_needed_entity_back_is_refused_with_the_evidence(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    insufficient = obj("agent-call", "ASSUMED", "model", "insufficient")
    turns = valid_script()
    turns[FAILING[0]] = [insufficient, ASSUMED]  # refused, then a reply the evidence allows
    turns[FAILING[1]] = [insufficient, insufficient]  # refused twice: undiagnosed, with why
    turns[FAILING[2]] = [{**NEVER_ASKED, "sufficiency": "sufficient"}, NEVER_ASKED]
    seen = script(fake, turns)
    assert diagnose(run_dir) == cli.EXIT_OK
    out = capsys.readouterr().out
    first = diagnosis_of(run_dir, FAILING[0])
    assert (first.status, first.sufficiency, first.attempts) == ("diagnosed", "sufficient", 2)
    assert "refused once: sufficiency 'insufficient' where every needed entity came back (" in (
        first.reason or ""
    )
    assert "measure:order_items:total_sales (exact, rank 10, used)" in (first.reason or "")
    retry = [r for r in seen if f"Case {FAILING[0]}." in r.question]
    assert "every needed entity came back" in json.dumps(retry[1].messages)  # the agent saw why
    second = diagnosis_of(run_dir, FAILING[1])
    assert second.status == "undiagnosed"
    assert "dimension:orders:status (exact, rank 2, unused)" in (second.reason or "")
    third = diagnosis_of(run_dir, FAILING[2])
    assert (
        "refused once: sufficiency 'sufficient' where the evidence says 'insufficient' (never "
        "came back: one of measure:orders:order_count | measure:order_items:order_count)"
    ) in (third.reason or "")
    assert f"diagnosed on the retry: {FAILING[0]}" in out
    assert f"undiagnosed: {FAILING[1]}" in out
    # Every cluster line's sufficiency agrees with its own eligibility.
    assert "codes: ASSUMED; sufficiency sufficient; eligibility 1 / 1" in out
    assert "codes: NEVER-ASKED; sufficiency insufficient; eligibility 0 / 1" in out
    for issue in ledger_reader.read_run(run_dir).issues().values():
        eligible, total = (int(x) for x in (issue.eligibility or "0 / 0").split(" / "))
        assert not claims.sufficiency_contradicts(issue.sufficiency, eligible, total), issue


COVERAGE_SHARED = obj("get_context/model", "COVERAGE", "model", entity=CONVENTION)
COVERAGE_ORDERS = obj(
    "get_context/model", "COVERAGE", "model", "insufficient", "measure:orders:order_count"
)
MERGED = {
    "clusters": [
        {
            "cluster_id": "coverage-everything",
            "qids": FAILING,
            "owner": "model",
            "component": "get_context/model",
            "codes": ["COVERAGE"],
            "rootCause": "Coverage gaps.",
            "evidence": "all three are COVERAGE",
            "confidence": "high",
        }
    ],
    "reasoning": "merged the COVERAGE cases",
}
APART = {
    "clusters": [
        {**MERGED["clusters"][0], "cluster_id": "unstated-convention", "qids": FAILING[:2]},
        {**MERGED["clusters"][0], "cluster_id": "no-order-count", "qids": FAILING[2:]},
    ],
    "reasoning": "kept the order count apart: another entity",
}


def coverage_script() -> dict[str, list[Any]]:
    return {
        FAILING[0]: [COVERAGE_SHARED],
        FAILING[1]: [COVERAGE_SHARED],
        FAILING[2]: [COVERAGE_ORDERS],
    }


def test_a_merge_of_different_causes_is_refused_saying_which(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    # Issue 43, repro 2: a clustering reply merging COVERAGE cases about different entities.
    seen = script(fake, coverage_script(), [MERGED, APART])
    assert diagnose(run_dir) == cli.EXIT_OK
    out = capsys.readouterr().out
    read = ledger_reader.read_run(run_dir)
    assert sorted(read.issues()) == sorted(
        ["r1:unstated-convention", "r1:no-order-count", JUDGE_ISSUE, f"r1:golden-{GOLD_WRONG}"]
    )
    [clustering] = read.of_kind("clustering")
    assert (clustering.status, clustering.attempts) == ("clustered", 2)
    which = (
        f"cluster coverage-everything joins different causes: {FAILING[0]} (COVERAGE, {CONVENTION}); "
        f"{FAILING[1]} (COVERAGE, {CONVENTION}); {FAILING[2]} (COVERAGE, measure:orders:order_count)"
    )
    assert which in (clustering.reason or "") and which in out
    asked = [r for r in seen if "DIAGNOSE_STEP: clustering" in r.system]
    assert len(asked) == 2 and which in json.dumps(asked[1].messages)


def test_a_merge_refused_twice_is_split_by_cause(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    script(fake, coverage_script(), [MERGED, MERGED])
    assert diagnose(run_dir) == cli.EXIT_OK
    out = capsys.readouterr().out
    read = ledger_reader.read_run(run_dir)
    [clustering] = read.of_kind("clustering")
    assert clustering.status == "split"
    model = [i for i in read.issues().values() if i.owner == "model"]
    assert sorted(sorted(i.qids) for i in model) == [sorted(FAILING[:2]), FAILING[2:]]
    for issue in model:
        assert issue.evidence and issue.evidence.startswith("split from coverage-everything")
        assert len({claims.norm(diagnosis_of(run_dir, q).entity) for q in issue.qids}) == 1
    assert "clustering refused twice (" in out and "): split by cause" in out
    assert read.errors == []


def test_distinct_causes_are_never_sent_to_a_clustering_call(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    turns = valid_script()
    turns[FAILING[1]] = [{**ASSUMED, "entity": "the rate convention of orders.status"}]
    seen = script(fake, turns, [MERGED])
    assert diagnose(run_dir) == cli.EXIT_OK
    assert seen and not [r for r in seen if "DIAGNOSE_STEP: clustering" in r.system]
    read = ledger_reader.read_run(run_dir)
    assert all(len(i.qids) == 1 for i in read.issues().values())
    [clustering] = read.of_kind("clustering")
    assert "each case is a cluster of one (no clustering call)" in (clustering.reasoning or "")


def hand_written(run_dir: Path, *issues: dict[str, Any]) -> None:
    """Issues appended to a closed run by hand, as the repros did (then sealed again)."""
    with (run_dir / "events.jsonl").open("a", encoding="utf-8") as handle:
        for issue in issues:
            handle.write(json.dumps(issue) + "\n")
    closed_as_is(run_dir)


def issue_line(issue_id: str, qids: list[str], **change: Any) -> dict[str, Any]:
    return {
        "kind": "issue",
        "issue_id": issue_id,
        "qids": qids,
        "primary_code": "COVERAGE",
        "contributing_codes": [],
        "component": "get_context/model",
        "owner": "model",
        "sufficiency": "unknown",
        "diagnosis": "written by hand",
        **change,
    }


def test_a_codes_owner_is_the_code_tables(fake: FakeAnthropic, run_dir: Path, capsys: Any) -> None:
    # Issue 43, repro 3: RETRIEVAL owned by the model, from the agent and by hand.
    retrieval = obj("get_context/retrieval", "RETRIEVAL", "model")
    turns = valid_script()
    turns[FAILING[2]] = [retrieval, retrieval]
    script(fake, turns)
    assert diagnose(run_dir) == cli.EXIT_OK
    law = "owner 'model' for RETRIEVAL (get_context/retrieval): the code table gives RETRIEVAL to retrieval"
    d = diagnosis_of(run_dir, FAILING[2])
    assert d.status == "undiagnosed" and law in (d.reason or "")
    capsys.readouterr()
    by_hand = issue_line(
        "r1:retrieval-by-hand",
        [FAILING[0]],
        component="get_context/retrieval",
        primary_code="RETRIEVAL",
    )
    hand_written(run_dir, by_hand)
    assert cli.main(["validate", str(run_dir)]) == cli.EXIT_INVALID
    assert law in capsys.readouterr().out
    assert cli.main(["improve", str(run_dir), "--issue", "r1:retrieval-by-hand"]) == 2
    err = capsys.readouterr().err
    assert "issue r1:retrieval-by-hand breaks the ledger contract: " + law in err
    # Declared validly, then re-declared against the table: readers see only the valid line,
    # improve looks at both.
    hand_written(
        run_dir,
        issue_line("r1:twice", [FAILING[0]]),
        issue_line("r1:twice", [FAILING[0]], owner="retrieval"),
    )
    assert cli.main(["improve", str(run_dir), "--issue", "r1:twice"]) == 2
    assert "owner 'retrieval' for COVERAGE" in capsys.readouterr().err
    # A line diagnose v1 wrote still reads (with a warning), and improve still refuses it.
    hand_written(run_dir, {**by_hand, "issue_id": "r1:v1", "diagnose_version": "1"})
    assert cli.main(["improve", str(run_dir), "--issue", "r1:v1"]) == 2
    assert "issue r1:v1: " + law in capsys.readouterr().err
    assert fake.calls("improver") == []


def test_hand_written_issues_stay_inside_their_set_and_off_holdout(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    # Issue 43, repro 4: a qid in no set; a model issue whose only case is a holdout case.
    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    hand_written(
        run_dir,
        issue_line("r1:nowhere", ["ecom_nowhere", FAILING[0]]),
        issue_line("r1:holdout-only", [HOLDOUT]),
        issue_line(
            "r1:holdout-golden",
            [HOLDOUT],
            component="dataset",
            primary_code="BAD-REFERENCE",
            owner="dataset",
        ),
    )
    capsys.readouterr()
    assert cli.main(["validate", str(run_dir)]) == cli.EXIT_INVALID
    out = capsys.readouterr().out
    assert "issue 'r1:nowhere': qids not in the set's cases.jsonl: ecom_nowhere" in out
    holdout = f"a model issue resting only on holdout cases ({HOLDOUT})"
    assert f"issue 'r1:holdout-only': {holdout}" in out
    assert "r1:holdout-golden" not in out  # the side door may take a holdout golden
    for issue_id, said in (("r1:nowhere", "ecom_nowhere"), ("r1:holdout-only", holdout)):
        assert cli.main(["improve", str(run_dir), "--issue", issue_id]) == 2
        assert said in capsys.readouterr().err
    assert fake.calls("improver") == []


def test_diagnose_rewrites_the_runs_report(fake: FakeAnthropic, run_dir: Path, capsys: Any) -> None:
    # Issue 43, repro 5: the clusters were in report.html only after `evalloop report`.
    page = run_dir / "report.html"
    assert page.is_file() and MODEL_ISSUE not in page.read_text(encoding="utf-8")
    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    assert f"report: {page} (rewritten with the issues)" in capsys.readouterr().out
    text = page.read_text(encoding="utf-8")
    assert 'id="clusters"' in text and MODEL_ISSUE in text and JUDGE_ISSUE in text


def get(server: Served, path: str) -> str:
    with urllib.request.urlopen(server.url + path, timeout=60) as resp:
        return str(resp.read().decode("utf-8"))


def test_the_judge_suspect_end_to_end_reviewed_in_view_never_improved(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    server = Served(run_dir.parent)
    try:
        assert "review queue: 1 judge suspect(s) awaiting a person" in get(server, "/")
        [queued] = json.loads(get(server, "/api/review-queue"))
        assert (queued["run"], queued["qid"], queued["issue_id"]) == (
            "r1",
            JUDGE_WRONG,
            JUDGE_ISSUE,
        )
        assert queued["judge_why"] == f"off on {JUDGE_WRONG}"
        page = get(server, "/review/")
        assert f'data-qid="{JUDGE_WRONG}"' in page and 'href="../runs/r1/"' in page
        assert JUDGE_ISSUE in get(server, "/runs/r1/")  # the report the queue links to
        status, said = server.post(
            "/api/runs/r1/reviews",
            {"qid": JUDGE_WRONG, "verdict": "match", "why": "the rows are the golden's"},
        )
        assert status == 200 and "judge-regressions.jsonl" in said["message"], said
        assert json.loads(get(server, "/api/review-queue")) == []
    finally:
        server.close()
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    settled = read.issue_statuses()[JUDGE_ISSUE]
    assert (settled.status, settled.by) == ("fixed", "review")
    [fixture] = sets.load_regressions(run_dir.parent.parent).rows
    assert (fixture[1].qid, fixture[1].verdict) == (JUDGE_WRONG, "match")
    # Never offered to improve, before and after its review.
    assert cli.main(["improve", str(run_dir), "--issue", JUDGE_ISSUE, "--no-probes"]) == 2
    assert "owned by 'judge'" in capsys.readouterr().err
    assert fake.calls("improver") == []
    # Diagnosed again: a person's match is no failure; the judge's issue keeps its status.
    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    read = ledger_reader.read_run(run_dir)
    assert JUDGE_WRONG not in {d.qid for d in read.of_kind("diagnosis")}
    assert read.issue_statuses()[JUDGE_ISSUE].status == "fixed"
    # The fixture counts in the judge's agreement figures: check-judge re-judges it.
    rows = example_rows()
    fake.policy = ScriptSpec.model_validate(
        {
            "cases_file": str(run_dir.parent.parent / "cases.jsonl"),
            "judge": {
                "default": {"verdict": "match", "confidence": 9},
                "by_question": {
                    rows[JUDGE_WRONG]["question"]: {"verdict": "no_match", "confidence": 9}
                },
            },
        }
    ).policy()
    done = run_pytest(fake, run_dir.parent.parent, "--eval-check-judge")
    assert "raw agreement: 0% over 1 fixtures" in done.stdout, done.stdout + done.stderr


def test_a_judge_suspect_the_person_upheld_goes_up_the_ladder(
    fake: FakeAnthropic, run_dir: Path
) -> None:
    from pytest_evalloop.review.review import record_review

    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    done = record_review(
        run_dir, JUDGE_WRONG, "no_match", why="the prose names the wrong brand", reviewer="Rita"
    )
    assert done.fixture_id is not None  # agreeing with the judge on a suspect still counts
    assert ledger_reader.read_run(run_dir).issue_statuses()[JUDGE_ISSUE].status == "rejected"
    prose = obj("construction", "WRONG-PICK", "agent-skill", entity="dimension:products:brand")
    script(fake, {**valid_script(), JUDGE_WRONG: [prose]})
    assert diagnose(run_dir) == cli.EXIT_OK
    d = diagnosis_of(run_dir, JUDGE_WRONG)
    assert (d.status, d.component) == ("diagnosed", "construction")
    assert d.evidence["settled_by"] == "Rita" and d.evidence["judge_suspect"] is False


def test_rows_not_wholly_re_executed_show_no_judge_error(
    fake: FakeAnthropic, run_dir: Path
) -> None:
    # A capped result that happens to hold the golden's rows proves nothing about the rest.
    prediction = run_dir / "artifacts" / JUDGE_WRONG / "prediction.json"
    stored = json.loads(prediction.read_text(encoding="utf-8"))
    prediction.write_text(json.dumps({**stored, "truncated": True}), encoding="utf-8")
    closed_as_is(run_dir)
    brand = obj("construction", "WRONG-PICK", "agent-skill", entity="dimension:products:brand")
    script(fake, {**valid_script(), JUDGE_WRONG: [brand]})
    assert diagnose(run_dir) == cli.EXIT_OK
    d = diagnosis_of(run_dir, JUDGE_WRONG)
    assert (d.status, d.component) == ("diagnosed", "construction")
    assert d.evidence["rows_match"] is None and d.evidence["judge_suspect"] is False
