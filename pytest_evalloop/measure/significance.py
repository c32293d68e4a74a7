"""A paired test beside the acceptance bar: how surprising a comparison's flips would be if
the change made no difference.

The bar (seed 004) decides; nothing here overrides it. :func:`paired_tests` computes, for a
comparison, the exact McNemar p-value over its discordant cases (the bar's own better/worse
flips) and, when either run has several samples per case, the paired sign-flip permutation
p-value over per-case pass fractions (`repeats.case_counts`, the aggregates rule). The
terminal summary and `evalloop flips` print :func:`lines` under the gate's line, and
`--eval-gate=bar+significant` (:func:`require_significance`) accepts only when the bar accepts
and the p-value is under `--eval-alpha`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_evalloop.measure import stats

if TYPE_CHECKING:
    from pytest_evalloop.ledger.reader import RunLedger
    from pytest_evalloop.measure.aggregates import Tally
    from pytest_evalloop.measure.comparison import Comparison
    from pytest_evalloop.measure.gate import GateVerdict, TargetedReport

BAR_SIGNIFICANT = "bar+significant"
"""The gate that needs both the bar and a paired test under alpha."""
DEFAULT_ALPHA = 0.05


@dataclass(frozen=True)
class PairedTests:
    """The paired tests of one comparison."""

    better: int
    worse: int
    mcnemar_p: float
    sign_flip_p: float | None
    """With samples only (None when both runs have one sample per case)."""
    sign_flip_cases: int
    """Cases with a pass fraction on both sides (the sign-flip test's n)."""
    mean_difference: float | None
    """Mean per-case (current − baseline) pass fraction over those cases."""

    @property
    def p(self) -> float:
        """The p-value a `bar+significant` gate reads: sign-flip with samples, else McNemar."""
        return self.mcnemar_p if self.sign_flip_p is None else self.sign_flip_p

    @property
    def test_name(self) -> str:
        """Which test :attr:`p` comes from."""
        return "McNemar" if self.sign_flip_p is None else "sign-flip"


def paired_tests(
    comparison: Comparison,
    baseline: RunLedger,
    current: RunLedger,
    tallies: tuple[Tally, Tally] | None = None,
) -> PairedTests:
    """McNemar over the comparison's flips; the sign-flip test over per-case fractions of the
    cases the comparison kept (not dropped), when either side has more than one sample.
    `tallies`: both ledgers' `aggregates.tally` (baseline first), when the caller has them."""
    from pytest_evalloop.measure import aggregates, repeats

    better, worse = len(comparison.better), len(comparison.worse)
    base_tally, cur_tally = tallies or (aggregates.tally(baseline), aggregates.tally(current))
    before = repeats.case_counts(base_tally)
    after = repeats.case_counts(cur_tally)
    dropped = {d.qid for d in getattr(comparison, "dropped", [])}
    kept = [
        *(f.qid for f in comparison.better + comparison.worse),
        *comparison.stable_pass,
        *comparison.stable_fail,
        *(n.qid for n in comparison.neither),
    ]
    differences = []
    for qid in kept:
        if qid in dropped or qid not in before or qid not in after:
            continue
        was, now = before[qid].fraction, after[qid].fraction
        if was is not None and now is not None:
            differences.append(now - was)
    sampled = any(c.samples > 1 for side in (before, after) for c in side.values())
    return PairedTests(
        better=better,
        worse=worse,
        mcnemar_p=stats.mcnemar_exact(better, worse),
        sign_flip_p=stats.sign_flip_test(differences) if sampled else None,
        sign_flip_cases=len(differences),
        mean_difference=sum(differences) / len(differences) if differences else None,
    )


def targeted_tests(report: TargetedReport) -> PairedTests:
    """In targeted mode the decision is about the targets, so its paired test is too: exact
    McNemar over the targets that were fixed (better) against those that broke (worse)."""
    better, worse = len(report.with_outcome("fixed")), len(report.with_outcome("broke"))
    return PairedTests(
        better=better,
        worse=worse,
        mcnemar_p=stats.mcnemar_exact(better, worse),
        sign_flip_p=None,
        sign_flip_cases=0,
        mean_difference=None,
    )


def lines(tests: PairedTests, alpha: float = DEFAULT_ALPHA) -> list[str]:
    """The paired tests in words, each with what it assumes (and, when McNemar is the test and
    too few cases are discordant to reach `alpha`, `caveats.significance_note`)."""
    from pytest_evalloop.measure import caveats

    n = tests.better + tests.worse
    out = [
        f"paired test (exact McNemar, two-sided, over {n} discordant cases: {tests.better} "
        f"better, {tests.worse} worse): p = {_p(tests.mcnemar_p)}; assumes independent cases "
        "and one decided verdict per case per run"
    ]
    if tests.sign_flip_p is not None:
        mean = "n/a" if tests.mean_difference is None else f"{tests.mean_difference:+.3f}"
        out.append(
            f"paired test (sign-flip permutation over {tests.sign_flip_cases} cases' pass "
            f"fractions, mean change {mean}): p = {_p(tests.sign_flip_p)}; assumes independent "
            "cases whose change is symmetric around 0 under no effect (no normality)"
        )
    if tests.sign_flip_p is None:
        out += caveats.significance_note(tests.better, tests.worse, alpha)
    out.append(
        "  the bar decides; a p-value is how often flips like these would occur if the change "
        "made no difference, not the chance the change works"
    )
    return out


def record(tests: PairedTests) -> dict[str, float | int | None]:
    """The paired tests as `run.json` records them (`pairedTests`)."""
    return {
        "better": tests.better,
        "worse": tests.worse,
        "mcnemarP": round(tests.mcnemar_p, 6),
        "signFlipP": None if tests.sign_flip_p is None else round(tests.sign_flip_p, 6),
        "signFlipCases": tests.sign_flip_cases,
        "meanDifference": None
        if tests.mean_difference is None
        else round(tests.mean_difference, 6),
    }


def _p(value: float) -> str:
    return f"{value:.3g}" if value >= 0.001 else f"{value:.1e}"


def require_significance(verdict: GateVerdict, tests: PairedTests, alpha: float) -> GateVerdict:
    """`bar+significant`: a bar acceptance stands only when the paired p-value is < alpha;
    otherwise the decision is `unresolved` (gate exit status). Any other decision is kept."""
    gate = BAR_SIGNIFICANT
    if verdict.decision != "accepted":
        return verdict.model_copy(update={"gate": gate})
    if tests.p < alpha:
        reason = f"{verdict.reason}; {tests.test_name} p = {_p(tests.p)} < alpha {alpha:g}"
        return verdict.model_copy(update={"gate": gate, "reason": reason})
    reason = (
        f"{verdict.reason}, but {tests.test_name} p = {_p(tests.p)} is not < alpha {alpha:g}: "
        "the flips could be chance; add cases or samples, or gate on the bar alone"
    )
    return verdict.model_copy(update={"gate": gate, "decision": "unresolved", "reason": reason})
