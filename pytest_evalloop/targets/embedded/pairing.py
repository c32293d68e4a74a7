"""Comparing a golden value with a route's rows by value, whatever the route named its columns.

A golden is a set of figures, not a set of column names: `{"buyers": 101740}` is reproduced by
a query that returns `user_count = 101740`, and a model that names its measure differently has
not drifted. So a route's columns are paired with the golden's:

1. a column with the golden's own name is the golden's (a same-named column is a claim; its
   value must agree, it is never traded for another column that happens to hold the figure);
2. the golden's other columns pair one to one with the route's other columns **by value**:
   for a scalar, a column holding the figure (a single-figure golden against a single-column
   row pairs the two, whatever they hold); for rows, a column holding the same multiset of
   values, with the rows then compared whole under the pairing;
3. a rows golden's `rank` column (named `rank`, or `..._rank`) holding exactly 1, 2, ..., n,
   when the route has no column left to hold it, pairs with the route's row order: the one
   place row order counts. Otherwise rows compare as a multiset (order-insensitive).

`compare` returns a `Comparison`: why they differ (None when they agree) and which columns were
paired by value, so every report can say so. Numbers compare with a relative tolerance of 1e-6,
widened to half a unit of the last place when a scalar golden states `round`.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

#: keys of a scalar golden value that describe it rather than hold a figure
VALUE_META_KEYS = frozenset({"round", "currency", "unit", "note"})
#: golden kinds that carry no value to compare
NOTHING_TO_DERIVE = frozenset({"unanswerable", "criteria"})
REL_TOL = 1e-6
ROW_ORDER = "(row order)"
"""What a rank column of a rows golden pairs with when no column holds its values."""
MAX_PAIRINGS = 256
"""Candidate pairings of a rows golden tried in full before the comparison gives up (columns
whose values coincide column by column; a real result has a handful)."""

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Comparison:
    """A golden against a route's rows: `why` they differ (None: they agree) and the golden
    columns paired with differently named route columns, in the golden's order."""

    why: str | None
    paired: tuple[tuple[str, str], ...] = ()

    @property
    def agrees(self) -> bool:
        return self.why is None

    def paired_text(self) -> str:
        """`buyers = user_count, rank = (row order)`, or "" when every column kept its name."""
        return ", ".join(f"{golden} = {route}" for golden, route in self.paired)


def compare(stored: Any, rows: Rows, kind: str) -> Comparison:
    """Whether `rows` reproduce the stored golden value, pairing columns by value (see the
    module's rules). Kinds with nothing to derive always agree."""
    if kind == "scalar":
        return _compare_scalar(stored, rows)
    if kind == "rows":
        return _compare_rows(stored, rows)
    if kind in NOTHING_TO_DERIVE:
        return Comparison(None)
    return Comparison(
        f"golden kind {kind!r} cannot be compared; use scalar, rows, unanswerable or criteria"
    )


def compare_golden(stored: Any, rows: Rows, kind: str) -> str | None:
    """None when `rows` reproduce the stored golden value, else a sentence saying what differs
    (`compare` without the pairing)."""
    return compare(stored, rows, kind).why


def in_golden_shape(stored: Any, rows: Rows, kind: str, comparison: Comparison) -> Any:
    """The route's rows as a golden value under the golden's own column names (the pairing
    applied), or None when they cannot take its shape: what later routes are compared with."""
    clean = [{k: normalize(v) for k, v in row.items()} for row in rows]
    pairs = dict(comparison.paired)
    if kind == "rows" and isinstance(stored, list) and stored:
        columns = _columns(stored)
        if not all(c in pairs or all(c in row for row in clean) for c in columns):
            return None
        return [
            {c: _cell(row, pairs.get(c, c), index) for c in columns}
            for index, row in enumerate(clean)
        ]
    if kind == "rows":
        return clean
    if kind == "scalar" and isinstance(stored, dict) and len(clean) == 1:
        keys = [k for k in stored if k not in VALUE_META_KEYS]
        if all(pairs.get(k, k) in clean[0] for k in keys):
            meta = {k: v for k, v in stored.items() if k in VALUE_META_KEYS}
            return {**{k: clean[0][pairs.get(k, k)] for k in keys}, **meta}
    return None


