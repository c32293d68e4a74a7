"""The failure shape of a wrong answer against its golden (seed 004, eval-diagnose step 3).

Pure functions over two sets of rows: the golden's and the re-executed prediction's. Each shape
is one signature of the seed's table with where it says to look; a diagnosis reads them before
it names a cause. Columns are paired by name, then by the judge's column pairing, then by
position among columns of the same sort (number or not); non-numeric columns are the rows' keys.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from pytest_evalloop.targets.embedded.goldens import VALUE_META_KEYS

ShapeName = Literal[
    "row_count",
    "superset",
    "subset",
    "integer_multiple",
    "same_keys_other_values",
    "minority_differ",
    "extremes_match_means_differ",
    "identical_values",
    "implausible_magnitude",
]
LOOK_HERE: dict[str, str] = {
    "row_count": "Row count differs: grain, filter or a missing/extra group",
    "superset": "Superset: every expected row present, plus others; often not an error",
    "subset": "Subset: rows missing: a filter or join that drops them",
    "integer_multiple": "Off by a clean integer multiple: fanout; which side of the join is "
    "non-unique",
    "same_keys_other_values": "Same row count, values differ: wrong column or literal, not joins",
    "minority_differ": "Right keys, wrong aggregates on a minority: an undeclared or "
    "wrong-cardinality relationship",
    "extremes_match_means_differ": "Extremes match, means do not: population, filter, or join "
    "scope",
    "identical_values": "Identical high-precision values across entities that should differ: "
    "cross-contamination join",
    "implausible_magnitude": "A magnitude that cannot be true: fanout, possibly in the golden",
}
IMPLAUSIBLE = 1000.0
"""A ratio beyond this (either way) between prediction and golden is not a plausible figure."""


class Shape(BaseModel):
    """One signature found, what it measured, and where the seed says to look."""

    shape: ShapeName
    detail: str
    look_here: str


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def close(a: Any, b: Any) -> bool:
    """Equal as the judge's tolerance reads figures (relative 1e-4, or half a cent)."""
    if _is_number(a) and _is_number(b):
        return math.isclose(float(a), float(b), rel_tol=1e-4, abs_tol=0.005)
    return str(a).strip().casefold() == str(b).strip().casefold()


def golden_rows(kind: str, value: Any) -> list[dict[str, Any]] | None:
    """The golden as rows: a scalar golden is one row; None when it has no rows to compare."""
    if kind == "rows" and isinstance(value, list):
        return [r for r in value if isinstance(r, dict)]
    if kind == "scalar":
        if isinstance(value, dict):
            # `round`, `unit` and the like describe the figure; they are no column of it.
            return [{k: v for k, v in value.items() if k not in VALUE_META_KEYS}]
        if _is_number(value) or isinstance(value, str):
            return [{"value": value}]
    return None


