"""Links this set's synthetic tables into ecommerce/data/ on first use, so a fresh clone runs
`pytest evals/ecommerce-malloy` with no other step. tools/gen_malloy_data.py generates them
(seeded) once per machine into the cache, keyed by its version, seed and products.parquet; later
imports only check the links. At import time on purpose: the plugin checks that the package
compiles before any hook of this file would run."""

import runpy
from pathlib import Path

HERE = Path(__file__).parent
DATA = HERE / "ecommerce" / "data"
GENERATOR = HERE.parent.parent / "tools" / "gen_malloy_data.py"

if GENERATOR.is_file():
    runpy.run_path(str(GENERATOR))["ensure"](DATA)
