"""The dogfood scorecard over a scripted ten-case run written through the real ledger writer."""

from __future__ import annotations

import json
import shutil
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
    score_attempt,
)

CTX = ("get_context", "context")
QUERY = ("execute_query", "query")
LIST = ("mcp__kb__list_graphs", None)  # no role in the profile: a call all the same
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
    "q09": ([LIST, STORE], "match", "criteria", ["write-back"]),
    "q10": ([CTX, CTX, QUERY], "match", "criteria", ["write-back"]),
    "q12": ([LIST] * 5 + [STORE], "match", "criteria", ["write-back"]),
    "q13": ([LIST, STORE], "match", "criteria", ["write-back"]),
}
# What each write-back's transcript says the store call was given.
STORE_INPUT = {
    "q09": {"compilationId": "c-42", "content": "we chose DuckDB"},
    "q12": {"compilationId": "c-42", "content": "we chose DuckDB"},
    "q13": {"content": "we chose DuckDB"},
}

# Hand-computed: (case, calls, trigger, correctness, discipline, hallucination).
EXPECTED = [
    ("q01", 2, True, 2, True, False),
    ("q02", 3, True, 1, False, False),  # its final query returned 150 rows: a bulk dump
    ("q03", 4, True, 2, False, False),  # four calls
    ("q04", 0, False, 0, True, True),  # answered with no tool call: no trigger, no evidence
    ("q05", 2, True, 2, False, False),  # context call returned 40 entities
    ("q06", 1, True, 0, True, False),  # "not on record" for missing data: excused, 0 of 2
    ("q07", 2, True, 0, True, True),  # invented an answer to an unanswerable question
    ("q08", 3, True, 0, True, False),  # wrong, but backed by a query: not a hallucination
    ("q09", 2, True, 2, True, False),  # write-back: one discovery, one write into c-42
    ("q10", 3, False, 2, False, False),  # write-back that never wrote
    ("q12", 6, True, 2, False, False),  # five list_graphs before its write: six calls
    ("q13", 2, True, 2, False, False),  # wrote into no explicit compilationId
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


def write_run(run_dir: Path, set_dir: Path) -> None:
    """The scripted run of the set at `set_dir`: attempts, tool calls and scores, plus one
    contaminated attempt; its run.json names the set as the core's writer does."""
    ledger_writer.write_run_info(
        run_dir,
        ledger.RunInfo(
            runId="dogfood-baseline-01",
            target="t",
            answererModel="m",
            phase="baseline",
            started=ledger.now_iso(),
            setName="dogfood",
            setDir=str(set_dir.resolve()),
            datasetSha=sets.dataset_sha(set_dir),
        ),
    )
    writer = ledger_writer.LedgerWriter(run_dir)
    for qid, (calls, verdict, _, _) in SCRIPT.items():
        prediction = f"artifacts/{qid}/prediction.json"
        rows = 150 if qid == "q02" else 3
        (run_dir / prediction).parent.mkdir(parents=True)
        (run_dir / prediction).write_text(json.dumps({"rows": [{"n": i} for i in range(rows)]}))
        transcript = f"artifacts/{qid}/transcript.json"
        log = [{"tool": c[0], "input": STORE_INPUT.get(qid, {}) if c is STORE else {}}
               for c in calls]  # fmt: skip
        (run_dir / transcript).write_text(json.dumps({"tool_log": log}))
        writer.append(
            _attempt(qid, predictionPath=prediction, transcriptPath=transcript),
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
    write_run(run, set_dir)
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
    assert card.triggered == 10
    assert card.median_calls == 2.0
    # The excused q06 scores 0 of 2: out of the hallucination rule, in the total.
    assert (card.correctness_total, card.correctness_max, card.excused) == (15, 24, 1)
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
    assert lines[6] == "q06       1        1    0 exc           1  get_context"
    assert lines[11] == (
        "q12       6        1        2           0  "
        + ", ".join(["mcp__kb__list_graphs"] * 5)
        + ", mcp__kb__store | write-back made 5 discovery, 1 write and 0 other call(s); the "
        "shape is one discovery then one write"
    )
    assert lines[12].endswith("| mcp__kb__store names no compilationId")
    assert lines[-2] == (
        "median calls 2 | trigger 10/12 | correctness 15/24 (1 excused) | discipline 6/12 | "
        "hallucinations 2 | unscored 0"
    )
    assert lines[-1] == "left out (contaminated): q11"


def test_default_gate_fails_with_a_reason_per_missed_criterion(card: Scorecard) -> None:
    passed, reasons = card.gate()
    assert not passed
    assert reasons == [
        "trigger 10/12 is below 100%: q04, q10",
        "correctness 15/24 (62%) is below 75%",
        "2 hallucinated zero(s): q04, q07",
        "discipline 6/12 is below 80%: q02, q03, q05, q10, q12, q13",
    ]


LENIENT = Thresholds(
    trigger_rate=0.8, median_calls=2, correctness=0.6, discipline=0.5, hallucinations=2
)


def test_gate_passes_at_the_run_s_own_figures(card: Scorecard) -> None:
    assert card.gate(LENIENT) == (True, [])


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"trigger_rate": 0.9}, "trigger 10/12 is below 90%: q04, q10"),
        ({"median_calls": 1.5}, "median tool calls 2 is above 1.5"),
        ({"correctness": 0.63}, "correctness 15/24 (62%) is below 63%"),
        ({"discipline": 0.6}, "discipline 6/12 is below 60%: q02, q03, q05, q10, q12, q13"),
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
    assert card.set_problem is None  # the caller said what the cases are


