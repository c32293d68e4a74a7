"""One Messages API tool-use conversation, for every role that holds one.

The answerer, the skills agent, the diagnoser (and its clustering call) and the improver each
send a conversation, count the reply (turns, tokens, the model the API served), keep its
blocks, then either run the tools it asks for and send their results, or take it as the final
reply: checked when the role checks replies, and asked again with why when refused. That loop
is :func:`converse`, once; what differs between the roles is a :class:`LoopPolicy` (tools and
how to run them, limits, what ends the loop, how a refused reply is retried, what is recorded,
the cache breakpoints) and what a role reads back from the :class:`Conversation`.

Failures are `create_message`'s (every endpoint failure a `HarnessError`) or a tool runner's
own; the loop catches none of them. A spend ceiling or a rate limit that wraps the client
(`improve.budget`, `ratelimit.LimitedTransport`) sees every request, as it is one
`client.messages.create` each.

Why not the SDK's own tool runner (``client.beta.messages.tool_runner``, ``@beta_async_tool``;
read in anthropic 2.17): it sends through ``client.beta.messages`` (beta types, its thread's
own re-sends on a rejection), not through `endpoint.create_message`, so an endpoint failure
would not be our redacted `HarnessError` and a wrapper of ``client.messages.create`` (the
loop's budget) would not see the request; it turns every exception a tool raises into an
``is_error`` result, where the answerer must stop the attempt when the target fails; it has
a turn limit (``max_iterations``) but no token budget, no checked final reply asked again,
no recorder, and caching only as one top-level ``cache_control`` (our moving breakpoints are
marked on a copy of each request, never on the history); and it resumes ``pause_turn`` where
the answerer records it as the stop. Wrapping all of that around it would be more code than
this loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_evalloop.model_api.caching import EPHEMERAL, conversation_request
from pytest_evalloop.model_api.endpoint import create_message
from pytest_evalloop.model_api.pricing import Usage

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import Message

ToolRunner = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
"""Runs one ``tool_use`` block (as sent back) and returns its ``tool_result`` block. A failure
the model should read is a result with ``is_error``; anything it raises ends the loop."""
Check = Callable[[str], tuple[Any, list[str]]]
"""A final reply's text -> its checked object, or None and why it is refused."""
Recorder = Callable[[dict[str, Any], "Message | None"], None]
"""Sees every message of the conversation once, as it is added (the reply it came from, for an
assistant turn): a transcript, a stream of events."""

NO_TEXT = "(no text)"
"""What a refused reply with nothing else to send back is sent as before its retry: the API
refuses an empty turn."""


@dataclass(frozen=True)
class LoopPolicy:
    """What one role's conversation is allowed and how it ends."""

    model: str
    system: str
    """The system prompt: one text block, marked for the cache (every role's stable prefix)."""
    max_output_tokens: int
    max_turns: int
    """Replies the conversation may get, retries and tool turns included."""
    tools: list[dict[str, Any]] | None = None
    """As the API takes them (None: none offered); the caller marks the last one for the cache."""
    run_tool: ToolRunner | None = None
    """None: no tools, every reply is final."""
    token_budget: int | None = None
    """Stop before running a turn's tools once the conversation has used this many tokens
    (input, output and cache, over every reply)."""
    stop_reason_decides: bool = True
    """True: the reply's ``stop_reason`` says whether it asks for tools (``tool_use``; one
    without calls ends the loop as ``tool_use_without_calls``), any other reason is final.
    False: its ``tool_use`` blocks do, whatever the reason (Claude Code's way, the conductor's
    agents)."""
    last_turn_runs_tools: bool = False
    """At the turn limit, still run the tools the last reply asks for (a conductor records
    every probe and edit its agent asked for) before stopping as ``max_turns``."""
    check: Check | None = None
    """None: the final reply is taken as it is."""
    retry_text: Callable[[list[str]], str] | None = None
    """The user turn that asks again after a refused reply, from why it was refused."""
    max_attempts: int = 2
    """Final replies checked before the loop gives up (1 and a retry)."""
    moving_breakpoints: bool = False
    """Mark each request with `caching.conversation_request`'s two moving breakpoints, so turn
    N reads turns 1..N-1 from the cache."""
    record: Recorder | None = None


@dataclass
class Conversation:
    """One conversation's messages and what the loop counted. The caller builds it with the
    opening user turn(s) and reads it back, also after a deadline cut the loop short."""

    messages: list[dict[str, Any]]
    usage: Usage = field(default_factory=Usage)
    turns: int = 0
    model: str | None = None
    """The model the API said it served (the last reply's `model`)."""
    stop: str = "end_turn"
    """The final reply's ``stop_reason`` ("unknown" when it had none), or why the loop stopped
    first: ``max_turns``, ``token_budget``, ``tool_use_without_calls``, ``timeout``."""
    text: str | None = None
    """The latest reply text, from any turn (None: no reply said anything yet)."""
    final_text: str | None = None
    """The text of the last final reply ("" when it had none); None when none came."""
    attempts: int = 0
    """Final replies checked."""
    reply: Any = None
    """The checked object of an accepted reply."""
    problems: list[str] = field(default_factory=list)
    """Why the last checked reply was refused ([] once one is accepted)."""
    refused: list[str] = field(default_factory=list)
    """Why the first refused reply was refused (what a retry answered)."""

    def tokens(self) -> int:
        u = self.usage
        return u.input_tokens + u.output_tokens + u.cache_read_tokens + u.cache_creation_tokens


