"""What a diagnosis may claim, given the mechanical evidence of its case, and what a cluster
may join.

Pure functions, one rule each, that the conductor applies before it accepts anything an agent
says (and a Hypothesis test holds to their statement): the evidence decides both ways. Rows
that match the golden make the case the judge's (a judge suspect), and nothing else; a case
whose rows do not match is never the judge's. A late rung needs every needed entity back. A
sufficiency the evidence contradicts is refused, `sufficient` with a needed entity missing and
`insufficient` with every one delivered alike. A code that says something of the entity it
names (never came back, came back, left unused) is refused when the ledger shows otherwise.
Each refusal quotes the evidence it rests on, so the retry (and a person) can see why.

A cluster is a claim that one change fixes all its cases: it may join cases only when their
component, owner, primary code and named entity (or convention) agree (`cause_key`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pytest_evalloop.diagnose.evidence import Evidence, Needed
from pytest_evalloop.ledger.vocabulary import JUDGE, LATE_RUNGS, code_of


def norm(text: str | None) -> str:
    """A named entity or convention as clusters compare it: case, spacing and backticks aside."""
    return " ".join((text or "").strip().strip("`").split()).casefold()


def quote(n: Needed) -> str:
    """One needed entity as the evidence has it: `id (route, rank r, used|unused)`."""
    if n.delivery == "missing":
        return f"{n.id} (never came back)"
    rank = f", rank {n.rank}" if n.rank is not None else ""
    return f"{n.id} ({n.delivery}{rank}, {'used' if n.used else 'unused'})"


def gaps(evidence: Evidence) -> list[str]:
    """The needed entities that never came back and that nothing else covers: a required one,
    or a whole requiredAnyOf group (any member back covers the group)."""
    out = [n.id for n in evidence.needed if n.group is None and n.delivery == "missing"]
    groups: dict[int, list[Needed]] = {}
    for n in evidence.needed:
        if n.group is not None:
            groups.setdefault(n.group, []).append(n)
    for members in groups.values():
        if all(m.delivery == "missing" for m in members):
            out.append("one of " + " | ".join(m.id for m in members))
    return out


_REFERENCE = re.compile(r"[\w]+(?:[:.][\w]+){1,2}")


def named(entity: str | None, evidence: Evidence) -> list[Needed]:
    """The needed entities a diagnosis's `entity` names: by id (`kind:source:name`) or as
    `source.name` / `source:name`, alone or inside its words (a name alone, or prose about it,
    is no reference the ledger can check)."""
    said = set(_REFERENCE.findall(norm(entity)))
    found = []
    for n in evidence.needed:
        parts = n.id.casefold().split(":")
        forms = {n.id.casefold()}
        if len(parts) == 3:
            forms |= {f"{parts[1]}.{parts[2]}", f"{parts[1]}:{parts[2]}"}
        if forms & said:
            found.append(n)
    return found


def _not_the_judges(evidence: Evidence) -> str:
    if evidence.settled_by is not None:
        return f"a person ({evidence.settled_by}) settled the verdict"
    if evidence.rows_match is None:
        return "there are no rows to compare with the golden"
    if evidence.rows_match is False:
        shapes = ", ".join(f"{s.shape}: {s.detail}" for s in evidence.shapes)
        return f"the rows differ from the golden ({shapes or 'a golden column is missing'})"
    return f"the judge said {evidence.verdict!r}, not no_match"


def contradictions(
    component: str, primary_code: str, sufficiency: str, entity: str | None, evidence: Evidence
) -> list[str]:
    """Where a diagnosis claims what its evidence contradicts (empty: nothing)."""
    problems = []
    if evidence.judge_suspect and component != JUDGE:
        problems.append(
            f"{component} on a judge suspect: the re-executed rows match the golden (every "
            f"golden column, no failure shape) and only the judge said no_match "
            f"({evidence.judge_why or 'no why given'}): the case is the judge's, for a "
            "person's review, never a diagnosis of the model, the answerer or retrieval"
        )
    elif component == JUDGE and not evidence.judge_suspect:
        problems.append(
            f"component judge where {_not_the_judges(evidence)}: the judge component is only "
            "for rows that match the golden"
        )
    missing = gaps(evidence)
    if component in LATE_RUNGS and missing:
        problems.append(
            f"{component} while needed entities never came back ({', '.join(missing)}): "
            "an entity that was never returned is an earlier rung (agent-call or get_context)"
        )
    if sufficiency == "sufficient" and evidence.sufficiency != "sufficient":
        why = (
            f"never came back: {', '.join(missing)}"
            if missing
            else "the rendered tool results were not kept, or the case names no needed entity"
        )
        problems.append(
            f"sufficiency 'sufficient' where the evidence says {evidence.sufficiency!r} "
            f"({why}): sufficiency is proven from what came back and was kept, not assumed"
        )
    if sufficiency == "insufficient" and evidence.eligible:
        problems.append(
            "sufficiency 'insufficient' where every needed entity came back ("
            + "; ".join(quote(n) for n in evidence.needed if n.delivery != "missing")
            + "): say 'sufficient' when the rendered results were kept, else 'unknown'"
        )
    problems += _claim_problems(component, primary_code, entity, evidence)
    return problems


_SAYS = {
    "absent": "never came back",
    "returned": "came back",
    "returned-unused": "came back and was left unused",
    "unused": "was left out of the final query",
}


def _claim_problems(
    component: str, primary_code: str, entity: str | None, evidence: Evidence
) -> list[str]:
    row = code_of(component, primary_code)
    if row is None or row.claim == "-":
        return []
    problems = []
    for n in named(entity, evidence):
        back, used = n.delivery != "missing", n.used
        wrong = {
            "absent": back,
            "returned": not back,
            "returned-unused": not back or used,
            "unused": used,
        }[row.claim]
        if wrong:
            problems.append(
                f"{primary_code} says {n.id} {_SAYS[row.claim]}; the evidence: {quote(n)}"
            )
    return problems


# --- clusters ------------------------------------------------------------------------------


def cause_key(diagnosis: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """What a cluster's cases must share: component, owner, primary code, named entity."""
    return (
        str(diagnosis.get("component") or ""),
        str(diagnosis.get("owner") or ""),
        str(diagnosis.get("primary_code") or ""),
        norm(diagnosis.get("entity")),
    )


def describe(qid: str, diagnosis: Mapping[str, Any]) -> str:
    """One case's cause as a refusal names it."""
    return f"{qid} ({diagnosis.get('primary_code')}, {diagnosis.get('entity') or 'no entity'})"


def mixed_cause(qids: Iterable[str], diagnosed: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why these cases are not one cause (None: they are, or some are unknown here)."""
    members = [q for q in qids if q in diagnosed]
    keys = {cause_key(diagnosed[q]) for q in members}
    if len(keys) <= 1:
        return None
    return "; ".join(describe(q, diagnosed[q]) for q in members)


def split_by_cause(
    qids: Iterable[str], diagnosed: Mapping[str, Mapping[str, Any]]
) -> list[list[str]]:
    """The cases grouped by `cause_key`, in their first appearance's order."""
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for q in qids:
        groups.setdefault(cause_key(diagnosed[q]), []).append(q)
    return list(groups.values())


def sufficiency_contradicts(sufficiency: str, eligible: int, total: int) -> bool:
    """Whether an issue's sufficiency contradicts its own construction eligibility: sufficient
    while some case lacked a needed entity, or insufficient while every case had them all."""
    if total == 0:
        return False
    return (sufficiency == "sufficient" and eligible < total) or (
        sufficiency == "insufficient" and eligible == total
    )
