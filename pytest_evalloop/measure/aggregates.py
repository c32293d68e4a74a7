"""Which scores count: the one rule every figure of a run is computed under.

Every number a run reports -- the terminal summary, `evalloop report`, the totals in
`run.json`, the flip table and the gate -- is counted from ledger events through this module,
so no two views can disagree on what a case was or whether it counts.

Each attempt gets one **outcome word**, decided by :func:`outcome` from its `score` event
(and its `attempt` event), in this order:

- ``contaminated``: the attempt or its score says ``contaminated: true`` -- its host-side log
  showed what the contamination check refuses (a protected path named or touched, a claimed
  call the host never logged: the attempt's ``contamination_reasons`` say which), so its
  verdict (if any) says nothing about the model;
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

**Doing less is never free.** An ``unscored`` attempt whose reason is one the answerer caused
(`ANSWERER_DID_LESS`: no final query) is no wrong answer and has no verdict (seed 004), but it
is not an answer either: the **submitted share** (`Tally.submitted` of `Tally.answerable`) is
printed beside every pass rate, and in a comparison a case decided ``match`` in the baseline
that the answerer did not submit now is **worse**; undecided now by any other door, it is a
lost decision gates read as worse (`transitions.transition`, the one rule every view
applies).

A run is a **harness failure** when it aborted, is invalid, or more than 10% of its attempts
were contaminated (any, on a run under 10 attempts; seed 004): no model score may be published
from it, so its pass rate is **withheld** (also when it aborted: its verdicts are a biased
subset; or is invalid: the counts themselves are in doubt). Below that threshold the
contaminated attempts leave every aggregate and the pass rate is published with their count.

**People settle what the judge could not** (`review` events, `evalloop review` / `evalloop
view`). The judge's `score` line is never edited; :func:`settled_scores` is the one rule for
how a review counts, and every view (tally, run.json totals, flips, the gate, the report)
reads scores through it:

- people's reviews of an attempt count as one human label (:mod:`people`: each person's
  latest ruling once, the latest review stands when more people hold it than any other
  verdict); where people disagree the attempt counts as ``needs_human`` (neither pass nor fail,
  `Tally.people_disagree`) until one more review settles it; a review of an attempt whose judge
  outcome is ``contaminated``, ``harness_error``, ``gold_wrong`` or ``unscored`` changes
  nothing (the review commands refuse to write one);
- a review with a verdict replaces the judge's verdict: a person's ``match`` / ``no_match``
  is a decision like the judge's (it enters the pass rate, flips and the gate), a person's
  ``near_match`` is neither pass nor fail;
- a "golden is wrong" review changes no score: it opens the golden side door instead;
- every view shows how many attempts people settled (`Tally.human_settled`) and how many of
  those overruled a decided verdict (`Tally.overruled`).

Statistics over repeats build on :class:`Counted`: each attempt's outcome and whether it
counts, one line per attempt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.measure import people

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

KINDS = frozenset({"attempt", "score", "review", "retrieval_score"})
"""The event kinds a tally reads."""
RETRIEVAL_FIELDS = frozenset({"recall", "precision", "noise", "returned", "coverage"})
"""The `retrieval_score` keys a tally reads (a comparison's read has no retrieval events)."""
FIELDS = (
    frozenset(
        {"verdict", "reason", "contaminated", "contamination_reasons", "gold_status", "gold_note"}
        | {"reviewer", "why", "golden_wrong"}
    )
    | RETRIEVAL_FIELDS
)
"""The event keys a tally reads (with kind, qid and sample)."""

CONTAMINATION_LIMIT = 0.1
"""Above this fraction of contaminated attempts a run is a harness failure (seed 004)."""
SMALL_RUN = 10
"""Under this many attempts, any contaminated attempt makes the run a harness failure."""

ANSWERER_DID_LESS: frozenset[str] = frozenset({"not_submitted", "contamination_unknown"})
"""Null-verdict reasons the answerer caused: no wrong answer, but no answer either (no final
query; or an answerer of the user's own whose answer no host-side log covers)."""

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
    return verdict if verdict in VERDICTS else "unscored"


VERDICTS = frozenset({"match", "no_match", "near_match", "needs_human"})
"""The verdict words a score can carry (a null verdict is `unscored`)."""


REVIEWABLE: frozenset[str] = frozenset({"match", "no_match", "near_match", "needs_human"})
"""Judge outcomes a person may settle (not contaminated, errored, gold_wrong or unscored)."""


class SettledScore:
    """A judge's score as people settled it: the human label's verdict, the judge's everything
    else (`judge_verdict` keeps what the judge said, `settled_by` whose ruling stands). Where
    people disagree the verdict is `needs_human`, `settled_by` None and `people_disagree` says
    who ruled what."""

    __slots__ = (
        "_score",
        "verdict",
        "settled_by",
        "judge_verdict",
        "review_why",
        "people_disagree",
    )

    def __init__(self, score: Any, label: people.HumanLabel, review: Any = None) -> None:
        self._score = score
        self.judge_verdict = score.verdict
        self.review_why = getattr(review, "why", None)
        if label.disagree:
            self.verdict = "needs_human"
            self.settled_by = None
            self.people_disagree: str | None = label.text()
        else:
            self.verdict = label.verdict
            self.settled_by = label.reviewer
            self.people_disagree = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._score, name)


