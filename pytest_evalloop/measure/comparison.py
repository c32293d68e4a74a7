"""Two runs compared case by case: each run seen as one side per case, and the flip table.

The unit of comparison is the case, and `transitions.transition` decides each one: no_match ->
match is *better*; match -> no_match is *worse*, and so is a pass the answerer left unanswered
now (not submitted, no host log, contaminated, an answer error: doing less never passes a
gate); a pass that is undecided now by any other door (near_match, needs_human, an unparseable
judge, the golden doubted, a harness error) is *undecided*, a lost decision every gate reads
as worse before it accepts. A case out of every aggregate on either side otherwise is
*dropped*, and counted as such; anything else is *neither*. What a comparison decides is
`gate`'s; how it reads is `comparison_text`'s.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pytest_evalloop.ledger.contract import RUN_FILE, ScoreEvent
from pytest_evalloop.ledger.reader import (
    COMPARED_FIELDS,
    COMPARED_KINDS,
    RunLedger,
    read_run,
    read_run_info,
)
from pytest_evalloop.measure import aggregates, comparable, transitions
from pytest_evalloop.measure import pins as pin_rules
from pytest_evalloop.measure.comparable import RunFacts
from pytest_evalloop.measure.pins import PinDiff
from pytest_evalloop.measure.unmeasured import unmeasured_why


class RunNotFoundError(ValueError):
    """A run reference that names no run directory."""


class UnreadableRunError(ValueError):
    """A run directory whose run.json cannot be read."""


class _Model(BaseModel):
    # Validators are built on first use: each build costs milliseconds at every start, and a
    # command that imports this module need not compare anything.
    model_config = ConfigDict(defer_build=True)


# --- one run, seen case by case ----------------------------------------------------------


class CaseSide(_Model):
    """One case's outcome in one run, with what the flip table shows about it."""

    qid: str
    verdict: str | None
    reason: str | None = None
    why: str | None = None
    final_query: str | None = None
    contaminated: bool | str | None = None
    samples: int = 1
    passes: int = 0
    """Samples judged match (with several samples; the flip table shows passes/decided)."""
    decided: int | None = None
    """Samples judged match or no_match, or None for one sample."""
    excluded: str | None = None
    """Why the case leaves every aggregate (`contaminated`, `gold_wrong`, `harness_error`), or
    None; such a case is dropped from a comparison (see `aggregates`)."""

    @property
    def passed(self) -> bool | None:
        """True for match, False for no_match, None for anything else (never a fail)."""
        return _PASSED.get(self.verdict or "")

    @property
    def word(self) -> transitions.SideWord:
        """This side as `transitions.transition` reads it."""
        return transitions.side_word(self.verdict, self.reason, self.excluded)


_PASSED = {"match": True, "no_match": False}


class RunView(_Model):
    """A run reduced to what a comparison needs: identity, pins and one side per case."""

    run_id: str
    label: str | None = None
    pins: dict[str, Any] = Field(default_factory=dict)
    status: str | None = None
    cases: dict[str, CaseSide] = Field(default_factory=dict)
    withheld: str | None = None
    """Why the run's pass rate is withheld (`aggregates.Tally.withheld`), or None."""
    outcomes: dict[str, int] = Field(default_factory=dict)
    """Attempts per outcome word (`aggregates.Tally.outcomes`)."""
    submitted: int = 0
    """Attempts that count and were submitted (`aggregates.Tally.submitted`)."""
    answerable: int = 0
    """Attempts that count (`aggregates.Tally.answerable`)."""
    human_text: str = ""
    """How many attempts people settled (`aggregates.Tally.human_text`; empty: none)."""
    facts: RunFacts | None = None
    """What the comparability rule reads of the run (`comparable.facts_of`); None only for a
    view built in memory (a unit test), which no rule can vouch for."""

    @property
    def submitted_share(self) -> float | None:
        """submitted / answerable, None when no attempt counts."""
        return self.submitted / self.answerable if self.answerable else None

    @property
    def name(self) -> str:
        """The label when there is one, else the run id."""
        return self.label or self.run_id


def read_compared(run_dir: Path) -> RunLedger:
    """Read what a comparison of `run_dir` needs (`run_view`, `harness_failure`), unvalidated,
    and check it against its seal (`ledger.seal`): a gate decides only on a run as it closed."""
    from pytest_evalloop.ledger import seal

    read = read_run(run_dir, kinds=COMPARED_KINDS, validate=False, fields=COMPARED_FIELDS)
    read.seal_check = seal.verify(run_dir)
    return read


