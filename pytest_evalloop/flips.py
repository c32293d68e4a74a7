"""Baselines, flips, the acceptance bar and targeted mode, as pure functions over two runs.

The unit of comparison is the case. A flip needs a confident verdict on both sides: no_match ->
match is *better*, match -> no_match is *worse*. near_match, needs_human and unscored (null)
verdicts on either side are *neither*, so a case one arm could not score never becomes a flip.
A case out of every aggregate on either side (contaminated, a golden the judge showed wrong, a
harness error: `aggregates` decides) is *dropped*, and counted as such.
The acceptance bar and the targeted-mode rules are seed 004's eval-loop measurement doctrine;
docs/measurement.md is the user-facing account.

`flips_main` is the `evalloop flips A B` command.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pytest_evalloop import aggregates
from pytest_evalloop import pins as pin_rules
from pytest_evalloop.calibration import (
    CALIBRATION_FILE,
    Calibration,
    CalibrationBand,
    load_calibration,
    render_block,
    today,
)
from pytest_evalloop.gcpolicy import gc_paused
from pytest_evalloop.ledger import RUN_FILE, AcceptanceCheckEvent, ScoreEvent
from pytest_evalloop.ledger_reader import (
    COMPARED_FIELDS,
    COMPARED_KINDS,
    RunLedger,
    read_run,
    read_run_info,
)
from pytest_evalloop.pins import OVERRIDE_FLAG, PinDiff
from pytest_evalloop.significance import (
    BAR_SIGNIFICANT,
    DEFAULT_ALPHA,
    PairedTests,
    paired_tests,
    require_significance,
)
from pytest_evalloop.significance import lines as paired_lines

# pytest owns exit statuses 0-5; ours start above them so CI can tell a gate from a test failure.
EXIT_GATE_REJECTED = 6
"""The gate did not accept: rejected, unresolved, or refused (pins differ)."""
EXIT_HARNESS_FAILURE = 7
"""A run cannot be measured: aborted, or contaminated above the limit."""
EXIT_USAGE = 2

# worse -> better needed (seed 004, eval-loop measurement). More worse than the table rejects.
BAR = {0: 5, 1: 7, 2: 9, 3: 10}

Gate = Literal["bar", "bar+significant", "no-regressions", "off"]
Decision = Literal["accepted", "rejected", "unresolved", "refused"]
Outcome = Literal["fixed", "still_failing", "broke", "already_passing", "mixed", "unscored"]
BandStatus = Literal["within", "above_improving", "above", "unknown"]
GATES: tuple[Gate, ...] = ("bar", "bar+significant", "no-regressions", "off")


class RunNotFoundError(ValueError):
    """A run reference that names no run directory."""


class UnreadableRunError(ValueError):
    """A run directory whose run.json cannot be read."""


class _Model(BaseModel):
    # Validators are built on first use: a comparison never needs the gate's or targeted
    # mode's models unless asked, and each build costs milliseconds at every start.
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
    excluded: str | None = None
    """Why the case leaves every aggregate (`contaminated`, `gold_wrong`, `harness_error`), or
    None; such a case is dropped from a comparison (see `aggregates`)."""

    @property
    def passed(self) -> bool | None:
        """True for match, False for no_match, None for anything else (never a fail)."""
        return _PASSED.get(self.verdict or "")


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

    @property
    def name(self) -> str:
        """The label when there is one, else the run id."""
        return self.label or self.run_id


def read_compared(run_dir: Path) -> RunLedger:
    """Read what a comparison of `run_dir` needs (`run_view`, `harness_failure`), unvalidated."""
    return read_run(run_dir, kinds=COMPARED_KINDS, validate=False, fields=COMPARED_FIELDS)


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
    for (qid, _sample), score in ledger.scores().items():
        scores.setdefault(qid, []).append(score)
    queries: dict[str, dict[int | None, str | None]] = {}
    for (qid, sample), attempt in ledger.attempts().items():
        queries.setdefault(qid, {})[sample] = attempt.final_query
    cases = {}
    for qid in list(scores) + [q for q in queries if q not in scores]:
        cases[qid] = case_side(qid, scores.get(qid, []), queries.get(qid, {}))
    tally = aggregates.tally(ledger) if tally is None else tally
    return RunView(
        run_id=ledger.info.run_id,
        label=ledger.info.label,
        pins=pin_rules.pins_of(info),
        status=ledger.info.status,
        cases=cases,
        withheld=tally.withheld,
        outcomes=tally.outcomes,
    )


def case_side(
    qid: str, scores: list[ScoreEvent], queries: dict[int | None, str | None]
) -> CaseSide:
    """One case's verdict from its samples' scores.

    A case any of whose samples is contaminated, or whose golden a sample's judge showed wrong
    (`aggregates.outcome`), leaves every aggregate: no verdict, and `excluded` says why. An
    attempt without a score is unscored (`not_scored`) and excluded as a harness error.
    Otherwise one sample: its verdict. Several samples: the majority of decided
    (match/no_match) samples; a tie is unscored. With no decided sample, the commoner of
    near_match/needs_human (needs_human on a tie), else unscored.
    """
    if not scores:
        query = next(iter(queries.values()), None)
        return CaseSide(
            qid=qid, verdict=None, reason="not_scored", final_query=query, excluded="harness_error"
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
    elif len(ordered) == 1:
        pick, verdict, reason = ordered[0], ordered[0].verdict, None
    else:
        verdict, reason = _majority([s.verdict for s in ordered], len(ordered))
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
    if n == 1:
        return verdicts[0], None
    tally = Counter(v for v in verdicts if v is not None)
    match, no_match = tally["match"], tally["no_match"]
    if match or no_match:
        if match == no_match:
            return None, f"samples_split: {match} match, {no_match} no_match of {n}"
        return ("match" if match > no_match else "no_match"), None
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
    if (path / RUN_FILE).is_file():
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
    if (root / ref / RUN_FILE).is_file():
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


def compare(baseline: RunView, current: RunView, *, qids: set[str] | None = None) -> Comparison:
    """Classify every case of the two runs (restricted to `qids` when given)."""
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
    )
    for qid in sorted(base_ids & cur_ids, key=natural_key):
        _classify(result, baseline.cases[qid], current.cases[qid])
    return result


_DROP_ORDER = ("contaminated", "gold_wrong", "harness_error")


def _classify(result: Comparison, before: CaseSide, after: CaseSide) -> None:
    out = {before.excluded, after.excluded}
    reason = next((r for r in _DROP_ORDER if r in out), None)
    if reason is not None:
        # Out of every aggregate on one side is out of the comparison (seed 004).
        result.dropped.append(
            Dropped(qid=before.qid, reason=reason, baseline=before, current=after)
        )
        return
    was, now = before.passed, after.passed
    if was is None or now is None:
        result.neither.append(Neither(qid=before.qid, baseline=before, current=after))
        if before.verdict == after.verdict == "near_match":
            result.stable_near_match.append(before.qid)
    elif was == now:
        (result.stable_pass if now else result.stable_fail).append(before.qid)
    else:
        (result.better if now else result.worse).append(
            Flip(qid=before.qid, baseline=before, current=after)
        )


# --- the acceptance bar and the gates ----------------------------------------------------


def acceptance_bar(better: int, worse: int) -> Literal["accepted", "rejected", "unresolved"]:
    """The flip-count bar: worse 0 needs >= 5 better, 1 -> 7, 2 -> 9, 3 -> 10; more rejects."""
    if better < 0 or worse < 0:
        raise ValueError(f"flip counts cannot be negative (better={better}, worse={worse})")
    if worse not in BAR:
        return "rejected"
    return "accepted" if better >= BAR[worse] else "unresolved"


def bar_rule(better: int, worse: int) -> str:
    """The row of the bar that decides, in words."""
    if worse not in BAR:
        return f"{worse} worse: more than {max(BAR)} worse rejects whatever got better"
    return f"{worse} worse needs >= {BAR[worse]} better; got {better}"


def no_regressions(c: Comparison) -> Literal["accepted", "rejected"]:
    """The `no-regressions` gate: accepted iff no case went match -> no_match."""
    return "rejected" if c.worse else "accepted"


class GateVerdict(_Model):
    """What a gate decided about a comparison, and the rule that decided it."""

    gate: Gate
    decision: Decision
    reason: str
    better: int
    worse: int
    regressions: list[str] = Field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 when the gate is off or accepts, else EXIT_GATE_REJECTED."""
        return 0 if self.gate == "off" or self.decision == "accepted" else EXIT_GATE_REJECTED


