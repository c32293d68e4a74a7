"""The answerer-facing query path of the embedded target.

This module is a security boundary. The answerer must stay blind: it may read the model's
sources and nothing else -- no files (so no gold artifact and nothing under ``evals/``), no
network, no extensions, no settings, no other database. Two layers enforce that:

1. DuckDB itself. The sandbox database is the model's read-only snapshot file (see
   `snapshot.py`), opened with external access, extension loading and configuration changes
   switched off and the configuration locked from the first moment. This is the real barrier: a
   query that slips past layer 2 still cannot open a file or write anything.
2. A policy check on DuckDB's own parse tree (``extract_statements`` for the statement kind,
   ``json_serialize_sql`` for the tree). It exists to give a clear, early refusal naming what was
   refused, instead of a raw engine error.

The queries themselves run in a child process (`query_host.py` runs it, `query_child.py` is its
side), where the memory limit is
held by the kernel, the time limit by killing the child if an interrupt is not enough, and the
reply's size by a row cap and a byte cap; breaking a limit costs only the query.

The policy check is a pure function of the SQL text (the relations and catalogue are fixed per
sandbox), so each sandbox remembers the texts that passed it in a bounded memo: the conductor's
re-execution of a query the answerer just ran is not parsed and walked twice.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from pytest_evalloop.targets.embedded.query_host import QueryHost
from pytest_evalloop.targets.embedded.query_limits import HostError, Limits, locked_config

if TYPE_CHECKING:
    import duckdb

    from pytest_evalloop.targets.embedded.model import SemanticModel

__all__ = ["BoundedMemo", "QueryFailed", "QueryRefused", "QueryResult", "Sandbox"]

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
# Functions whose value changes from one run of the same SQL to the next (random numbers, the
# clock, sequences): a query using one is not repeatable, so its rows are never memoised.
VOLATILE_FUNCTIONS = frozenset(
    {
        "random",
        "setseed",
        "uuid",
        "gen_random_uuid",
        "uuidv4",
        "uuidv7",
        "nextval",
        "currval",
        "now",
        "today",
        "current_date",
        "current_time",
        "current_timestamp",
        "current_localtime",
        "current_localtimestamp",
        "localtime",
        "localtimestamp",
        "get_current_time",
        "get_current_timestamp",
        "transaction_timestamp",
        "txid_current",
    }
)
# Bounds of the per-sandbox memo of SQL texts that passed the policy check.
CHECK_MEMO_ENTRIES = 4096
CHECK_MEMO_BYTES = 4 * 1024 * 1024
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
    """Rows of one query, JSON-safe, bounded by the row cap and the byte cap."""

    columns: list[str]
    rows_json: str
    """The rows as a JSON array, as the query process wrote them (the tool's reply uses them
    as they are; `rows` parses them on first use)."""
    row_count: int
    row_cap_hit: bool
    elapsed_ms: float
    byte_cap_hit: bool = False
    """Whether rows were left out because the reply reached its byte cap."""
    repeatable: bool = True
    """Whether the same SQL on the same sandbox always gives these rows (no random or clock
    function, no sampling): only then may a caller reuse them instead of running it again."""

    @functools.cached_property
    def rows(self) -> list[dict[str, Any]]:
        """The rows, one dict per row."""
        rows: list[dict[str, Any]] = json.loads(self.rows_json)
        return rows


class BoundedMemo:
    """A thread-safe least-recently-used map bounded in entries and in total size.

    Callers give each value's size (bytes, roughly); a value larger than the whole budget is
    simply not kept.
    """

    def __init__(self, *, max_entries: int, max_bytes: int) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(
                f"max_entries and max_bytes must be positive, got {max_entries}, {max_bytes}"
            )
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> Any | None:
        """The value stored under `key` (now the most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: str, value: Any, size: int) -> None:
        """Store `value`, evicting the least recently used entries to stay within bounds."""
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, size)
            self._bytes += size
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size(self) -> int:
        """Total size of the stored values."""
        return self._bytes