def _cell(row: dict[str, Any], column: str, index: int) -> Any:
    return index + 1 if column == ROW_ORDER else row[column]


def _compare_scalar(stored: Any, rows: Rows) -> Comparison:
    if not isinstance(stored, dict):
        return Comparison(
            f"a scalar golden value must be an object of named figures, got {stored!r}"
        )
    if len(rows) != 1:
        return Comparison(f"expected exactly one row, got {len(rows)}")
    places = stored.get("round")
    abs_tol = 0.5 * 10.0 ** -int(places) if isinstance(places, int) else 0.0
    row = {k: normalize(v) for k, v in rows[0].items()}
    figures = [k for k in stored if k not in VALUE_META_KEYS]
    if not figures:  # nothing to compare would agree with anything
        return Comparison(
            f"the scalar golden {stored!r} holds no figure, only "
            f"{', '.join(sorted(VALUE_META_KEYS & set(stored))) or 'nothing'}; give it one"
        )
    for key in figures:
        if key in row and not values_equal(stored[key], row[key], abs_tol=abs_tol):
            return Comparison(f"{key}: stored {stored[key]!r}, derived {row[key]!r}")
    unnamed = [k for k in figures if k not in row]
    if not unnamed:
        return Comparison(None)
    free = [c for c in row if c not in figures]
    if len(figures) == 1 and len(row) == 1:
        # One figure, one column: they are the same figure under two names, equal or not.
        (key,), (column,) = unnamed, free
        pair = ((key, column),)
        if values_equal(stored[key], row[column], abs_tol=abs_tol):
            return Comparison(None, pair)
        why = (
            f"{key} (paired with the query's only column {column!r}): stored "
            f"{stored[key]!r}, derived {row[column]!r}"
        )
        return Comparison(why, pair)
    match = _matching(unnamed, free, lambda k, c: values_equal(stored[k], row[c], abs_tol=abs_tol))
    if match is None:
        wanted = {k: stored[k] for k in unnamed}
        others = {c: row[c] for c in free}
        return Comparison(
            f"no column of the query holds the stored {_figures(wanted)} (the query returned "
            f"{others or 'no other column'})"
        )
    return Comparison(None, tuple((k, match[k]) for k in unnamed))


def _figures(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v!r}" for k, v in values.items())


def _matching(
    keys: list[str], columns: list[str], fits: Callable[[str, str], bool]
) -> dict[str, str] | None:
    """A one-to-one pairing of every key with a column it fits (Kuhn's augmenting paths:
    polynomial, and the first columns in order win ties), or None when there is none."""
    owner: dict[str, str] = {}

    def place(key: str, seen: set[str]) -> bool:
        for column in columns:
            if column in seen or not fits(key, column):
                continue
            seen.add(column)
            if column not in owner or place(owner[column], seen):
                owner[column] = key
                return True
        return False

    if not all(place(key, set()) for key in keys):
        return None
    return {key: column for column, key in owner.items()}


