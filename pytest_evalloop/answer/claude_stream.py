"""The ``claude`` CLI's ``stream-json`` output read as the host-side log.

One stdout line is one event (``stream_event``); ``parse_stream`` turns the transcript into the
tool log (every ``tool_use``, MCP or not, completed by its ``tool_result``, a spilled result read
back) and the assistant's texts; the ``system``/``init`` event says which servers connected and
which tools the session offered; the ``result`` event carries usage. ``trim_event`` cuts tool
results for the stored transcript.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalloop.answer.answerer import log_row
from pytest_evalloop.failures import HarnessError
from pytest_evalloop.model_api.pricing import Usage
from pytest_evalloop.roles.contract import TargetSession, ToolOutcome, ToolUse
from pytest_evalloop.targets.bridge import truncate_text

__all__ = [
    "SERVER_NAME",
    "ParsedStream",
    "as_int",
    "check_servers",
    "check_tools",
    "init_model",
    "parse_stream",
    "stream_event",
    "trim_event",
    "usage_of",
]

SERVER_NAME = "data"
"""The MCP server's name in the generated config; tools read ``mcp__data__<tool>``. Neutral on
purpose: the answerer must get no hint that it is being evaluated."""

TRANSCRIPT_RESULT_CHARS = 4_000
"""Each tool result is kept in the transcript up to this many characters."""
# "...Output has been saved to /abs/tool-results/x.txt." ends a sentence: the final "." is not
# part of the path (file names the CLI picks end in an extension, never in a dot).
_SPILLED = re.compile(r"(?:Full output saved to|Output has been saved to):?\s*(\S+?)\.?(?=\s|$)")
_SPILL_NOTE_CHARS = 4_000
"""A tool result longer than this is a real result, not the CLI's note about a spilled one."""


@dataclass
class ParsedStream:
    """What a stream-json transcript says the answerer did."""

    log: list[ToolUse] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    """Assistant text blocks, in order."""
    api_calls: int = 0
    served_model: str | None = None
    """The model the endpoint said answered: the last assistant message's, leaving out the
    CLI's own `<synthetic>` messages (the init event only echoes `--model`)."""

    def answer_text(self, result: Mapping[str, Any]) -> str | None:
        """The final reply: the result event's text, else the last assistant text."""
        text = result.get("result")
        if isinstance(text, str) and text.strip():
            return text
        return self.texts[-1] if self.texts else None


SYNTHETIC_MODEL = "<synthetic>"
"""The model the claude CLI writes on messages it made itself, no request behind them."""


def parse_stream(
    events: list[dict[str, Any]],
    session: TargetSession,
    *,
    cwd: Path | None = None,
    spill_dirs: Iterable[Path] | None = None,
) -> ParsedStream:
    """The tool log of a stream-json transcript: one row per ``tool_use`` block, in order,
    completed by the ``tool_result`` with the same id (ok/error, context results).

    ``mcp__<server>__<tool>`` names are MCP calls of the bare tool (roles only for our own
    server); anything else is a host tool, logged with its input as given. A result the CLI
    spilled to a file is read back when the file lies under one of ``spill_dirs`` (anywhere
    when None).
    """
    dirs = None if spill_dirs is None else [Path(d).resolve() for d in spill_dirs]
    parsed = ParsedStream()
    uses: dict[str, tuple[int, str, dict[str, Any]]] = {}
    message_ids: set[str] = set()
    for event in events:
        message = event.get("message")
        if not isinstance(message, dict):
            continue
        blocks = message.get("content")
        blocks = blocks if isinstance(blocks, list) else []
        if event.get("type") == "assistant":
            message_ids.add(str(message.get("id") or len(message_ids)))
            served = message.get("model")
            if isinstance(served, str) and served and served != SYNTHETIC_MODEL:
                parsed.served_model = served
            for block in blocks:
                _assistant_block(block, parsed, uses, session)
        elif event.get("type") == "user":
            for block in blocks:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    _complete(block, parsed, uses, session, cwd, dirs)
    parsed.api_calls = len(message_ids)
    return parsed


def _assistant_block(
    block: Any,
    parsed: ParsedStream,
    uses: dict[str, tuple[int, str, dict[str, Any]]],
    session: TargetSession,
) -> None:
    if not isinstance(block, dict):
        return
    if block.get("type") == "text" and block.get("text"):
        parsed.texts.append(str(block["text"]))
    if block.get("type") != "tool_use":
        return
    name = str(block.get("name") or "")
    arguments = block.get("input")
    arguments = dict(arguments) if isinstance(arguments, dict) else {}
    bare = _our_tool(name)
    if bare is not None:
        row = ToolUse(tool=bare, input=arguments, is_mcp=True, role=session.role_of(bare))
        if row.role == "query":
            row.query = session.query_of(bare, arguments)
    else:
        row = ToolUse(tool=name, input=arguments, is_mcp=name.startswith("mcp__"))
    uses[str(block.get("id"))] = (len(parsed.log), bare or name, arguments)
    parsed.log.append(row)


def _complete(
    block: dict[str, Any],
    parsed: ParsedStream,
    uses: dict[str, tuple[int, str, dict[str, Any]]],
    session: TargetSession,
    cwd: Path | None,
    spill_dirs: list[Path] | None,
) -> None:
    """Fill a logged tool use from its ``tool_result``."""
    found = uses.get(str(block.get("tool_use_id")))
    if found is None:
        return
    index, tool, arguments = found
    row = parsed.log[index]
    outcome = _outcome(block, cwd, spill_dirs)
    if row.is_mcp and row.tool == tool and session.role_of(tool) is not None:
        parsed.log[index] = log_row(session, tool, arguments, outcome)
        return
    row.ok = not outcome.is_error
    row.error = outcome.error


