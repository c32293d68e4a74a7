"""The embedded target's MCP server: a context tool and a query tool over a semantic model.

    python -m pytest_evalloop.targets.embedded.server <set_dir> [--transport stdio|http] [--port N]

The answerer talks to this server and to nothing else, so everything it says -- tool
descriptions, instructions, payloads -- is about the data. Nothing here mentions evaluation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pytest_evalloop.targets.embedded.retrieval import EntityIndex, RankedEntity, index_for
from pytest_evalloop.targets.embedded.sandbox import BoundedMemo, QueryRefused, Sandbox

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from pytest_evalloop.targets.embedded.model import SemanticModel

__all__ = [
    "QueryTool",
    "build_server",
    "build_server_from_parts",
    "load_set_target",
    "main",
    "serve",
]

MAX_LIMIT = 50
# Bounds of the per-server memo of execute_query replies (see build_server_from_parts).
RESULT_MEMO_ENTRIES = 256
RESULT_MEMO_BYTES = 8 * 1024 * 1024
BUILTIN_DATASETS = ("ecommerce",)

GET_CONTEXT_DESCRIPTION = """\
Search the semantic model: find the sources (tables), dimensions (columns you group or filter \
by), measures (aggregates with their exact definition) and views (prepared queries) relevant to \
a question. Start here before writing any query.

Arguments:
- query: the need in plain words, e.g. "revenue by product category" or "customers who \
returned an order". Pass an empty string to list the sources.
- source: optional source name to search within (with an empty query, lists that source's \
entities).
- limit: how many results to return (1-50, default 10).

Returns JSON {"traceId", "results": [{"id", "kind", "name", "source", "doc", "rank"}], \
"rankedSummary": {"entityIds", "ranks", "resultCount"}}. Results are ordered best first. Each \
entity id is "kind:source:name". Read each doc: it states grain, units and caveats, and a \
measure's doc gives the SQL to use for it."""

EXECUTE_QUERY_DESCRIPTION = """\
Run one read-only DuckDB SQL SELECT against the model's sources and return the rows.

Reference sources and views by the names get_context returns (e.g. SELECT ... FROM orders). \
WITH, joins, window functions, DESCRIBE <source>, SUMMARIZE <source> and SHOW TABLES work. \
Anything that writes, reads files or URLs, changes settings or runs more than one statement is \
refused with the reason. Results are capped at {row_cap} rows (rowCapHit says when more \
existed: aggregate or add LIMIT) and at {reply_bytes:,} bytes of JSON (byteCapHit says when rows \
were left out: select fewer or shorter columns). Queries stop after {timeout:g} s or when they \
need more than {memory_mb} MB of memory.

Returns JSON {{"columns", "rows": [{{column: value}}], "rowCount", "rowCapHit", "rowCap", \
"byteCapHit", "byteCap"}}. Dates and timestamps come back as ISO strings, decimals as numbers."""


def build_server_from_parts(
    model: SemanticModel,
    data_dir: Path,
    *,
    row_cap: int = 1000,
    timeout_s: float = 10.0,
    memory_mb: int = 2048,
    reply_bytes: int = 1_000_000,
) -> MCPServer:
    """An MCP server with `get_context` and `execute_query` over `model` and its data."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    sandbox = Sandbox(
        model,
        data_dir,
        row_cap=row_cap,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        reply_bytes=reply_bytes,
    )
    index = index_for(model.entities())
    query_tool = QueryTool(sandbox)
    with _root_logger_kept():
        server: MCPServer = MCPServer(
            f"{model.name}-data",
            instructions=_instructions(model, index),
            version="1",
            log_level="WARNING",
        )
    _drop_tracing(server)

    # Async although it never awaits: the SDK runs a plain function on a worker thread, and a
    # hop to a thread and back costs more CPU than the sub-millisecond search itself.
    @server.tool(name="get_context", description=GET_CONTEXT_DESCRIPTION, structured_output=False)
    async def get_context(query: str = "", source: str | None = None, limit: int = 10) -> str:
        try:
            return json.dumps(context_payload(index, query, source=source, limit=limit))
        except ValueError as exc:
            raise ToolError(str(exc)) from None

    @server.tool(
        name="execute_query",
        description=EXECUTE_QUERY_DESCRIPTION.format(
            row_cap=row_cap, timeout=timeout_s, reply_bytes=reply_bytes, memory_mb=memory_mb
        ),
        structured_output=False,
    )
    async def execute_query(sql: str) -> str:
        try:
            return await query_tool.reply(sql)
        except QueryRefused as exc:
            raise ToolError(str(exc)) from None

    return server


class QueryTool:
    """The `execute_query` tool's work: run SQL on a sandbox and render the JSON reply.

    Replies to repeatable queries are remembered by exact SQL text, in a memo bounded in entries
    and bytes. That is sound: the sandbox is a read-only snapshot that never changes while it
    lives, its row cap is fixed, and a reply is only kept when the sandbox says the query is
    repeatable (no random or clock function, no sampling), so running it again would give the
    same reply. A refused or failed query raises before anything is stored, and a query not in
    the memo runs on the sandbox under its time limit as always. The usual hit is the
    conductor re-running the final query the answerer just ran; a hit also skips the hop to a
    worker thread.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        max_entries: int = RESULT_MEMO_ENTRIES,
        max_bytes: int = RESULT_MEMO_BYTES,
    ) -> None:
        self.sandbox = sandbox
        self.replies = BoundedMemo(max_entries=max_entries, max_bytes=max_bytes)

    async def reply(self, sql: str) -> str:
        """The JSON reply for `sql`; raises QueryRefused (or QueryFailed) with the reason."""
        known: str | None = self.replies.get(sql)
        if known is not None:
            return known
        result = await self.sandbox.execute_async(sql)
        counts = {
            "rowCount": result.row_count,
            "rowCapHit": result.row_cap_hit,
            "rowCap": self.sandbox.row_cap,
            "byteCapHit": result.byte_cap_hit,
            "byteCap": self.sandbox.limits.reply_bytes,
        }
        # The rows' JSON goes in as the query process wrote it: parsing and re-encoding it here
        # was the larger part of a 1,000-row reply's cost in this process.
        text = (
            f'{{"columns": {json.dumps(result.columns)}, "rows": {result.rows_json}, '
            f"{json.dumps(counts)[1:]}"
        )
        if result.repeatable:
            self.replies.put(sql, text, len(text))
        return text


