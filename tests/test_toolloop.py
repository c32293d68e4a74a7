"""The one Messages API tool loop (`model_api/toolloop.py`), through the real anthropic SDK and
the project's fake: each rule a role's policy chooses, and what holds for every script."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalloop.model_api.toolloop import (
    NO_TEXT,
    Conversation,
    LoopPolicy,
    before_deadline,
    converse,
)
from pytest_evalloop.testing import FakeAnthropic, Reply, ToolCall
from pytest_evalloop.testing.policies import FakeRequest

MODEL = "claude-sonnet-4-6"
TOOL = {"name": "look", "description": "Look.", "input_schema": {"type": "object"}}
STOPS = {"end_turn", "max_tokens", "stop_sequence", "unknown", "tool_use"}
"""A final reply's stop reasons (`tool_use` with no calls is final where the calls decide)."""
LIMITS = {"max_turns", "token_budget", "tool_use_without_calls"}


class Script:
    """Replies by turn (1 + the assistant messages sent); the last one repeats."""

    def __init__(self) -> None:
        self.replies: list[Reply] = [Reply(text="done")]
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: FakeRequest) -> Reply:
        self.bodies.append(request.body)
        return self.replies[min(request.turn, len(self.replies)) - 1]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeAnthropic, Script]]:
    script = Script()
    with FakeAnthropic(script) as fake:
        yield fake, script


def hold(
    served: tuple[FakeAnthropic, Script], replies: list[Reply], **policy: Any
) -> tuple[Conversation, list[str], Script]:
    """One conversation over `replies`; returns it, the tool calls run (by id) and the script."""
    fake, script = served
    fake.reset()
    script.replies, script.bodies = replies, []
    ran: list[str] = []

    async def run_tool(block: dict[str, Any]) -> dict[str, Any]:
        ran.append(str(block["id"]))
        return {"type": "tool_result", "tool_use_id": block["id"], "content": "seen"}

    settings_: dict[str, Any] = {
        "model": MODEL,
        "system": "You look.",
        "max_output_tokens": 4096,
        "max_turns": 4,
        "tools": [TOOL],
        "run_tool": run_tool,
        **policy,
    }

    async def go() -> Conversation:
        client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="k", max_retries=0)
        try:
            conv = Conversation([{"role": "user", "content": "Look around."}])
            return await converse(client, LoopPolicy(**settings_), conv)
        finally:
            await client.close()

    return asyncio.run(go()), ran, script


def calls(n: int, stop: str | None = None) -> Reply:
    return Reply(text="looking", tool_calls=[ToolCall("look") for _ in range(n)], stop_reason=stop)


def test_the_stop_reason_decides_for_the_answerer(served: Any) -> None:
    # Calls under a stop that is not tool_use are never run: the reply was cut off.
    conv, ran, _ = hold(served, [calls(1, "max_tokens")])
    assert (conv.stop, ran, conv.turns, conv.final_text) == ("max_tokens", [], 1, "looking")
    conv, ran, _ = hold(served, [calls(0, "tool_use")])
    assert (conv.stop, ran, conv.final_text) == ("tool_use_without_calls", [], None)
    assert conv.text == "looking"


def test_the_calls_decide_for_claude_code_and_the_conductors(served: Any) -> None:
    conv, ran, _ = hold(
        served, [calls(2, "max_tokens"), Reply(text="done")], stop_reason_decides=False
    )
    assert (conv.stop, len(ran), conv.turns, conv.final_text) == ("end_turn", 2, 2, "done")
    # The two results go back in one user turn, in the order of the calls.
    results = conv.messages[2]["content"]
    assert [r["tool_use_id"] for r in results] == ran


