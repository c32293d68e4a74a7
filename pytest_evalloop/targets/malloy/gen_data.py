"""Synthetic data for the malloy-samples `ecommerce` package, in the reference model's schema.

The reference package (malloy-samples `ecommerce`) ships only `products.parquet`; its other three
tables were too large to copy. This writes them, seeded, next to the real products file so the
real `ecommerce.malloy` compiles and runs unchanged:

- `users.parquet` (168,063 rows), `inventory_items.parquet` (487,936: one per order line, the
  rest unsold stock), `order_items.parquet` (271,019 lines over about 264,000 orders), the row
  counts of the original files;
- the types the model pins: `order_items.shipped_at` and `delivered_at` are DATE (the model's
  `days(created_at::date to shipped_at)` needs a date), every other `*_at` is TIMESTAMP;
- the facts the model's docs state: orders run 2019-01-01 to 2022-11-14, shipments to
  2022-11-20, unshipped lines are Cancelled or Processing, `inventory_items.sold_at` is a copy of
  the order line's `created_at` even when it was cancelled, `sale_price` is the product's
  retail price.

Python's `random.Random(seed)` draws every value (its sequence is stable across Python
versions), so the files and the goldens derived from them are the same on every machine. DuckDB
only writes the parquet files. The tables are generated once per machine into the cache (keyed
by `DATA_VERSION`, the seed and products.parquet's sha) and each data folder links to them
(`ensure`).

It ships in the package so a set copied out of this repository (`evals/ecommerce-malloy`, or the
malloy-samples reference set) finds it: `evalloop malloy-data DIR...` or
`python -m pytest_evalloop.targets.malloy.gen_data DIR...`, DIR a package's data folder, a
package folder (its `data/`) or a set folder (the data folders of its Malloy package and truth
package). Layer: targets (see docs/malloy.md, "The example set").
"""

from __future__ import annotations

import argparse
import bisect
import csv
import datetime as dt
import hashlib
import itertools
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEED = 20261202
DATA_VERSION = "1"
"""Bump when the generator's output changes; goldens hold for one version only."""
USERS = 168_063
ORDER_LINES = 271_019
INVENTORY = 487_936
START = dt.datetime(2019, 1, 1)
END = dt.datetime(2022, 11, 14, 23, 59, 59)
SHIP_END = dt.date(2022, 11, 20)
GENERATED = ("users", "inventory_items", "order_items")
CACHED = (*(f"{t}.parquet" for t in GENERATED), "GENERATED")
"""What the cache folder holds and the package's data folder links to."""
PRODUCTS = "products.parquet"
TABLE_FILES = frozenset({PRODUCTS, *(f"{t}.parquet" for t in GENERATED)})
"""The table files of the malloy-samples ecommerce package this generator can provide."""
MODULE = "pytest_evalloop.targets.malloy.gen_data"
COMMAND = "evalloop malloy-data"

FIRST = "James Mary John Patricia Robert Jennifer Michael Linda William Elizabeth David Barbara Richard Susan Joseph Jessica Thomas Sarah Charles Karen Daniel Nancy Matthew Lisa Anthony Betty Mark Sandra".split()
LAST = "Smith Johnson Williams Brown Jones Garcia Miller Davis Rodriguez Martinez Hernandez Lopez Gonzalez Wilson Anderson Thomas Taylor Moore Jackson Martin Lee Perez Thompson White Harris".split()
PLACES = [
    ("United States", "California", "Los Angeles", 34.05, -118.24, 0.18),
    ("United States", "Texas", "Houston", 29.76, -95.37, 0.12),
    ("United States", "New York", "New York", 40.71, -74.01, 0.10),
    ("United States", "Florida", "Miami", 25.76, -80.19, 0.07),
    ("China", "Guangdong", "Shenzhen", 22.54, 114.06, 0.20),
    ("Brasil", "São Paulo", "São Paulo", -23.55, -46.63, 0.12),
    ("South Korea", "Seoul", "Seoul", 37.57, 126.98, 0.06),
    ("France", "Île-de-France", "Paris", 48.86, 2.35, 0.05),
    ("United Kingdom", "England", "London", 51.51, -0.13, 0.05),
    ("Germany", "Berlin", "Berlin", 52.52, 13.40, 0.05),
]
TRAFFIC = [
    ("Search", 0.70),
    ("Organic", 0.15),
    ("Facebook", 0.06),
    ("Email", 0.05),
    ("Display", 0.04),
]
STATUS = [
    ("Complete", 0.62),
    ("Shipped", 0.12),
    ("Processing", 0.06),
    ("Cancelled", 0.12),
    ("Returned", 0.08),
]


