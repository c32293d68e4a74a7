"""Generates this set's synthetic tables on first use (seeded; a minute at most), so a fresh
clone runs `pytest evals/ecommerce-malloy` with no other step. At import time on purpose: the
plugin checks that the package compiles before any hook of this file would run."""

import fcntl
import runpy
from pathlib import Path

HERE = Path(__file__).parent
DATA = HERE / "ecommerce" / "data"
GENERATOR = HERE.parent.parent / "tools" / "gen_malloy_data.py"
TABLES = ("users", "inventory_items", "order_items")


def _ensure_data() -> None:
    if all((DATA / f"{t}.parquet").is_file() for t in TABLES) or not GENERATOR.is_file():
        return
    with open(DATA / ".generate.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers import this file too
        if not all((DATA / f"{t}.parquet").is_file() for t in TABLES):
            print(f"evalloop: generating {DATA} with {GENERATOR} (once)")
            runpy.run_path(str(GENERATOR))["generate"](DATA)


_ensure_data()