def _compare_rows(stored: Any, rows: Rows) -> Comparison:
    if not isinstance(stored, list) or not all(isinstance(r, dict) for r in stored):
        return Comparison(f"a rows golden value must be a list of row objects, got {stored!r}")
    if len(stored) != len(rows):
        return Comparison(f"expected {len(stored)} rows, got {len(rows)}")
    if not stored:
        return Comparison(None)
    columns = _columns(stored)
    got = [{k: normalize(v) for k, v in row.items()} for row in rows]
    route = _columns(got)
    named = [c for c in columns if all(c in row for row in got)]
    unnamed = [c for c in columns if c not in named]
    if not unnamed:
        return Comparison(_rows_differ(stored, got, columns, {}))
    free = [c for c in route if c not in columns]
    # The row order may stand for a rank only when some golden column has no route column.
    spare = len(free) < len(unnamed)
    candidates = {g: _candidates(g, stored, got, free, rank_ok=spare) for g in unnamed}
    lonely = [g for g in unnamed if not candidates[g]]
    if lonely:
        return Comparison(
            f"no column of the query holds the values of {_names(lonely)} (stored "
            f"{[r.get(lonely[0]) for r in stored]!r} in {lonely[0]!r}; the query returned "
            f"columns {route})"
        )
    first: tuple[tuple[str, str], ...] | None = None
    for pairing in itertools.islice(_pairings(unnamed, candidates), MAX_PAIRINGS):
        why = _rows_differ(stored, got, columns, dict(pairing))
        if why is None:
            return Comparison(None, pairing)
        first = first or pairing
    if first is None:  # two golden columns hold values only one route column holds
        return Comparison(
            f"the columns {_names(unnamed)} cannot each be paired with a column of their own "
            f"by value (the query returned columns {route}; holding their values: "
            f"{candidates})"
        )
    why = _rows_differ(stored, got, columns, dict(first))
    paired = ", ".join(f"{g} = {r}" for g, r in first)
    return Comparison(f"{why} (columns paired by value: {paired})", first)


def _names(columns: list[str]) -> str:
    return ", ".join(repr(c) for c in columns)


def _columns(rows: Rows) -> list[str]:
    """Every column of `rows`, in first-seen order."""
    return list(dict.fromkeys(k for row in rows for k in row))


def _candidates(
    golden: str, stored: Rows, got: Rows, free: list[str], *, rank_ok: bool
) -> list[str]:
    """The route columns holding the golden column's values (as a multiset), then the row
    order when the column is a rank (named so, 1..n) and `rank_ok` (a column is missing)."""
    want = sorted((normalize(r.get(golden)) for r in stored), key=_cell_key)
    found = [
        c
        for c in free
        if all(
            values_equal(a, b)
            for a, b in zip(want, sorted((r.get(c) for r in got), key=_cell_key), strict=True)
        )
    ]
    if not found and rank_ok and _is_rank(golden, want):
        found.append(ROW_ORDER)
    return found


def _is_rank(name: str, values: list[Any]) -> bool:
    named = name.casefold() == "rank" or name.casefold().endswith("_rank")
    numbers = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    return named and numbers and sorted(values) == list(range(1, len(values) + 1))


def _pairings(
    unnamed: list[str], candidates: dict[str, list[str]]
) -> Iterator[tuple[tuple[str, str], ...]]:
    """Every one-to-one choice of a candidate column per unnamed golden column, in order."""

    def extend(index: int, used: frozenset[str]) -> Iterator[tuple[tuple[str, str], ...]]:
        if index == len(unnamed):
            yield ()
            return
        golden = unnamed[index]
        for column in candidates[golden]:
            if column in used:
                continue
            for rest in extend(index + 1, used | {column}):
                yield ((golden, column), *rest)

    return extend(0, frozenset())


def _rows_differ(stored: Rows, got: Rows, columns: list[str], pairs: dict[str, str]) -> str | None:
    """The first row the two multisets do not share (over the golden's columns, each read from
    its paired route column), or None."""
    derived = [
        {c: _cell(row, pairs.get(c, c), index) for c in columns} for index, row in enumerate(got)
    ]
    want = sorted(
        ({c: normalize(r.get(c)) for c in columns} for r in stored),
        key=lambda r: _row_key(r, columns),
    )
    have = sorted(derived, key=lambda r: _row_key(r, columns))
    for want_row, got_row in zip(want, have, strict=True):
        if not all(values_equal(want_row[c], got_row[c]) for c in columns):
            return (
                f"the stored row {want_row} is not among the derived rows (in its place: {got_row})"
            )
    return None


def _row_key(row: dict[str, Any], columns: list[str]) -> tuple[tuple[int, Any], ...]:
    return tuple(_cell_key(row.get(column)) for column in columns)


def _cell_key(value: Any) -> tuple[int, Any]:
    value = normalize(value)
    if value is None:
        return (0, "")
    if _is_number(value):
        return (1, round(float(value), 4))
    return (2, str(value))


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
