"""What counts in an aggregate: one rule (`aggregates`), and every view of a run agreeing on it.

The pure rule is tested on events; then whole runs through the loopback fake endpoint show
that the terminal summary, `evalloop report`, `run.json` totals, `evalloop flips` and the gate
count a verified_wrong golden, a contaminated attempt and an aborted (harness error) attempt
the same way, and that a resumed run's summary covers the whole run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest

from pytest_evalloop.answer import pipeline
from pytest_evalloop.cli import main as evalloop_main
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger.contract import AttemptEvent, RetrievalScoreEvent, RunInfo, ScoreEvent
from pytest_evalloop.ledger.reader import read_run
from pytest_evalloop.ledger.writer import LedgerWriter, write_run_info
from pytest_evalloop.measure import aggregates
from pytest_evalloop.measure.comparison import compare, read_compared, run_view
from pytest_evalloop.measure.flips import flips_main
from pytest_evalloop.measure.gate import (
    EXIT_GATE_REJECTED,
    EXIT_HARNESS_FAILURE,
    EXIT_RUN_UNFINISHED,
    decide_gate,
    harness_failure,
)
from pytest_evalloop.session import runs
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic, FakeRequest, Fault, ScriptSpec
from tests.sealing import closed_as_is
from tests.test_gate import QIDS
from tests.test_run import ORACLE, make_set

# --- the rule, on events ---------------------------------------------------------------------


def _attempt(qid: str, **kw: Any) -> AttemptEvent:
    return AttemptEvent(
        qid=qid,
        sample=kw.pop("sample", None),
        phase="baseline",
        question_sha="0" * 16,
        submitted=True,
        **{"final_query": f"SELECT '{qid}'", **kw},
    )


def _score(qid: str, verdict: str | None, **kw: Any) -> ScoreEvent:
    return ScoreEvent(
        qid=qid,
        sample=kw.pop("sample", None),
        phase="baseline",
        verdict=verdict,  # type: ignore[arg-type]
        reason=kw.pop("reason", f"judged {qid}"),
        **kw,
    )


def test_each_attempt_gets_one_outcome_word() -> None:
    assert aggregates.outcome(_score("q", "match")) == "match"
    assert aggregates.outcome(_score("q", None, reason="not_submitted")) == "unscored"
    wrong = _score("q", "match", gold_status="verified_wrong", gold_note="3x too high")
    assert aggregates.outcome(wrong) == "gold_wrong"
    assert aggregates.outcome(_score("q", "no_match", gold_status="suspect")) == "no_match"
    dirty = _score("q", None, contaminated=True, gold_status="verified_wrong")
    assert aggregates.outcome(dirty) == "contaminated"  # contamination outranks everything
    assert aggregates.outcome(None, _attempt("q", error="answerer: HTTP 503")) == "harness_error"
    assert aggregates.outcome(None, _attempt("q", contaminated=True)) == "contaminated"
    assert aggregates.outcome(_score("q", "match", contaminated="unknown")) == "match"
    assert [aggregates.counts(w) for w in ("gold_wrong", "contaminated", "harness_error")] == [
        False,
        False,
        False,
    ]
    assert all(aggregates.counts(w) for w in ("match", "near_match", "needs_human", "unscored"))


def test_the_outcome_words_are_written_once() -> None:
    # The summary's order is the Literal's, and an item's status is the same word list.
    assert aggregates.OUTCOMES == get_args(aggregates.Outcome)
    assert get_args(pipeline.Status) == aggregates.OUTCOMES
    assert aggregates.OUTCOMES[:2] == ("match", "no_match") and len(set(aggregates.OUTCOMES)) == 8


def _tally(rows: list[tuple[str, str | None, dict[str, Any]]], **kw: Any) -> aggregates.Tally:
    """rows: (qid, verdict or "harness_error", score fields incl. recall)."""
    attempts, scores, recalls = {}, {}, {}
    for qid, verdict, given in rows:
        key = (qid, None)
        fields = dict(given)
        recall = fields.pop("recall", None)
        attempts[key] = _attempt(qid, contaminated=fields.get("contaminated", False))
        if verdict != "harness_error":
            scores[key] = _score(qid, verdict, **fields)
            recalls[key] = recall
    return aggregates.tally_events(attempts, scores, recalls, name="r", status=kw.get("status"))


def test_the_tally_keeps_gold_wrong_contaminated_and_aborted_out_of_every_figure() -> None:
    t = _tally(
        [
            ("a", "match", {"recall": 1.0}),
            ("b", "match", {"recall": 0.5}),
            ("c", "no_match", {"recall": 0.0}),
            ("d", "near_match", {"recall": 1.0}),
            ("e", "match", {"recall": 0.0, "gold_status": "verified_wrong", "gold_note": "n"}),
            ("f", "harness_error", {}),
        ]
    )
    assert t.outcomes == {
        "match": 2,
        "no_match": 1,
        "near_match": 1,
        "gold_wrong": 1,
        "harness_error": 1,
    }
    assert (t.passed, t.decided, t.pass_rate, t.withheld) == (2, 3, 2 / 3, None)
    # near_match retrieved for real and counts in recall; gold_wrong and the error do not.
    assert t.recalls == [1.0, 0.5, 0.0, 1.0] and t.recall == 0.625
    assert t.doubted == [{"qid": "e", "gold_status": "verified_wrong", "gold_note": "n"}]
    totals = t.totals()
    assert totals["outcomes"]["harness_error"] == 1 and totals["passRate"] == round(2 / 3, 6)
    assert totals["recallAttempts"] == 4 and totals["harnessFailure"] is None


def test_contamination_under_the_limit_publishes_the_rate_and_above_it_fails_the_harness() -> None:
    # Seed 004: a harness failure above 10% of the attempts, or on any contamination in a run
    # under 10; below that the contaminated attempts leave the aggregates, the rate is published.
    clean = [(f"q{i}", "match", {"recall": 1.0}) for i in range(10)]
    dirty = ("x", None, {"contaminated": True, "reason": "contaminated", "recall": 0.0})
    one = _tally([*clean, dirty])
    assert one.contaminated == 1 and one.pass_rate == 1.0 and one.withheld is None
    assert one.harness_failure is None  # 1 of 11 is under 10%
    assert one.recalls == [1.0] * 10
    two = _tally([*clean[:8], dirty, ("y", None, {"contaminated": True, "reason": "c"})])
    limit = "2 of 10 attempts contaminated (limit: more than 10% of the attempts)"
    assert limit in (two.harness_failure or "") and (two.withheld or "").startswith(limit)
    assert two.pass_rate is None
    small = _tally([*clean[:5], dirty])
    assert (small.withheld or "").startswith(
        "1 of 6 attempts contaminated (limit: any on a run under 10 attempts)"
    )
    assert small.harness_failure is not None
    aborted = _tally(clean[:3], status="aborted")
    assert aborted.harness_failure == "run r aborted"
    assert (aborted.withheld or "").startswith("the run aborted")
    invalid = _tally(clean[:3], status="invalid")
    assert (invalid.harness_failure or "").startswith("run r does not validate")
    assert invalid.pass_rate is None and "does not validate" in (invalid.withheld or "")


def test_every_reader_of_a_tally_reads_the_fields_it_needs() -> None:
    # A light read raises on a key it did not read: the comparison and the close reads must
    # carry every key the rule looks at.
    assert aggregates.FIELDS - aggregates.RETRIEVAL_FIELDS <= ledger_reader.COMPARED_FIELDS
    assert aggregates.FIELDS <= runs.CLOSE_FIELDS and aggregates.KINDS <= runs.CLOSE_KINDS


# --- comparisons and the gate, on stored runs ------------------------------------------------

PINS = {
    "datasetSha": "d" * 64,
    "judgeVersion": "4",
    "rubricSha": "r" * 64,
    "answererModel": "m",
    "judgeModel": "m",
    "target": "embedded",
}


def _write_run(
    runs_dir: Path, name: str, rows: dict[str, tuple[str | None, dict[str, Any]]]
) -> Path:
    from tests.test_flips import whole_selection

    run_dir = runs_dir / name
    info = {
        "runId": name,
        "phase": "baseline",
        "started": "2026-12-01T00:00:00Z",
        "sessionId": f"session-{name}",
        "selection": whole_selection(len(rows)),
        **PINS,
    }
    write_run_info(run_dir, RunInfo.model_validate({**info, "status": "complete"}))
    events: list[Any] = []
    for qid, (verdict, fields) in rows.items():
        dirty = fields.get("contaminated", False)
        # Each run answered on its own: its own final query text (two runs sharing answers
        # byte for byte are one run counted twice, which the comparability rule refuses).
        events.append(_attempt(qid, contaminated=dirty, final_query=f"SELECT '{qid}' -- {name}"))
        if verdict != "harness_error":
            events.append(_score(qid, verdict, **fields))
            events.append(RetrievalScoreEvent(qid=qid, sample=None, phase="baseline", recall=1.0))
    LedgerWriter(run_dir).append(*events)
    closed_as_is(run_dir)
    return run_dir


def test_a_comparison_drops_a_case_out_on_either_side_and_says_how_many(
    tmp_path: Path, capsys: Any
) -> None:
    dirty = (None, {"contaminated": True, "reason": "contaminated"})
    wrong = ("match", {"gold_status": "verified_wrong", "gold_note": "the key sums 3 slices"})
    base = {f"q{i}": ("no_match", {}) for i in range(12)} | {"q1": dirty}
    cur = {f"q{i}": ("match", {}) for i in range(12)} | {"q2": wrong, "q3": ("harness_error", {})}
    a, b = _write_run(tmp_path, "a", base), _write_run(tmp_path, "b", cur)
    c = compare(run_view(read_run(a)), run_view(read_run(b)))
    assert [(d.qid, d.reason) for d in c.dropped] == [
        ("q1", "contaminated"),
        ("q2", "gold_wrong"),
        ("q3", "harness_error"),
    ]
    assert len(c.better) == 9 and c.neither == [] and c.scored_in_both == 9
    assert c.withheld == []  # 1 of 12 is under the limit: the rate is published
    assert flips_main([str(a), str(b)]) == 0
    out = _flat(capsys.readouterr().out)
    assert (
        "dropped (out of every aggregate on either side): 3: 1 contaminated (q1); "
        "1 gold_wrong (q2); 1 harness_error (q3)"
    ) in out
    assert "better (no_match -> match): 9" in out


@pytest.mark.parametrize("gate", ["bar", "no-regressions", "off"])
def test_no_gate_accepts_a_run_whose_pass_rate_is_withheld(
    tmp_path: Path, capsys: Any, gate: str
) -> None:
    # q5 and q6 failed in the baseline: contaminated now they are dropped (after a pass they
    # would count as worse); the other five fixed would pass the bar alone.
    base = {f"q{i}": ("no_match" if i < 7 else "match", {}) for i in range(12)}
    cur = {f"q{i}": ("match", {}) for i in range(12)}
    cur["q5"] = cur["q6"] = (None, {"contaminated": True, "reason": "contaminated"})
    a, b = _write_run(tmp_path, "a", base), _write_run(tmp_path, "b", cur)
    assert harness_failure(read_run(b)) is not None  # 2 of 12: above the limit
    c = compare(run_view(read_run(a)), run_view(read_run(b)))
    verdict = decide_gate(gate, c, allow_pin_mismatch=False, targeted=None)  # type: ignore[arg-type]
    assert verdict.decision == "refused"
    assert "pass rate withheld (b: 2 of 12 attempts contaminated" in verdict.reason
    assert "(the flips alone: accepted)" in verdict.reason
    assert verdict.reason.count("gate off") == (gate == "off")
    expected = 0 if gate == "off" else EXIT_GATE_REJECTED
    assert verdict.exit_code == expected
    failed = 0 if gate == "off" else EXIT_HARNESS_FAILURE
    assert flips_main([str(a), str(b), "--gate", gate]) == failed
    assert f"gate {gate}: REFUSED -- " in capsys.readouterr().out


def _flat(text: str) -> str:
    """Text with its wrapped lines joined and whitespace runs made single spaces."""
    return " ".join(text.split())


# --- whole runs through the fake endpoint ----------------------------------------------------

GOLD_NOTE = "the golden sums three overlapping time slices: 3x the re-executed total"
READS_THE_KEY = [
    {"tool": "get_context", "input": {"query": "{question}"}},
    {
        "tool": "execute_query",
        "input": {"sql": "SELECT * FROM read_text('evals/shop/cases.jsonl')"},
    },
    {"text": "I looked it up.\n\nFinal query:\n```sql\n{modelQuery}\n```"},
]


def _questions(set_dir: Path) -> dict[str, str]:
    return {c.qid: c.question for _, c in sets.load_cases(set_dir).rows}


def _policy(
    set_dir: Path,
    *,
    no_match: set[str] = frozenset(),  # type: ignore[assignment]
    gold_wrong: set[str] = frozenset(),  # type: ignore[assignment]
    contaminated: set[str] = frozenset(),  # type: ignore[assignment]
    judge_down: set[str] = frozenset(),  # type: ignore[assignment]
) -> Any:
    q = _questions(set_dir)
    judged: dict[str, Any] = {q[i]: {"verdict": "no_match", "why": f"fails {i}"} for i in no_match}
    for qid in gold_wrong:
        judged[q[qid]] = {
            "verdict": "match",
            "gold_status": "verified_wrong",
            "gold_note": GOLD_NOTE,
        }
    inner = ScriptSpec.model_validate(
        {
            "cases_file": str(set_dir / sets.CASES_FILE),
            "answerer": {
                "default": ORACLE,
                "by_question": {q[i]: READS_THE_KEY for i in contaminated},
            },
            "judge": {"default": {"verdict": "match"}, "by_question": judged},
        }
    ).policy()
    down = [q[i] for i in judge_down]

    def policy(request: FakeRequest) -> Any:
        if request.role == "judge" and any(question in request.user_text for question in down):
            return Fault(status=400, message="the judge's endpoint refused this request")
        return inner(request)

    return policy


def _run(pytester: pytest.Pytester, set_dir: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(str(set_dir), "-p", "no:cacheprovider", *args)


def _section(out: str, title: str) -> list[str]:
    """The lines of one `evalloop: ...` section of the terminal summary."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if f" evalloop: {title} " in line)
    rest = lines[start + 1 :]
    end = next((i for i, line in enumerate(rest) if line.startswith("=")), len(rest))
    return rest[:end]


