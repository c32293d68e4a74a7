"""The diagnose vocabulary (seed 004, eval-diagnose), verbatim: components in ladder order,
owners, the code table (each code's component, its owners and what it claims of the entity it
names), sufficiency and issue statuses, and the one rule that checks a diagnosis against them
(the ledger contract's `issue` and `diagnosis` events, the conductor's check of an agent's
reply, `evalloop validate` and `evalloop improve` all call it). The contract re-exports the
names its events use; docs/diagnose.md shows `CODE_TABLE` and a test holds the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

COMPONENTS = (
    "dataset",
    "agent-call",
    "get_context/model",
    "get_context/retrieval",
    "construction",
    "model-definition",
)
"""The component ladder, in the order a diagnosis walks it."""
JUDGE: Literal["judge"] = "judge"
"""The component and owner of a judge suspect: the re-executed rows match the golden, yet the
judge said no_match. Not a rung of the ladder: the conductor routes such a case before any
agent sees it, a person's review settles it, and no edit ever follows from it."""
ALL_COMPONENTS: tuple[str, ...] = (JUDGE, *COMPONENTS)
Component = Literal[
    "judge",
    "dataset",
    "agent-call",
    "get_context/model",
    "get_context/retrieval",
    "construction",
    "model-definition",
]
Owner = Literal["model", "retrieval", "agent-skill", "dataset", "judge"]
"""No environment owner: an environment failure stops the run before diagnosis."""
OWNERS: tuple[str, ...] = ("model", "retrieval", "agent-skill", "dataset", JUDGE)
Sufficiency = Literal["sufficient", "insufficient", "unknown"]
Level = Literal["high", "medium", "low"]
IssueStatus = Literal["open", "batched", "fixed", "rejected", "deferred"]
ISSUE_STATUSES: tuple[str, ...] = ("open", "batched", "fixed", "rejected", "deferred")

Claim = Literal["-", "absent", "returned", "returned-unused", "unused"]
"""What a code says of the entity a diagnosis names, when that entity is one the case needs
(`-`: nothing the ledger can check). `absent`: it never came back; `returned`: it came back;
`returned-unused`: it came back and the final query left it out; `unused`: the final query
left it out (whether or not it came back)."""


@dataclass(frozen=True)
class Code:
    """One row of the code table."""

    component: str
    code: str
    owners: tuple[str, ...]
    """Who may own an issue of this code: the seed's owner column (`model or agent-skill`
    where the seed makes it depend on what the docs said)."""
    claim: Claim
    when: str


_M, _S, _R, _D = ("model",), ("agent-skill",), ("retrieval",), ("dataset",)
_MS = ("model", "agent-skill")
# fmt: off
CODE_TABLE: tuple[Code, ...] = (
    Code(JUDGE, "JUDGE-SUSPECT", (JUDGE,), "-", "the rows match the golden; only the judge said no"),
    Code("dataset", "BAD-REFERENCE", _D, "-", "the golden itself is wrong, the defect named"),
    Code("dataset", "AMBIGUOUS-REFERENCE", _D, "-", "the key is untrustworthy, no unique fix"),
    Code("dataset", "BAD-QUESTION", _D, "-", "unanswerable as written, or underspecified"),
    Code("dataset", "CORRECT-SUPERSET", _D, "-", "every expected row present, plus context"),
    Code("agent-call", "NEVER-ASKED", _MS, "-", "no ask targeted a needed concept (model: nothing prompted it)"),
    Code("agent-call", "VAGUE", _S, "-", "compound or generic utterances, nothing could rank"),
    Code("agent-call", "QUESTION-VOCAB", _MS, "-", "parroted the question (model: the data's words undocumented)"),
    Code("agent-call", "NO-DISAMBIG", _M, "-", "two plausible candidates, never resolved"),
    Code("agent-call", "ASSUMED", _MS, "-", "assumed a scope or convention (model: nothing warned)"),
    Code("agent-call", "WRONG-TYPE-OR-SCOPE", _S, "-", "asked with the wrong target type or scope"),
    Code("get_context/model", "COVERAGE", _M, "absent", "no representing entity anywhere (a missing join too)"),
    Code("get_context/model", "NOT-RETURNED", _M, "absent", "it exists, the ask was on target, it never came back"),
    Code("get_context/model", "LOW-RANK", _M, "returned-unused", "returned, buried under noise the agent skipped"),
    Code("get_context/model", "AMBIGUOUS", _M, "-", "several near-identical candidates"),
    Code("get_context/model", "GUIDANCE-NOT-RETRIEVED", _M, "returned", "entities came back, their guidance did not"),
    Code("get_context/model", "GUIDANCE-DECLINED", _M, "returned", "guidance retrieved and judged inapplicable"),
    Code("get_context/retrieval", "RETRIEVAL", _R, "unused", "model right, ask on target, ranking still failed"),
    Code("construction", "WRONG-PICK", _MS, "returned", "needed entity returned, another used (model: indistinguishable)"),
    Code("construction", "SCOPE", _MS, "-", "right entities, wrong population (model: rule undocumented)"),
    Code("construction", "GRAIN", _MS, "-", "right entities, wrong grain"),
    Code("construction", "FILTER-LITERAL", _MS, "-", "a filter literal not the stored form"),
    Code("construction", "CONVENTION", _M, "-", "right data, wrong convention: expose a named measure"),
    Code("construction", "SYNTAX", _S, "-", "could not express it; execute errors; never submitted"),
    # The seed gives model-definition no table of its own: "bad grain, wrong join key,
    # inverted filter" are the construction table's semantic codes, found in the definition
    # rather than in the query. SYNTAX and WRONG-PICK are the agent's acts, never a definition's.
    Code("model-definition", "SCOPE", _M, "-", "the definition's population is wrong"),
    Code("model-definition", "GRAIN", _M, "-", "the definition's grain or join key is wrong"),
    Code("model-definition", "FILTER-LITERAL", _M, "-", "the definition's filter is wrong"),
    Code("model-definition", "CONVENTION", _M, "-", "the definition or its doc states a false rule"),
)
# fmt: on
"""The law: every code, the component it belongs to, who may own it, and what it claims of the
entity a diagnosis names. Only `model` owners go on to an edit."""
_BY_KEY: dict[tuple[str, str], Code] = {(c.component, c.code): c for c in CODE_TABLE}
CODES: dict[str, tuple[str, ...]] = {
    component: tuple(c.code for c in CODE_TABLE if c.component == component)
    for component in ALL_COMPONENTS
}
"""The codes each component's primary code is drawn from (contributing codes: any of them)."""
ALL_CODES: frozenset[str] = frozenset(c.code for c in CODE_TABLE)
LATE_RUNGS = ("construction", "model-definition")
"""The rungs that need every needed entity to have come back."""