# The product attributes an inventory item carries are denormalised from the catalogue here, in
# DuckDB, rather than written out per row by Python (most of the generator's time otherwise).
_SELECT = {
    "inventory_items": "SELECT i.id, i.product_id, i.created_at, i.sold_at, p.cost,"
    " p.category AS product_category, p.name AS product_name, p.brand AS product_brand,"
    " p.retail_price AS product_retail_price, p.department AS product_department,"
    " p.sku AS product_sku, p.distribution_center_id AS product_distribution_center_id"
    " FROM inventory_items i JOIN read_parquet('{products}') p ON p.id = i.product_id",
}


def _picker(weighted: list[tuple[Any, float]]) -> Callable[[random.Random], Any]:
    """A weighted draw with its cumulative weights computed once: `choices` with `cum_weights`
    draws exactly what it draws with `weights` (one `random()`), without re-summing per call."""
    names = [w[0] for w in weighted]
    cum = list(itertools.accumulate(w[-1] for w in weighted))
    return lambda rng: rng.choices(names, cum_weights=cum)[0]


_TRAFFIC = _picker(TRAFFIC)
_STATUS = _picker(STATUS)
_PLACE = _picker([(p, p[5]) for p in PLACES])


def _moment(rng: random.Random) -> dt.datetime:
    # Sales grow over time: the density of order times rises linearly across the range.
    span = (END - START).total_seconds()
    return START + dt.timedelta(seconds=int(span * (rng.random() ** 0.6)))


def _products(data_dir: Path) -> list[tuple[object, ...]]:
    import duckdb

    path = data_dir / PRODUCTS
    if not path.is_file():
        raise DataError(f"{path} is missing: copy the reference package's products.parquet there")
    return duckdb.execute(
        "SELECT id, cost, category, name, brand, retail_price, department, sku,"
        f" distribution_center_id FROM read_parquet('{path}') ORDER BY id"
    ).fetchall()


