"""A Malloy-Publisher-shaped fake MCP server, for tests that must not need Node or the network.

It copies what a client of Publisher's MCP endpoint can observe (docs: the reference notes on
Publisher's MCP tools): the seven tool names and their camelCase input schemas, every result as
an embedded JSON resource at ``content[0]``, and the three error shapes:

1. a schema violation (e.g. no ``modelPath``) is a JSON-RPC error ``-32602``;
2. neither or both of ``query`` / ``queryName`` is an ``isError`` text block
   ``"MCP error -32602: ..."``;
3. an execution failure is an ``isError`` resource ``{"error", "suggestions"}`` plus a text block.

Queries are not run: answers come from a script, ``{normalised query text: rows}``, per served
model (package and model path) and, where scripted, per givens. Entities come from a JSON list
or a rough parse of a ``.malloy`` file. Run it in-process
(``mcp.Client(build_fake_publisher(...))``) or as a process::

    python -m pytest_evalloop.testing.fake_publisher --model FILE --script FILE --port N
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from mcp.types import CallToolResult

URL_LINE_PREFIX = "EVALLOOP_FAKE_PUBLISHER_URL="
CONTEXT_TOOL = "malloy_getContext"
QUERY_TOOL = "malloy_executeQuery"
TOOL_NAMES = (
    QUERY_TOOL,
    CONTEXT_TOOL,
    "malloy_searchDocs",
    "malloy_compile",
    "malloy_reloadPackage",
    "malloy_searchDatabaseSchema",
    "malloy_getStatus",
)
DEFAULT_ROW_LIMIT = 1000
MAX_RESPONSE_CHARS = 90_000
MAX_SAFE_INTEGER = 2**53 - 1
NEITHER_QUERY = "Either 'query' or both 'sourceName' and 'queryName' must be provided"
BOTH_QUERIES = "Cannot provide both 'query' and 'queryName'"

_STR = {"type": "string"}
_SCHEMA_URL = "http://json-schema.org/draft-07/schema#"


def _object(properties: dict[str, Any], required: Iterable[str] = ()) -> dict[str, Any]:
    # The shape Zod-to-JSON-schema gives Publisher's TypeScript tools.
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
        "$schema": _SCHEMA_URL,
    }


_MODEL_ARGS = {"environmentName": _STR, "packageName": _STR, "modelPath": _STR}
SCHEMAS: dict[str, dict[str, Any]] = {
    QUERY_TOOL: _object(
        {
            **_MODEL_ARGS,
            "query": _STR,
            "queryName": _STR,
            "sourceName": _STR,
            "filterParams": {
                "type": "object",
                "additionalProperties": {
                    "anyOf": [_STR, {"type": "array", "items": _STR}],
                },
            },
            "givens": {"type": "object", "additionalProperties": {}},
        },
        required=("environmentName", "packageName", "modelPath"),
    ),
    CONTEXT_TOOL: _object(
        {
            "environmentName": _STR,
            "packageName": _STR,
            "query": {"type": "string", "maxLength": 500},
            "sourceName": _STR,
            "limit": {"type": "integer", "exclusiveMinimum": 0, "maximum": 50},
        }
    ),
    "malloy_searchDocs": _object(
        {"query": _STR, "limit": {"type": "integer", "exclusiveMinimum": 0}}, ["query"]
    ),
    "malloy_compile": _object({**_MODEL_ARGS, "query": _STR}, ["environmentName", "packageName"]),
    "malloy_reloadPackage": _object(
        {"environmentName": _STR, "packageName": _STR}, ["environmentName", "packageName"]
    ),
    "malloy_searchDatabaseSchema": _object(
        {"environmentName": _STR, "packageName": _STR, "query": _STR},
        ["environmentName", "packageName"],
    ),
    "malloy_getStatus": _object({}),
}

DESCRIPTIONS = {
    QUERY_TOOL: "Execute a Malloy query (ad-hoc `query`, or a named view/query via `queryName` "
    "and `sourceName`) against a model and return the rows as JSON.",
    CONTEXT_TOOL: "Discover environments, packages and sources, and find the sources, views, "
    "queries, dimensions and measures relevant to a plain-English need. Start here.",
    "malloy_searchDocs": "Search the Malloy language documentation.",
    "malloy_compile": "Compile-check Malloy without running it.",
    "malloy_reloadPackage": "Recompile a package from disk.",
    "malloy_searchDatabaseSchema": "List and rank warehouse tables and columns.",
    "malloy_getStatus": "Server health, load errors and stale packages.",
}


_PUNCTUATION_SPACE = re.compile(r"\s*(->|[{}()\[\],;:=<>!+*/])\s*")


def normalise_query(text: str) -> str:
    """The script key of a query: case folded, whitespace collapsed and dropped around
    punctuation, so `{aggregate: x}` and `{ aggregate:x }` are one query."""
    collapsed = " ".join(text.split()).casefold()
    return _PUNCTUATION_SPACE.sub(r"\1", collapsed)


@dataclass
class Script:
    """Scripted answers of `malloy_executeQuery`: rows, or an execution error, per query.

    The top level answers for the fake's own package and model; `models` holds the scripts
    of further models it serves, keyed `(package, modelPath)`, so a test can tell apart rows
    from one model and another. An answer may also depend on the call's givens:
    `{"byGivens": [{"givens": {...}, "rows": [...]}, ...], "rows": [...]}` (the outer `rows`
    answer any other givens; without it they are an execution error).
    """

    answers: dict[str, Any] = field(default_factory=dict)
    default: Any = None
    """Rows for any query not in `answers`; None makes unknown queries an execution error."""
    models: dict[tuple[str, str], Script] = field(default_factory=dict)

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Script:
        """From `{"queries": {text: answer}, "default": rows, "models": {"pkg/model.malloy":
        {"queries": ..., "default": ...}}}`."""
        queries = data.get("queries", {})
        models = {}
        for key, model in (data.get("models") or {}).items():
            package, _, model_path = str(key).partition("/")
            if not package or not model_path:
                raise ValueError(f"script models key {key!r}: write it as <package>/<modelPath>")
            models[(package, model_path)] = cls.from_data(model)
        return cls({normalise_query(k): v for k, v in queries.items()}, data.get("default"), models)

    def answer(self, query: str, givens: dict[str, Any] | None = None) -> Any:
        """Rows (a list) or an error mapping for `query` run with `givens`."""
        found = self.answers.get(normalise_query(query), self.default)
        if isinstance(found, dict) and "byGivens" in found:
            wanted = givens or {}
            match = [e for e in found["byGivens"] if (e.get("givens") or {}) == wanted]
            found = match[0].get("rows") if match else found.get("rows")
            if found is None:
                return {
                    "error": f"Query failed: nothing is scripted for givens {json.dumps(wanted)}",
                    "suggestions": ["Check the model's given: block for the values it takes"],
                }
        if found is None:
            return {
                "error": f"Query failed to compile: nothing is scripted for {query!r}",
                "suggestions": ["Check field names with malloy_getContext"],
            }
        return found


@dataclass
class FakePublisher:
    """What the fake serves: one environment, its own package and model, and any further
    models its script names."""

    entities: list[dict[str, Any]]
    script: Script = field(default_factory=Script)
    environment: str = "local"
    package: str = "ecommerce"
    model_path: str = "ecommerce.malloy"
    description: str = "Example Transactional data for an eCommerce business"
    row_limit: int = DEFAULT_ROW_LIMIT
    max_response_chars: int = MAX_RESPONSE_CHARS
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Every tool call received, in order (for in-process tests)."""
    served_revision: str | None = None
    source_content_sha: str | None = None
    """The package identity a server may report (`servedRevision`, minted per load, and
    `sourceContentSha`, a hash over every model path): when set, every package-scoped
    getContext payload carries them, as the identity of what was served."""

    @property
    def packages(self) -> list[str]:
        """Every package served, the fake's own first."""
        return list(dict.fromkeys([self.package, *(p for p, _ in self.script.models)]))

    def script_for(self, package: str, model_path: str) -> Script | None:
        """The script of one served model; None when the fake does not serve it."""
        if (package, model_path) == (self.package, self.model_path):
            return self.script
        return self.script.models.get((package, model_path))


