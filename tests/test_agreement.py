"""The judge's agreement with people: Cohen's kappa, its interval, the judge regression flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalloop.measure import agreement
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic, JudgeVerdict, Reply
from pytest_evalloop.testing.policies import render_verdict
from tests.test_gate import _malloy_copy, run

LABEL = st.sampled_from(["match", "no_match", "near_match"])


def test_kappa_matches_a_worked_example() -> None:
    # 20 + 15 agree of 50; people 25/25, judge 30/20: p_o 0.7, p_e 0.5, kappa 0.4.
    pairs = (
        [("match", "match")] * 20
        + [("match", "no_match")] * 5
        + [("no_match", "match")] * 10
        + [("no_match", "no_match")] * 15
    )
    assert agreement.kappa(pairs) == pytest.approx(0.4)
    found = agreement.Agreement(tuple(pairs))
    assert found.raw == pytest.approx(0.7)
    assert found.confusion() == (["match", "no_match"], [[20, 5], [10, 15]])
    low, high = found.interval or (None, None)
    assert low is not None and high is not None and low < 0.4 < high
    assert not any("warning" in line for line in found.lines())


def test_kappa_is_undefined_on_one_label_and_warns_under_thirty() -> None:
    assert agreement.kappa([("match", "match")] * 3) is None
    assert agreement.kappa([]) is None
    lines = agreement.Agreement((("match", "match"), ("no_match", "match"))).lines()
    assert any("only 2 human-settled fixtures" in line for line in lines)


@given(st.lists(st.tuples(LABEL, LABEL), min_size=1, max_size=60))
def test_kappa_is_at_most_one_and_one_only_on_full_agreement(pairs: list[tuple[str, str]]) -> None:
    k = agreement.kappa(pairs)
    if k is None:
        return
    assert -1.0 - 1e-9 <= k <= 1.0 + 1e-9
    assert (abs(k - 1.0) < 1e-9) == all(a == b for a, b in pairs)


@settings(deadline=None, max_examples=30)
@given(st.lists(st.tuples(LABEL, LABEL), min_size=2, max_size=40))
def test_the_interval_is_ordered_and_reproducible(pairs: list[tuple[str, str]]) -> None:
    ci = agreement.interval(pairs)
    assert ci == agreement.interval(pairs)
    if ci is not None:
        assert ci[0] <= ci[1]


def test_a_changed_judge_below_the_last_interval_is_a_regression() -> None:
    old = {
        "judgeModel": "a",
        "judgeVersion": "3",
        "rubricSha": "x",
        "kappa": 0.8,
        "low": 0.6,
        "intervalMethod": agreement.METHOD,
    }
    assert agreement.regression({**old, "kappa": 0.5, "judgeVersion": "4"}, old)
    assert agreement.regression({**old, "kappa": 0.65, "judgeVersion": "4"}, old) is None
    # The same judge again is noise, not a regression; no record yet is nothing to fall from.
    assert agreement.regression({**old, "kappa": 0.5}, old) is None
    assert agreement.regression({**old, "kappa": 0.5}, None) is None


def test_the_regression_rule_reads_a_low_end_only_where_one_exists() -> None:
    changed = {"judgeModel": "b", "judgeVersion": "4", "rubricSha": "y", "kappa": 0.2}
    no_interval = {"judgeModel": "a", "kappa": 1.0, "low": None, "noInterval": "only 1 no_match"}
    # A record from the interval that could collapse (no intervalMethod): its low is not read.
    collapsed = {"judgeModel": "a", "kappa": 1.0, "low": 1.0, "high": 1.0}
    for previous in (no_interval, collapsed):
        assert agreement.regression(changed, previous) is None
        note = agreement.unbounded(changed, previous)
        assert note is not None and "not called a regression" in note


@pytest.mark.parametrize(
    ("pairs", "said"),
    [
        # Repro 3 of issue 44: 29 match/match and 1 no_match/no_match printed "1.00 to 1.00".
        ([("match", "match")] * 29 + [("no_match", "no_match")], "only 1 no_match"),
        ([("match", "match"), ("no_match", "no_match")], "only 1 match, 1 no_match"),
        ([("match", "match")] * 5 + [("match", "no_match")], "people used one verdict only"),
    ],
)
def test_too_few_labels_of_a_verdict_get_no_interval_and_say_so(
    pairs: list[tuple[str, str]], said: str
) -> None:
    found = agreement.Agreement(tuple(pairs))
    assert found.interval is None
    assert said in found.lines()[0] and "to 1.00" not in found.lines()[0]
    record = found.record({}, "t")
    assert record["low"] is None and said in record["noInterval"]


@settings(deadline=None, max_examples=40)
@given(
    st.integers(min_value=agreement.MIN_PER_CLASS, max_value=40),
    st.integers(min_value=agreement.MIN_PER_CLASS, max_value=40),
)
def test_perfect_agreement_never_gets_a_zero_width_interval(a: int, b: int) -> None:
    pairs = [("match", "match")] * a + [("no_match", "no_match")] * b
    ci = agreement.interval(pairs)
    assert ci is not None and ci[0] < ci[1] == 1.0 and ci[0] >= -1.0


def test_the_interval_is_the_hull_of_the_bootstrap_and_the_fixed_margins_interval() -> None:
    pairs = (
        [("match", "match")] * 20
        + [("match", "no_match")] * 5
        + [("no_match", "match")] * 10
        + [("no_match", "no_match")] * 15
    )
    # p_o 0.7 over 50; Wilson 0.5625..0.8092; p_e 0.5: kappa 0.125..0.618 by fixed margins.
    low, high = agreement._fixed_margins(pairs)
    assert low == pytest.approx(0.12499, abs=1e-4) and high == pytest.approx(0.61793, abs=1e-4)
    boot = agreement._bootstrap(pairs)
    assert agreement.interval(pairs) == (min(boot[0], low), max(boot[1], high))


def test_people_agreement_counts_attempts_and_pairs() -> None:
    found = agreement.Agreement(
        (("match", "match"),),
        people=(("no_match", "match"), ("match", "match", "match"), ("near_match",)),
        disputed=("q-r1",),
    )
    assert agreement.people_agreement([list(p) for p in found.people]) == (2, 1, 4, 3)
    lines = found.lines()
    assert "people vs people: 1 of 2 attempts two or more people ruled on agree" in lines[2]
    assert "(pairwise agreement 75% over 4 pairs)" in lines[2]
    assert lines[3].startswith("people disagree: 1 fixture(s) out of kappa")


def _judge(set_dir: Path, flipped: set[str]) -> Any:
    fixtures = [row for _, row in sets.load_regressions(set_dir).rows]
    settled = {f.prediction["answer_text"][:80]: (f.fixture_id, f.verdict) for f in fixtures}
    other = {"match": "no_match", "no_match": "match", "near_match": "match"}

    def judge(request: Any) -> Reply:
        for head, (fixture_id, verdict) in settled.items():
            if head in request.user_text:
                said = other[verdict] if fixture_id in flipped else verdict
                return Reply(text=render_verdict(JudgeVerdict(verdict=said, confidence=8)))
        return Reply(text="no fixture matched")

    return judge


def test_check_judge_prints_kappa_and_flags_a_judge_that_got_worse(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = _malloy_copy(pytester.path)
    ids = [row.fixture_id for _, row in sets.load_regressions(set_dir).rows]
    fake.policy = _judge(set_dir, set())
    first = run(pytester, set_dir, "--eval-check-judge")
    first.stdout.fnmatch_lines(
        [
            "*judge agreement: ecommerce*",
            "judge vs people: Cohen's kappa 1.00*",
            f"raw agreement: 100% over {len(ids)} fixtures (one per settled attempt)",
            "warning: only * human-settled fixtures (under 30)*",
            "confusion (rows: people, columns: judge):",
        ]
    )
    [record] = [
        json.loads(x) for x in (set_dir / agreement.AGREEMENT_FILE).read_text().splitlines()
    ]
    assert record["kappa"] == 1.0 and record["count"] == len(ids) and not record["regression"]
    # Another judge model that disagrees on half the fixtures: below the last interval.
    fake.policy = _judge(set_dir, set(ids[::2]))
    second = run(pytester, set_dir, "--eval-check-judge", "--eval-judge-model=claude-other")
    second.stdout.fnmatch_lines(["*JUDGE REGRESSION: kappa * below the last recorded interval*"])
    lines = (set_dir / agreement.AGREEMENT_FILE).read_text().splitlines()
    assert json.loads(lines[-1])["regression"] is True


def test_a_subset_prints_kappa_but_records_nothing(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = _malloy_copy(pytester.path)
    first = sets.load_regressions(set_dir).rows[0][1].fixture_id
    fake.policy = _judge(set_dir, set())
    result = run(pytester, set_dir, "--eval-check-judge", "-k", first)
    result.stdout.fnmatch_lines(["judge vs people: *", "*not recorded (a -k/-m subset*"])
    assert not (set_dir / agreement.AGREEMENT_FILE).exists()
