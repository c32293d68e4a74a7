"""The spend ceiling (`--eval-max-cost`): whether one more attempt may start.

One pure function decides (:func:`ceiling_reached`); :class:`SpendCeiling` only keeps the
counts it reads. An attempt is admitted while what was spent plus what the attempts in flight
are expected to cost, plus the expected cost of the new one, stays under the ceiling; the
expected cost of an attempt is the mean of the finished ones (or the caller's prior, e.g. the
last comparable run's per-case cost, before any has finished). An attempt already running is
never cut short: the money it spends is spent either way, and a half attempt is no evidence.

The ceiling bounds one session's spend: `--eval-resume` of a run a ceiling stopped starts its
own count, so the same ceiling finishes the run in instalments.
"""

from __future__ import annotations

import threading

from pytest_evalloop.model_api.pricing import Usage


def expected_attempt_cost(spent: float, finished: int, prior: float | None) -> float:
    """What one attempt is expected to cost: the mean so far, else the prior, else 0."""
    if finished > 0:
        return spent / finished
    return prior or 0.0


GO = "go"
WAIT = "wait"


def admission(
    ceiling: float, spent: float, in_flight: int, per_attempt: float, settled: int
) -> str:
    """Whether one more attempt may start: `GO`, `WAIT` (for an estimate), or the reason the
    ceiling stops the run.

    With no estimate yet (nothing settled, no prior) one attempt runs alone and the others wait
    for its cost, so a first wave of `--eval-concurrency` attempts cannot overshoot unseen.
    Otherwise an attempt starts while `spent + (in_flight + 1) * per_attempt < ceiling`.
    """
    if per_attempt <= 0:
        if settled == 0 and in_flight > 0:
            return WAIT
        if spent < ceiling:
            return GO
    elif spent + (in_flight + 1) * per_attempt < ceiling:
        return GO
    return ceiling_reason(ceiling, spent, in_flight, per_attempt)


def ceiling_reason(ceiling: float, spent: float, in_flight: int, per_attempt: float) -> str:
    """The run's abort reason when the ceiling stops it."""
    return (
        f"spend ceiling --eval-max-cost={ceiling:g} reached: ${spent:.4f} spent, "
        f"{in_flight} attempt(s) in flight at ~${per_attempt:.4f} each; "
        "finish the run with --eval-resume (and a new ceiling)"
    )


class SpendCeiling:
    """This session's spend against `--eval-max-cost` (thread-safe: results land from
    callbacks)."""

    def __init__(self, ceiling: float, prior: float | None = None) -> None:
        self.ceiling = ceiling
        self.prior = prior
        self.spent = 0.0
        self.finished = 0
        self.in_flight = 0
        self.unpriced = 0
        """Attempts whose cost is unknown (a model without a price): counted at the mean."""
        self._lock = threading.Lock()

    def admit(self) -> str:
        """`GO` (the attempt is now in flight), `WAIT`, or the reason the ceiling stops it."""
        with self._lock:
            per = expected_attempt_cost(self.spent, self.finished, self.prior)
            settled = self.finished + self.unpriced
            decision = admission(self.ceiling, self.spent, self.in_flight, per, settled)
            if decision == GO:
                self.in_flight += 1
            return decision

    def settle(self, cost: float | None) -> None:
        """An admitted attempt ended having cost `cost` (None: unknown, not counted as 0)."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)
            if cost is None:
                self.unpriced += 1
                return
            self.spent += cost
            self.finished += 1


# Shapes of a typical attempt for the estimate without a comparable run: the answerer's turns,
# what each turn adds to the conversation, and the judge's case prompt (tokens).
TYPICAL_TURNS = 5
TURN_GROWTH_TOKENS = 800
JUDGE_CASE_TOKENS = 1500
OUTPUT_TOKENS_PER_CALL = 200


def rough_attempt_usage(prefix_tokens: int, doctrine_tokens: int) -> tuple[Usage, Usage]:
    """(answerer, judge) usage of one typical attempt from token counts alone, uncached: the
    answerer resends its growing conversation on each of `TYPICAL_TURNS` turns."""
    answerer_in = sum(prefix_tokens + t * TURN_GROWTH_TOKENS for t in range(TYPICAL_TURNS))
    answerer = Usage(
        input_tokens=answerer_in,
        output_tokens=TYPICAL_TURNS * OUTPUT_TOKENS_PER_CALL,
        calls=TYPICAL_TURNS,
    )
    judge = Usage(
        input_tokens=doctrine_tokens + JUDGE_CASE_TOKENS,
        output_tokens=OUTPUT_TOKENS_PER_CALL,
        calls=1,
    )
    return answerer, judge


def estimate_line(attempts: int, per_attempt: float | None, source: str) -> str:
    """What `--eval-estimate` prints."""
    if per_attempt is None:
        return (
            f"evalloop estimate: {attempts} attempt(s); cost unknown ({source}); nothing was paid"
        )
    return (
        f"evalloop estimate: {attempts} attempt(s) x ${per_attempt:.4f} = "
        f"${attempts * per_attempt:.2f} ({source}); nothing was paid"
    )
