"""The MCP ⇄ Anthropic bridge; MCP results come from a real in-process MCP server."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)

from pytest_evalloop.roles.contract import ToolOutcome, ToolSpec
from pytest_evalloop.targets.bridge import (
    EMPTY_RESULT_TEXT,
    anthropic_tools,
    outcome_from_mcp,
    tool_result_block,
)

# --------------------------------------------------------------------------- anthropic_tools

SCHEMA = {
    "$schema": "urn:example:json-schema-draft-07",
    "type": "object",
    "properties": {"query": {"type": "string", "maxLength": 500}},
    "required": ["query"],
    "additionalProperties": False,
}


def specs() -> list[ToolSpec]:
    return [
        ToolSpec(name="malloy_getContext", description="Ranked entities.", input_schema=SCHEMA),
        ToolSpec(name="malloy_executeQuery", description="Run Malloy.", input_schema=SCHEMA),
        ToolSpec(name="ping"),
    ]


def test_tools_keep_the_schema_without_dollar_schema_and_cache_the_last() -> None:
    tools = anthropic_tools(specs())
    assert [t["name"] for t in tools] == ["malloy_getContext", "malloy_executeQuery", "ping"]
    first = tools[0]
    assert first["description"] == "Ranked entities."
    assert first["input_schema"] == {k: v for k, v in SCHEMA.items() if k != "$schema"}
    assert [t.get("cache_control") for t in tools] == [None, None, {"type": "ephemeral"}]
    # A tool without arguments still gets the object schema the API requires.
    assert tools[2]["input_schema"] == {"type": "object"}
    assert "description" not in tools[2]
    # The caller's schemas are not modified.
    assert "$schema" in SCHEMA


def test_tools_without_cache_carry_no_cache_control() -> None:
    assert all("cache_control" not in t for t in anthropic_tools(specs(), cache=False))
    assert anthropic_tools([]) == []


@pytest.mark.parametrize("name", ["bad name", "a.b", "x" * 65, ""])
def test_a_name_the_api_refuses_is_a_value_error(name: str) -> None:
    with pytest.raises(ValueError, match="cannot be offered") as caught:
        anthropic_tools([*specs(), ToolSpec(name=name)])
    assert repr(name) in str(caught.value)


def test_a_name_listed_twice_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="'ping' is listed twice"):
        anthropic_tools([ToolSpec(name="ping"), ToolSpec(name="ping")])


# --------------------------------------------------------------------------- tool_result_block


def test_result_block_is_text_and_marks_errors() -> None:
    ok = tool_result_block("toolu_1", ToolOutcome(text='{"rows": []}'))
    assert ok == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": '{"rows": []}'}],
    }
    failed = tool_result_block("toolu_2", ToolOutcome(text="", is_error=True, error="no table"))
    assert failed["is_error"] is True
    assert failed["content"] == [{"type": "text", "text": "no table"}]


def test_empty_result_is_described() -> None:
    block = tool_result_block("toolu_3", ToolOutcome(text=""))
    assert block["content"][0]["text"] == EMPTY_RESULT_TEXT


def test_long_result_is_cut_with_a_marker() -> None:
    block = tool_result_block("toolu_4", ToolOutcome(text="y" * 1_000), max_chars=100)
    text = block["content"][0]["text"]
    assert text.startswith("y" * 100) and not text.startswith("y" * 101)
    assert "truncated: 900 of 1000 characters cut" in text


# --------------------------------------------------------------------------- outcome_from_mcp


def resource(text: str, mime: str | None = "application/json") -> EmbeddedResource:
    return EmbeddedResource(
        type="resource",
        resource=TextResourceContents(uri="malloy://environment/e#x", mime_type=mime, text=text),
    )


PAYLOAD = {"rows": [{"category": "Jeans", "total_sales": 123.5}], "_limit_hit": False}
PNG = base64.b64encode(b"\x89PNG fake").decode()


def publisher_like() -> MCPServer:
    """Tools returning each result shape a bridge must handle."""
    server = MCPServer("bridge-test")

    @server.tool(name="json_resource")
    async def json_resource() -> CallToolResult:
        return CallToolResult(
            content=[resource(json.dumps(PAYLOAD)), TextContent(type="text", text="1 warning")]
        )

    @server.tool(name="json_error")
    async def json_error() -> CallToolResult:
        body = {"error": "Unknown field 'revenue'", "suggestions": ["call malloy_getContext"]}
        return CallToolResult(
            is_error=True,
            content=[resource(json.dumps(body)), TextContent(type="text", text="Suggestions:")],
        )

    @server.tool(name="untyped_json")
    async def untyped_json() -> CallToolResult:
        return CallToolResult(content=[resource('[{"a": 1}]', mime=None)])

    @server.tool(name="plain_text_resource")
    async def plain_text_resource() -> CallToolResult:
        return CallToolResult(content=[resource("just words", mime="text/plain")])

    @server.tool(name="mixed")
    async def mixed() -> CallToolResult:
        blob = BlobResourceContents(uri="file:///x.bin", mime_type="image/png", blob=PNG)
        return CallToolResult(
            content=[
                TextContent(type="text", text="chart follows"),
                ImageContent(type="image", data=PNG, mime_type="image/png"),
                EmbeddedResource(type="resource", resource=blob),
            ]
        )

    @server.tool(name="typed")
    async def typed() -> dict[str, int]:
        return {"n": 3}

    @server.tool(name="fails")
    async def fails() -> str:
        raise ToolError("the warehouse is read-only")

    return server


def call_all() -> dict[str, CallToolResult]:
    async def main() -> dict[str, CallToolResult]:
        results: dict[str, CallToolResult] = {}
        async with Client(publisher_like()) as client:
            for tool in (await client.list_tools()).tools:
                results[tool.name] = await client.call_tool(tool.name, {})
        return results

    return asyncio.run(main())


@pytest.fixture(scope="module")
def results() -> dict[str, CallToolResult]:
    return call_all()


def outcome(results: dict[str, CallToolResult], name: str) -> ToolOutcome:
    return outcome_from_mcp(results[name])


def test_embedded_json_resource_is_decoded(results: dict[str, Any]) -> None:
    got = outcome(results, "json_resource")
    assert got.payload == PAYLOAD
    assert got.text == json.dumps(PAYLOAD) + "\n1 warning"
    assert (got.is_error, got.error) == (False, None)


def test_publisher_error_carries_is_error_and_the_message(results: dict[str, Any]) -> None:
    got = outcome(results, "json_error")
    assert got.is_error is True
    assert got.error == "Unknown field 'revenue'"
    assert got.payload["suggestions"] == ["call malloy_getContext"]
    assert "Suggestions:" in got.text


def test_json_text_without_a_mime_type_is_decoded(results: dict[str, Any]) -> None:
    assert outcome(results, "untyped_json").payload == [{"a": 1}]


def test_plain_text_resource_is_text_only(results: dict[str, Any]) -> None:
    got = outcome(results, "plain_text_resource")
    assert (got.text, got.payload) == ("just words", None)


def test_images_and_blobs_are_described_not_sent(results: dict[str, Any]) -> None:
    got = outcome(results, "mixed")
    assert got.text.splitlines() == [
        "chart follows",
        "[image content omitted]",
        "[binary resource content omitted]",
    ]
    assert PNG not in got.text


def test_structured_content_stands_in_for_a_payload(results: dict[str, Any]) -> None:
    got = outcome(results, "typed")
    assert got.payload == {"n": 3}


def test_tool_error_text_is_the_error(results: dict[str, Any]) -> None:
    got = outcome(results, "fails")
    assert got.is_error is True
    assert got.error is not None and "read-only" in got.error
    block = tool_result_block("toolu_9", got)
    assert block["is_error"] is True and "read-only" in block["content"][0]["text"]
