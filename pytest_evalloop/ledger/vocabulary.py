"""The diagnose vocabulary (seed 004, eval-diagnose), verbatim: components in ladder order,
owners, codes per component, sufficiency and issue statuses, and the one rule that checks a
diagnosis against them (the ledger contract's `issue` events and the conductor's check of an
agent's reply both call it). The contract re-exports every name here."""

from __future__ import annotations

from typing import Literal

COMPONENTS = (
    "dataset",
    "agent-call",
    "get_context/model",
    "get_context/retrieval",
    "construction",
    "model-definition",
)
"""The component ladder, in the order a diagnosis walks it."""
Component = Literal[
    "dataset",
    "agent-call",
    "get_context/model",
    "get_context/retrieval",
    "construction",
    "model-definition",
]
Owner = Literal["model", "retrieval", "agent-skill", "dataset"]
"""No environment owner: an environment failure stops the run before diagnosis."""
OWNERS: tuple[str, ...] = ("model", "retrieval", "agent-skill", "dataset")
Sufficiency = Literal["sufficient", "insufficient", "unknown"]
Level = Literal["high", "medium", "low"]
IssueStatus = Literal["open", "batched", "fixed", "rejected", "deferred"]
ISSUE_STATUSES: tuple[str, ...] = ("open", "batched", "fixed", "rejected", "deferred")
_CONSTRUCTION_CODES = ("WRONG-PICK", "SCOPE", "GRAIN", "FILTER-LITERAL", "CONVENTION", "SYNTAX")
CODES: dict[str, tuple[str, ...]] = {
    "dataset": ("BAD-REFERENCE", "AMBIGUOUS-REFERENCE", "BAD-QUESTION", "CORRECT-SUPERSET"),
    "agent-call": (
        "NEVER-ASKED",
        "VAGUE",
        "QUESTION-VOCAB",
        "NO-DISAMBIG",
        "ASSUMED",
        "WRONG-TYPE-OR-SCOPE",
    ),
    "get_context/model": (
        "COVERAGE",
        "NOT-RETURNED",
        "LOW-RANK",
        "AMBIGUOUS",
        "GUIDANCE-NOT-RETRIEVED",
        "GUIDANCE-DECLINED",
    ),
    "get_context/retrieval": ("RETRIEVAL",),
    "construction": _CONSTRUCTION_CODES,
    # The seed gives model-definition no table of its own: "bad grain, wrong join key,
    # inverted filter" are the construction table's semantic codes, found in the definition
    # rather than in the query. SYNTAX and WRONG-PICK are the agent's acts, never a definition's.
    "model-definition": ("SCOPE", "GRAIN", "FILTER-LITERAL", "CONVENTION"),
}
"""The codes each component's primary code is drawn from (contributing codes: any of them)."""
ALL_CODES: frozenset[str] = frozenset(c for codes in CODES.values() for c in codes)


def issue_problems(
    component: str, owner: str, primary_code: str, contributing: list[str], sufficiency: str
) -> list[str]:
    """What is wrong with a diagnosis against the vocabulary (empty: nothing).

    One rule for the ledger's `issue` events and the conductor's check of an agent's reply.
    """
    problems = []
    if component not in COMPONENTS:
        hint = " (write the component's name, never C1/C2/C3)" if component[:1] == "C" else ""
        problems.append(f"component {component!r} is not one of {list(COMPONENTS)}{hint}")
    elif primary_code not in CODES[component]:
        where = "of no component" if primary_code not in ALL_CODES else f"not of {component}"
        problems.append(
            f"primary_code {primary_code!r} is {where}; {component} takes {list(CODES[component])}"
        )
    if owner not in OWNERS:
        problems.append(f"owner {owner!r} is not one of {list(OWNERS)} (no environment owner)")
    elif (owner == "dataset") != (component == "dataset"):
        problems.append(f"owner {owner!r} with component {component!r}: dataset goes with dataset")
    unknown = [c for c in contributing if c not in ALL_CODES]
    if unknown:
        problems.append(f"contributing_codes {unknown} are not codes of the skill")
    if component == "construction" and sufficiency != "sufficient":
        problems.append(
            f"construction with sufficiency {sufficiency!r}: construction needs the context "
            "proven sufficient (the rendered tool result kept); otherwise an earlier rung"
        )
    return problems


RunMode = Literal["measure", "triage", "improve"]
MODES: tuple[str, ...] = ("measure", "triage", "improve")
"""How far the loop walked on a run, in order: answered and judged, diagnosed, improved."""


def raised_mode(current: str | None, step: str) -> RunMode:
    """The run's mode once `step` touched it: the further of the two, so diagnosing a run an
    improve already touched leaves it `improve` (a mode never goes back)."""
    known = current if current in MODES else "measure"
    return MODES[max(MODES.index(known), MODES.index(step))]  # type: ignore[return-value]
