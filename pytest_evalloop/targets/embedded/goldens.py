"""Re-deriving goldens: the pure part of `--eval-verify-goldens`.

A golden is trusted only while the truth data still produces it, by two differently shaped
derivations (`canonicalQuery` and `verification.secondQuery`), and while the model's own route
(`modelQuery`, run through the answerer-facing query path) still reaches it. Each route that
disagrees with the stored value becomes one `Drift`.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import re
import threading
from collections.abc import Callable
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel

from pytest_evalloop.sets import cases as sets

if TYPE_CHECKING:
    import duckdb

Route = Literal["canonical", "second", "model"]
ModelQueryRunner = Callable[[str], list[dict[str, Any]]]

#: keys of a scalar golden value that describe it rather than hold a figure
VALUE_META_KEYS = frozenset({"round", "currency", "unit", "note"})
#: golden kinds that carry no value to re-derive
NOTHING_TO_DERIVE = frozenset({"unanswerable", "criteria"})
REL_TOL = 1e-6

_truth_lock = threading.Lock()
_truth_cache: dict[Path, duckdb.DuckDBPyConnection] = {}


class RowSource(Protocol):
    """A truth connection as `verify_case` reads it: a query's rows (SQL here, Malloy for a
    malloy set's truth package)."""

    def rows(self, sql: str) -> list[dict[str, Any]]: ...


class Drift(BaseModel):
    """One route whose derived value disagrees with the stored golden (or could not run).

    `problem` says which: `disagrees` (the route ran and derived another value), `failed` (the
    route could not run) or `unproven` (nothing wrong with the value, but the golden lacks the
    second, differently shaped derivation that proves it).
    """

    qid: str
    route: Route
    stored: Any
    derived: Any
    message: str
    problem: Literal["disagrees", "failed", "unproven"] = "disagrees"


_SQL_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.S)
_SQL_PUNCT = re.compile(r"\s*([(),;=<>+\-*/|.])\s*")


@functools.lru_cache(maxsize=4096)
def query_shape(sql: str) -> str:
    """A query's text with what cannot change its meaning removed: comments, case, spacing and
    a trailing semicolon. Two queries of one shape are one derivation, however they are typed."""
    text = _SQL_COMMENT.sub(" ", sql).casefold()
    text = " ".join(_SQL_PUNCT.sub(r"\1", text).split())
    return text.rstrip("; ")


def _axis(text: Any) -> str:
    return " ".join(str(text or "").split()).casefold()


def derivation_problems(qid: str, golden: dict[str, Any]) -> list[str]:
    """Why a golden is not proven two ways (seed 004), or [] when its two derivations count.

    A golden is proven by its `canonicalQuery` and a second derivation that takes another route
    to the same figure: `verification.secondQuery`, whose text is not the canonical query's
    again (up to case, spacing and comments), with `verification.primaryAxis` and `variesAxis`
    both named and different (what the canonical query rests on, what the second one varies).
    Two derivations that vary the same axis share every other blind spot. Kinds with nothing to
    derive (unanswerable, criteria) have no problems here: a person vouches for them.
    """
    if str(golden.get("kind", "")) in NOTHING_TO_DERIVE:
        return []
    verification = golden.get("verification") or {}
    problems = []
    second = verification.get("secondQuery")
    canonical = golden.get("canonicalQuery")
    if not second:
        problems.append(
            f"case {qid} has no golden.verification.secondQuery; a golden needs a second,"
            " differently shaped derivation on the truth tables"
        )
    elif canonical and query_shape(str(second)) == query_shape(str(canonical)):
        problems.append(
            f"case {qid}: golden.verification.secondQuery is the canonicalQuery again (the same "
            "text up to case, spacing and comments), so it proves nothing; the second derivation "
            "must take another route to the same figure (group by something else, aggregate a "
            "different way, go through other raw tables)"
        )
    elif canonical and query_shape(str(canonical)) in query_shape(str(second)):
        # `SELECT * FROM (<canonical>)` and its kin compute the canonical query's figure and
        # only re-read it: one derivation wrapped, not a second route.
        problems.append(
            f"case {qid}: golden.verification.secondQuery contains the canonicalQuery (it wraps "
            "or re-reads it), so it is the same derivation; the second derivation must compute "
            "the figure by another route, without the canonical query inside it"
        )
    primary, varies = _axis(verification.get("primaryAxis")), _axis(verification.get("variesAxis"))
    missing = [
        name for name, text in (("primaryAxis", primary), ("variesAxis", varies)) if not text
    ]
    if missing:
        problems.append(
            f"case {qid}: golden.verification lacks {', '.join(missing)}; name the axis the "
            "canonical query rests on and the one the second derivation varies"
        )
    elif primary == varies:
        problems.append(
            f"case {qid}: golden.verification names the same axis twice "
            f"({verification.get('primaryAxis')!r}); the second derivation must vary a different "
            "axis to count"
        )
    return problems


