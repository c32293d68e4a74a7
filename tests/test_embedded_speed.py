"""The embedded target's speed mechanisms give the same answers as the work they skip.

The read-only snapshot file, the memo of checked SQL, the memo of query replies, the shared
watchdog thread, the precomputed BM25 postings and the in-flight request tracking of a target
session: each is checked against a cold path (or a reference library) and for its bounds.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.failures import HarnessError
from pytest_evalloop.sets.cases import load_set_config
from pytest_evalloop.targets.embedded.data import ensure_data
from pytest_evalloop.targets.embedded.model import ModelFileError, SemanticModel
from pytest_evalloop.targets.embedded.retrieval import EntityIndex, okapi_postings, tokenize
from pytest_evalloop.targets.embedded.sandbox import BoundedMemo, QueryRefused, Sandbox
from pytest_evalloop.targets.embedded.server import QueryTool, build_server_from_parts
from pytest_evalloop.targets.embedded.snapshot import SNAPSHOT_CATALOG, snapshot_key, snapshot_path
from pytest_evalloop.targets.profiles import load_profile
from pytest_evalloop.targets.target import MCPTarget
from tests.querygate import QueryGate
from tests.test_sandbox import N_ORDERS, write_tiny_set

ECOMMERCE = Path(__file__).resolve().parent.parent / "evals" / "ecommerce"


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_set(tmp_path_factory.mktemp("speed"))


@pytest.fixture(scope="module")
def model(tiny_set: Path) -> SemanticModel:
    return SemanticModel.load(tiny_set / "model.json")


@pytest.fixture(scope="module")
def sandbox(model: SemanticModel, tiny_set: Path) -> Sandbox:
    return Sandbox(model, tiny_set / "data", row_cap=50, timeout_s=5.0)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


# --- BoundedMemo --------------------------------------------------------------------------


def test_memo_evicts_the_least_recently_used_entry_past_its_entry_bound() -> None:
    memo = BoundedMemo(max_entries=2, max_bytes=1000)
    memo.put("a", 1, 1)
    memo.put("b", 2, 1)
    assert memo.get("a") == 1  # "a" is now the most recently used
    memo.put("c", 3, 1)
    assert (memo.get("a"), memo.get("b"), memo.get("c")) == (1, None, 3)
    assert len(memo) == 2


def test_memo_stays_within_its_byte_bound_and_skips_oversized_values() -> None:
    memo = BoundedMemo(max_entries=100, max_bytes=10)
    memo.put("a", "x", 4)
    memo.put("b", "y", 4)
    memo.put("c", "z", 4)  # 12 bytes: the oldest goes
    assert memo.get("a") is None
    assert memo.size == 8
    memo.put("huge", "w", 11)
    assert memo.get("huge") is None
    assert memo.size == 8
    memo.put("b", "y2", 2)  # replacing a key re-counts its size
    assert (memo.get("b"), memo.size) == ("y2", 6)


def test_memo_rejects_nonsense_bounds() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        BoundedMemo(max_entries=0, max_bytes=10)


# --- the snapshot file --------------------------------------------------------------------


def test_the_snapshot_is_built_once_and_opened_read_only(
    model: SemanticModel, tiny_set: Path, tmp_path: Path
) -> None:
    import duckdb

    path = snapshot_path(model, tiny_set / "data", cache_dir=tmp_path)
    stat = path.stat()
    again = snapshot_path(model, tiny_set / "data", cache_dir=tmp_path)
    assert again == path
    assert (again.stat().st_ino, again.stat().st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no scratch file left
    con = duckdb.connect(str(path), read_only=True)
    try:
        names = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        # The model's sources, and none of the raw tables they were built from.
        assert names == {"orders", "users"}
        assert con.execute("SELECT current_database()").fetchone() == (SNAPSHOT_CATALOG,)
        assert con.execute("SELECT count(*) FROM orders").fetchone() == (N_ORDERS,)
    finally:
        con.close()


def test_the_snapshot_key_follows_the_model_and_the_data(
    model: SemanticModel, tiny_set: Path, tmp_path: Path
) -> None:
    key = snapshot_key(model, tiny_set / "data")
    changed = model.model_copy(update={"doc": model.doc + " Changed."})
    assert snapshot_key(changed, tiny_set / "data") != key
    data = tmp_path / "data"
    data.mkdir()
    for file in (tiny_set / "data").iterdir():
        data.joinpath(file.name).write_bytes(file.read_bytes())
    assert snapshot_key(model, data) == key  # same bytes elsewhere: same snapshot
    users = data / "users.parquet"
    users.write_bytes(users.read_bytes() + b"\0")
    assert snapshot_key(model, data) != key


def test_a_missing_raw_file_and_a_broken_model_are_named(
    model: SemanticModel, tiny_set: Path, tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError, match=r"users\.parquet is missing"):
        snapshot_path(model, tmp_path, cache_dir=tmp_path / "cache")
    broken = SemanticModel.model_validate(
        {
            "name": "b",
            "doc": "x",
            "sources": [
                {
                    "name": "orders",
                    "doc": "x",
                    "from": "orders",
                    "grain": "x",
                    "dimensions": [{"name": "nope", "doc": "no such column"}],
                }
            ],
        }
    )
    with pytest.raises(ModelFileError, match="orders"):
        snapshot_path(broken, tiny_set / "data", cache_dir=tmp_path / "cache")
    leftovers = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert leftovers == []


def test_an_unusable_cache_falls_back_to_a_private_folder(
    model: SemanticModel, tiny_set: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    path = snapshot_path(model, tiny_set / "data", cache_dir=blocker)
    assert path.is_file()
    assert not str(path).startswith(str(blocker))


def test_sandboxes_over_one_snapshot_share_it_and_stay_usable_after_one_closes(
    model: SemanticModel, tiny_set: Path
) -> None:
    first = Sandbox(model, tiny_set / "data")
    second = Sandbox(model, tiny_set / "data")
    first.close()
    assert second.execute("SELECT count(*) AS n FROM orders").rows == [{"n": N_ORDERS}]
    second.close()


# --- the checked-SQL memo and repeatability -----------------------------------------------


def test_a_repeated_query_is_checked_once_and_gives_the_cold_result(sandbox: Sandbox) -> None:
    sql = "SELECT status, count(*) AS n FROM orders GROUP BY status ORDER BY status"
    before = len(sandbox._checked)
    cold = sandbox.execute(sql)
    assert len(sandbox._checked) == before + 1
    warm = sandbox.execute(sql)
    assert len(sandbox._checked) == before + 1
    assert (warm.columns, warm.rows, warm.repeatable) == (cold.columns, cold.rows, True)


def test_a_refused_query_is_never_remembered_as_checked(sandbox: Sandbox) -> None:
    sql = "SELECT * FROM read_csv('/etc/hostname')"
    before = len(sandbox._checked)
    for _ in range(2):
        with pytest.raises(QueryRefused, match="read_csv"):
            sandbox.execute(sql)
    assert len(sandbox._checked) == before
    assert sandbox._checked.get(sql) is None


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT random() AS r",
        "SELECT now() AS t",
        "SELECT current_date AS d",
        "SELECT gen_random_uuid() AS u",
        "SELECT order_id FROM orders USING SAMPLE 10",
        "SELECT count(*) AS n FROM orders WHERE amount > (SELECT 50 * random())",
    ],
)
def test_random_clock_and_sampled_queries_are_not_repeatable(sandbox: Sandbox, sql: str) -> None:
    assert sandbox.execute(sql).repeatable is False


def test_queries_start_no_thread_in_this_process(sandbox: Sandbox) -> None:
    # The queries run in the query process (one watchdog thread there); here each sandbox has
    # one thread reading that process's replies, and a query adds none.
    sandbox.execute("SELECT 1 AS n")
    before = set(threading.enumerate())
    for _ in range(20):
        sandbox.execute("SELECT count(*) AS n FROM users")
    # None started; one of an earlier test's sandbox may end meanwhile (its process is gone,
    # its reader thread sees the pipe close in its own time): that is no thread of these.
    started = [t.name for t in threading.enumerate() if t not in before]
    assert started == []
    names = [t.name for t in threading.enumerate()]
    assert "evalloop-query-host" in names
    assert not any("Timer" in n or "watchdog" in n for n in names)


# --- the reply memo of execute_query ------------------------------------------------------


@pytest.mark.anyio
async def test_a_remembered_reply_is_the_cold_reply(sandbox: Sandbox, model: Any) -> None:
    tool = QueryTool(sandbox)
    sql = "SELECT user_id, count(*) AS n FROM orders GROUP BY user_id ORDER BY user_id LIMIT 5"
    cold = await tool.reply(sql)
    assert len(tool.replies) == 1
    warm = await tool.reply(sql)
    assert warm == cold
    fresh = await QueryTool(sandbox).reply(sql)
    assert fresh == cold
    assert json.loads(cold)["rowCount"] == 5


@pytest.mark.anyio
async def test_refusals_failures_and_volatile_queries_are_not_remembered(
    sandbox: Sandbox,
) -> None:
    tool = QueryTool(sandbox)
    for sql in ("DROP TABLE orders", "SELECT nosuch FROM orders"):
        for _ in range(2):
            with pytest.raises(QueryRefused):
                await tool.reply(sql)
    randoms = {json.loads(await tool.reply("SELECT random() AS r"))["rows"][0]["r"] for _ in "ab"}
    assert len(randoms) == 2  # ran twice, not served from memory
    assert len(tool.replies) == 0


@pytest.mark.anyio
async def test_the_reply_memo_is_bounded(sandbox: Sandbox) -> None:
    tool = QueryTool(sandbox, max_entries=3, max_bytes=10_000)
    for n in range(6):
        await tool.reply(f"SELECT {n} AS n")
    assert len(tool.replies) == 3
    assert tool.replies.get("SELECT 0 AS n") is None
    assert tool.replies.get("SELECT 5 AS n") is not None


def test_the_server_runs_without_the_tracing_middleware(
    model: SemanticModel, tiny_set: Path
) -> None:
    server = build_server_from_parts(model, tiny_set / "data")
    names = [type(layer).__name__ for layer in server.middleware]
    assert "OpenTelemetryMiddleware" not in names
    assert names  # the SDK's other layers (request state) stay


# --- retrieval ----------------------------------------------------------------------------


def test_okapi_postings_score_exactly_as_rank_bm25() -> None:
    from rank_bm25 import BM25Okapi

    from pytest_evalloop.targets.embedded.retrieval import _document

    entities = SemanticModel.load(ECOMMERCE / "model.json").entities()
    corpus = [_document(e) for e in entities]
    reference = BM25Okapi(corpus)
    postings = okapi_postings(corpus)
    questions = [
        json.loads(line)["question"]
        for line in (ECOMMERCE / "cases.jsonl").read_text().splitlines()
        if line.strip()
    ]
    for question in [*questions, "order order status", "zzz unknown words", "total"]:
        terms = tokenize(question)
        scores = [0.0] * len(corpus)
        for term in terms:
            for position, weight in postings.get(term, ()):
                scores[position] += weight
        assert scores == [float(x) for x in reference.get_scores(terms)], question


def test_ranking_is_deterministic_and_independent_of_query_history() -> None:
    entities = SemanticModel.load(ECOMMERCE / "model.json").entities()
    warm = EntityIndex(entities)
    for word in ("revenue", "customers", "shipping", "returned orders by month"):
        warm.rank(word)
    cold = EntityIndex(entities)
    for query in ("revenue by category", "returned orders by month", "age of buyers"):
        assert warm.rank(query) == cold.rank(query)
        assert warm.rank(query, source="orders", limit=3) == cold.rank(
            query, source="orders", limit=3
        )


# --- the target session's in-flight requests ----------------------------------------------


@pytest.mark.anyio
async def test_closing_the_target_ends_a_request_in_flight_as_a_harness_error(
    model: SemanticModel, tiny_set: Path, query_gate: QueryGate
) -> None:
    server = build_server_from_parts(model, tiny_set / "data", timeout_s=60.0)
    target = MCPTarget(server, load_profile(None, load_set_config(tiny_set), tiny_set), name="t")
    session = await target.open()
    slow = asyncio.ensure_future(session.execute(query_gate.sql()))  # the gate never opens
    await asyncio.to_thread(query_gate.wait_started)  # in flight, for as long as the test likes
    assert not slow.done()
    await target.close()
    with pytest.raises(HarnessError, match="target t"):
        await asyncio.wait_for(slow, 15)
    assert not session._inflight


@pytest.mark.anyio
async def test_a_cancelled_caller_stays_cancelled(
    model: SemanticModel, tiny_set: Path, query_gate: QueryGate
) -> None:
    server = build_server_from_parts(model, tiny_set / "data", timeout_s=60.0)
    target = MCPTarget(server, load_profile(None, load_set_config(tiny_set), tiny_set), name="t")
    session = await target.open()
    try:
        slow = asyncio.ensure_future(session.execute(query_gate.sql()))  # never opened
        await asyncio.to_thread(query_gate.wait_started)  # the query is running in the child
        assert not slow.done()
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        outcome = await session.execute("SELECT count(*) AS n FROM orders")
        assert outcome.rows == [{"n": N_ORDERS}]
    finally:
        await target.close()


def test_ensure_data_cache_is_used_for_the_example_set() -> None:
    # The example set's snapshot lives under the same cache root as its raw data.
    model = SemanticModel.load(ECOMMERCE / "model.json")
    path = snapshot_path(model, ensure_data())
    assert os.path.commonpath([path, ensure_data().parent]) == str(ensure_data().parent)


# --- the model's entities -------------------------------------------------------------------


def test_entities_are_derived_once_and_match_a_fresh_load() -> None:
    model = SemanticModel.load(ECOMMERCE / "model.json")
    first = model.entities()
    assert model.entities() == first
    assert model.entities()[0] is first[0]  # remembered, not rebuilt
    assert first == SemanticModel.load(ECOMMERCE / "model.json").entities()
    ids = [e.id for e in first[:6]]
    assert model.definitions_for(ids) == SemanticModel.load(
        ECOMMERCE / "model.json"
    ).definitions_for(ids)


def test_a_copy_with_other_sources_derives_its_own_entities() -> None:
    model = SemanticModel.load(ECOMMERCE / "model.json")
    model.entities()
    narrowed = model.model_copy(update={"sources": model.sources[:1]})
    assert {e.source for e in narrowed.entities()} == {model.sources[0].name}
    assert len(model.entities()) > len(narrowed.entities())
    with pytest.raises(ValueError, match="frozen"):
        model.sources = []  # type: ignore[misc]


def test_a_damaged_snapshot_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_dir = write_tiny_set(tmp_path)
    model = SemanticModel.load(set_dir / "model.json")
    monkeypatch.setenv("EVALLOOP_CACHE_DIR", str(tmp_path / "cache"))
    path = snapshot_path(model, set_dir / "data")
    path.write_bytes(b"not a database" * 1000)
    box = Sandbox(model, set_dir / "data")
    try:
        assert box.execute("SELECT count(*) AS n FROM orders").rows == [{"n": N_ORDERS}]
    finally:
        box.close()