async def converse(
    client: anthropic.AsyncAnthropic, policy: LoopPolicy, conversation: Conversation
) -> Conversation:
    """Hold the conversation to a final reply (checked, when the policy checks) or a limit."""
    if policy.max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {policy.max_turns}")
    conv = conversation
    if policy.record is not None and conv.turns == 0:
        for message in conv.messages:
            policy.record(message, None)
    system = [{"type": "text", "text": policy.system, "cache_control": EPHEMERAL}]
    while True:
        sent = conversation_request(conv.messages) if policy.moving_breakpoints else conv.messages
        reply = await create_message(
            client, policy.model, policy.max_output_tokens, system, policy.tools, sent
        )
        conv.turns += 1
        conv.model = getattr(reply, "model", None) or conv.model
        conv.usage.add(Usage.of_reply(reply.usage))
        content = [block_param(b) for b in reply.content]
        _add(policy, conv, {"role": "assistant", "content": content}, reply)
        text = text_of(content)
        if text:
            conv.text = text
        calls = [b for b in content if b.get("type") == "tool_use"]
        asks = reply.stop_reason == "tool_use" if policy.stop_reason_decides else bool(calls)
        if policy.run_tool is not None and asks:
            if not await _tool_turn(policy, conv, calls):
                return conv
        elif not _final_reply(policy, conv, text, reply.stop_reason):
            return conv


async def _tool_turn(policy: LoopPolicy, conv: Conversation, calls: list[dict[str, Any]]) -> bool:
    """Run the calls and send their results; False when a limit ends the loop instead."""
    assert policy.run_tool is not None
    at_limit = conv.turns >= policy.max_turns
    if at_limit and not policy.last_turn_runs_tools:
        return _stopped(conv, "max_turns")
    if policy.token_budget is not None and conv.tokens() >= policy.token_budget:
        return _stopped(conv, "token_budget")
    if not calls:
        # Nothing to answer; an empty user turn would be a 400 from the API.
        return _stopped(conv, "tool_use_without_calls")
    results = [await policy.run_tool(call) for call in calls]
    _add(policy, conv, {"role": "user", "content": results})
    return not at_limit or _stopped(conv, "max_turns")


def _final_reply(policy: LoopPolicy, conv: Conversation, text: str, stop: str | None) -> bool:
    """Take (or check) a final reply; True when a refusal is asked again."""
    conv.final_text = text
    conv.stop = stop or "unknown"
    if policy.check is None:
        return False
    conv.attempts += 1
    checked, problems = policy.check(text)
    if checked is not None:
        conv.reply, conv.problems = checked, []
        return False
    conv.problems = problems
    conv.refused = conv.refused or problems
    if conv.attempts >= policy.max_attempts or policy.retry_text is None:
        return False
    # The refused reply goes back without calls it made that were never run (the API wants a
    # result for each), and as NO_TEXT when nothing else is left (it refuses an empty turn).
    said = conv.messages[-1]["content"]
    kept = [b for b in said if b.get("type") != "tool_use"]
    if kept != said or not kept:
        conv.messages[-1] = {
            "role": "assistant",
            "content": kept or [{"type": "text", "text": NO_TEXT}],
        }
    _add(policy, conv, {"role": "user", "content": policy.retry_text(problems)})
    return conv.turns < policy.max_turns or _stopped(conv, "max_turns")


def _stopped(conv: Conversation, why: str) -> bool:
    conv.stop = why
    return False


def _add(
    policy: LoopPolicy, conv: Conversation, message: dict[str, Any], reply: Message | None = None
) -> None:
    conv.messages.append(message)
    if policy.record is not None:
        policy.record(message, reply)


async def before_deadline(seconds: float, work: Coroutine[Any, Any, Any]) -> bool:
    """Run ``work`` under a deadline: True when the deadline cut it short (what it did so far
    stays in its conversation). A timeout of its own inside still raises."""
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            await work
    except TimeoutError:
        if not deadline.expired():
            raise
        return True
    return False


def block_param(block: Any) -> dict[str, Any]:
    """An SDK content block as the plain dict we send back and keep in a transcript."""
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    dumped: dict[str, Any] = block.model_dump(mode="json", exclude_none=True)
    return dumped


def text_of(content: list[dict[str, Any]]) -> str:
    """A reply's text blocks, blank-line separated ("" when it has none)."""
    return "\n\n".join(b["text"] for b in content if b.get("type") == "text" and b.get("text"))
