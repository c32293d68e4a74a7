"""What a stream-json transcript says (the CLI's, or the ``anthropic`` skill agent's events
written in the same shape): the agent's tool calls, the texts injected into it, the result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    """One ``tool_use`` of the transcript and whether its result was an error."""

    name: str
    input: dict[str, Any]
    id: str = ""
    is_error: bool | None = None

    @property
    def input_text(self) -> str:
        """The input as compact JSON, the form the detectors search."""
        return json.dumps(self.input, ensure_ascii=False, separators=(",", ":"))


@dataclass
class Transcript:
    """What a stream-json transcript says: the agent's calls, injected texts, the result."""

    tool_calls: list[ToolCall] = field(default_factory=list)
    user_texts: list[str] = field(default_factory=list)
    assistant_texts: list[str] = field(default_factory=list)
    result: dict[str, Any] | None = None
    visible_skills: list[str] | None = None
    slash_commands: list[str] = field(default_factory=list)
    version: str | None = None
    model: str | None = None

    @property
    def final_text(self) -> str:
        """The final response: the result text, else the last assistant text."""
        text = (self.result or {}).get("result")
        if isinstance(text, str) and text.strip():
            return text
        return self.assistant_texts[-1] if self.assistant_texts else ""

    @property
    def subtype(self) -> str | None:
        """The result event's subtype (``success``, ``error_max_turns``, ...)."""
        value = (self.result or {}).get("subtype")
        return str(value) if value else None

    def commands(self) -> list[str]:
        """Shell commands the agent ran (any tool input with a ``command`` string)."""
        return [str(c.input["command"]) for c in self.tool_calls if "command" in c.input]


def read_transcript(events: list[dict[str, Any]]) -> Transcript:
    """Parse stream-json events into a :class:`Transcript`."""
    t = Transcript()
    by_id: dict[str, ToolCall] = {}
    for event in events:
        kind = event.get("type")
        if kind == "system" and event.get("subtype") == "init":
            _read_init(t, event)
        elif kind == "result":
            t.result = event
        message = event.get("message")
        if kind not in ("assistant", "user") or not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            (t.user_texts if kind == "user" else t.assistant_texts).append(content)
            continue
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict):
                _read_block(t, kind, block, by_id)
    return t


def _read_init(t: Transcript, event: dict[str, Any]) -> None:
    skills = event.get("skills")
    if isinstance(skills, list):
        t.visible_skills = [_skill_name(s) for s in skills]
    slash = event.get("slash_commands")
    t.slash_commands = [_skill_name(s) for s in slash] if isinstance(slash, list) else []
    t.version = str(event.get("claude_code_version") or "") or None
    t.model = str(event.get("model") or "") or None


def _skill_name(entry: Any) -> str:
    name = entry.get("name", "") if isinstance(entry, dict) else entry
    return str(name).lstrip("/")


def _read_block(
    t: Transcript, kind: Any, block: dict[str, Any], by_id: dict[str, ToolCall]
) -> None:
    btype = block.get("type")
    if kind == "assistant" and btype == "tool_use":
        raw = block.get("input")
        call = ToolCall(str(block.get("name") or ""), raw if isinstance(raw, dict) else {})
        call.id = str(block.get("id") or "")
        t.tool_calls.append(call)
        by_id[call.id] = call
    elif kind == "assistant" and btype == "text":
        t.assistant_texts.append(str(block.get("text") or ""))
    elif kind == "user" and btype == "text":
        t.user_texts.append(str(block.get("text") or ""))
    elif kind == "user" and btype == "tool_result":
        found = by_id.get(str(block.get("tool_use_id")))
        if found is not None:
            found.is_error = bool(block.get("is_error"))
