"""The embedded ecommerce dataset: a deterministic generator written as parquet into a cache.

The data is never committed: `ensure_data()` generates it on first use from a fixed seed with the
standard library's `random`, writes CSV to a scratch folder and lets DuckDB turn each file into
parquet. The same DATASET_VERSION always yields the same bytes, so goldens computed once stay
true on every machine.

Traps the example set relies on (kept on purpose, tested in tests/test_embedded_data.py):
- order vs line grain: `orders` has one row per order, `order_items` one per line (1-4 lines);
- statuses: Cancelled orders never ship, Returned orders were delivered then sent back,
  Processing / Shipped orders are still in flight at the data's as-of date;
- a partial final year: orders run 2019-01-01 to 2022-11-14;
- two costs: `products.cost` is the catalogue (list) cost, `inventory_items.cost` the unit cost
  actually paid for that unit, usually below the catalogue figure;
- products never sold, inventory never sold, and `inventory_items.sold_at` set even when the
  order that took the unit was cancelled.
"""

from __future__ import annotations

import csv
import os
import random
import shutil
import tempfile
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from itertools import accumulate
from pathlib import Path
from typing import Any

DATASET_VERSION = "2"
TABLES: tuple[str, ...] = ("users", "products", "inventory_items", "orders", "order_items")

SEED = 20221114
START = datetime(2019, 1, 1)
SIGNUP_START = datetime(2018, 6, 1)  # some accounts predate the first order
ORDER_END = datetime(2022, 11, 14, 23, 59, 59)
AS_OF = datetime(2022, 11, 16, 23, 59, 59)  # when the extract was taken
N_USERS = 24_000
N_PRODUCTS = 2_000
NEVER_SOLD_SHARE = 0.06

SCHEMAS: dict[str, tuple[tuple[str, str], ...]] = {
    "users": (
        ("id", "INTEGER"),
        ("first_name", "VARCHAR"),
        ("last_name", "VARCHAR"),
        ("email", "VARCHAR"),
        ("age", "INTEGER"),
        ("gender", "VARCHAR"),
        ("city", "VARCHAR"),
        ("state", "VARCHAR"),
        ("country", "VARCHAR"),
        ("traffic_source", "VARCHAR"),
        ("created_at", "TIMESTAMP"),
    ),
    "products": (
        ("id", "INTEGER"),
        ("name", "VARCHAR"),
        ("brand", "VARCHAR"),
        ("category", "VARCHAR"),
        ("department", "VARCHAR"),
        ("cost", "DOUBLE"),
        ("retail_price", "DOUBLE"),
        ("sku", "VARCHAR"),
        ("distribution_center_id", "INTEGER"),
    ),
    "inventory_items": (
        ("id", "INTEGER"),
        ("product_id", "INTEGER"),
        ("cost", "DOUBLE"),
        ("created_at", "TIMESTAMP"),
        ("sold_at", "TIMESTAMP"),
        ("product_name", "VARCHAR"),
        ("product_brand", "VARCHAR"),
        ("product_category", "VARCHAR"),
        ("product_department", "VARCHAR"),
        ("product_retail_price", "DOUBLE"),
        ("product_distribution_center_id", "INTEGER"),
    ),
    "orders": (
        ("order_id", "INTEGER"),
        ("user_id", "INTEGER"),
        ("status", "VARCHAR"),
        ("created_at", "TIMESTAMP"),
        ("shipped_at", "DATE"),
        ("delivered_at", "TIMESTAMP"),
        ("returned_at", "TIMESTAMP"),
        ("num_of_item", "INTEGER"),
    ),
    "order_items": (
        ("id", "INTEGER"),
        ("order_id", "INTEGER"),
        ("user_id", "INTEGER"),
        ("product_id", "INTEGER"),
        ("inventory_item_id", "INTEGER"),
        ("status", "VARCHAR"),
        ("sale_price", "DOUBLE"),
        ("created_at", "TIMESTAMP"),
        ("shipped_at", "DATE"),
        ("delivered_at", "TIMESTAMP"),
        ("returned_at", "TIMESTAMP"),
    ),
}