def pair_columns(
    gold: Sequence[Mapping[str, Any]],
    pred: Sequence[Mapping[str, Any]],
    pairing: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """golden column -> prediction column (unpaired golden columns left out)."""
    gold_cols = list(gold[0]) if gold else []
    pred_cols = list(pred[0]) if pred else []
    out: dict[str, str] = {}
    for col in gold_cols:
        if col in pred_cols:
            out[col] = col
        elif pairing and isinstance(pairing.get(col), str) and pairing[col] in pred_cols:
            out[col] = pairing[col]
    for numeric in (True, False):
        free_gold = [c for c in gold_cols if c not in out and _sort(gold, c) is numeric]
        taken = set(out.values())
        free_pred = [c for c in pred_cols if c not in taken and _sort(pred, c) is numeric]
        out.update(zip(free_gold, free_pred, strict=False))
    return out


def _sort(rows: Sequence[Mapping[str, Any]], col: str) -> bool:
    values = [r.get(col) for r in rows if r.get(col) is not None]
    return bool(values) and all(_is_number(v) for v in values)


def rows_match(
    gold: Sequence[Mapping[str, Any]],
    pred: Sequence[Mapping[str, Any]],
    pairing: Mapping[str, Any] | None = None,
) -> bool:
    """Whether the prediction's rows are the golden's: every golden column paired with one of
    the prediction's (extra prediction columns are context) and no failure shape between them.
    A golden column nothing pairs with is never taken as matching."""
    if gold and len(pair_columns(gold, pred, pairing)) < len(gold[0]):
        return False
    return not failure_shapes(gold, pred, pairing)


def failure_shapes(
    gold: Sequence[Mapping[str, Any]],
    pred: Sequence[Mapping[str, Any]],
    pairing: Mapping[str, Any] | None = None,
) -> list[Shape]:
    """Every signature the prediction shows against the golden; [] when they agree."""
    columns = pair_columns(gold, pred, pairing)
    keys = [g for g in columns if not _sort(gold, g)]
    values = [g for g in columns if _sort(gold, g)]
    found: list[Shape] = []

    def add(name: ShapeName, detail: str) -> None:
        found.append(Shape(shape=name, detail=detail, look_here=LOOK_HERE[name]))

    def same(g: Mapping[str, Any], p: Mapping[str, Any], cols: list[str]) -> bool:
        return all(close(g.get(c), p.get(columns[c])) for c in cols)

    every = keys + values
    gold_in_pred = [any(same(g, p, every) for p in pred) for g in gold]
    pred_in_gold = [any(same(g, p, every) for g in gold) for p in pred]
    if len(gold) == len(pred) and all(gold_in_pred) and all(pred_in_gold):
        return []
    if len(gold) != len(pred):
        add("row_count", f"golden {len(gold)} row(s), prediction {len(pred)}")
    if gold and all(gold_in_pred) and len(pred) > len(gold):
        add("superset", f"all {len(gold)} golden row(s) present among {len(pred)}")
    elif pred and all(pred_in_gold) and len(pred) < len(gold):
        add("subset", f"{len(pred)} of {len(gold)} golden row(s) present, none extra")
    matched = _by_key(gold, pred, keys, columns)
    _value_shapes(matched, values, columns, add)
    _column_shapes(gold, pred, keys, values, columns, add, found)
    return found


def _by_key(
    gold: Sequence[Mapping[str, Any]],
    pred: Sequence[Mapping[str, Any]],
    keys: list[str],
    columns: dict[str, str],
) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """Golden rows with the prediction row of the same keys (by position when keyless)."""
    if not keys:
        return list(zip(gold, pred, strict=False)) if len(gold) == len(pred) else []
    pairs = []
    for g in gold:
        match = next((p for p in pred if all(close(g[k], p.get(columns[k])) for k in keys)), None)
        if match is not None:
            pairs.append((g, match))
    return pairs


def _value_shapes(
    matched: list[tuple[Mapping[str, Any], Mapping[str, Any]]],
    values: list[str],
    columns: dict[str, str],
    add: Any,
) -> None:
    ratios: list[float] = []
    differing = 0
    for g, p in matched:
        row_differs = False
        for col in values:
            gv, pv = g.get(col), p.get(columns[col])
            if not (isinstance(gv, int | float) and isinstance(pv, int | float)):
                continue
            if not (_is_number(gv) and _is_number(pv)) or close(gv, pv):
                continue
            row_differs = True
            if gv != 0:
                ratios.append(float(pv) / float(gv))
        differing += row_differs
    if not matched or not differing:
        return
    multiple = _clean_multiple(ratios)
    if multiple is not None:
        add("integer_multiple", f"prediction = golden x {multiple:g} on {differing} row(s)")
    if len(matched) > 1 and differing * 2 < len(matched):
        add("minority_differ", f"{differing} of {len(matched)} same-key row(s) differ")
    elif multiple is None:
        add("same_keys_other_values", f"{differing} of {len(matched)} same-key row(s) differ")
    extreme = max((max(r, 1 / r) for r in ratios if r > 0), default=1.0)
    if extreme >= IMPLAUSIBLE:
        add("implausible_magnitude", f"off by a factor of {extreme:.3g}")


def _clean_multiple(ratios: list[float]) -> float | None:
    """The one integer k >= 2 (or 1/k) every ratio equals, if there is one."""
    if not ratios:
        return None
    first = ratios[0]
    k = first if first >= 1 else (1 / first if first > 0 else 0)
    if k < 1.5 or abs(k - round(k)) > 1e-6 * k:
        return None
    if not all(math.isclose(r, first, rel_tol=1e-6) for r in ratios):
        return None
    return first if first >= 1 else 1 / round(k)


def _column_shapes(
    gold: Sequence[Mapping[str, Any]],
    pred: Sequence[Mapping[str, Any]],
    keys: list[str],
    values: list[str],
    columns: dict[str, str],
    add: Any,
    found: list[Shape],
) -> None:
    for col in values:
        gv = [float(r[col]) for r in gold if _is_number(r.get(col))]
        pv = [float(r[columns[col]]) for r in pred if _is_number(r.get(columns[col]))]
        if len(gv) >= 2 and len(pv) >= 2:
            extremes = close(min(gv), min(pv)) and close(max(gv), max(pv))
            minority = any(f.shape == "minority_differ" for f in found)
            # A minority of keyed rows off already says where: the extremes add nothing.
            if extremes and not minority and not close(sum(gv) / len(gv), sum(pv) / len(pv)):
                add("extremes_match_means_differ", f"{col}: min and max agree, mean differs")
        repeated = [v for v, n in Counter(pv).items() if n > 1 and _high_precision(v)]
        distinct_keys = len({tuple(str(r.get(columns[k])) for k in keys) for r in pred})
        if keys and repeated and distinct_keys > 1 and len(set(gv)) == len(gv):
            add("identical_values", f"{col}: {repeated[0]:g} repeats across different keys")


def _high_precision(value: float) -> bool:
    # A repeated 0 or 12 across groups happens; a repeated 48213.77 is one figure copied.
    return value != 0 and (value != round(value) or abs(value) >= 1000)
