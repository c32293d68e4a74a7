"""Targets through tool profiles: the fake Publisher over HTTP and stdio, the embedded server."""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.failures import HarnessError
from pytest_evalloop.roles.contract import Target, TargetSession
from pytest_evalloop.sets.cases import SetConfig, load_set_config
from pytest_evalloop.targets.profiles import EMBEDDED, ProfileError, ToolProfile, load_profile
from pytest_evalloop.targets.target import MCPTarget, build_target
from pytest_evalloop.testing.fake_publisher import URL_LINE_PREFIX
from tests.test_sandbox import write_tiny_set

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "malloy-samples"
MALLOY = REFERENCE / "ecommerce" / "ecommerce.malloy"
MODEL = {"environmentName": "local", "packageName": "ecommerce", "modelPath": "ecommerce.malloy"}
BIG = 2**53 + 7
SCRIPT = {
    "queries": {
        "run: order_items -> { aggregate: total_sales }": [{"total_sales": 123.5}],
        "run: order_items -> { group_by: id }": [{"id": i} for i in range(9)],
        "run: order_items -> wide": [{"text": "w" * 300} for _ in range(4)],
        "run: order_items -> { group_by: big }": [{"big": BIG}],
        "run: order_items -> top_brands": [{"brand": "Levi's"}],
        "run: order_items -> { group_by: nope }": {
            "error": "'nope' is not defined",
            "suggestions": ["Check field names with malloy_getContext"],
        },
    }
}
PUBLISHER_SET = SetConfig.model_validate(
    {"name": "ecommerce", "targetPackage": "ecommerce", "targetModelPath": "ecommerce.malloy"}
)
FAKE_ARGS = ["--model", str(MALLOY), "--row-limit", "5", "--max-response-chars", "700"]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def script_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fake") / "script.json"
    path.write_text(json.dumps(SCRIPT), encoding="utf-8")
    return path


