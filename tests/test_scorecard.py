"""The dogfood scorecard over a scripted ten-case run written through the real ledger writer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.skills.scorecard import (
    CaseFacts,
    Limits,
    Row,
    Scorecard,
    Thresholds,
    bulk_dumps,
    load_case_facts,
)

CTX = ("get_context", "context")
QUERY = ("execute_query", "query")
STORE = ("mcp__kb__store", None)

# qid: (tool calls as (tool, role, extra fields), verdict, golden kind, tags)
SCRIPT: dict[str, tuple[list[tuple[Any, ...]], str | None, str, list[str]]] = {
    "q01": ([CTX, QUERY], "match", "scalar", []),
    "q02": ([CTX, QUERY, QUERY], "near_match", "rows", []),
    "q03": ([CTX, CTX, QUERY, QUERY], "match", "scalar", []),
    "q04": ([], "no_match", "scalar", []),
    "q05": ([(*CTX, {"rankedSummary": {"resultCount": 40}}), QUERY], "match", "scalar", []),
    "q06": ([CTX], "match", "unanswerable", ["unanswerable"]),
    "q07": ([CTX, QUERY], "no_match", "unanswerable", ["unanswerable"]),
    "q08": ([CTX, (*QUERY, {"error": "Binder Error"}), QUERY], "no_match", "scalar", []),
    "q09": ([CTX, STORE], "match", "criteria", ["write-back"]),
    "q10": ([CTX, CTX, QUERY], "match", "criteria", ["write-back"]),
}

# Hand-computed: (case, calls, trigger, correctness, discipline, hallucination).
EXPECTED = [
    ("q01", 2, True, 2, True, False),
    ("q02", 3, True, 1, False, False),  # its final query returned 150 rows: a bulk dump
    ("q03", 4, True, 2, False, False),  # four calls
    ("q04", 0, False, 0, True, True),  # answered with no tool call: no trigger, no evidence
    ("q05", 2, True, 2, False, False),  # context call returned 40 entities
    ("q06", 1, True, None, True, False),  # "not on record" for missing data: excused
    ("q07", 2, True, 0, True, True),  # invented an answer to an unanswerable question
    ("q08", 3, True, 0, True, False),  # wrong, but backed by a query: not a hallucination
    ("q09", 2, True, 2, True, False),  # write-back: one read, one write
    ("q10", 3, False, 2, False, False),  # write-back that never wrote
]


def write_set(set_dir: Path) -> None:
    """A set whose cases carry the golden kinds and tags of SCRIPT."""
    set_dir.mkdir(parents=True)
    (set_dir / "set.json").write_text(json.dumps({"name": "dogfood"}))
    rows = []
    for qid, (_, _, kind, tags) in SCRIPT.items():
        question = f"question {qid}?"
        rows.append(
            {
                "qid": qid,
                "question": question,
                "split": "dev",
                "tags": tags,
                "golden": {"status": "verified", "kind": kind, "value": 1},
                "questionSha": sets.question_sha(question),
            }
        )
    (set_dir / "cases.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_run(run_dir: Path) -> None:
    """The scripted run: attempts, tool calls and scores, plus one contaminated attempt."""
    ledger_writer.write_run_info(
        run_dir,
        ledger.RunInfo(
            runId="dogfood-baseline-01",
            target="t",
            answererModel="m",
            phase="baseline",
            started=ledger.now_iso(),
        ),
    )
    writer = ledger_writer.LedgerWriter(run_dir)
    for qid, (calls, verdict, _, _) in SCRIPT.items():
        prediction = f"artifacts/{qid}/prediction.json"
        rows = 150 if qid == "q02" else 3
        (run_dir / prediction).parent.mkdir(parents=True)
        (run_dir / prediction).write_text(json.dumps({"rows": [{"n": i} for i in range(rows)]}))
        writer.append(
            _attempt(qid, predictionPath=prediction),
            *[_call(qid, seq, *call) for seq, call in enumerate(calls, start=1)],
            ledger.ScoreEvent(
                qid=qid, sample=None, phase="baseline", verdict=verdict, reason="judged"
            ),
        )
    writer.append(
        _attempt("q11", contaminated=True),
        ledger.ScoreEvent(
            qid="q11", sample=None, phase="baseline", verdict=None, reason="contaminated"
        ),
    )


def _attempt(qid: str, **extra: Any) -> ledger.AttemptEvent:
    return ledger.AttemptEvent(
        qid=qid,
        sample=None,
        phase="baseline",
        question_sha="0" * 16,
        submitted=True,
        final_query="SELECT 1",
        **extra,
    )


def _call(
    qid: str, seq: int, tool: str, role: str | None, extra: Any = None
) -> ledger.ToolCallEvent:
    return ledger.ToolCallEvent(
        qid=qid,
        sample=None,
        phase="baseline",
        tool=tool,
        role=role,
        seq=seq,
        query="SELECT count(*) FROM orders" if role == "query" else None,
        **(extra or {}),
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    set_dir = tmp_path / "dogfood"
    write_set(set_dir)
    run = set_dir / "runs" / "dogfood-baseline-01"
    write_run(run)
    return run


@pytest.fixture
def card(run_dir: Path) -> Scorecard:
    return Scorecard.from_ledger(run_dir)


def test_rows_match_the_hand_computed_table(card: Scorecard) -> None:
    got = [
        (r.label, r.calls, r.trigger, r.correctness, r.discipline, r.hallucination)
        for r in card.rows
    ]
    assert got == EXPECTED
    assert card.excluded == ["q11"]
    assert [r.qid for r in card.rows if r.excused] == ["q06"]


def test_totals(card: Scorecard) -> None:
    assert card.triggered == 8
    assert card.median_calls == 2.0
    assert (card.correctness_total, card.correctness_max) == (11, 18)
    assert card.disciplined == 6
    assert [r.qid for r in card.hallucinations] == ["q04", "q07"]
    assert card.unscored == []


def test_lines(card: Scorecard) -> None:
    lines = card.lines()
    assert lines[0] == "case  calls  trigger  correct  discipline  tools / notes"
    assert lines[1] == "q01       2        1        2           1  get_context, execute_query"
    assert lines[2] == (
        "q02       3        1        1           0  get_context, execute_query, execute_query"
        " | final query returned 150 rows (> 100)"
    )
    assert lines[6] == "q06       1        1  excused           1  get_context"
    assert lines[-2] == (
        "median calls 2 | trigger 8/10 | correctness 11/18 | discipline 6/10 | "
        "hallucinations 2 | unscored 0"
    )
    assert lines[-1] == "left out (contaminated): q11"


def test_default_gate_fails_with_a_reason_per_missed_criterion(card: Scorecard) -> None:
    passed, reasons = card.gate()
    assert not passed
    assert reasons == [
        "trigger 8/10 is below 100%: q04, q10",
        "correctness 11/18 (61%) is below 75%",
        "2 hallucinated zero(s): q04, q07",
        "discipline 6/10 is below 80%: q02, q03, q05, q10",
    ]


LENIENT = Thresholds(
    trigger_rate=0.8, median_calls=2, correctness=0.6, discipline=0.6, hallucinations=2
)


def test_gate_passes_at_the_run_s_own_figures(card: Scorecard) -> None:
    assert card.gate(LENIENT) == (True, [])


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"trigger_rate": 0.9}, "trigger 8/10 is below 90%: q04, q10"),
        ({"median_calls": 1.5}, "median tool calls 2 is above 1.5"),
        ({"correctness": 0.62}, "correctness 11/18 (61%) is below 62%"),
        ({"discipline": 0.7}, "discipline 6/10 is below 70%: q02, q03, q05, q10"),
        ({"hallucinations": 1}, "2 hallucinated zero(s): q04, q07"),
    ],
)
def test_gate_fails_on_each_threshold(card: Scorecard, change: dict[str, Any], reason: str) -> None:
    assert card.gate(replace(LENIENT, **change)) == (False, [reason])


def test_unscored_attempts_fail_the_gate(card: Scorecard) -> None:
    card.rows.append(
        Row("q12", None, ("get_context",), True, "needs_human", None, False, False, True)
    )
    passed, reasons = card.gate(replace(LENIENT, trigger_rate=0.7))
    assert not passed
    assert reasons == ["1 attempt(s) unscored: q12; every case needs a verdict"]
    assert card.gate(replace(LENIENT, trigger_rate=0.7, unscored=1)) == (True, [])


def test_an_empty_run_fails(tmp_path: Path) -> None:
    assert Scorecard.from_ledger(tmp_path, cases={}).gate() == (
        False,
        [f"no attempts to score in {tmp_path}"],
    )


def test_case_facts_come_from_the_set(run_dir: Path) -> None:
    facts = load_case_facts(run_dir.parent.parent)
    assert facts["q06"] == CaseFacts(golden_kind="unanswerable", write_back=False)
    assert facts["q09"] == CaseFacts(golden_kind="criteria", write_back=True)
    assert load_case_facts(run_dir) == {}


def test_without_case_facts_nothing_is_excused(run_dir: Path) -> None:
    card = Scorecard.from_ledger(run_dir, cases={})
    by_qid = {r.qid: r for r in card.rows}
    assert by_qid["q06"].correctness == 2 and not by_qid["q06"].excused
    assert by_qid["q07"].hallucination is False  # a query backs it, and no golden says otherwise
    assert by_qid["q10"].trigger is True  # not known to be a write-back case


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT * FROM orders", ["execute_query selected * without a LIMIT"]),
        ("select * from orders limit 10", []),
        ("SELECT id FROM orders LIMIT 5000", ["execute_query asked for 5000 rows (> 100)"]),
        ("SELECT count(*) FROM orders", []),
    ],
)
def test_bulk_queries(query: str, expected: list[str]) -> None:
    event = ledger.ToolCallEvent(
        qid="q", sample=None, phase="p", tool="execute_query", role="query", query=query
    )
    assert bulk_dumps([event], None, Limits()) == expected


def test_limits_are_configurable(run_dir: Path) -> None:
    card = Scorecard.from_ledger(
        run_dir, limits=Limits(max_calls=4, max_context_results=50, max_rows=200)
    )
    assert [r.qid for r in card.rows if not r.discipline] == ["q10"]


def test_terminal_section(pytester: pytest.Pytester, run_dir: Path) -> None:
    pytester.makeconftest(
        f"""
        from pathlib import Path
        from pytest_evalloop.skills.scorecard import terminal_section

        def pytest_terminal_summary(terminalreporter):
            terminal_section(terminalreporter, Path({str(run_dir)!r}))
        """
    )
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        [
            "*skill scorecard: dogfood-baseline-01*",
            "case  calls  trigger  correct  discipline  tools / notes",
            "median calls 2 | trigger 8/10 | correctness 11/18 | discipline 6/10 | *",
            "scorecard gate: FAILED",
            "  - trigger 8/10 is below 100%: q04, q10",
        ]
    )