_ROOT_LOGGER_LOCK = threading.Lock()
"""One server build at a time (`_root_logger_kept`)."""


@contextlib.contextmanager
def _root_logger_kept() -> Iterator[None]:
    """The root logger's handlers and level as they were before the block.

    The SDK's server constructor configures logging: a rich handler on the root logger at the
    server's level, when the root has no handler. The root logger is the user's. In a pytest
    run with its logging plugin off, and in every `evalloop` command, that handler printed each
    HTTP request of the run on the terminal (httpx logs them at INFO)."""
    # One build at a time: a build that began while another's handler was on the root would
    # take that handler for the user's and put it back after the other had removed it.
    with _ROOT_LOGGER_LOCK:
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        try:
            yield
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)


def _drop_tracing(server: MCPServer) -> None:
    """Remove the SDK's OpenTelemetry middleware from `server`'s chain.

    It opens a span around every request even when no exporter is installed (the SDK documents
    dropping it from `middleware` as the way to opt out), and nothing here exports traces: on
    the in-process path it was a tenth of each tool call's CPU.
    """
    server.middleware[:] = [
        layer for layer in server.middleware if type(layer).__name__ != "OpenTelemetryMiddleware"
    ]


def context_payload(
    index: EntityIndex, query: str, *, source: str | None = None, limit: int = 10
) -> dict[str, Any]:
    """The `get_context` reply; raises ValueError (shown to the caller) on a bad argument."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    if source is not None and not source.strip():
        source = None
    sources = index.sources()
    if source is not None and source.lower() not in {s.lower() for s in sources}:
        raise ValueError(
            f"unknown source {source!r}; the sources are: {', '.join(sources)}. "
            "Call get_context with an empty query to list them"
        )
    hits = index.rank(query, source=source, limit=limit)
    return {
        "traceId": uuid.uuid4().hex,
        "results": [_result(hit) for hit in hits],
        "rankedSummary": {
            "entityIds": [hit.id for hit in hits],
            "ranks": [hit.rank for hit in hits],
            "resultCount": len(hits),
        },
    }


def _result(hit: RankedEntity) -> dict[str, Any]:
    return {
        "id": hit.id,
        "kind": hit.kind,
        "name": hit.name,
        "source": hit.source,
        "doc": hit.doc,
        "rank": hit.rank,
    }


def _instructions(model: SemanticModel, index: EntityIndex) -> str:
    about = model.doc.strip() or f"the {model.name} data"
    return (
        f"This server answers questions about {model.name}: {about}\n"
        f"Sources: {', '.join(index.sources())}.\n"
        "Start with get_context to find the sources, dimensions, measures and views that fit "
        "the question and to read their docs (grain, units, caveats). Then run one DuckDB "
        "SELECT with execute_query, using the measure definitions the docs give. Answer from "
        "the rows the query returns."
    )


def load_set_target(set_dir: Path) -> tuple[SemanticModel, Path]:
    """Read `<set_dir>/set.json` and return the embedded target's model and data directory."""
    from pytest_evalloop.targets.embedded.model import SemanticModel

    set_dir = Path(set_dir)
    config_path = set_dir / "set.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{config_path} does not exist; pass the directory of a set") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_path} is not valid JSON ({exc}); fix the file") from None
    target = config.get("target") or {}
    if target.get("kind") != "embedded":
        raise ValueError(
            f"{config_path}: target.kind is {target.get('kind')!r}, expected 'embedded'; "
            "only an embedded target can be served from a set"
        )
    model = SemanticModel.load(set_dir / str(target.get("model", "model.json")))
    return model, _data_dir(set_dir, str(target.get("data", "ecommerce")), config_path)


