"""Issue 25 point 6: a warning wherever the numbers cannot carry a conclusion."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.measure import caveats, repeats, stats
from pytest_evalloop.measure.comparison import RunView, case_side, compare
from pytest_evalloop.measure.comparison_text import report_lines
from pytest_evalloop.measure.gate import TargetedReport, TargetOutcome, decide_gate
from pytest_evalloop.measure.significance import PairedTests, lines

M, N = "match", "no_match"


def _side(cases: dict[str, list[str]]) -> RunView:
    sides = {}
    for qid, verdicts in cases.items():
        scores = [
            ledger.ScoreEvent(qid=qid, sample=i, phase="p", verdict=v, reason="judged")
            for i, v in enumerate(verdicts)
        ]
        sides[qid] = case_side(qid, scores, {})
    return RunView(run_id="r", cases=sides)


def _text(base: RunView, cur: RunView) -> str:
    c = compare(base, cur)
    return "\n".join(
        report_lines(c, None, None, baseline_label="a", current_label="b", band=None, verbosity=0)
    )


def test_the_significance_floor_is_six_one_way_cases_at_005() -> None:
    assert caveats.significance_floor(0.05) == 6
    assert caveats.significance_floor(0.01) == 8
    assert stats.mcnemar_exact(6, 0) < 0.05 <= stats.mcnemar_exact(5, 0)


@given(st.sampled_from([0.1, 0.05, 0.01, 0.001]), st.integers(0, 12), st.integers(0, 12))
def test_below_the_floor_no_split_is_significant_and_the_note_says_so(
    alpha: float, better: int, worse: int
) -> None:
    floor = caveats.significance_floor(alpha)
    note = caveats.significance_note(better, worse, alpha)
    if better + worse < floor:
        assert stats.mcnemar_exact(better, worse) >= alpha
        assert note and f"fewer than {floor}" in note[0]
    else:
        assert note == []


def _paired(better: int, worse: int) -> PairedTests:
    return PairedTests(
        better=better,
        worse=worse,
        mcnemar_p=stats.mcnemar_exact(better, worse),
        sign_flip_p=None,
        sign_flip_cases=0,
        mean_difference=None,
    )


def test_bar_significant_says_it_could_not_accept_on_five_flips() -> None:
    # Before: "UNRESOLVED ... p = 0.0625 is not < alpha 0.05" and nothing said that no 5 flips
    # could ever be significant at 0.05.
    base = _side({f"q{i}": [N] for i in range(5)})
    cur = _side({f"q{i}": [M] for i in range(5)})
    verdict = decide_gate(
        "bar+significant",
        compare(base, cur),
        allow_pin_mismatch=False,
        targeted=None,
        paired=_paired(5, 0),
    )
    assert verdict.decision == "unresolved"
    assert "fewer than 6 discordant cases all one way" in verdict.reason
    assert any("fewer than 6" in line for line in lines(_paired(5, 0)))
    assert not any("fewer than" in line for line in lines(_paired(6, 0)))


def test_a_targeted_decision_takes_the_targets_paired_test() -> None:
    # Before: the set-wide test (here 8 better: p < 0.05) decided a targeted acceptance of two
    # fixed targets. Now McNemar over the targets (2 fixed, 0 broke: p = 0.5) decides.
    base = _side({f"q{i}": [N] for i in range(8)})
    cur = _side({f"q{i}": [M] for i in range(8)})
    report = TargetedReport(
        arms=2,
        targets=[
            TargetOutcome(qid=q, outcome="fixed", baseline=N, post=[M, M]) for q in ("q0", "q1")
        ],
        untargeted_better=[["q2"], ["q2"]],
        untargeted_worse=[[], []],
        noise_band=8,
    )
    verdict = decide_gate(
        "bar+significant",
        compare(base, cur),
        allow_pin_mismatch=False,
        targeted=report,
        paired=_paired(8, 0),
    )
    assert verdict.decision == "unresolved", verdict.reason
    assert "over the 2 target(s) only" in verdict.reason
    assert "McNemar p = 0.5" in verdict.reason


def test_a_majority_flip_is_marked_and_shows_its_fractions() -> None:
    # Before: 1/3 -> 2/3 printed "no_match -> match", like 0/3 -> 3/3.
    text = _text(_side({"a": [N, N, M], "b": [N, N, N]}), _side({"a": [M, M, N], "b": [M] * 3}))
    assert "a: no_match (1/3 match) -> match (2/3 match) [majority flip" in text
    assert "b: no_match (0/3 match) -> match (3/3 match)\n" in text + "\n"


def test_runs_sampled_differently_are_noted() -> None:
    # Before: a k=1 run compared with a k=3 run without a word.
    text = _text(_side({"a": [N]}), _side({"a": [M, M, N]}))
    assert "the baseline has 1 sample(s) per case and the current run 3" in text
    assert "sample(s) per case" not in _text(_side({"a": [N]}), _side({"a": [M]}))


def test_the_clustered_interval_over_few_cases_says_it_under_covers() -> None:
    from tests.test_repeats import _tally

    few = _tally([(q, s, M if s else N) for q in "abcdef" for s in range(3)])
    [line] = [x for x in repeats.summary_lines(repeats.figures(few)) if "mean pass" in x]
    assert "covers less than 95% (about 92.5% at 6 cases)" in line
    assert caveats.clustered_interval_note(caveats.FEW_CLUSTERS) == ""