def _report(run_dir: Path, capsys: Any) -> list[str]:
    capsys.readouterr()
    assert evalloop_main(["report", str(run_dir)]) == 0
    return capsys.readouterr().out.splitlines()


def test_a_golden_the_judge_shows_wrong_is_gold_wrong_in_every_view(
    pytester: pytest.Pytester, fake: FakeAnthropic, capsys: Any
) -> None:
    shop = make_set(pytester.path, QIDS[:3])
    fake.policy = _policy(shop, gold_wrong={QIDS[1]})
    result = _run(pytester, shop, "-v", "-rs", "--eval-label=r")
    out = result.stdout.str()
    assert result.ret == 0, out
    assert result.parseoutcomes() == {"passed": 2, "gold_wrong": 1}
    result.stdout.fnmatch_lines(
        [
            f"*::{QIDS[1]} GOLD_WRONG*",
            f"GOLD_WRONG *::{QIDS[1]} - the judge showed the golden wrong: {GOLD_NOTE}; "
            "judge said match; *",
        ]
    )
    summary = _section(out, "r")
    assert "verdicts: 2 match, 1 gold_wrong" in summary
    rate = (
        "pass rate: 100.0% (2/2 decided; near_match, needs_human and unscored excluded; "
        "out of every aggregate: 1 gold_wrong), 95% Wilson interval 34.2%–100.0%"
    )
    assert rate in summary
    doubted = f"golden doubted by the judge: {QIDS[1]} (verified_wrong): {GOLD_NOTE}"
    assert doubted in summary
    run_dir = shop / "runs" / "r"
    report = _report(run_dir, capsys)
    assert report[:2] == summary[:2] and doubted in report
    info = ledger_reader.read_run_info(run_dir)
    assert info.totals is not None
    assert info.totals["outcomes"] == {"match": 2, "gold_wrong": 1}
    assert (info.totals["decided"], info.totals["passRate"]) == (2, 1.0)
    assert info.doubted_goldens == [
        {"qid": QIDS[1], "gold_status": "verified_wrong", "gold_note": GOLD_NOTE}
    ]
    view = run_view(read_compared(run_dir))
    assert view.outcomes == info.totals["outcomes"]
    assert view.cases[QIDS[1]].excluded == "gold_wrong"