def seal_problem(ledger: RunLedger) -> str | None:
    """What breaks a read run's seal ("unsealed" when it has none), or None when it holds."""
    from pytest_evalloop.ledger import seal

    check = ledger.seal_check if ledger.seal_check is not None else seal.verify(ledger.run_dir)
    if check.broken is not None:
        return check.broken
    return None if check.sealed and check.chained else "unsealed"


def run_view(ledger: RunLedger, tally: aggregates.Tally | None = None) -> RunView:
    """Build a RunView from a read ledger; one CaseSide per qid (see `case_side` for samples).
    `tally`: the ledger's `aggregates.tally`, when the caller has it already."""
    if ledger.info is None:
        problems = "; ".join(f.message for f in ledger.errors) or "unreadable"
        raise UnreadableRunError(
            f"run {ledger.run_dir} cannot be read ({problems}); "
            f"check it with `evalloop validate {ledger.run_dir}`"
        )
    info = ledger.info.model_dump(by_alias=True)
    scores: dict[str, list[ScoreEvent]] = {}
    for (qid, _sample), score in aggregates.settled_scores(ledger).items():
        scores.setdefault(qid, []).append(score)
    queries: dict[str, dict[int | None, str | None]] = {}
    answer_errors: set[str] = set()
    for (qid, sample), attempt in ledger.attempts().items():
        queries.setdefault(qid, {})[sample] = attempt.final_query
        if attempt.error_cause == "answer":
            answer_errors.add(qid)
    cases = {}
    for qid in list(scores) + [q for q in queries if q not in scores]:
        cases[qid] = case_side(
            qid, scores.get(qid, []), queries.get(qid, {}), answer_error=qid in answer_errors
        )
    tally = aggregates.tally(ledger) if tally is None else tally
    return RunView(
        run_id=ledger.info.run_id,
        label=ledger.info.label,
        pins=pin_rules.pins_of(info),
        status=ledger.info.status,
        cases=cases,
        withheld=tally.withheld,
        outcomes=tally.outcomes,
        submitted=tally.submitted,
        answerable=tally.answerable,
        human_text=tally.human_text,
        facts=comparable.facts_of(ledger, seal_problem(ledger), unmeasured_why(tally)),
    )


def case_side(
    qid: str,
    scores: list[ScoreEvent],
    queries: dict[int | None, str | None],
    *,
    answer_error: bool = False,
) -> CaseSide:
    """One case's verdict from its samples' scores.

    A case any of whose samples is contaminated, or whose golden a sample's judge showed wrong
    (`aggregates.outcome`), leaves every aggregate: no verdict, and `excluded` says why. A
    case without a score is excluded as a harness error, unscored with reason `not_scored`,
    or `answer_error` when the answer caused it (`answer_error`: an attempt of the case says
    `error_cause: "answer"`).
    Otherwise one sample: its verdict. Several samples (a sample attempted and never scored
    counts as one, undecided): match or no_match when more than half of all the samples say
    it, so no undecided sample could turn it (a sample that lost its decision never leaves
    the count: [match, needs_human] is no stable pass); a tie of decided samples is unscored
    (`samples_split`), and decided samples the undecided ones could outvote are unscored
    (`samples_undecided`). With no decided sample, the commoner of near_match/needs_human
    (needs_human on a tie), else unscored.
    """
    if not scores:
        query = next(iter(queries.values()), None)
        why = aggregates.ANSWER_ERROR if answer_error else "not_scored"
        return CaseSide(
            qid=qid, verdict=None, reason=why, final_query=query, excluded="harness_error"
        )
    # One sample is the common case: no sorting or tallying for it.
    ordered = scores if len(scores) == 1 else sorted(scores, key=_sample_order)
    words = [aggregates.outcome(s) for s in ordered]
    excluded = next((w for w in ("contaminated", "gold_wrong") if w in words), None)
    verdict: str | None
    reason: str | None
    if excluded is not None:
        bad = [s for s, w in zip(ordered, words, strict=True) if w == excluded]
        pick, verdict = bad[0], None
        reason = _excluded_reason(excluded, pick, len(bad), len(ordered))
    elif len(ordered) == 1 and len(queries) <= 1:
        pick, verdict, reason = ordered[0], ordered[0].verdict, None
    else:
        samples = max(len(ordered), len(queries))
        verdict, reason = _majority([s.verdict for s in ordered], samples)
        pick = next((s for s in ordered if s.verdict == verdict), ordered[0])
    if reason is None:
        reason = pick.reason
    flags = {s.contaminated for s in ordered}
    contaminated: bool | str = (
        True if True in flags else ("unknown" if "unknown" in flags else False)
    )
    return CaseSide(
        qid=qid,
        verdict=verdict,
        reason=reason,
        why=pick.why,
        final_query=queries.get(pick.sample),
        contaminated=contaminated,
        samples=len(ordered),
        passes=sum(s.verdict == "match" for s in ordered),
        decided=None
        if len(ordered) == 1
        else sum(s.verdict in ("match", "no_match") for s in ordered),
        excluded=excluded,
    )