def verify_case(
    case: dict[str, Any],
    set_dir: Path,
    *,
    model_query_runner: ModelQueryRunner | None = None,
    truth: RowSource | None = None,
) -> list[Drift]:
    """Re-derive one case's golden and return every disagreement; [] means the golden holds.

    The canonical query is compared with the stored value. The second derivation and the model
    query are compared with what the canonical query derived (the stored value when it could
    not run), so a stale golden is one `canonical` drift rather than three copies of it, and a
    `second` or `model` drift always means that route itself disagrees with the truth.
    `truth`, when given, is the set's truth connection shared by a check over many cases: it
    runs each distinct query once (the truth tables do not change during a check).
    """
    qid = str(case.get("qid", "<no qid>"))
    golden = case.get("golden") or {}
    kind = str(golden.get("kind", ""))
    if kind in NOTHING_TO_DERIVE:
        return []
    try:
        stored = sets.golden_value(set_dir, golden)
    except sets.GoldenArtifactError as exc:
        return [
            Drift(
                qid=qid,
                route="canonical",
                stored=None,
                derived=None,
                message=str(exc),
                problem="failed",
            )
        ]
    canonical = golden.get("canonicalQuery")
    if not canonical:
        msg = (
            f"case {qid} has a {kind or 'kind-less'} golden but no golden.canonicalQuery, so"
            " nothing re-derives it; add the SQL that computes it on the truth tables"
        )
        return [
            Drift(
                qid=qid,
                route="canonical",
                stored=stored,
                derived=None,
                message=msg,
                problem="unproven",
            )
        ]
    truth = truth or TruthQueries(set_dir, cache=False)
    drift, rows = _derive(qid, "canonical", stored, stored, kind, partial(truth.rows, canonical))
    drifts = [drift]
    derived = None if rows is None else _as_value(rows, kind, stored)
    reference = stored if derived is None else derived
    unproven = derivation_problems(qid, golden)
    second = (golden.get("verification") or {}).get("secondQuery")
    if second and query_shape(str(second)) != query_shape(str(canonical)):
        run_second = partial(truth.rows, str(second))
        drifts.append(_derive(qid, "second", stored, reference, kind, run_second)[0])
    drifts += [
        Drift(qid=qid, route="second", stored=stored, derived=None, message=m, problem="unproven")
        for m in unproven
    ]
    model_query = case.get("modelQuery")
    if model_query_runner is not None and model_query:
        run_model = partial(model_query_runner, model_query)
        drifts.append(_derive(qid, "model", stored, reference, kind, run_model)[0])
    return [d for d in drifts if d is not None]


class TruthQueries:
    """A set's truth connection, and (with `cache`) the rows of each query already run on it."""

    def __init__(self, set_dir: Path, *, cache: bool = True) -> None:
        self.data_dir = data_dir_for(set_dir)
        self._rows: dict[str, list[dict[str, Any]]] | None = {} if cache else None

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The truth connection, built on the first query (a check of held goldens runs none)."""
        return cached_truth_connection(self.data_dir)

    def rows(self, sql: str) -> list[dict[str, Any]]:
        """The rows of `sql` on the truth tables."""
        if self._rows is None:
            return fetch_rows(self.con, sql)
        if sql not in self._rows:
            self._rows[sql] = fetch_rows(self.con, sql)
        return self._rows[sql]


def _derive(
    qid: str,
    route: Route,
    stored: Any,
    reference: Any,
    kind: str,
    run: Callable[[], list[dict[str, Any]]],
) -> tuple[Drift | None, list[dict[str, Any]] | None]:
    """Run one route and compare it with `reference`; the Drift reports the stored value."""
    try:
        rows = run()
    except Exception as exc:  # any failure of the query is itself the finding
        msg = f"case {qid}: the {route} query failed: {type(exc).__name__}: {exc}"
        drift = Drift(
            qid=qid, route=route, stored=stored, derived=None, message=msg, problem="failed"
        )
        return drift, None
    why = compare_golden(reference, rows, kind)
    if why is None:
        return None, rows
    against = "the stored golden" if reference is stored else "the canonical derivation"
    msg = f"case {qid}: {route} derivation disagrees with {against}: {why}"
    return Drift(qid=qid, route=route, stored=stored, derived=_shown(rows, kind), message=msg), rows


def _as_value(rows: list[dict[str, Any]], kind: str, stored: Any) -> Any:
    """The canonical rows in the stored value's shape, or None when they cannot take it."""
    clean = [{k: normalize(v) for k, v in row.items()} for row in rows]
    if kind == "rows":
        return clean
    if kind == "scalar" and isinstance(stored, dict) and len(clean) == 1:
        keys = [k for k in stored if k not in VALUE_META_KEYS]
        if all(k in clean[0] for k in keys):
            meta = {k: v for k, v in stored.items() if k in VALUE_META_KEYS}
            return {**{k: clean[0][k] for k in keys}, **meta}
    return None


def _shown(rows: list[dict[str, Any]], kind: str) -> Any:
    clean = [{k: normalize(v) for k, v in row.items()} for row in rows]
    return clean[0] if kind == "scalar" and len(clean) == 1 else clean


