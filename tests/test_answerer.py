"""The anthropic answerer, through the real AsyncAnthropic client over loopback HTTP and a real
in-process MCP server (duckdb behind its query tool)."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import pytest
from mcp import Client, MCPError
from mcp.server.mcpserver import MCPServer
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolResult,
    EmbeddedResource,
    TextContent,
    TextResourceContents,
)

from pytest_evalloop.answer.answerer import (
    SYSTEM_PROMPT,
    TRANSCRIPT_RESULT_CHARS,
    AnthropicAnswerer,
    choose_final_query,
    extract_declared_final,
    extract_reported_calls,
    final_call,
    report_line,
)
from pytest_evalloop.failures import HarnessError
from pytest_evalloop.model_api.pricing import PriceTable
from pytest_evalloop.roles.contract import (
    AnswerRecord,
    ContextResult,
    QueryOutcome,
    TargetSession,
    ToolOutcome,
    ToolRole,
    ToolSpec,
    ToolUse,
)
from pytest_evalloop.targets.bridge import outcome_from_mcp

SECRET = "test-key-SECRET-do-not-leak-0123456789"
MODEL = "claude-sonnet-4-6"
QUESTION = "What was the total revenue in 2024?"

# --------------------------------------------------------------------------- the target


def make_target() -> MCPServer:
    """A two-tool MCP server: ranked context with a trace id, and duckdb queries."""
    import duckdb

    server = MCPServer("answerer-test-target")
    db = duckdb.connect(":memory:")
    db.execute("create table orders as select range as id, range * 10 as amount from range(5)")

    @server.tool(name="get_context", description="Ranked model entities for a search.")
    async def get_context(query: str) -> CallToolResult:
        payload = {
            "traceId": f"trace-{len(query)}",
            "servedRevision": "rev-7",
            "results": [
                {"kind": "measure", "name": "total_revenue", "source": "orders", "doc": "Sum."},
                {"kind": "dimension", "name": "order_year", "source": "orders", "doc": "Year."},
            ],
        }
        resource = TextResourceContents(
            uri="test://context", mime_type="application/json", text=json.dumps(payload)
        )
        return CallToolResult(content=[EmbeddedResource(type="resource", resource=resource)])

    @server.tool(name="execute_query", description="Run a SQL query over the orders table.")
    async def execute_query(query: str) -> CallToolResult:
        if not query.strip():
            # Publisher's schema check answers with a JSON-RPC error, not an error result.
            raise MCPError(INVALID_PARAMS, "'query' must be a non-empty string")
        if query == "crash":
            raise MCPError(INTERNAL_ERROR, "the warehouse connection dropped")
        try:
            cursor = db.cursor().execute(query)
            columns = [d[0] for d in cursor.description or []]
            rows = [dict(zip(columns, r, strict=True)) for r in cursor.fetchall()]
        except duckdb.Error as exc:
            return CallToolResult(is_error=True, content=[TextContent(type="text", text=str(exc))])
        return CallToolResult(content=[TextContent(type="text", text=json.dumps({"rows": rows}))])

    return server


ROLES: dict[str, ToolRole] = {"get_context": "context", "execute_query": "query"}


class McpSession:
    """A TargetSession over an ``mcp.Client`` connected to the in-process server."""

    name = "answerer-test-target"

    def __init__(self, client: Client) -> None:
        self.client = client
        self.list_calls = 0

    async def list_tools(self) -> list[ToolSpec]:
        self.list_calls += 1
        listed = (await self.client.list_tools()).tools
        return [
            ToolSpec(name=t.name, description=t.description or "", input_schema=t.input_schema)
            for t in listed
        ]

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        return outcome_from_mcp(await self.client.call_tool(tool, arguments))

    def role_of(self, tool: str) -> ToolRole | None:
        return ROLES.get(tool)

    def query_of(self, tool: str, arguments: dict[str, Any]) -> str | None:
        query = arguments.get("query")
        return query if isinstance(query, str) else None

    def context_results(self, outcome: ToolOutcome) -> list[ContextResult]:
        results = outcome.payload.get("results", []) if isinstance(outcome.payload, dict) else []
        return [ContextResult(rank=i, **r) for i, r in enumerate(results, 1)]

    async def execute(self, query: str) -> QueryOutcome:
        outcome = await self.call("execute_query", {"query": query})
        return QueryOutcome(rows=(outcome.payload or {}).get("rows", []), error=outcome.error)


# --------------------------------------------------------------------------- the endpoint


@dataclass
class Canned:
    """One scripted HTTP answer of the stub."""

    body: dict[str, Any]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


_ids = itertools.count(1)


def message(
    *blocks: dict[str, Any], stop: str | None = None, usage: dict[str, int] | None = None
) -> Canned:
    """A Messages API reply; the stop reason follows the blocks unless given."""
    has_tool = any(b["type"] == "tool_use" for b in blocks)
    return Canned(
        {
            "id": f"msg_{next(_ids)}",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": list(blocks),
            "stop_reason": stop or ("tool_use" if has_tool else "end_turn"),
            "stop_sequence": None,
            "usage": usage
            or {
                "input_tokens": 100,
                "output_tokens": 20,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
    )


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{next(_ids)}", "name": name, "input": arguments}


def error(status: int, kind: str, text_: str, **headers: str) -> Canned:
    body = {"type": "error", "error": {"type": kind, "message": text_}, "request_id": "req_1"}
    return Canned(body, status=status, headers=headers)


class StubAnthropic:
    """A loopback Messages API that plays ``script`` in order (the last entry repeats) and
    records every request body and header set."""

    def __init__(self, script: list[Canned] | Callable[[int], Canned]) -> None:
        self.script = script
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.stopping = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def _next(self, index: int) -> Canned:
        if callable(self.script):
            return self.script(index)
        return self.script[min(index, len(self.script) - 1)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                stub.bodies.append(json.loads(raw))
                stub.headers.append({k.lower(): v for k, v in self.headers.items()})
                canned = stub._next(len(stub.bodies) - 1)
                if stub.stopping.wait(canned.delay):
                    return
                data = json.dumps(canned.body).encode()
                try:
                    self.send_response(canned.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for name, value in canned.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

        return Handler

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> StubAnthropic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


def run(
    stub: StubAnthropic,
    question: str = QUESTION,
    *,
    max_retries: int = 0,
    **options: Any,
) -> tuple[AnswerRecord, McpSession]:
    """Answer ``question`` against the stub and the in-process target."""

    return answer_with(stub.url, question, max_retries=max_retries, **options)


def answer_with(
    url: str, question: str = QUESTION, *, max_retries: int = 0, **options: Any
) -> tuple[AnswerRecord, McpSession]:
    """Answer through a real AsyncAnthropic client at ``url``."""

    async def main() -> tuple[AnswerRecord, McpSession] | HarnessError:
        api = anthropic.AsyncAnthropic(base_url=url, api_key=SECRET, max_retries=max_retries)
        async with Client(make_target()) as client:
            session = McpSession(client)
            assert isinstance(session, TargetSession)
            answerer = AnthropicAnswerer(
                model=options.pop("model", MODEL), client_factory=lambda: api, **options
            )
            try:
                return await answerer.answer(question, session), session
            except HarnessError as exc:
                # Raised out of the client's task group it would arrive wrapped in a group.
                return exc
            finally:
                await api.close()

    outcome = asyncio.run(main())
    if isinstance(outcome, HarnessError):
        raise outcome
    return outcome


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool_result blocks of the last user message of a request."""
    return [b for b in body["messages"][-1]["content"] if b["type"] == "tool_result"]