def test_every_view_counts_a_run_the_same_and_one_contaminated_attempt_in_ten_is_dropped(
    pytester: pytest.Pytester, fake: FakeAnthropic, capsys: Any
) -> None:
    """A post run with a verified_wrong golden, a contaminated and an aborted attempt."""
    shop = make_set(pytester.path, QIDS)
    # QIDS[5..7] fail in the baseline: contaminated after a pass QIDS[5] would count as worse,
    # and gold_wrong or a harness error after a pass would be a lost decision (undecided now).
    fake.policy = _policy(shop, no_match=set(QIDS[:8]))
    base = _run(pytester, shop, "--eval-label=base")
    assert (shop / "runs" / "base" / "run.json").is_file(), base.stdout.str()
    fake.policy = _policy(shop, gold_wrong={QIDS[6]}, contaminated={QIDS[5]}, judge_down={QIDS[7]})
    result = _run(
        pytester,
        shop,
        "--baseline=base",
        "--eval-gate=bar",
        "--eval-label=post",
        "--eval-retries=0",
    )
    out = result.stdout.str()
    # Five fixed, none broken; 1 contaminated attempt in 10 is not above the limit (seed 004):
    # it leaves the aggregates, the rate is published with the count, and the bar accepts.
    assert result.ret == 0, out
    assert result.parseoutcomes() == {"passed": 7, "gold_wrong": 1, "errors": 2}
    counts = "verdicts: 7 match, 1 gold_wrong, 1 contaminated, 1 harness_error"
    rate = (
        "pass rate: 100.0% (7/7 decided; near_match, needs_human and unscored excluded; out of "
        "every aggregate: 1 gold_wrong, 1 contaminated, 1 harness_error), "
        "95% Wilson interval 64.6%–100.0%"
    )
    summary = _section(out, "post")
    assert summary[:3] == [counts, rate, "submitted: 7/7 (100.0%)"]
    [seen] = [line for line in summary if line.startswith("contaminated attempts: 1")]
    assert f"{QIDS[5]}: a sandbox-refused read of " in seen and "reached" not in seen
    # The contaminated, gold_wrong and harness-error attempts leave the recall mean.
    assert any(
        line.startswith("retrieval recall: mean ") and line.endswith(" over 7 attempts")
        for line in summary
    ), summary
    gate = _flat("\n".join(_section(out, "against the baseline")))
    assert "better (no_match -> match): 5 worse (match -> no_match): 0" in gate
    dropped = (
        f"dropped (out of every aggregate on either side): 3: 1 contaminated ({QIDS[5]}); "
        f"1 gold_wrong ({QIDS[6]}); 1 harness_error ({QIDS[7]})"
    )
    assert dropped in gate
    assert "gate bar: ACCEPTED -- acceptance bar: 0 worse needs >= 5 better; got 5" in gate

    run_dir = shop / "runs" / "post"
    report = _report(run_dir, capsys)
    assert report[:2] == summary[:2]
    recall_line = next(line for line in summary if line.startswith("retrieval recall"))
    assert recall_line in report
    totals = ledger_reader.read_run_info(run_dir).totals
    assert totals is not None
    assert totals["outcomes"] == {
        "match": 7,
        "gold_wrong": 1,
        "contaminated": 1,
        "harness_error": 1,
    }
    assert (totals["decided"], totals["passRate"], totals["recallAttempts"]) == (7, 1.0, 7)
    assert totals["passRateWithheld"] is None and totals["harnessFailure"] is None
    view = run_view(read_compared(run_dir))
    assert view.outcomes == totals["outcomes"] and view.withheld is None
    c = compare(run_view(read_compared(shop / "runs" / "base")), view)
    assert c.scored_in_both == totals["decided"]
    assert {d.reason: d.qid for d in c.dropped} == {
        "contaminated": QIDS[5],
        "gold_wrong": QIDS[6],
        "harness_error": QIDS[7],
    }
    [check] = ledger_reader.read_run(run_dir).of_kind("acceptance_check")
    assert check.decision == "accepted"
    capsys.readouterr()
    assert flips_main(["base", "post", "--set", str(shop), "--gate", "bar"]) == 0
    printed = _flat(capsys.readouterr().out)
    assert dropped in printed
    assert "gate bar: ACCEPTED" in printed


