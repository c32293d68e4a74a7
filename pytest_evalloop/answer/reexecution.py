"""What became of an attempt's final query when the conductor ran it again: one rule.

The conductor re-runs the answerer's final query as the answerer's own call
(:func:`reexecute`), and :func:`reexecution_state` names what came of it, once, for the judge's
prompt, the failure report and the attempt event alike:

- `ok`: rows, from a query the answerer ran itself;
- `unran`: rows, from a declared final query the answerer never ran in its transcript, so its
  answer was not read from them;
- `literal`: rows that hold only values written in the query text itself (`SELECT 72482 AS
  orders`, or a table read for a constant: :func:`constants_only`), or a SQL query every
  result column of which DuckDB's parser shows is built from constants alone (`SELECT 72480 +
  2`: :func:`reads_no_data`): the query read nothing it did not already say, so its rows are
  no evidence from the data;
- `failed`: the target answered the re-run with an error;
- `not_run`: the query was not run (why is given); `no_query`: there was none.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import threading
from typing import Any

from pytest_evalloop.judge.judge import ReExecution
from pytest_evalloop.roles.contract import FinalCall, QueryOutcome, TargetSession

ROWS_CHECKED = 50
"""How many rows :func:`constants_only` reads: a query of constants returns few."""

# A number written in the query. Positional and size clauses (`LIMIT 10`, `GROUP BY 1`) are
# removed first: a count of 10 under `LIMIT 10` is no constant of the query.
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])", re.IGNORECASE)
_CLAUSES = re.compile(
    r"\b(?:limit|offset|top|sample)\s+\d+|\b(?:group|order)\s+by\s+[\d\s,]+(?![\w(])",
    re.IGNORECASE,
)


async def reexecute(session: TargetSession, call: FinalCall) -> QueryOutcome:
    """The conductor's own run of the final query: the answerer's call, repeated.

    A user's session whose `execute` predates the `call` argument gets the query text alone.
    """
    assert call.query is not None
    if _takes_call(session.execute):
        return await session.execute(call.query, call=call)
    return await session.execute(call.query)


def _takes_call(method: Any) -> bool:
    # Asked of the function behind a bound method, once each: `inspect.signature` per
    # re-execution was a measurable share of a case's CPU for an answer that never changes.
    function = getattr(method, "__func__", method)
    try:
        return _kept_takes_call(function)
    except TypeError:  # a user's callable object that cannot be hashed: asked each time
        return _function_takes_call(function)


@functools.lru_cache(maxsize=64)
def _kept_takes_call(function: Any) -> bool:
    return _function_takes_call(function)


def _function_takes_call(function: Any) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "call" or p.kind is p.VAR_KEYWORD for p in parameters)


def reexecution_state(
    final_query: str | None, prediction: QueryOutcome | None, *, ran: bool = True
) -> tuple[ReExecution, str | None]:
    """What became of the final query's re-execution, and the error or reason that goes with
    it: the one rule the judge's prompt, the failure report and the attempt event read.

    ``ran``: whether the answerer itself ran the final query (`FinalCall.seq` is set); a stored
    prediction (a judge fixture) is taken as run, since no transcript says otherwise.
    """
    if final_query is None:
        return "no_query", None
    if prediction is None:
        return "not_run", "the final query was not re-executed"
    if prediction.not_run is not None:
        return "not_run", prediction.not_run
    if prediction.error is not None:
        return "failed", prediction.error
    if constants_only(final_query, prediction.rows) or reads_no_data(final_query):
        return "literal", None if ran else "the answerer never ran it either"
    return ("ok", None) if ran else ("unran", None)


def ran_by_answerer(call: FinalCall) -> bool:
    """Whether the final query is one the answerer ran: a replayed call of its transcript, or
    a query it did not declare (the last query call is always one it ran)."""
    return call.seq is not None or call.source != "declared"


def constants_only(query: str, rows: list[dict[str, Any]]) -> bool:
    """Whether every value of the rows is written in the query text itself: the query read
    nothing it did not already say (`SELECT 72482 AS orders`; `SELECT 72482 FROM t LIMIT 1`).

    Numbers are matched as numbers (72482 against `72482.0`), text case-insensitively. At least
    one value must be distinctive (`_distinctive`: not a small whole number, not a word of one
    to three letters): a `1` or an `x` is written in most queries (`> 1`, `rank = 1`), so rows
    of such values alone, or none (no rows, only nulls), are not called constant.
    """
    text = _CLAUSES.sub(" ", query)
    numbers = [float(token) for token in _NUMBER.findall(text)]
    lowered = text.lower()
    distinctive = False
    for row in rows[:ROWS_CHECKED]:
        for value in row.values():
            if value is None:
                continue
            if not _written(value, numbers, lowered):
                return False
            distinctive = distinctive or _distinctive(value)
    return distinctive


def _distinctive(value: Any) -> bool:
    """A value too particular to be in a query by chance: a number of three digits or more,
    or with a fraction; a text of four characters or more."""
    number = _as_number(value)
    if number is not None and not isinstance(value, bool):
        return abs(number) >= 100 or number != int(number)
    return len(str(value)) >= 4


def _written(value: Any, numbers: list[float], lowered: str) -> bool:
    if isinstance(value, bool):
        return str(value).lower() in lowered
    number = _as_number(value)
    if number is not None:
        return any(math.isclose(number, n, rel_tol=1e-9, abs_tol=1e-12) for n in numbers)
    return str(value).lower() in lowered


def _as_number(value: Any) -> float | None:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


# Expression classes of DuckDB's parse tree that read the data: a column, `*`, a subquery, a
# window; and any aggregate function (`count(*)`, `sum(1)` count rows).
_READS = frozenset({"COLUMN_REF", "STAR", "SUBQUERY", "WINDOW", "COLUMNS", "LAMBDA_REF"})


def reads_no_data(query: str) -> bool:
    """Whether DuckDB's parser shows a SQL query reads no data: no table anywhere in it (its
    subqueries, `VALUES` lists and CTEs included: `WITH t AS (SELECT 72481 AS n) SELECT n + 1
    FROM t`), or every result column built from constants alone (no column, no aggregate, no
    subquery: `SELECT 72480 + 2 AS orders FROM orders`). False for a query it does not parse
    as one SELECT (another language: Malloy)."""
    parsed = _parse(query)
    statements = parsed.get("statements") if isinstance(parsed, dict) else None
    if parsed.get("error") or not isinstance(statements, list) or len(statements) != 1:
        return False
    node = statements[0].get("node") or {}
    if not _reads_a_table(node, frozenset(_cte_names(node))):
        return True
    if node.get("type") != "SELECT_NODE" or not node.get("select_list"):
        return False
    aggregates = _duckdb()[1]
    return not any(_reads(column, aggregates) for column in node["select_list"])


# Table functions that make rows from their arguments alone: `FROM range(72482)` reads nothing.
_GENERATORS = frozenset({"range", "generate_series", "unnest"})


def _cte_names(node: Any) -> list[str]:
    """Every CTE name a query defines, at any depth (a reference to one is no table read)."""
    if isinstance(node, list):
        return [name for item in node for name in _cte_names(item)]
    if not isinstance(node, dict):
        return []
    names = [
        str(entry.get("key")).lower() for entry in (node.get("cte_map") or {}).get("map") or []
    ]
    return names + [name for value in node.values() for name in _cte_names(value)]


def _reads_a_table(node: Any, ctes: frozenset[str]) -> bool:
    """Whether the parse tree names a stored table (not one of the query's CTEs) or a table
    function that reads (a file, a catalog), anywhere."""
    if isinstance(node, list):
        return any(_reads_a_table(item, ctes) for item in node)
    if not isinstance(node, dict):
        return False
    kind = node.get("type")
    if kind == "BASE_TABLE":
        named = str(node.get("table_name") or "").lower()
        if node.get("schema_name") or node.get("catalog_name") or named not in ctes:
            return True
    if kind == "TABLE_FUNCTION":
        function = node.get("function") or {}
        if str(function.get("function_name") or "").lower() not in _GENERATORS:
            return True
    return any(_reads_a_table(value, ctes) for value in node.values())


def _reads(node: Any, aggregates: frozenset[str]) -> bool:
    if isinstance(node, list):
        return any(_reads(item, aggregates) for item in node)
    if not isinstance(node, dict):
        return False
    if node.get("class") in _READS:
        return True
    if node.get("class") == "FUNCTION" and str(node.get("function_name")) in aggregates:
        return True
    return any(_reads(value, aggregates) for value in node.values())


def _parse(query: str) -> dict[str, Any]:
    connection, _, lock = _duckdb()
    with lock:  # one in-memory connection, only its parser used, shared by the loop's threads
        row = connection.execute("SELECT json_serialize_sql(?)", [query]).fetchone()
    try:
        parsed = json.loads(row[0]) if row else {}
    except (TypeError, ValueError):
        return {"error": True}
    return parsed if isinstance(parsed, dict) else {"error": True}


@functools.cache
def _duckdb() -> tuple[Any, frozenset[str], threading.Lock]:
    import duckdb

    # One thread: it only parses, and DuckDB's pool costs each statement a hand-off.
    connection = duckdb.connect(":memory:", config={"threads": 1})
    names = connection.execute(
        "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_type = 'aggregate'"
    ).fetchall()
    return connection, frozenset(str(n[0]) for n in names), threading.Lock()


def shown_call(call: dict[str, Any] | None) -> dict[str, Any] | None:
    """The call the conductor made as the judge is shown it: the query text left out (it is
    in its own fence), the rest saying which model and givens were used."""
    if not call:
        return None
    arguments = dict(call.get("arguments") or {})
    arguments.pop(str(call.get("query_arg")), None)
    return {"tool": call.get("tool"), "arguments": arguments}