# --- the .malloy rough parse -----------------------------------------------------------------

_SOURCE = re.compile(r"^\s*source:\s*([A-Za-z_]\w*)\s+is\b")
_SECTION = re.compile(
    r"^\s*(dimension|measure|view|query|aggregate|group_by|join_\w+|primary_key|calculate):(.*)$"
)
_DECL = re.compile(r"^\s*([A-Za-z_]\w*)\s+is\b(.*)$")
_PUBLIC = re.compile(r"^\s*public:\s*(.+)$")
_QUERY_SOURCE = re.compile(r"\bis\s+([A-Za-z_]\w*)\s*->")
_KINDS = {"dimension", "measure", "view", "query"}


def entities_from_malloy(text: str) -> list[dict[str, Any]]:
    """Sources, public columns, dimensions, measures, views and queries of a model, with docs.

    A line-based approximation of what Publisher indexes, good enough for a fake: joins and
    `calculate:` are skipped, as Publisher skips them.
    """
    entities: list[dict[str, Any]] = []
    doc: list[str] = []
    source = ""
    section: str | None = None
    section_depth = 0
    depth = 0
    source_query = False  # inside `source: x is <table> -> {...}`: its outputs are columns

    def add(kind: str, name: str, owner: str) -> None:
        entities.append({"kind": kind, "name": name, "source": owner, "doc": " ".join(doc)})
        doc.clear()

    for raw in text.splitlines():
        line = raw.split("//")[0]
        stripped = line.strip()
        if stripped.startswith("#(doc)"):
            doc.append(stripped[len("#(doc)") :].strip())
            continue
        if stripped.startswith("#") or not stripped:
            continue
        if match := _SOURCE.match(line):
            source, section, source_query = match.group(1), None, "->" in line
            add("source", source, source)
        elif match := _SECTION.match(line):
            keyword, rest = match.groups()
            section = keyword if keyword in _KINDS else None
            if keyword in ("aggregate", "group_by") and source_query:
                section = "dimension"
            section_depth = depth
            if section and (decl := _DECL.match(rest)):
                owner = _query_owner(decl.group(2), source) if section == "query" else source
                add(section, decl.group(1), owner)
        elif (match := _PUBLIC.match(line)) and depth == 1:
            for name in re.findall(r"[A-Za-z_]\w*", match.group(1)):
                add("dimension", name, source)
        elif section and depth == section_depth and (decl := _DECL.match(line)):
            add(section, decl.group(1), source)
        if depth == 0 and section is None:
            source_query = (source_query or "->" in line) and not stripped.startswith("extend")
        depth += line.count("{") + line.count("(") - line.count("}") - line.count(")")
        if depth == 0 and section and "}" in line:
            section = None
        doc.clear()  # a doc belongs to the declaration right after it, or to nothing
    return entities