def decide_gate(
    gate: Gate,
    comparison: Comparison,
    *,
    allow_pin_mismatch: bool,
    targeted: TargetedReport | None,
    override_flag: str = OVERRIDE_FLAG,
    paired: PairedTests | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> GateVerdict:
    """Apply a gate. Differing pins refuse (unless allowed); a targeted regression rejects.

    A pair whose breaking pins differ is a rebase whatever the gate: it is refused, also under
    `off` (which still exits 0), unless `override_flag` was given, and then the reason says it
    is a rebase. `off` otherwise reports what the bar would say, with exit code 0.
    `bar+significant` is the bar, then `significance.require_significance` over `paired`.
    """
    if gate not in GATES:
        raise ValueError(f"unknown gate {gate!r}; use one of {', '.join(GATES)}")
    better, worse = len(comparison.better), len(comparison.worse)
    # In targeted mode a one-arm untargeted flip within the band is noise; only what broke
    # reproducibly (or a target that broke) counts as a regression.
    regressions = [f.qid for f in comparison.worse] if targeted is None else targeted.regressions
    names = ", ".join(d.name for d in comparison.pin_diffs)
    rebase = ""
    if comparison.pin_diffs:
        rebase = f"pins differ ({names}), allowed by {override_flag}: a rebase, not a delta; "

    def verdict(decision: Decision, reason: str) -> GateVerdict:
        if gate == "off":
            reason = f"gate off (exit status not gated); {reason}"
        return GateVerdict(
            gate=gate,
            decision=decision,
            reason=rebase + reason if decision != "refused" else reason,
            better=better,
            worse=worse,
            regressions=regressions,
        )

    if comparison.pin_diffs and not allow_pin_mismatch:
        return verdict(
            "refused",
            f"pins differ ({names}): a rebase, not a delta; re-run the baseline under the "
            f"current pins, or pass {override_flag} to compare them anyway",
        )
    if comparison.withheld:
        # Whatever the flips say, a run whose pass rate is withheld is no acceptance (in any
        # gate mode: `off` says the same and only leaves the exit status alone).
        would = acceptance_bar(better, worse) if targeted is None else targeted.decision()[0]
        return verdict(
            "refused",
            f"pass rate withheld ({'; '.join(comparison.withheld)}); no gate accepts "
            f"such a run; fix the harness and re-run (the flips alone: {would})",
        )
    if targeted is not None and targeted.regressions:
        return verdict(*targeted.decision())
    if gate == "no-regressions":
        if comparison.worse:
            return verdict("rejected", f"no-regressions: {worse} case(s) went match -> no_match")
        if targeted is not None:
            return verdict(*targeted.decision())
        return verdict("accepted", "no-regressions: no case went match -> no_match")
    decision, reason = (
        targeted.decision()
        if targeted is not None
        else (acceptance_bar(better, worse), f"acceptance bar: {bar_rule(better, worse)}")
    )
    if gate == BAR_SIGNIFICANT:
        if paired is None:
            raise ValueError(f"the {BAR_SIGNIFICANT} gate needs the comparison's paired tests")
        return require_significance(verdict(decision, reason), paired, alpha)
    return verdict(decision, reason)


def acceptance_event(
    verdict: GateVerdict, comparison: Comparison, *, final_run_ids: list[str]
) -> AcceptanceCheckEvent:
    """The ledger's `acceptance_check` event for a gate decision."""
    return AcceptanceCheckEvent(
        decision=verdict.decision,
        gate=verdict.gate,
        reason=verdict.reason,
        baselineRunId=comparison.baseline_run_id,
        finalRunIds=final_run_ids,
        regressions=verdict.regressions,
        better=[f.qid for f in comparison.better],
        worse=[f.qid for f in comparison.worse],
    )


# --- targeted mode -----------------------------------------------------------------------


class TargetOutcome(_Model):
    """What happened to one target across the post arms."""

    qid: str
    outcome: Outcome
    baseline: str | None
    post: list[str | None]


class TargetedReport(_Model):
    """Targets named before the run, judged on their own; the rest judged against the band."""

    arms: int
    targets: list[TargetOutcome] = Field(default_factory=list)
    unknown_targets: list[str] = Field(default_factory=list)
    untargeted_better: list[list[str]] = Field(default_factory=list)
    """Per post arm, untargeted cases no_match -> match."""
    untargeted_worse: list[list[str]] = Field(default_factory=list)
    regressed_in_both: list[str] = Field(default_factory=list)
    unclaimed_wins: list[str] = Field(default_factory=list)
    noise_band: int | None = None

    def with_outcome(self, outcome: Outcome) -> list[str]:
        """The targets with one outcome."""
        return [t.qid for t in self.targets if t.outcome == outcome]

    @property
    def regressions(self) -> list[str]:
        """Cases that block acceptance: targets that broke, untargeted worse in both arms."""
        return self.with_outcome("broke") + self.regressed_in_both

    @property
    def untargeted_flips(self) -> list[int]:
        """Untargeted flips per post arm."""
        return [
            len(b) + len(w)
            for b, w in zip(self.untargeted_better, self.untargeted_worse, strict=True)
        ]

    @property
    def band_status(self) -> BandStatus:
        """Where the untargeted flips sit against the band (every arm must be within it)."""
        if self.noise_band is None:
            return "unknown"
        if max(self.untargeted_flips, default=0) <= self.noise_band:
            return "within"
        return "above" if any(self.untargeted_worse) else "above_improving"

    def decision(self) -> tuple[Decision, str]:
        """The targeted acceptance rule and its reason (seed 004, targeted fixes)."""
        if self.regressions:
            parts = []
            if self.with_outcome("broke"):
                parts.append(f"targets that broke: {_few(self.with_outcome('broke'))}")
            if self.regressed_in_both:
                parts.append(f"untargeted worse in both post arms: {_few(self.regressed_in_both)}")
            return "rejected", "targeted mode: regression, not noise -- " + "; ".join(parts)
        if not self.targets:
            return "unresolved", "targeted mode: no known target to judge the fix on"
        pending = [t.qid for t in self.targets if t.outcome not in ("fixed",)]
        if pending:
            return "unresolved", f"targeted mode: targets not fixed in every arm: {_few(pending)}"
        if self.band_status == "above":
            return "unresolved", "targeted mode: untargeted flips above the noise band; investigate"
        if self.band_status == "unknown" and any(self.untargeted_worse):
            return "unresolved", (
                "targeted mode: untargeted cases got worse and no noise band "
                "is known; measure an A/A and pass the band"
            )
        if self.arms < 2:
            return "unresolved", (
                "targeted mode: every target fixed, but one post arm cannot "
                "tell a regression from noise; run a second post arm"
            )
        return "accepted", "targeted mode: every target fixed in both post arms, none broke"


def targeted(
    baseline: RunView,
    post: RunView,
    post2: RunView | None,
    targets: list[str],
    noise_band: int | None,
) -> TargetedReport:
    """Targeted mode: per-target outcomes, untargeted flips per arm, both-arm regressions."""
    arms = [post] if post2 is None else [post, post2]
    known = set(baseline.cases) | {q for arm in arms for q in arm.cases}
    wanted = list(dict.fromkeys(targets))
    report = TargetedReport(
        arms=len(arms),
        unknown_targets=[q for q in wanted if q not in known],
        noise_band=noise_band,
    )
    for qid in wanted:
        if qid in known:
            report.targets.append(_target_outcome(qid, baseline, arms))
    aimed = set(wanted)
    for arm in arms:
        c = compare(baseline, arm, qids=set(baseline.cases) - aimed)
        report.untargeted_better.append([f.qid for f in c.better])
        report.untargeted_worse.append([f.qid for f in c.worse])
    if post2 is not None:
        report.regressed_in_both = _in_both(report.untargeted_worse)
        report.unclaimed_wins = _in_both(report.untargeted_better)
    return report


def _in_both(per_arm: list[list[str]]) -> list[str]:
    second = set(per_arm[1])
    return [qid for qid in per_arm[0] if qid in second]


def _target_outcome(qid: str, baseline: RunView, arms: list[RunView]) -> TargetOutcome:
    before = baseline.cases.get(qid)
    after = [arm.cases.get(qid) for arm in arms]
    was = before.passed if before else None
    now = [side.passed if side else None for side in after]
    outcome: Outcome
    if was is None or None in now:
        outcome = "unscored"
    elif was:
        outcome = "already_passing" if all(now) else "broke"
    elif all(now):
        outcome = "fixed"
    else:
        outcome = "still_failing" if not any(now) else "mixed"
    return TargetOutcome(
        qid=qid,
        outcome=outcome,
        baseline=before.verdict if before else None,
        post=[side.verdict if side else None for side in after],
    )


def parse_targets(spec: str) -> list[str]:
    """Target qids from `q1,q2` or `@file` (one qid per line, `#` starts a comment)."""
    if spec.startswith("@"):
        path = Path(spec[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(
                f"targets file {path}: {exc.strerror}; give an existing file of qids, one per line"
            ) from exc
        raw = [line.split("#", 1)[0] for line in text.splitlines()]
    else:
        raw = [spec]
    qids = [q for chunk in raw for q in re.split(r"[,\s]+", chunk) if q]
    if not qids:
        raise ValueError(f"targets {spec!r} name no qid; pass q1,q2 or @file with one qid a line")
    return list(dict.fromkeys(qids))


# --- harness failure ---------------------------------------------------------------------


def harness_failure(ledger: RunLedger) -> str | None:
    """Why a run cannot be measured at all, or None (`aggregates.Tally.harness_failure`).

    Aborted, invalid (its ledger does not validate), or contaminated attempts above 10% (any
    contamination on a run under 10 attempts): such a run is a harness failure and no model
    score may be published from it.
    """
    return aggregates.tally(ledger).harness_failure


# --- the report ----------------------------------------------------------------------------

_OUTCOME_WORDS: dict[Outcome, str] = {
    "fixed": "FIXED",
    "still_failing": "still failing",
    "broke": "BROKE",
    "already_passing": "already passing",
    "mixed": "fixed in one arm only",
    "unscored": "unscored",
}
WIDTH = 96
NOISE_BAND_FLAG = "--noise-band"
DETAIL_LIMIT = 25


def report_lines(
    c: Comparison,
    gate: GateVerdict | None,
    targeted: TargetedReport | None,
    *,
    baseline_label: str,
    current_label: str,
    band: CalibrationBand | None,
    verbosity: int,
) -> list[str]:
    """The flip table as plain lines, the terminal summary and `evalloop flips` share it."""
    lines = [f"flips: {baseline_label} (baseline) -> {current_label} (current)"]
    lines += _pin_warning(c)
    lines += _counts(c, band)
    if verbosity >= 0:
        # A rebase can flip hundreds of cases; the default view details the first few.
        limit = None if verbosity >= 1 else DETAIL_LIMIT
        unstable = frozenset(band.unstable or []) if band is not None else frozenset()
        lines += _flip_section("better", c.better, limit, unstable)
        lines += _flip_section("worse", c.worse, limit, unstable)
    else:
        lines += _qid_list("better", [f.qid for f in c.better])
        lines += _qid_list("worse", [f.qid for f in c.worse])
    if verbosity >= 1:
        lines += _neither_section(c.neither)
        lines += _neither_section(c.dropped, "dropped")
    if verbosity >= 2:
        lines += _qid_list("stable pass", c.stable_pass)
        lines += _qid_list("stable fail", c.stable_fail)
    if c.stable_near_match:
        lines += _qid_list("coverage findings (near_match in both runs)", c.stable_near_match)
    lines += _case_set_lines(c, baseline_label, current_label)
    if targeted is not None:
        lines += _targeted_lines(targeted)
    if gate is not None:
        lines += _wrapped(f"gate {gate.gate}: {gate.decision.upper()} -- {gate.reason}", "")
    return lines


def _pin_warning(c: Comparison) -> list[str]:
    lines = []
    if c.pin_diffs:
        lines.append(
            "WARNING: pins differ between the runs -- this comparison is a rebase, not a delta:"
        )
        lines += [f"  {d.name}: {_pin(d.baseline)} -> {_pin(d.current)}" for d in c.pin_diffs]
    if c.model_change:
        lines.append("changed (the change under test): the served model")
        lines += [f"  {d.name}: {_pin(d.baseline)} -> {_pin(d.current)}" for d in c.model_change]
    if c.recorded_diffs:
        lines += _wrapped(
            "note: tool versions differ (recorded, not a comparison pin): "
            + pin_rules.describe(c.recorded_diffs),
            "",
        )
    return lines


def _pin(value: Any) -> str:
    return pin_rules.show(value)


def _counts(c: Comparison, band: CalibrationBand | None) -> list[str]:
    scored = c.scored_in_both
    pct = f" ({100 * c.flips / scored:.0f}%)" if scored else ""
    flipped = f"flipped: {c.flips} of {scored} scored in both{pct}"
    if band is not None:
        flipped += f"; A/A noise band {band.band} ({_band_origin(band)})"
    tally = Counter(n.category for n in c.neither)
    parts = [f"{k} {tally[k]}" for k in ("near_match", "needs_human", "unscored") if tally[k]]
    neither = f"neither pass nor fail: {len(c.neither)}"
    return [
        f"better (no_match -> match): {len(c.better)}   worse (match -> no_match): {len(c.worse)}",
        f"stable pass: {len(c.stable_pass)}   stable fail: {len(c.stable_fail)}   "
        + neither
        + (f" ({', '.join(parts)})" if parts else ""),
        flipped,
        *_dropped_lines(c),
    ]


def _dropped_lines(c: Comparison) -> list[str]:
    if not c.dropped:
        return []
    parts = [
        f"{len(qids)} {reason} ({_few(qids, 5)})"
        for reason in _DROP_ORDER
        if (qids := c.dropped_for(reason))
    ]
    text = f"dropped (out of every aggregate on either side): {len(c.dropped)}: " + "; ".join(parts)
    return _wrapped(text, "")


def _band_origin(band: CalibrationBand) -> str:
    if band.source == NOISE_BAND_FLAG:
        return f"given by {NOISE_BAND_FLAG}"
    where = Path(band.source).name if band.source else CALIBRATION_FILE
    return f"{where}, measured {band.measured}"


def _verdict(case: CaseSide) -> str:
    return case.verdict or "unscored"


def _flip_section(
    title: str, flips: list[Flip], limit: int | None, unstable: frozenset[str] = frozenset()
) -> list[str]:
    if not flips:
        return []
    lines = [f"{title}:"]
    shown = flips if limit is None else flips[:limit]
    for flip in shown:
        # A case the A/A pair found unstable (`evalloop noise`) flips by itself too.
        mark = " [unstable in the A/A pair]" if flip.qid in unstable else ""
        lines.append(f"  {flip.qid}: {_verdict(flip.baseline)} -> {_verdict(flip.current)}{mark}")
        if flip.current.why:
            lines += _wrapped("why (current): " + flip.current.why, "    ")
        lines += _query_lines(flip.baseline.final_query, flip.current.final_query)
    rest = [f.qid for f in flips[len(shown) :]]
    if rest:
        lines += _wrapped(f"... and {len(rest)} more (-v shows them): " + _few(rest, 50), "  ")
    return lines


def _query_lines(before: str | None, after: str | None) -> list[str]:
    if before is None and after is None:
        return ["    neither run recorded a final query"]
    if before == after:
        return [
            "    same query in both arms (the flip is downstream of the query):",
            *_indented(before),
        ]
    return ["    baseline query:", *_indented(before), "    current query:", *_indented(after)]


def _indented(query: str | None) -> list[str]:
    if query is None:
        return ["      (none recorded)"]
    return ["      " + line for line in query.strip("\n").splitlines()] or ["      (empty)"]


def _wrapped(text: str, indent: str) -> list[str]:
    flat = " ".join(text.split())
    return textwrap.wrap(flat, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def _qid_list(title: str, qids: list[str], limit: int | None = None) -> list[str]:
    if not qids:
        return []
    shown = qids if limit is None or len(qids) <= limit else qids[:limit] + ["..."]
    return _wrapped(f"{title} ({len(qids)}): " + ", ".join(shown), "")


def _neither_section(
    cases: list[Neither] | list[Dropped], title: str = "neither pass nor fail"
) -> list[str]:
    if not cases:
        return []
    lines = [f"{title}:"]
    for case in cases:
        reasons = [r for r in (case.baseline.reason, case.current.reason) if r]
        why = f" ({'; '.join(dict.fromkeys(reasons))})" if reasons else ""
        text = f"{case.qid}: {_verdict(case.baseline)} -> {_verdict(case.current)}{why}"
        lines += _wrapped(text, "  ")
    return lines


def _case_set_lines(c: Comparison, baseline_label: str, current_label: str) -> list[str]:
    lines = []
    if c.only_in_baseline:
        lines += _qid_list(f"only in {baseline_label} (not compared)", c.only_in_baseline, 10)
    if c.only_in_current:
        lines += _qid_list(f"only in {current_label} (not compared)", c.only_in_current, 10)
    return lines


def _targeted_lines(t: TargetedReport) -> list[str]:
    lines = [f"targeted mode: {len(t.targets)} target(s), {t.arms} post arm(s)"]
    for outcome, word in _OUTCOME_WORDS.items():
        qids = t.with_outcome(outcome)
        if qids:
            lines += _wrapped(f"{word}: " + ", ".join(qids), "  ")
    if t.unknown_targets:
        lines += _wrapped("unknown targets (dropped): " + ", ".join(t.unknown_targets), "  ")
    per_arm = ", ".join(
        f"{len(b) + len(w)} in arm {i} ({len(b)} better, {len(w)} worse)"
        for i, (b, w) in enumerate(
            zip(t.untargeted_better, t.untargeted_worse, strict=True), start=1
        )
    )
    lines.append(f"untargeted flips: {per_arm}")
    lines.append("  " + _band_sentence(t))
    if t.arms < 2:
        lines.append("  one post arm: a reproducible regression cannot be told from noise")
    if t.regressed_in_both:
        lines += _wrapped(
            "REGRESSED IN BOTH post arms -- not noise; DO NOT ACCEPT on the band "
            "alone: " + ", ".join(t.regressed_in_both),
            "  ",
        )
    if t.unclaimed_wins:
        lines += _wrapped(
            "unclaimed win (better in both post arms): " + ", ".join(t.unclaimed_wins), "  "
        )
    return lines


def _band_sentence(t: TargetedReport) -> str:
    status = t.band_status
    if status == "unknown":
        return "no noise band: measure an A/A pair and pass it (--noise-band or CALIBRATION.md)"
    if status == "within":
        return f"within the measured noise band ({t.noise_band})"
    if status == "above_improving":
        return f"above the band ({t.noise_band}), but every untargeted flip is an improvement"
    return f"ABOVE the measured noise band ({t.noise_band}); investigate those before accepting"


def _few(qids: Iterable[str], limit: int = 10) -> str:
    items = list(qids)
    return ", ".join(items[:limit]) + (
        f" (+{len(items) - limit} more)" if len(items) > limit else ""
    )


# --- `evalloop flips` ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalloop flips",
        description="Compare two stored runs case by case: flips, the acceptance bar, targets.",
        epilog=f"exit: 0 ok, {EXIT_USAGE} bad arguments, {EXIT_GATE_REJECTED} gate rejected/"
        f"unresolved/refused, {EXIT_HARNESS_FAILURE} harness failure (with --gate)",
    )
    parser.add_argument("baseline", help="baseline run: a run directory or a label")
    parser.add_argument("current", help="current (post-edit) run: a run directory or a label")
    parser.add_argument("--set", dest="set_dir", type=Path, help="set directory (labels in runs/)")
    parser.add_argument("--runs-dir", type=Path, help="where labelled runs live")
    parser.add_argument("--targets", help="targeted mode: q1,q2 or @file, named before the run")
    parser.add_argument("--noise-band", type=_band_arg, help="flips an A/A pair measured")
    parser.add_argument("--b2", help="a second post-edit run (targeted mode)")
    parser.add_argument("--gate", choices=GATES, help="exit non-zero unless this gate accepts")
    parser.add_argument(
        "--alpha",
        type=_alpha_arg,
        default=DEFAULT_ALPHA,
        help=f"with --gate {BAR_SIGNIFICANT}: the paired p-value must be under this "
        f"(default {DEFAULT_ALPHA})",
    )
    parser.add_argument(
        "--allow-pin-mismatch",
        action="store_true",
        help="gate even though pins differ (a rebase, not a delta)",
    )
    parser.add_argument(
        "--calibration",
        action="store_true",
        help="print a CALIBRATION.md block for the pair as an A/A",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0)
    parser.add_argument("-q", "--quiet", action="count", default=0)
    return parser


def _band_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a flip count; pass a whole number >= 0 from an A/A pair"
        )
    return value


def _alpha_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a level; pass a number in (0, 1)")
    return value


def flips_main(argv: list[str]) -> int:
    """`evalloop flips A B ...`: print the flip table; with --gate, exit with its code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return _run(args)
    except ValueError as exc:
        print(f"evalloop flips: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    if args.b2 and not args.targets:
        raise ValueError(
            "--b2 is a second post arm for targeted mode; name the targets with "
            "--targets q1,q2 (chosen before the run)"
        )
    targets = parse_targets(args.targets) if args.targets else None
    find = {"set_dir": args.set_dir, "runs_dir": args.runs_dir}
    base_led = read_compared(resolve_run(args.baseline, **find))
    cur_led = read_compared(resolve_run(args.current, **find))
    with gc_paused():  # a view per case per run, and no cycle among them (see gc_paused)
        base, cur = run_view(base_led), run_view(cur_led)
        comparison = compare(base, cur)
    if args.calibration:
        return _print_calibration(comparison, base, cur)
    post2 = run_view(read_compared(resolve_run(args.b2, **find))) if args.b2 else None
    band = _find_band(args, base, cur, base_led)
    noise = band.band if band else None
    report = None
    if targets is not None:
        report = targeted(base, cur, post2, targets, noise)
    paired = paired_tests(comparison, base_led, cur_led)
    verdict = None
    if args.gate:
        verdict = decide_gate(
            args.gate,
            comparison,
            allow_pin_mismatch=args.allow_pin_mismatch,
            targeted=report,
            override_flag="--allow-pin-mismatch",
            paired=paired,
            alpha=args.alpha,
        )
    lines = report_lines(
        comparison,
        verdict,
        report,
        baseline_label=base.name,
        current_label=cur.name,
        band=band,
        verbosity=args.verbose - args.quiet,
    )
    lines += paired_lines(paired)
    print("\n".join(lines))
    failures = [f for f in map(harness_failure, (base_led, cur_led)) if f]
    for failure in failures:
        print(f"HARNESS FAILURE: {failure}", file=sys.stderr)
    if args.gate and args.gate != "off" and failures:
        return EXIT_HARNESS_FAILURE
    return verdict.exit_code if verdict else 0


def _find_band(
    args: argparse.Namespace, base: RunView, cur: RunView, base_led: RunLedger
) -> CalibrationBand | None:
    if args.noise_band is not None:
        # A band given by hand belongs to this pair by the user's word; say so in the report.
        return CalibrationBand(
            band=args.noise_band,
            measured=today(),
            runs=[base.run_id, cur.run_id],
            pins=dict(cur.pins),
            source=NOISE_BAND_FLAG,
        )
    set_dir = args.set_dir
    if set_dir is None and base_led.run_dir.parent.name == "runs":
        set_dir = base_led.run_dir.parent.parent
    if set_dir is None:
        return None
    calibration: Calibration = load_calibration(set_dir / CALIBRATION_FILE)
    for problem in calibration.problems:
        print(f"warning: {problem}", file=sys.stderr)
    band = calibration.band_for(cur.pins)
    return band if band is not None and band.matches(base.pins) else None


def _print_calibration(c: Comparison, base: RunView, cur: RunView) -> int:
    # An A/A pair is one configuration twice: no breaking pin and not the model may differ.
    differ = c.pin_diffs + c.model_change
    if differ:
        names = ", ".join(d.name for d in differ)
        raise ValueError(
            f"not an A/A pair: pins differ ({names}): {pin_rules.describe(differ)}; run both "
            "arms under one configuration to measure a band"
        )
    if base.run_id == cur.run_id:
        raise ValueError(f"both runs are {base.run_id!r}; an A/A needs two independent runs")
    band = CalibrationBand(
        band=c.flips,
        measured=today(),
        runs=[base.run_id, cur.run_id],
        pins=dict(cur.pins),
        scoredInBoth=c.scored_in_both,
        flipped=sorted([f.qid for f in c.better + c.worse], key=natural_key),
    )
    print(render_block(band), end="")
    lines = report_lines(
        c, None, None, baseline_label=base.name, current_label=cur.name, band=None, verbosity=-1
    )
    print("\n".join(lines), file=sys.stderr)
    return 0