def generate(data_dir: Path, *, seed: int = SEED) -> list[Path]:
    """Write the three generated tables into `data_dir` (beside products.parquet)."""
    import duckdb

    rng = random.Random(seed)
    products = _products(data_dir)
    # Popularity: a few products sell often (a top-products list has a clear order).
    weights = [1.0 / (1 + (i * 7919) % len(products)) ** 0.35 for i in range(len(products))]
    cum = []
    total = 0.0
    for w in weights:
        total += w
        cum.append(total)

    users = []
    user_times = sorted(_moment(rng) for _ in range(USERS))
    for uid, created in enumerate(user_times, start=1):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        country, state, city, lat, lon, _ = _PLACE(rng)
        users.append(
            (
                uid,
                first,
                last,
                f"{first.lower()}{last.lower()}{uid}@example.com",
                rng.randint(12, 70),
                rng.choice("MF"),
                city,
                state,
                country,
                f"{rng.randint(10000, 99999)}",
                round(lat + rng.uniform(-0.5, 0.5), 6),
                round(lon + rng.uniform(-0.5, 0.5), 6),
                _TRAFFIC(rng),
                created,
            )
        )

    lines: list[tuple[Any, ...]] = []
    inventory: list[tuple[int, tuple[object, ...], dt.datetime, dt.datetime | None]] = []
    order_id = 0
    while len(lines) < ORDER_LINES:
        order_id += 1
        created = _moment(rng)
        known = bisect.bisect_right(user_times, created)
        user_id = rng.randint(1, max(known, 1))
        status = _STATUS(rng)
        if (END - created).days < 6 and status in ("Complete", "Returned", "Shipped"):
            status = "Processing"  # too recent to have shipped by the end of the file
        shipped = delivered = returned = None
        if status not in ("Cancelled", "Processing"):
            shipped = min(created.date() + dt.timedelta(days=rng.randint(0, 3)), SHIP_END)
        if status in ("Complete", "Returned"):
            delivered = shipped + dt.timedelta(days=rng.randint(1, 9))  # type: ignore[operator]
        if status == "Returned":
            returned = dt.datetime.combine(delivered, dt.time()) + dt.timedelta(  # type: ignore[arg-type]
                days=rng.randint(1, 20), seconds=rng.randint(0, 86399)
            )
        for _ in range(1 if rng.random() < 0.975 else rng.randint(2, 4)):
            if len(lines) >= ORDER_LINES:
                break
            product = products[bisect.bisect_left(cum, rng.random() * total)]
            item_id = len(inventory) + 1
            received = created - dt.timedelta(
                days=rng.randint(1, 120), seconds=rng.randint(0, 86399)
            )
            inventory.append((item_id, product, received, created))
            lines.append(
                (
                    len(lines) + 1,
                    order_id,
                    user_id,
                    item_id,
                    product[5],
                    status,
                    created,
                    shipped,
                    delivered,
                    returned,
                )
            )
    while len(inventory) < INVENTORY:
        product = products[rng.randrange(len(products))]
        inventory.append((len(inventory) + 1, product, _moment(rng), None))

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        files: dict[str, tuple[list[Any], str]] = {
            "users": (
                users,
                "id BIGINT, first_name VARCHAR, last_name VARCHAR, email VARCHAR, age BIGINT,"
                " gender VARCHAR, city VARCHAR, state VARCHAR, country VARCHAR, zip VARCHAR,"
                " latitude DOUBLE, longitude DOUBLE, traffic_source VARCHAR, created_at TIMESTAMP",
            ),
            "inventory_items": (
                [(i, p[0], r, s) for i, p, r, s in inventory],
                "id BIGINT, product_id BIGINT, created_at TIMESTAMP, sold_at TIMESTAMP",
            ),
            "order_items": (
                lines,
                "id BIGINT, order_id BIGINT, user_id BIGINT, inventory_item_id BIGINT,"
                " sale_price DOUBLE, status VARCHAR, created_at TIMESTAMP, shipped_at DATE,"
                " delivered_at DATE, returned_at TIMESTAMP",
            ),
        }
        con = duckdb.connect()
        for table, (rows, schema) in files.items():
            staged = Path(tmp) / f"{table}.csv"
            with staged.open("w", newline="", encoding="utf-8") as handle:
                csv.writer(handle).writerows(rows)  # None is written as "", read as NULL
            con.execute(f"CREATE TABLE {table} ({schema})")
            con.execute(f"COPY {table} FROM '{staged}' (FORMAT csv, HEADER false, NULLSTR '')")
            target = data_dir / f"{table}.parquet"
            select = _SELECT.get(table, f"SELECT * FROM {table}").format(
                products=data_dir / "products.parquet"
            )
            con.execute(f"COPY ({select} ORDER BY id) TO '{target}' (FORMAT parquet)")
            out.append(target)
        (data_dir / "GENERATED").write_text(
            f"{MODULE} version {DATA_VERSION} seed {seed}\n", encoding="utf-8"
        )
    return out


def cache_folder(products: Path, *, seed: int = SEED) -> Path:
    """Where the tables of this generator version, seed and products file are kept, once per
    machine: `<cache root>/ecommerce-malloy-v<DATA_VERSION>-s<seed>-p<products sha>` (cache
    root: `$EVALLOOP_CACHE_DIR`, else `~/.cache/pytest-evalloop`, as the embedded data's)."""
    from pytest_evalloop.targets.embedded.data import cache_root

    sha = hashlib.sha256(products.read_bytes()).hexdigest()[:12]
    return cache_root() / f"ecommerce-malloy-v{DATA_VERSION}-s{seed}-p{sha}"


def _complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in CACHED)


class DataError(ValueError):
    """The tables cannot be made: no products.parquet to build them around. The message says
    where it was looked for and what to copy there."""