def _query_owner(rest: str, fallback: str) -> str:
    match = _QUERY_SOURCE.search("is " + rest)
    return match.group(1) if match else fallback


# --- result envelopes ------------------------------------------------------------------------


def _uri(
    fragment: str, *, env: str | None, package: str | None = None, model: str | None = None
) -> str:
    uri = f"malloy://environment/{quote(env, safe='') if env else 'home'}"
    if package:
        uri += f"/package/{package}"
        if model:
            uri += f"/models/{quote(model, safe='')}"
    return f"{uri}#{fragment}"


def resource_result(
    uri: str, payload: Any, *, text: str | None = None, is_error: bool = False
) -> CallToolResult:
    """Publisher's envelope: the JSON payload as an embedded resource, then optional prose."""
    from mcp.types import CallToolResult, EmbeddedResource, TextContent, TextResourceContents

    content: list[Any] = [
        EmbeddedResource(
            type="resource",
            resource=TextResourceContents(
                uri=uri, mime_type="application/json", text=json.dumps(payload, indent=2)
            ),
        )
    ]
    if text:
        content.append(TextContent(type="text", text=text))
    return CallToolResult(content=content, is_error=is_error)


def tool_error(uri: str, message: str, suggestions: list[str]) -> CallToolResult:
    """Publisher's execution-failure shape: isError, resource `{error, suggestions}` + text."""
    bullets = "\n".join(f"- {s}" for s in suggestions)
    prose = f"{message}\n\nSuggestions:\n{bullets}" if suggestions else message
    payload = {"error": message, "suggestions": suggestions}
    return resource_result(uri, payload, text=prose, is_error=True)


def _invalid_params(tool: str, arguments: dict[str, Any]) -> None:
    """Raise Publisher's JSON-RPC -32602 for arguments its Zod schema would reject."""
    import jsonschema
    from mcp import MCPError
    from mcp.types import INVALID_PARAMS

    validator = jsonschema.Draft7Validator(SCHEMAS[tool])
    issues = [_zod_issue(err) for err in validator.iter_errors(arguments)]
    if issues:
        detail = json.dumps(issues, indent=2)
        message = f"MCP error -32602: Invalid arguments for tool {tool}: {detail}"
        raise MCPError(INVALID_PARAMS, message)