def test_a_resumed_run_summarises_the_whole_run(
    pytester: pytest.Pytester, fake: FakeAnthropic, capsys: Any
) -> None:
    shop = make_set(pytester.path, QIDS[:6])
    fake.policy = _policy(shop, no_match={QIDS[1]})
    # -x stops the session at the first no_match: the run is left interrupted after 2 cases.
    first = _run(pytester, shop, "-x", "--eval-concurrency=1", "--eval-label=r")
    assert first.ret == EXIT_RUN_UNFINISHED, first.stdout.str()  # stopped by -x: unfinished
    run_dir = shop / "runs" / "r"
    assert ledger_reader.read_run_info(run_dir).status == "interrupted"
    assert len(ledger_reader.read_run(run_dir).scores()) == 2
    resumed = _run(pytester, shop, "--eval-resume=r")
    summary = _section(resumed.stdout.str(), "r")
    assert summary[:2] == [
        "verdicts: 5 match, 1 no_match",
        "pass rate: 83.3% (5/6 decided; near_match, needs_human and unscored excluded), "
        "95% Wilson interval 43.6%–97.0%",
    ]
    recall_line = next(line for line in summary if line.startswith("retrieval recall"))
    assert recall_line.endswith(" over 6 attempts")
    assert (
        "this session answered 4 of the run's 6 attempts; the figures above cover the whole run"
        in summary
    )
    report = _report(run_dir, capsys)
    assert report[:2] == summary[:2] and recall_line in report
    assert json.loads((run_dir / "run.json").read_text())["totals"]["recallAttempts"] == 6


