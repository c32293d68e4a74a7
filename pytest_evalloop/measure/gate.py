"""What a comparison decides: the acceptance bar, the gates, targeted mode and the exit codes.

The acceptance bar and the targeted-mode rules are seed 004's eval-loop measurement doctrine;
docs/measurement.md is the user-facing account. Every function here is pure over
`comparison.Comparison` and `comparison.RunView`: the plugin's gate (`baseline`), `evalloop
flips` and `evalloop report` call the same ones.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pytest_evalloop.ledger.contract import AcceptanceCheckEvent
from pytest_evalloop.ledger.reader import RunLedger
from pytest_evalloop.measure import aggregates, caveats, transitions
from pytest_evalloop.measure.comparison import Comparison, RunView, compare, few
from pytest_evalloop.measure.pins import OVERRIDE_FLAG
from pytest_evalloop.measure.significance import (
    BAR_SIGNIFICANT,
    DEFAULT_ALPHA,
    PairedTests,
    mcnemar_tests,
    shown_p,
)

# pytest owns exit statuses 0-5; ours start above them so CI can tell a gate from a test failure.
EXIT_GATE_REJECTED = 6
"""The gate did not accept: rejected, unresolved, or refused (pins differ)."""
EXIT_HARNESS_FAILURE = 7
"""A run cannot be measured: aborted, or contaminated above the limit."""
EXIT_RUN_UNFINISHED = 8
"""This session's run did not finish (aborted, or interrupted by Ctrl-C or -x/--maxfail): with
or without a gate, unless `--eval-allow-aborted`. Never green: its verdicts are a subset."""
EXIT_NOTHING_MEASURED = 15
"""This session's run measured nothing (`measure/unmeasured.py`: most attempts not submitted,
or none decided), with or without a gate, unless `--eval-allow-unmeasured`. 9 is
`EXIT_NOTHING_TO_ANSWER` (nothing was answered at all), 10-14 are `evalloop merge`'s own."""
UNFINISHED = ("aborted", "interrupted")
"""The run statuses `EXIT_RUN_UNFINISHED` is for."""

# worse -> better needed (seed 004, eval-loop measurement). More worse than the table rejects.
BAR = {0: 5, 1: 7, 2: 9, 3: 10}

Gate = Literal["bar", "bar+significant", "no-regressions", "off"]
Decision = Literal["accepted", "rejected", "unresolved", "refused"]
TargetStatus = Literal["fixed", "still_failing", "broke", "already_passing", "mixed", "unscored"]
BandStatus = Literal["within", "above_improving", "above", "unknown"]
GATES: tuple[Gate, ...] = ("bar", "bar+significant", "no-regressions", "off")
SETTLE = (
    "settle them (`evalloop review` for needs_human/near_match, the golden side door for "
    "gold_wrong) or re-run"
)
"""What to do about cases undecided after a pass, in every reason that names them."""


class _Model(BaseModel):
    # Validators are built on first use: a comparison needs the gate's and targeted mode's
    # models only when asked, and each build costs milliseconds at every start.
    model_config = ConfigDict(defer_build=True)


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


def no_regressions(c: Comparison) -> Literal["accepted", "rejected", "unresolved"]:
    """The `no-regressions` gate: rejected when a case got worse (match -> no_match, or a pass
    the answerer left unanswered: `transitions.transition`); unresolved when a pass is
    undecided now (a lost decision may hide a regression); else accepted."""
    if c.worse:
        return "rejected"
    return "unresolved" if c.undecided else "accepted"


def lost_decisions(c: Comparison) -> str:
    """The undecided-after-a-pass cases by their real transition, for a reason ("" when none):
    `2 that passed in the baseline are undecided now (match -> needs_human: q1; match ->
    gold_wrong: q2)`."""
    if not c.undecided:
        return ""
    by: dict[str, list[str]] = {}
    for u in c.undecided:
        by.setdefault(f"match -> {u.word}", []).append(u.qid)
    parts = "; ".join(f"{name}: {few(qids, 5)}" for name, qids in by.items())
    return f"{len(c.undecided)} that passed in the baseline are undecided now ({parts})"


