"""Links this set's synthetic tables into ecommerce/data/ on first use, so a fresh clone (or a
copy of this folder anywhere pytest-evalloop is installed) runs `pytest evals/ecommerce-malloy`
with no other step. The generator ships in the package (`evalloop malloy-data DIR` by hand): it
generates the tables (seeded) once per machine into the cache, keyed by its version, seed and
products.parquet; later imports only check the links. At import time on purpose: the plugin
checks that the package compiles before any hook of this file would run."""

from contextlib import suppress
from pathlib import Path

from pytest_evalloop.targets.malloy.gen_data import DataError, ensure

# Without products.parquet nothing can be generated; the plugin's compile check then names the
# missing table files and what to do, as one usage error rather than this file's traceback.
with suppress(DataError):
    ensure(Path(__file__).parent / "ecommerce" / "data")
