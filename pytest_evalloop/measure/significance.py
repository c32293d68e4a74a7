"""A paired test beside the acceptance bar: how surprising a comparison's flips would be if
the change made no difference.

The bar (seed 004) decides; nothing here overrides it. :func:`paired_tests` computes, for a
comparison, the exact McNemar p-value over its discordant cases (the bar's own better/worse
flips, a pass the answerer left unanswered among the worse) and, when either run has several
samples per case, the paired sign-flip permutation p-value over per-case pass fractions. The
tests count what the bar counts: on the current side a sample the answerer left unanswered
(not submitted, no host log, contaminated, an answer error: `aggregates.fails_the_answer`) is
a failed sample, 0, so no test beside a rejection reports an improvement from doing less. The
terminal summary and `evalloop flips` print :func:`lines` under the gate's line, and
`--eval-gate=bar+significant` (`gate.require_significance`) accepts only when the bar accepts,
the paired change is an improvement and its p-value is under `--eval-alpha`. The tests know
counts and comparisons, never a gate: the gate reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_evalloop.measure import aggregates, caveats, repeats, stats
from pytest_evalloop.measure.comparison import Comparison, natural_key

if TYPE_CHECKING:
    from pytest_evalloop.ledger.reader import RunLedger
    from pytest_evalloop.measure.aggregates import Tally

BAR_SIGNIFICANT = "bar+significant"
"""The gate that needs both the bar and a paired test under alpha."""
DEFAULT_ALPHA = 0.05


@dataclass(frozen=True)
class PairedTests:
    """The paired tests of one comparison."""

    better: int
    worse: int
    mcnemar_p: float
    """Over the better flips against the worse ones and the undecided (read as worse)."""
    sign_flip_p: float | None
    """With samples only (None when both runs have one sample per case)."""
    sign_flip_cases: int
    """Cases with a pass fraction on both sides (the sign-flip test's n)."""
    mean_difference: float | None
    """Mean per-case (current − baseline) pass fraction over those cases."""
    undecided: int = 0
    """Passes undecided now (`comparison.undecided`): lost decisions, read as worse."""

    @property
    def p(self) -> float:
        """The p-value a `bar+significant` gate reads: sign-flip with samples, else McNemar."""
        return self.mcnemar_p if self.sign_flip_p is None else self.sign_flip_p

    @property
    def improves(self) -> bool:
        """Whether the change the test measures points up: more better than worse (McNemar),
        a positive mean change (sign-flip)."""
        if self.sign_flip_p is None:
            return self.better > self.worse + self.undecided
        return self.mean_difference is not None and self.mean_difference > 0

    @property
    def direction(self) -> str:
        """The measured change in words, for a reason."""
        if self.sign_flip_p is None:
            return f"{self.better} better, {self.worse + self.undecided} worse or undecided"
        mean = "n/a" if self.mean_difference is None else f"{self.mean_difference:+.3f}"
        return f"mean change {mean}"

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
    base_tally, cur_tally = tallies or (aggregates.tally(baseline), aggregates.tally(current))
    return tests_of(comparison, base_tally, cur_tally)


def tests_of(comparison: Comparison, baseline: Tally, current: Tally) -> PairedTests:
    """:func:`paired_tests` over the two runs' tallies, read as the bar reads a comparison
    before it accepts: against the change.

    McNemar's discordant cases are the better flips against the worse ones and the passes
    undecided now (a lost decision, read as worse). A baseline case's pass fraction is its
    matches over its decided samples; a current case's is its matches over all its samples:
    one the answerer left unanswered, or that is undecided now, is a failed sample, never a
    sample left out. A baseline that did less is no fail the change gets credit for fixing.
    """
    better, worse = len(comparison.better), len(comparison.worse)
    undecided = len(comparison.undecided)
    before = {q: c.fraction for q, c in repeats.case_counts(baseline).items()}
    after = _current_fractions(current)
    kept = [
        *(f.qid for f in comparison.better + comparison.worse),
        *comparison.stable_pass,
        *comparison.stable_fail,
        *(n.qid for n in comparison.neither),
        *(u.qid for u in comparison.undecided),
    ]
    differences, keys = [], []
    for qid in sorted(kept, key=natural_key):
        was, now = before.get(qid), after.get(qid)
        if was is not None and now is not None:
            differences.append(now - was)
            keys.append(qid)
    sampled = repeats.samples_given(baseline) > 1 or repeats.samples_given(current) > 1
    return PairedTests(
        better=better,
        worse=worse,
        undecided=undecided,
        mcnemar_p=stats.mcnemar_exact(better, worse + undecided),
        sign_flip_p=stats.sign_flip_test(differences, keys=keys) if sampled else None,
        sign_flip_cases=len(differences),
        mean_difference=sum(differences) / len(differences) if differences else None,
    )


def _current_fractions(tally: Tally) -> dict[str, float]:
    """Per case, its matches over all its samples: whatever else a sample is (a fail, not
    submitted, contaminated, undecided, an error), it is no pass."""
    passes: dict[str, int] = {}
    samples: dict[str, int] = {}
    for attempt in tally.attempts:
        samples[attempt.qid] = samples.get(attempt.qid, 0) + 1
        passes[attempt.qid] = passes.get(attempt.qid, 0) + (attempt.outcome == "match")
    return {q: passes[q] / n for q, n in samples.items()}


def mcnemar_tests(better: int, worse: int) -> PairedTests:
    """The paired test of two counts alone, with no samples: exact McNemar over `better`
    against `worse` (a targeted decision's targets fixed against those that broke)."""
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
    n = tests.better + tests.worse + tests.undecided
    lost = (
        f", {tests.undecided} undecided now after a pass, read as worse" if tests.undecided else ""
    )
    out = [
        f"paired test (exact McNemar, two-sided, over {n} discordant cases: {tests.better} "
        f"better, {tests.worse} worse{lost}): p = {shown_p(tests.mcnemar_p)}; assumes independent "
        "cases and one decided verdict per case per run"
    ]
    if tests.sign_flip_p is not None:
        mean = "n/a" if tests.mean_difference is None else f"{tests.mean_difference:+.3f}"
        out.append(
            f"paired test (sign-flip permutation over {tests.sign_flip_cases} cases' pass "
            f"fractions, mean change {mean}; a current sample that is not a match is no pass): "
            f"p = {shown_p(tests.sign_flip_p)}; assumes independent cases whose change is "
            "symmetric around 0 under no effect (no normality)"
        )
    if tests.sign_flip_p is None:
        out += caveats.significance_note(tests.better, tests.worse + tests.undecided, alpha)
    out.append(
        "  the bar decides; a p-value is how often flips like these would occur if the change "
        "made no difference, not the chance the change works"
    )
    return out


def record(tests: PairedTests) -> dict[str, float | int | None]:
    """The paired tests as `run.json` records them (`pairedTests`); the sign-flip fields only
    when there were samples (the test is run only then: ledger.md)."""
    out: dict[str, float | int | None] = {
        "better": tests.better,
        "worse": tests.worse,
        "undecided": tests.undecided,
        "mcnemarP": round(tests.mcnemar_p, 6),
    }
    if tests.sign_flip_p is not None:
        out["signFlipP"] = round(tests.sign_flip_p, 6)
        out["signFlipCases"] = tests.sign_flip_cases
        out["meanDifference"] = (
            None if tests.mean_difference is None else round(tests.mean_difference, 6)
        )
    return out


def shown_p(value: float) -> str:
    """A p-value as every line and reason prints it."""
    return f"{value:.3g}" if value >= 0.001 else f"{value:.1e}"