FINAL = "The total revenue is 100.\n\nFinal query:\n```sql\nselect sum(amount) from orders\n```"


# --------------------------------------------------------------------------- the loop


def test_two_tool_calls_then_text_records_everything() -> None:
    script = [
        message(call("get_context", query="total revenue 2024")),
        message(text("Let me run it."), call("execute_query", query="select 42 as n")),
        message(text(FINAL)),
    ]
    with StubAnthropic(script) as stub:
        record, session = run(stub)

    assert record.stop == "end_turn"
    assert record.num_turns == 3 and len(stub.bodies) == 3
    assert record.answer_text == FINAL
    assert record.declared_final == "select sum(amount) from orders"
    assert choose_final_query(record.declared_final, record.tool_log) == (
        "select sum(amount) from orders",
        "declared",
    )
    context, query = record.tool_log
    assert (context.tool, context.role, context.ok, context.is_mcp) == (
        "get_context",
        "context",
        True,
        True,
    )
    assert context.targets == "total revenue 2024"
    assert context.trace_id == f"trace-{len('total revenue 2024')}"
    assert [(r["kind"], r["name"], r["rank"]) for r in context.context_results] == [
        ("measure", "total_revenue", 1),
        ("dimension", "order_year", 2),
    ]
    assert (query.tool, query.role, query.query, query.ok) == (
        "execute_query",
        "query",
        "select 42 as n",
        True,
    )
    # The query really ran through MCP and its rows went back to the model.
    (result,) = tool_results(stub.bodies[2])
    assert json.loads(result["content"][0]["text"]) == {"rows": [{"n": 42}]}
    assert "is_error" not in result
    # Tools are listed once per answer; the question goes verbatim as the first user turn.
    assert session.list_calls == 1
    assert record.served_revision == "rev-7"
    # The question goes verbatim, as one text block carrying the moving cache breakpoint.
    assert stub.bodies[0]["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": QUESTION, "cache_control": {"type": "ephemeral"}}],
        }
    ]
    # Turn 3 marks the end of turn 2's request (read exactly) and its own end (written).
    third = stub.bodies[2]["messages"]
    marked = [
        (i, j)
        for i, m in enumerate(third)
        for j, b in enumerate(m["content"] if isinstance(m["content"], list) else [])
        if "cache_control" in b
    ]
    assert marked == [(2, len(third[2]["content"]) - 1), (4, len(third[4]["content"]) - 1)]
    assert sum("cache_control" in t for t in stub.bodies[2]["tools"]) + len(marked) + 1 == 4