def settles(score: Any | None, label: people.HumanLabel | None) -> bool:
    """Whether people's `label` replaces the judge's verdict of `score` (the rule in the
    docstring: a disagreement replaces it too, with needs_human)."""
    if label is None or score is None:
        return False
    return outcome(score) in REVIEWABLE


def review_refusal(score: Any | None, attempt: Any | None) -> str | None:
    """Why a person may not review this attempt, or None (the review commands ask this)."""
    word = outcome(score, attempt)
    if word in REVIEWABLE:
        return None
    why = {
        "contaminated": "its attempt is contaminated: its verdict says nothing about the model",
        "harness_error": "the harness never scored it (a harness error): re-run it instead",
        "gold_wrong": "the judge showed its golden wrong: repair the golden instead",
        "unscored": "the judge had nothing to score (not submitted, or the golden not usable)",
    }
    return why[word]


def settled_scores(read: Any) -> dict[Key, Any]:
    """The score that counts per attempt, with people's reviews applied (`settles`)."""
    scores = read.scores()
    events = read.of_kind("review")
    if not events:
        return scores
    found = people.labels(events)
    latest = read.reviews()
    return {
        key: SettledScore(score, found[key], latest.get(key))
        if settles(score, found.get(key))
        else score
        for key, score in scores.items()
    }


def _contaminated(event: Any | None) -> bool:
    # `is True`, never truthiness: "unknown" is not contamination, and old ledgers carried the
    # string "false" (read as False by the ledger's tolerant reader).
    return event is not None and event.contaminated is True


ANSWER_ERROR = "answer_error"
"""The reason of an attempt whose harness error the answer caused (`error_cause: "answer"`: a
request refused for what the answer put in it): the answer's fault, not the harness's."""
JUDGE_UNPARSEABLE = "judge_unparseable"


