"""The truth connection: the raw, semantics-free tables every golden is derived from.

Seed 004's rule: a golden must never be derived from the model under test. So goldens run on a
connection of their own, built straight from the parquet files with no dimensions, measures,
joins or docs, and never handed to the answerer's query path.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pytest_evalloop.targets.embedded.data import TABLES

if TYPE_CHECKING:
    import duckdb


def truth_connection(data_dir: Path) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB holding one table per raw table (named as TABLES), copied in."""
    import duckdb

    data_dir = Path(data_dir)
    missing = [t for t in TABLES if not (data_dir / f"{t}.parquet").is_file()]
    if missing:
        raise FileNotFoundError(
            f"truth data in {data_dir} lacks {missing}; call ensure_data() to generate it"
        )
    con = duckdb.connect(":memory:")
    con.execute("SET enable_progress_bar = false")  # never printed into our stdout
    for table in TABLES:
        con.execute(
            f"CREATE TABLE {table} AS SELECT * FROM read_parquet(?)",
            [str(data_dir / f"{table}.parquet")],
        )
    return con
