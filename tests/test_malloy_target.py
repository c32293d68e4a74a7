"""The malloy target's server: the real compiler behind Publisher's tool names, over real MCP.

One server per package for the whole module (starting one costs about a second and ~250 MB):
the answerer's package and the truth package of `evals/ecommerce-malloy`, driven through the
real `mcp` SDK client exactly as `MalloyTarget` drives them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MALLOY_SET, REPO

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="the malloy target needs node and npm on PATH (install Node.js 20+)",
)

SET_DIR = REPO / "evals" / "ecommerce-malloy"
MODEL_ARGS = {
    "environmentName": "local",
    "packageName": "ecommerce",
    "modelPath": "ecommerce.malloy",
}


@functools.cache
def ensure_set_data() -> None:
    """The set's generated tables, linked from the cache (its conftest does it on a real run;
    generated once per machine), once per test process."""
    import runpy

    runpy.run_path(str(SET_DIR / "conftest.py"))


class Servers:
    """The model and truth servers on one private loop, called synchronously by the tests.

    One task owns both clients from start to close (anyio's cancel scopes must be left by the
    task that entered them); the tests' calls run on the same loop in between.
    """

    def __init__(self) -> None:
        from pytest_evalloop.sets.cases import load_set_config
        from pytest_evalloop.targets.malloy.package import malloy_spec

        self.spec = malloy_spec(SET_DIR, load_set_config(SET_DIR), None)
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.owner: Any = None

    def start(self) -> None:
        ready = self.loop.create_future()
        self.owner = self.loop.create_task(self._own(ready))
        self.loop.run_until_complete(ready)

    async def _own(self, ready: asyncio.Future[None]) -> None:
        from mcp import Client

        from pytest_evalloop.targets.malloy.package import server_parameters

        assert self.spec.truth_root is not None
        async with (
            Client(server_parameters(self.spec.root), mode="legacy") as self.model,
            Client(server_parameters(self.spec.truth_root), mode="legacy") as self.truth,
        ):
            ready.set_result(None)
            await self.stop.wait()

    def call(self, client: Any, tool: str, args: dict[str, Any]) -> tuple[bool, Any, str]:
        result = self.loop.run_until_complete(client.call_tool(tool, args))
        payload = None
        texts = []
        for block in result.content:
            resource = getattr(block, "resource", None)
            if resource is not None and payload is None:
                payload = json.loads(resource.text)
            if getattr(block, "text", None):
                texts.append(block.text)
        return bool(result.is_error), payload, "\n".join(texts)

    def close(self) -> None:
        self.stop.set()
        if self.owner is not None:
            self.loop.run_until_complete(self.owner)
        self.loop.close()


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    ensure_set_data()
    running = Servers()
    running.start()
    yield running
    running.close()


def _reference_cases() -> list[dict[str, Any]]:
    lines = (MALLOY_SET / "cases.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_every_reference_model_and_canonical_query_compiles_and_runs(servers: Servers) -> None:
    from pytest_evalloop.targets.malloy.truth import rewrite_tables, truth_sources

    assert servers.spec.truth_root is not None and servers.spec.truth_model_path
    sources = truth_sources(servers.spec.truth_root, servers.spec.truth_model_path)
    assert sources["data/order_items.parquet"] == "order_items"
    cases = _reference_cases()
    model_queries = [c["modelQuery"] for c in cases if c.get("modelQuery")]
    canonical = [c["golden"]["canonicalQuery"] for c in cases if c["golden"].get("canonicalQuery")]
    assert len(model_queries) == 45 and len(canonical) == 45
    failed = []
    for query in model_queries:
        error, payload, text = servers.call(
            servers.model, "malloy_executeQuery", {**MODEL_ARGS, "query": query}
        )
        if error or not isinstance(payload.get("rows"), list):
            failed.append(("model", query[:60], text[:200]))
    truth_args = {**MODEL_ARGS, "packageName": "ecommerce-truth", "modelPath": "truth.malloy"}
    raw_refused = 0
    for query in canonical:
        error, payload, text = servers.call(
            servers.truth,
            "malloy_executeQuery",
            {**truth_args, "query": rewrite_tables(query, sources)},
        )
        if error or not payload["rows"]:
            failed.append(("truth", query[:60], text[:200]))
        raw_refused += "duckdb.table(" in query
    assert failed == []
    # Without the rewrite the table form is what restricted mode refuses (37 of the 45).
    assert raw_refused == 37


def test_a_restricted_construct_is_a_tool_error_the_answerer_sees(servers: Servers) -> None:
    error, payload, text = servers.call(
        servers.model,
        "malloy_executeQuery",
        {
            **MODEL_ARGS,
            "query": "run: duckdb.table('data/order_items.parquet') -> { aggregate: c is count() }",
        },
    )
    assert error is True
    assert "restricted" in payload["error"] and "query:1:" in payload["error"]
    assert any(p["code"] == "restricted-construct-forbidden" for p in payload["problems"])
    assert "Suggestions:" in text
    # A broken query is a compiler error naming the line, not a crash of the server.
    error, payload, _ = servers.call(
        servers.model,
        "malloy_executeQuery",
        {**MODEL_ARGS, "query": "run: order_items -> {\n aggregate: no_such_measure\n}"},
    )
    assert (
        error is True and "query:2:" in payload["error"] and "no_such_measure" in payload["error"]
    )
    error, payload, _ = servers.call(
        servers.model,
        "malloy_executeQuery",
        {**MODEL_ARGS, "query": "run: order_items -> { aggregate: order_count }"},
    )
    assert error is False and payload["rows"][0]["order_count"] > 0


def test_the_answerers_server_cannot_reach_the_truth_package_or_the_set(servers: Servers) -> None:
    error, payload, _ = servers.call(
        servers.model, "malloy_getContext", {"environmentName": "local"}
    )
    assert [r["name"] for r in payload["results"]] == ["ecommerce"]
    for tool, args in (
        (
            "malloy_getContext",
            {"environmentName": "local", "packageName": "ecommerce-truth", "query": "order"},
        ),
        (
            "malloy_executeQuery",
            {
                **MODEL_ARGS,
                "packageName": "ecommerce-truth",
                "modelPath": "truth.malloy",
                "query": "run: order_items -> { aggregate: c is count() }",
            },
        ),
        (
            "malloy_executeQuery",
            {
                **MODEL_ARGS,
                "modelPath": "../ecommerce-truth/truth.malloy",
                "query": "run: order_items -> { aggregate: c is count() }",
            },
        ),
    ):
        error, payload, _ = servers.call(servers.model, tool, args)
        assert error is True and "not" in payload["error"], (tool, args, payload)
    for query in (
        "import '../ecommerce-truth/truth.malloy'\nrun: order_items -> { aggregate: c is count() }",
        "run: duckdb.table('../cases.jsonl') -> { select: * }",
        "run: duckdb.sql(\"select * from read_text('../cases.jsonl')\") -> { select: * }",
    ):
        error, payload, _ = servers.call(
            servers.model, "malloy_executeQuery", {**MODEL_ARGS, "query": query}
        )
        assert error is True and "cases.jsonl" not in json.dumps(payload.get("rows", [])), query
        assert "restricted" in payload["error"], payload["error"]


def test_get_context_ranks_the_compiled_models_entities_with_their_docs(servers: Servers) -> None:
    error, payload, _ = servers.call(
        servers.model,
        "malloy_getContext",
        {"environmentName": "local", "packageName": "ecommerce", "query": "total sales 2022"},
    )
    assert error is False
    top = payload["results"][:5]
    assert ("measure", "order_items", "total_sales_2022") in [
        (e["kind"], e["source"], e["name"]) for e in top
    ]
    entity = next(e for e in payload["results"] if e["name"] == "total_sales_2022")
    assert entity["doc"] == "Total sales in 2022" and entity["modelPath"] == "ecommerce.malloy"
    assert len(payload["sourceContentSha"]) == 64
    _, listing, _ = servers.call(
        servers.model, "malloy_getContext", {"environmentName": "local", "packageName": "ecommerce"}
    )
    assert {e["name"] for e in listing["results"]} == {
        "users",
        "product",
        "inventory_items",
        "user_order_facts",
        "order_items",
    }


def _package(tmp_path: Path, model: str) -> Path:
    root = tmp_path / "pkg"
    (root / "data").mkdir(parents=True)
    shutil.copyfile(
        SET_DIR / "ecommerce" / "data" / "products.parquet", root / "data" / "products.parquet"
    )
    (root / "m.malloy").write_text(model, encoding="utf-8")
    return root


def test_a_missing_table_file_is_named_before_compiling(tmp_path: Path) -> None:
    from pytest_evalloop.targets.malloy.package import MalloySpec, check_package, package_problem

    root = _package(
        tmp_path,
        "source: p is duckdb.table('data/products.parquet')\n"
        "source: o is duckdb.table('data/order_items.parquet')\n",
    )
    check = check_package(root)
    assert check.ok is False
    [problem] = check.problems
    assert problem.file == "m.malloy" and problem.line == 2 and problem.code == "missing-table-file"
    assert "data/order_items.parquet does not exist" in problem.message
    text = package_problem(MalloySpec(name="malloy:pkg", root=root, model_path="m.malloy"))
    assert text is not None and f"{root / 'm.malloy'}:2:" in text
    # A table of the malloy-samples ecommerce package: named with the command that makes it.
    assert f"its table files are missing: `evalloop malloy-data {root / 'data'}` generates" in text
    (root / "m.malloy").write_text("source: s is duckdb.table('data/sessions.parquet')\n")
    text = package_problem(MalloySpec(name="malloy:pkg", root=root, model_path="m.malloy"))
    assert text is not None and "sessions.parquet does not exist" in text
    assert "its table files are missing: copy them there" in text and "malloy-data" not in text


def test_a_model_that_does_not_compile_reports_the_compilers_file_and_line(tmp_path: Path) -> None:
    from pytest_evalloop.targets.malloy.package import check_package

    root = _package(
        tmp_path,
        "source: p is duckdb.table('data/products.parquet') extend {\n"
        "  measure: n is count()\n"
        "  measure: bad is no_such_column.sum()\n"
        "}\n",
    )
    check = check_package(root)
    assert check.ok is False
    assert [(p.file, p.line) for p in check.problems] == [("m.malloy", 3)]
    assert "no_such_column" in check.problems[0].message
    assert check.pins["compilerVersion"] == "0.0.431"


def test_the_npm_tree_is_installed_from_the_lock_into_the_cache() -> None:
    from pytest_evalloop.targets.malloy import install

    server = install.ensure_server()
    tree = server.parent
    assert tree == install.install_root() / install.lock_sha()
    assert (tree / install.STAMP).read_text().strip() == install.lock_sha()
    locked = json.loads((install.HERE / "package-lock.json").read_text())
    pinned = locked["packages"]["node_modules/@malloydata/malloy"]["version"]
    installed = json.loads((tree / "node_modules/@malloydata/malloy/package.json").read_text())
    assert installed["version"] == pinned == "0.0.431"
    antlr = json.loads((tree / "node_modules/antlr4ts/package.json").read_text())
    assert antlr["version"] == "0.5.0-alpha.4"  # the override: npm's own pick breaks the compiler
    script = (REPO / "tools" / "real_components.sh").read_text()
    assert "malloy-server" in script and "ensure_server" in script


def test_every_scored_golden_is_proven_two_ways_on_the_truth_package(servers: Servers) -> None:
    """Each verified golden's canonical Malloy query (truth server) and its SQL second
    derivation (DuckDB straight on the table files) agree, and so does its modelQuery through
    the model, compared by value (the model's measure names are not the golden's); a wrong or
    missing second derivation is caught."""
    from pytest_evalloop.goldens.preflight import golden_refusal
    from pytest_evalloop.sets import cases as sets
    from pytest_evalloop.targets.choice import truth_source
    from pytest_evalloop.targets.embedded.goldens import derive_golden, verify_case
    from pytest_evalloop.targets.malloy.truth import is_sql

    def model_rows(query: str) -> list[dict[str, Any]]:
        error, payload, text = servers.call(
            servers.model, "malloy_executeQuery", {**MODEL_ARGS, "query": query}
        )
        if error:
            raise ValueError(text)
        rows: list[dict[str, Any]] = payload["rows"]
        return rows

    ensure_set_data()
    rows = [case for _, case in sets.load_cases(SET_DIR).rows]
    scored = [c for c in rows if golden_refusal(c) is None and c.golden and c.golden.value]
    assert len(scored) == 39
    source = truth_source(SET_DIR, sets.load_set_config(SET_DIR), target=None)
    assert source is not None and source.kind == "malloy"
    truth = source.open()
    try:
        problems = [p.message for c in scored for p in verify_case(c.raw(), SET_DIR, truth=truth)]
        assert problems == []
        # Every route, the model's included: what `--eval-verify-goldens` checks on this set.
        derivable = [
            c for c in rows if c.golden is not None and c.golden.kind in ("scalar", "rows")
        ]
        found = {
            c.qid: derive_golden(c.raw(), SET_DIR, truth=truth, model_query_runner=model_rows)
            for c in derivable
        }
        for c in derivable:
            drifts = [d.message for d in found[c.qid].drifts]
            if c in scored:
                assert drifts == [], c.qid
            else:  # provisional: what it lacks, never its own canonical query
                assert not [d for d in found[c.qid].drifts if d.route == "canonical"], drifts
        paired = {q: f.paired for q, f in found.items() if f.paired}
        assert len(paired) == 12
        assert paired["ecom_customer_count"] == {"model": "buyers = user_count"}
        assert paired["ecom_2022_sales_casual"] == {"model": "total_sales = total_sales_2022"}
        rank = "rank = (row order)"
        assert paired["ecom_top_categories"] == {"canonical": rank, "model": rank}
        seconds = [c.raw()["golden"]["verification"]["secondQuery"] for c in scored]
        assert all(is_sql(q) for q in seconds) and not any(
            is_sql(c.golden.canonical_query or "") for c in scored
        )
        case = next(c.raw() for c in scored if c.qid == "ecom_order_count")
        wrong = json.loads(json.dumps(case))
        wrong["golden"]["verification"]["secondQuery"] = (
            "SELECT count(*) AS order_count FROM order_items"  # lines, not orders
        )
        [drift] = verify_case(wrong, SET_DIR, truth=truth)
        assert (drift.route, drift.problem) == ("second", "disagrees")
        assert "order_count: stored 257900, derived 271019" in drift.message
        del wrong["golden"]["verification"]
        unproven = verify_case(wrong, SET_DIR, truth=truth)
        assert {(d.route, d.problem) for d in unproven} == {("second", "unproven")}
    finally:
        truth.close()
    assert is_sql("-- why\n  WITH x AS (SELECT 1) SELECT * FROM x")
    assert not is_sql("run: with_tax -> { aggregate: n is count() }")


def test_the_claude_code_answerer_reaches_the_malloy_server_itself(tmp_path: Path) -> None:
    """The claude-code answerer (the stand-in CLI, which shares the real CLI's code path) is
    given the malloy target's own stdio command, starts the server itself, and its final query
    re-executes through the harness's session on the same package."""
    from pytest_evalloop.answer.answerer import choose_final_query
    from pytest_evalloop.answer.claude_code import ClaudeCodeAnswerer
    from pytest_evalloop.sets.cases import load_set_config
    from pytest_evalloop.targets.choice import build_target
    from pytest_evalloop.testing.fake_claude import install_fake_claude

    ensure_set_data()
    [case] = [
        json.loads(line)
        for line in (SET_DIR / "cases.jsonl").read_text(encoding="utf-8").splitlines()
        if '"ecom_customer_count"' in line
    ]
    context = {"environmentName": "local", "packageName": "ecommerce", "query": "customers"}
    policy = {
        "record_file": str(tmp_path / "record.jsonl"),
        "cases_file": str(SET_DIR / "cases.jsonl"),
        "by_question": {
            case["question"]: [
                {"tool": "malloy_getContext", "input": context},
                {"tool": "malloy_executeQuery", "input": {**MODEL_ARGS, "query": "{modelQuery}"}},
                {"tool": "malloy_executeQuery", "input": {**MODEL_ARGS, "query": "run: nope"}},
                {"text": "Final query:\n```malloy\n{modelQuery}\n```"},
            ]
        },
    }
    (tmp_path / "policy.json").write_text(json.dumps(policy), encoding="utf-8")
    shim = install_fake_claude(tmp_path / "bin", tmp_path / "policy.json")
    answerer = ClaudeCodeAnswerer(
        model="claude-sonnet-4-6", executable=str(shim), max_turns=8, timeout_s=120.0
    )

    async def main() -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
        target = build_target(SET_DIR, load_set_config(SET_DIR), target=None, tool_profile=None)
        session = await target.open()
        try:
            config = session.mcp_server_config()
            record = await answerer.answer(case["question"], session)
            final, _ = choose_final_query(record.declared_final, record.tool_log)
            rows = (await session.execute(final)).rows if final else []
            return record, rows, config
        finally:
            await target.close()

    record, rows, config = asyncio.run(main())
    assert config["type"] == "stdio" and config["args"][0].endswith("server.mjs")
    assert config["args"][config["args"].index("--root") + 1] == str(SET_DIR / "ecommerce")
    assert [(u.tool, u.role, u.is_mcp, u.ok) for u in record.tool_log] == [
        ("malloy_getContext", "context", True, True),
        ("malloy_executeQuery", "query", True, True),
        ("malloy_executeQuery", "query", True, False),
    ]
    ids = {r["id"] for r in record.tool_log[0].context_results}
    assert "source:users:users" in ids  # Malloy entity ids, from the compiled model
    assert "query:1:6: Reference to undefined object 'nope'" in (record.tool_log[2].error or "")
    assert record.declared_final == case["modelQuery"]
    assert rows == [{"user_count": case["golden"]["value"]["buyers"]}]