def compare_golden(stored: Any, rows: list[dict[str, Any]], kind: str) -> str | None:
    """None when `rows` reproduce the stored golden value, else a sentence saying what differs.

    scalar: one row whose columns named like the value's keys (meta keys such as `round` and
    `currency` aside) hold equal figures; rows: the same multiset of rows over the golden's
    columns, order ignored, extra columns ignored. Numbers compare with relative tolerance 1e-6,
    widened to half a unit of the last place when a scalar golden states `round`.
    """
    if kind == "scalar":
        return _compare_scalar(stored, rows)
    if kind == "rows":
        return _compare_rows(stored, rows)
    if kind in NOTHING_TO_DERIVE:
        return None
    return f"golden kind {kind!r} cannot be compared; use scalar, rows, unanswerable or criteria"


def _compare_scalar(stored: Any, rows: list[dict[str, Any]]) -> str | None:
    if not isinstance(stored, dict):
        return f"a scalar golden value must be an object of named figures, got {stored!r}"
    if len(rows) != 1:
        return f"expected exactly one row, got {len(rows)}"
    places = stored.get("round")
    abs_tol = 0.5 * 10.0 ** -int(places) if isinstance(places, int) else 0.0
    row = rows[0]
    for key, want in stored.items():
        if key in VALUE_META_KEYS:
            continue
        if key not in row:
            return f"column {key!r} is missing; the query returned columns {sorted(row)}"
        got = normalize(row[key])
        if not values_equal(want, got, abs_tol=abs_tol):
            return f"{key}: stored {want!r}, derived {got!r}"
    return None


def _compare_rows(stored: Any, rows: list[dict[str, Any]]) -> str | None:
    if not isinstance(stored, list) or not all(isinstance(r, dict) for r in stored):
        return f"a rows golden value must be a list of row objects, got {stored!r}"
    if len(stored) != len(rows):
        return f"expected {len(stored)} rows, got {len(rows)}"
    if not stored:
        return None
    columns = list(stored[0])
    missing = [c for c in columns if any(c not in row for row in rows)]
    if missing:
        return f"columns {missing} are missing; the query returned columns {sorted(rows[0])}"
    want = sorted(stored, key=lambda r: _sort_key(r, columns))
    got = sorted(
        ({c: normalize(row[c]) for c in columns} for row in rows),
        key=lambda r: _sort_key(r, columns),
    )
    for want_row, got_row in zip(want, got, strict=True):
        for column in columns:
            if not values_equal(want_row.get(column), got_row[column]):
                return f"row {want_row}: stored {want_row}, derived {got_row}"
    return None


def _sort_key(row: dict[str, Any], columns: list[str]) -> tuple[tuple[int, Any], ...]:
    key: list[tuple[int, Any]] = []
    for column in columns:
        value = normalize(row.get(column))
        if value is None:
            key.append((0, ""))
        elif _is_number(value):
            key.append((1, round(float(value), 4)))
        else:
            key.append((2, str(value)))
    return tuple(key)


def values_equal(want: Any, got: Any, *, abs_tol: float = 0.0) -> bool:
    """Equality of two golden cells: numbers within tolerance, everything else exactly."""
    want, got = normalize(want), normalize(got)
    if _is_number(want) and _is_number(got):
        a, b = float(want), float(got)
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=max(abs_tol, 1e-9))
    return bool(want == got)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def normalize(value: Any) -> Any:
    """A JSON-friendly form of a DuckDB cell: Decimal to float, dates to ISO text."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    return value


def fetch_rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    """Run `sql` on a fresh cursor of `con` and return its rows as column-name dicts."""
    cursor = con.cursor()
    try:
        result = cursor.execute(sql)
        names = [d[0] for d in result.description or []]
        return [dict(zip(names, row, strict=True)) for row in result.fetchall()]
    finally:
        cursor.close()


def data_dir_for(set_dir: Path) -> Path:
    """The raw-data directory a set's truth connection reads, from set.json `target.data`.

    `"ecommerce"` (or no target) means the generated embedded dataset; anything else is a folder
    of `<table>.parquet` files relative to the set directory.
    """
    from pytest_evalloop.targets.embedded.data import ensure_data

    set_dir = Path(set_dir)
    meta_path = set_dir / "set.json"
    target: dict[str, Any] = {}
    if meta_path.is_file():
        target = json.loads(meta_path.read_text(encoding="utf-8")).get("target") or {}
    data = target.get("data", "ecommerce")
    if data == "ecommerce":
        return ensure_data()
    folder = (set_dir / str(data)).resolve()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{meta_path}: target.data {data!r} is neither 'ecommerce' nor a folder of parquet"
            f" files ({folder} does not exist); fix target.data"
        )
    return folder


def cached_truth_connection(data_dir: Path) -> duckdb.DuckDBPyConnection:
    """The process-wide truth connection for `data_dir`, built on first use."""
    from pytest_evalloop.targets.embedded.truth import truth_connection

    key = Path(data_dir).resolve()
    with _truth_lock:
        con = _truth_cache.get(key)
        if con is None:
            con = _truth_cache[key] = truth_connection(key)
        return con