def _data_dir(set_dir: Path, data: str, config_path: Path) -> Path:
    if data in BUILTIN_DATASETS:
        from pytest_evalloop.targets.embedded.data import ensure_data

        return ensure_data()
    folder = set_dir / data
    if folder.is_dir():
        return folder
    raise ValueError(
        f"{config_path}: target.data is {data!r}, which is neither a built-in dataset "
        f"({', '.join(BUILTIN_DATASETS)}) nor a folder of parquet files under {set_dir}"
    )


def build_server(set_dir: Path, **limits: Any) -> MCPServer:
    """The MCP server for the embedded target described by `<set_dir>/set.json`.

    `limits` are `build_server_from_parts`'s: row_cap, timeout_s, memory_mb, reply_bytes.
    """
    model, data_dir = load_set_target(Path(set_dir))
    return build_server_from_parts(model, data_dir, **limits)


def serve(
    set_dir: Path,
    transport: Literal["stdio", "http"],
    host: str = "127.0.0.1",
    port: int = 8765,
    **limits: Any,
) -> None:
    """Serve the set's embedded target over stdio or streamable HTTP (at `/mcp`) until stopped."""
    server = build_server(set_dir, **limits)
    if transport == "stdio":
        server.run("stdio")
    elif transport == "http":
        # stderr, because stdout may be a pipe someone parses; the URL is what a client needs.
        print(f"serving http://{host}:{port}/mcp", file=sys.stderr, flush=True)
        server.run("streamable-http", host=host, port=port, streamable_http_path="/mcp")
    else:
        raise ValueError(f"transport must be 'stdio' or 'http', got {transport!r}")


def main(argv: list[str] | None = None) -> int:
    """Command line: serve a set's embedded target."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_evalloop.targets.embedded.server",
        description="Serve a set's embedded semantic model over MCP.",
    )
    parser.add_argument("set_dir", type=Path, help="directory holding set.json")
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--row-cap", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=10.0, help="query time limit, seconds")
    parser.add_argument(
        "--memory-mb", type=int, default=2048, help="memory limit of the query process, MB"
    )
    parser.add_argument(
        "--reply-bytes", type=int, default=1_000_000, help="cap on a reply's rows, bytes of JSON"
    )
    args = parser.parse_args(argv)
    try:
        serve(
            args.set_dir,
            args.transport,
            host=args.host,
            port=args.port,
            row_cap=args.row_cap,
            timeout_s=args.timeout,
            memory_mb=args.memory_mb,
            reply_bytes=args.reply_bytes,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