class Sandbox:
    """A locked-down, read-only DuckDB database holding the model's sources.

    The policy check runs here, on a connection that only parses; the queries that pass it run
    in a child process under `limits` (see `query_host.py`). Thread-safe.
    """

    def __init__(
        self,
        model: SemanticModel,
        data_dir: Path,
        *,
        row_cap: int = 1000,
        timeout_s: float = 10.0,
        memory_mb: int = 2048,
        reply_bytes: int = 1_000_000,
    ) -> None:
        if row_cap < 1:
            raise ValueError(f"row_cap must be at least 1, got {row_cap}; pass a positive cap")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}; pass e.g. 10.0")
        self.limits = Limits(
            timeout_s=timeout_s, row_cap=row_cap, reply_bytes=reply_bytes, memory_mb=memory_mb
        )
        self.row_cap = row_cap
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        path, self._con = _open_locked_database(model, Path(data_dir))
        self._catalog = _scalar(self._con, "SELECT current_database()")
        self.relations = _relation_names(self._con)
        # SQL text -> whether it is repeatable, for texts that passed check_query. Sound because
        # the check depends only on the text, the relations and the catalogue, and the last two
        # never change for this sandbox. Refusals are not kept: they are rare and cheap.
        self._checked = BoundedMemo(max_entries=CHECK_MEMO_ENTRIES, max_bytes=CHECK_MEMO_BYTES)
        self._host = QueryHost(path, self.limits)
        self._closed = False

    def execute(self, sql: str) -> QueryResult:
        """Run one read-only SELECT; raise `QueryRefused` with the reason when not allowed."""
        started = time.perf_counter()
        if self._closed:
            raise QueryFailed("query failed: the query tool was closed")
        repeatable = self._checked.get(sql)
        if repeatable is None:
            cur = self._cursor()
            try:
                repeatable = check_query(cur, sql, relations=self.relations, catalog=self._catalog)
            finally:
                cur.close()
            self._checked.put(sql, repeatable, len(sql))
        reply = self.run_unchecked(sql)
        return QueryResult(
            columns=reply["columns"],
            rows_json=reply["rowsJson"],
            row_count=reply["rowCount"],
            row_cap_hit=reply["rowCapHit"],
            byte_cap_hit=reply["byteCapHit"],
            elapsed_ms=round((time.perf_counter() - started) * 1000, 3),
            repeatable=repeatable,
        )

    def run_unchecked(self, sql: str) -> dict[str, Any]:
        """Run `sql` in the query process without the policy check (the engine's locks and the
        limits still hold): `execute` after its check, and tests of the engine barrier."""
        try:
            return self._host.run(sql)
        except HostError as exc:
            raise (QueryRefused if exc.refused else QueryFailed)(str(exc)) from None

    async def execute_async(self, sql: str) -> QueryResult:
        """`execute` on a worker thread, so an event loop stays responsive."""
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.execute, sql)

    @property
    def query_pid(self) -> int:
        """The process id of the child running this sandbox's queries now."""
        return self._host.pid

    def close(self) -> None:
        """Release the database and stop the query process."""
        self._closed = True
        self._host.close()
        self._con.close()

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        # Creating cursors is the only use of the shared connection object; guard it.
        with self._lock:
            return self._con.cursor()


def _open_locked_database(
    model: SemanticModel, data_dir: Path
) -> tuple[Path, duckdb.DuckDBPyConnection]:
    import duckdb

    from pytest_evalloop.targets.embedded.snapshot import snapshot_path

    # The model's relations come from its read-only snapshot file, which holds nothing else (the
    # raw tables were dropped before it was written); the truth connection is a different
    # database instance that nothing here can name. This connection only reads the catalogue
    # and parses (the query process opens the file with the same locks); it is locked all the
    # same. DuckDB gives every connection to one file in one process the same instance, so
    # these settings must be the same for every sandbox (they are: none depends on the caller).
    config = locked_config(2048)
    path = snapshot_path(model, data_dir)
    try:
        return path, duckdb.connect(str(path), read_only=True, config=config)
    except duckdb.ConnectionException:
        raise  # the file is fine; another connection in this process disagrees on settings
    except duckdb.Error:
        # A damaged cache file (a disk that filled up, a stray edit) is rebuilt, once.
        path.unlink(missing_ok=True)
        path = snapshot_path(model, data_dir)
        return path, duckdb.connect(str(path), read_only=True, config=config)


def _relation_names(con: duckdb.DuckDBPyConnection) -> frozenset[str]:
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND NOT internal UNION SELECT view_name FROM duckdb_views() "
        "WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal"
    ).fetchall()
    return frozenset(str(r[0]).lower() for r in rows)


def _scalar(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    row = con.execute(sql).fetchone()
    return str(row[0]) if row else ""


def check_query(
    cur: duckdb.DuckDBPyConnection, sql: str, *, relations: frozenset[str], catalog: str
) -> bool:
    """Refuse anything but one SELECT over the given relations, with allowed functions only.

    Returns whether the query is repeatable (see `QueryResult.repeatable`).
    """
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
    return check_tree(tree, relations=relations, catalog=catalog)


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


def check_tree(tree: dict[str, Any], *, relations: frozenset[str], catalog: str) -> bool:
    """Walk a `json_serialize_sql` tree and refuse disallowed functions and relations.

    Returns whether the query is repeatable: no volatile function and no sample clause.
    """
    ctes = {name.lower() for name in _cte_names(tree)}
    repeatable = True
    for node in _nodes(tree):
        node_type = node.get("type")
        if node.get("sample") or _is_clock_keyword(node):
            repeatable = False
        if node.get("class") == "FUNCTION":
            name = str(node.get("function_name", ""))
            _check_function(name)
            if name.lower() in VOLATILE_FUNCTIONS:
                repeatable = False
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
    return repeatable


def _is_clock_keyword(node: dict[str, Any]) -> bool:
    # `current_date`, `localtimestamp` and friends parse as column references and only become
    # the clock when binding finds no such column; a real column of that name is merely not
    # memoised.
    if node.get("class") != "COLUMN_REF":
        return False
    names = node.get("column_names") or []
    return bool(names) and str(names[-1]).lower() in VOLATILE_FUNCTIONS


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


def _first_line(exc: BaseException, keep: int = 1) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:keep]) or type(exc).__name__