def fails_the_answer(word: str, reason: str | None) -> bool:
    """Whether an attempt (outcome word, reason) is one the answerer left unanswered (the
    paired tests count it a failed sample, as the bar counts the case worse after a pass)."""
    if word in ("contaminated", "harness_error"):
        return word == "contaminated" or reason == ANSWER_ERROR
    return word == "unscored" and reason in ANSWERER_DID_LESS


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
    returned: int | None = None
    """How many distinct entities the attempt was handed: the N its precision is taken at."""
    coverage: str | None = None
    """The case's coverage label when it was answered (covered, derivable, absent)."""
    seen: tuple[str, ...] = ()
    """What the contamination check saw (the attempt's `contamination_reasons`)."""
    settled_by: str | None = None
    """The person whose review decided this attempt's verdict (None: the judge's stands)."""
    judge_verdict: str | None = None
    """What the judge said, when a person settled the attempt."""
    people_disagree: str | None = None
    """Who ruled what, when people disagree on the attempt (it counts as needs_human)."""

    @property
    def counts(self) -> bool:
        """Whether this attempt enters the aggregates."""
        return counts(self.outcome)

    @property
    def did_less(self) -> bool:
        """Unscored for a reason the answerer caused (`ANSWERER_DID_LESS`)."""
        return self.outcome == "unscored" and self.reason in ANSWERER_DID_LESS

    @property
    def failed_the_answer(self) -> bool:
        """Left unanswered by the answerer itself (`fails_the_answer`)."""
        return fails_the_answer(self.outcome, self.reason)


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
    def human_settled(self) -> int:
        """Attempts whose verdict a person settled (`settled_scores`)."""
        return sum(1 for a in self.attempts if a.settled_by is not None)

    @property
    def overruled(self) -> int:
        """Human-settled attempts whose judge verdict was decided and differs from the person's."""
        return sum(
            1
            for a in self.attempts
            if a.settled_by is not None
            and a.judge_verdict in DECIDED
            and a.judge_verdict != a.verdict
        )

    @property
    def people_disagree(self) -> int:
        """Attempts people disagree on (counted as needs_human until one more review)."""
        return sum(1 for a in self.attempts if a.people_disagree is not None)

    @property
    def human_text(self) -> str:
        """The people line every view prints (empty when nobody reviewed)."""
        if not self.human_settled and not self.people_disagree:
            return ""
        text = (
            f"settled by people: {self.human_settled} "
            f"({self.overruled} overruling a decided verdict)"
        )
        if self.people_disagree:
            text += f"; people disagree: {self.people_disagree} (counted as needs_human)"
        return text

    @property
    def contaminated(self) -> int:
        """Contaminated attempts."""
        return sum(1 for a in self.attempts if a.outcome == "contaminated")

    @property
    def answerable(self) -> int:
        """Attempts that count (the submitted share's denominator)."""
        return sum(1 for a in self.attempts if a.counts)

    @property
    def submitted(self) -> int:
        """Attempts that count and that the answerer did not leave unanswered (`did_less`)."""
        return sum(1 for a in self.attempts if a.counts and not a.did_less)

    @property
    def submitted_share(self) -> float | None:
        """submitted / answerable; None when no attempt counts."""
        return self.submitted / self.answerable if self.answerable else None

    @property
    def withheld(self) -> str | None:
        """Why the pass rate may not be quoted, or None."""
        if self.status == "aborted":
            why = f": {self.abort_reason}" if self.abort_reason else ""
            return f"the run aborted{why}; its verdicts are a biased subset"
        if self.status == "invalid":
            why = self.invalid_reason or "see run.json invalidReason"
            return f"the run's ledger does not validate: {why}"
        return self._too_contaminated()

    def _too_contaminated(self) -> str | None:
        """The seed's threshold: above 10% of attempts, or any on a run under 10 attempts."""
        dirty, total = self.contaminated, len(self.attempts)
        if not dirty or (total >= SMALL_RUN and dirty / total <= CONTAMINATION_LIMIT):
            return None
        limit = (
            f"any on a run under {SMALL_RUN} attempts"
            if total < SMALL_RUN
            else f"more than {CONTAMINATION_LIMIT:.0%} of the attempts"
        )
        return f"{dirty} of {total} attempts contaminated (limit: {limit}): {self.seen_text}"

    @property
    def seen_text(self) -> str:
        """What the contamination check saw, per contaminated attempt (the first three)."""
        dirty = [a for a in self.attempts if a.outcome == "contaminated"]
        parts = [f"{a.qid}: {'; '.join(a.seen) or 'contaminated'}" for a in dirty[:3]]
        more = f" (+{len(dirty) - 3} more)" if len(dirty) > 3 else ""
        return ", ".join(parts) + more

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
        dirty = self._too_contaminated()
        if dirty:
            return f"run {self.name}: {dirty}; fix the answerer's isolation and re-run"
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
    def returned(self) -> list[int]:
        """The N each precision in `precisions` was taken at (distinct entities returned).

        Precision is a share of what came back, so it moves with how much the answerer asked
        for (a context limit of 2, 10 or 50): a precision figure without its N cannot be
        compared. Attempts of a run written before `returned` was recorded are left out.
        """
        return [
            a.returned
            for a in self.attempts
            if a.counts
            and a.precision is not None
            and a.coverage in (None, "covered")
            and a.returned is not None
        ]

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

    @property
    def submitted_text(self) -> str:
        """The submitted share as every view prints it beside the pass rate."""
        share = self.submitted_share
        if share is None:
            return "submitted: n/a (no attempt counts)"
        return f"submitted: {self.submitted}/{self.answerable} ({share:.1%})"

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
            "submitted": self.submitted,
            "answerable": self.answerable,
            "recall": None if recall is None else round(recall, 6),
            "recallAttempts": len(self.recalls),
            "precision": None if self.precision is None else round(self.precision, 6),
            "precisionAttempts": len(self.precisions),
            "noise": None if self.noise is None else round(self.noise, 6),
            "humanSettled": self.human_settled,
            "overruled": self.overruled,
            "peopleDisagree": self.people_disagree,
            "precisionReturned": (
                round(sum(self.returned) / len(self.returned), 6) if self.returned else None
            ),
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
                reason=score.reason if score is not None else _unscored_why(attempts.get(key)),
                gold_status=score.gold_status if score is not None else None,
                gold_note=score.gold_note if score is not None else None,
                recall=retrieval if numbers else getattr(retrieval, "recall", None),
                precision=None if numbers else getattr(retrieval, "precision", None),
                noise=None if numbers else getattr(retrieval, "noise", None),
                returned=None if numbers else getattr(retrieval, "returned", None),
                coverage=None if numbers else getattr(retrieval, "coverage", None),
                seen=_seen(attempts.get(key)) if word == "contaminated" else (),
                settled_by=getattr(score, "settled_by", None),
                judge_verdict=getattr(score, "judge_verdict", None),
                people_disagree=getattr(score, "people_disagree", None),
            )
        )
    return Tally(
        name=name,
        status=status,
        abort_reason=abort_reason,
        attempts=tuple(counted),
        invalid_reason=invalid_reason,
    )


