"""The statistics a run's figures come with: intervals, repeat metrics and paired tests.

Pure functions over plain numbers (per-case pass counts, discordant pairs, per-case
differences), so each can be checked against an independent computation. None of them decides
anything: the acceptance bar is the gate (seed 004); these say how much to trust a figure.

Conventions:

- A **case** is the unit of independence. With ``--eval-samples=k`` a case contributes k
  attempts, but those are not k independent draws from the population of questions: they share
  the question, its golden and its difficulty. Every interval and test here treats a case's
  samples as one cluster.
- Only decided samples (``match`` / ``no_match``) count towards a case's pass fraction; a case
  with no decided sample has no fraction and is left out (and counted as such by the caller).
- 95% intervals use z = 1.959964.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054
"""The two-sided 95% normal quantile."""

EXACT_SIGN_FLIP_LIMIT = 16
"""Up to this many non-zero differences the sign-flip test enumerates all 2^n assignments."""
SIGN_FLIP_RESAMPLES = 20_000
"""Random sign assignments drawn above that limit (seeded: the same input, the same p)."""


@dataclass(frozen=True)
class CaseCounts:
    """One case's decided samples: how many matched (``passes``) of how many were decided."""

    passes: int
    decided: int
    samples: int
    """All samples, decided or not (near_match, needs_human, unscored)."""
    uniform: bool | None = None
    """Every sample had the same outcome (three near_match are uniform); None: derive it from
    the counts (all decided and all one way)."""

    @property
    def fraction(self) -> float | None:
        """The case's pass fraction over its decided samples; None when none was decided."""
        return self.passes / self.decided if self.decided else None

    @property
    def consistent(self) -> bool:
        """Whether every sample reached the same outcome."""
        if self.uniform is not None:
            return self.uniform
        return self.decided == self.samples and self.passes in (0, self.samples)


