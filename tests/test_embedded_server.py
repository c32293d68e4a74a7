"""The embedded MCP server: tool shapes, ranked context, trace ids, row cap, HTTP transport."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.targets.embedded.model import SemanticModel
from pytest_evalloop.targets.embedded.retrieval import EntityIndex, index_for, rank, tokenize
from pytest_evalloop.targets.embedded.server import build_server_from_parts
from tests.querygate import EVENT_CEILING_S
from tests.test_sandbox import write_tiny_set

ROW_CAP = 25
ECOMMERCE = Path(__file__).resolve().parent.parent / "evals" / "ecommerce"


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_set(tmp_path_factory.mktemp("server"))


@pytest.fixture(scope="module")
def model(tiny_set: Path) -> SemanticModel:
    return SemanticModel.load(tiny_set / "model.json")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def client(model: SemanticModel, tiny_set: Path) -> AsyncIterator[Any]:
    from mcp import Client

    server = build_server_from_parts(model, tiny_set / "data", row_cap=ROW_CAP)
    async with Client(server) as mcp_client:
        yield mcp_client


async def _context(client: Any, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool("get_context", arguments)
    assert not result.is_error, result.content
    payload: dict[str, Any] = json.loads(result.content[0].text)
    return payload


@pytest.mark.anyio
async def test_tools_are_listed_with_their_arguments(client: Any) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {"get_context", "execute_query"}
    context_props = tools["get_context"].input_schema["properties"]
    assert set(context_props) == {"query", "source", "limit"}
    assert context_props["limit"]["default"] == 10
    assert tools["execute_query"].input_schema["required"] == ["sql"]
    assert "Start here" in tools["get_context"].description
    assert f"capped at {ROW_CAP} rows" in tools["execute_query"].description


@pytest.mark.anyio
async def test_instructions_describe_the_data_and_nothing_else(client: Any) -> None:
    tools = (await client.list_tools()).tools
    text = " ".join([client.instructions or ""] + [t.description or "" for t in tools]).lower()
    assert "orders" in text and "get_context" in text
    for word in ("eval", "golden", "gold", "judge", "test", "benchmark"):
        assert word not in text, word


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("What was our total sales revenue?", "measure:orders:total_revenue"),
        ("number of customers", "measure:users:customer_count"),
        ("which country do customers live in", "dimension:users:country"),
        ("breakdown by order status", "dimension:orders:status"),
        ("revenue for each status", "view:orders:revenue_by_status"),
        ("when did customers register an account", "dimension:users:signed_up_at"),
    ],
)
async def test_get_context_ranks_the_expected_entity_first(
    client: Any, query: str, expected: str
) -> None:
    payload = await _context(client, query=query)
    ids = [r["id"] for r in payload["results"]]
    assert ids and ids[0] == expected, ids
    assert [r["rank"] for r in payload["results"]] == list(range(1, len(ids) + 1))
    summary = payload["rankedSummary"]
    assert summary == {"entityIds": ids, "ranks": summary["ranks"], "resultCount": len(ids)}
    first = payload["results"][0]
    assert set(first) == {"id", "kind", "name", "source", "doc", "rank"}
    assert first["id"] == f"{first['kind']}:{first['source']}:{first['name']}"


@pytest.mark.anyio
async def test_empty_query_lists_sources_and_source_drills_down(client: Any) -> None:
    listing = await _context(client, query="")
    assert [r["id"] for r in listing["results"]] == ["source:orders:orders", "source:users:users"]
    drill = await _context(client, query="", source="users", limit=50)
    assert {r["source"] for r in drill["results"]} == {"users"}
    assert len(drill["results"]) == 5  # the source, 3 dimensions, 1 measure
    scoped = await _context(client, query="identifier", source="users")
    assert [r["id"] for r in scoped["results"]] == ["dimension:users:user_id"]
    assert len((await _context(client, query="order", limit=2))["results"]) == 2


@pytest.mark.anyio
async def test_bad_context_arguments_are_error_results(client: Any) -> None:
    unknown = await client.call_tool("get_context", {"query": "x", "source": "nope"})
    assert unknown.is_error and "orders, users" in unknown.content[0].text
    too_many = await client.call_tool("get_context", {"query": "x", "limit": 500})
    assert too_many.is_error and "between 1 and 50" in too_many.content[0].text


@pytest.mark.anyio
async def test_trace_ids_are_unique(client: Any) -> None:
    ids = [(await _context(client, query="revenue"))["traceId"] for _ in range(20)]
    assert len(set(ids)) == 20
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


@pytest.mark.anyio
async def test_execute_query_payload_and_row_cap(client: Any) -> None:
    capped = await client.call_tool("execute_query", {"sql": "SELECT * FROM orders"})
    payload = json.loads(capped.content[0].text)
    assert payload["rowCapHit"] is True
    assert payload["rowCount"] == ROW_CAP == len(payload["rows"]) == payload["rowCap"]
    assert payload["columns"] == ["order_id", "user_id", "status", "created_at", "amount"]
    small = await client.call_tool(
        "execute_query",
        {"sql": "SELECT status, sum(amount) AS s FROM orders GROUP BY 1 ORDER BY 1"},
    )
    body = json.loads(small.content[0].text)
    assert body["rowCapHit"] is False and body["rowCount"] == 3
    assert all(isinstance(r["s"], float) for r in body["rows"])
    failed = await client.call_tool("execute_query", {"sql": "SELECT nosuch FROM orders"})
    assert failed.is_error and "nosuch" in failed.content[0].text


def test_tokenize_splits_identifiers_and_stems() -> None:
    assert tokenize("orderStatus, total_revenue of Categories!") == [
        "order",
        "status",
        "total",
        "revenu",
        "category",
    ]
    assert tokenize("the boxes and addresses") == ["box", "address"]
    assert tokenize("   ") == []


def test_index_is_cached_and_ties_are_deterministic(model: SemanticModel) -> None:
    entities = model.entities()
    assert index_for(entities) is index_for(list(entities))
    shuffled = list(reversed(entities))
    assert [r.id for r in rank("customer", entities)] == [r.id for r in rank("customer", shuffled)]
    assert rank("zebra quantum", entities) == []
    assert EntityIndex([]).rank("anything") == []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for_port(
    port: int, proc: subprocess.Popen[bytes], deadline_s: float = EVENT_CEILING_S
) -> None:
    # A wait for an event (the port answers); the ceiling only says when to call it failed.
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"server exited early: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"server did not listen on 127.0.0.1:{port} within {deadline_s}s")


@pytest.fixture
def http_server(tiny_set: Path) -> Any:
    port = _free_port()
    cmd = [sys.executable, "-m", "pytest_evalloop.targets.embedded.server", str(tiny_set)]
    cmd += ["--transport", "http", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.anyio
async def test_http_transport_serves_both_tools(http_server: str) -> None:
    from mcp import Client

    async with Client(http_server) as remote:
        assert {t.name for t in (await remote.list_tools()).tools} == {
            "get_context",
            "execute_query",
        }
        result = await remote.call_tool("execute_query", {"sql": "SELECT count(*) AS n FROM users"})
        assert json.loads(result.content[0].text)["rows"] == [{"n": 200}]
        refused = await remote.call_tool("execute_query", {"sql": "FROM 'evals/tiny/set.json'"})
        assert refused.is_error
        context = json.loads(
            (await remote.call_tool("get_context", {"query": "total revenue"})).content[0].text
        )
        assert context["results"][0]["id"] == "measure:orders:total_revenue"


def test_cli_reports_a_missing_set(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_evalloop.targets.embedded.server", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "set.json" in proc.stderr and "does not exist" in proc.stderr


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("average days to ship an order", ["measure:orders:avg_days_to_ship"]),
        ("gross margin as a percent of sales", ["measure:order_items:gross_margin_pct"]),
        ("when was the customer account created", ["dimension:users:created_at"]),
        (
            "total revenue by product category",
            ["measure:order_items:total_sales", "dimension:products:category"],
        ),
    ],
)
def test_ranking_on_the_example_model(query: str, expected: list[str]) -> None:
    """The shipped ecommerce model: plain questions find their entities in the top 3."""
    model = SemanticModel.load(ECOMMERCE / "model.json")
    top = [hit.id for hit in rank(query, model.entities(), limit=3)]
    assert set(expected) <= set(top), top


def test_building_the_server_leaves_the_root_logger_as_it_was(
    model: SemanticModel, tiny_set: Path
) -> None:
    """The SDK's server constructor puts a rich handler on a root logger that has none (at
    INFO, by default): with pytest's logging plugin off, or in an `evalloop` command, every
    HTTP request of a run was then printed. The root logger is the user's: as it was."""
    import logging

    root = logging.getLogger()
    kept_handlers, kept_level = list(root.handlers), root.level
    root.handlers[:] = []
    root.setLevel(logging.ERROR)
    try:
        build_server_from_parts(model, tiny_set / "data", row_cap=ROW_CAP)
        assert root.handlers == []
        assert root.level == logging.ERROR
        mine = logging.NullHandler()
        root.handlers[:] = [mine]
        build_server_from_parts(model, tiny_set / "data", row_cap=ROW_CAP)
        assert root.handlers == [mine]
        assert root.level == logging.ERROR
    finally:
        root.handlers[:] = kept_handlers
        root.setLevel(kept_level)


def test_ctrl_c_stops_evalloop_serve_quietly(tiny_set: Path) -> None:
    """Ctrl-C is how a served target is stopped: status 130 and no traceback (the HTTP server
    re-raised the interrupt once it had shut down, and the command printed it)."""
    import signal

    from tests.test_concurrency import sigint_not_ignored

    port = _free_port()
    cmd = [sys.executable, "-m", "pytest_evalloop.cli", "serve", str(tiny_set)]
    cmd += ["--transport", "http", "--port", str(port)]
    with sigint_not_ignored():  # a CI step's background job ignores SIGINT, and so would this
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_port(port, proc)  # serving: the interrupt lands on a running server
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=EVENT_CEILING_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err.decode()
    assert b"Traceback" not in err