def _zod_issue(err: Any) -> dict[str, Any]:
    path = list(err.absolute_path)
    if err.validator == "required":
        missing = re.findall(r"'([^']+)' is a required property", err.message)
        return {
            "code": "invalid_type",
            "expected": "string",
            "received": "undefined",
            "path": path + missing[:1],
            "message": "Required",
        }
    return {"code": "invalid_type", "path": path, "message": err.message}


# --- malloy_getContext -----------------------------------------------------------------------

_SANITIZE = re.compile(r'[~^:*+\-"]')


def get_context(publisher: FakePublisher, args: dict[str, Any]) -> CallToolResult:
    """The four tiers: environments, packages, sources, ranked entities."""
    env, pkg = args.get("environmentName"), args.get("packageName")
    limit = args.get("limit")
    if not env:
        payload = {
            "results": [
                {
                    "kind": "environment",
                    "name": publisher.environment,
                    "packages": publisher.packages,
                }
            ]
        }
        return resource_result(_uri("get-context", env=None), payload)
    home = _uri("get-context", env=env)
    if env != publisher.environment:
        return tool_error(
            home,
            f"Environment '{env}' not found",
            [f"Call malloy_getContext with no arguments; known: {publisher.environment}"],
        )
    if not pkg:
        packages = [
            {
                "kind": "package",
                "name": name,
                "description": publisher.description if name == publisher.package else "",
                "environmentName": env,
            }
            for name in publisher.packages
        ]
        return resource_result(home, {"results": packages})
    uri = _uri("get-context", env=env, package=str(pkg))
    if pkg not in publisher.packages:
        return tool_error(
            uri,
            f"Package '{pkg}' not found in environment '{env}'",
            [f"Known packages: {', '.join(publisher.packages)}"],
        )
    # Entities are parsed from the fake's own model only; further packages have none.
    own = publisher.entities if pkg == publisher.package else []
    query = str(args.get("query") or "").strip()
    scope = [e for e in own if _in_source(e, args.get("sourceName"))]
    if not query:
        found = [e for e in scope if e["kind"] == "source"]
        payload = {"results": [_wire(publisher, e) for e in found[:limit]]}
    else:
        ranked = _rank(scope, query)[: limit or 10]
        payload = {"results": [_wire(publisher, e) for e in ranked]}
    return resource_result(uri, {**payload, **_identity(publisher)})


def _identity(publisher: FakePublisher) -> dict[str, str]:
    identity = {
        "servedRevision": publisher.served_revision,
        "sourceContentSha": publisher.source_content_sha,
    }
    return {k: v for k, v in identity.items() if v is not None}


def _in_source(entity: dict[str, Any], source: Any) -> bool:
    return not source or entity["source"] == source


def _wire(publisher: FakePublisher, entity: dict[str, Any]) -> dict[str, Any]:
    # Publisher sends no id and no rank: order is the rank.
    return {
        "kind": entity["kind"],
        "name": entity["name"],
        "source": entity["source"],
        "environmentName": publisher.environment,
        "packageName": publisher.package,
        "modelPath": publisher.model_path,
        "doc": entity.get("doc", ""),
    }


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", text.casefold()) if w]


def _rank(entities: list[dict[str, Any]], query: str) -> list[dict[str, Any]]:
    terms = set(_words(_SANITIZE.sub(" ", query)))

    def score(entity: dict[str, Any]) -> float:
        name = set(_words(entity["name"]))
        source = set(_words(entity["source"]))
        doc = _words(entity.get("doc", ""))
        return 4 * len(terms & name) + len(terms & source) + sum(w in terms for w in doc) / 4

    scored = [(score(e), i, e) for i, e in enumerate(entities)]
    return [e for s, _, e in sorted(scored, key=lambda t: (-t[0], t[1])) if s > 0]


# --- malloy_executeQuery ---------------------------------------------------------------------

_QUERY_LIMIT = re.compile(r"\b(?:limit|top)\s*:\s*(\d+)")