def test_the_set_comes_from_the_run_s_record_wherever_the_run_sits(
    run_dir: Path, tmp_path: Path
) -> None:
    # The repro: under --eval-runs-dir the run is not inside its set, and the card
    # looked for cases at run_dir.parent.parent, found none, and scored q06 as 2 of 2.
    elsewhere = tmp_path / "kept-runs" / run_dir.name
    shutil.copytree(run_dir, elsewhere)
    in_place, moved = Scorecard.from_ledger(run_dir), Scorecard.from_ledger(elsewhere)
    assert moved.lines() == in_place.lines()
    assert moved.gate() == in_place.gate()
    assert moved.set_problem is None and moved.excused == 1


def test_a_set_that_moved_or_changed_fails_the_gate_instead_of_scoring_blind(
    run_dir: Path, tmp_path: Path
) -> None:
    set_dir = run_dir.parent.parent
    (set_dir / "cases.jsonl").write_text((set_dir / "cases.jsonl").read_text().replace(
        '"write-back"', '"read"'))  # fmt: skip
    card = Scorecard.from_ledger(run_dir)
    assert card.set_problem is not None and "changed since the run" in card.set_problem
    assert card.rows and card.gate(LENIENT)[1][0] == card.set_problem
    moved_set = tmp_path / "renamed"
    set_dir.rename(moved_set)
    card = Scorecard.from_ledger(moved_set / "runs" / run_dir.name)
    assert card.set_problem == (
        f"the run's set {set_dir} (run.json setDir) holds no set.json and cases.jsonl: put the "
        "set back or pass the cases"
    )
    assert card.lines()[-2] == f"set: {card.set_problem}"


def test_every_excused_attempt_still_counts_in_the_total(tmp_path: Path) -> None:
    # The repro: four "not on record" answers printed correctness 0/0 and the
    # correctness criterion was skipped; the seed counts each 0 against its 2.
    facts = {f"u{i}": CaseFacts(golden_kind="unanswerable") for i in range(4)}
    rows = [
        score_attempt(_attempt(q), [_call(q, 1, *QUERY)], _score(q, "match"), f, Limits())
        for q, f in facts.items()
    ]
    card = Scorecard(rows=rows)
    assert (card.correctness_total, card.correctness_max, card.excused) == (0, 8, 4)
    assert card.hallucinations == []
    assert "correctness 0/8 (0%) is below 75%" in card.gate()[1]


def test_the_seed_s_bar_counts_excused_answers() -> None:
    # 6 matches, 2 wrong answers backed by a query and 2 excused: 12/20, under the seed's 15/20
    # (it passed as 12/16 while excusals shrank the maximum).
    plan = ["match"] * 6 + ["no_match"] * 2 + ["match"] * 2
    rows = [
        score_attempt(_attempt(f"c{i}"), [_call(f"c{i}", 1, *QUERY)], _score(f"c{i}", v),
                      CaseFacts(golden_kind="unanswerable" if i >= 8 else "scalar"), Limits())
        for i, v in enumerate(plan)
    ]  # fmt: skip
    card = Scorecard(rows=rows)
    assert (card.correctness_total, card.correctness_max) == (12, 20)
    assert card.gate()[1] == ["correctness 12/20 (60%) is below 75%"]


