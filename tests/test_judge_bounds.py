"""What the judge is shown of an answer is bounded and stated, and pinned (issue 41).

The fake refuses a prompt over the model's window as the API does (HTTP 400
`invalid_request_error`, `prompt is too long: N tokens > M maximum`); the endpoint tells such a
refusal apart; no answer can make the judge's prompt outgrow the window; every re-execution
state has its own words, and the `judgePromptSha` pin covers them and every bound.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import anthropic
import pytest

from pytest_evalloop.answer.reexecution import constants_only, reexecution_state
from pytest_evalloop.failures import HarnessError
from pytest_evalloop.judge import judge
from pytest_evalloop.judge.judge import JudgeMaterials, parse_verdict, render_case_prompt
from pytest_evalloop.model_api.endpoint import create_message
from pytest_evalloop.model_api.pricing import STANDARD_CONTEXT
from pytest_evalloop.roles.contract import QueryOutcome
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec

MODEL = "claude-sonnet-4-5"


def materials(**update: Any) -> JudgeMaterials:
    base = JudgeMaterials(
        qid="q",
        question="How many orders?",
        golden_kind="scalar",
        golden_value={"orders": 72482},
        prediction_rows=[{"orders": 72482}],
        prediction_columns=["orders"],
        final_query="SELECT count(*) AS orders FROM orders",
        answer_text="72482 orders.",
        model_definitions="source orders",
    )
    return base.model_copy(update=update)


# --- the fake refuses what the API refuses ------------------------------------------------------


def test_the_fake_refuses_a_prompt_over_the_window_in_the_apis_words() -> None:
    long_text = "x" * (4 * 1_000)
    with FakeAnthropic() as fake:
        fake.context_windows[MODEL] = 500
        client = anthropic.Anthropic(api_key="k", base_url=fake.base_url, max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": long_text}]
            )
        assert fake.calls()[0].status == 400
    body = info.value.body
    assert info.value.status_code == 400
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert re.fullmatch(r"prompt is too long: \d+ tokens > 500 maximum", body["error"]["message"])
    assert STANDARD_CONTEXT == 200_000


def test_the_endpoint_tells_a_refused_size_from_a_broken_endpoint() -> None:
    async def call(fake: FakeAnthropic, text: str, tools: Any = None) -> HarnessError:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=fake.base_url, max_retries=0)
        messages = [{"role": "user", "content": text}]
        try:
            await create_message(client, MODEL, 10, [], tools, messages)
        except HarnessError as exc:
            return exc
        finally:
            await client.close()
        raise AssertionError("no error")

    with FakeAnthropic() as fake:
        fake.context_windows[MODEL] = 50
        too_long = asyncio.run(call(fake, "y" * 1_000))
        bad_tool = [{"name": "bad name!", "input_schema": {"type": "object"}}]
        invalid = asyncio.run(call(fake, "q", bad_tool))
    assert too_long.refused == "too_long"
    assert "as too long (HTTP 400 invalid_request_error: prompt is too long:" in str(too_long)
    assert invalid.refused == "invalid"
    down = ScriptSpec.model_validate({"down": {"status": 500}})
    with FakeAnthropic(down) as fake:
        assert asyncio.run(call(fake, "q")).refused is None


# --- no answer makes the judge's prompt outgrow the window -------------------------------------


def test_a_megabyte_of_rows_is_shown_as_a_stated_sample() -> None:
    rows = [{"pad": "x" * 1_990, "order_id": i} for i in range(480)]
    prompt = render_case_prompt(materials(prediction_rows=rows, prediction_columns=["pad"]))
    assert len(prompt) < 120_000  # about 30,000 tokens, far inside a 200,000-token window
    assert "... 431 more rows not shown (of 480): these are the first 49;" in prompt
    assert "the prompt holds at most 500 rows and 100,000 characters of them" in prompt


def test_long_cells_answers_and_queries_are_cut_where_they_say_so() -> None:
    m = materials(
        prediction_rows=[{"blob": "b" * 5_000, "nested": {"k": "v" * 3_000}}],
        answer_text="a" * 40_000,
        final_query="q" * 25_000,
    )
    prompt = render_case_prompt(m)
    assert "[... the value goes on for 3,000 more characters, not shown]" in prompt
    assert "(a value longer than 2,000 characters is cut where it says so)" in prompt
    assert "[... the answer goes on for 10,000 more characters, not shown]" in prompt
    assert "[... the query goes on for 5,000 more characters, not shown]" in prompt
    assert "b" * 2_001 not in prompt and "a" * 30_001 not in prompt


def test_the_worst_answer_fits_the_window_with_room_for_the_rest() -> None:
    rows = [{f"c{j}": "z" * 1_999 for j in range(60)} for _ in range(500)]
    m = materials(
        prediction_rows=rows, answer_text="a" * 10**6, final_query="q" * 10**6, qid="w" * 10
    )
    case = render_case_prompt(m)
    # The answer's part of the prompt, at most; the doctrine and definitions are the set's.
    assert len(case) < 160_000 < STANDARD_CONTEXT
    # A query can make its own error message as long as it likes: the judge sees its start.
    failed = materials(
        reexecution="failed", reexecution_detail="x" * 2_000_000, prediction_rows=None
    )
    prompt = render_case_prompt(failed)
    assert len(prompt) < 20_000 and "more characters, not shown" in prompt


# --- every re-execution state has its words, and the pin covers them ----------------------------


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ("ok", "ok: the harness re-ran the final query; 1 row"),
        ("unran", "NOT RUN BY THE ANSWERER"),
        ("literal", "NO DATA READ"),
        ("failed", "FAILED: the harness re-ran the final query"),
        ("not_run", "not attempted: "),
    ],
)
def test_each_reexecution_state_is_named_to_the_judge(state: str, words: str) -> None:
    rows = None if state in ("failed", "not_run") else [{"orders": 72482}]
    prompt = render_case_prompt(materials(reexecution=state, prediction_rows=rows))
    assert words in prompt
    if state != "ok":
        assert "ok: the harness re-ran" not in prompt


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PROMPT_ROW_CAP", 5),
        ("PROMPT_ROWS_CHARS", 10),
        ("PROMPT_CELL_CHARS", 3),
        ("PROMPT_ANSWER_CHARS", 7),
        ("PROMPT_QUERY_CHARS", 9),
    ],
)
def test_the_prompt_pin_moves_with_every_bound(
    monkeypatch: pytest.MonkeyPatch, name: str, value: int
) -> None:
    assert pin_moves(monkeypatch, name, value)


def test_the_prompt_pin_moves_with_the_words_of_a_non_ok_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    words = dict(judge._NO_ROWS)
    words["failed"] = words["failed"].replace("failed", "did not work")
    assert pin_moves(monkeypatch, "_NO_ROWS", words)


def pin_moves(monkeypatch: pytest.MonkeyPatch, name: str, value: Any) -> bool:
    """Whether `judgePromptSha` changes with judge.<name> set to `value` (restored after)."""
    before = judge.case_prompt_sha()
    monkeypatch.setattr(judge, name, value)
    judge.case_prompt_sha.cache_clear()
    try:
        return judge.case_prompt_sha() != before
    finally:
        monkeypatch.undo()
        judge.case_prompt_sha.cache_clear()
        assert judge.case_prompt_sha() == before


# --- which rows are constants of their query ----------------------------------------------------


@pytest.mark.parametrize(
    ("query", "rows", "constant"),
    [
        ("SELECT 72482 AS orders", [{"orders": 72482}], True),
        ("SELECT 72482 AS orders FROM order_items LIMIT 1", [{"orders": 72482.0}], True),
        ("SELECT '2022' AS y, 5248931.25 AS s", [{"y": "2022", "s": "5248931.25"}], True),
        ("SELECT * FROM (VALUES (72482, 'Done')) t(n, s)", [{"n": 72482, "s": "DONE"}], True),
        ("SELECT count(*) AS orders FROM orders", [{"orders": 72482}], False),
        # A count equal to a LIMIT or a GROUP BY position is no constant of the query.
        ("SELECT status, count(*) FROM t GROUP BY 1 LIMIT 10", [{"status": "t", "n": 10}], False),
        ("SELECT sum(x) FROM t WHERE false", [{"s": None}], False),
        ("SELECT 1", [], False),
        # Small numbers and short words are in most queries: no evidence of a constant alone.
        ("run: t -> { where: n > 1 aggregate: c is count() }", [{"value": 1}], False),
        ("SELECT x FROM t WHERE rank = 1 AND k = 'ab'", [{"r": 1, "k": "ab"}], False),
        ("run: t -> { select: m is 10, s is 4510963.5 }", [{"m": 10, "s": 4510963.5}], True),
    ],
)
def test_constants_only(query: str, rows: list[dict[str, Any]], constant: bool) -> None:
    assert constants_only(query, rows) is constant


@pytest.mark.parametrize(
    ("query", "constant"),
    [
        ("SELECT 72480 + 2 AS orders", True),
        ("SELECT 72480 + 2 AS orders FROM orders LIMIT 1", True),
        ("SELECT 'a' || 'b' AS s FROM t", True),
        ("SELECT count(*) AS orders FROM orders", False),
        ("SELECT sum(1) AS n FROM orders", False),  # an aggregate counts rows
        ("SELECT (SELECT count(*) FROM t) AS n", False),
        ("SELECT total_sales FROM order_items__sales_by_year WHERE year = 2022", False),
        ("run: orders -> { aggregate: order_count }", False),  # Malloy: not parsed as SQL
        ("SELECT 1; SELECT 2", False),
        # A constant wrapped in a subquery, a VALUES list or a CTE reads no table either.
        ("SELECT (SELECT 72481) + 1 AS orders", True),
        ("SELECT sum(x) AS orders FROM (VALUES (72000), (482)) t(x)", True),
        ("WITH t AS (SELECT 72481 AS n) SELECT n + 1 AS orders FROM t", True),
        ("SELECT count(*) AS orders FROM range(72482)", True),
        ("WITH t AS (SELECT * FROM orders) SELECT count(*) AS orders FROM t", False),
        ("WITH orders AS (SELECT 1 AS n) SELECT count(*) FROM main.orders", False),
        ("SELECT count(*) FROM read_csv('orders.csv')", False),
        ("SELECT a.n FROM (SELECT count(*) AS n FROM orders) a", False),
        ("SELECT 1 AS one UNION ALL SELECT count(*) FROM orders", False),
    ],
)
def test_reads_no_data(query: str, constant: bool) -> None:
    from pytest_evalloop.answer.reexecution import reads_no_data

    assert reads_no_data(query) is constant


def test_the_state_of_a_final_query() -> None:
    rows = QueryOutcome(columns=["orders"], rows=[{"orders": 72482}])
    assert reexecution_state("SELECT 72482 AS orders", rows) == ("literal", None)
    assert reexecution_state("SELECT 72482 AS orders", rows, ran=False) == (
        "literal",
        "the answerer never ran it either",
    )
    assert reexecution_state("SELECT count(*) FROM orders", rows, ran=False) == ("unran", None)
    assert reexecution_state("SELECT count(*) FROM orders", rows) == ("ok", None)
    # A constant computed, not written: DuckDB's parser shows it reads no data.
    assert reexecution_state("SELECT 72480 + 2 AS orders", rows)[0] == "literal"
    assert reexecution_state(None, None) == ("no_query", None)


def test_rows_rule_holds_a_literal_to_no_match_and_spares_a_refusal() -> None:
    said = judge.JudgeOutcome(verdict="match", reason="r", why="the rows contain it")
    held = judge.rows_rule(said, ("literal", None), refusal_case=False)
    assert held.verdict == "no_match" and "reads no data" in held.why
    # The reason shown beside the verdict is the rule's, never the judge's case for a match.
    assert held.reason == "held no_match: the final query reads no data"
    assert judge.rows_rule(said, ("literal", None), refusal_case=True).verdict == "match"
    assert judge.rows_rule(said, ("unran", None), refusal_case=False).verdict == "match"


# --- a doubt needs its evidence -----------------------------------------------------------------


def _reply(**fields: Any) -> str:
    import json

    obj = {"verdict": "match", "confidence": 8, "why": "w", **fields}
    return f"```json\n{json.dumps(obj)}\n```"


@pytest.mark.parametrize("status", ["suspect", "verified_wrong", "verified_benign"])
def test_a_doubted_golden_without_a_gold_note_is_no_verdict(status: str) -> None:
    assert parse_verdict(_reply(gold_status=status)) is None
    assert parse_verdict(_reply(gold_status=status, gold_note="  ")) is None
    parsed = parse_verdict(_reply(gold_status=status, gold_note="72482 vs 72480"))
    assert parsed is not None and parsed.gold_status == status
    # Verified needs no note; a word of the judge's own is noted for it (recorded as suspect).
    assert parse_verdict(_reply(gold_status="verified")) is not None
    own = parse_verdict(_reply(gold_status="looks wrong"))
    assert own is not None and own.gold_status == "suspect" and own.gold_note