def _start_fake(script_file: Path) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "pytest_evalloop.testing.fake_publisher"]
    command += [*FAKE_ARGS, "--script", str(script_file), "--port", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    stdout = proc.stdout
    assert stdout is not None
    lines: list[str] = []
    # A thread, so a fake that never prints cannot hang the suite.
    reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(20)
    if not lines or not lines[0].startswith(URL_LINE_PREFIX):
        proc.kill()
        pytest.fail(f"fake publisher did not print its URL line (got {lines!r})")
    return proc, lines[0].strip().removeprefix(URL_LINE_PREFIX)


@pytest.fixture(scope="module")
def fake_url(script_file: Path) -> Iterator[str]:
    proc, url = _start_fake(script_file)
    yield url
    proc.terminate()
    proc.wait(10)


def _publisher(url: Any, **changes: Any) -> MCPTarget:
    profile = load_profile("publisher", PUBLISHER_SET, REFERENCE / "evals" / "ecommerce")
    return MCPTarget(url, profile.model_copy(update=changes), name=str(url), read_timeout_s=20)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the publisher profile over streamable HTTP ----------------------------------------------


@pytest.mark.anyio
async def test_publisher_target_lists_tools_once_and_shares_its_session(fake_url: str) -> None:
    target = _publisher(fake_url)
    assert isinstance(target, Target)
    first, second = await asyncio.gather(target.open(), target.open())
    try:
        assert first is second
        assert isinstance(first, TargetSession)
        tools = {tool.name: tool for tool in await first.list_tools()}
        assert {"malloy_getContext", "malloy_executeQuery"} <= set(tools)
        assert "modelPath" in tools["malloy_executeQuery"].input_schema["required"]
        assert first.role_of("malloy_getContext") == "context"
        assert first.role_of("malloy_executeQuery") == "query"
        assert first.role_of("malloy_getStatus") is None
    finally:
        await target.close()


@pytest.mark.anyio
async def test_context_call_derives_ids_and_ranks(fake_url: str) -> None:
    target = _publisher(fake_url)
    session = await target.open()
    try:
        arguments = {"environmentName": "local", "packageName": "ecommerce", "query": "revenue"}
        outcome = await session.call("malloy_getContext", arguments)
        assert not outcome.is_error and isinstance(outcome.payload, dict)
        results = session.context_results(outcome)
        assert results, outcome.text
        assert [r.rank for r in results] == list(range(1, len(results) + 1))
        assert all(r.id == f"{r.kind}:{r.source}:{r.name}" for r in results)
        assert "measure:order_items:total_sales" in {r.id for r in results}
        listing = await session.call("malloy_getContext", {"environmentName": "local"})
        assert listing.payload["results"] and session.context_results(listing) == []
        sources = await session.call("malloy_getContext", {**arguments, "query": ""})
        assert "source:users:users" in {r.id for r in session.context_results(sources)}
    finally:
        await target.close()


@pytest.mark.anyio
async def test_execute_reports_rows_and_truncation(fake_url: str) -> None:
    target = _publisher(fake_url)
    session = await target.open()
    try:
        total = await session.execute("run: order_items -> {aggregate: total_sales}")
        assert total.error is None
        assert (total.columns, total.rows, total.truncated) == (
            ["total_sales"],
            [{"total_sales": 123.5}],
            False,
        )
        capped = await session.execute("run: order_items -> { group_by: id }")
        assert len(capped.rows) == 5 and capped.truncated
        assert capped.meta["_limit_hit"] is True
        wide = await session.execute("run: order_items -> wide")
        assert wide.truncated and wide.meta["_rows_truncated"] is True
        assert len(wide.rows) == wide.meta["_returned_rows"] < 4
        big = await session.execute("run: order_items -> { group_by: big }")
        assert big.rows == [{"big": str(BIG)}]  # kept as the server sent it
        concurrent = await asyncio.gather(
            *(session.execute("run: order_items -> { aggregate: total_sales }") for _ in range(8))
        )
        assert [c.rows for c in concurrent] == [[{"total_sales": 123.5}]] * 8
    finally:
        await target.close()


@pytest.mark.anyio
async def test_each_publisher_error_shape_is_an_outcome(fake_url: str) -> None:
    target = _publisher(fake_url)
    session = await target.open()
    try:
        # 1. schema violation: JSON-RPC -32602, shown to the answerer rather than raised
        missing = await session.call("malloy_executeQuery", {"environmentName": "local"})
        assert missing.is_error and missing.text.startswith("MCP error -32602")
        assert "modelPath" in missing.text and missing.payload is None
        # 2. neither query nor queryName: an isError text block
        neither = await session.call("malloy_executeQuery", MODEL)
        assert neither.is_error and "Either 'query'" in (neither.error or "")
        # 3. an execution failure: isError resource {error, suggestions} and prose
        arguments = {**MODEL, "query": "run: order_items -> { group_by: nope }"}
        failed = await session.call("malloy_executeQuery", arguments)
        assert failed.is_error and failed.error == "'nope' is not defined"
        assert failed.payload["suggestions"] == ["Check field names with malloy_getContext"]
        assert "Suggestions:" in failed.text
        # the same failure, re-executed by the conductor
        replay = await session.execute("run: order_items -> { group_by: nope }")
        assert replay.error == "'nope' is not defined" and replay.rows == []
        # the session is still usable after all three
        assert (await session.execute("run: order_items -> top_brands")).rows
    finally:
        await target.close()


@pytest.mark.anyio
async def test_query_of_reads_the_query_argument_and_named_views(fake_url: str) -> None:
    target = _publisher(fake_url)
    session = await target.open()
    try:
        assert session.query_of("malloy_executeQuery", {**MODEL, "query": "run: a"}) == "run: a"
        named = {**MODEL, "queryName": "top_brands", "sourceName": "order_items"}
        assert session.query_of("malloy_executeQuery", named) == "run: order_items -> top_brands"
        assert session.query_of("malloy_getContext", {"query": "run: a"}) is None
        # what query_of returns replays through execute to the same rows
        replayed = await session.execute(session.query_of("malloy_executeQuery", named) or "")
        direct = await session.call("malloy_executeQuery", named)
        assert replayed.rows == direct.payload["rows"] == [{"brand": "Levi's"}]
    finally:
        await target.close()


@pytest.mark.anyio
async def test_hidden_args_are_removed_from_schemas_and_filled_in(fake_url: str) -> None:
    target = _publisher(fake_url, hidden_args=["environmentName", "packageName", "modelPath"])
    session = await target.open()
    try:
        tools = {tool.name: tool for tool in await session.list_tools()}
        schema = tools["malloy_executeQuery"].input_schema
        assert "modelPath" not in schema["properties"] and schema["required"] == []
        outcome = await session.call(
            "malloy_executeQuery", {"query": "run: order_items -> top_brands"}
        )
        assert not outcome.is_error and outcome.payload["rows"] == [{"brand": "Levi's"}]
    finally:
        await target.close()


# --- re-execution repeats the answerer's call ------------------------------------------------

COUNT = "run: order_items -> { aggregate: n is count() }"
SHOP2 = {"environmentName": "local", "packageName": "shop2", "modelPath": "other.malloy"}


def _two_model_fake() -> Any:
    from pytest_evalloop.testing.fake_publisher import FakePublisher, Script

    script = Script.from_data(
        {
            "queries": {COUNT: [{"n": 1}]},
            "models": {
                "shop2/other.malloy": {
                    "queries": {
                        COUNT: {"byGivens": [{"givens": {"region": "EU"}, "rows": [{"n": 42}]}]},
                        "run: order_items -> by_region": [{"region": "EU"}],
                    }
                }
            },
        }
    )
    return FakePublisher(entities=[], script=script)


@pytest.mark.anyio
async def test_re_execution_repeats_the_answerers_call_on_its_model_and_givens() -> None:
    from pytest_evalloop.roles.contract import FinalCall
    from pytest_evalloop.testing.fake_publisher import build_fake_publisher

    fake = _two_model_fake()
    profile = load_profile("publisher", PUBLISHER_SET, REFERENCE / "evals" / "ecommerce")
    target = MCPTarget(build_fake_publisher(fake), profile, name="fake")
    session = await target.open()
    try:
        asked = {**SHOP2, "query": COUNT, "givens": {"region": "EU"}}
        exact = FinalCall(query=COUNT, source="last_successful", tool=QUERY, arguments=asked)
        exact = exact.model_copy(update={"exact": True, "seq": 2})
        outcome = await session.execute(COUNT, call=exact)
        assert outcome.rows == [{"n": 42}]
        assert fake.calls[-1] == (QUERY, asked)
        assert outcome.call == {"tool": QUERY, "arguments": asked, "query_arg": "query"}
        # Without the call, the set's default model answers: other rows, the old behaviour.
        assert (await session.execute(COUNT)).rows == [{"n": 1}]
        # A declared query never run as such keeps the borrowed model and givens, and drops
        # the named view it replaces (Publisher refuses both).
        named = {**SHOP2, "queryName": "by_region", "sourceName": "order_items"}
        borrowed = FinalCall(
            query=COUNT,
            source="declared",
            tool=QUERY,
            arguments={**named, "givens": {"region": "EU"}},
        )
        assert (await session.execute(COUNT, call=borrowed)).rows == [{"n": 42}]
        assert "queryName" not in fake.calls[-1][1]
    finally:
        await target.close()


QUERY = "malloy_executeQuery"


# --- transport failures are harness errors ---------------------------------------------------


@pytest.mark.anyio
async def test_a_down_target_is_a_harness_error_naming_the_url() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/mcp"
    target = _publisher(url)
    with pytest.raises(HarnessError, match=rf"{url}.*could not connect"):
        await target.open()
    await target.close()


@pytest.mark.anyio
async def test_a_target_that_dies_mid_session_is_a_harness_error(script_file: Path) -> None:
    proc, url = _start_fake(script_file)
    target = _publisher(url)
    try:
        session = await target.open()
        assert (await session.execute("run: order_items -> top_brands")).rows
        proc.kill()
        proc.wait(10)
        with pytest.raises(HarnessError, match=url):
            await asyncio.wait_for(session.execute("run: order_items -> top_brands"), 15)
        with pytest.raises(HarnessError, match=url):
            await asyncio.wait_for(session.call("malloy_getContext", {}), 15)
    finally:
        proc.kill()
        await target.close()


# --- stdio and embedded ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_stdio_target_runs_the_fake_publisher_as_a_command(
    script_file: Path, tmp_path: Path
) -> None:
    set_dir = tmp_path / "pub"
    set_dir.mkdir()
    config = {"name": "pub", "publisher": MODEL}
    (set_dir / "set.json").write_text(json.dumps(config), encoding="utf-8")
    argv = [sys.executable, "-m", "pytest_evalloop.testing.fake_publisher", "--transport"]
    argv += ["stdio", *FAKE_ARGS, "--script", str(script_file)]
    command = shlex.join(argv)
    target = build_target(
        set_dir, load_set_config(set_dir), target=command, tool_profile="publisher"
    )
    assert target.name == command
    session = await target.open()
    try:
        assert "malloy_executeQuery" in {t.name for t in await session.list_tools()}
        rows = (await session.execute("run: order_items -> { aggregate: total_sales }")).rows
        assert rows == [{"total_sales": 123.5}]
    finally:
        await target.close()