def _unscored_why(attempt: Any | None) -> str:
    """The reason of an attempt with no score: `answer_error` when the answer caused its
    harness error (`error_cause`), else `not_scored`."""
    cause = getattr(attempt, "error_cause", None) if attempt is not None else None
    return ANSWER_ERROR if cause == "answer" else "not_scored"


def _seen(attempt: Any | None) -> tuple[str, ...]:
    reasons = getattr(attempt, "contamination_reasons", None) if attempt is not None else None
    return tuple(str(r) for r in reasons or ())


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
        settled_scores(read),
        _recalls(read.of_kind("retrieval_score")),
        name=name,
        status=status if status is not None else (info.status if info is not None else None),
        abort_reason=info.abort_reason if info is not None else None,
        invalid_reason=invalid_reason or (info.invalid_reason if info is not None else None),
    )


def _recalls(events: Iterable[Any]) -> dict[Key, Any]:
    # Fixed-term replays write run-level retrieval scores (no qid); they are not per attempt.
    return {(e.qid, e.sample): e for e in events if e.qid is not None}


def _requests(role: str, event: Any, replayed: bool) -> int:
    """The API requests one line stands for: an answer's turns (one request each), a score's
    judge attempts (0 when no judge was called), one for a diagnoser's line. A line written
    before the field existed counts one."""
    if role == "answerer":
        turns = event.num_turns
        return 0 if replayed else (1 if turns is None else int(turns))
    if role == "judge":
        tries = event.judge_attempts
        return 1 if tries is None else int(tries)
    return 1


def role_costs(read: ledger_reader.RunLedger) -> dict[str, ledger.RoleCost]:
    """What each role spent, counted from the attempt and score lines; `calls` is the API
    requests made (`_requests`), not the lines."""
    out = {}
    roles: list[tuple[str, tuple[str, ...]]] = [("answerer", ("attempt",)), ("judge", ("score",))]
    if read.of_kind("diagnosis") or read.of_kind("clustering"):
        # Only a diagnosed run has the role: an undiagnosed run's costs stay as they were.
        roles.append(("diagnoser", ("diagnosis", "clustering")))
    if read.of_kind("candidate"):
        roles.append(("improver", ("candidate",)))
    # A rejudge re-reads its source's answers: its answerer made no request.
    replayed = read.info is not None and bool(read.info.rejudge_of)
    for role, kinds in roles:
        # Summed in locals, the model built once: an assignment to a pydantic model's field
        # costs a microsecond or more, six per event (a tenth of a 10,000-case report's build).
        calls = input_tokens = output_tokens = cache_read = cache_creation = 0
        cost: float | None = 0.0
        for event in (e for kind in kinds for e in read.of_kind(kind)):
            if event.input_tokens is None and event.cost_usd is None:
                continue
            calls += _requests(role, event, replayed)
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