def test_request_offers_exactly_the_session_tools_with_caching() -> None:
    with StubAnthropic([message(text("42"))]) as stub:
        run(stub)
    (body,) = stub.bodies
    assert [t["name"] for t in body["tools"]] == ["get_context", "execute_query"]
    assert [("cache_control" in t) for t in body["tools"]] == [False, True]
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert all("$schema" not in t["input_schema"] for t in body["tools"])
    assert body["tools"][1]["input_schema"]["required"] == ["query"]
    (system,) = body["system"]
    assert system["cache_control"] == {"type": "ephemeral"}
    assert system["text"] == SYSTEM_PROMPT
    assert body["model"] == MODEL and body["max_tokens"] == 4096
    assert "temperature" not in body


def test_system_prompt_never_hints_at_being_checked() -> None:
    forbidden = re.compile(r"evaluat|\btests?\b|testing|golden|grader|grading|judg|scor", re.I)
    assert forbidden.findall(SYSTEM_PROMPT) == []
    assert "JUDGE_VERSION" not in SYSTEM_PROMPT
    assert "Final query:" in SYSTEM_PROMPT and "```sql" in SYSTEM_PROMPT


def test_system_prompt_asks_for_the_calls_report_in_the_shape_it_parses() -> None:
    # Seed 001 rule 3 needs the answerer's own count of its tool calls.
    assert "\nTool calls: <number>\n" in SYSTEM_PROMPT
    assert SYSTEM_PROMPT.index("Tool calls:") > SYSTEM_PROMPT.index("Final query:")
    assert extract_reported_calls(f"It is 100.\n\n{report_line(3)}") == (3, "reported")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (f"{FINAL}\n\nTool calls: 2", (2, "reported")),
        (f"{FINAL}\n\n**Tool calls:** 12", (12, "reported")),
        ("Done.\n\n- tool calls: 0", (0, "reported")),
        ("Tool calls: 3 (get_context 1, execute_query 2)", (3, "reported")),
        ("Tool calls: get_context=1, execute_query=2", (3, "reported")),
        ("MCP tool calls: 4", (4, "reported")),
        ("Tool calls: 1\n\nOn second thought...\n\nTool calls: 5", (5, "reported")),
        (FINAL, (None, "missing")),
        ("I made two tool calls: one to look, one to count.", (None, "missing")),
        (None, (None, "missing")),
        ("Tool calls: a few", (None, "unreadable")),
    ],
)
def test_extract_reported_calls(answer: str | None, expected: tuple[int | None, str]) -> None:
    assert extract_reported_calls(answer) == expected