@pytest.mark.anyio
async def test_a_command_that_is_not_a_server_is_a_harness_error(tmp_path: Path) -> None:
    command = f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(3)'"
    target = MCPTarget(
        _stdio(command), load_profile("publisher", PUBLISHER_SET, tmp_path), name=command
    )
    with pytest.raises(HarnessError, match="sys.exit"):
        await asyncio.wait_for(target.open(), 30)
    await target.close()


def _stdio(command: str) -> Any:
    from mcp import StdioServerParameters

    argv = shlex.split(command)
    return StdioServerParameters(command=argv[0], args=argv[1:])


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_set(tmp_path_factory.mktemp("target"))


@pytest.mark.anyio
async def test_embedded_target_in_process(tiny_set: Path) -> None:
    target = build_target(tiny_set, load_set_config(tiny_set), target=None, tool_profile=None)
    assert target.name == "embedded:tiny" and target.profile == EMBEDDED
    session = await target.open()
    try:
        assert {t.name for t in await session.list_tools()} == {"get_context", "execute_query"}
        outcome = await session.call("get_context", {"query": "revenue"})
        results = session.context_results(outcome)
        assert results and results[0].rank == 1
        assert "measure:orders:total_revenue" in {r.id for r in results}
        assert session.query_of("execute_query", {"sql": "SELECT 1"}) == "SELECT 1"
        count = await session.execute("SELECT count(*) AS n FROM orders")
        assert count.columns == ["n"] and count.rows == [{"n": 2000}] and not count.truncated
        everything = await session.execute("SELECT * FROM orders")
        assert everything.truncated and len(everything.rows) == 1000
        refused = await session.execute("COPY orders TO 'x.csv'")
        assert refused.error and not refused.rows
    finally:
        await target.close()