# category -> (departments, lowest price, highest price, nouns)
CATEGORIES: dict[str, tuple[tuple[str, ...], float, float, tuple[str, ...]]] = {
    "Jeans": (("Men", "Women"), 30, 180, ("Slim Jeans", "Straight Jeans", "Bootcut Jeans")),
    "Tops & Tees": (("Men", "Women"), 10, 60, ("Crew Tee", "V-Neck Tee", "Henley")),
    "Sweaters": (("Men", "Women"), 25, 150, ("Cardigan", "Crewneck Sweater", "Turtleneck")),
    "Outerwear & Coats": (("Men", "Women"), 60, 400, ("Parka", "Trench Coat", "Puffer Jacket")),
    "Accessories": (("Men", "Women"), 5, 80, ("Beanie", "Leather Belt", "Scarf", "Sunglasses")),
    "Dresses": (("Women",), 30, 250, ("Wrap Dress", "Maxi Dress", "Shift Dress")),
    "Intimates": (("Women",), 8, 50, ("Bralette", "Camisole", "Briefs")),
    "Swim": (("Men", "Women"), 15, 120, ("Swim Trunks", "One-Piece", "Bikini Top")),
    "Shorts": (("Men", "Women"), 15, 70, ("Chino Shorts", "Denim Shorts", "Cargo Shorts")),
    "Active": (("Men", "Women"), 15, 100, ("Running Tights", "Track Jacket", "Sports Bra")),
    "Sleep & Lounge": (("Men", "Women"), 15, 80, ("Pajama Set", "Robe", "Lounge Pants")),
    "Socks": (("Men", "Women"), 4, 25, ("Crew Socks", "Ankle Socks", "Wool Socks")),
    "Suits & Sport Coats": (("Men",), 120, 600, ("Two-Piece Suit", "Blazer", "Sport Coat")),
    "Skirts": (("Women",), 20, 120, ("Pleated Skirt", "Pencil Skirt", "Denim Skirt")),
}
BRANDS = (
    "Northvale", "Calder & Co", "Redwing Denim", "Marlow", "Ostara", "Pinehurst", "Lumen",
    "Hartwell", "Sable Row", "Tidewater", "Kestrel", "Brightline", "Ashgrove", "Fenwick",
    "Orchard Lane", "Ironbark", "Solano", "Wrenfield", "Cobalt Bay", "Thistle",
)  # fmt: skip
ADJECTIVES = ("Classic", "Essential", "Heritage", "Everyday", "Relaxed", "Premium", "Vintage")
FIRST_NAMES = (
    "James", "Mary", "Wei", "Ana", "Luca", "Fatima", "Noah", "Olivia", "Hiro", "Sofia",
    "Omar", "Emma", "Diego", "Mia", "Ivan", "Chloe", "Arjun", "Grace", "Kofi", "Lena",
)  # fmt: skip
LAST_NAMES = (
    "Smith", "Garcia", "Chen", "Silva", "Rossi", "Khan", "Brown", "Muller", "Tanaka", "Lopez",
    "Novak", "Kim", "Okafor", "Martin", "Dubois", "Patel", "Jensen", "Costa", "Walsh", "Ivanova",
)  # fmt: skip
# (country, state, city, weight)
PLACES = (
    ("United States", "California", "Los Angeles", 9), ("United States", "Texas", "Houston", 6),
    ("United States", "New York", "New York", 6), ("United States", "Florida", "Miami", 4),
    ("United States", "Illinois", "Chicago", 3), ("United States", "Washington", "Seattle", 2),
    ("China", "Guangdong", "Shenzhen", 8), ("China", "Shanghai", "Shanghai", 6),
    ("Brasil", "Sao Paulo", "Sao Paulo", 6), ("Brasil", "Bahia", "Salvador", 2),
    ("South Korea", "Seoul", "Seoul", 3), ("France", "Ile-de-France", "Paris", 3),
    ("United Kingdom", "England", "London", 3), ("Germany", "Berlin", "Berlin", 3),
    ("Spain", "Madrid", "Madrid", 2), ("Japan", "Tokyo", "Tokyo", 3),
    ("Australia", "New South Wales", "Sydney", 2), ("Belgium", "Brussels", "Brussels", 1),
)  # fmt: skip
TRAFFIC_SOURCES = (("Search", 70), ("Organic", 15), ("Facebook", 6), ("Email", 5), ("Display", 4))
ITEMS_PER_ORDER = ((1, 60), (2, 25), (3, 10), (4, 5))
MONTH_WEIGHT = {11: 1.3, 12: 1.6}  # seasonality; every other month weighs 1.0


@dataclass
class _Product:
    id: int
    name: str
    brand: str
    category: str
    department: str
    cost: float
    retail_price: float
    distribution_center_id: int


@dataclass
class _Tables:
    rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=lambda: {t: [] for t in TABLES})