def worst_case_bar(better: int, worse: int, undecided: int) -> Decision | None:
    """The bar read with every lost decision as worse: None when that changes nothing, else
    what an acceptance becomes (`unresolved`: a lost decision is not known to be worse, so it
    never rejects on its own)."""
    if not undecided or acceptance_bar(better, worse) != "accepted":
        return None
    return None if acceptance_bar(better, worse + undecided) == "accepted" else "unresolved"


class GateVerdict(_Model):
    """What a gate decided about a comparison, and the rule that decided it."""

    gate: Gate
    decision: Decision
    reason: str
    better: int
    worse: int
    regressions: list[str] = Field(default_factory=list)
    inadmissible: bool = False
    """Refused by the comparability rule (`comparable`): the runs are not whole, finished,
    sealed, independent measurements of one design, so nothing was measured to decide on."""

    @property
    def exit_code(self) -> int:
        """0 when the gate is off or accepts; EXIT_HARNESS_FAILURE when the runs cannot be
        compared at all; else EXIT_GATE_REJECTED."""
        if self.gate == "off" or self.decision == "accepted":
            return 0
        return EXIT_HARNESS_FAILURE if self.inadmissible else EXIT_GATE_REJECTED


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
    `bar+significant` is the bar, then :func:`require_significance` over `paired`.
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

    def verdict(decision: Decision, reason: str, *, inadmissible: bool = False) -> GateVerdict:
        if gate == "off":
            reason = f"gate off (exit status not gated); {reason}"
        return GateVerdict(
            gate=gate,
            decision=decision,
            reason=rebase + reason if decision != "refused" else reason,
            better=better,
            worse=worse,
            regressions=regressions,
            inadmissible=inadmissible,
        )

    if comparison.refused:
        # Before the pins and the flips: runs that are not whole, finished, sealed and
        # independent measurements of one design carry no decision, whatever they show.
        would = acceptance_bar(better, worse) if targeted is None else targeted.decision()[0]
        return verdict(
            "refused",
            f"these runs cannot carry a decision: {'; '.join(comparison.refused)} (the flips "
            f"alone: {would})",
            inadmissible=True,
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
            by = ", ".join(f"{k}: {n}" for k, n in comparison.worse_by().items())
            return verdict("rejected", f"no-regressions: {worse} case(s) got worse ({by})")
        # Targeted or not: no-regressions rejects any case that got worse, band or none, so a
        # case that left a pass undecided (a harness error, a judge that could not decide)
        # cannot be accepted where failing it outright would have been rejected.
        if comparison.undecided:
            return verdict(
                "unresolved",
                f"no-regressions: no case got worse, but {lost_decisions(comparison)}: a lost "
                f"decision may hide a regression; {SETTLE}",
            )
        if targeted is not None:
            return verdict(*targeted.decision())
        return verdict("accepted", "no-regressions: no case that passed got worse or undecided")
    decision, reason = (
        targeted.decision()
        if targeted is not None
        else (acceptance_bar(better, worse), f"acceptance bar: {bar_rule(better, worse)}")
    )
    lost = len(comparison.undecided)
    if targeted is None and worst_case_bar(better, worse, lost) is not None:
        decision = "unresolved"
        reason = (
            f"{reason}; but {lost_decisions(comparison)}, and read as worse (a lost decision "
            f"may hide a regression) {bar_rule(better, worse + lost)}; {SETTLE}"
        )
    if gate == BAR_SIGNIFICANT:
        if paired is None:
            raise ValueError(f"the {BAR_SIGNIFICANT} gate needs the comparison's paired tests")
        if targeted is not None:
            # A targeted decision is judged on its targets, never on the set-wide test: exact
            # McNemar over the targets fixed against those that broke.
            fixed, broke = targeted.with_outcome("fixed"), targeted.with_outcome("broke")
            paired = mcnemar_tests(len(fixed), len(broke))
            reason = f"{reason} ({caveats.targeted_significance_note(len(targeted.targets))})"
        judged = require_significance(verdict(decision, reason), paired, alpha)
        if judged.decision == "unresolved":
            note = caveats_note(paired, alpha)
            if note:
                judged = judged.model_copy(update={"reason": f"{judged.reason}; {note}"})
        return judged
    return verdict(decision, reason)


def require_significance(verdict: GateVerdict, tests: PairedTests, alpha: float) -> GateVerdict:
    """`bar+significant`: a bar acceptance stands only when the paired p-value is < alpha;
    otherwise the decision is `unresolved` (gate exit status). Any other decision is kept."""
    gate = BAR_SIGNIFICANT
    if verdict.decision != "accepted":
        return verdict.model_copy(update={"gate": gate})
    if not tests.improves:
        # A two-sided p can be small for a change that made things worse: no acceptance.
        reason = (
            f"{verdict.reason}, but the {tests.test_name} test's change is no improvement "
            f"({tests.direction}): a small p says the runs differ, not that the change helped"
        )
        return verdict.model_copy(update={"gate": gate, "decision": "unresolved", "reason": reason})
    if tests.p < alpha:
        reason = f"{verdict.reason}; {tests.test_name} p = {shown_p(tests.p)} < alpha {alpha:g}"
        return verdict.model_copy(update={"gate": gate, "reason": reason})
    reason = (
        f"{verdict.reason}, but {tests.test_name} p = {shown_p(tests.p)} is not < alpha "
        f"{alpha:g}: the flips could be chance; add cases or samples, or gate on the bar alone"
    )
    return verdict.model_copy(update={"gate": gate, "decision": "unresolved", "reason": reason})


def caveats_note(paired: PairedTests, alpha: float) -> str:
    """Why a McNemar-tested acceptance could not have been significant ("" when it could)."""
    if paired.sign_flip_p is not None:
        return ""
    notes = caveats.significance_note(paired.better, paired.worse + paired.undecided, alpha)
    return notes[0].strip().removeprefix("note: ") if notes else ""


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
    outcome: TargetStatus
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
    untargeted_undecided: list[list[str]] = Field(default_factory=list)
    """Per post arm, untargeted cases that passed in the baseline and are undecided now: the
    decision reads them as worse before it accepts."""
    regressed_in_both: list[str] = Field(default_factory=list)
    unclaimed_wins: list[str] = Field(default_factory=list)
    noise_band: int | None = None

    def with_outcome(self, outcome: TargetStatus) -> list[str]:
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
        """The targeted acceptance rule and its reason (seed 004, targeted fixes); an
        acceptance stands only if it would stand with every untargeted lost decision read as
        worse (`transitions.LOST_AFTER_A_PASS`), else it is unresolved."""
        decision, reason = self._decision()
        lost = [qids for qids in self.untargeted_undecided if qids]
        if decision != "accepted" or not lost:
            return decision, reason
        read_worse = [
            w + u for w, u in zip(self.untargeted_worse, self.untargeted_undecided, strict=True)
        ]
        worst = self.model_copy(
            update={
                "untargeted_worse": read_worse,
                "untargeted_undecided": [],
                "regressed_in_both": _in_both(read_worse) if self.arms > 1 else [],
            }
        )
        if worst._decision()[0] == "accepted":
            return decision, reason
        shown = few(dict.fromkeys(q for qids in lost for q in qids))
        return "unresolved", (
            f"{reason}; but untargeted cases that passed in the baseline are undecided now "
            f"({shown}), and read as worse (a lost decision may hide a regression) it would "
            f"not accept: {worst._decision()[1]}; {SETTLE}"
        )

    def _decision(self) -> tuple[Decision, str]:
        if self.regressions:
            parts = []
            if self.with_outcome("broke"):
                parts.append(f"targets that broke: {few(self.with_outcome('broke'))}")
            if self.regressed_in_both:
                parts.append(f"untargeted worse in both post arms: {few(self.regressed_in_both)}")
            return "rejected", "targeted mode: regression, not noise -- " + "; ".join(parts)
        if not self.targets:
            return "unresolved", "targeted mode: no known target to judge the fix on"
        pending = [t.qid for t in self.targets if t.outcome not in ("fixed",)]
        if pending:
            return "unresolved", f"targeted mode: targets not fixed in every arm: {few(pending)}"
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
    if post2 is not None and post2.run_id == post.run_id:
        post2 = None  # one run twice is one arm (the plugin and `evalloop flips` refuse it)
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
        report.untargeted_undecided.append([u.qid for u in c.undecided])
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
    changes = [
        transitions.transition(before.word, side.word)[0] if before and side else None
        for side in after
    ]
    outcome: TargetStatus
    if "worse" in changes:
        # A target that passed and is not submitted in an arm broke there (doing less).
        outcome = "broke"
    elif was is None or None in now:
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
