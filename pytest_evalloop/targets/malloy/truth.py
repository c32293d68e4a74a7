"""Golden queries on a set's truth package, through a second Malloy server of the same kind.

Seed 004's rule: a golden is never derived from the model under test. A Malloy set names a
truth package (semantics-free sources over the same table files); its `canonicalQuery` runs
there, on a server process of its own that the answerer's session is never given. `rows` is
synchronous (the golden check, `--eval-verify-goldens` and the golden side door call it from
plain code): the server lives on a private event loop in a daemon thread. The same client runs
a case's `modelQuery` on the answerer's package for `evalloop golden promote` (`PackageQueries`
over that package, SQL refused).

A golden's second derivation (`verification.secondQuery`) may be SQL instead of Malloy: text
that starts with SELECT or WITH runs on DuckDB (Python's, no Malloy compiler in between) over
the truth package's own table files, one view per truth source under the source's name. So the
two derivations share neither the query language nor the compiler, only the data.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path
from typing import Any

from pytest_evalloop.targets.malloy.package import (
    MalloyError,
    ServedPackage,
    check_package,
    served_problem,
    server_parameters,
)
from pytest_evalloop.targets.target import client_transport

_TABLE = re.compile(r"""duckdb\s*\.\s*table\s*\(\s*(['"])(.*?)\1\s*\)""")
_TRUTH_SOURCE = re.compile(
    r"""source\s*:\s*([A-Za-z_][A-Za-z_0-9]*)\s+is\s+duckdb\s*\.\s*table\s*\(\s*(['"])(.*?)\2\s*\)"""
)
_SQL = re.compile(r"^\s*(?:--[^\n]*\n\s*)*(?:select|with)\b", re.IGNORECASE)
CALL_TIMEOUT_S = 300.0


def is_sql(query: str) -> bool:
    """Whether a truth query is SQL (starts with SELECT or WITH; a Malloy query never does)."""
    return _SQL.match(query) is not None


def truth_sources(truth_root: Path, model_path: str) -> dict[str, str]:
    """table path → the truth model's source over it (`source: x is duckdb.table('p')`)."""
    text = (truth_root / model_path).read_text(encoding="utf-8")
    return {m.group(3): m.group(1) for m in _TRUTH_SOURCE.finditer(text)}


def rewrite_tables(query: str, sources: dict[str, str]) -> str:
    """`duckdb.table('<path>')` → the truth source over `<path>` (restricted mode refuses the
    table form in query text; a path no truth source covers is left for the compiler to name)."""
    return _TABLE.sub(lambda m: sources.get(m.group(2), m.group(0)), query)


class TruthUnavailable(MalloyError):
    """The truth package cannot be served (it does not compile, its tables are missing): no
    golden can be verified on it. The message says why and what to run."""


class PackageQueries:
    """One package's server, queried synchronously (implements `.rows(query)` and `close()`).

    `sql` lets a query starting with SELECT or WITH run on DuckDB over the package's table files
    (a truth package's second derivations); the answerer's package never gets it.
    """

    def __init__(
        self, package: ServedPackage, *, sql: bool = False, data_from: Path | None = None
    ) -> None:
        key = "truthModelPath" if sql else "target.modelPath"
        problem = served_problem(package, data_from=data_from, model_key=key)
        if problem:
            raise TruthUnavailable(problem)
        self.package = package
        self.root = package.root
        self.model_path = package.model_path
        self.name = check_package(self.root).pins.get("package") or self.root.name
        self.tables = truth_sources(self.root, self.model_path)
        self.sources = self.tables if package.table_rewrite else {}
        self.sql = sql
        self._sql: Any = None
        self._rows: dict[str, list[dict[str, Any]]] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._runner: Any = None

    def rows(self, query: str) -> list[dict[str, Any]]:
        """The rows of `query` on the truth package (each distinct query run once)."""
        if query not in self._rows:
            if self.sql and is_sql(query):
                self._rows[query] = self._run_sql(query)
            else:
                future = asyncio.run_coroutine_threadsafe(self._run(query), self._loop)
                self._rows[query] = future.result(CALL_TIMEOUT_S)
        return self._rows[query]

    def _run_sql(self, query: str) -> list[dict[str, Any]]:
        import duckdb

        from pytest_evalloop.targets.embedded.goldens import fetch_rows

        if self._sql is None:
            con = duckdb.connect(":memory:")
            con.execute("SET enable_progress_bar = false")
            for path, source in sorted(self.tables.items()):
                table = self.root / path
                if not table.is_file():
                    raise ValueError(f"truth source {source}: {table} does not exist")
                quoted = str(table).replace("'", "''")  # a view cannot take a parameter
                con.execute(f"CREATE VIEW \"{source}\" AS SELECT * FROM read_parquet('{quoted}')")
            self._sql = con
        try:
            return fetch_rows(self._sql, query)
        except duckdb.Error as exc:
            raise ValueError(f"SQL on the truth tables: {exc}") from exc

    async def _run(self, query: str) -> list[dict[str, Any]]:
        client = await self._connect()
        text = rewrite_tables(query, self.sources)
        result = await client.call_tool(
            "malloy_executeQuery",
            {
                "environmentName": self.package.environment,
                "packageName": self.name,
                "modelPath": self.model_path,
                "query": text,
            },
        )
        payload = _payload(result)
        if result.is_error:
            message = payload.get("error") if isinstance(payload, dict) else None
            raise ValueError(message or _text(result))
        rows = payload.get("rows") if isinstance(payload, dict) else None
        if not isinstance(rows, list):
            raise ValueError(f"the truth server returned no rows: {_text(result)[:300]}")
        return rows

    async def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        from mcp import Client

        from pytest_evalloop.steps import announce

        announce(f"starting the Malloy server of the truth package {self.root}")
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()

        async def own(stop: asyncio.Event) -> None:
            try:
                async with Client(
                    client_transport(server_parameters(self.root, self.package.environment)),
                    mode="legacy",
                    read_timeout_seconds=CALL_TIMEOUT_S,
                ) as client:
                    ready.set_result(client)
                    await stop.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise

        self._runner = asyncio.ensure_future(own(self._stop))
        self._client = await ready
        return self._client

    def close(self) -> None:
        """Stop the truth server and its thread."""
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._runner is not None:

            async def wait() -> None:
                await asyncio.wait([self._runner], timeout=10.0)

            asyncio.run_coroutine_threadsafe(wait(), self._loop).result(15.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        self._client = None
        if self._sql is not None:
            self._sql.close()
            self._sql = None


def _payload(result: Any) -> Any:
    for block in result.content:
        resource = getattr(block, "resource", None)
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            try:
                return json.loads(text)
            except ValueError:
                return None
    return None


def _text(result: Any) -> str:
    return "\n".join(str(getattr(b, "text", "")) for b in result.content if getattr(b, "text", ""))
