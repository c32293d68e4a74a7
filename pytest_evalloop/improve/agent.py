"""The improver agent: doctrine, its tools (probe the data, propose an edit), the checked reply.

The doctrine (``doctrine.md``) is ours, written from seed 004's eval-improve skill and its output
contract; ``IMPROVE_VERSION`` and ``doctrine_sha()`` pin it (``doctrine_versions.json`` holds the
sha of every version, and a test fails when the text changes without a bump). One fresh
conversation per issue. The agent's tools are the target's own context and query tools (its
probes, every one recorded) and ``propose_edit``, which the conductor applies to a working copy
and answers with whether the model still loads. The conductor decides what stands, never the
agent: its reply object is checked, refused once with why, then the proposal is void.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, ValidationError

from pytest_evalloop.diagnose.agent import ConductorAgent, fenced, last_object
from pytest_evalloop.model_api.pricing import Usage

if TYPE_CHECKING:
    import anthropic

    from pytest_evalloop.roles.contract import TargetSession

IMPROVE_VERSION: str = "1"
MAX_TURNS = 12
"""Assistant turns the conversation may take (probes and proposals included)."""
EDIT_TOOL = "propose_edit"
ASK_AGAIN = "End your reply with the report block and one corrected JSON object."
"""What the improver is asked after a refused object (under the list of why)."""


@cache
def render_doctrine() -> str:
    """The improver's system prompt."""
    text = resources.files("pytest_evalloop.improve").joinpath("doctrine.md").read_text("utf-8")
    return text.replace("{{IMPROVE_VERSION}}", IMPROVE_VERSION)


@cache
def doctrine_sha() -> str:
    """sha256 of the rendered prompt: what `IMPROVE_VERSION` pins."""
    return hashlib.sha256(render_doctrine().encode("utf-8")).hexdigest()


def edit_tool(files: list[str]) -> dict[str, Any]:
    """The `propose_edit` tool as the Messages API takes it."""
    return {
        "name": EDIT_TOOL,
        "description": (
            "Replace text in one model file of the working copy. `old` must occur exactly once "
            "in the file. The reply says whether the edited model still loads."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "file": {"type": "string", "enum": files},
                "old": {"type": "string", "description": "Exact text to replace (unique)"},
                "new": {"type": "string", "description": "What replaces it"},
            },
            "required": ["file", "old", "new"],
        },
    }


class Probe(BaseModel):
    why: str = ""
    query: str = Field(min_length=1)
    result: str = ""


class Suspect(BaseModel):
    qid: str
    entity: str = ""
    stored: Any = None
    rederived: Any = None


class ImproveReply(BaseModel):
    """The output contract's object."""

    files: list[str] = Field(default_factory=list)
    probes: list[Probe] = Field(default_factory=list)
    edit: str = Field(min_length=1)
    edit_tier: int | None = Field(default=None, alias="editTier", ge=1, le=5)
    disagreement: str = "NONE"
    meaning_changed: list[str] = Field(default_factory=list, alias="meaningChanged")
    golden_suspect: list[Suspect] = Field(default_factory=list, alias="goldenSuspect")


def check_reply(text: str) -> tuple[ImproveReply | None, list[str]]:
    """The reply's object, or why it is refused."""
    obj = last_object(text, "edit")
    if obj is None:
        return None, ["the reply ends with no JSON object carrying an edit"]
    try:
        return ImproveReply.model_validate(obj), []
    except ValidationError as exc:
        parts = [
            f"{'.'.join(str(p) for p in e['loc']) or '(object)'}: {e['msg']}" for e in exc.errors()
        ]
        return None, ["; ".join(parts)]


@dataclass
class Outcome:
    """What the conversation yielded: the reply, every tool call, every proposed edit."""

    reply: ImproveReply | None = None
    text: str = ""
    problems: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Each probe: `{tool, input, query, result, error}` (query: the query text run, if any)."""
    edits: list[dict[str, Any]] = field(default_factory=list)
    """Each `propose_edit` input, with the conductor's answer."""
    attempts: int = 0
    usage: Usage = field(default_factory=Usage)
    model: str = ""


EditHandler = Callable[[dict[str, Any]], Awaitable[tuple[bool, str]]]
"""Applies one proposed edit to the working copy: (applied, what to tell the agent)."""


async def improve(
    client: anthropic.AsyncAnthropic,
    model: str,
    prompt: str,
    session: TargetSession | None,
    tools: list[dict[str, Any]],
    on_edit: EditHandler,
    *,
    max_turns: int = MAX_TURNS,
    max_tokens: int = 8192,
) -> Outcome:
    """One issue, one fresh conversation: probes, proposals, then the checked object.

    Endpoint failures raise `HarnessError`; a probe that errors is shown to the agent as a tool
    error and recorded, never raised.
    """
    from pytest_evalloop.roles.contract import ToolOutcome

    out = Outcome()

    async def edit(arguments: dict[str, Any]) -> ToolOutcome:
        applied, said = await on_edit(arguments)
        out.edits.append({**arguments, "applied": applied, "answer": said})
        return ToolOutcome(text=said, is_error=not applied, error=None)

    agent = ConductorAgent(render_doctrine(), check_reply, max_tokens, max_turns, ASK_AGAIN, True)
    conv, out.calls = await agent.run(client, model, prompt, session, tools, {EDIT_TOOL: edit})
    out.reply, out.problems, out.attempts = conv.reply, conv.problems, conv.attempts
    out.text = conv.final_text or ""
    out.usage, out.model = conv.usage, conv.model or model
    return out


def fenced_prompt(head: str, sections: list[tuple[str, str]]) -> str:
    """The user message: every piece of run text fenced as data (diagnose's fencing)."""

    return fenced(head, sections)


def shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1, default=str)