@pytest.mark.parametrize(("last_turn_runs_tools", "runs"), [(False, 2), (True, 3)])
def test_at_the_turn_limit_the_last_calls_run_only_when_the_policy_says(
    served: Any, last_turn_runs_tools: bool, runs: int
) -> None:
    conv, ran, script = hold(
        served, [calls(1)], max_turns=3, last_turn_runs_tools=last_turn_runs_tools
    )
    assert (conv.stop, conv.turns, len(script.bodies), len(ran)) == ("max_turns", 3, 3, runs)
    assert conv.final_text is None


def test_the_token_budget_stops_before_the_tools(served: Any) -> None:
    conv, ran, _ = hold(served, [calls(1)], token_budget=1)
    assert (conv.stop, conv.turns, ran) == ("token_budget", 1, [])
    assert conv.tokens() >= 1 and conv.usage.calls == 1


def check(text: str) -> tuple[str | None, list[str]]:
    return (text, []) if text.startswith("OK") else (None, [f"not OK: {text[:10]!r}"])


def test_a_refused_reply_is_asked_again_once_with_why(served: Any) -> None:
    conv, _, script = hold(
        served,
        [Reply(text="nope"), Reply(text="OK now")],
        check=check,
        retry_text=lambda problems: "Again: " + "; ".join(problems),
    )
    assert (conv.reply, conv.problems, conv.refused, conv.attempts) == (
        "OK now",
        [],
        ["not OK: 'nope'"],
        2,
    )
    retry = script.bodies[1]["messages"]
    assert [m["role"] for m in retry] == ["user", "assistant", "user"]
    assert retry[-1]["content"] == "Again: not OK: 'nope'"


def test_refused_twice_the_loop_gives_up_with_the_last_why(served: Any) -> None:
    conv, _, script = hold(
        served, [Reply(text="no"), Reply(text="still no")], check=check, retry_text=str
    )
    assert (conv.reply, conv.problems, conv.refused, conv.attempts, len(script.bodies)) == (
        None,
        ["not OK: 'still no'"],
        ["not OK: 'no'"],
        2,
        2,
    )


def test_an_empty_reply_goes_back_as_text_before_a_retry(served: Any) -> None:
    # The API refuses an empty assistant turn that is not the last one.
    _, _, script = hold(served, [Reply(), Reply(text="OK")], check=check, retry_text=str)
    sent = script.bodies[1]["messages"][1]
    assert sent == {"role": "assistant", "content": [{"type": "text", "text": NO_TEXT}]}


def test_a_refused_reply_goes_back_without_calls_never_run(served: Any) -> None:
    # Under the stop-reason rule a cut-off reply's calls are never run: the API wants a result
    # for each call sent back, so the retry sends the reply's text alone.
    conv, ran, script = hold(
        served, [calls(1, "max_tokens"), Reply(text="OK")], check=check, retry_text=str
    )
    assert (conv.reply, ran) == ("OK", [])
    sent = script.bodies[1]["messages"][1]
    assert sent == {"role": "assistant", "content": [{"type": "text", "text": "looking"}]}


def test_moving_breakpoints_mark_the_request_never_the_history(served: Any) -> None:
    conv, _, script = hold(
        served, [calls(1), calls(1), Reply(text="done")], moving_breakpoints=True
    )
    third = script.bodies[2]["messages"]
    marked = [i for i, m in enumerate(third) if "cache_control" in m["content"][-1]]
    assert marked == [len(third) - 3, len(third) - 1]
    assert all(
        "cache_control" not in block
        for m in conv.messages
        if isinstance(m["content"], list)
        for block in m["content"]
    )
    # The system prompt is marked on every request, whatever the policy.
    assert all(b["system"][0]["cache_control"] == {"type": "ephemeral"} for b in script.bodies)


def test_the_recorder_sees_every_message_once_in_order(served: Any) -> None:
    seen: list[tuple[str, str | None]] = []

    def record(message: dict[str, Any], reply: Any) -> None:
        seen.append((message["role"], reply.stop_reason if reply is not None else None))

    conv, _, _ = hold(served, [calls(1), Reply(text="done")], record=record)
    assert seen == [
        ("user", None),
        ("assistant", "tool_use"),
        ("user", None),
        ("assistant", "end_turn"),
    ]
    assert len(seen) == len(conv.messages)