def _our_tool(name: str) -> str | None:
    prefix = f"mcp__{SERVER_NAME}__"
    return name[len(prefix) :] if name.startswith(prefix) and len(name) > len(prefix) else None


def _outcome(
    block: Mapping[str, Any], cwd: Path | None, spill_dirs: list[Path] | None = None
) -> ToolOutcome:
    """A ``tool_result`` block as a ToolOutcome; JSON text becomes the payload."""
    content = block.get("content")
    texts: list[str] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif part.get("type") == "resource" and isinstance(part.get("resource"), dict):
                texts.append(str(part["resource"].get("text", "")))
    texts = [_unspill(t, cwd, spill_dirs) for t in texts]
    text = "\n".join(texts)
    payload = next((p for p in map(_json_value, texts) if p is not None), None)
    is_error = bool(block.get("is_error"))
    error = None
    if is_error:
        said = payload.get("error") if isinstance(payload, dict) else None
        error = (str(said) if said else text)[:2_000]
    return ToolOutcome(text=text, payload=payload, is_error=is_error, error=error)


def _json_value(text: str) -> Any:
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _unspill(text: str, cwd: Path | None, spill_dirs: list[Path] | None = None) -> str:
    """The CLI saves a large tool result to a file and says where; read it back while the
    scratch directory still exists (a file that is gone, or lies outside ``spill_dirs``,
    leaves the note as it was)."""
    match = _SPILLED.search(text)
    if match is None or len(text) > _SPILL_NOTE_CHARS:
        return text
    path = Path(match.group(1))
    if not path.is_absolute() and cwd is not None:
        path = cwd / path
    try:
        path = path.resolve()
        if spill_dirs is not None and not any(path.is_relative_to(d) for d in spill_dirs):
            return text  # a note naming a file elsewhere is not the CLI's spill
        return path.read_text(encoding="utf-8")
    except OSError:
        return text


def stream_event(line: str) -> dict[str, Any] | None:
    """One line of the CLI's stream-json output as an event, or None when it is not one."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def check_servers(events: list[dict[str, Any]], tail: str) -> None:
    """A target the CLI could not connect to is the harness's failure, not a wrong answer."""
    init = next(
        (e for e in events if e.get("type") == "system" and e.get("subtype") == "init"), None
    )
    servers = init.get("mcp_servers") if init else None
    for server in servers if isinstance(servers, list) else []:
        if isinstance(server, dict) and server.get("name") == SERVER_NAME:
            status = server.get("status")
            if status != "connected":
                raise HarnessError(
                    f"the claude CLI could not connect to the target's MCP server (status "
                    f"{status!r}); {tail}check the server command or URL it was given"
                )


def check_tools(events: list[dict[str, Any]], allowed: list[str], tail: str) -> None:
    """The session must offer the target's tools and nothing else: a built-in tool in it (a
    CLI that ignored ``--tools ""``) would let the answerer reach the host."""
    init = next(
        (e for e in events if e.get("type") == "system" and e.get("subtype") == "init"), None
    )
    tools = init.get("tools") if init else None
    if not isinstance(tools, list):
        return
    extra = sorted(str(t) for t in tools if str(t) not in allowed)
    if extra:
        raise HarnessError(
            f"the claude CLI's session offered tools beyond the target's: {extra}; {tail}"
            'use a CLI that supports --tools "" (2.1.332 or later)'
        )


def init_model(events: list[dict[str, Any]]) -> str | None:
    for event in events:
        if event.get("type") == "system" and event.get("subtype") == "init":
            model = event.get("model")
            return str(model) if model else None
    return None


def as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def usage_of(result: Mapping[str, Any], api_calls: int) -> Usage:
    raw = result.get("usage")
    raw = raw if isinstance(raw, dict) else {}
    return Usage(
        input_tokens=as_int(raw.get("input_tokens")),
        output_tokens=as_int(raw.get("output_tokens")),
        cache_read_tokens=as_int(raw.get("cache_read_input_tokens")),
        cache_creation_tokens=as_int(raw.get("cache_creation_input_tokens")),
        calls=api_calls or as_int(result.get("num_turns")),
    )


def trim_event(event: dict[str, Any]) -> dict[str, Any]:
    """An event with each tool result cut to a few KB; tool inputs are kept whole."""
    message = event.get("message")
    if event.get("type") != "user" or not isinstance(message, dict):
        return event
    content = message.get("content")
    if not isinstance(content, list):
        return event
    blocks = [_trim_result(b) if isinstance(b, dict) else b for b in content]
    return {**event, "message": {**message, "content": blocks}}


def _trim_result(block: dict[str, Any]) -> dict[str, Any]:
    content = block.get("content")
    if isinstance(content, str):
        return {**block, "content": truncate_text(content, TRANSCRIPT_RESULT_CHARS)}
    if isinstance(content, list):
        parts = [
            {**p, "text": truncate_text(str(p["text"]), TRANSCRIPT_RESULT_CHARS)}
            if isinstance(p, dict) and "text" in p
            else p
            for p in content
        ]
        return {**block, "content": parts}
    return block