def wilson(successes: float, n: float, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a binomial proportion; None when ``n`` is 0.

    Assumes ``n`` independent Bernoulli trials. Unlike the normal approximation it stays inside
    [0, 1] and is sensible at 0/n and n/n, where small evals usually land. ``n`` may be an
    effective (non-integer) sample size, as :func:`clustered_interval` passes.
    """
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within 0..{n}, got {successes}")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # At 0/n and n/n the bound is exactly 0 or 1; say so rather than 0.9999999999999999.
    low = 0.0 if p == 0 else max(0.0, centre - half)
    high = 1.0 if p == 1 else min(1.0, centre + half)
    return low, high


@dataclass(frozen=True)
class PassRate:
    """A pass rate as the mean of per-case fractions, with its clustered 95% interval."""

    mean: float
    low: float
    high: float
    cases: int
    """Cases with at least one decided sample (the clusters)."""
    effective_n: float
    """The number of independent trials the interval is worth (≤ decided samples)."""


def clustered_interval(cases: Sequence[CaseCounts], z: float = Z95) -> PassRate | None:
    """The mean per-case pass fraction and a 95% interval that treats each case as a cluster.

    Estimator: p̂ = mean over cases of passes/decided (each case weighs the same, whatever its
    number of decided samples). Its standard error is the between-case one,
    SE² = Σ(fᵢ − p̂)² / (n(n − 1)) over the n cases, which is what makes k samples of one case
    worth less than k cases: when a case's samples agree, the extra samples add nothing.
    The interval is Wilson's at the effective sample size n_eff = p̂(1 − p̂) / SE² (capped at the
    number of decided samples, floored at 1); where that is undefined (p̂ at 0 or 1, or a single
    case) n_eff is the number of cases, i.e. each case counts as one trial. With one sample per
    case this is the ordinary Wilson interval on n − 1 trials (the sample variance's n − 1).
    Assumes cases are an independent draw from the questions the set stands for.
    """
    fractions = [f for f in (c.fraction for c in cases) if f is not None]
    n = len(fractions)
    if n == 0:
        return None
    mean = math.fsum(fractions) / n
    decided = sum(c.decided for c in cases if c.decided)
    n_eff = float(n)
    if n > 1 and 0.0 < mean < 1.0:
        variance = math.fsum((f - mean) ** 2 for f in fractions) / (n - 1)
        se2 = variance / n
        n_eff = min(float(decided), mean * (1 - mean) / se2) if se2 > 0 else float(decided)
        n_eff = max(n_eff, 1.0)
    bounds = wilson(mean * n_eff, n_eff, z)
    assert bounds is not None
    return PassRate(mean=mean, low=bounds[0], high=bounds[1], cases=n, effective_n=n_eff)


@dataclass(frozen=True)
class RepeatMetrics:
    """What k samples per case say beyond the mean: pass@k, pass^k and consistency, each over
    the cases it can be computed for (the others are counted, never silently mixed in)."""

    k: int
    """The samples a case was given (the most any case has)."""
    cases: int
    """Cases with at least one sample."""
    complete: int
    """Cases with k decided samples: the denominator of pass@k and pass^k."""
    pass_at_k: float | None
    """Share of the complete cases where at least one of the k samples matched."""
    pass_hat_k: float | None
    """Share of the complete cases where all k samples matched."""
    full: int
    """Cases with k samples, decided or not: the denominator of ``consistent``."""
    consistent: float | None
    """Share of the full cases whose k samples all had the same outcome."""

    @property
    def short(self) -> int:
        """Cases left out of pass@k and pass^k: fewer than k decided samples."""
        return self.cases - self.complete


def repeat_metrics(cases: Sequence[CaseCounts], k: int | None = None) -> RepeatMetrics:
    """pass@k, pass^k and the share of consistent cases.

    pass@k is the empirical "any of k matched" (the chance a user retrying k times gets one
    right answer); pass^k is "all k matched" (the chance an agent run k times is right every
    time, tau-bench's reliability measure). Both are computed from observed samples, so only a
    case with k *decided* samples can carry them: a case with an undecided (near_match,
    needs_human, unscored) or a dropped sample (a harness error) is left out and counted
    (``short``), never scored on fewer samples under a label that says k. Over the complete
    cases pass^k ≤ mean fraction ≤ pass@k. A case is consistent when its k samples had one
    outcome (k near_match are consistent); that share is over the cases with k samples.
    ``k`` defaults to the most samples any case has.
    """
    seen = [c for c in cases if c.samples > 0]
    k = max((c.samples for c in seen), default=0) if k is None else k
    complete = [c for c in seen if c.decided >= k]
    full = [c for c in seen if c.samples >= k]
    any_pass = sum(1 for c in complete if c.passes > 0)
    all_pass = sum(1 for c in complete if c.passes == c.decided)
    agree = sum(1 for c in full if c.consistent)
    return RepeatMetrics(
        k=k,
        cases=len(seen),
        complete=len(complete),
        pass_at_k=any_pass / len(complete) if complete else None,
        pass_hat_k=all_pass / len(complete) if complete else None,
        full=len(full),
        consistent=agree / len(full) if full else None,
    )


def mcnemar_exact(better: int, worse: int) -> float:
    """The exact two-sided McNemar p-value over the discordant cases.

    Under the null hypothesis (the change makes no difference) each discordant case (a match on
    one side and a no_match on the other) is equally likely to have gone either way, so
    ``better`` ~ Binomial(better + worse, 1/2). The p-value doubles the smaller tail, capped at 1;
    no discordant case gives 1. Assumes independent cases and one decided verdict per case per
    side; concordant cases carry no information about the difference and do not enter.
    """
    if better < 0 or worse < 0:
        raise ValueError(f"counts must be ≥ 0, got {better} better and {worse} worse")
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(better, worse) + 1))
    return min(1.0, 2 * tail / 2**n)


def sign_flip_test(
    differences: Sequence[float],
    *,
    keys: Sequence[str] | None = None,
    seed: int = 0,
    resamples: int = SIGN_FLIP_RESAMPLES,
) -> float:
    """A paired sign-flip permutation test: two-sided p-value that the mean difference is 0.

    ``differences`` are per-case (after − before) pass fractions. Under the null hypothesis
    each case's difference is symmetric around 0, so flipping its sign is as likely as not;
    the p-value is the share of sign assignments whose |mean| is at least the observed one.
    Zero differences cannot change sign and are kept (they dilute the mean). Exact over all
    2^m assignments of the m non-zero differences when m ≤ 16; above that, ``resamples``
    seeded random assignments with the (1 + hits) / (1 + resamples) correction. ``keys`` (the
    cases' qids) give each case its own seeded stream of signs, so a change to one case's
    difference leaves every other case's draws as they were: lowering a difference can then
    never lower the sampled p of a positive mean, as it cannot the exact one. Assumes
    independent cases; makes no normality assumption.
    """
    n = len(differences)
    nonzero = [d for d in differences if d != 0]
    if not nonzero:
        return 1.0
    observed = abs(math.fsum(differences)) / n
    # Compare sums, not means (same n), with a tolerance for float noise in equal sums.
    target = observed * n - 1e-9
    m = len(nonzero)
    if m <= EXACT_SIGN_FLIP_LIMIT:
        hits = 0
        for mask in range(1 << m):
            total = math.fsum(-d if mask >> i & 1 else d for i, d in enumerate(nonzero))
            hits += abs(total) >= target
        return hits / (1 << m)
    if keys is not None:
        # One string of '0'/'1' per case: its sign in each resample.
        signs = [
            (d, format(random.Random(f"{seed}:{key}").getrandbits(resamples), f"0{resamples}b"))
            for d, key in zip(differences, keys, strict=True)
            if d != 0
        ]
        hits = sum(
            abs(math.fsum(d if bits[r] == "1" else -d for d, bits in signs)) >= target
            for r in range(resamples)
        )
        return (1 + hits) / (1 + resamples)
    rng = random.Random(seed)
    hits = 0
    for _ in range(resamples):
        total = math.fsum(d if rng.random() < 0.5 else -d for d in nonzero)
        hits += abs(total) >= target
    return (1 + hits) / (1 + resamples)
