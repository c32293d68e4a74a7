"""The answerer-facing query path of the embedded target.

This module is a security boundary. The answerer must stay blind: it may read the model's
sources and nothing else -- no files (so no gold artifact and nothing under ``evals/``), no
network, no extensions, no settings, no other database. Two layers enforce that:

1. DuckDB itself. The sandbox database is a private in-memory instance; once the sources are
   loaded, external access, extension loading and configuration changes are switched off and the
   configuration is locked. This is the real barrier: a query that slips past layer 2 still
   cannot open a file.
2. A policy check on DuckDB's own parse tree (``extract_statements`` for the statement kind,
   ``json_serialize_sql`` for the tree). It exists to give a clear, early refusal naming what was
   refused, instead of a raw engine error.

A time limit interrupts runaway queries and a row cap bounds what comes back.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    import duckdb

    from pytest_evalloop.embedded.model import SemanticModel

__all__ = ["QueryFailed", "QueryRefused", "QueryResult", "Sandbox", "json_safe"]

# Table functions that only generate or reshape values; every other table function (file
# readers, metadata listings, profiling switches, nested-SQL runners) is refused.
ALLOWED_TABLE_FUNCTIONS = frozenset(
    {"range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree"}
)
# Functions refused wherever they appear. Metadata functions (duckdb_*, pragma_*) are refused
# too: they reveal settings and the engine's environment, which the answerer does not need --
# the context tool describes the model, and DESCRIBE / SHOW TABLES describe the relations.
DENIED_FUNCTION_PREFIXES = (
    "read_",
    "duckdb_",
    "pragma_",
    "parquet_",
    "sniff_",
    "json_execute",
    "iceberg_",
    "delta_",
    "sqlite_",
    "postgres_",
    "mysql_",
)
DENIED_FUNCTIONS = frozenset(
    {
        "glob",
        "query",
        "query_table",
        "current_setting",
        "getvariable",
        "getenv",
        "which_secret",
        "copy_database",
        "import_database",
        "enable_profile",
        "disable_profile",
        "database_size",
        "database_list",
        "show_databases",
        "json_deserialize_sql",
        "checkpoint",
        "force_checkpoint",
        "seq_scan",
        "arrow_scan",
        "pandas_scan",
        "python_map_function",
    }
)
# `SHOW TABLES` and `SHOW ALL TABLES` only list this private database's relations.
ALLOWED_SHOW_SPECIAL = frozenset({'"tables"', "tables", "__show_tables_expanded"})
PATH_MARKERS = ("/", "\\", ".", ":", "~")
# DuckDB files several keywords under one statement type; name them the way users write them.
STATEMENT_NAMES = {
    "LOAD": "INSTALL/LOAD",
    "SET": "SET/RESET/USE",
    "CALL": "CALL/CHECKPOINT",
    "MULTI": "PIVOT/multi-part",
    "COPY_DATABASE": "COPY DATABASE",
}


class QueryRefused(Exception):
    """The sandbox refused a query; the message is a clear reason meant for the answerer."""


class QueryFailed(QueryRefused):
    """The query was allowed but the database rejected it (syntax, unknown column, ...)."""


class QueryResult(BaseModel):
    """Rows of one query, JSON-safe, bounded by the row cap."""

    columns: list[str]
    rows: list[dict[str, Any]]
    row_count: int
    row_cap_hit: bool
    elapsed_ms: float


class Sandbox:
    """A locked-down, private DuckDB database holding the model's sources.

    Thread-safe: every query runs on its own cursor.
    """

    def __init__(
        self,
        model: SemanticModel,
        data_dir: Path,
        *,
        row_cap: int = 1000,
        timeout_s: float = 10.0,
    ) -> None:
        if row_cap < 1:
            raise ValueError(f"row_cap must be at least 1, got {row_cap}; pass a positive cap")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}; pass e.g. 10.0")
        self.row_cap = row_cap
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._con = _open_locked_database(model, Path(data_dir))
        self._catalog = _scalar(self._con, "SELECT current_database()")
        self.relations = _relation_names(self._con)

    def execute(self, sql: str) -> QueryResult:
        """Run one read-only SELECT; raise `QueryRefused` with the reason when not allowed."""
        started = time.perf_counter()
        cur = self._cursor()
        try:
            check_query(cur, sql, relations=self.relations, catalog=self._catalog)
            columns, raw_rows = self._run(cur, sql)
        finally:
            cur.close()
        cap_hit = len(raw_rows) > self.row_cap
        rows = [_row_dict(columns, r) for r in raw_rows[: self.row_cap]]
        return QueryResult(
            columns=columns,
            rows=rows,
            row_count=len(rows),
            row_cap_hit=cap_hit,
            elapsed_ms=round((time.perf_counter() - started) * 1000, 3),
        )

    async def execute_async(self, sql: str) -> QueryResult:
        """`execute` on a worker thread, so an event loop stays responsive."""
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.execute, sql)

    def close(self) -> None:
        """Release the database."""
        self._con.close()

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        # Creating cursors is the only use of the shared connection object; guard it.
        with self._lock:
            return self._con.cursor()

    def _run(
        self, cur: duckdb.DuckDBPyConnection, sql: str
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        import duckdb

        timer = threading.Timer(self.timeout_s, cur.interrupt)
        timer.daemon = True
        timer.start()
        try:
            cur.execute(sql)
            columns = [d[0] for d in cur.description or []]
            # One row past the cap tells us the cap was hit without fetching everything.
            raw_rows = cur.fetchmany(self.row_cap + 1)
        except duckdb.InterruptException:
            raise QueryRefused(
                f"query stopped: it ran past the time limit of {self.timeout_s:g} s; "
                "aggregate or filter more so it finishes sooner"
            ) from None
        except duckdb.PermissionException as exc:
            raise QueryRefused(
                "query refused: it tried to reach something outside the model's sources "
                f"({_first_line(exc)}); query only the sources listed by get_context"
            ) from None
        except duckdb.Error as exc:
            raise QueryFailed(f"query failed: {_first_line(exc, keep=6)}") from None
        finally:
            timer.cancel()
        return _unique_columns(columns), raw_rows


def _open_locked_database(model: SemanticModel, data_dir: Path) -> duckdb.DuckDBPyConnection:
    import duckdb

    from pytest_evalloop.embedded.model import install_sources

    # A fresh ":memory:" connection is a private database instance: nothing else in the process
    # (the truth connection included) is attached to it or reachable from it. Python replacement
    # scans would let `FROM some_name` read a Python variable of a calling frame, so they are off
    # from the start, for every cursor. An empty temp_directory stops spilling to disk, and a
    # memory limit turns a query that would exhaust the machine into an ordinary error.
    config: dict[str, str | bool | int | float | list[str]] = {
        "python_enable_replacements": False,
        "temp_directory": "",
        "memory_limit": "2GB",
    }
    con = duckdb.connect(":memory:", config=config)
    install_sources(con, model, data_dir)
    for statement in (
        "SET enable_external_access = false",
        "SET allow_community_extensions = false",
        "SET autoinstall_known_extensions = false",
        "SET autoload_known_extensions = false",
        "SET lock_configuration = true",
    ):
        con.execute(statement)
    return con


def _relation_names(con: duckdb.DuckDBPyConnection) -> frozenset[str]:
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' AND NOT internal "
        "UNION SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' AND NOT internal"
    ).fetchall()
    return frozenset(str(r[0]).lower() for r in rows)


def _scalar(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    row = con.execute(sql).fetchone()
    return str(row[0]) if row else ""


def check_query(
    cur: duckdb.DuckDBPyConnection, sql: str, *, relations: frozenset[str], catalog: str
) -> None:
    """Refuse anything but one SELECT over the given relations, with allowed functions only."""
    import duckdb

    if not sql.strip():
        raise QueryRefused("query refused: the SQL is empty; send one SELECT statement")
    try:
        statements = cur.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryFailed(f"query failed to parse: {_first_line(exc, keep=6)}") from None
    if len(statements) != 1:
        raise QueryRefused(
            f"query refused: found {len(statements)} statements; send exactly one SELECT "
            "statement (no ';'-separated batches)"
        )
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        shown = STATEMENT_NAMES.get(kind.name, kind.name)
        raise QueryRefused(
            f"query refused: {shown} statements are not allowed; the query tool is "
            "read-only and runs a single SELECT (WITH ... SELECT, FROM ..., DESCRIBE and "
            "SUMMARIZE are fine)"
        )
    tree = _parse_tree(cur, sql)
    check_tree(tree, relations=relations, catalog=catalog)


def _parse_tree(cur: duckdb.DuckDBPyConnection, sql: str) -> dict[str, Any]:
    row = cur.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    tree: dict[str, Any] = json.loads(row[0]) if row else {"error": True}
    if tree.get("error"):
        # Not serialisable means we cannot vouch for it; refuse rather than guess.
        message = tree.get("error_message", "unknown parse error")
        raise QueryRefused(
            f"query refused: it could not be checked ({message}); use a plain SELECT"
        )
    return tree


def check_tree(tree: dict[str, Any], *, relations: frozenset[str], catalog: str) -> None:
    """Walk a `json_serialize_sql` tree and refuse disallowed functions and relations."""
    ctes = {name.lower() for name in _cte_names(tree)}
    for node in _nodes(tree):
        node_type = node.get("type")
        if node.get("class") == "FUNCTION":
            _check_function(str(node.get("function_name", "")))
        elif node_type == "TABLE_FUNCTION":
            _check_table_function(node)
        elif node_type == "BASE_TABLE":
            _check_relation(node, relations=relations, ctes=ctes, catalog=catalog)
        elif node_type == "SHOW_REF" and node.get("show_type") == "SHOW_SPECIAL":
            if str(node.get("table_name", "")).lower() not in ALLOWED_SHOW_SPECIAL:
                raise QueryRefused(
                    f"query refused: SHOW {node.get('table_name')} is not allowed; use SHOW "
                    "TABLES or DESCRIBE <source>"
                )


def _check_function(name: str) -> None:
    lowered = name.lower()
    if lowered in DENIED_FUNCTIONS or lowered.startswith(DENIED_FUNCTION_PREFIXES):
        raise QueryRefused(
            f"query refused: function {name}() is not available; it reads files, settings or "
            "engine metadata. Query the model's sources by name instead"
        )


def _check_table_function(node: dict[str, Any]) -> None:
    function = node.get("function") or {}
    name = str(function.get("function_name", "?"))
    if name.lower() not in ALLOWED_TABLE_FUNCTIONS:
        allowed = ", ".join(sorted(ALLOWED_TABLE_FUNCTIONS))
        raise QueryRefused(
            f"query refused: table function {name}() is not available (allowed: {allowed}); "
            "read data from the model's sources by name"
        )


def _check_relation(
    node: dict[str, Any], *, relations: frozenset[str], ctes: set[str], catalog: str
) -> None:
    name = str(node.get("table_name", ""))
    schema = str(node.get("schema_name", "")).lower()
    db = str(node.get("catalog_name", "")).lower()
    if not schema and not db and name.lower() in ctes:
        return
    # `memory.orders` parses as schema "memory"; DuckDB resolves it to the catalogue's main.
    schema_ok = schema in ("", "main") or (not db and schema == catalog.lower())
    qualified_ok = db in ("", catalog.lower()) and schema_ok
    if qualified_ok and name.lower() in relations:
        return
    if any(marker in name for marker in PATH_MARKERS):
        raise QueryRefused(
            f"query refused: {name!r} looks like a file or URL; the query tool reads only the "
            "model's sources, referenced by name"
        )
    shown = ".".join(p for p in (db, schema, name) if p)
    available = ", ".join(sorted(relations)) or "(none)"
    raise QueryRefused(
        f"query refused: relation {shown} is not one of the model's sources; available: "
        f"{available}. Call get_context to see what each holds"
    )


def _nodes(tree: Any) -> Iterator[dict[str, Any]]:
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _cte_names(tree: Any) -> Iterator[str]:
    for node in _nodes(tree):
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict):
            for entry in cte_map.get("map", []):
                yield str(entry.get("key", ""))


def _unique_columns(columns: list[str]) -> list[str]:
    # Rows become dicts, so `SELECT 1 AS a, 2 AS a` would silently lose a column otherwise.
    seen: dict[str, int] = {}
    unique = []
    for name in columns:
        count = seen.get(name, 0)
        seen[name] = count + 1
        unique.append(name if count == 0 else f"{name}_{count + 1}")
    return unique


def _row_dict(columns: list[str], row: tuple[Any, ...]) -> dict[str, Any]:
    return {name: json_safe(value) for name, value in zip(columns, row, strict=True)}


def json_safe(value: Any) -> Any:
    """Turn a DuckDB value into something `json.dumps` accepts, losing as little as possible."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        # NaN and infinity are not JSON; say what they were rather than dropping them.
        return value if math.isfinite(value) else str(value)
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [json_safe(v) for v in value]
    return str(value)


def _first_line(exc: BaseException, keep: int = 1) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:keep]) or type(exc).__name__