TABLE_HEAD = ("component", "code", "owner", "its named entity", "when")


def code_table_markdown(rows: tuple[Code, ...] = CODE_TABLE) -> str:
    """The code table as docs/diagnose.md and the diagnose doctrine show it."""
    lines = [
        "| " + " | ".join(TABLE_HEAD) + " |",
        "|" + "---|" * len(TABLE_HEAD),
    ]
    for c in rows:
        cells = (c.component, c.code, " or ".join(c.owners), c.claim, c.when)
        lines.append(
            "| " + " | ".join(f"`{x}`" if i < 2 else x for i, x in enumerate(cells)) + " |"
        )
    return "\n".join(lines)


def code_of(component: str, code: str) -> Code | None:
    """The table's row for a component's code (None: not a code of that component)."""
    return _BY_KEY.get((component, code))


def owner_problem(component: str, owner: str, primary_code: str) -> str | None:
    """Why the code table does not give `primary_code` of `component` to `owner` (None: it
    does, or the code is not the table's, which `issue_problems` says)."""
    row = code_of(component, primary_code)
    if row is None or owner not in OWNERS or owner in row.owners:
        return None
    return (
        f"owner {owner!r} for {primary_code} ({component}): the code table gives "
        f"{primary_code} to {' or '.join(row.owners)} (docs/diagnose.md, the code table)"
    )


GRANDFATHERED_VERSIONS = frozenset({"1"})
"""Diagnose versions written before the code table's owners were enforced: their lines keep
validating (an owner the table does not give is a warning on read, `reader`), and improve
still refuses such an issue."""


def issue_problems(
    component: str,
    owner: str,
    primary_code: str,
    contributing: list[str],
    sufficiency: str,
    *,
    owner_law: bool = True,
) -> list[str]:
    """What is wrong with a diagnosis against the vocabulary and the code table (empty:
    nothing); `owner_law=False` leaves out the table's owners (a grandfathered line).

    One rule for the ledger's `issue` and `diagnosis` events, the conductor's check of an
    agent's reply, `evalloop validate` and `evalloop improve`.
    """
    problems = []
    row = code_of(component, primary_code)
    if component not in ALL_COMPONENTS:
        hint = " (write the component's name, never C1/C2/C3)" if component[:1] == "C" else ""
        problems.append(f"component {component!r} is not one of {list(ALL_COMPONENTS)}{hint}")
    elif row is None:
        where = "of no component" if primary_code not in ALL_CODES else f"not of {component}"
        problems.append(
            f"primary_code {primary_code!r} is {where}; {component} takes {list(CODES[component])}"
        )
    wrong_owner = owner_problem(component, owner, primary_code)
    if owner not in OWNERS:
        problems.append(f"owner {owner!r} is not one of {list(OWNERS)} (no environment owner)")
    elif wrong_owner and owner_law:
        problems.append(wrong_owner)
    elif (component in (_D[0], JUDGE) or owner in (_D[0], JUDGE)) and owner != component:
        # What even a grandfathered line must keep: dataset and judge own themselves.
        problems.append(f"owner {owner!r} with component {component!r}: {component} owns itself")
    unknown = [c for c in contributing if c not in ALL_CODES]
    if unknown:
        problems.append(f"contributing_codes {unknown} are not codes of the skill")
    if component == "construction" and sufficiency != "sufficient":
        problems.append(
            f"construction with sufficiency {sufficiency!r}: construction needs the context "
            "proven sufficient (the rendered tool result kept); otherwise an earlier rung"
        )
    return problems


def event_problems(event: Any) -> list[str]:
    """`issue_problems` of an `issue` or `diagnosis` event (grandfathered by its version)."""
    return issue_problems(
        event.component or "",
        event.owner or "",
        event.primary_code or "",
        event.contributing_codes,
        event.sufficiency or "",
        owner_law=event.diagnose_version not in GRANDFATHERED_VERSIONS,
    )


RunMode = Literal["measure", "triage", "improve"]
MODES: tuple[str, ...] = ("measure", "triage", "improve")
"""How far the loop walked on a run, in order: answered and judged, diagnosed, improved."""


def raised_mode(current: str | None, step: str) -> RunMode:
    """The run's mode once `step` touched it: the further of the two, so diagnosing a run an
    improve already touched leaves it `improve` (a mode never goes back)."""
    known = current if current in MODES else "measure"
    return MODES[max(MODES.index(known), MODES.index(step))]  # type: ignore[return-value]
