"""Re-deriving goldens: the pure part of `--eval-verify-goldens`.

A golden is trusted only while the truth data still produces it, by two differently shaped
derivations (`canonicalQuery` and `verification.secondQuery`), and while the model's own route
(`modelQuery`, run through the answerer-facing query path) still reaches it. Each route that
disagrees with the stored value becomes one `Drift`.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel

from pytest_evalloop.sets import cases as sets

# The comparison lives in `pairing`; its public names stay importable from here, where they
# were first defined (callers across the package import them from this module).
from pytest_evalloop.targets.embedded.pairing import (
    NOTHING_TO_DERIVE,
    compare,
    in_golden_shape,
    normalize,
)
from pytest_evalloop.targets.embedded.pairing import REL_TOL as REL_TOL
from pytest_evalloop.targets.embedded.pairing import VALUE_META_KEYS as VALUE_META_KEYS
from pytest_evalloop.targets.embedded.pairing import compare_golden as compare_golden
from pytest_evalloop.targets.embedded.pairing import values_equal as values_equal

if TYPE_CHECKING:
    import duckdb

Route = Literal["canonical", "second", "model"]
ModelQueryRunner = Callable[[str], list[dict[str, Any]]]


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
    detail: str = ""
    """What differs or why the route could not run, without the case and route (a list that
    already names them shows this)."""


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


@dataclass
class Derivation:
    """Every route of one golden: what disagreed (`drifts`, [] when the golden holds) and, per
    route that agreed only under another column name, which columns were paired by value."""

    drifts: list[Drift] = field(default_factory=list)
    paired: dict[Route, str] = field(default_factory=dict)
    """route -> `golden column = route column, ...` (pairing.Comparison.paired_text)."""

    def paired_lines(self) -> list[str]:
        return [f"route {route}: {text}" for route, text in self.paired.items()]


def verify_case(
    case: dict[str, Any],
    set_dir: Path,
    *,
    model_query_runner: ModelQueryRunner | None = None,
    truth: RowSource | None = None,
) -> list[Drift]:
    """Re-derive one case's golden and return every disagreement; [] means the golden holds
    (`derive_golden`'s drifts)."""
    return derive_golden(case, set_dir, model_query_runner=model_query_runner, truth=truth).drifts


def derive_golden(
    case: dict[str, Any],
    set_dir: Path,
    *,
    model_query_runner: ModelQueryRunner | None = None,
    truth: RowSource | None = None,
) -> Derivation:
    """Re-derive one case's golden by every route it records, comparing by value (`pairing`).

    The canonical query is compared with the stored value. The second derivation and the model
    query are compared with what the canonical query derived, under the golden's column names
    (the stored value when it could not run), so a stale golden is one `canonical` drift rather
    than three copies of it, and a `second` or `model` drift always means that route itself
    disagrees with the truth. A route that could not run is `failed` ("could not verify"),
    never a drift of the value. `truth`, when given, is the set's truth connection shared by a
    check over many cases: it runs each distinct query once.
    """
    qid = str(case.get("qid", "<no qid>"))
    golden = case.get("golden") or {}
    kind = str(golden.get("kind", ""))
    found = Derivation()
    if kind in NOTHING_TO_DERIVE:
        return found
    try:
        stored = sets.golden_value(set_dir, golden)
    except sets.GoldenArtifactError as exc:
        found.drifts.append(
            Drift(
                qid=qid,
                route="canonical",
                stored=None,
                derived=None,
                message=f"could not verify: {exc}",
                problem="failed",
            )
        )
        return found
    canonical = golden.get("canonicalQuery")
    if not canonical:
        msg = (
            f"case {qid} has a {kind or 'kind-less'} golden but no golden.canonicalQuery, so"
            " nothing re-derives it; add the query that computes it on the truth tables"
        )
        found.drifts.append(
            Drift(
                qid=qid,
                route="canonical",
                stored=stored,
                derived=None,
                message=msg,
                problem="unproven",
            )
        )
        return found
    truth = truth or TruthQueries(set_dir, cache=False)
    rows = _derive(found, qid, "canonical", stored, stored, kind, partial(truth.rows, canonical))
    derived = (
        None if rows is None else in_golden_shape(stored, rows, kind, compare(stored, rows, kind))
    )
    reference = stored if derived is None else derived
    second = (golden.get("verification") or {}).get("secondQuery")
    if second and query_shape(str(second)) != query_shape(str(canonical)):
        _derive(found, qid, "second", stored, reference, kind, partial(truth.rows, str(second)))
    found.drifts += [
        Drift(qid=qid, route="second", stored=stored, derived=None, message=m, problem="unproven")
        for m in derivation_problems(qid, golden)
    ]
    model_query = case.get("modelQuery")
    if model_query_runner is not None and model_query:
        run_model = partial(model_query_runner, model_query)
        _derive(found, qid, "model", stored, reference, kind, run_model)
    return found


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

    def close(self) -> None:
        """Nothing to stop: the process-wide connection is shared (`cached_truth_connection`)."""


def _derive(
    found: Derivation,
    qid: str,
    route: Route,
    stored: Any,
    reference: Any,
    kind: str,
    run: Callable[[], list[dict[str, Any]]],
) -> list[dict[str, Any]] | None:
    """Run one route and compare it with `reference` by value; a drift (reporting the stored
    value) or the pairing goes to `found`. Returns the route's rows, None when it failed."""
    problem: Literal["disagrees", "failed"]
    rows: list[dict[str, Any]] | None = None
    try:
        got = run()
    except Exception as exc:  # any failure of the query is itself the finding
        derived, problem = None, "failed"
        detail = message = f"could not verify: the {route} query did not run: {exc}"
    else:
        rows, result = got, compare(reference, got, kind)
        if result.agrees:
            if result.paired:
                found.paired[route] = result.paired_text()
            return rows
        against = "the stored golden" if reference is stored else "the canonical derivation"
        derived, problem, detail = _shown(got, kind), "disagrees", str(result.why)
        message = f"case {qid}: {route} derivation disagrees with {against}: {detail}"
    found.drifts.append(
        Drift(
            qid=qid,
            route=route,
            stored=stored,
            derived=derived,
            message=message,
            problem=problem,
            detail=detail,
        )
    )
    return rows


def _shown(rows: list[dict[str, Any]], kind: str) -> Any:
    clean = [{k: normalize(v) for k, v in row.items()} for row in rows]
    return clean[0] if kind == "scalar" and len(clean) == 1 else clean


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
