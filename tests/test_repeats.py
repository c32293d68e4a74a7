"""`--eval-samples=k`: per-case fractions, pass@k, pass^k, consistency and the clustered
interval, in the terminal summary and run.json totals, counted through the aggregates rule."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.measure import aggregates, repeats, stats
from pytest_evalloop.measure.comparison import RunView, case_side, compare
from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import QIDS, _example_rows, make_set, only_run, run, spec

CASES = QIDS[:4]


def _varying_judge(questions: dict[str, str]) -> dict[str, Any]:
    """Case 0 always matches, case 1 two of three, case 2 one of three, case 3 never."""
    m, n = {"verdict": "match"}, {"verdict": "no_match"}
    return {
        "default": m,
        "by_question": {
            questions[CASES[1]]: [m, n, m],
            questions[CASES[2]]: [n, n, m],
            questions[CASES[3]]: [n],
        },
    }


def test_samples_print_pass_at_k_pass_hat_k_consistency_and_clustered_interval(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = make_set(pytester.path, CASES)
    rows = _example_rows()
    fake.policy = spec(set_dir, _varying_judge({q: rows[q]["question"] for q in CASES})).policy()
    result = run(pytester, set_dir, "--eval-samples=3")
    out = result.stdout.str()
    # Hand count: fractions 3/3, 2/3, 1/3, 0/3 -> any matched 3 of 4, all matched 1 of 4,
    # consistent (all agree) 2 of 4, mean of fractions 0.5.
    assert "samples: 3 per case over 4 cases: pass@3 75.0%, pass^3 25.0%, consistent 50.0%" in out
    expected = stats.clustered_interval([stats.CaseCounts(p, 3, 3) for p in (3, 2, 1, 0)])
    assert expected is not None
    assert f"mean pass rate: 50.0%, 95% interval {expected.low:.1%}-{expected.high:.1%}" in out
    assert f"inconsistent cases (2): {CASES[1]} 2/3, {CASES[2]} 1/3" in out
    totals = json.loads((only_run(set_dir) / "run.json").read_text(encoding="utf-8"))["totals"]
    rep = totals["repeats"]
    assert (rep["samples"], rep["cases"]) == (3, 4)
    assert (rep["passAtK"], rep["passHatK"], rep["consistent"]) == (0.75, 0.25, 0.5)
    assert rep["meanPassRate"] == 0.5
    assert rep["interval95"] == [round(expected.low, 6), round(expected.high, 6)]
    assert rep["perCase"][CASES[2]] == {"passes": 1, "decided": 3, "samples": 3}
    assert rep["unstable"] == [CASES[1], CASES[2]]


def test_one_sample_adds_no_repeat_figures(pytester: pytest.Pytester, fake: FakeAnthropic) -> None:
    set_dir = make_set(pytester.path, CASES[:2])
    fake.policy = spec(set_dir).policy()
    result = run(pytester, set_dir)
    assert "pass@" not in result.stdout.str()
    totals = json.loads((only_run(set_dir) / "run.json").read_text(encoding="utf-8"))["totals"]
    assert "repeats" not in totals


def _tally(rows: list[tuple[str, int, str | None]], **kw: Any) -> aggregates.Tally:
    scores = {
        (qid, s): ledger.ScoreEvent(
            qid=qid, sample=s, phase="p", verdict=v, reason="judged" if v else "not_submitted", **kw
        )
        for qid, s, v in rows
    }
    return aggregates.tally_events({}, scores, {}, name="t", status="complete")


def test_figures_count_through_the_aggregates_rule() -> None:
    # A gold_wrong sample is no sample; a near_match one is a sample, not decided.
    tally = _tally(
        [("a", 0, "match"), ("a", 1, "near_match"), ("b", 0, "no_match"), ("b", 1, "no_match")]
    )
    fig = repeats.figures(tally)
    assert fig is not None
    assert fig.cases == {
        "a": stats.CaseCounts(passes=1, decided=1, samples=2),
        "b": stats.CaseCounts(passes=0, decided=2, samples=2),
    }
    assert fig.unstable == ["a"]
    assert fig.metrics.pass_hat_k == 0.0 and fig.metrics.pass_at_k == 0.5
    assert repeats.summary_lines(fig)[-1] == "inconsistent cases (1): a 1/1, 1 undecided"


def test_withheld_pass_rate_withholds_repeat_figures() -> None:
    scores = {
        ("a", s): ledger.ScoreEvent(
            qid="a", sample=s, phase="p", verdict="match", reason="judged", contaminated=s == 1
        )
        for s in (0, 1)
    }
    tally = aggregates.tally_events({}, scores, {}, name="t", status="complete")
    assert tally.withheld is not None
    assert repeats.figures(tally) is None


def _side(qid: str, verdicts: list[str]) -> RunView:
    scores = [
        ledger.ScoreEvent(qid=qid, sample=i, phase="p", verdict=v, reason="judged")
        for i, v in enumerate(verdicts)
    ]
    return RunView(run_id="r", cases={qid: case_side(qid, scores, {})})


def test_flips_compare_per_case_majorities() -> None:
    m, n = "match", "no_match"
    # 2/3 -> 3/3: the majority was already match; not a flip.
    assert compare(_side("q", [m, n, m]), _side("q", [m, m, m])).flips == 0
    # 1/3 -> 3/3: majority no_match -> match; a flip.
    assert [f.qid for f in compare(_side("q", [n, n, m]), _side("q", [m, m, m])).better] == ["q"]
    # 1/2 -> 2/2: a tie is unresolved, reported apart, never a flip.
    tie = compare(_side("q", [n, m]), _side("q", [m, m]))
    assert tie.flips == 0 and tie.neither[0].baseline.reason.startswith("samples_split")