def test_the_calls_report_reaches_the_record_through_the_sdk() -> None:
    """Scripted on the shared fake: an honest, an inflated and an omitted report."""
    from pytest_evalloop.testing import FakeAnthropic, ScriptSpec

    calls = [
        {"tool": "get_context", "input": {"query": "{question}"}},
        {"tool": "execute_query", "input": {"query": "select 1 as one"}},
    ]
    spec = ScriptSpec.model_validate(
        {
            "answerer": {
                "by_question": {
                    "honest?": [*calls, [{"text": FINAL}, {"report_calls": "honest"}]],
                    "inflated?": [*calls, [{"text": FINAL}, {"report_calls": 9}]],
                    "omitted?": [*calls, {"text": FINAL}],
                }
            }
        }
    )
    with FakeAnthropic(spec) as fake:
        records = {
            q: answer_with(fake.base_url, q)[0] for q in ("honest?", "inflated?", "omitted?")
        }
    assert {q: (r.reported_calls, r.reported_calls_status) for q, r in records.items()} == {
        "honest?": (2, "reported"),
        "inflated?": (9, "reported"),
        "omitted?": (None, "missing"),
    }
    assert all(len(r.tool_log) == 2 for r in records.values())
    # The report follows the final query; the declared query is still read.
    assert records["honest?"].answer_text == f"{FINAL}\n\nTool calls: 2"
    assert records["honest?"].declared_final == "select sum(amount) from orders"


def test_tool_error_goes_back_to_the_model_with_is_error() -> None:
    script = [
        message(call("execute_query", query="select bogus from orders")),
        message(call("execute_query", query="select count(*) as n from orders")),
        message(call("execute_query", query="select nope")),
        message(text("There are 5 orders.")),
    ]
    with StubAnthropic(script) as stub:
        record, _ = run(stub)
    (failed,) = tool_results(stub.bodies[1])
    assert failed["is_error"] is True
    assert "bogus" in failed["content"][0]["text"]
    first, second, third = record.tool_log
    assert not first.ok and first.error is not None and "bogus" in first.error
    assert second.ok and not third.ok
    assert choose_final_query(record.declared_final, record.tool_log) == (
        "select count(*) as n from orders",
        "last_successful",
    )


def test_unknown_tool_is_refused_and_logged() -> None:
    script = [message(call("read_file", path="evals/gold.json")), message(text("done"))]
    with StubAnthropic(script) as stub:
        record, _ = run(stub)
    (refused,) = tool_results(stub.bodies[1])
    assert refused["is_error"] is True and "read_file" in refused["content"][0]["text"]
    (row,) = record.tool_log
    assert (row.tool, row.ok, row.input) == ("read_file", False, {"path": "evals/gold.json"})


def test_rejected_arguments_go_back_to_the_model() -> None:
    script = [message(call("execute_query", query=" ")), message(text("I could not run it."))]
    with StubAnthropic(script) as stub:
        record, _ = run(stub)
    (rejected,) = tool_results(stub.bodies[1])
    assert rejected["is_error"] is True
    assert "-32602" in rejected["content"][0]["text"]
    assert "non-empty" in rejected["content"][0]["text"]
    (row,) = record.tool_log
    assert (row.ok, row.role) == (False, "query")
    assert record.stop == "end_turn"


def test_a_failing_target_is_a_harness_error() -> None:
    with StubAnthropic([message(call("execute_query", query="crash"))]) as stub:
        with pytest.raises(HarnessError, match="answerer-test-target.*execute_query") as caught:
            run(stub)
    assert "connection dropped" in str(caught.value)
    assert len(stub.bodies) == 1


def test_tool_use_stop_without_calls_ends_the_loop() -> None:
    with StubAnthropic([message(text("hmm"), stop="tool_use")]) as stub:
        record, _ = run(stub)
    assert (record.stop, record.answer_text, len(stub.bodies)) == (
        "tool_use_without_calls",
        "hmm",
        1,
    )


def test_turn_limit_stops_cleanly() -> None:
    with StubAnthropic([message(text("looking"), call("get_context", query="x"))]) as stub:
        record, _ = run(stub, max_turns=3)
    assert record.stop == "max_turns"
    assert record.num_turns == 3 and len(stub.bodies) == 3
    # The third turn's tools are not run: nobody would read their results.
    assert len(record.tool_log) == 2
    assert record.answer_text == "looking"
    assert record.declared_final is None


