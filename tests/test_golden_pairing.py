"""A golden compared with a route's rows by value (`targets.embedded.pairing`).

The issue this answers: a `verified` golden `{"total_sales": 5552682.88}` was reported "drifted"
because the model's query named its column `total_sales_2022`. A route that holds the golden's
figures under other names agrees, and says which columns it paired; a real value difference is
still a drift with both values; a same-named column is never traded for another that happens to
hold the figure. Hypothesis checks the two directions for every input: renaming and reordering
never makes a drift, changing a figure always does.
"""

from __future__ import annotations

import string
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pytest_evalloop.targets.embedded.goldens import Drift, derive_golden
from pytest_evalloop.targets.embedded.pairing import (
    ROW_ORDER,
    VALUE_META_KEYS,
    compare,
    in_golden_shape,
)

# ----------------------------------------------------------------------------- scalars


def test_a_renamed_single_column_is_the_same_figure() -> None:
    stored = {"total_sales": 5552682.88, "currency": "usd", "round": 2}
    found = compare(stored, [{"total_sales_2022": 5552682.876660146}], "scalar")
    assert found.agrees and found.paired == (("total_sales", "total_sales_2022"),)
    assert found.paired_text() == "total_sales = total_sales_2022"
    assert in_golden_shape(stored, [{"total_sales_2022": 5552682.876660146}], "scalar", found) == {
        "total_sales": 5552682.876660146,
        "currency": "usd",
        "round": 2,
    }


def test_a_renamed_single_column_with_another_value_is_a_drift_with_both_values() -> None:
    found = compare({"unsold": 249458}, [{"inventory_item_count": 216917}], "scalar")
    assert not found.agrees
    assert found.why == (
        "unsold (paired with the query's only column 'inventory_item_count'): stored 249458, "
        "derived 216917"
    )


def test_several_figures_pair_one_to_one_by_value() -> None:
    stored = {"orders": 120, "buyers": 100, "round": 0}
    rows = [{"n_customers": 100, "n_orders": 120, "extra": 7}]
    found = compare(stored, rows, "scalar")
    assert found.agrees
    assert dict(found.paired) == {"orders": "n_orders", "buyers": "n_customers"}
    # Two figures, one column holding one of them: no one-to-one pairing, both sides shown.
    found = compare(stored, [{"n": 120, "m": 5}], "scalar")
    assert found.why is not None
    assert "no column of the query holds the stored orders 120, buyers 100" in found.why
    assert "{'n': 120, 'm': 5}" in found.why


def test_equal_figures_still_need_a_column_each() -> None:
    found = compare({"a": 5, "b": 5}, [{"x": 5, "y": 6}], "scalar")
    assert not found.agrees  # x cannot stand for both
    assert compare({"a": 5, "b": 5}, [{"x": 5, "y": 5}], "scalar").agrees


def test_a_same_named_column_is_a_claim_never_traded_for_another() -> None:
    found = compare({"orders": 100}, [{"orders": 120, "customers": 100}], "scalar")
    assert found.why == "orders: stored 100, derived 120"


def test_a_named_figure_and_a_renamed_one_together() -> None:
    stored = {"orders": 100, "revenue": 2500.5}
    assert compare(stored, [{"orders": 100, "total_sales": 2500.5}], "scalar").paired == (
        ("revenue", "total_sales"),
    )


# ----------------------------------------------------------------------------- rows


def test_rows_pair_renamed_columns_and_ignore_row_order() -> None:
    stored = [{"category": "Jeans", "orders": 3}, {"category": "Tops", "orders": 5}]
    rows = [
        {"product_category": "Tops", "order_count": 5, "total_sales": 10.0},
        {"product_category": "Jeans", "order_count": 3, "total_sales": 4.0},
    ]
    found = compare(stored, rows, "rows")
    assert found.agrees
    assert dict(found.paired) == {"category": "product_category", "orders": "order_count"}
    assert in_golden_shape(stored, rows, "rows", found) == [
        {"category": "Tops", "orders": 5},
        {"category": "Jeans", "orders": 3},
    ]


