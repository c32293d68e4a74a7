"""A person's verdict on an attempt: what `evalloop review` writes, and how it counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalloop import cli
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure import aggregates, comparison
from pytest_evalloop.sets import cases as sets
from tests.reviewruns import DOUBTED, FAILED, MATCHED, review_run


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return review_run(tmp_path)


def _totals(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())["totals"]


def _fixtures(run_dir: Path) -> list[sets.RegressionFixture]:
    loaded = sets.load_regressions(run_dir.parent.parent)
    assert not loaded.errors, loaded.errors
    return [row for _, row in loaded.rows]


def test_settling_a_needs_human_and_overruling_a_match_count_as_the_rule_says(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _totals(run_dir)
    assert before["outcomes"] == {"match": 1, "no_match": 1, "needs_human": 1}
    assert before["passRate"] == 0.5
    args = [
        "review",
        str(run_dir),
        DOUBTED,
        "--verdict",
        "match",
        "--why",
        "rows agree",
        "--by",
        "Ann",
    ]
    assert cli.main(args) == 0
    assert (
        cli.main(
            [
                "review",
                str(run_dir),
                MATCHED,
                "--verdict",
                "no_match",
                "--why",
                "wrong year",
                "--by",
                "Bo",
            ]
        )
        == 0
    )
    after = _totals(run_dir)
    # needs_human -> match (a decision now), match -> no_match: 1 of 3 decided passes.
    assert after["outcomes"] == {"match": 1, "no_match": 2}
    assert after["decided"] == 3 and after["passed"] == 1
    assert after["humanSettled"] == 2 and after["overruled"] == 1
    read = ledger_reader.read_run(run_dir)
    assert not read.errors, read.errors
    # Append-only: the judge's scores are as they were.
    assert {k[0]: s.verdict for k, s in read.scores().items()}[MATCHED] == "match"
    reviews = {e.qid: e for e in read.of_kind("review")}
    assert reviews[DOUBTED].reviewer == "Ann" and reviews[DOUBTED].judge_verdict == "needs_human"
    assert reviews[MATCHED].why == "wrong year" and reviews[MATCHED].at
    assert cli.main(["validate", str(run_dir)]) == 0
    fixtures = {f.qid: f for f in _fixtures(run_dir)}
    assert set(fixtures) == {DOUBTED, MATCHED}
    assert fixtures[MATCHED].verdict == "no_match" and fixtures[MATCHED].settled_by == "Bo"
    assert fixtures[MATCHED].model_extra["judgeVerdict"] == "match"
    assert fixtures[MATCHED].prediction["final_query"]
    assert reviews[MATCHED].regression == fixtures[MATCHED].fixture_id
    # The static report was rewritten from the ledger: it shows the people's count.
    assert "settled by people: 2" in (run_dir / "report.html").read_text()


def test_agreeing_with_the_judge_settles_and_files_the_label_too(run_dir: Path) -> None:
    # Kappa over disagreements alone would read 0% agreement whatever the judge: every settled
    # attempt is one fixture, the ones the judge got right included.
    assert (
        cli.main(
            ["review", str(run_dir), FAILED, "--verdict", "no_match", "--why", "yes", "--by", "A"]
        )
        == 0
    )
    [fixture] = _fixtures(run_dir)
    assert (fixture.qid, fixture.verdict, fixture.model_extra["judgeVerdict"]) == (
        FAILED,
        "no_match",
        "no_match",
    )
    assert fixture.rulings == [{"reviewer": "A", "verdict": "no_match"}]
    assert _totals(run_dir)["humanSettled"] == 1 and _totals(run_dir)["overruled"] == 0


def test_a_review_without_a_why_or_a_reviewer_writes_nothing(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = (run_dir / ledger.EVENTS_FILE).read_bytes()
    assert (
        cli.main(["review", str(run_dir), FAILED, "--verdict", "match", "--why", "  ", "--by", "A"])
        == 1
    )
    assert "needs a why" in capsys.readouterr().err
    assert (
        cli.main(
            ["review", str(run_dir), "no_such_qid", "--verdict", "match", "--why", "x", "--by", "A"]
        )
        == 1
    )
    assert "no attempt" in capsys.readouterr().err
    assert (run_dir / ledger.EVENTS_FILE).read_bytes() == events
    assert not (run_dir.parent.parent / sets.REGRESSIONS_FILE).exists()


def test_golden_is_wrong_holds_the_golden_and_changes_no_count(run_dir: Path) -> None:
    before = _totals(run_dir)
    args = ["review", str(run_dir), FAILED, "--verdict", "golden_wrong", "--why", "key is 2021's"]
    assert cli.main([*args, "--by", "Cy"]) == 0
    assert _totals(run_dir) == {**before, "humanSettled": 0, "overruled": 0, "peopleDisagree": 0}
    row = next(c for _, c in sets.load_cases(run_dir.parent.parent).rows if c.qid == FAILED)
    assert row.golden is not None and row.golden.status == "ambiguous"
    assert [e.golden_wrong for e in ledger_reader.read_run(run_dir).of_kind("review")] == [True]


def _score(**kw: object) -> ledger.ScoreEvent:
    base: dict = {
        "qid": "q",
        "sample": None,
        "phase": "baseline",
        "verdict": "match",
        "reason": "r",
    }
    return ledger.ScoreEvent.model_validate({**base, **kw})


@pytest.mark.parametrize(
    ("score", "refused"),
    [
        (None, "harness"),
        (_score(contaminated=True), "contaminated"),
        (_score(gold_status="verified_wrong"), "golden"),
        (_score(verdict=None, reason="not_submitted"), "nothing to score"),
        (_score(verdict="needs_human"), None),
    ],
)
def test_which_attempts_a_person_may_review(score: object, refused: str | None) -> None:
    why = aggregates.review_refusal(score, None)
    assert (why is None) if refused is None else (refused in (why or ""))


def test_the_contract_refuses_a_review_with_no_ruling_or_two() -> None:
    common = {
        "qid": "q",
        "sample": None,
        "phase": "p",
        "reviewer": "A",
        "why": "w",
        "judge_verdict": "match",
    }
    with pytest.raises(ValueError, match="exactly one"):
        ledger.ReviewEvent.model_validate({**common, "verdict": None})
    with pytest.raises(ValueError, match="exactly one"):
        ledger.ReviewEvent.model_validate({**common, "verdict": "match", "golden_wrong": True})


# --- the rule, for every input ------------------------------------------------------------


JUDGE = st.sampled_from(["match", "no_match", "near_match", "needs_human", None])
PERSON = st.sampled_from(["match", "no_match", "near_match", "golden_wrong"])


def _ledger(cases: list[tuple[str | None, bool, str | None]], name: str = "r") -> Any:
    """An in-memory run: per case the judge's verdict, whether contaminated, the review."""
    info = ledger.RunInfo.model_validate(
        {"runId": name, "target": "t", "answererModel": "m", "phase": "baseline", "started": "s"}
    )
    events: list[Any] = []
    for i, (verdict, dirty, ruling) in enumerate(cases):
        qid = f"q{i}"
        common = {"qid": qid, "sample": None, "phase": "baseline"}
        events.append(
            ledger.AttemptEvent.model_validate(
                {
                    **common,
                    "question_sha": "x",
                    "submitted": True,
                    "final_query": "q",
                    "contaminated": dirty,
                }
            )
        )
        events.append(
            ledger.ScoreEvent.model_validate(
                {**common, "verdict": verdict, "reason": "r", "contaminated": dirty}
            )
        )
        if ruling is not None:
            events.append(
                ledger.ReviewEvent.model_validate(
                    {
                        **common,
                        "verdict": None if ruling == "golden_wrong" else ruling,
                        "golden_wrong": ruling == "golden_wrong",
                        "reviewer": "P",
                        "why": "w",
                        "judge_verdict": verdict,
                    }
                )
            )
    return ledger_reader.RunLedger(run_dir=Path(name), info=info, events=events)