def ensure(*data_dirs: Path, seed: int = SEED) -> Path:
    """The generated tables in each of `data_dirs`, as links into the cache (generated there
    first when missing); returns the cache folder.

    products.parquet is the reference package's own file: the first folder that holds it is
    the source, and a folder without one (a truth package's `data/`) gets a link to it. Cheap
    when cached: a hash of products.parquet and a look at the links. Safe for concurrent
    callers (xdist workers, several checkouts): one generates under a file lock into a private
    folder renamed into place; links are replaced atomically.
    """
    import fcntl

    folders = _distinct(data_dirs)
    products = next((d / PRODUCTS for d in folders if (d / PRODUCTS).is_file()), None)
    if products is None:
        where = ", ".join(str(d / PRODUCTS) for d in folders) or "(no folder given)"
        raise DataError(
            f"no products.parquet in {where}: copy the malloy-samples package's "
            "ecommerce/data/products.parquet there (the other three tables are generated "
            "around it)"
        )
    own = [f / n for f in folders for n in CACHED if (f / n).exists() and not (f / n).is_symlink()]
    if own:
        # A table of the user's own is never replaced by a link to generated data.
        raise DataError(
            f"{own[0]} is a file of its own, not a link this command made; it is left alone: "
            "move it away to generate the malloy-samples tables there, or keep it (a folder "
            "holding its own tables needs no generator)"
        )
    final = cache_folder(products, seed=seed)
    if not _complete(final):
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(final.parent / f".{final.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _complete(final):
                scratch = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
                try:
                    (scratch / PRODUCTS).symlink_to(products.resolve())
                    generate(scratch, seed=seed)
                    (scratch / PRODUCTS).unlink()
                    scratch.rename(final)
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        links = {name: final / name for name in CACHED}
        if not (folder / PRODUCTS).is_file():
            links[PRODUCTS] = products.resolve()
        for name, want in links.items():
            _link(folder / name, want)
    return final


def _distinct(data_dirs: tuple[Path, ...]) -> list[Path]:
    """The folders, each once: a truth package's `data` that links to the package's own
    folder is that folder."""
    seen: dict[Path, Path] = {}
    for folder in data_dirs:
        seen.setdefault(Path(folder).resolve(), Path(folder))
    return list(seen.values())


def _link(link: Path, want: Path) -> None:
    if link.is_symlink() and Path(os.readlink(link)) == want:
        return
    temp = link.parent / f".{link.name}.{os.getpid()}.link"
    temp.unlink(missing_ok=True)
    temp.symlink_to(want)
    temp.replace(link)


def data_folders(path: Path) -> list[Path]:
    """The data folders a command-line DIR stands for: a set folder's Malloy package and truth
    package (their `data/`), a package folder's `data/`, or the data folder itself."""
    path = Path(path)
    if (path / "set.json").is_file():
        from pytest_evalloop.sets.cases import SetError, load_set_config
        from pytest_evalloop.targets.malloy.setpackages import MalloyError, set_packages

        try:
            roots = set_packages(path, load_set_config(path))
        except (SetError, MalloyError) as exc:
            raise DataError(str(exc)) from exc
        if not roots:
            raise DataError(
                f"{path / 'set.json'} names no Malloy package or truth package; give the "
                "package's data folder instead"
            )
        return [root / "data" for root in roots]
    if path.is_dir() and any(path.glob("*.malloy")):
        return [path / "data"]
    return [path]


def fix_command(missing: list[Path], also: list[Path]) -> str | None:
    """The command that makes the missing table files, when this generator makes them all
    (`evalloop malloy-data <folders>`), or None. `also` are data folders that may hold the
    products.parquet the tables are built around (the answerer's package's)."""
    if not missing or any(p.name not in TABLE_FILES for p in missing):
        return None
    folders = _distinct(tuple([*also, *(p.parent for p in missing)]))
    if not any((d / PRODUCTS).is_file() for d in folders):
        return None
    return f"{COMMAND} " + " ".join(str(d) for d in folders)


def main(argv: list[str] | None = None) -> int:
    """`evalloop malloy-data DIR...`: 0 the tables are in place, 2 they cannot be made."""
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Generate the malloy-samples ecommerce tables (users, inventory_items, "
        "order_items; seeded, around the reference products.parquet) once per machine and link "
        "them into each data folder.",
    )
    parser.add_argument(
        "dirs",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="a package's data folder, a package folder (its data/), or a set folder (its "
        "Malloy package's and truth package's data/)",
    )
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    try:
        missing = [d for d in args.dirs if not d.exists()]
        if missing:
            raise DataError(
                f"no such folder {missing[0]}; give a package's data folder (holding "
                "products.parquet), a package folder or a set folder"
            )
        folders = [f for d in args.dirs for f in data_folders(d)]
        cache = ensure(*folders, seed=args.seed)
    except DataError as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        return 2
    for folder in _distinct(tuple(folders)):
        print(f"{folder}: {', '.join(sorted(TABLE_FILES))} (generated tables from {cache})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
