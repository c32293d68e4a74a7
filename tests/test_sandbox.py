"""Escape attempts against the embedded target's query path, through the real MCP client.

Every attack goes through `execute_query` over the real protocol, in-process and over stdio,
and must come back refused (an `is_error` result with a clear reason) within the time limit,
while an ordinary query keeps working on the same server afterwards.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pytest_evalloop.targets.embedded.data import TABLES
from pytest_evalloop.targets.embedded.model import SemanticModel
from pytest_evalloop.targets.embedded.query_child import json_safe
from pytest_evalloop.targets.embedded.query_host import GRACE_S
from pytest_evalloop.targets.embedded.sandbox import QueryFailed, QueryRefused, Sandbox
from pytest_evalloop.targets.embedded.server import build_server_from_parts
from tests.querygate import EVENT_CEILING_S, QueryGate, wait_exited

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
        args = [
            "-m",
            "pytest_evalloop.targets.embedded.server",
            str(tiny_set),
            "--transport",
            "stdio",
        ]
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
    from pytest_evalloop.targets.embedded.truth import truth_connection

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


# --- the limits hold for any query ----------------------------------------------------------

# The embedded target of the example set, hosted in-process by a fresh interpreter (as the
# pytest process hosts it) and driven through the real MCP client. Each hostile query reports
# its wall time, its reply, and the peak RSS of the hosting process and of the query process.
HOSTILE_SCRIPT = r"""
import asyncio, json, os, resource, sys, time
from pathlib import Path
from mcp import Client
from pytest_evalloop.targets.embedded.server import build_server_from_parts, load_set_target

model, data = load_set_target(Path(sys.argv[1]))
limits = json.loads(sys.argv[2])
queries = json.loads(sys.argv[3])


