"""`--eval-samples=k`: per-case fractions, pass@k, pass^k, consistency and the clustered
interval, in the terminal summary and run.json totals, counted through the aggregates rule."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.measure import aggregates, repeats, stats
from pytest_evalloop.measure.comparison import RunView, case_side, compare
from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import QIDS, _example_rows, make_set, only_run, run, spec

CASES = QIDS[:4]
_CLEAN = SimpleNamespace(contaminated=False)
"""An attempt line as the counting rule reads it (a harness error has one and no score)."""


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
    assert (
        "samples: 3 per case over 4 cases: pass@3 75.0%, pass^3 25.0% (over 4 cases with 3 "
        "decided samples), consistent 50.0% (over 4 cases with 3 samples: one outcome each)"
    ) in out
    assert "left out of" not in out
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


def test_one_sample_per_case_shows_the_same_wilson_interval_in_every_view(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # Before: report.html and the Markdown summary printed a Wilson interval at k=1 that the
    # terminal never showed. Now all three append it from `figures.interval_text`.
    import html

    set_dir = make_set(pytester.path, CASES[:3])
    fake.policy = spec(set_dir).policy()
    md = pytester.path / "summary.md"
    result = run(pytester, set_dir, f"--eval-summary-md={md}")
    [line] = [x for x in result.stdout.str().splitlines() if x.startswith("pass rate: ")]
    low, high = stats.wilson(3, 3) or (0.0, 0.0)
    shown = f"95% Wilson interval {low:.1%}\u2013{high:.1%}"
    assert line.endswith(shown), line
    page = html.unescape((only_run(set_dir) / "report.html").read_text(encoding="utf-8"))
    markdown = md.read_text(encoding="utf-8").replace("\\", "")
    assert shown in page and shown in markdown


def test_the_interval_is_wilson_at_one_sample_and_none_with_samples() -> None:
    from pytest_evalloop.measure import figures

    one = _tally([("a", 0, "match"), ("b", 0, "no_match"), ("c", 0, "near_match")])
    assert figures.pass_rate_interval(one) == (*stats.wilson(1, 2), "95% Wilson interval")  # type: ignore[misc]
    many = _tally([("a", 0, "match"), ("a", 1, "no_match"), ("b", 0, "match"), ("b", 1, "match")])
    assert figures.pass_rate_interval(many) is None and figures.interval_text(many) == ""


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
        "a": stats.CaseCounts(passes=1, decided=1, samples=2, uniform=False),
        "b": stats.CaseCounts(passes=0, decided=2, samples=2, uniform=True),
    }
    assert fig.unstable == ["a"]
    # a has one decided sample of 2: left out of pass@2/pass^2, named, never scored on one.
    assert fig.short == ["a"]
    assert (fig.metrics.complete, fig.metrics.pass_hat_k, fig.metrics.pass_at_k) == (1, 0.0, 0.0)
    lines = repeats.summary_lines(fig)
    assert (
        "left out of pass@2/pass^2: 1 case with fewer than 2 decided samples: a 1/1, 1 undecided"
        in lines
    )
    assert lines[-1] == "inconsistent cases (1): a 1/1, 1 undecided"


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


def test_a_case_near_match_every_time_is_consistent_and_out_of_pass_at_k() -> None:
    # Before: "inconsistent cases (10): ... 0/0, 2 undecided", and pass@2 below the mean pass
    # rate (cases with no decided sample were in pass@k's denominator, not in the mean's).
    rows = [(f"n{i}", s, "near_match") for i in range(10) for s in (0, 1)]
    rows += [(f"m{i}", s, "match") for i in range(7) for s in (0, 1)]
    rows += [("x", 0, "match"), ("x", 1, "no_match"), ("y", 0, "no_match"), ("y", 1, "no_match")]
    fig = repeats.figures(_tally(rows))
    assert fig is not None
    assert fig.unstable == ["x"]
    m = fig.metrics
    assert (m.cases, m.complete, m.full) == (19, 9, 19)
    assert m.pass_at_k == 8 / 9 and m.pass_hat_k == 7 / 9
    assert m.consistent == 18 / 19
    assert fig.rate is not None and m.pass_hat_k <= fig.rate.mean <= m.pass_at_k
    lines = repeats.summary_lines(fig)
    assert lines[0] == (
        "samples: 2 per case over 19 cases: pass@2 88.9%, pass^2 77.8% (over 9 cases with 2 "
        "decided samples), consistent 94.7% (over 19 cases with 2 samples: one outcome each)"
    )
    assert lines[1].startswith(
        "left out of pass@2/pass^2: 10 cases with fewer than 2 decided samples: n0 0/0, 2 "
        "undecided, n1 0/0"
    )
    assert lines[-1] == "inconsistent cases (1): x 1/2"


def test_pass_hat_k_never_counts_a_case_on_fewer_samples_than_k() -> None:
    # k = 3; q2's failing third sample's judge errored (a harness error, no score): before,
    # q2 was "every sample matched" on 2 samples and pass^3 rose from 33.3% to 50.0%.
    rows = [("q1", s, "match") for s in (1, 2, 3)]
    rows += [("q2", 1, "match"), ("q2", 2, "match")]
    rows += [(q, s, "no_match") for q in ("q3", "q4") for s in (1, 2, 3)]
    scores = {
        (qid, s): ledger.ScoreEvent(qid=qid, sample=s, phase="p", verdict=v, reason="judged")
        for qid, s, v in rows
    }
    attempts = {(q, s): _CLEAN for q in ("q1", "q2", "q3", "q4") for s in (1, 2, 3)}
    tally = aggregates.tally_events(attempts, scores, {}, name="t", status="complete")
    fig = repeats.figures(tally)
    assert fig is not None and fig.samples == 3
    assert fig.short == ["q2"] and fig.missing == ["q2"]
    assert fig.metrics.complete == 3 and fig.metrics.pass_hat_k == 1 / 3
    assert fig.metrics.full == 3
    lines = repeats.summary_lines(fig)
    assert "pass^3 33.3% (over 3 cases with 3 decided samples)" in lines[0]
    assert lines[1] == (
        "left out of pass@3/pass^3: 1 case with fewer than 3 decided samples: q2 2/2, 1 dropped"
    )
    rep = repeats.totals(fig)["repeats"]
    assert rep["passAtKCases"] == 3 and rep["leftOutOfPassAtK"] == ["q2"]


_case = st.builds(
    lambda decided, passes, undecided, dropped: (passes, decided, undecided, dropped),
    st.integers(0, 4),
    st.integers(0, 4),
    st.integers(0, 2),
    st.integers(0, 1),
).filter(lambda c: c[1] <= c[0])


@settings(max_examples=200, deadline=None)
@given(st.lists(_case, min_size=1, max_size=8))
def test_pass_at_k_and_pass_hat_k_bracket_the_mean_over_the_same_cases(
    shapes: list[tuple[int, int, int, int]],
) -> None:
    rows: list[tuple[str, int, str | None]] = []
    attempts: dict[tuple[str, int | None], object] = {}
    for i, (decided, passes, undecided, dropped) in enumerate(shapes):
        words = ["match"] * passes + ["no_match"] * (decided - passes)
        words += ["near_match"] * undecided
        for s, word in enumerate(words):
            rows.append((f"q{i}", s, word))
        for s in range(len(words) + dropped):
            attempts[(f"q{i}", s)] = _CLEAN
    scores = {
        (qid, s): ledger.ScoreEvent(qid=qid, sample=s, phase="p", verdict=v, reason="judged")
        for qid, s, v in rows
    }
    tally = aggregates.tally_events(attempts, scores, {}, name="t", status="complete")
    fig = repeats.figures(tally)
    if fig is None:
        return
    m, k = fig.metrics, fig.samples
    complete = [c for c in fig.cases.values() if c.decided == k]
    assert m.complete == len(complete) == m.cases - len(fig.short)
    if complete:
        mean = sum(c.passes / k for c in complete) / len(complete)
        assert m.pass_hat_k is not None and m.pass_at_k is not None
        assert m.pass_hat_k - 1e-12 <= mean <= m.pass_at_k + 1e-12
    else:
        assert m.pass_at_k is None and m.pass_hat_k is None
    # A case is listed inconsistent exactly when its samples had more than one outcome.
    for qid in fig.cases:
        words = {w for q, _s, w in rows if q == qid}
        assert (qid in fig.unstable) == (len(words) > 1)


def test_every_view_shows_the_repeat_figures_the_terminal_prints(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # Before: report.html and the Markdown summary printed no pass@k, pass^k, consistency or
    # judge-sample agreement, and put the case-clustered interval on the attempt pass rate.
    import html

    set_dir = make_set(pytester.path, CASES)
    rows = _example_rows()
    fake.policy = spec(set_dir, _varying_judge({q: rows[q]["question"] for q in CASES})).policy()
    md = pytester.path / "summary.md"
    result = run(
        pytester, set_dir, "--eval-samples=3", "--eval-judge-samples=2", f"--eval-summary-md={md}"
    )
    out = result.stdout.str().splitlines()
    shown = [
        line
        for line in out
        if line.startswith(
            ("samples: ", "mean pass rate: ", "inconsistent cases", "judge samples: ")
        )
    ]
    assert len(shown) == 4, out
    page = html.unescape((only_run(set_dir) / "report.html").read_text(encoding="utf-8"))
    markdown = md.read_text(encoding="utf-8").replace("\\", "")
    for line in shown:
        assert f"<li>{line}</li>" in page, line
        assert f"- {line}" in markdown, line
    # The attempt pass rate carries no other estimator's interval.
    assert "case-clustered" not in page and "case-clustered" not in markdown