def test_a_set_without_embedded_target_needs_eval_target(tmp_path: Path) -> None:
    (tmp_path / "set.json").write_text(json.dumps({"name": "x"}), encoding="utf-8")
    with pytest.raises(ValueError, match="--eval-target"):
        build_target(tmp_path, load_set_config(tmp_path), target=None, tool_profile=None)


def test_urls_and_commands_pick_their_transport(tmp_path: Path) -> None:
    url = build_target(
        tmp_path, PUBLISHER_SET, target="http://127.0.0.1:4040/mcp", tool_profile="publisher"
    )
    assert url.server == "http://127.0.0.1:4040/mcp" and url.profile.client_mode == "legacy"
    stdio = build_target(
        tmp_path, PUBLISHER_SET, target="npx 'my server' --flag", tool_profile="publisher"
    )
    server: Any = stdio.server
    assert (server.command, server.args) == ("npx", ["my server", "--flag"])


# --- profiles --------------------------------------------------------------------------------


def test_publisher_profile_reads_the_real_sets_keys() -> None:
    set_dir = REFERENCE / "evals" / "ecommerce"
    profile = load_profile("publisher", load_set_config(set_dir), set_dir)
    assert profile.fixed_args == MODEL
    assert (profile.context_tool, profile.query_tool, profile.query_arg) == (
        "malloy_getContext",
        "malloy_executeQuery",
        "query",
    )
    assert profile.truncation_keys == ["_limit_hit", "_rows_truncated"]


def test_publisher_block_wins_over_fallback_keys(tmp_path: Path) -> None:
    config = SetConfig.model_validate(
        {
            "name": "s",
            "targetPackage": "old",
            "publisher": {"environmentName": "prod", "packageName": "p", "modelPath": "m.malloy"},
        }
    )
    fixed = load_profile("publisher", config, tmp_path).fixed_args
    assert fixed == {"environmentName": "prod", "packageName": "p", "modelPath": "m.malloy"}


def test_publisher_profile_without_a_package_says_what_to_add(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"set\.json.*packageName, modelPath.*\"publisher\""):
        load_profile("publisher", SetConfig(name="s"), tmp_path)


def test_profile_from_a_file_and_from_set_json(tmp_path: Path) -> None:
    spec = {"context_tool": "get_context", "query_tool": "run_sql", "query_arg": "sql"}
    (tmp_path / "credible.json").write_text(json.dumps(spec), encoding="utf-8")
    from_file = load_profile("credible.json", SetConfig(name="s"), tmp_path)
    assert (from_file.name, from_file.query_tool) == ("credible", "run_sql")
    in_set = SetConfig.model_validate({"name": "s", "toolProfile": {**spec, "name": "mine"}})
    assert load_profile(None, in_set, tmp_path).name == "mine"
    named = SetConfig.model_validate({"name": "s", "toolProfile": "publisher", "publisher": MODEL})
    assert load_profile(None, named, tmp_path).name == "publisher"
    assert load_profile(None, SetConfig(name="s"), tmp_path) == EMBEDDED


def test_bad_profiles_name_the_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"context_tool": "a", "query_arg": "q", "colour": 1}), "utf-8")
    with pytest.raises(ProfileError) as caught:
        load_profile(str(bad), SetConfig(name="s"), tmp_path)
    message = str(caught.value)
    assert str(bad) in message and "'query_tool'" in message and "'colour'" in message
    with pytest.raises(ProfileError, match="not a built-in"):
        load_profile("nope.json", SetConfig(name="s"), tmp_path)
    with pytest.raises(ValueError, match="hidden_args"):
        ToolProfile(name="x", context_tool="a", query_tool="b", query_arg="q", hidden_args=["k"])
