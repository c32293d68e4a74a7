"""Where the numbers cannot carry a conclusion: the warnings every view prints beside them.

Each function here is pure and says one thing a reader would otherwise miss: that a paired test
cannot reach alpha on so few discordant cases, that two runs sampled differently are not like
for like, that a majority flip of a sampled case is not every sample flipping, that the
case-clustered interval covers less than 95% over few cases, and that in targeted mode the
paired test is over the targets. The terminal summary, `evalloop flips`, report.html and the
Markdown summary print these lines (through `comparison_text`, `significance` and `repeats`).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from pytest_evalloop.measure import stats

if TYPE_CHECKING:
    from pytest_evalloop.measure.comparison import CaseSide, Comparison

FEW_CLUSTERS = 30
"""Below this many cases the case-clustered interval's coverage falls short of its 95%
(a normal approximation on the between-case variance; about 92.5% at 6 cases)."""


@cache
def significance_floor(alpha: float) -> int:
    """The fewest discordant cases, all one way, whose exact McNemar p is under `alpha`.

    2 * 0.5**n < alpha: 6 at 0.05, 8 at 0.01. Fewer discordant cases can never be significant,
    however they split."""
    n = 1
    while stats.mcnemar_exact(n, 0) >= alpha:
        n += 1
    return n


def significance_note(better: int, worse: int, alpha: float) -> list[str]:
    """A note when McNemar cannot reach `alpha` on these discordant cases (none otherwise)."""
    n, floor = better + worse, significance_floor(alpha)
    if n >= floor:
        return []
    return [
        f"  note: {n} discordant case(s): McNemar's p cannot fall under alpha {alpha:g} with "
        f"fewer than {floor} discordant cases all one way, so bar+significant cannot accept "
        "this comparison; add cases or samples"
    ]


def samples_note(c: Comparison) -> list[str]:
    """A note when the two runs took a different number of samples per case."""
    base, cur = c.baseline_samples, c.current_samples
    if base == cur:
        return []
    return [
        f"note: the baseline has {base} sample(s) per case and the current run {cur}: a "
        f"case's verdict is one draw on a side with 1 sample and a majority on a side with "
        "more, so the flips are not like for like; re-run one side with the other's "
        "--eval-samples"
    ]


def side_fraction(side: CaseSide) -> str:
    """A sampled side's decided matches, e.g. " (1/3 match)"; "" for one sample."""
    if side.samples <= 1 or side.decided is None:
        return ""
    return f" ({side.passes}/{side.decided} match)"


def is_partial_flip(before: CaseSide, after: CaseSide) -> bool:
    """Whether a flip of sampled cases moved the majority, not every sample: 1/3 -> 2/3 is,
    0/3 -> 3/3 is not. One sample per side is never partial."""
    if max(before.samples, after.samples) <= 1:
        return False
    return {_extreme(before), _extreme(after)} != {"none", "all"}


def _extreme(side: CaseSide) -> str:
    if side.decided is None or side.decided == 0:
        return "?"
    if side.passes == 0:
        return "none"
    return "all" if side.passes == side.decided else "some"


def clustered_interval_note(cases: int) -> str:
    """A clause for the case-clustered interval over few cases ("" from FEW_CLUSTERS up)."""
    if cases >= FEW_CLUSTERS:
        return ""
    return (
        f"; over fewer than {FEW_CLUSTERS} cases this interval covers less than 95% "
        "(about 92.5% at 6 cases): read it as a lower bound on the uncertainty"
    )


def targeted_significance_note(targets: int) -> str:
    """What the paired test is over in targeted mode."""
    return f"the paired test is over the {targets} target(s) only (fixed against broke)"