def test_columns_with_the_same_values_pair_as_the_rows_say() -> None:
    # a and b hold the same multiset {1, 2}; only a -> y, b -> x keeps the rows together.
    stored = [{"a": 1, "b": 2}, {"a": 2, "b": 1}, {"a": 1, "b": 1}]
    rows = [{"x": 2, "y": 1}, {"x": 1, "y": 2}, {"x": 1, "y": 1}]
    assert compare(stored, rows, "rows").agrees
    # Each column still holds {1, 1, 2}, but no pairing gives back the stored rows.
    bad = [{"x": 1, "y": 1}, {"x": 2, "y": 2}, {"x": 1, "y": 1}]
    found = compare(stored, bad, "rows")
    assert found.why is not None and "columns paired by value" in found.why


def test_a_rank_column_pairs_with_the_row_order_and_then_order_counts() -> None:
    stored = [
        {"category": "Outerwear", "total_sales": 19.5, "rank": 1},
        {"category": "Jeans", "total_sales": 18.1, "rank": 2},
    ]
    rows = [
        {"category": "Outerwear", "total_sales": 19.5},
        {"category": "Jeans", "total_sales": 18.1},
    ]
    found = compare(stored, rows, "rows")
    assert found.agrees and found.paired == (("rank", ROW_ORDER),)
    assert not compare(stored, list(reversed(rows)), "rows").agrees
    # A rank the route returns by name is compared by name, as any column.
    named = [{**row, "rank": i + 1} for i, row in enumerate(reversed(rows))]
    assert not compare(stored, named, "rows").agrees


def test_row_order_stands_only_for_a_rank_the_route_has_no_column_for() -> None:
    # 1..n in a column not named as a rank is a figure, and so is a rank when the route has a
    # column of its own that could hold it: neither pairs with the row order.
    assert not compare([{"k": "a", "n": 1}], [{"k": "a"}], "rows").agrees
    assert not compare([{"rank": 1}], [{"position": 99}], "rows").agrees
    assert compare([{"k": "a", "rank": 1}], [{"k": "a"}], "rows").agrees


def test_a_column_nothing_holds_is_named_with_its_values() -> None:
    stored = [{"k": "a", "rank": None}, {"k": "b", "rank": None}]
    found = compare(stored, [{"k": "a"}, {"k": "b"}], "rows")
    assert found.why == (
        "no column of the query holds the values of 'rank' (stored [None, None] in 'rank'; the "
        "query returned columns ['k'])"
    )


# ----------------------------------------------------------------------------- the routes


def test_a_route_that_could_not_run_is_could_not_verify_never_drifted(tmp_path: Any) -> None:
    class Missing:
        def rows(self, query: str) -> list[dict[str, Any]]:
            raise FileNotFoundError("data/order_items.parquet does not exist")

    case = {
        "qid": "q",
        "golden": {"kind": "scalar", "value": {"n": 1}, "canonicalQuery": "SELECT 1 AS n"},
    }
    [drift] = [
        d for d in derive_golden(case, tmp_path, truth=Missing()).drifts if d.route == "canonical"
    ]
    assert drift.problem == "failed"
    assert drift.message == (
        "could not verify: the canonical query did not run: data/order_items.parquet does not exist"
    )


def test_the_model_route_is_compared_by_value_and_its_pairing_reported(tmp_path: Any) -> None:
    class Truth:
        def rows(self, query: str) -> list[dict[str, Any]]:
            return [{"buyers": 101740}]

    case = {
        "qid": "ecom_customer_count",
        "modelQuery": "run: order_items -> { aggregate: user_count }",
        "golden": {"kind": "scalar", "value": {"buyers": 101740}, "canonicalQuery": "x"},
    }
    found = derive_golden(
        case, tmp_path, truth=Truth(), model_query_runner=lambda q: [{"user_count": 101740}]
    )
    assert {d.route for d in found.drifts} == {"second"}  # only the missing second derivation
    assert found.paired_lines() == ["route model: buyers = user_count"]
    found = derive_golden(
        case, tmp_path, truth=Truth(), model_query_runner=lambda q: [{"user_count": 7}]
    )
    drift: Drift = next(d for d in found.drifts if d.route == "model")
    assert drift.problem == "disagrees" and "stored 101740, derived 7" in drift.message
    assert found.paired == {}  # a pairing is reported where the route agreed, not where it drifted


