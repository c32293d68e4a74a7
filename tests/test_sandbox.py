"""Escape attempts against the embedded target's query path, through the real MCP client.

Every attack goes through `execute_query` over the real protocol, in-process and over stdio,
and must come back refused (an `is_error` result with a clear reason) within the time limit,
while an ordinary query keeps working on the same server afterwards.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import duckdb
import pytest

from pytest_evalloop.embedded.data import TABLES
from pytest_evalloop.embedded.model import SemanticModel
from pytest_evalloop.embedded.sandbox import QueryFailed, QueryRefused, Sandbox, json_safe
from pytest_evalloop.embedded.server import build_server_from_parts

TIMEOUT_S = 1.5
# Refusals are parse-time checks, so they come back at once; the runaway query gets the
# time limit plus scheduling slack.
QUICK_S = 1.0
SLACK_S = 3.0

TINY_MODEL = {
    "name": "shop",
    "doc": "Orders and customers of a small online shop.",
    "sources": [
        {
            "name": "orders",
            "doc": "One row per order placed in the shop.",
            "from": "orders",
            "grain": "one row per order",
            "primary_key": "order_id",
            "dimensions": [
                {"name": "order_id", "doc": "Unique order identifier."},
                {"name": "user_id", "doc": "The customer who placed the order."},
                {"name": "status", "doc": "Order status: Complete, Cancelled or Returned."},
                {"name": "created_at", "doc": "Timestamp when the order was placed."},
                {"name": "amount", "doc": "Order value in US dollars."},
            ],
            "measures": [
                {"name": "order_count", "doc": "Number of orders.", "sql": "count(*)"},
                {
                    "name": "total_revenue",
                    "doc": "Total sales revenue in dollars, excluding cancelled orders.",
                    "sql": "sum(amount) FILTER (WHERE status <> 'Cancelled')",
                },
            ],
            "joins": [
                {
                    "name": "users",
                    "doc": "The customer behind the order.",
                    "on": "orders.user_id = users.user_id",
                    "relationship": "many_to_one",
                }
            ],
            "views": [
                {
                    "name": "revenue_by_status",
                    "doc": "Revenue per order status.",
                    "sql": "SELECT status, sum(amount) AS revenue FROM orders GROUP BY status",
                }
            ],
        },
        {
            "name": "users",
            "doc": "Registered customers of the shop.",
            "from": "users",
            "grain": "one row per customer",
            "primary_key": "user_id",
            "dimensions": [
                {"name": "user_id", "doc": "Customer identifier."},
                {"name": "country", "doc": "Country the customer lives in."},
                {"name": "signed_up_at", "doc": "Date the customer registered an account."},
            ],
            "measures": [
                {
                    "name": "customer_count",
                    "doc": "Number of distinct customers.",
                    "sql": "count(DISTINCT user_id)",
                }
            ],
        },
    ],
}
N_ORDERS = 2000
GOLD_SECRET = "gold-secret-4242"


def write_tiny_set(root: Path) -> Path:
    """A set under `<root>/evals/tiny` with parquet data and a gold artifact beside it."""
    set_dir = root / "evals" / "tiny"
    data_dir = set_dir / "data"
    data_dir.mkdir(parents=True)
    (set_dir / "model.json").write_text(json.dumps(TINY_MODEL), encoding="utf-8")
    set_json = {
        "name": "tiny",
        "target": {"kind": "embedded", "model": "model.json", "data": "data"},
    }
    (set_dir / "set.json").write_text(json.dumps(set_json), encoding="utf-8")
    gold = set_dir / "gold"
    gold.mkdir()
    (gold / "answer.csv").write_text(f"answer\n{GOLD_SECRET}\n", encoding="utf-8")
    (set_dir / "cases.jsonl").write_text(json.dumps({"qid": "q1", "secret": GOLD_SECRET}) + "\n")
    raw = {
        "orders": f"""SELECT range AS order_id, range % 200 AS user_id,
                ['Complete', 'Cancelled', 'Returned'][range % 3 + 1] AS status,
                TIMESTAMP '2021-01-01' + to_hours(range::BIGINT) AS created_at,
                (10 + range % 90)::DECIMAL(10, 2) AS amount FROM range({N_ORDERS})""",
        "users": """SELECT range AS user_id, ['US', 'FR', 'JP'][range % 3 + 1] AS country,
                DATE '2020-01-01' + range::INTEGER AS signed_up_at FROM range(200)""",
    }
    con = duckdb.connect(":memory:")
    for table in TABLES:
        query = raw.get(table, "SELECT range AS id FROM range(3)")
        con.execute(f"COPY ({query}) TO '{data_dir / table}.parquet' (FORMAT parquet)")
    con.close()
    return set_dir


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_set(tmp_path_factory.mktemp("sandbox"))


@pytest.fixture(scope="module")
def sandbox(tiny_set: Path) -> Sandbox:
    model = SemanticModel.load(tiny_set / "model.json")
    return Sandbox(model, tiny_set / "data", row_cap=100, timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module", params=["in-process", "stdio"])
async def client(request: pytest.FixtureRequest, tiny_set: Path) -> AsyncIterator[object]:
    """One MCP client per transport for the whole module (one stdio server process)."""
    from mcp import Client, StdioServerParameters

    if request.param == "in-process":
        model = SemanticModel.load(tiny_set / "model.json")
        target: object = build_server_from_parts(model, tiny_set / "data", timeout_s=TIMEOUT_S)
    else:
        args = ["-m", "pytest_evalloop.embedded.server", str(tiny_set), "--transport", "stdio"]
        args += ["--timeout", str(TIMEOUT_S)]
        # cwd is the folder holding evals/, so relative gold paths would resolve if allowed.
        target = StdioServerParameters(
            command=sys.executable, args=args, cwd=str(tiny_set.parent.parent)
        )
    async with Client(target) as mcp_client:  # type: ignore[arg-type]
        yield mcp_client


def _gold_path(tiny_set: Path) -> str:
    return str(tiny_set / "gold" / "answer.csv")


# (id, sql, words the refusal must contain). `{gold}` is the absolute gold artifact path.
ATTACKS = [
    ("read_csv-gold", "SELECT * FROM read_csv('{gold}')", "read_csv"),
    (
        "read_csv_auto-evals",
        "SELECT * FROM read_csv_auto('evals/tiny/gold/answer.csv')",
        "read_csv_auto",
    ),
    (
        "read_parquet-data",
        "SELECT * FROM read_parquet('evals/tiny/data/orders.parquet')",
        "read_parquet",
    ),
    ("read_json-cases", "SELECT * FROM read_json('evals/tiny/cases.jsonl')", "read_json"),
    ("read_text-gold", "SELECT content FROM read_text('{gold}')", "read_text"),
    ("read_blob-gold", "SELECT content FROM read_blob('{gold}')", "read_blob"),
    ("glob-evals", "SELECT * FROM glob('evals/**')", "glob"),
    ("parquet_scan", "SELECT * FROM parquet_scan('evals/tiny/data/users.parquet')", "parquet_scan"),
    ("sniff_csv", "SELECT * FROM sniff_csv('{gold}')", "sniff_csv"),
    ("bare-file-reference", "SELECT * FROM 'answer.csv'", "file"),
    ("from-evals-path", "FROM 'evals/tiny/gold/answer.csv'", "file"),
    ("quoted-identifier-path", 'SELECT * FROM "evals/tiny/gold/answer.csv"', "file"),
    ("union-with-file", "SELECT 'x' UNION ALL SELECT * FROM read_csv('{gold}')", "read_csv"),
    ("scalar-subquery-read", "SELECT (SELECT count(*) FROM read_csv('{gold}')) AS n", "read_csv"),
    ("copy-to", "COPY (SELECT * FROM orders) TO '/tmp/evalloop-leak.csv'", "COPY"),
    ("attach-file", "ATTACH '/tmp/evalloop-leak.duckdb' AS leak", "ATTACH"),
    ("attach-memory", "ATTACH ':memory:' AS other", "ATTACH"),
    ("detach", "DETACH memory", "DETACH"),
    ("install", "INSTALL httpfs", "INSTALL"),
    ("load", "LOAD httpfs", "LOAD"),
    ("pragma", "PRAGMA database_list", "PRAGMA"),
    ("set", "SET enable_external_access = true", "SET"),
    ("reset", "RESET lock_configuration", "RESET"),
    (
        "httpfs-url",
        "SELECT * FROM read_parquet('https://gold.example.invalid/gold.parquet')",
        "read_parquet",
    ),
    ("bare-url", "SELECT * FROM 'https://gold.example.invalid/gold.csv'", "file"),
    ("call", "CALL pragma_version()", "CALL"),
    ("export-database", "EXPORT DATABASE '/tmp/evalloop-export'", "EXPORT"),
    ("create", "CREATE TABLE stash AS SELECT * FROM orders", "CREATE"),
    ("drop", "DROP TABLE orders", "DROP"),
    ("delete", "DELETE FROM orders", "DELETE"),
    ("multiple-statements", "SELECT 1; SELECT 2", "2 statements"),
    ("comment-hides-statement", "SELECT 1 /* look away */; DROP TABLE orders -- ", "2 statements"),
    ("literal-with-semicolon", "SELECT 'a;b'; COPY orders TO '/tmp/x.csv'", "2 statements"),
    ("duckdb_settings", "SELECT * FROM duckdb_settings()", "duckdb_settings"),
    ("current_setting", "SELECT current_setting('enable_external_access')", "current_setting"),
    ("getenv", "SELECT getenv('HOME')", "getenv"),
    ("duckdb_databases", "SELECT database_name FROM duckdb_databases()", "duckdb_databases"),
    ("information_schema", "SELECT * FROM information_schema.tables", "not one of"),
    ("nested-sql-query", "SELECT * FROM query('SELECT * FROM read_csv(''x.csv'')')", "query"),
    ("serialized-sql", "SELECT json_execute_serialized_sql('{{}}')", "json_execute_serialized_sql"),
    ("other-catalog", "SELECT * FROM system.main.duckdb_tables", "not one of"),
    (
        "cross-join-10-minutes",
        "SELECT count(*) FROM orders a, orders b, orders c, orders d",
        "time limit",
    ),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("sql", "expected"), [a[1:] for a in ATTACKS], ids=[a[0] for a in ATTACKS])
async def test_attack_is_refused_and_server_keeps_working(
    client: object, tiny_set: Path, sql: str, expected: str
) -> None:
    started = time.perf_counter()
    result = await client.call_tool("execute_query", {"sql": sql.format(gold=_gold_path(tiny_set))})  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - started
    text = " ".join(getattr(block, "text", "") for block in result.content)
    assert result.is_error, f"not refused: {sql!r} returned {text[:200]}"
    assert expected.lower() in text.lower(), text
    assert GOLD_SECRET not in text
    limit = TIMEOUT_S + SLACK_S if "time limit" in expected else QUICK_S
    assert elapsed < limit, f"took {elapsed:.2f}s"
    if "time limit" in expected:
        assert elapsed >= TIMEOUT_S * 0.9, "stopped before the limit: was it really interrupted?"
    ok = await client.call_tool("execute_query", {"sql": "SELECT count(*) AS n FROM orders"})  # type: ignore[attr-defined]
    assert not ok.is_error
    assert json.loads(ok.content[0].text)["rows"] == [{"n": N_ORDERS}]


def test_attack_list_is_long_enough() -> None:
    assert len(ATTACKS) >= 25
    assert len({a[0] for a in ATTACKS}) == len(ATTACKS)


def test_engine_barrier_holds_without_the_policy_check(sandbox: Sandbox, tiny_set: Path) -> None:
    """enable_external_access=false is the real barrier: a raw cursor cannot read the gold."""
    gold = _gold_path(tiny_set)
    # Control: the path is readable by an unlocked database, so a refusal below means the lock.
    assert GOLD_SECRET in str(duckdb.connect().execute(f"FROM read_csv('{gold}')").fetchall())
    raw = sandbox._con.cursor()  # bypasses check_query on purpose
    for sql in (
        f"FROM read_csv('{gold}')",
        f"FROM '{gold}'",
        f"FROM read_text('{gold}')",
        "COPY orders TO '/tmp/evalloop-raw-leak.csv'",
        f"ATTACH '{tiny_set}/leak.duckdb' AS leak",
    ):
        with pytest.raises(duckdb.PermissionException):
            raw.execute(sql)
    with pytest.raises(duckdb.Error, match="locked"):
        raw.execute("SET enable_external_access = true")
    assert not (tiny_set / "leak.duckdb").exists()


def test_truth_database_is_unreachable(sandbox: Sandbox, tiny_set: Path) -> None:
    from pytest_evalloop.embedded.truth import truth_connection

    truth = truth_connection(tiny_set / "data")
    truth.execute("CREATE TABLE truth_marker AS SELECT 1 AS x")
    # The sandbox's own catalogue is its snapshot file's ("model"); the truth connection's
    # default catalogue ("memory") is not reachable under any spelling.
    assert sandbox.execute("SELECT count(*) AS n FROM model.orders").rows == [{"n": N_ORDERS}]
    for sql in (
        "SELECT * FROM truth_marker",
        "SELECT * FROM memory.main.truth_marker",
        "SELECT * FROM memory.orders",
    ):
        with pytest.raises(QueryRefused, match="not one of the model's sources"):
            sandbox.execute(sql)
    # Even past the policy check, the name does not exist in the sandbox's own database.
    with pytest.raises(duckdb.CatalogException):
        sandbox._con.cursor().execute("SELECT * FROM truth_marker")
    # The raw tables install_sources read from are gone too: only the model's relations remain.
    assert sandbox.relations == {"orders", "users", "orders__revenue_by_status"}


def test_allowed_select_forms(sandbox: Sandbox) -> None:
    cte = sandbox.execute(
        "WITH s AS (SELECT status, count(*) AS n FROM orders GROUP BY status) "
        "SELECT * FROM s ORDER BY status"
    )
    assert cte.rows == [
        {"status": "Cancelled", "n": 667},
        {"status": "Complete", "n": 667},
        {"status": "Returned", "n": 666},
    ]
    assert sandbox.execute("SELECT * FROM orders__revenue_by_status").row_count == 3
    assert sandbox.execute("DESCRIBE orders").row_count == 5
    assert {r["name"] for r in sandbox.execute("SHOW TABLES").rows} == sandbox.relations
    joined = sandbox.execute(
        "SELECT u.country, count(*) AS n FROM orders o JOIN users u USING (user_id) "
        "GROUP BY ALL ORDER BY 1"
    )
    # 200 customers with 10 orders each; FR, JP, US hold 67, 66, 67 customers.
    assert [r["n"] for r in joined.rows] == [670, 660, 670]
    assert sandbox.execute("SELECT 'a;b' AS s").rows == [{"s": "a;b"}]


def test_row_cap_and_json_safe_values(sandbox: Sandbox) -> None:
    capped = sandbox.execute("SELECT * FROM orders")
    assert (capped.row_count, capped.row_cap_hit) == (100, True)
    exact = sandbox.execute("SELECT * FROM orders LIMIT 100")
    assert (exact.row_count, exact.row_cap_hit) == (100, False)
    row = sandbox.execute("SELECT * FROM orders WHERE order_id = 25").rows[0]
    assert row == {
        "order_id": 25,
        "user_id": 25,
        "status": "Cancelled",  # 25 % 3 == 1
        "created_at": "2021-01-02T01:00:00",
        "amount": 35.0,
    }
    json.dumps(capped.rows)  # must not raise
    assert json_safe(float("nan")) == "nan"
    assert sandbox.execute("SELECT 1 AS a, 2 AS a").rows == [{"a": 1, "a_2": 2}]


def test_sql_errors_are_readable(sandbox: Sandbox) -> None:
    with pytest.raises(QueryFailed, match="nosuch_column"):
        sandbox.execute("SELECT nosuch_column FROM orders")
    with pytest.raises(QueryFailed, match="syntax error"):
        sandbox.execute("SELEC 1")
    with pytest.raises(QueryRefused, match="empty"):
        sandbox.execute("   ")


def test_concurrent_queries_and_timeout_isolation(sandbox: Sandbox) -> None:
    """A runaway query on one thread is stopped without disturbing queries on others."""
    outcomes: dict[str, object] = {}

    def runaway() -> None:
        try:
            sandbox.execute("SELECT count(*) FROM orders a, orders b, orders c, orders d")
        except QueryRefused as exc:
            outcomes["runaway"] = str(exc)

    thread = threading.Thread(target=runaway)
    thread.start()
    counts = [sandbox.execute("SELECT count(*) AS n FROM users").rows[0]["n"] for _ in range(20)]
    thread.join(timeout=TIMEOUT_S + SLACK_S)
    assert counts == [200] * 20
    assert "time limit" in str(outcomes.get("runaway"))