def test_wall_clock_limit_stops_a_slow_endpoint() -> None:
    def script(index: int) -> Canned:
        if index == 0:
            return message(call("get_context", query="revenue"))
        slow = message(text("too late"))
        slow.delay = 10.0
        return slow

    with StubAnthropic(script) as stub:
        record, _ = run(stub, timeout_s=0.6)
    assert record.stop == "timeout"
    assert 0.5 < record.wall_seconds < 5
    assert record.answer_text is None
    assert [u.tool for u in record.tool_log] == ["get_context"]
    assert record.num_turns == 1


def test_token_budget_counts_cache_tokens() -> None:
    usage = {
        "input_tokens": 500,
        "output_tokens": 100,
        "cache_creation_input_tokens": 200,
        "cache_read_input_tokens": 500,
    }
    with StubAnthropic([message(call("get_context", query="x"), usage=usage)]) as stub:
        record, _ = run(stub, max_tokens_budget=2_500)
    # 1 300 tokens per call: under the budget after one call, over it after two.
    assert record.stop == "token_budget"
    assert record.num_turns == 2 and len(stub.bodies) == 2
    assert record.usage.input_tokens == 1_000
    assert record.usage.cache_read_tokens == 1_000
    assert record.usage.cache_creation_tokens == 400
    assert record.usage.output_tokens == 200
    assert record.usage.calls == 2


def test_usage_and_cost_are_summed_over_calls() -> None:
    usages = [
        {
            "input_tokens": 1_000,
            "output_tokens": 50,
            "cache_creation_input_tokens": 4_000,
            "cache_read_input_tokens": 0,
        },
        {
            "input_tokens": 300,
            "output_tokens": 150,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 4_000,
        },
    ]
    script = [
        message(call("get_context", query="x"), usage=usages[0]),
        message(text("done"), usage=usages[1]),
    ]
    with StubAnthropic(script) as stub:
        record, _ = run(stub)
    assert record.usage.model_dump() == {
        "input_tokens": 1_300,
        "output_tokens": 200,
        "cache_read_tokens": 4_000,
        "cache_creation_tokens": 4_000,
        "calls": 2,
    }
    # Sonnet 4.6 list price: 3 in, 15 out, 0.30 cache read, 3.75 cache write per million.
    expected = (1_300 * 3 + 200 * 15 + 4_000 * 0.3 + 4_000 * 3.75) / 1_000_000
    assert record.cost_usd == pytest.approx(expected)
    assert record.model == MODEL


def test_unknown_model_cost_is_none_not_zero() -> None:
    with StubAnthropic([message(text("done"))]) as stub:
        record, _ = run(stub, model="claude-unheard-of-9", prices=PriceTable())
    assert record.cost_usd is None
    assert record.usage.calls == 1


def test_max_tokens_and_refusal_stops_are_recorded() -> None:
    with StubAnthropic([message(text("The answer is"), stop="max_tokens")]) as stub:
        record, _ = run(stub)
    assert (record.stop, record.answer_text) == ("max_tokens", "The answer is")
    with StubAnthropic([message(stop="refusal")]) as stub:
        record, _ = run(stub)
    assert (record.stop, record.answer_text) == ("refusal", None)


def test_transcript_is_json_with_results_cut_and_no_secret() -> None:
    big = "select repeat('x', 20000) as blob"
    script = [message(call("execute_query", query=big)), message(text("done"))]
    with StubAnthropic(script) as stub:
        record, _ = run(stub)
    dumped = json.dumps(record.transcript)
    assert [m["role"] for m in record.transcript] == ["user", "assistant", "user", "assistant"]
    (result,) = record.transcript[2]["content"]
    kept = result["content"][0]["text"]
    assert len(kept) < TRANSCRIPT_RESULT_CHARS + 200
    assert "truncated" in kept
    # The model itself got the whole result.
    assert len(tool_results(stub.bodies[1])[0]["content"][0]["text"]) > 20_000
    assert SECRET not in dumped and SECRET not in record.model_dump_json()
    # The key did go where it belongs: the request's auth header.
    assert stub.headers[0]["authorization"] == f"Bearer {SECRET}"


# --------------------------------------------------------------------------- failures


