"""How a case changed between two runs: the one rule of a comparison.

A case's side in a run is one word (:func:`side_word`: its outcome word from
:mod:`aggregates`, each door out of a decision told apart), and :func:`transition` reads a
baseline side and a current side as better, worse, stable, undecided now (a lost decision),
neither, or dropped. The flip table, targeted mode, the paired tests and every gate classify a
case's change by it, so no two views can disagree on what a change was.
"""

from __future__ import annotations

from typing import Literal

from pytest_evalloop.measure.aggregates import (
    ANSWER_ERROR,
    ANSWERER_DID_LESS,
    JUDGE_UNPARSEABLE,
    OUT_OF_EVERY_AGGREGATE,
    VERDICTS,
    Outcome,
)

SideWord = Literal[
    Outcome, "not_submitted", "contamination_unknown", "judge_unparseable", "answer_error"
]
"""A case's side in a comparison: its outcome word, each door out of a decision told apart
(`not_submitted`, `contamination_unknown`, `judge_unparseable`, `answer_error`)."""

WORSE_AFTER_A_PASS: frozenset[str] = frozenset(
    {"no_match", "not_submitted", "contamination_unknown", "contaminated", ANSWER_ERROR}
)
"""What a case that passed in the baseline may become that counts as **worse**: a fail, and
every way the answerer itself left it unanswered (no final query, no host log covering the
answer, a contaminated answer, an answer too big or malformed for the harness to judge)."""
LOST_AFTER_A_PASS: frozenset[str] = frozenset(
    {"near_match", "needs_human", JUDGE_UNPARSEABLE, "unscored", "gold_wrong", "harness_error"}
)
"""What else it may become: **undecided now**, a decision the baseline had and the current run
lacks. Not known to be worse, but it may hide one: gates read it as worse before accepting."""


def side_word(verdict: str | None, reason: str | None, excluded: str | None) -> SideWord:
    """The word of one case's side in a comparison (see `comparison.CaseSide`)."""
    if excluded in OUT_OF_EVERY_AGGREGATE:
        if excluded == "harness_error" and reason == ANSWER_ERROR:
            return ANSWER_ERROR  # type: ignore[return-value]
        return excluded  # type: ignore[return-value]
    if verdict == "needs_human" and reason == JUDGE_UNPARSEABLE:
        return JUDGE_UNPARSEABLE  # type: ignore[return-value]
    if verdict in VERDICTS:
        return verdict  # type: ignore[return-value]
    return reason if reason in ANSWERER_DID_LESS else "unscored"  # type: ignore[return-value]


Transition = Literal[
    "better", "worse", "stable_pass", "stable_fail", "undecided", "neither", "dropped"
]
DROP_ORDER: tuple[Outcome, ...] = ("contaminated", "gold_wrong", "harness_error")
"""Why a case is dropped, in the order a reason wins when both sides have one."""


def transition(before: SideWord, after: SideWord) -> tuple[Transition, str | None]:
    """How a case changed between a baseline side and a current side, and the word that names
    the change where the kind alone does not (the drop reason; the undecided side's word).

    The one rule of a comparison. From a baseline pass: `match` is a stable pass; a fail, or
    any way the answerer left the case unanswered (`WORSE_AFTER_A_PASS`), is **worse** (doing
    less, cheating or breaking the harness never passes a gate); anything else is
    **undecided** (`LOST_AFTER_A_PASS`: a lost decision, which gates read as worse before they
    accept). Otherwise a side out of every aggregate drops the case (the first of
    `DROP_ORDER`; an answer error is a harness error there); no_match -> match is better;
    no_match -> no_match a stable fail; anything else is neither: a baseline fail that is
    undecided now hides no regression, and a baseline without a decision has none to lose.
    """
    if before == "match":
        if after == "match":
            return "stable_pass", None
        if after in WORSE_AFTER_A_PASS:
            return "worse", None
        return "undecided", after
    sides = {_dropped_as(before), _dropped_as(after)}
    for reason in DROP_ORDER:
        if reason in sides:
            return "dropped", reason
    if before == "no_match":
        if after == "match":
            return "better", None
        if after == "no_match":
            return "stable_fail", None
    return "neither", None


def _dropped_as(word: str) -> str:
    return "harness_error" if word == ANSWER_ERROR else word