def ensure_data(cache_dir: Path | None = None) -> Path:
    """Return the directory holding `<table>.parquet` for every table, generating it once.

    The folder is `<root>/ecommerce-v<DATASET_VERSION>`, where root is `cache_dir`, else
    `$EVALLOOP_CACHE_DIR`, else `~/.cache/pytest-evalloop`. Generation writes into a private
    temporary folder and renames it into place, so concurrent callers (xdist workers) never see
    a half-written dataset; the loser of the race discards its copy.
    """
    root = cache_root(cache_dir)
    final = root / f"ecommerce-v{DATASET_VERSION}"
    if _complete(final):
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        if cache_dir is not None or os.environ.get("EVALLOOP_CACHE_DIR"):
            raise  # a folder the user named: theirs to fix
        # A home without a writable cache (HOME=/ in a CI container): the data is a cache, so
        # it goes to the temporary folder instead of stopping the run.
        return ensure_data(Path(tempfile.gettempdir()) / "pytest-evalloop")
    scratch = Path(tempfile.mkdtemp(prefix=f".ecommerce-v{DATASET_VERSION}-", dir=root))
    try:
        from pytest_evalloop.steps import announce

        announce(f"generating the example store's tables into {root} (once per machine, ~5 s)")
        generate(scratch)
        try:
            os.rename(scratch, final)
        except OSError:
            if not _complete(final):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def cache_root(cache_dir: Path | None = None) -> Path:
    """`cache_dir`, else `$EVALLOOP_CACHE_DIR`, else `~/.cache/pytest-evalloop`."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("EVALLOOP_CACHE_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "pytest-evalloop"


def _complete(folder: Path) -> bool:
    return all((folder / f"{table}.parquet").is_file() for table in TABLES)


def generate(out_dir: Path) -> None:
    """Generate every table into `out_dir` as `<table>.parquet` (deterministic bytes)."""
    tables = _build(random.Random(SEED))
    _write_parquet(tables, Path(out_dir))


def _build(rng: random.Random) -> _Tables:
    tables = _Tables()
    products = _products(rng, tables)
    sellable = [p for p in products if rng.random() >= NEVER_SOLD_SHARE]
    popularity = list(accumulate(rng.lognormvariate(0, 1.1) for _ in sellable))
    users = _users(rng, tables)
    next_ids = {"order": 1, "line": 1, "unit": 1}
    for user_id, signed_up in users:
        for _ in range(_order_count(rng)):
            _order(rng, tables, user_id, signed_up, sellable, popularity, next_ids)
    _unsold_stock(rng, tables, products, next_ids)
    return tables


def _products(rng: random.Random, tables: _Tables) -> list[_Product]:
    products = []
    names = list(CATEGORIES)
    for pid in range(1, N_PRODUCTS + 1):
        category = rng.choice(names)
        departments, low, high, nouns = CATEGORIES[category]
        brand = rng.choice(BRANDS)
        retail = round(low + (high - low) * rng.random() ** 1.6, 2)
        product = _Product(
            id=pid,
            name=f"{brand} {rng.choice(ADJECTIVES)} {rng.choice(nouns)} {pid}",
            brand=brand,
            category=category,
            department=rng.choice(departments),
            cost=round(retail * rng.uniform(0.35, 0.6), 2),
            retail_price=retail,
            distribution_center_id=rng.randint(1, 10),
        )
        products.append(product)
        sku = f"{rng.getrandbits(64):016X}"
        tables.rows["products"].append(
            (pid, product.name, brand, category, product.department, product.cost, retail, sku,
             product.distribution_center_id)
        )  # fmt: skip
    return products


def _users(rng: random.Random, tables: _Tables) -> list[tuple[int, datetime]]:
    span = (ORDER_END - SIGNUP_START).total_seconds()
    place_cum = list(accumulate(p[3] for p in PLACES))
    source_cum = list(accumulate(s[1] for s in TRAFFIC_SOURCES))
    users = []
    for uid in range(1, N_USERS + 1):
        # the power skews sign-ups later: the business grows
        created = SIGNUP_START + timedelta(seconds=int(span * rng.random() ** 0.8))
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        country, state, city, _ = rng.choices(PLACES, cum_weights=place_cum)[0]
        source = rng.choices(TRAFFIC_SOURCES, cum_weights=source_cum)[0][0]
        email = f"{first.lower()}.{last.lower()}{uid}@example.com"
        row = (uid, first, last, email, rng.randint(12, 70), rng.choice(("Male", "Female")),
               city, state, country, source, _ts(created))  # fmt: skip
        tables.rows["users"].append(row)
        users.append((uid, created))
    return users


def _order_count(rng: random.Random) -> int:
    if rng.random() < 0.2:
        return 0  # signed up, never ordered
    return min(1 + int(rng.expovariate(1 / 3.2)), 30)


def _order_time(rng: random.Random, signed_up: datetime) -> datetime:
    first = max(signed_up, START)
    span = (ORDER_END - first).total_seconds()
    while True:
        when = first + timedelta(seconds=int(span * rng.random()))
        if rng.random() * 1.6 <= MONTH_WEIGHT.get(when.month, 1.0):
            return when


def _lifecycle(
    rng: random.Random, created: datetime
) -> tuple[str, date | None, datetime | None, datetime | None]:
    """Status and milestone dates of one order as seen on AS_OF."""
    if rng.random() < 0.15:
        return "Cancelled", None, None, None
    # a few orders wait weeks for stock, so recent ones are still Processing on AS_OF
    delay = rng.randint(2, 96) if rng.random() < 0.97 else rng.randint(96, 500)
    shipped = (created + timedelta(hours=delay)).date()
    if shipped > AS_OF.date():
        return "Processing", None, None, None
    delivered = datetime.combine(shipped, datetime.min.time()) + timedelta(
        hours=rng.randint(20, 150), minutes=rng.randint(0, 59)
    )
    if delivered > AS_OF:
        return "Shipped", shipped, None, None
    if rng.random() < 0.1:
        returned = delivered + timedelta(days=rng.randint(1, 25), hours=rng.randint(0, 23))
        if returned <= AS_OF:
            return "Returned", shipped, delivered, returned
    return "Complete", shipped, delivered, None


def _order(
    rng: random.Random,
    tables: _Tables,
    user_id: int,
    signed_up: datetime,
    sellable: list[_Product],
    popularity: list[float],
    next_ids: dict[str, int],
) -> None:
    order_id = next_ids["order"]
    next_ids["order"] += 1
    created = _order_time(rng, signed_up)
    status, shipped, delivered, returned = _lifecycle(rng, created)
    n_items = rng.choices([n for n, _ in ITEMS_PER_ORDER], [w for _, w in ITEMS_PER_ORDER])[0]
    stamps = (_ts(created), _d(shipped), _ts(delivered), _ts(returned))
    tables.rows["orders"].append((order_id, user_id, status, *stamps, n_items))
    total = popularity[-1]
    for _ in range(n_items):
        product = sellable[bisect_left(popularity, rng.random() * total)]
        unit_id = _sold_unit(rng, tables, product, created, stamps[0], next_ids)
        discount = rng.uniform(0.7, 0.95) if rng.random() < 0.12 else 1.0
        tables.rows["order_items"].append(
            (next_ids["line"], order_id, user_id, product.id, unit_id, status,
             round(product.retail_price * discount, 2), *stamps)
        )  # fmt: skip
        next_ids["line"] += 1


def _sold_unit(
    rng: random.Random,
    tables: _Tables,
    product: _Product,
    sold_at: datetime | None,
    sold_stamp: str,
    next_ids: dict[str, int],
) -> int:
    """Add one inventory unit of `product`; `sold_at` mirrors the order line's created_at.

    Units are bought below the catalogue cost (negotiated 2-22% off), so costing sold goods at
    products.cost overstates them: the catalogue-vs-unit-cost trap.
    """
    unit_id = next_ids["unit"]
    next_ids["unit"] += 1
    anchor = sold_at or AS_OF
    received = max(START - timedelta(days=30), anchor - timedelta(hours=rng.randint(24, 2400)))
    tables.rows["inventory_items"].append(
        (unit_id, product.id, round(product.cost * rng.uniform(0.78, 0.98), 2), _ts(received),
         sold_stamp, product.name, product.brand, product.category, product.department,
         product.retail_price, product.distribution_center_id)
    )  # fmt: skip
    return unit_id


def _unsold_stock(
    rng: random.Random, tables: _Tables, products: list[_Product], next_ids: dict[str, int]
) -> None:
    for product in products:
        for _ in range(rng.randint(0, 40)):
            _sold_unit(rng, tables, product, None, "", next_ids)


def _ts(value: datetime | None) -> str:
    return "" if value is None else value.isoformat(" ")


def _d(value: date | None) -> str:
    return "" if value is None else value.isoformat()


def _write_parquet(tables: _Tables, out_dir: Path) -> None:
    import duckdb

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="evalloop-csv-") as scratch:
        con = duckdb.connect(":memory:")
        try:
            con.execute("SET threads = 1")  # one writer thread: byte-identical files
            # No progress bar: on a slow machine DuckDB would print it into the caller's stdout.
            con.execute("SET enable_progress_bar = false")
            for table in TABLES:
                csv_path = Path(scratch) / f"{table}.csv"
                with csv_path.open("w", newline="", encoding="utf-8") as handle:
                    csv.writer(handle).writerows(tables.rows[table])
                _csv_to_parquet(con, table, csv_path, out_dir / f"{table}.parquet")
        finally:
            con.close()


def _csv_to_parquet(con: Any, table: str, csv_path: Path, target: Path) -> None:
    columns = ", ".join(f"'{name}': '{kind}'" for name, kind in SCHEMAS[table])
    con.execute(
        f"COPY (SELECT * FROM read_csv('{csv_path}', header = false, nullstr = '',"
        f" columns = {{{columns}}})) TO '{target}' (FORMAT parquet, COMPRESSION zstd)"
    )