def _sample_order(score: ScoreEvent) -> int:
    return -1 if score.sample is None else score.sample


def _excluded_reason(excluded: str, pick: ScoreEvent, bad: int, samples: int) -> str:
    # Say why a verdict the judge did give is not counted.
    what = "contaminated" if excluded == "contaminated" else "gold_status verified_wrong"
    said = f" (judge said {pick.verdict})" if pick.verdict is not None else ""
    if samples > 1:
        return f"{what}{said}: {bad} of {samples} samples"
    return f"{what}{said}" if said or excluded != "contaminated" else (pick.reason or what)


def _majority(verdicts: list[str | None], n: int) -> tuple[str | None, str | None]:
    """`n`: the samples attempted (at least `len(verdicts)`; the rest were never scored)."""
    if n == 1:
        return verdicts[0], None
    tally = Counter(v for v in verdicts if v is not None)
    match, no_match = tally["match"], tally["no_match"]
    undecided = n - match - no_match
    if match * 2 > n:
        return "match", None
    if no_match * 2 > n:
        return "no_match", None
    if match or no_match:
        if undecided == 0:
            return None, f"samples_split: {match} match, {no_match} no_match of {n}"
        return None, (
            f"samples_undecided: {match} match, {no_match} no_match, {undecided} undecided of {n}"
        )
    near, human = tally["near_match"], tally["needs_human"]
    if near or human:
        return ("near_match" if near > human else "needs_human"), None
    return None, None


# --- finding a run -----------------------------------------------------------------------


def resolve_run(ref: str, *, set_dir: Path | None, runs_dir: Path | None) -> Path:
    """The run directory a reference names: a run dir path, or a label/run id.

    A label is looked up under `runs_dir` (else `<set_dir>/runs`), first by directory name,
    then by the `label` or `runId` inside each run.json.
    """
    path = Path(ref)
    # A run.json in any form names a run: one that is no regular file (a pipe, a link) is
    # refused by the reader, naming it, never taken for a directory without one.
    if os.path.lexists(path / RUN_FILE):
        return path
    root = runs_dir if runs_dir is not None else (set_dir / "runs" if set_dir else None)
    if root is None or not root.is_dir():
        where = f"runs directory {root} does not exist" if root else "no --set or --runs-dir"
        if path.is_dir():
            raise RunNotFoundError(f"{ref!r} is a directory without {RUN_FILE}: not a run")
        raise RunNotFoundError(
            f"run {ref!r} is not a run directory and {where}; pass a run directory, "
            "or --set/--runs-dir to look the label up"
        )
    children = sorted(child for child in root.iterdir() if (child / RUN_FILE).is_file())
    if os.path.lexists(root / ref / RUN_FILE):
        return root / ref
    named = [child for child in children if ref in _identities(child)]
    if len(named) == 1:
        return named[0]
    if named:
        dirs = ", ".join(child.name for child in named)
        raise RunNotFoundError(
            f"label {ref!r} names {len(named)} runs in {root} ({dirs}); "
            "pass the run directory instead"
        )
    labels = sorted({name for child in children for name in _identities(child)})
    shown = ", ".join(labels[:30]) + (" ..." if len(labels) > 30 else "") or "(none)"
    raise RunNotFoundError(f"no run {ref!r} in {root}; runs there: {shown}")


def _identities(run_dir: Path) -> set[str]:
    names = {run_dir.name}
    try:
        info = read_run_info(run_dir)
    except (OSError, ValueError):
        return names
    names.add(info.run_id)
    if info.label:
        names.add(info.label)
    return names


# --- comparing two runs ------------------------------------------------------------------


class Flip(_Model):
    """A case with a confident verdict on both sides that changed."""

    qid: str
    baseline: CaseSide
    current: CaseSide


class Neither(_Model):
    """A case present in both runs with no pass/fail on at least one side."""

    qid: str
    baseline: CaseSide
    current: CaseSide

    @property
    def category(self) -> Literal["unscored", "needs_human", "near_match"]:
        """Why it is neither: an unscored side first, then needs_human, else near_match."""
        verdicts = {self.baseline.verdict, self.current.verdict}
        if None in verdicts or not verdicts <= {"match", "no_match", "near_match", "needs_human"}:
            return "unscored"
        return "needs_human" if "needs_human" in verdicts else "near_match"


