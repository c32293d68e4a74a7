"""The generated ecommerce dataset: deterministic, race-safe, and carrying its traps."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from pytest_evalloop.targets.embedded.data import DATASET_VERSION, TABLES, ensure_data
from pytest_evalloop.targets.embedded.truth import truth_connection


def _digests(folder: Path) -> dict[str, str]:
    return {t: hashlib.sha256((folder / f"{t}.parquet").read_bytes()).hexdigest() for t in TABLES}


@pytest.fixture(scope="module")
def data_dir() -> Path:
    """The shared cached dataset (generated once per cache, as users get it)."""
    return ensure_data()


@pytest.fixture(scope="module")
def truth(data_dir: Path) -> duckdb.DuckDBPyConnection:
    return truth_connection(data_dir)


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> object:
    row = con.execute(sql).fetchone()
    assert row is not None
    return row[0]


def test_two_racing_generations_agree_byte_for_byte(tmp_path: Path, data_dir: Path) -> None:
    # Two processes generate into the same empty cache at once, as xdist workers would.
    code = (
        "import sys; from pathlib import Path; from pytest_evalloop.targets.embedded.data import "
        "ensure_data; print(ensure_data(Path(sys.argv[1])))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    expected = tmp_path / f"ecommerce-v{DATASET_VERSION}"
    assert outputs == [str(expected), str(expected)]
    # the loser's scratch folder is gone; only the finished dataset remains
    assert sorted(p.name for p in tmp_path.iterdir()) == [expected.name]
    # an independent generation (the shared cache) has exactly the same bytes
    assert _digests(expected) == _digests(data_dir)


def test_cache_location_follows_argument_then_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_dir: Path
) -> None:
    seeded = tmp_path / "env" / f"ecommerce-v{DATASET_VERSION}"
    seeded.mkdir(parents=True)
    for table in TABLES:  # a complete folder is reused as is, never regenerated
        (seeded / f"{table}.parquet").write_bytes((data_dir / f"{table}.parquet").read_bytes())
    monkeypatch.setenv("EVALLOOP_CACHE_DIR", str(tmp_path / "env"))
    assert ensure_data() == seeded
    assert ensure_data(tmp_path / "env") == seeded


def test_row_counts(truth: duckdb.DuckDBPyConnection) -> None:
    counts = {t: _one(truth, f"SELECT count(*) FROM {t}") for t in TABLES}
    assert counts["order_items"] >= 100_000  # type: ignore[operator]
    assert counts["users"] == 24_000
    assert counts["products"] == 2_000
    assert counts["inventory_items"] > counts["order_items"]  # type: ignore[operator]


def test_order_vs_line_grain(truth: duckdb.DuckDBPyConnection) -> None:
    lines = _one(truth, "SELECT count(*) FROM order_items")
    orders = _one(truth, "SELECT count(*) FROM orders")
    assert _one(truth, "SELECT count(DISTINCT order_id) FROM order_items") == orders
    assert _one(truth, "SELECT sum(num_of_item) FROM orders") == lines
    assert orders < lines  # type: ignore[operator]
    assert _one(truth, "SELECT max(num_of_item) FROM orders") == 4
    # every line carries its order's status
    mismatched = "SELECT count(*) FROM orders o JOIN order_items i USING (order_id) WHERE o.status <> i.status"
    assert _one(truth, mismatched) == 0


def test_statuses_and_their_dates(truth: duckdb.DuckDBPyConnection) -> None:
    statuses = {r[0] for r in truth.execute("SELECT DISTINCT status FROM orders").fetchall()}
    assert statuses == {"Complete", "Returned", "Shipped", "Processing", "Cancelled"}
    checks = {
        "Cancelled": "shipped_at IS NULL AND delivered_at IS NULL",
        "Processing": "shipped_at IS NULL",
        "Shipped": "shipped_at IS NOT NULL AND delivered_at IS NULL",
        "Returned": "returned_at > delivered_at",
        "Complete": "delivered_at IS NOT NULL AND returned_at IS NULL",
    }
    for status, condition in checks.items():
        bad = f"SELECT count(*) FROM orders WHERE status = '{status}' AND NOT ({condition})"
        assert _one(truth, bad) == 0, status
    share = _one(truth, "SELECT avg(CASE WHEN status = 'Cancelled' THEN 1 ELSE 0 END) FROM orders")
    assert 0.1 < share < 0.2  # type: ignore[operator]


def test_final_year_is_partial(truth: duckdb.DuckDBPyConnection) -> None:
    first, last = truth.execute("SELECT min(created_at), max(created_at) FROM orders").fetchone()  # type: ignore[misc]
    assert first.year == 2019 and first.month == 1
    assert (last.year, last.month, last.day) == (2022, 11, 14)
    assert _one(truth, "SELECT typeof(shipped_at) FROM orders LIMIT 1") == "DATE"


def test_unit_cost_differs_from_catalogue_cost(truth: duckdb.DuckDBPyConnection) -> None:
    ratio = _one(
        truth,
        "SELECT avg(i.cost / p.cost) FROM inventory_items i JOIN products p ON p.id = i.product_id",
    )
    assert 0.8 < ratio < 0.96  # type: ignore[operator]
    same = "SELECT count(*) FROM inventory_items i JOIN products p ON p.id = i.product_id WHERE i.cost = p.cost"
    assert _one(truth, same) < 0.01 * _one(truth, "SELECT count(*) FROM inventory_items")  # type: ignore[operator]


def test_never_sold_products_and_stock(truth: duckdb.DuckDBPyConnection) -> None:
    never = "SELECT count(*) FROM products p WHERE NOT EXISTS (SELECT 1 FROM order_items i WHERE i.product_id = p.id)"
    assert 50 < _one(truth, never) < 300  # type: ignore[operator]
    assert _one(truth, "SELECT count(*) FROM inventory_items WHERE sold_at IS NULL") > 10_000  # type: ignore[operator]
    # a unit sits on at most one line, and sold_at is set even when that order was cancelled
    assert _one(truth, "SELECT count(*) - count(DISTINCT inventory_item_id) FROM order_items") == 0
    cancelled_units = (
        "SELECT count(*) FROM order_items o JOIN inventory_items i ON i.id = o.inventory_item_id"
        " WHERE o.status = 'Cancelled' AND i.sold_at = o.created_at"
    )
    assert _one(truth, cancelled_units) == _one(
        truth, "SELECT count(*) FROM order_items WHERE status = 'Cancelled'"
    )


def test_discounts_make_sale_price_differ_from_list(truth: duckdb.DuckDBPyConnection) -> None:
    below = "SELECT avg(CASE WHEN o.sale_price < p.retail_price THEN 1 ELSE 0 END) FROM order_items o JOIN products p ON p.id = o.product_id"
    assert 0.05 < _one(truth, below) < 0.2  # type: ignore[operator]
    above = "SELECT count(*) FROM order_items o JOIN products p ON p.id = o.product_id WHERE o.sale_price > p.retail_price"
    assert _one(truth, above) == 0


def test_truth_connection_names_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="ensure_data"):
        truth_connection(tmp_path)


def test_truth_holds_only_the_raw_tables(truth: duckdb.DuckDBPyConnection) -> None:
    names = {
        r[0] for r in truth.execute("SELECT table_name FROM information_schema.tables").fetchall()
    }
    assert names == set(TABLES)
    # raw means semantics-free: no derived columns such as the model's unit_cost
    cols = [d[0] for d in truth.execute("SELECT * FROM order_items LIMIT 0").description]
    assert "unit_cost" not in cols and "sale_price" in cols
