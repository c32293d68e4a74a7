"""The Publisher-shaped fake, seen through the real `mcp.Client`: names, schemas, tiers, errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.testing.fake_publisher import (
    BOTH_QUERIES,
    NEITHER_QUERY,
    TOOL_NAMES,
    FakePublisher,
    Script,
    build_fake_publisher,
    entities_from_malloy,
)

MALLOY = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "reference"
    / "malloy-samples"
    / "ecommerce"
    / "ecommerce.malloy"
)
MODEL = {"environmentName": "local", "packageName": "ecommerce", "modelPath": "ecommerce.malloy"}
BIG = 2**53 + 1


@pytest.fixture(scope="module")
def entities() -> list[dict[str, Any]]:
    return entities_from_malloy(MALLOY.read_text(encoding="utf-8"))


@pytest.fixture
def publisher(entities: list[dict[str, Any]]) -> FakePublisher:
    script = Script.from_data(
        {
            "queries": {
                "run: order_items -> { aggregate: total_sales }": [{"total_sales": 10.5}],
                "run: order_items -> { group_by: id }": [{"id": i} for i in range(8)],
                "run: order_items -> { group_by: id; limit: 8 }": [{"id": i} for i in range(8)],
                "run: order_items -> wide": [{"text": "x" * 100} for _ in range(10)],
                "run: order_items -> { group_by: big }": [{"big": BIG, "small": 7}],
                "run: order_items -> top_categories": [{"category": "Jeans"}],
                "run: order_items -> { group_by: nope }": {
                    "error": "'nope' is not defined",
                    "suggestions": ["Check field names with malloy_getContext"],
                },
            }
        }
    )
    return FakePublisher(entities=entities, script=script, row_limit=5, max_response_chars=500)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(publisher: FakePublisher) -> AsyncIterator[Any]:
    from mcp import Client

    async with Client(build_fake_publisher(publisher), mode="legacy") as mcp_client:
        yield mcp_client


async def _payload(client: Any, tool: str, arguments: dict[str, Any]) -> tuple[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    block = result.content[0]
    assert block.type == "resource"
    assert block.resource.mime_type == "application/json"
    return block.resource.uri, json.loads(block.resource.text)


# --- names and schemas -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_lists_publishers_seven_tools_with_camel_case_schemas(client: Any) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert list(tools) == list(TOOL_NAMES)
    assert "malloy_getContext" in tools and "malloy_executeQuery" in tools
    query = tools["malloy_executeQuery"].input_schema
    assert query["required"] == ["environmentName", "packageName", "modelPath"]
    expected = {"query", "queryName", "sourceName", "filterParams", "givens"}
    assert expected | set(MODEL) == set(query["properties"])
    context = tools["malloy_getContext"].input_schema
    assert context["required"] == []
    assert context["properties"]["limit"]["maximum"] == 50
    assert context["properties"]["query"]["maxLength"] == 500


@pytest.mark.anyio
async def test_stub_tools_answer_with_the_resource_envelope(client: Any) -> None:
    _, status = await _payload(client, "malloy_getStatus", {})
    assert status["operationalState"] == "serving"
    _, docs = await _payload(client, "malloy_searchDocs", {"query": "nest"})
    assert docs == {"results": []}


# --- malloy_getContext's four tiers ----------------------------------------------------------


@pytest.mark.anyio
async def test_tier_one_lists_environments(client: Any) -> None:
    uri, payload = await _payload(client, "malloy_getContext", {})
    assert uri == "malloy://environment/home#get-context"
    expected = {"kind": "environment", "name": "local", "packages": ["ecommerce"]}
    assert payload["results"] == [expected]


@pytest.mark.anyio
async def test_tier_two_lists_packages(client: Any) -> None:
    uri, payload = await _payload(client, "malloy_getContext", {"environmentName": "local"})
    assert uri == "malloy://environment/local#get-context"
    [package] = payload["results"]
    assert package["kind"] == "package" and package["name"] == "ecommerce"
    assert package["environmentName"] == "local" and package["description"]


@pytest.mark.anyio
async def test_tier_three_lists_sources(client: Any) -> None:
    arguments = {"environmentName": "local", "packageName": "ecommerce"}
    uri, payload = await _payload(client, "malloy_getContext", arguments)
    assert uri == "malloy://environment/local/package/ecommerce#get-context"
    names = [r["name"] for r in payload["results"]]
    assert names == ["users", "product", "inventory_items", "user_order_facts", "order_items"]
    assert {r["kind"] for r in payload["results"]} == {"source"}
    assert payload["results"][0]["modelPath"] == "ecommerce.malloy"


@pytest.mark.anyio
async def test_tier_four_ranks_entities_without_ids_or_ranks(client: Any) -> None:
    arguments = {
        "environmentName": "local",
        "packageName": "ecommerce",
        "query": "gross margin",
        "limit": 3,
    }
    _, payload = await _payload(client, "malloy_getContext", arguments)
    results = payload["results"]
    assert len(results) == 3
    assert all("margin" in r["name"] for r in results)
    assert all("id" not in r and "rank" not in r for r in results)
    assert set(results[0]) == {
        "kind",
        "name",
        "source",
        "environmentName",
        "packageName",
        "modelPath",
        "doc",
    }


@pytest.mark.anyio
async def test_tier_four_filters_by_source(client: Any) -> None:
    arguments = {
        "environmentName": "local",
        "packageName": "ecommerce",
        "query": "count",
        "sourceName": "product",
    }
    _, payload = await _payload(client, "malloy_getContext", arguments)
    assert payload["results"], "product has a count measure"
    assert {r["source"] for r in payload["results"]} == {"product"}


@pytest.mark.anyio
async def test_unknown_package_is_an_execution_error(client: Any) -> None:
    arguments = {"environmentName": "local", "packageName": "nope"}
    result = await client.call_tool("malloy_getContext", arguments)
    assert result.is_error
    assert "nope" in json.loads(result.content[0].resource.text)["error"]


# --- the three error shapes ------------------------------------------------------------------


@pytest.mark.anyio
async def test_schema_violation_is_a_json_rpc_invalid_params_error(client: Any) -> None:
    from mcp import MCPError

    arguments = {"environmentName": "local", "packageName": "ecommerce", "query": "run: x"}
    with pytest.raises(MCPError) as caught:
        await client.call_tool("malloy_executeQuery", arguments)
    assert caught.value.code == -32602
    assert "modelPath" in caught.value.message
    with pytest.raises(MCPError) as caught:
        await client.call_tool("malloy_getContext", {"limit": 51})
    assert caught.value.code == -32602


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("extra", "message"),
    [({}, NEITHER_QUERY), ({"query": "run: a -> b", "queryName": "b"}, BOTH_QUERIES)],
)
async def test_neither_or_both_queries_is_an_error_text_block(
    client: Any, extra: dict[str, Any], message: str
) -> None:
    result = await client.call_tool("malloy_executeQuery", {**MODEL, **extra})
    assert result.is_error
    [block] = result.content
    assert block.type == "text"
    assert block.text == f"MCP error -32602: {message}"


@pytest.mark.anyio
async def test_execution_failure_is_an_error_resource_and_text(client: Any) -> None:
    arguments = {**MODEL, "query": "run: order_items -> { group_by: nope }"}
    result = await client.call_tool("malloy_executeQuery", arguments)
    assert result.is_error
    resource, text = result.content
    payload = json.loads(resource.resource.text)
    assert payload == {
        "error": "'nope' is not defined",
        "suggestions": ["Check field names with malloy_getContext"],
    }
    assert text.type == "text" and "Suggestions:" in text.text and "nope" in text.text


# --- malloy_executeQuery ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_scripted_rows_in_the_query_envelope(client: Any) -> None:
    # Whitespace and case differ from the script's key: the fake normalises both.
    arguments = {**MODEL, "query": "RUN: order_items ->\n  {aggregate:   total_sales}"}
    uri, payload = await _payload(client, "malloy_executeQuery", arguments)
    assert uri == "malloy://environment/local/package/ecommerce/models/ecommerce.malloy#result"
    assert payload["rows"] == [{"total_sales": 10.5}]
    assert payload["_limit_hit"] is False
    assert payload["_limit_source"] == "server_default"
    assert payload["_meta"]["connection_name"] == "duckdb"


@pytest.mark.anyio
async def test_server_row_limit_sets_limit_hit_and_a_warning(client: Any) -> None:
    arguments = {**MODEL, "query": "run: order_items -> { group_by: id }"}
    result = await client.call_tool("malloy_executeQuery", arguments)
    payload = json.loads(result.content[0].resource.text)
    assert len(payload["rows"]) == 5
    assert payload["_limit_hit"] is True and payload["_query_row_limit"] == 5
    assert "Returned exactly 5 rows" in result.content[1].text


@pytest.mark.anyio
async def test_a_query_limit_is_not_a_limit_hit(client: Any) -> None:
    arguments = {**MODEL, "query": "run: order_items -> { group_by: id; limit: 8 }"}
    _, payload = await _payload(client, "malloy_executeQuery", arguments)
    assert len(payload["rows"]) == 8
    assert payload["_limit_source"] == "query" and payload["_limit_hit"] is False


@pytest.mark.anyio
async def test_oversized_response_drops_rows_and_says_so(client: Any) -> None:
    arguments = {**MODEL, "query": "run: order_items -> wide"}
    _, payload = await _payload(client, "malloy_executeQuery", arguments)
    assert payload["_rows_truncated"] is True
    assert payload["_total_rows"] == 5  # after the row limit of 5
    assert payload["_returned_rows"] == len(payload["rows"]) < 5


@pytest.mark.anyio
async def test_integers_beyond_2_53_arrive_as_strings(client: Any) -> None:
    arguments = {**MODEL, "query": "run: order_items -> { group_by: big }"}
    result = await client.call_tool("malloy_executeQuery", arguments)
    assert f'"big": "{BIG}"' in result.content[0].resource.text
    assert json.loads(result.content[0].resource.text)["rows"] == [{"big": str(BIG), "small": 7}]


@pytest.mark.anyio
async def test_named_view_runs_as_source_arrow_view(client: Any) -> None:
    arguments = {**MODEL, "queryName": "top_categories", "sourceName": "order_items"}
    _, payload = await _payload(client, "malloy_executeQuery", arguments)
    assert payload["rows"] == [{"category": "Jeans"}]


@pytest.mark.anyio
async def test_unscripted_query_fails_like_a_compile_error(
    client: Any, publisher: FakePublisher
) -> None:
    result = await client.call_tool("malloy_executeQuery", {**MODEL, "query": "run: x -> y"})
    assert result.is_error
    assert "nothing is scripted" in json.loads(result.content[0].resource.text)["error"]
    assert publisher.calls[-1] == ("malloy_executeQuery", {**MODEL, "query": "run: x -> y"})


# --- several models, and givens -------------------------------------------------------------

COUNT = "run: order_items -> { aggregate: n is count() }"
OTHER = {"environmentName": "local", "packageName": "shop2", "modelPath": "other.malloy"}


@pytest.fixture
async def multi(entities: list[dict[str, Any]]) -> AsyncIterator[Any]:
    from mcp import Client

    script = Script.from_data(
        {
            "queries": {COUNT: [{"n": 1}]},
            "models": {
                "shop2/other.malloy": {
                    "queries": {
                        COUNT: {
                            "byGivens": [{"givens": {"region": "EU"}, "rows": [{"n": 42}]}],
                            "rows": [{"n": 7}],
                        }
                    }
                },
                "shop2/strict.malloy": {
                    "queries": {COUNT: {"byGivens": [{"givens": {"y": 1}, "rows": []}]}}
                },
            },
        }
    )
    fake = FakePublisher(entities=entities, script=script)
    async with Client(build_fake_publisher(fake), mode="legacy") as mcp_client:
        yield mcp_client


@pytest.mark.anyio
async def test_each_model_and_givens_answer_with_their_own_rows(multi: Any) -> None:
    run = "malloy_executeQuery"
    assert (await _payload(multi, run, {**MODEL, "query": COUNT}))[1]["rows"] == [{"n": 1}]
    uri, payload = await _payload(multi, run, {**OTHER, "query": COUNT})
    assert payload["rows"] == [{"n": 7}]
    assert uri == "malloy://environment/local/package/shop2/models/other.malloy#result"
    eu = {**OTHER, "query": COUNT, "givens": {"region": "EU"}}
    assert (await _payload(multi, run, eu))[1]["rows"] == [{"n": 42}]
    strict = {**OTHER, "modelPath": "strict.malloy", "query": COUNT, "givens": {"y": 2}}
    failed = await multi.call_tool(run, strict)
    assert failed.is_error and "givens" in json.loads(failed.content[0].resource.text)["error"]
    missing = await multi.call_tool(run, {**OTHER, "modelPath": "nope.malloy", "query": COUNT})
    assert missing.is_error and "nope.malloy" in missing.content[0].resource.text


@pytest.mark.anyio
async def test_further_packages_are_listed(multi: Any) -> None:
    _, envs = await _payload(multi, "malloy_getContext", {})
    assert envs["results"][0]["packages"] == ["ecommerce", "shop2"]
    _, packages = await _payload(multi, "malloy_getContext", {"environmentName": "local"})
    assert [p["name"] for p in packages["results"]] == ["ecommerce", "shop2"]


def test_a_models_key_needs_a_package_and_a_path() -> None:
    with pytest.raises(ValueError, match="<package>/<modelPath>"):
        Script.from_data({"models": {"other.malloy": {}}})


# --- the .malloy rough parse -----------------------------------------------------------------


def _ids(entities: list[dict[str, Any]]) -> set[str]:
    return {f"{e['kind']}:{e['source']}:{e['name']}" for e in entities}


def test_parse_finds_sources_fields_measures_and_views(entities: list[dict[str, Any]]) -> None:
    ids = _ids(entities)
    for expected in (
        "source:order_items:order_items",
        "dimension:order_items:status",
        "dimension:order_items:gross_margin",
        "measure:order_items:total_sales",
        "view:order_items:top_categories",
        "dimension:user_order_facts:lifetime_orders",
        "dimension:user_order_facts:spend_category",
        "measure:inventory_items:total_cost",
    ):
        assert expected in ids
    kinds = {e["kind"] for e in entities}
    assert kinds == {"source", "dimension", "measure", "view"}


def test_parse_keeps_docs_with_their_entity_and_skips_joins(
    entities: list[dict[str, Any]],
) -> None:
    by_id = {f"{e['kind']}:{e['source']}:{e['name']}": e for e in entities}
    assert by_id["measure:order_items:total_sales"]["doc"] == "Total revenue from all line items"
    # The join docs just above `gross_margin` belong to the joins, which are not entities.
    assert by_id["dimension:order_items:gross_margin"]["doc"].startswith("Profit margin")
    assert "dimension:order_items:users" not in by_id
    multi = by_id["dimension:order_items:status"]["doc"]
    assert "Complete, Shipped" in multi and "every other status is a sale" in multi


def test_parse_of_a_small_model() -> None:
    text = """
    #(doc) Flights.
    source: flights is duckdb.table('f.parquet') extend {
      measure:
        #(doc) How many flights.
        flight_count is count()
      view: by_carrier is { group_by: carrier; aggregate: flight_count }
      calculate: hidden is lag(flight_count)
    }
    """
    assert entities_from_malloy(text) == [
        {"kind": "source", "name": "flights", "source": "flights", "doc": "Flights."},
        {
            "kind": "measure",
            "name": "flight_count",
            "source": "flights",
            "doc": "How many flights.",
        },
        {"kind": "view", "name": "by_carrier", "source": "flights", "doc": ""},
    ]