def execute_query(publisher: FakePublisher, args: dict[str, Any]) -> CallToolResult:
    """Scripted rows in Publisher's query envelope, with its row limit and truncation flags."""
    from mcp.types import CallToolResult, TextContent

    query, name = args.get("query"), args.get("queryName")
    if bool(query) == bool(name):
        message = BOTH_QUERIES if query else NEITHER_QUERY
        text = TextContent(type="text", text=f"MCP error -32602: {message}")
        return CallToolResult(content=[text], is_error=True)
    if name:
        query = f"run: {args.get('sourceName') or name} -> {name}"
    env, package, model = args["environmentName"], args["packageName"], args["modelPath"]
    uri = _uri("result", env=env, package=package, model=model)
    script = publisher.script_for(package, model) if env == publisher.environment else None
    if script is None:
        problem = f"Model '{model}' not found in package '{package}' of environment '{env}'"
        return tool_error(uri, problem, ["List models with malloy_getContext"])
    givens = args.get("givens") if isinstance(args.get("givens"), dict) else None
    answer = script.answer(str(query), givens)
    if isinstance(answer, dict):
        return tool_error(uri, str(answer.get("error")), list(answer.get("suggestions", [])))
    envelope, warning = _envelope(publisher, str(query), list(answer))
    return resource_result(uri, envelope, text=warning)


def _envelope(
    publisher: FakePublisher, query: str, rows: list[dict[str, Any]]
) -> tuple[dict[str, Any], str | None]:
    own = _QUERY_LIMIT.search(query)
    cap = int(own.group(1)) if own else publisher.row_limit
    rows = [_safe_row(row) for row in rows[:cap]]
    limit_hit = own is None and len(rows) == cap
    envelope: dict[str, Any] = {
        "rows": rows,
        "_meta": {"schema": _schema(rows), "annotations": [], "connection_name": "duckdb"},
        "_query_row_limit": cap,
        "_limit_source": "query" if own else "server_default",
        "_limit_hit": limit_hit,
    }
    kept = _fit(rows, publisher.max_response_chars)
    if kept < len(rows):
        envelope.update(
            rows=rows[:kept], _rows_truncated=True, _total_rows=len(rows), _returned_rows=kept
        )
    warning = None
    if limit_hit:
        warning = (
            f"Returned exactly {cap} rows, the server's default row limit; there may be more. "
            "Aggregate, or add a limit to the query."
        )
        envelope["warning"] = warning
    return envelope, warning


def _fit(rows: list[dict[str, Any]], max_chars: int) -> int:
    """How many leading rows fit in `max_chars` of JSON (Publisher's response-size cap)."""
    used = 0
    for index, row in enumerate(rows):
        used += len(json.dumps(row)) + 1
        if used > max_chars:
            return index
    return len(rows)


def _safe_row(row: dict[str, Any]) -> dict[str, Any]:
    # JavaScript numbers lose precision above 2^53, so Publisher sends such integers as strings.
    return {k: str(v) if _big_int(v) else v for k, v in row.items()}


def _big_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SAFE_INTEGER


