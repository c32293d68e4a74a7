"""The statistics module against independent computations: enumeration, simulation, hand sums."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest

from pytest_evalloop.measure.stats import (
    CaseCounts,
    clustered_interval,
    mcnemar_exact,
    repeat_metrics,
    sign_flip_test,
    wilson,
)


def _binomial_minlike(b: int, c: int) -> float:
    """Two-sided exact binomial test by summing every outcome no likelier than the observed
    one (the 'minlike' definition), in exact fractions."""
    n = b + c
    probs = [Fraction(math.comb(n, i), 2**n) for i in range(n + 1)]
    observed = probs[b]
    return float(min(Fraction(1), sum(p for p in probs if p <= observed)))


@pytest.mark.parametrize(
    ("better", "worse"),
    [(0, 0), (1, 0), (0, 1), (5, 0), (0, 7), (3, 3), (4, 1), (10, 2), (2, 9), (25, 15)],
)
def test_mcnemar_matches_the_enumerated_binomial(better: int, worse: int) -> None:
    assert mcnemar_exact(better, worse) == pytest.approx(_binomial_minlike(better, worse))


def test_mcnemar_edges_by_hand() -> None:
    assert mcnemar_exact(0, 0) == 1.0  # nothing discordant: no evidence either way
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)  # all one way, 5 cases
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 64)
    assert mcnemar_exact(3, 3) == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def _sign_flip_brute(diffs: list[float]) -> float:
    n = len(diffs)
    observed = abs(sum(diffs)) / n
    hits = total = 0
    for signs in itertools.product((1, -1), repeat=n):
        mean = abs(sum(s * d for s, d in zip(signs, diffs, strict=True))) / n
        hits += mean >= observed - 1e-12
        total += 1
    return hits / total


@pytest.mark.parametrize(
    "diffs",
    [
        [0.0, 0.0, 0.0],
        [1.0],
        [1.0, 1.0, 1.0, 1.0],
        [1 / 3, 2 / 3, 0.0, -1 / 3, 1.0],
        [0.5, -0.5, 0.5, 1.0, 0.0, 0.0, 1 / 3],
        [-1.0, -2 / 3, -1.0, 0.0],
    ],
)
def test_sign_flip_matches_full_enumeration(diffs: list[float]) -> None:
    assert sign_flip_test(diffs) == pytest.approx(_sign_flip_brute(diffs))


def test_sign_flip_with_k1_equals_mcnemar_on_the_discordant_cases() -> None:
    # With one sample a side, differences are -1, 0 or +1: the sign-flip test is the exact
    # McNemar test (zeros change nothing, the sum of signs is a Binomial(m, 1/2) shift).
    for better, worse in [(5, 0), (4, 1), (3, 3), (7, 2)]:
        diffs = [1.0] * better + [-1.0] * worse + [0.0] * 6
        assert sign_flip_test(diffs) == pytest.approx(mcnemar_exact(better, worse))


def test_sign_flip_above_the_exact_limit_is_seeded_and_close() -> None:
    diffs = [1.0] * 14 + [-1.0] * 6 + [0.5] * 4  # 24 non-zero: sampled
    first, again = sign_flip_test(diffs), sign_flip_test(diffs)
    assert first == again
    exact = _sign_flip_exact_by_counting(diffs)
    assert abs(first - exact) < 0.01


def _sign_flip_exact_by_counting(diffs: list[float]) -> float:
    """Exact p for many differences by convolving the distribution of signed sums."""
    sums = {Fraction(0): 1}
    for d in diffs:
        f = Fraction(d).limit_denominator(1000)
        nxt: dict[Fraction, int] = {}
        for s, count in sums.items():
            for v in (s + f, s - f):
                nxt[v] = nxt.get(v, 0) + count
        sums = nxt
    observed = abs(sum(Fraction(d).limit_denominator(1000) for d in diffs))
    return sum(c for s, c in sums.items() if abs(s) >= observed) / 2 ** len(diffs)


def test_wilson_known_values() -> None:
    assert wilson(0, 0) is None
    low, high = wilson(8, 10) or (0, 0)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    low, high = wilson(10, 10) or (0, 0)
    assert high == 1.0 and round(low, 4) == 0.7225


def test_a_case_with_no_decided_sample_has_no_fraction_and_is_left_out() -> None:
    cases = [CaseCounts(2, 2, 2), CaseCounts(0, 0, 2), CaseCounts(0, 2, 2)]
    rate = clustered_interval(cases)
    assert rate is not None
    assert (rate.cases, rate.mean) == (2, 0.5)
    assert clustered_interval([CaseCounts(0, 0, 3)]) is None
    assert clustered_interval([]) is None


def test_repeated_identical_samples_do_not_narrow_the_interval() -> None:
    # The cluster property: a case whose k samples agree is worth one trial, not k.
    outcomes = [1] * 14 + [0] * 6
    once = clustered_interval([CaseCounts(o, 1, 1) for o in outcomes])
    thrice = clustered_interval([CaseCounts(3 * o, 3, 3) for o in outcomes])
    assert once is not None and thrice is not None
    assert (thrice.low, thrice.high) == pytest.approx((once.low, once.high))
    assert thrice.effective_n == pytest.approx(once.effective_n)
    # ... whereas samples that disagree within cases carry information of their own
    mixed = clustered_interval([CaseCounts(2, 3, 3)] * 20)
    assert mixed is not None and mixed.mean == pytest.approx(2 / 3)


def test_k1_is_wilson_on_n_minus_one() -> None:
    rate = clustered_interval([CaseCounts(1, 1, 1)] * 8 + [CaseCounts(0, 1, 1)] * 4)
    assert rate is not None
    expected = wilson(rate.mean * 11, 11)
    assert expected is not None and (rate.low, rate.high) == pytest.approx(expected)


def test_all_pass_counts_each_case_once() -> None:
    rate = clustered_interval([CaseCounts(3, 3, 3)] * 10)
    assert rate is not None and rate.mean == 1.0 and rate.high == 1.0
    assert (rate.low, rate.high) == pytest.approx(wilson(10, 10))


def test_clustered_interval_covers_about_95_percent_in_simulation() -> None:
    # 400 simulated runs of 40 cases x 3 samples, case difficulty drawn from Beta(2, 1):
    # the interval should hold the true mean pass probability about 95% of the time (a
    # naive interval over 120 independent draws covers markedly less here).
    rng = random.Random(7)
    true_mean = 2 / 3
    covered = naive_covered = 0
    runs = 400
    for _ in range(runs):
        cases = []
        for _case in range(40):
            p = rng.betavariate(2, 1)
            passes = sum(rng.random() < p for _ in range(3))
            cases.append(CaseCounts(passes, 3, 3))
        rate = clustered_interval(cases)
        assert rate is not None
        covered += rate.low <= true_mean <= rate.high
        naive = wilson(sum(c.passes for c in cases), 120)
        assert naive is not None
        naive_covered += naive[0] <= true_mean <= naive[1]
    assert 0.91 <= covered / runs <= 0.99, covered / runs
    assert naive_covered < covered


def test_repeat_metrics_by_hand() -> None:
    cases = [
        CaseCounts(3, 3, 3),  # all match: pass@3, pass^3, consistent
        CaseCounts(0, 3, 3),  # all no_match: consistent, neither pass metric
        CaseCounts(1, 3, 3),  # split: pass@3 only
        CaseCounts(2, 2, 3),  # one undecided sample: out of pass@3/pass^3, not consistent
        CaseCounts(0, 0, 3, uniform=True),  # three near_match: consistent, out of pass@3
    ]
    m = repeat_metrics(cases)
    assert (m.cases, m.complete, m.full, m.short) == (5, 3, 5, 2)
    assert m.pass_at_k == pytest.approx(2 / 3)
    assert m.pass_hat_k == pytest.approx(1 / 3)
    assert m.consistent == pytest.approx(3 / 5)
    assert repeat_metrics([]).pass_at_k is None
    single = repeat_metrics([CaseCounts(1, 1, 1), CaseCounts(0, 1, 1)])  # k = 1
    assert (single.pass_at_k, single.pass_hat_k, single.consistent) == (0.5, 0.5, 1.0)