CASES = st.lists(st.tuples(JUDGE, st.booleans(), st.none() | PERSON), max_size=25)


@given(CASES)
def test_every_view_counts_a_settled_case_by_the_one_rule(
    cases: list[tuple[str | None, bool, str | None]],
) -> None:
    read = _ledger(cases)
    tally = aggregates.tally(read)
    expected = []
    for verdict, dirty, ruling in cases:
        judged = "contaminated" if dirty else (verdict or "unscored")
        settled = ruling not in (None, "golden_wrong") and judged in aggregates.REVIEWABLE
        expected.append((ruling if settled else judged, settled))
    assert [a.outcome for a in tally.attempts] == [word for word, _ in expected]
    assert tally.human_settled == sum(1 for _, settled in expected if settled)
    assert tally.decided == sum(1 for word, _ in expected if word in aggregates.DECIDED)
    # The comparison (flips, every gate) reads the same verdicts.
    view = comparison.run_view(read, tally)
    sides = [view.cases[f"q{i}"] for i in range(len(cases))]
    for side, (word, _) in zip(sides, expected, strict=True):
        if word in aggregates.REVIEWABLE:
            assert side.verdict == word


def test_a_persons_overrule_is_a_flip_against_the_baseline() -> None:
    base = comparison.run_view(_ledger([("match", False, None)], "base"))
    current = comparison.run_view(_ledger([("match", False, "no_match")], "cur"))
    found = comparison.compare(base, current)
    assert [f.qid for f in found.worse] == ["q0"]


def test_the_flip_table_says_how_many_cases_people_settled() -> None:
    from pytest_evalloop.measure.comparison_text import report_lines

    base = comparison.run_view(_ledger([("match", False, None)], "base"))
    current = comparison.run_view(_ledger([("match", False, "no_match")], "cur"))
    lines = report_lines(
        comparison.compare(base, current),
        None,
        None,
        baseline_label="base",
        current_label="cur",
        band=None,
        verbosity=0,
    )
    assert "cur: settled by people: 1 (1 overruling a decided verdict)" in lines


def test_a_review_keeps_the_reports_flip_view(tmp_path: Path) -> None:
    from tests.reportruns import two_runs

    _, _, current, _ = two_runs(tmp_path)
    assert 'id="flip-table"' in (current / "report.html").read_text()
    qid = next(k[0] for k in ledger_reader.read_run(current).scores())
    args = [
        "review",
        str(current),
        qid,
        "--verdict",
        "near_match",
        "--why",
        "arguable",
        "--by",
        "A",
    ]
    assert cli.main(args) == 0
    html = (current / "report.html").read_text()
    assert 'id="flip-table"' in html and "settled by people: 1" in html