def _schema(rows: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(rows[0]) if rows else []
    return {"fields": [{"kind": "dimension", "name": n} for n in names]}


# --- the stubs -------------------------------------------------------------------------------


def _stub(tool: str) -> Callable[[FakePublisher, dict[str, Any]], CallToolResult]:
    def answer(publisher: FakePublisher, args: dict[str, Any]) -> CallToolResult:
        uri = _uri(tool, env=args.get("environmentName"), package=args.get("packageName"))
        payloads: dict[str, Any] = {
            "malloy_searchDocs": {"results": []},
            "malloy_compile": {"status": "ok", "problems": []},
            "malloy_reloadPackage": {"status": "reloaded", "packageName": args.get("packageName")},
            "malloy_searchDatabaseSchema": {"results": []},
            "malloy_getStatus": {"operationalState": "serving", "loadErrors": []},
        }
        return resource_result(uri, payloads[tool])

    return answer


HANDLERS: dict[str, Callable[[FakePublisher, dict[str, Any]], CallToolResult]] = {
    QUERY_TOOL: execute_query,
    CONTEXT_TOOL: get_context,
    **{name: _stub(name) for name in TOOL_NAMES[2:]},
}


# --- the server ------------------------------------------------------------------------------


def build_fake_publisher(publisher: FakePublisher) -> MCPServer:
    """An MCPServer serving `publisher` with Publisher's tool names, schemas and shapes."""
    from mcp.server.mcpserver import MCPServer

    class _FakePublisherServer(MCPServer):
        async def list_tools(self) -> list[Any]:
            # MCPServer derives schemas from signatures; show Publisher's own instead.
            tools = await super().list_tools()
            return [t.model_copy(update={"input_schema": SCHEMAS[t.name]}) for t in tools]

    server = _FakePublisherServer(
        "malloy-publisher-mcp-server",
        instructions="Start with malloy_getContext to discover environments, packages and "
        "sources, then run Malloy with malloy_executeQuery.",
        version="0.0.1",
    )
    for name in TOOL_NAMES:
        server.add_tool(
            _tool_function(publisher, name),
            name=name,
            description=DESCRIPTIONS[name],
            structured_output=False,
        )
    return server


def _tool_function(publisher: FakePublisher, tool: str) -> Callable[..., Any]:
    # Every Publisher argument, loosely typed, so our own validation (not pydantic's) decides
    # what is rejected and how: Publisher rejects schema violations as JSON-RPC errors.
    async def call(
        environmentName: Any = None,
        packageName: Any = None,
        modelPath: Any = None,
        query: Any = None,
        queryName: Any = None,
        sourceName: Any = None,
        filterParams: Any = None,
        givens: Any = None,
        limit: Any = None,
    ) -> Any:
        given = {
            "environmentName": environmentName,
            "packageName": packageName,
            "modelPath": modelPath,
            "query": query,
            "queryName": queryName,
            "sourceName": sourceName,
            "filterParams": filterParams,
            "givens": givens,
            "limit": limit,
        }
        args = {k: v for k, v in given.items() if v is not None}
        publisher.calls.append((tool, args))
        _invalid_params(tool, args)
        return HANDLERS[tool](publisher, args)

    call.__name__ = tool
    return call


def load_fake(model: Path | None, script: Path | None, **options: Any) -> FakePublisher:
    """A FakePublisher from a `.malloy` or entities `.json` file and a script `.json` file."""
    entities: list[dict[str, Any]] = []
    if model is not None:
        text = model.read_text(encoding="utf-8")
        entities = json.loads(text) if model.suffix == ".json" else entities_from_malloy(text)
        options.setdefault(
            "model_path", model.name if model.suffix == ".malloy" else "model.malloy"
        )
    loaded = Script()
    if script is not None:
        loaded = Script.from_data(json.loads(script.read_text(encoding="utf-8")))
    return FakePublisher(entities=entities, script=loaded, **options)


async def serve_http(server: MCPServer, host: str, port: int) -> None:
    """Serve stateless streamable HTTP at /mcp; print the URL line once the port is bound."""
    import uvicorn

    app = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    web = uvicorn.Server(config)
    task = asyncio.create_task(web.serve())
    while not web.started:
        if task.done():
            await task  # the bind failed: let its error out
            return
        await asyncio.sleep(0.02)
    bound = web.servers[0].sockets[0].getsockname()[1]
    print(f"{URL_LINE_PREFIX}http://{host}:{bound}/mcp", flush=True)
    await task


def main(argv: list[str] | None = None) -> int:
    """Command line: serve the fake over streamable HTTP (default) or stdio."""
    parser = argparse.ArgumentParser(prog="python -m pytest_evalloop.testing.fake_publisher")
    parser.add_argument("--model", type=Path, help=".malloy file, or a JSON list of entities")
    parser.add_argument("--script", type=Path, help='JSON {"queries": {query: rows}, "default"}')
    parser.add_argument("--port", type=int, default=4040, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--transport", choices=("http", "stdio"), default="http")
    parser.add_argument("--environment", default="local")
    parser.add_argument("--package", default="ecommerce")
    parser.add_argument("--row-limit", type=int, default=DEFAULT_ROW_LIMIT)
    parser.add_argument("--max-response-chars", type=int, default=MAX_RESPONSE_CHARS)
    parser.add_argument("--served-revision", help="report this servedRevision (per load)")
    parser.add_argument("--source-content-sha", help="report this sourceContentSha")
    args = parser.parse_args(argv)
    # The SDK logs every stateless request at INFO; a fake should be quiet unless it fails.
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("mcp").setLevel(logging.WARNING)
    publisher = load_fake(
        args.model,
        args.script,
        environment=args.environment,
        package=args.package,
        row_limit=args.row_limit,
        max_response_chars=args.max_response_chars,
        served_revision=args.served_revision,
        source_content_sha=args.source_content_sha,
    )
    server = build_fake_publisher(publisher)
    if args.transport == "stdio":
        server.run("stdio")
        return 0
    try:
        asyncio.run(serve_http(server, args.host, args.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