class Undecided(_Model):
    """A case that passed in the baseline and is undecided now: a lost decision."""

    qid: str
    word: str
    """What the current side is (`transitions.LOST_AFTER_A_PASS`): `needs_human`, ..."""
    baseline: CaseSide
    current: CaseSide


class Dropped(_Model):
    """A case present in both runs that one side keeps out of every aggregate."""

    qid: str
    reason: str
    """`contaminated`, `gold_wrong` or `harness_error` (the first that applies, either side)."""
    baseline: CaseSide
    current: CaseSide


class Comparison(_Model):
    """The flip table between a baseline and a current run."""

    baseline_run_id: str
    current_run_id: str
    better: list[Flip] = Field(default_factory=list)
    worse: list[Flip] = Field(default_factory=list)
    stable_pass: list[str] = Field(default_factory=list)
    stable_fail: list[str] = Field(default_factory=list)
    neither: list[Neither] = Field(default_factory=list)
    undecided: list[Undecided] = Field(default_factory=list)
    """Cases that passed in the baseline and are undecided now (`transitions.LOST_AFTER_A_PASS`):
    every gate reads them as worse before it accepts."""
    stable_near_match: list[str] = Field(default_factory=list)
    only_in_baseline: list[str] = Field(default_factory=list)
    only_in_current: list[str] = Field(default_factory=list)
    pin_diffs: list[PinDiff] = Field(default_factory=list)
    """Breaking pins that differ (`pins.BREAKING`): the comparison is a rebase."""
    model_change: list[PinDiff] = Field(default_factory=list)
    """The served model's pins that differ (`pins.UNDER_TEST`): the change under test."""
    recorded_diffs: list[PinDiff] = Field(default_factory=list)
    """Tool versions that differ (`pins.RECORDED`): shown, never a mismatch."""
    dropped: list[Dropped] = Field(default_factory=list)
    """Cases out of every aggregate on either side: never a flip, never neither."""
    withheld: list[str] = Field(default_factory=list)
    """`<run>: <why>` for each run whose pass rate is withheld: no gate accepts then."""
    settled_by_people: list[str] = Field(default_factory=list)
    """`<run>: settled by people: N (...)` for each side where people settled attempts: their
    verdicts are the ones compared (`aggregates.settled_scores`)."""
    submitted_fell: str | None = None
    """How the submitted share fell against the baseline, in words, or None."""
    baseline_samples: int = 1
    current_samples: int = 1
    """Samples per case of each run (the most any compared case has): `caveats.samples_note`."""
    refused: list[str] = Field(default_factory=list)
    """Why the runs cannot carry a decision (`comparable.refusals`): every gate refuses then."""
    coverage: str = ""
    """`compared N of M cases; left out: ...` (`comparable.coverage_line`)."""

    def worse_by(self) -> dict[str, int]:
        """How many worse cases each real transition holds (`match -> not_submitted`: 40)."""
        return dict(Counter(f"match -> {f.current.word}" for f in self.worse))

    def undecided_by(self) -> dict[str, int]:
        """How many undecided cases each real transition holds (`match -> needs_human`: 2)."""
        return dict(Counter(f"match -> {u.word}" for u in self.undecided))

    def dropped_for(self, reason: str) -> list[str]:
        """The dropped qids for one reason."""
        return [d.qid for d in self.dropped if d.reason == reason]

    @property
    def scored_in_both(self) -> int:
        """Cases with match/no_match on both sides."""
        return len(self.better) + len(self.worse) + len(self.stable_pass) + len(self.stable_fail)

    @property
    def flips(self) -> int:
        """better + worse."""
        return len(self.better) + len(self.worse)


_DIGIT_RUNS = re.compile(r"(\d+)")