def test_rate_limit_after_retries_is_a_harness_error_without_the_key() -> None:
    busy = error(429, "rate_limit_error", "Number of requests exceeded", **{"retry-after-ms": "5"})
    with StubAnthropic([busy]) as stub:
        with pytest.raises(HarnessError) as caught:
            run(stub, max_retries=2)
    message_ = str(caught.value)
    assert "429" in message_ and stub.url in message_
    assert SECRET not in message_ and "sk-ant" not in message_
    assert len(stub.bodies) == 3  # one try and the client's two retries
    assert [h.get("x-stainless-retry-count") for h in stub.headers] == ["0", "1", "2"]


def test_overloaded_then_ok_is_retried_by_the_client() -> None:
    script = [error(529, "overloaded_error", "Overloaded", **{"retry-after-ms": "5"})]
    script.append(message(text("42")))
    with StubAnthropic(script) as stub:
        record, _ = run(stub, max_retries=2)
    assert record.answer_text == "42" and len(stub.bodies) == 2


def test_authentication_failure_is_a_configuration_error() -> None:
    denied = error(401, "authentication_error", "invalid x-api-key")
    with StubAnthropic([denied]) as stub:
        with pytest.raises(HarnessError, match="invalid x-api-key") as caught:
            run(stub, max_retries=2)
    assert "401" in str(caught.value) and "ANTHROPIC_API_KEY" in str(caught.value)
    assert SECRET not in str(caught.value)
    assert len(stub.bodies) == 1  # a 401 is not retried


def test_echoed_key_is_redacted() -> None:
    echo = error(400, "invalid_request_error", f"bad request from key {SECRET}")
    with StubAnthropic([echo]) as stub:
        with pytest.raises(HarnessError) as caught:
            run(stub)
    assert SECRET not in str(caught.value) and "[redacted]" in str(caught.value)


def test_unreachable_endpoint_is_a_harness_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    with pytest.raises(HarnessError, match=f"127.0.0.1:{port}.*unreachable") as caught:
        answer_with(f"http://127.0.0.1:{port}")
    assert SECRET not in str(caught.value)


# --------------------------------------------------------------------------- final query


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (FINAL, "select sum(amount) from orders"),
        (
            "**Final query:**\n```malloy\nrun: orders -> { aggregate: n }\n```",
            "run: orders -> { aggregate: n }",
        ),
        ("Final query:\n```sql\nselect 1\n```\nThen\nFinal query:\n```\nselect 2\n```", "select 2"),
        ("final query: ```sql\nselect 3\n```", "select 3"),
        ("Here it is:\n```sql\nselect 1\n```", None),
        ("Final query:\n```sql\n\n```", None),
        (None, None),
        # The shapes models write: blank lines, no tag, bold, headings, more words, CRLF, ~~~.
        ("Final query:\n\n```sql\nselect 4\n```", "select 4"),
        ("Final query:\n\n\n```\nselect 5\n```", "select 5"),
        ("**Final query:**\n\n```malloy\nrun: a -> b\n```", "run: a -> b"),
        ("**Final query**:\n  \n```\nselect 6\n```", "select 6"),
        ("### Final query\n\n```sql\nselect 7\n```", "select 7"),
        ("Final Malloy query run against `m.malloy`:\n\n```malloy\nq8\n```", "q8"),
        ("Final query:\r\n\r\n```sql\r\nselect 9\r\n```", "select 9"),
        ("Final query:\n~~~\nselect 10\n~~~", "select 10"),
        ("Final query:\n```sql\nselect 11```", "select 11"),
        # Prose between the label and a fence, or a fence cut off, declares nothing.
        ("Final query:\nI ran this one.\n```sql\nselect 1\n```", None),
        ("Final query:\n\n```sql\nselect cut", None),
    ],
)
def test_extract_declared_final(answer: str | None, expected: str | None) -> None:
    assert extract_declared_final(answer) == expected


def query_use(q: str, ok: bool = True) -> ToolUse:
    return ToolUse(tool="execute_query", role="query", query=q, ok=ok)


