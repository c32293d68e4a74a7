"""Which scores count: the one rule every figure of a run is computed under.

Every number a run reports -- the terminal summary, `evalloop report`, the totals in
`run.json`, the flip table and the gate -- is counted from ledger events through this module,
so no two views can disagree on what a case was or whether it counts.

Each attempt gets one **outcome word**, decided by :func:`outcome` from its `score` event
(and its `attempt` event), in this order:

- ``contaminated``: the attempt or its score says ``contaminated: true`` -- the answerer
  reached the answer key, so its verdict (if any) says nothing about the model;
- ``harness_error``: an attempt with no score -- the harness could not finish it (endpoint
  down after retries, target dead, judge unreachable); such attempts are what an aborted run
  is made of;
- ``gold_wrong``: the judge showed the golden itself to be wrong (``gold_status:
  verified_wrong``), whatever verdict it gave against it;
- otherwise the judge's verdict: ``match``, ``no_match``, ``near_match``, ``needs_human``,
  or ``unscored`` for a null verdict (not submitted, golden not verified, ...).

The first three leave **every** aggregate (seed 004, ledger-schema): they are counted apart,
never in the pass rate, the recall mean, or a comparison. Of the rest only ``match`` and
``no_match`` are decisions; the pass rate is match / (match + no_match). ``near_match``,
``needs_human`` and ``unscored`` are counted and reported but are neither pass nor fail.
Retrieval recall is averaged over every attempt that stays in the aggregates (a near_match
attempt retrieved for real).

A pass rate is **withheld** when the run aborted (its verdicts are a biased subset), when its
ledger does not validate (status `invalid`: the counts themselves are in doubt) or when any
attempt was contaminated (the answer key was reachable). A run is a **harness failure** when
it aborted, is invalid, or more than 10% of its attempts were contaminated (any, on a run under
10 attempts): no model score may be published from it.

Statistics over repeats build on :class:`Counted`: each attempt's outcome and whether it
counts, one line per attempt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from pytest_evalloop.ledger import contract as ledger

if TYPE_CHECKING:
    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.ledger.reader import RunLedger

Outcome = Literal[
    "match",
    "no_match",
    "near_match",
    "needs_human",
    "unscored",
    "gold_wrong",
    "contaminated",
    "harness_error",
]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
"""Every outcome word, in the order a summary lists them (the order `Outcome` spells)."""
DECIDED: frozenset[str] = frozenset({"match", "no_match"})
OUT_OF_EVERY_AGGREGATE: frozenset[str] = frozenset({"gold_wrong", "contaminated", "harness_error"})
"""Outcomes that never enter a pass rate, a recall mean or a comparison."""

KINDS = frozenset({"attempt", "score", "retrieval_score"})
"""The event kinds a tally reads."""
RETRIEVAL_FIELDS = frozenset({"recall", "precision", "noise", "coverage"})
"""The `retrieval_score` keys a tally reads (a comparison's read has no retrieval events)."""
FIELDS = (
    frozenset({"verdict", "reason", "contaminated", "gold_status", "gold_note"}) | RETRIEVAL_FIELDS
)
"""The event keys a tally reads (with kind, qid and sample)."""

CONTAMINATION_LIMIT = 0.1
"""Above this fraction of contaminated attempts a run is a harness failure (seed 004)."""
SMALL_RUN = 10
"""Under this many attempts, any contaminated attempt makes the run a harness failure."""

Key = tuple[str, int | None]


def outcome(score: Any | None, attempt: Any | None = None) -> Outcome:
    """The outcome word of one attempt, from its score event (None: never scored).

    Works on validated events and on light reads alike (it reads `contaminated`, `verdict`
    and `gold_status` only).
    """
    if _contaminated(score) or _contaminated(attempt):
        return "contaminated"
    if score is None:
        return "harness_error"
    if score.gold_status == "verified_wrong":
        return "gold_wrong"
    verdict = score.verdict
    return verdict if verdict in _VERDICTS else "unscored"


_VERDICTS = frozenset({"match", "no_match", "near_match", "needs_human"})


def _contaminated(event: Any | None) -> bool:
    # `is True`, never truthiness: "unknown" is not contamination, and old ledgers carried the
    # string "false" (read as False by the ledger's tolerant reader).
    return event is not None and event.contaminated is True


def counts(word: str) -> bool:
    """Whether an attempt with this outcome enters aggregates (pass rate, recall, flips)."""
    return word not in OUT_OF_EVERY_AGGREGATE


@dataclass(frozen=True)
class Counted:
    """One attempt as the counting rule sees it."""

    qid: str
    sample: int | None
    outcome: Outcome
    verdict: str | None
    """What the judge said (kept for a gold_wrong or contaminated attempt: the report says it)."""
    reason: str | None
    gold_status: str | None
    gold_note: str | None
    recall: float | None
    precision: float | None = None
    """Share of the entities the attempt was handed that the case wanted (recall.py)."""
    noise: int | None = None
    """How many returned entities the case did not want."""
    coverage: str | None = None
    """The case's coverage label when it was answered (covered, derivable, absent)."""

    @property
    def counts(self) -> bool:
        """Whether this attempt enters the aggregates."""
        return counts(self.outcome)


@dataclass(frozen=True)
class Tally:
    """A run's attempts, each with its outcome, and every figure counted from them."""

    name: str
    status: str | None
    abort_reason: str | None
    attempts: tuple[Counted, ...]
    invalid_reason: str | None = None

    @property
    def outcomes(self) -> dict[str, int]:
        """How many attempts had each outcome word (zero counts left out), in OUTCOMES order."""
        tally = Counter(a.outcome for a in self.attempts)
        return {word: tally[word] for word in OUTCOMES if tally[word]}

    @property
    def passed(self) -> int:
        """Attempts judged match (and counted)."""
        return sum(1 for a in self.attempts if a.outcome == "match")

    @property
    def decided(self) -> int:
        """Attempts judged match or no_match (and counted): the pass rate's denominator."""
        return sum(1 for a in self.attempts if a.outcome in DECIDED)

    @property
    def contaminated(self) -> int:
        """Contaminated attempts."""
        return sum(1 for a in self.attempts if a.outcome == "contaminated")

    @property
    def withheld(self) -> str | None:
        """Why the pass rate may not be quoted, or None."""
        if self.status == "aborted":
            why = f": {self.abort_reason}" if self.abort_reason else ""
            return f"the run aborted{why}; its verdicts are a biased subset"
        if self.status == "invalid":
            return "the run's ledger does not validate: see run.json invalidReason"
        if self.contaminated:
            return (
                f"{self.contaminated} of {len(self.attempts)} attempts contaminated: the "
                "answerer reached the answer key"
            )
        return None

    @property
    def pass_rate(self) -> float | None:
        """match / decided; None when withheld or when nothing was decided."""
        if self.withheld is not None or not self.decided:
            return None
        return self.passed / self.decided

    @property
    def harness_failure(self) -> str | None:
        """Why no model score may be published from this run at all, or None."""
        if self.status == "aborted":
            why = f": {self.abort_reason}" if self.abort_reason else ""
            return f"run {self.name} aborted{why}"
        if self.status == "invalid":
            return f"run {self.name} does not validate: {self.invalid_reason}"
        dirty, total = self.contaminated, len(self.attempts)
        if dirty and (total < SMALL_RUN or dirty / total > CONTAMINATION_LIMIT):
            return (
                f"run {self.name}: {dirty} of {total} attempts contaminated (limit: 10%, none "
                f"on a run under {SMALL_RUN}); fix the answerer's isolation and re-run"
            )
        return None

    @property
    def recalls(self) -> list[float]:
        """Per-attempt entity recall of the attempts that count (None recalls left out)."""
        return [a.recall for a in self.attempts if a.counts and a.recall is not None]

    @property
    def recall(self) -> float | None:
        """Mean entity recall over the attempts that count, None when none has one."""
        values = self.recalls
        return sum(values) / len(values) if values else None

    @property
    def precisions(self) -> list[float]:
        """Per-attempt retrieval precision of the attempts that count and whose case is
        covered (or unlabelled), None precisions left out.

        Covered only, as the real set's own notes ask: for a derivable or absent case the model
        lacks the entity, so what came back instead says nothing about retrieval.
        """
        return [
            a.precision
            for a in self.attempts
            if a.counts and a.precision is not None and a.coverage in (None, "covered")
        ]

    @property
    def precision(self) -> float | None:
        """Mean retrieval precision over `precisions`, None when there is none."""
        values = self.precisions
        return sum(values) / len(values) if values else None

    @property
    def noise(self) -> float | None:
        """Mean count of unwanted entities per attempt, over the attempts `precisions` uses."""
        values = [
            a.noise
            for a in self.attempts
            if a.counts and a.precision is not None and a.coverage in (None, "covered")
        ]
        return sum(v or 0 for v in values) / len(values) if values else None

    @property
    def unscored_reasons(self) -> dict[str, int]:
        """Why the `unscored` attempts were not scored, with counts."""
        tally = Counter(a.reason or "?" for a in self.attempts if a.outcome == "unscored")
        return dict(sorted(tally.items()))

    @property
    def doubted(self) -> list[dict[str, Any]]:
        """Attempts whose golden the judge did not believe (suspect or verified_wrong)."""
        return [
            {"qid": a.qid, "gold_status": a.gold_status, "gold_note": a.gold_note}
            for a in self.attempts
            if a.gold_status in ("suspect", "verified_wrong")
        ]

    def totals(self) -> dict[str, Any]:
        """The figures `run.json` records as `totals` (the same every view prints)."""
        recall = self.recall
        return {
            "attempts": len(self.attempts),
            "outcomes": self.outcomes,
            "decided": self.decided,
            "passed": self.passed,
            "passRate": None if self.pass_rate is None else round(self.pass_rate, 6),
            "passRateWithheld": self.withheld,
            "harnessFailure": self.harness_failure,
            "recall": None if recall is None else round(recall, 6),
            "recallAttempts": len(self.recalls),
            "precision": None if self.precision is None else round(self.precision, 6),
            "precisionAttempts": len(self.precisions),
            "noise": None if self.noise is None else round(self.noise, 6),
        }


def tally_events(
    attempts: Mapping[Key, Any],
    scores: Mapping[Key, Any],
    recalls: Mapping[Key, Any],
    *,
    name: str,
    status: str | None,
    abort_reason: str | None = None,
    invalid_reason: str | None = None,
) -> Tally:
    """The tally of a run from its attempt, score and per-attempt retrieval events, by attempt
    key. `recalls` maps a key to its `retrieval_score` event (or to a bare recall number).

    Every key with an attempt or a score is one attempt (attempts first, in their order).
    """
    keys = list(dict.fromkeys([*attempts, *scores]))
    counted = []
    for key in keys:
        score = scores.get(key)
        word = outcome(score, attempts.get(key))
        retrieval = recalls.get(key)
        numbers = isinstance(retrieval, int | float) or retrieval is None
        counted.append(
            Counted(
                qid=key[0],
                sample=key[1],
                outcome=word,
                verdict=score.verdict if score is not None else None,
                reason=score.reason if score is not None else "not_scored",
                gold_status=score.gold_status if score is not None else None,
                gold_note=score.gold_note if score is not None else None,
                recall=retrieval if numbers else getattr(retrieval, "recall", None),
                precision=None if numbers else getattr(retrieval, "precision", None),
                noise=None if numbers else getattr(retrieval, "noise", None),
                coverage=None if numbers else getattr(retrieval, "coverage", None),
            )
        )
    return Tally(
        name=name,
        status=status,
        abort_reason=abort_reason,
        attempts=tuple(counted),
        invalid_reason=invalid_reason,
    )


def tally(
    read: RunLedger, *, status: str | None = None, invalid_reason: str | None = None
) -> Tally:
    """The tally of a read run (`status` and `invalid_reason` override what its run.json had
    when read: closing decides them).

    A read without `retrieval_score` events (a comparison's) has no recall figures.
    """
    info = read.info
    name = (info.label or info.run_id) if info is not None else str(read.run_dir)
    return tally_events(
        read.attempts(),
        read.scores(),
        _recalls(read.of_kind("retrieval_score")),
        name=name,
        status=status if status is not None else (info.status if info is not None else None),
        abort_reason=info.abort_reason if info is not None else None,
        invalid_reason=invalid_reason or (info.invalid_reason if info is not None else None),
    )


def _recalls(events: Iterable[Any]) -> dict[Key, Any]:
    # Fixed-term replays write run-level retrieval scores (no qid); they are not per attempt.
    return {(e.qid, e.sample): e for e in events if e.qid is not None}


def role_costs(read: ledger_reader.RunLedger) -> dict[str, ledger.RoleCost]:
    """What each role spent, counted from the attempt and score lines."""
    out = {}
    roles: list[tuple[str, tuple[str, ...]]] = [("answerer", ("attempt",)), ("judge", ("score",))]
    if read.of_kind("diagnosis") or read.of_kind("clustering"):
        # Only a diagnosed run has the role: an undiagnosed run's costs stay as they were.
        roles.append(("diagnoser", ("diagnosis", "clustering")))
    if read.of_kind("candidate"):
        roles.append(("improver", ("candidate",)))
    for role, kinds in roles:
        # Summed in locals, the model built once: an assignment to a pydantic model's field
        # costs a microsecond or more, six per event (a tenth of a 10,000-case report's build).
        calls = input_tokens = output_tokens = cache_read = cache_creation = 0
        cost: float | None = 0.0
        for event in (e for kind in kinds for e in read.of_kind(kind)):
            if event.input_tokens is None and event.cost_usd is None:
                continue
            calls += 1
            input_tokens += event.input_tokens or 0
            output_tokens += event.output_tokens or 0
            cache_read += event.cache_read_tokens or 0
            cache_creation += event.cache_creation_tokens or 0
            if event.cost_usd is None or cost is None:
                cost = None
            else:
                cost = round(cost + event.cost_usd, 6)
        out[role] = ledger.RoleCost(
            calls=calls,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=cache_read,
            cache_creation_tokens=cache_creation,
            cost_usd=cost,
        )
    return out
