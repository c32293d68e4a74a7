"""MCP tools ⇄ Anthropic tool use: our own bridge.

The SDK's helper (``anthropic.lib.tools.mcp``) refuses ``application/json`` embedded resources,
and every Publisher result is one, so we convert both directions ourselves:

- :func:`anthropic_tools`: a target's tool list → the ``tools`` parameter of ``messages.create``;
- :func:`outcome_from_mcp`: an MCP ``CallToolResult`` → our :class:`ToolOutcome`;
- :func:`tool_result_block`: a :class:`ToolOutcome` → the ``tool_result`` block the model reads.
"""

from __future__ import annotations

import copy
import json
import re
from typing import TYPE_CHECKING, Any

from pytest_evalloop.roles.contract import ToolOutcome, ToolSpec

if TYPE_CHECKING:
    import mcp.types

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""Tool names the Messages API accepts."""

EMPTY_RESULT_TEXT = "(the tool returned no content)"
# The API rejects empty text blocks, so an empty result is described instead.

_JSON_MIME = re.compile(r"^application/(?:[\w.-]+\+)?json\b", re.IGNORECASE)


def anthropic_tools(tools: list[ToolSpec], *, cache: bool = True) -> list[dict[str, Any]]:
    """The Messages API ``tools`` parameter for a target's tools, in the target's order.

    ``$schema`` is dropped from each input schema (the rest is kept as the server wrote it).
    With ``cache``, the last tool carries ``cache_control`` so the whole tool block is cached.
    Raises ``ValueError`` for a name the API would reject, or a name listed twice.
    """
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for tool in tools:
        if not TOOL_NAME.match(tool.name):
            raise ValueError(
                f"MCP tool {tool.name!r} cannot be offered to the Messages API: names must "
                f"match {TOOL_NAME.pattern}; rename the tool in the target or its tool profile"
            )
        if tool.name in seen:
            raise ValueError(
                f"MCP tool {tool.name!r} is listed twice by the target; tool names must be unique"
            )
        seen.add(tool.name)
        schema = {k: copy.deepcopy(v) for k, v in tool.input_schema.items() if k != "$schema"}
        # The API requires an object schema; an MCP tool without arguments may send none.
        schema.setdefault("type", "object")
        entry: dict[str, Any] = {"name": tool.name, "input_schema": schema}
        if tool.description:
            entry["description"] = tool.description
        out.append(entry)
    if cache and out:
        out[-1]["cache_control"] = {"type": "ephemeral"}
    return out


def truncate_text(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` with a marker saying how much was cut."""
    if len(text) <= max_chars:
        return text
    cut = len(text) - max_chars
    return (
        f"{text[:max_chars]}\n[... truncated: {cut} of {len(text)} characters cut; "
        "narrow the request (fewer rows or columns) to see the rest]"
    )


def tool_result_block(
    tool_use_id: str, outcome: ToolOutcome, *, max_chars: int = 60_000
) -> dict[str, Any]:
    """The ``tool_result`` block that answers one ``tool_use``: text, ``is_error`` on errors."""
    text = outcome.text
    if not text and outcome.is_error:
        text = outcome.error or ""
    text = text or EMPTY_RESULT_TEXT
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": [{"type": "text", "text": truncate_text(text, max_chars)}],
    }
    if outcome.is_error:
        block["is_error"] = True
    return block


def _decode_json(text: str, mime_type: str | None) -> Any:
    """The JSON value of a resource text when it is one: declared JSON, or an object/array."""
    declared = bool(mime_type and _JSON_MIME.match(mime_type))
    stripped = text.lstrip()
    if not declared and not stripped.startswith(("{", "[")):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if declared or isinstance(value, dict | list):
        return value
    return None


def outcome_from_mcp(result: mcp.types.CallToolResult) -> ToolOutcome:
    """Normalise an MCP tool result.

    Text blocks and embedded text resources are joined (in order) into ``text``; the first JSON
    resource (mime type JSON, or text that parses as an object or array) is decoded into
    ``payload``; without one, ``structured_content``, then a lone text block holding a JSON
    object or array, stand in. Images, audio, links and binary resources are described as
    ``[<type> content omitted]``. ``is_error`` is carried, with the text (or the payload's
    ``error``) as ``error``.
    """
    import mcp.types as mt

    parts: list[str] = []
    payload: Any = None
    texts: list[str] = []
    for block in result.content:
        if isinstance(block, mt.TextContent):
            parts.append(block.text)
            texts.append(block.text)
        elif isinstance(block, mt.EmbeddedResource) and isinstance(
            block.resource, mt.TextResourceContents
        ):
            parts.append(block.resource.text)
            if payload is None:
                payload = _decode_json(block.resource.text, block.resource.mime_type)
        else:
            kind = block.type if not isinstance(block, mt.EmbeddedResource) else "binary resource"
            parts.append(f"[{kind} content omitted]")
    if payload is None and result.structured_content is not None:
        payload = result.structured_content
    if payload is None and len(texts) == 1:
        payload = _decode_json(texts[0], None)
    text = "\n".join(parts)
    return ToolOutcome(
        text=text,
        payload=payload,
        is_error=bool(result.is_error),
        error=_error_text(text, payload) if result.is_error else None,
    )


def _error_text(text: str, payload: Any) -> str:
    """The error message of a failed call: the payload's ``error`` field, else the text."""
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        return str(payload["error"])
    return text or "the tool reported an error without a message"