class _Retrieval:
    """A stand-in `retrieval_score` event: only the keys a tally reads."""

    def __init__(self, recall: float | None, precision: float | None, noise: int, coverage: str):
        self.recall, self.precision, self.noise, self.coverage = recall, precision, noise, coverage


def test_precision_counts_covered_cases_that_stay_in_the_aggregates() -> None:
    attempts = {(q, None): _attempt(q, contaminated=q == "dirty") for q in "abcd"}
    attempts[("dirty", None)] = _attempt("dirty", contaminated=True)
    scores = {key: _score(key[0], "match") for key in attempts}
    retrieval = {
        ("a", None): _Retrieval(1.0, 0.5, 2, "covered"),
        ("b", None): _Retrieval(1.0, 1.0, 0, "covered"),
        ("c", None): _Retrieval(0.0, 0.0, 5, "derivable"),  # a modelling gap: left out
        ("d", None): _Retrieval(None, None, 3, "absent"),
        ("dirty", None): _Retrieval(1.0, 0.0, 9, "covered"),  # contaminated: left out
    }
    t = aggregates.tally_events(attempts, scores, retrieval, name="r", status="complete")
    assert t.precisions == [0.5, 1.0]
    assert t.precision == 0.75 and t.noise == 1.0
    assert t.recalls == [1.0, 1.0, 0.0]  # recall keeps derivable cases, never a contaminated one
    totals = t.totals()
    assert (totals["precision"], totals["precisionAttempts"], totals["noise"]) == (0.75, 2, 1.0)