def hwm(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM"):
                return int(line.split()[1]) // 1024
    except OSError:
        return 0
    return 0


async def main():
    server = build_server_from_parts(model, data, **limits)
    async with Client(server) as client:
        await client.call_tool("execute_query", {"sql": "SELECT 1 AS warm"})
        for sql in queries:
            started = time.perf_counter()
            result = await client.call_tool("execute_query", {"sql": sql})
            wall = time.perf_counter() - started
            text = result.content[0].text
            cut = not result.is_error and json.loads(text).get("byteCapHit", False)
            # The query process: the live one's high-water mark, and every replaced one's.
            live = [int(p) for p in os.listdir("/proc") if p.isdigit() and _is_child(int(p))]
            peak = max([hwm(p) for p in live] + [resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024])
            after = await client.call_tool("execute_query", {"sql": "SELECT count(*) AS n FROM orders"})
            print(json.dumps({
                "sql": sql, "wall_s": round(wall, 2), "is_error": result.is_error, "cut": cut,
                "text": text[:300], "reply_bytes": len(text),
                # VmHWM, not ru_maxrss: the kernel carries ru_maxrss over from the process this
                # one was forked from (a pytest worker that may have grown to hundreds of MB).
                "host_peak_rss_mb": hwm(os.getpid()),
                "query_peak_rss_mb": peak, "next_ok": not after.is_error,
            }), flush=True)


def _is_child(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


asyncio.run(main())
"""
# The default memory limit; a time limit short enough that the slow ones meet it in seconds.
HOSTILE_LIMITS = {"timeout_s": 3.0, "memory_mb": 2048, "reply_bytes": 1_000_000}
# What the kernel's cap does not count but RSS does: the interpreter's and DuckDB's code pages.
RSS_MARGIN_MB = 160
# The process hosting the target only ever holds replies within the byte cap (the old code
# took it past 2 GB).
HOST_RSS_MB = 400
MEMORY = "more memory than the limit"
TIME = "past the time limit"
ANSWERED = "answered"
"""A heavy query a fast machine finishes within every limit: a right answer, not a breach."""
HOSTILE = [
    # (id, sql, what the reply may say: the words of an error, or "cut" for a shortened reply).
    # Which of memory and time a heavy query meets first depends on the machine; either holds.
    ("range-1e9", "SELECT len(range(1000000000)) AS n", (MEMORY,)),
    # Not interruptible: slower than the time limit on a loaded machine (the query process is
    # replaced), within it on an idle one.
    ("range-8e7", "SELECT len(range(80000000)) AS n", (TIME, MEMORY, ANSWERED)),
    (
        "cross-join-count",
        "SELECT count(*) AS n FROM inventory_items a CROSS JOIN order_items b",
        (TIME, ANSWERED),
    ),
    (
        "cross-join-sort",
        "SELECT a.*, b.* FROM inventory_items a CROSS JOIN order_items b "
        "ORDER BY a.cost DESC, b.sale_price DESC",
        (MEMORY, TIME),
    ),
    (
        "cross-join-list",
        "SELECT list(a.id) AS ids FROM inventory_items a CROSS JOIN order_items b",
        (MEMORY, TIME),
    ),
    # DuckDB takes 1.5 s to build the string on an idle machine: under load, the time limit;
    # and the memory cap may stop it first (seen in CI): each is a refusal within the limits.
    ("string-50mb", "SELECT repeat('x', 50000000) AS s", ("over the reply limit", TIME, MEMORY)),
    ("rows-of-5kb", "SELECT repeat('x', 5000) AS s FROM range(1000)", ("cut",)),
]


@pytest.fixture(scope="module")
def hostile_outcomes() -> dict[str, dict[str, Any]]:
    import subprocess

    from pytest_evalloop.targets.embedded.data import ensure_data
    from tests.conftest import EXAMPLE_SET

    ensure_data()  # generated outside the timed queries
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            HOSTILE_SCRIPT,
            str(EXAMPLE_SET),
            json.dumps(HOSTILE_LIMITS),
            json.dumps([sql for _, sql, _ in HOSTILE]),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return {name: line for (name, _, _), line in zip(HOSTILE, lines, strict=True)}


@pytest.mark.parametrize(
    ("name", "expected"), [(h[0], h[2]) for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_a_hostile_query_is_refused_or_cut_within_every_limit(
    hostile_outcomes: dict[str, dict[str, Any]], name: str, expected: tuple[str, ...]
) -> None:
    outcome = hostile_outcomes[name]
    text = outcome["text"]
    if expected == ("cut",):
        assert not outcome["is_error"] and outcome["cut"], text
    elif not outcome["is_error"]:
        # Answered: allowed only where the machine may finish it in time, and then whole.
        assert ANSWERED in expected and not outcome["cut"], text
    else:
        assert any(words in text for words in expected), text
    timeout = HOSTILE_LIMITS["timeout_s"]
    assert outcome["wall_s"] < timeout + 1.0 + SLACK_S, outcome  # the limit, the grace, slack
    if TIME in text:
        assert outcome["wall_s"] >= timeout * 0.9, outcome
    assert outcome["reply_bytes"] <= HOSTILE_LIMITS["reply_bytes"] + 1000
    assert outcome["query_peak_rss_mb"] <= HOSTILE_LIMITS["memory_mb"] + RSS_MARGIN_MB, outcome
    assert outcome["host_peak_rss_mb"] <= HOST_RSS_MB, outcome
    assert outcome["next_ok"], "the target must answer the next query"


# --- the query process ----------------------------------------------------------------------


def _example_sandbox(**limits: Any) -> Sandbox:
    from pytest_evalloop.targets.embedded.data import ensure_data
    from tests.conftest import EXAMPLE_SET

    return Sandbox(SemanticModel.load(EXAMPLE_SET / "model.json"), ensure_data(), **limits)


def test_the_engine_barrier_holds_in_the_query_process(sandbox: Sandbox, tiny_set: Path) -> None:
    """Past the policy check, the process that runs queries is locked just as tightly."""
    gold = _gold_path(tiny_set)
    for sql in (
        f"FROM read_csv('{gold}')",
        f"FROM '{gold}'",
        "COPY orders TO '/tmp/evalloop-child-leak.csv'",
        f"ATTACH '{tiny_set}/child-leak.duckdb' AS leak",
    ):
        with pytest.raises(QueryRefused, match="outside the model's sources") as caught:
            sandbox.run_unchecked(sql)
        assert GOLD_SECRET not in str(caught.value)
    with pytest.raises(QueryFailed, match="locked"):
        sandbox.run_unchecked("SET enable_external_access = true")
    assert not (tiny_set / "child-leak.duckdb").exists()
    assert not Path("/tmp/evalloop-child-leak.csv").exists()


def test_the_query_process_gets_no_secrets(tiny_set: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-" + "ant-child-must-not-see-this")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "tok-child-must-not-see-this")
    box = Sandbox(SemanticModel.load(tiny_set / "model.json"), tiny_set / "data")
    try:
        box.execute("SELECT 1 AS x")
        environ = Path(f"/proc/{box.query_pid}/environ").read_bytes()
    finally:
        box.close()
    assert b"child-must-not-see-this" not in environ
    assert b"ANTHROPIC" not in environ


def test_a_reply_is_cut_at_its_byte_cap(tiny_set: Path) -> None:
    box = Sandbox(
        SemanticModel.load(tiny_set / "model.json"), tiny_set / "data", reply_bytes=10_000
    )
    try:
        cut = box.execute("SELECT * FROM orders ORDER BY order_id")
        whole = box.execute("SELECT order_id FROM orders ORDER BY order_id LIMIT 20")
    finally:
        box.close()
    assert cut.byte_cap_hit and not cut.row_cap_hit
    assert 0 < cut.row_count < 100 and cut.row_count == len(cut.rows)
    assert len(json.dumps(cut.rows)) <= 10_000
    assert [r["order_id"] for r in cut.rows] == list(range(cut.row_count))  # a prefix, in order
    assert not whole.byte_cap_hit and whole.row_count == 20


@pytest.mark.anyio
async def test_the_reply_says_when_the_byte_cap_cut_it(tiny_set: Path) -> None:
    from pytest_evalloop.targets.embedded.server import QueryTool

    model = SemanticModel.load(tiny_set / "model.json")
    box = Sandbox(model, tiny_set / "data", reply_bytes=2_000)
    try:
        payload = json.loads(await QueryTool(box).reply("SELECT * FROM orders"))
    finally:
        box.close()
    assert payload["byteCapHit"] is True and payload["byteCap"] == 2_000
    assert payload["rowCapHit"] is False and payload["rowCount"] == len(payload["rows"])


def test_a_query_that_ignores_the_interrupt_is_stopped_by_replacing_the_process(
    query_gate: QueryGate,
) -> None:
    box = _example_sandbox(timeout_s=1.0)
    try:
        box.execute("SELECT 1 AS warm")
        first = box.query_pid
        # The gate never opens and never checks DuckDB's interrupt: the watchdog's interrupt
        # cannot stop it, so only replacing the process can, on any machine.
        started = time.perf_counter()
        with pytest.raises(QueryRefused, match="time limit of 1 s"):
            box.execute(query_gate.sql())
        elapsed = time.perf_counter() - started
        assert query_gate.started_pids() == {first}
        assert elapsed >= 1.0 + GRACE_S  # it was not answered before the grace ran out
        assert box.query_pid is not None and box.query_pid != first
        wait_exited(first)  # the kill lands when the kernel delivers it, not at the call
        assert box.execute("SELECT count(*) AS n FROM users").rows == [{"n": 24000}]
    finally:
        box.close()


def test_queries_in_flight_when_the_process_dies_are_run_again(
    tiny_set: Path, query_gate: QueryGate
) -> None:
    import signal

    box = Sandbox(SemanticModel.load(tiny_set / "model.json"), tiny_set / "data", timeout_s=60)
    try:
        box.execute("SELECT 1 AS warm")
        victim = box.query_pid
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["rows"] = box.execute(query_gate.sql()).rows
            except QueryRefused as exc:
                outcome["error"] = str(exc)

        thread = threading.Thread(target=run)
        thread.start()
        assert query_gate.wait_started() == {victim}  # in flight in the victim, and held there
        os.kill(victim, signal.SIGKILL)  # as if another query's overrun ended it
        # Sent again to the new process, where it is held at the gate too; then let it finish.
        [again] = query_gate.wait_started(count=2) - {victim}
        assert box.query_pid == again != victim
        query_gate.open()
        thread.join(timeout=EVENT_CEILING_S)
        assert outcome == {"rows": [{"n": 1}]}
    finally:
        box.close()


def test_a_process_left_heavy_by_a_query_is_retired(tiny_set: Path) -> None:
    box = Sandbox(SemanticModel.load(tiny_set / "model.json"), tiny_set / "data", memory_mb=512)
    try:
        box.execute("SELECT 1 AS warm")
        first = box.query_pid
        box.execute("SELECT count(*) AS n FROM orders")
        assert box.query_pid == first  # ordinary queries leave it light
        assert box.execute("SELECT len(range(20000000)) AS n").rows == [{"n": 20000000}]
        deadline = time.monotonic() + EVENT_CEILING_S
        while box.query_pid == first and time.monotonic() < deadline:
            time.sleep(0.01)  # the retire message arrives on the reader thread
        assert box.query_pid != first
        assert box.execute("SELECT count(*) AS n FROM orders").rows == [{"n": N_ORDERS}]
        wait_exited(first)  # the retired process must exit
    finally:
        box.close()


def test_the_query_process_ends_with_its_sandbox_and_with_its_parent(tiny_set: Path) -> None:
    import subprocess

    box = Sandbox(SemanticModel.load(tiny_set / "model.json"), tiny_set / "data")
    box.execute("SELECT 1 AS x")
    pid = box.query_pid
    box.close()
    with pytest.raises(ProcessLookupError):  # close() returns once the child is reaped
        os.kill(pid, 0)
    with pytest.raises(QueryFailed, match="closed"):
        box.execute("SELECT 2 AS x")
    # A sandbox dropped without close() (a server nobody closes) ends its child too.
    dropped = Sandbox(SemanticModel.load(tiny_set / "model.json"), tiny_set / "data")
    dropped.execute("SELECT 1 AS x")
    orphan = dropped.query_pid
    del dropped
    gc.collect()
    wait_exited(orphan)
    # A parent that dies without closing anything: the child sees its stdin close and exits.
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from pytest_evalloop.targets.embedded.model import SemanticModel\n"
        "from pytest_evalloop.targets.embedded.sandbox import Sandbox\n"
        f"box = Sandbox(SemanticModel.load(Path({str(tiny_set / 'model.json')!r})), "
        f"Path({str(tiny_set / 'data')!r}))\n"
        "box.execute('SELECT 1 AS x')\n"
        "print(box.query_pid, flush=True)\n"
        "os._exit(0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    orphan = int(done.stdout.strip())
    wait_exited(orphan)


def test_limits_are_checked() -> None:
    from pytest_evalloop.targets.embedded.query_limits import Limits

    with pytest.raises(ValueError, match="reply_bytes must be positive"):
        Limits(reply_bytes=0)
    with pytest.raises(ValueError, match="memory_mb must be at least 256"):
        Limits(memory_mb=100)