def natural_key(qid: str) -> list[Any]:
    """Sort key that puts q2 before q10."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in _DIGIT_RUNS.split(qid)]


def compare(
    baseline: RunView,
    current: RunView,
    *,
    qids: set[str] | None = None,
    second: RunView | None = None,
) -> Comparison:
    """Classify every case of the two runs (restricted to `qids` when given), and ask the one
    comparability rule whether they (with `second`, a second post arm) may carry a decision."""
    base_ids = set(baseline.cases) if qids is None else set(baseline.cases) & qids
    cur_ids = set(current.cases) if qids is None else set(current.cases) & qids
    differ = pin_rules.classify(baseline.pins, current.pins)
    result = Comparison(
        baseline_run_id=baseline.run_id,
        current_run_id=current.run_id,
        only_in_baseline=sorted(base_ids - cur_ids, key=natural_key),
        only_in_current=sorted(cur_ids - base_ids, key=natural_key),
        pin_diffs=differ.breaking,
        model_change=differ.under_test,
        recorded_diffs=differ.recorded,
        withheld=[f"{run.name}: {run.withheld}" for run in (baseline, current) if run.withheld],
        settled_by_people=[
            f"{run.name}: {run.human_text}" for run in (baseline, current) if run.human_text
        ],
        submitted_fell=_submitted_fell(baseline, current),
        baseline_samples=max((baseline.cases[q].samples for q in base_ids), default=1),
        current_samples=max((current.cases[q].samples for q in cur_ids), default=1),
    )
    for qid in sorted(base_ids & cur_ids, key=natural_key):
        _classify(result, baseline.cases[qid], current.cases[qid])
    arms = [baseline.facts, current.facts] + ([second.facts] if second is not None else [])
    if all(f is not None for f in arms):
        extra = second.facts if second is not None else None
        found = comparable.refusals(baseline.facts, current.facts, extra)  # type: ignore[arg-type]
        same_set = baseline.pins.get("datasetSha") == current.pins.get("datasetSha")
        if not found and same_set and (result.only_in_baseline or result.only_in_current):
            # Two whole runs of one dataset hold the same cases; these do not, so one of
            # their records of what they covered is not true.
            found.append(
                comparable.Refusal(
                    rule="whole",
                    why=f"the runs {baseline.name} and {current.name} both record the whole "
                    f"split of one dataset but hold different cases ("
                    f"{len(result.only_in_baseline)} only in the baseline, "
                    f"{len(result.only_in_current)} only in the current run)",
                )
            )
        result.refused = comparable.texts(found)
    result.coverage = _coverage(result, baseline, current)
    return result


def _coverage(c: Comparison, baseline: RunView, current: RunView) -> str:
    compared = c.scored_in_both + len(c.neither) + len(c.undecided)
    now = current.facts.selection if current.facts is not None else {}
    was = baseline.facts.selection if baseline.facts is not None else {}
    # A case one run left out (its own record says why) is not listed again as "only in" the
    # other; a run whose selection was whole explains nothing, so its missing cases are listed.
    sharded = int(((current.facts.shard if current.facts else None) or {}).get("count") or 1) > 1
    only_base = (
        "held by the other shards" if sharded else f"only in the baseline {c.baseline_run_id}"
    )
    extra = {
        **comparable.left_out_of(was, f"in the baseline {c.baseline_run_id}"),
        only_base: (c.only_in_baseline if now.get("whole", True) else []),
        f"only in the current run {c.current_run_id}": (
            c.only_in_current if was.get("whole", True) else []
        ),
        **{f"dropped: {reason}": c.dropped_for(reason) for reason in DROP_ORDER},
    }
    return comparable.coverage_line(compared, now, extra)


DROP_ORDER = transitions.DROP_ORDER


def _submitted_fell(baseline: RunView, current: RunView) -> str | None:
    was, now = baseline.submitted_share, current.submitted_share
    if was is None or now is None or now >= was:
        return None
    return (
        f"submitted share fell: {baseline.name} {baseline.submitted}/{baseline.answerable} "
        f"({was:.1%}) -> {current.name} {current.submitted}/{current.answerable} ({now:.1%}); "
        "a case that passed and is not submitted now counts as worse"
    )


def _classify(result: Comparison, before: CaseSide, after: CaseSide) -> None:
    kind, reason = transitions.transition(before.word, after.word)
    if kind == "dropped":
        # Out of every aggregate on one side is out of the comparison (seed 004).
        assert reason is not None
        result.dropped.append(
            Dropped(qid=before.qid, reason=reason, baseline=before, current=after)
        )
    elif kind == "undecided":
        assert reason is not None
        result.undecided.append(
            Undecided(qid=before.qid, word=reason, baseline=before, current=after)
        )
    elif kind == "neither":
        result.neither.append(Neither(qid=before.qid, baseline=before, current=after))
        if before.verdict == after.verdict == "near_match":
            result.stable_near_match.append(before.qid)
    elif kind in ("stable_pass", "stable_fail"):
        (result.stable_pass if kind == "stable_pass" else result.stable_fail).append(before.qid)
    else:
        (result.better if kind == "better" else result.worse).append(
            Flip(qid=before.qid, baseline=before, current=after)
        )


def few(qids: Iterable[str], limit: int = 10) -> str:
    """The first `limit` qids, and how many more there are (a reason or a line stays short)."""
    items = list(qids)
    return ", ".join(items[:limit]) + (
        f" (+{len(items) - limit} more)" if len(items) > limit else ""
    )