def test_a_deadline_keeps_what_the_conversation_did() -> None:
    never = threading.Event()
    turns = [calls(1), Reply(text="late", held_until=never)]

    def policy(request: FakeRequest) -> Reply:
        return turns[request.turn - 1]

    async def run_tool(block: dict[str, Any]) -> dict[str, Any]:
        return {"type": "tool_result", "tool_use_id": block["id"], "content": "seen"}

    with FakeAnthropic(policy) as fake:

        async def go() -> tuple[bool, Conversation]:
            client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="k", max_retries=0)
            conv = Conversation([{"role": "user", "content": "Look."}])
            rules = LoopPolicy(MODEL, "s", 4096, 4, tools=[TOOL], run_tool=run_tool)
            # The second reply is held until the fake stops: only the deadline ends the loop.
            cut = await before_deadline(0.5, converse(client, rules, conv))
            await client.close()
            return cut, conv

        cut, conv = asyncio.run(go())
    assert cut and conv.turns == 1 and conv.text == "looking" and conv.final_text is None


def test_a_timeout_of_the_work_itself_is_no_deadline() -> None:
    async def fails() -> None:
        raise TimeoutError("the work's own")

    with pytest.raises(TimeoutError, match="the work's own"):
        asyncio.run(before_deadline(60, fails()))


def test_max_turns_must_be_positive(served: Any) -> None:
    with pytest.raises(ValueError, match="max_turns must be at least 1"):
        hold(served, [Reply(text="x")], max_turns=0)


step = st.builds(
    lambda n, stop, text: Reply(
        text=text, tool_calls=[ToolCall("look") for _ in range(n)], stop_reason=stop
    ),
    st.integers(0, 2),
    st.sampled_from([None, "tool_use", "end_turn", "max_tokens"]),
    st.sampled_from([None, "a", "OK"]),
)


@settings(max_examples=60, deadline=None)
@given(
    replies=st.lists(step, min_size=1, max_size=6),
    max_turns=st.integers(1, 5),
    stop_reason_decides=st.booleans(),
    last_turn_runs_tools=st.booleans(),
    checked=st.booleans(),
    budget=st.sampled_from([None, 1, 10**9]),
)
def test_every_script_keeps_the_api_contract_and_the_counts(
    served: Any,
    replies: list[Reply],
    max_turns: int,
    stop_reason_decides: bool,
    last_turn_runs_tools: bool,
    checked: bool,
    budget: int | None,
) -> None:
    conv, ran, script = hold(
        served,
        replies,
        max_turns=max_turns,
        stop_reason_decides=stop_reason_decides,
        last_turn_runs_tools=last_turn_runs_tools,
        token_budget=budget,
        **({"check": check, "retry_text": str} if checked else {}),
    )
    # One request a turn, never more than the limit; every reply counted once.
    assert conv.turns == len(script.bodies) == conv.usage.calls <= max_turns
    assert conv.stop in STOPS | LIMITS
    assert conv.stop != "max_turns" or conv.turns == max_turns
    assert conv.attempts <= 2
    # Every tool_use answered by exactly one result in the next turn; nothing else is run.
    results = []
    for before, after in zip(conv.messages, conv.messages[1:], strict=False):
        if before["role"] == "assistant" and after["role"] == "user":
            asked = [b["id"] for b in before["content"] if b.get("type") == "tool_use"]
            if isinstance(after["content"], list):
                answered = [b["tool_use_id"] for b in after["content"]]
                assert answered == asked and answered
                results += answered
    assert results == ran
    # Roles alternate, and no request carries an empty turn but the opening's.
    for body in script.bodies:
        roles = [m["role"] for m in body["messages"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"] * (len(roles) % 2)
        assert all(m["content"] for m in body["messages"])
