"""Targets: one MCP connection per process, read through a tool profile.

:class:`MCPTarget` connects to an MCP server (in-process, streamable HTTP or stdio) and opens a
session the answerer and the conductor share. The session normalises every result to a
:class:`~pytest_evalloop.roles.contract.ToolOutcome` and sorts failures in two:

- the answerer's mistakes (a tool error, a schema violation rejected as JSON-RPC -32602) are
  outcomes it is shown, so it can correct itself;
- the harness's failures (connection refused, server died, timeout) raise
  :class:`~pytest_evalloop.failures.HarnessError`, which make an attempt a pytest error and never
  a `no_match`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop.failures import HarnessError
from pytest_evalloop.roles.contract import (
    ContextResult,
    FinalCall,
    QueryOutcome,
    ToolOutcome,
    ToolRole,
    ToolSpec,
)
from pytest_evalloop.sets.cases import SetConfig
from pytest_evalloop.targets.bridge import outcome_from_mcp
from pytest_evalloop.targets.profiles import ToolProfile, load_profile

if TYPE_CHECKING:
    from mcp import Client, StdioServerParameters
    from mcp.server.mcpserver import MCPServer

__all__ = ["MCPSession", "MCPTarget", "build_target", "client_transport"]

# JSON-RPC codes that mean "your call was wrong", which the answerer must see and can fix.
# Anything else a server raises (-32000 connection closed, -32001 timeout, -32603 internal)
# means the harness could not do its job.
CALLER_ERROR_CODES = frozenset({-32602, -32601})
# The SDK's answer to a request on a connection whose server has gone (it exited or crashed):
# the connection is dead for good, and the session says so (`broken`).
CONNECTION_CLOSED = -32000
NOT_ENTITIES = frozenset({"environment", "package"})
_URL = re.compile(r"^https?://", re.IGNORECASE)


class MCPTarget:
    """An MCP server the answerer uses, reached through a tool profile (implements Target)."""

    def __init__(
        self,
        server: MCPServer | str | StdioServerParameters,
        profile: ToolProfile,
        *,
        name: str,
        read_timeout_s: float = 120.0,
        launch: dict[str, Any] | None = None,
        pins: dict[str, Any] | None = None,
    ) -> None:
        self.server = server
        self.profile = profile
        self.name = name
        # A URL's pins name the model, not the socket (`url_pins`), whoever built the target.
        by_url = url_pins(server, profile) if isinstance(server, str) else {}
        self.pins: dict[str, Any] = {"targetProfile": profile.name, **by_url, **(pins or {})}
        """run.json pins this target knows before it serves (see `target_pins`)."""
        self.read_timeout_s = read_timeout_s
        self.launch = launch
        """How an out-of-process agent (the claude CLI) starts this server itself, when the
        server object lives in-process: an `mcpServers` entry."""
        self._lock = asyncio.Lock()
        self._session: MCPSession | None = None
        self._stop: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None

    async def open(self) -> MCPSession:
        """Connect once; later calls (also concurrent ones) get the same session."""
        async with self._lock:
            if self._session is not None and not self._session.broken:
                return self._session
            await self._shutdown()
            ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            # The client's task group must be entered and left by one task; a dedicated task
            # owns it, so open() and close() may come from different tasks.
            self._runner = asyncio.create_task(self._own_client(ready, self._stop))
            # Requests in flight on this connection: when the task owning the client ends (the
            # transport died), they are cancelled at once rather than left waiting for a reply
            # that never comes.
            inflight: set[asyncio.Future[Any]] = set()
            self._runner.add_done_callback(functools.partial(_cancel_all, inflight))
            try:
                client = await asyncio.wait_for(ready, self.read_timeout_s)
            except Exception as exc:
                await self._shutdown()
                raise HarnessError(
                    f"target {self.name}: could not connect: {_describe(exc)}"
                ) from exc
            self._session = MCPSession(self, client, inflight)
            return self._session

    def failure_advice(self, session: MCPSession) -> str:
        """What a harness error of this target's session tells the user to do."""
        return "check that the server is running and reachable"

    async def close(self) -> None:
        """Disconnect (a no-op when not open)."""
        async with self._lock:
            await self._shutdown()

    async def _shutdown(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._runner is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._runner, 10.0)
        self._session, self._stop, self._runner = None, None, None

    async def _own_client(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        from mcp import Client

        try:
            client = Client(
                client_transport(self.server),
                mode=self.profile.client_mode,
                read_timeout_seconds=self.read_timeout_s,
            )
            async with client:
                ready.set_result(client)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(_plain(exc))
            elif self._session is not None:
                self._session.failure = _plain(exc)
            if not isinstance(exc, Exception):
                raise


class MCPSession:
    """An open connection to an MCP target (implements TargetSession)."""

    def __init__(
        self, target: MCPTarget, client: Client, inflight: set[asyncio.Future[Any]] | None = None
    ) -> None:
        self.name = target.name
        self.profile = target.profile
        self._target = target
        self._client = client
        self._tools: list[ToolSpec] | None = None
        self._inflight = inflight if inflight is not None else set()
        self.failure: BaseException | None = None
        """Set when the connection died under us; every later call raises HarnessError."""

    @property
    def broken(self) -> bool:
        """Whether the connection has died."""
        return self.failure is not None

    @property
    def instructions(self) -> str | None:
        """What the server said about using its tools when it was connected (MCP
        `instructions`), or None: both answerer backends give it to the model."""
        said = getattr(self._client, "instructions", None)
        return said if isinstance(said, str) and said.strip() else None

    def mcp_server_config(self) -> dict[str, Any]:
        """The `mcpServers` entry an agent CLI uses to reach this same target."""
        from mcp import StdioServerParameters

        server = self._target.server
        if isinstance(server, str):
            return {"type": "http", "url": server}
        if isinstance(server, StdioServerParameters):
            entry: dict[str, Any] = {
                "type": "stdio",
                "command": server.command,
                "args": list(server.args),
                "env": dict(server.env or {}),
            }
            if server.cwd:
                entry["cwd"] = str(server.cwd)
            return entry
        if self._target.launch is not None:
            return dict(self._target.launch)
        raise HarnessError(
            f"target {self.name} runs in-process and has no launch command an agent CLI could use"
        )

    async def list_tools(self) -> list[ToolSpec]:
        """The target's tools, as the answerer sees them (hidden arguments removed); cached."""
        if self._tools is None:
            listed = await self._guard("list tools", self._client.list_tools())
            self._tools = [
                ToolSpec(
                    name=tool.name,
                    description=tool.description or "",
                    input_schema=_hide(dict(tool.input_schema), self.profile.hidden_args),
                )
                for tool in listed.tools
            ]
        return list(self._tools)

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Call one tool; tool errors and rejected arguments come back as `is_error`."""
        from mcp import MCPError

        hidden = {k: self.profile.fixed_args[k] for k in self.profile.hidden_args}
        try:
            result = await self._guard(
                f"call {tool}", self._client.call_tool(tool, {**arguments, **hidden})
            )
        except MCPError as exc:
            text = _mcp_error_text(exc)
            return ToolOutcome(text=text, is_error=True, error=text)
        return outcome_from_mcp(result)

    def role_of(self, tool: str) -> ToolRole | None:
        """`context`, `query`, or None, per the profile."""
        if tool == self.profile.context_tool:
            return "context"
        if tool == self.profile.query_tool:
            return "query"
        return None

    def query_of(self, tool: str, arguments: dict[str, Any]) -> str | None:
        """The query text of a query-tool call; a named query reads as the profile's template."""
        if tool != self.profile.query_tool:
            return None
        text = arguments.get(self.profile.query_arg)
        if isinstance(text, str) and text.strip():
            return text
        named = self.profile.named_query
        if named is not None and arguments.get(named.name_arg):
            name = str(arguments[named.name_arg])
            source = str(arguments.get(named.source_arg) or name)
            return named.template.format(name=name, source=source)
        return None

    def context_results(self, outcome: ToolOutcome) -> list[ContextResult]:
        """Ranked entities of a context result; ids `kind:source:name` and ranks by position
        when the server sends none."""
        payload = outcome.payload
        items = payload.get(self.profile.results_key) if isinstance(payload, dict) else None
        if outcome.is_error or not isinstance(items, list):
            return []
        results = []
        for position, item in enumerate(items, start=1):
            if isinstance(item, dict) and item.get("name") and _is_entity(item.get("kind")):
                results.append(_context_result(item, position))
        return results

    async def execute(self, query: str, call: FinalCall | None = None) -> QueryOutcome:
        """Re-execute `query` as the conductor, repeating the answerer's `call` when given.

        An exact call goes out as the answerer sent it: its tool, its arguments (package, model,
        givens, the query itself), plus the profile's hidden arguments it never saw. A
        borrowed call (a declared query never run as such, a stored prediction) keeps its
        arguments over the profile's defaults and takes `query` as its query text. Without a
        call, `query` runs with the profile's fixed arguments.
        """
        from mcp import MCPError

        tool, arguments = self.replay_arguments(query, call)
        sent = {"tool": tool, "arguments": arguments, "query_arg": self.profile.query_arg}
        try:
            result = await self._guard(f"call {tool}", self._client.call_tool(tool, arguments))
        except MCPError as exc:
            return QueryOutcome(error=_mcp_error_text(exc), call=sent)
        return self._query_outcome(outcome_from_mcp(result)).model_copy(update={"call": sent})

    def replay_arguments(self, query: str, call: FinalCall | None) -> tuple[str, dict[str, Any]]:
        """The tool and arguments re-execution sends for `query` (see `execute`)."""
        profile = self.profile
        hidden = {k: profile.fixed_args[k] for k in profile.hidden_args}
        if call is None or call.arguments is None:
            return profile.query_tool, {**profile.fixed_args, profile.query_arg: query}
        tool = call.tool or profile.query_tool
        if call.exact:
            return tool, {**call.arguments, **hidden}
        borrowed = dict(call.arguments)
        if profile.named_query is not None:
            # The query text replaces a named view: Publisher refuses both at once.
            borrowed.pop(profile.named_query.name_arg, None)
            borrowed.pop(profile.named_query.source_arg, None)
        return tool, {**profile.fixed_args, **borrowed, profile.query_arg: query, **hidden}

    def _query_outcome(self, outcome: ToolOutcome) -> QueryOutcome:
        payload = outcome.payload
        if outcome.is_error:
            return QueryOutcome(error=outcome.error or outcome.text)
        rows = payload.get(self.profile.rows_key) if isinstance(payload, dict) else None
        if not isinstance(payload, dict) or not isinstance(rows, list):
            return QueryOutcome(
                error=f"{self.profile.query_tool} returned no {self.profile.rows_key!r} list in "
                f"a JSON payload (profile {self.profile.name!r}): {outcome.text[:300]!r}"
            )
        columns = payload.get(self.profile.columns_key)
        if not isinstance(columns, list):
            columns = list(rows[0]) if rows and isinstance(rows[0], dict) else []
        columns = [str(c) for c in columns]
        keys = self.profile.truncation_keys
        meta = {
            k: v
            for k, v in payload.items()
            if k not in (self.profile.rows_key, self.profile.columns_key)
        }
        return QueryOutcome(
            columns=columns,
            rows=[_row_dict(row, columns) for row in rows],
            truncated=any(bool(payload.get(k)) for k in keys),
            meta=meta,
        )

    async def _guard(self, what: str, call: Any) -> Any:
        """Await an MCP request, turning transport failures into HarnessError."""
        from mcp import MCPError

        runner = self._target._runner
        if self.failure is not None or runner is None or runner.done():
            call.close()
            raise self._harness(what, self.failure or ConnectionError("connection closed"))
        # A dead transport cancels the client's tasks but may leave this request waiting for a
        # reply that never comes; the owner task's end cancels every request still in flight
        # (see MCPTarget.open), which lands in the CancelledError branch below.
        request = asyncio.ensure_future(call)
        inflight = self._inflight
        inflight.add(request)
        try:
            return await request
        except asyncio.CancelledError as exc:
            caller = asyncio.current_task()
            if caller is not None and caller.cancelling():
                raise  # our caller is being cancelled: not a transport failure
            raise self._harness(what, self.failure or ConnectionError("connection closed")) from exc
        except MCPError as exc:
            if exc.code in CALLER_ERROR_CODES:
                raise
            if exc.code == CONNECTION_CLOSED and self.failure is None:
                # The client's own task goes on waiting after its server exits; without this
                # the session would never know it is dead (and never be reopened).
                self.failure = ConnectionError("the server closed the connection (it exited)")
            raise self._harness(what, exc) from exc
        except Exception as exc:
            raise self._harness(what, exc) from exc
        finally:
            inflight.discard(request)

    def _harness(self, what: str, exc: BaseException) -> HarnessError:
        return HarnessError(
            f"target {self.name}: {what} failed: {_describe(exc)}; "
            + self._target.failure_advice(self)
        )


def _cancel_all(requests: set[asyncio.Future[Any]], _owner: asyncio.Task[None]) -> None:
    for request in list(requests):
        request.cancel()


def _is_entity(kind: Any) -> bool:
    # Publisher's first two discovery tiers list environments and packages: places to look,
    # not entities of the model.
    return bool(kind) and kind not in NOT_ENTITIES


def _context_result(item: dict[str, Any], position: int) -> ContextResult:
    kind, name = str(item["kind"]), str(item["name"])
    source = str(item.get("source") or (name if kind == "source" else ""))
    doc = item.get("doc") or ""
    rank = item.get("rank")
    return ContextResult(
        id=str(item.get("id") or f"{kind}:{source}:{name}"),
        kind=kind,
        name=name,
        source=source,
        doc="\n".join(map(str, doc)) if isinstance(doc, list) else str(doc),
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else position,
    )


def _row_dict(row: Any, columns: list[str]) -> dict[str, Any]:
    if isinstance(row, dict):
        return row
    if isinstance(row, list | tuple):
        return dict(zip(columns, row, strict=False))
    return {"value": row}


def _hide(schema: dict[str, Any], hidden: list[str]) -> dict[str, Any]:
    if not hidden:
        return schema
    properties = {k: v for k, v in schema.get("properties", {}).items() if k not in hidden}
    required = [k for k in schema.get("required", []) if k not in hidden]
    return {**schema, "properties": properties, "required": required}


def _mcp_error_text(exc: Any) -> str:
    message = str(exc.message)
    return message if message.startswith("MCP error") else f"MCP error {exc.code}: {message}"


def _plain(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (anyio wraps transport errors in them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    exc = _plain(exc)
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def target_pins(
    set_dir: Path, set_config: SetConfig, *, target: str | None, tool_profile: str | None
) -> dict[str, Any]:
    """What a set's target is, before it serves: `target`, `targetProfile`, and for the
    embedded target `modelSha` (sha256 of its model file, the bytes it serves).

    An external target's model is pinned from what it reports while it serves (see
    `runs.served_pins`). The one place that names a target: `build_target` and the resume
    check before collection both ask here.
    """
    profile = load_profile(tool_profile, set_config, set_dir)
    if target is not None:
        return {**url_pins(target, profile), "targetProfile": profile.name}
    embedded = set_config.target or {}
    if embedded.get("kind") != "embedded":
        return {"targetProfile": profile.name}  # no target at all: build_target says why
    pins: dict[str, Any] = {"target": f"embedded:{set_config.name}", "targetProfile": profile.name}
    model = embedded.get("model")
    if model:
        pins["modelSha"] = file_sha(set_dir / str(model))
    return pins


def url_pins(target: str, profile: ToolProfile) -> dict[str, Any]:
    """The `target` pin of `--eval-target`: what identifies the model, not the socket.

    An MCP URL's host and port say where a server listens, not what it serves: the same
    Publisher model (same `modelSha`, same revision) behind another port must be comparable.
    So a URL is pinned by its scheme and path plus the arguments the profile fixes (the
    Publisher's environment, package and model path); the whole URL is recorded as `mcpUrl`
    (shown when it differs, never a mismatch). A command line is pinned as written.
    """
    if not _URL.match(target):
        return {"target": target}
    from urllib.parse import urlsplit

    parts = urlsplit(target)
    identity = f"{parts.scheme.lower()}:{parts.path or '/'}"
    if parts.query:
        identity += f"?{parts.query}"
    fixed = ", ".join(f"{k}={v}" for k, v in sorted(profile.fixed_args.items()))
    if fixed:
        identity += f" ({fixed})"
    return {"target": identity, "mcpUrl": target}


def file_sha(path: Path) -> str | None:
    """sha256 hex of a file's bytes, or None when it cannot be read."""
    import hashlib

    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def missing_target(set_dir: Path, set_config: SetConfig) -> str | None:
    """Why a set cannot be answered without `--eval-target`, or None (it has an embedded one)."""
    kind = (set_config.target or {}).get("kind")
    if kind == "embedded":
        return None
    extra = set_config.model_extra or {}
    served = [
        f"{label} {extra[key]!r}"
        for key, label in (("targetPackage", "package"), ("targetModelPath", "model"))
        if isinstance(extra.get(key), str)
    ]
    serving = f" (this set names {', '.join(served)})" if served else ""
    return (
        f"{set_dir / 'set.json'} declares no embedded target (target.kind is {kind!r}), so its "
        "cases have nothing to be answered against: pass --eval-target=<MCP URL or command>, "
        f"with --eval-tool-profile=publisher for a Malloy Publisher{serving}; or "
        "--eval-target=malloy:<package dir> to serve a local Malloy package with the real "
        'compiler (docs/malloy.md); or add "target": {"kind": "embedded", ...} or {"kind": '
        '"malloy", "package": "<dir>"} to set.json. Without a target the offline parts still '
        "run: --collect-only, --eval-check-judge"
    )


def client_transport(server: Any) -> Any:
    """What the MCP client connects through: a stdio command gets `stdio_client` with the
    current `sys.stderr` as the server's errlog; anything else goes as it is.

    Why: mcp binds `errlog`'s default to the `sys.stderr` of the moment it was imported. In a
    process that imported it under pytest's capture, that is a capture file since closed or
    swapped, so a server's stderr would land nowhere (or the spawn fails on its descriptor).
    A stream without a descriptor (an in-memory capture) cannot be a child's stderr: the
    process's own stderr stands in.
    """
    import sys

    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    if not isinstance(server, StdioServerParameters):
        return server
    errlog = sys.stderr
    try:
        errlog.fileno()
    except (AttributeError, OSError, ValueError):
        errlog = sys.__stderr__ or errlog
    return stdio_client(server, errlog=errlog)


def build_target(
    set_dir: Path, set_config: SetConfig, *, target: str | None, tool_profile: str | None
) -> MCPTarget:
    """The target for a set: `--eval-target` (URL or command line) or the set's embedded server.

    An http(s) URL is reached over streamable HTTP; anything else is a command run over stdio.
    With no `--eval-target`, set.json must describe an embedded target.
    """
    from mcp import StdioServerParameters

    profile = load_profile(tool_profile, set_config, set_dir)
    if target is None:
        problem = missing_target(set_dir, set_config)
        if problem:
            raise ValueError(problem)
        from pytest_evalloop.targets.embedded.server import build_server

        pins = target_pins(set_dir, set_config, target=None, tool_profile=tool_profile)
        return MCPTarget(
            build_server(set_dir),
            profile,
            name=pins.pop("target"),
            launch=_embedded_launch(set_dir),
            pins=pins,
        )
    if _URL.match(target):
        return MCPTarget(target, profile, name=target)
    argv = shlex.split(target)
    if not argv:
        raise ValueError("--eval-target is empty; pass an MCP URL (http://...) or a command line")
    server = StdioServerParameters(command=argv[0], args=argv[1:])
    return MCPTarget(server, profile, name=target)


def _embedded_launch(set_dir: Path) -> dict[str, Any]:
    """The same embedded server as a stdio command, for agents that start their own servers."""
    import os
    import sys

    from pytest_evalloop.targets.embedded.data import ensure_data

    # The data cache root is passed on, so a server started under a scratch HOME reuses it.
    cache_root = ensure_data().parent
    return {
        "type": "stdio",
        "command": sys.executable,
        "args": [
            "-m",
            "pytest_evalloop.targets.embedded.server",
            str(set_dir.resolve()),
            "--transport",
            "stdio",
        ],
        "env": {"EVALLOOP_CACHE_DIR": os.environ.get("EVALLOOP_CACHE_DIR", str(cache_root))},
    }