@pytest.mark.parametrize(
    ("store_input", "problem"),
    [
        ({"compilationId": "c-42"}, None),
        ({"compilation_id": 42}, None),
        ({"compilationId": "  "}, "mcp__kb__store names no compilationId"),
        ({"compilationId": True}, "mcp__kb__store names no compilationId"),
        (None, "mcp__kb__store's arguments are not on record (no transcript)"),
    ],
)
def test_the_write_names_its_compilation(store_input: Any, problem: str | None) -> None:
    calls = [_call("w", 1, *LIST), _call("w", 2, *STORE)]
    logged = None if store_input is None else {1: (LIST[0], {}), 2: (STORE[0], store_input)}
    from pytest_evalloop.skills.scorecard import write_back_shape

    assert write_back_shape(calls, logged, Limits()) == ([problem] if problem else [])
    # A log whose call at that place is another tool is not this call's record.
    swapped = {1: (LIST[0], {}), 2: ("mcp__kb__ingest_file", {"compilationId": "c-42"})}
    assert write_back_shape(calls, swapped, Limits()) == [
        "mcp__kb__store's arguments are not on record (no transcript)"
    ]


def _score(qid: str, verdict: str) -> ledger.ScoreEvent:
    return ledger.ScoreEvent(qid=qid, sample=None, phase="baseline", verdict=verdict, reason="j")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT * FROM orders", ["execute_query selected * without a limit"]),
        ("SELECT o.* FROM orders o", ["execute_query selected * without a limit"]),
        ("select * from orders limit 10", []),
        ("SELECT id FROM orders LIMIT 5000", ["execute_query asked for 5000 rows (> 100)"]),
        ("SELECT count(*) FROM orders", []),
        # Malloy: the repro, then its limits.
        ("run: t -> { select: * }", ["execute_query selected * without a limit"]),
        ("run: orders -> {\n  select: *\n}", ["execute_query selected * without a limit"]),
        ("run: t -> { select: * limit: 10 }", []),
        ("run: t -> { select: *; limit: 5000 }", ["execute_query asked for 5000 rows (> 100)"]),
        (
            "run: t -> { group_by: state; aggregate: n is count(); top: 500 }",
            ["execute_query asked for 500 rows (> 100)"],
        ),
        ("run: t -> { aggregate: n is count() }", []),
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
    assert [r.qid for r in card.rows if not r.discipline] == ["q10", "q12", "q13"]


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
            "median calls 2 | trigger 10/12 | correctness 15/24 (1 excused) | discipline 6/12 | *",
            "scorecard gate: FAILED",
            "  - trigger 10/12 is below 100%: q04, q10",
        ]
    )


# --- one scorecard whether the run sits in its set or under --eval-runs-dir ---------------------

REAL_QIDS = ["ecom_order_count", "ecom_sales_2022", "ecom_roas", "ecom_cart_abandonment"]
NOT_ON_RECORD = [
    {"tool": "get_context", "input": {"query": "{question}"}},
    {"text": "That is not on record: the data holds no such figures."},
]


def test_eval_scorecard_prints_one_card_in_place_and_under_eval_runs_dir(
    pytester: pytest.Pytester, fake: Any, tmp_path: Path
) -> None:
    from tests.test_run import ORACLE, _example_rows, make_set, run, spec

    set_dir = make_set(pytester.path, REAL_QIDS)
    rows = _example_rows()
    refusals = {rows[q]["question"]: NOT_ON_RECORD for q in REAL_QIDS[2:]}
    answerer = {"default": ORACLE, "by_question": refusals}
    fake.policy = spec(set_dir, answerer=answerer).policy()

    def card(*args: str) -> list[str]:
        result = run(pytester, set_dir, "--eval-scorecard", "--eval-report=off", *args)
        out = result.stdout.lines
        start = next(i for i, line in enumerate(out) if "skill scorecard:" in line)
        end = next(i for i, line in enumerate(out) if line.startswith("scorecard gate:"))
        assert result.ret == 6, result.stdout.str()  # the excused zeros miss the bar
        return out[start + 1 : end + 1]

    in_place = card("--eval-label=dogfood")
    under = card("--eval-label=dogfood", f"--eval-runs-dir={tmp_path / 'kept'}")
    assert under == in_place
    assert (tmp_path / "kept" / "dogfood" / "run.json").is_file()
    assert in_place[-2].startswith(
        "median calls 1.5 | trigger 4/4 | correctness 4/8 (2 excused) | discipline 4/4 | "
        "hallucinations 0 | unscored 0"
    ), in_place