# ----------------------------------------------------------------------------- properties

NAMES = st.text(string.ascii_lowercase, min_size=1, max_size=6)
FIGURES = st.one_of(
    st.integers(-(10**9), 10**9),
    st.floats(-1e9, 1e9, allow_nan=False, allow_infinity=False).map(lambda x: round(x, 3)),
    st.text(string.ascii_letters, max_size=5),
)


@st.composite
def scalar_and_renamed_row(
    draw: st.DrawFn,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    # A figure's name, never one a golden keeps for what describes its figures ("unit",
    # "round"): Hypothesis drew {"unit": 0}, a golden with no figure at all.
    figure_names = NAMES.filter(lambda name: name not in VALUE_META_KEYS)
    keys = draw(st.lists(figure_names, min_size=1, max_size=4, unique=True))
    values = draw(st.lists(FIGURES, min_size=len(keys), max_size=len(keys)))
    stored = dict(zip(keys, values, strict=True))
    renamed = {k: draw(st.sampled_from([k, f"{k}_route"])) for k in keys}
    row = {renamed[k]: stored[k] for k in draw(st.permutations(keys))}
    return stored, row, renamed


@given(scalar_and_renamed_row())
def test_renaming_a_routes_columns_never_makes_a_drift(
    case: tuple[dict[str, Any], dict[str, Any], dict[str, str]],
) -> None:
    stored, row, renamed = case
    found = compare(stored, [row], "scalar")
    assert found.agrees, found.why
    moved = {k: v for k, v in renamed.items() if k != v}
    # Each renamed figure is paired with a column holding it (its own, unless two are equal).
    assert {k for k, _ in found.paired} == set(moved)
    assert all(row[column] == stored[key] for key, column in found.paired)


@given(scalar_and_renamed_row(), st.data())
def test_changing_one_figure_always_drifts_and_shows_both_values(
    case: tuple[dict[str, Any], dict[str, Any], dict[str, str]], data: st.DataObject
) -> None:
    stored, row, renamed = case
    key = data.draw(st.sampled_from(sorted(stored)))
    if any(v == stored[key] for k, v in stored.items() if k != key):
        return  # another figure holds the same value: changing this one is not observable
    old = stored[key]
    new: Any = (old + 1 + abs(old)) if isinstance(old, int | float) else f"{old}!"
    changed = {**row, renamed[key]: new}
    found = compare(stored, [changed], "scalar")
    assert not found.agrees
    assert repr(old) in str(found.why) and repr(new) in str(found.why)


@st.composite
def rows_and_route(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    columns = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    n = draw(st.integers(1, 5))
    stored = [
        {c: draw(st.one_of(st.integers(0, 5), st.sampled_from("abc"))) for c in columns}
        for _ in range(n)
    ]
    renamed = {c: draw(st.sampled_from([c, f"{c}_x"])) for c in columns}
    order = draw(st.permutations(range(n)))
    route = [{renamed[c]: stored[i][c] for c in columns} for i in order]
    return stored, route


@given(rows_and_route())
def test_reordering_and_renaming_rows_never_makes_a_drift(
    case: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    stored, route = case
    found = compare(stored, route, "rows")
    assert found.agrees, found.why


@given(rows_and_route(), st.data())
def test_changing_one_cell_of_the_rows_always_drifts(
    case: tuple[list[dict[str, Any]], list[dict[str, Any]]], data: st.DataObject
) -> None:
    stored, route = case
    index = data.draw(st.integers(0, len(route) - 1))
    column = data.draw(st.sampled_from(sorted(route[index])))
    changed = [dict(row) for row in route]
    changed[index][column] = 99  # no drawn value is 99
    assert not compare(stored, changed, "rows").agrees


def test_a_scalar_golden_with_no_figure_agrees_with_nothing() -> None:
    found = compare({"round": 2, "currency": "usd"}, [{"total": 1}], "scalar")
    assert found.why == (
        "the scalar golden {'round': 2, 'currency': 'usd'} holds no figure, only currency, "
        "round; give it one"
    )