@pytest.mark.parametrize(
    ("declared", "log", "expected"),
    [
        ("select d", [query_use("select a")], ("select d", "declared")),
        (
            None,
            [query_use("select a"), query_use("select b", ok=False)],
            ("select a", "last_successful"),
        ),
        (
            "  ",
            [query_use("select a", ok=False), query_use("select b", ok=False)],
            ("select b", "last_call"),
        ),
        (None, [ToolUse(tool="get_context", role="context")], (None, "none")),
        (None, [], (None, "none")),
    ],
)
def test_choose_final_query(
    declared: str | None, log: list[ToolUse], expected: tuple[str | None, str]
) -> None:
    assert choose_final_query(declared, log) == expected


def malloy_use(query: str, ok: bool = True, **arguments: Any) -> ToolUse:
    return ToolUse(
        tool="malloy_executeQuery",
        role="query",
        query=query,
        ok=ok,
        input={"packageName": "shop2", "modelPath": "other.malloy", "query": query, **arguments},
    )


def test_a_declared_query_is_replayed_as_the_call_that_ran_it() -> None:
    log = [
        ToolUse(tool="malloy_getContext", role="context"),
        malloy_use("run: o -> { aggregate: n }", givens={"region": "EU"}),
        malloy_use("run: o -> { group_by: x }"),
    ]
    answer = "It is 42.\n\nFinal query:\n\n```malloy\nrun: o -> {\n  aggregate: n\n}\n```"
    chosen = final_call(extract_declared_final(answer), log)
    assert (chosen.source, chosen.seq, chosen.exact) == ("declared", 2, True)
    assert chosen.query == "run: o -> {\n  aggregate: n\n}"
    assert chosen.tool == "malloy_executeQuery"
    assert chosen.arguments == log[1].input


def test_a_declared_query_never_run_borrows_the_last_calls_model_and_givens() -> None:
    log = [malloy_use("run: o -> a", givens={"region": "EU"}), malloy_use("bad", ok=False)]
    chosen = final_call("run: o -> b", log)
    assert (chosen.source, chosen.seq, chosen.exact) == ("declared", None, False)
    assert chosen.arguments == log[0].input


@pytest.mark.parametrize(
    ("log", "source", "seq"),
    [
        ([malloy_use("a"), malloy_use("b", ok=False)], "last_successful", 1),
        ([malloy_use("a", ok=False), malloy_use("b", ok=False)], "last_call", 2),
        ([], "none", None),
    ],
)
def test_final_call_says_where_the_query_came_from(
    log: list[ToolUse], source: str, seq: int | None
) -> None:
    chosen = final_call(None, log)
    assert (chosen.source, chosen.seq) == (source, seq)
    assert chosen.exact is (seq is not None)


def test_max_turns_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_turns"):
        AnthropicAnswerer(model=MODEL, client_factory=anthropic.AsyncAnthropic, max_turns=0)


# --------------------------------------------------------------------------- the shared fake


def test_scripted_loop_on_the_shared_fake_reads_the_prompt_cache() -> None:
    from pytest_evalloop.testing import FakeAnthropic, ScriptSpec

    final = "It is 100.\n\nFinal query:\n```sql\nselect sum(amount) as revenue from orders\n```"
    spec = ScriptSpec.model_validate(
        {
            "answerer": {
                "default": [
                    {"tool": "get_context", "input": {"query": "{question}"}},
                    {"tool": "execute_query", "input": {"query": "select 1 as one"}},
                    {"text": final},
                ]
            },
            "faults": [{"role": "answerer", "status": 529, "retry_after_ms": 5, "after": 1}],
        }
    )
    with FakeAnthropic(spec) as fake:
        record, _ = answer_with(fake.base_url, max_retries=2)
        calls = fake.calls("answerer")
    assert record.stop == "end_turn" and record.num_turns == 3
    assert record.declared_final == "select sum(amount) as revenue from orders"
    assert [u.tool for u in record.tool_log] == ["get_context", "execute_query"]
    assert record.tool_log[0].targets == QUESTION
    # One 529 was retried by the client; nobody outside the SDK saw it.
    assert [c.status for c in calls] == [200, 529, 200, 200]
    assert all(c.tools == ["get_context", "execute_query"] for c in calls)
    # The first request's prefix (tools, system prompt, question) is under Sonnet 4.6's
    # 2,048-token floor: the API caches nothing and says so only by two zero counters.
    assert calls[0].input_tokens < 2048
    assert (calls[0].cache_creation_input_tokens, calls[0].cache_read_input_tokens) == (0, 0)
    assert record.usage.calls == 3
