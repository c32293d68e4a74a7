"""The fake Anthropic endpoint, exercised through the real anthropic SDK (sync and async)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import pytest
from pydantic import ValidationError

from pytest_evalloop.testing import (
    FakeAnthropic,
    FakeRequest,
    Fault,
    Reply,
    ScriptError,
    ScriptSpec,
    ToolCall,
    fetch_requests,
    reset_fake,
    start_fake_anthropic_process,
)
from pytest_evalloop.testing.policies import (
    NO_SCRIPT_TEXT,
    Outcome,
    fill,
    parse_request,
    template_values,
)
from tests.querygate import EVENT_CEILING_S

MODEL = "claude-sonnet-5-5"
SECRET = "test-key-SECRET-value-0123456789"
JUDGE_SYSTEM = "You are the judge.\nJUDGE_VERSION: 7\nScore the answer."

TOOLS: list[dict[str, Any]] = [
    {
        "name": "get_context",
        "description": "Ranked entities for a search.",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
    {
        "name": "execute_query",
        "description": "Run a query.",
        "input_schema": {"type": "object", "properties": {"sql": {"type": "string"}}},
    },
]

LOOP_SPEC = ScriptSpec.model_validate(
    {
        "answerer": {
            "default": [
                {"tool": "get_context", "input": {"q": "{question}"}},
                {"tool": "execute_query", "input": {"sql": "select 42 as n"}},
                {"text": "There are 42."},
            ]
        },
        "judge": {"default": {"verdict": "match", "confidence": 9, "why": "42 equals 42"}},
    }
)


def client(fake: FakeAnthropic, **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fake.base_url, api_key=SECRET, **kwargs)


def run_loop(api: anthropic.Anthropic, question: str, **kwargs: Any) -> list[Any]:
    """A minimal answerer loop; returns every response."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    replies = []
    for _ in range(6):
        resp = api.messages.create(
            model=MODEL, max_tokens=1000, tools=TOOLS, messages=messages, **kwargs
        )
        replies.append(resp)
        messages.append({"role": "assistant", "content": resp.content})
        if resp.stop_reason != "tool_use":
            return replies
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": f"ran {b.name}"}
            for b in resp.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    raise AssertionError("the loop did not end")


def test_tool_use_loop_two_turns_then_text() -> None:
    with FakeAnthropic(LOOP_SPEC) as fake:
        replies = run_loop(client(fake), "How many orders?")
        log = fake.calls()
    assert [r.stop_reason for r in replies] == ["tool_use", "tool_use", "end_turn"]
    first = replies[0].content[0]
    assert (first.name, first.input) == ("get_context", {"q": "How many orders?"})
    assert replies[1].content[0].input == {"sql": "select 42 as n"}
    assert replies[2].content[0].text == "There are 42."
    assert [(r.role, r.turn) for r in log] == [("answerer", 1), ("answerer", 2), ("answerer", 3)]
    assert log[0].tools == ["get_context", "execute_query"]
    assert replies[0].content[0].id != replies[1].content[0].id


def test_async_client_runs_the_same_loop() -> None:
    async def loop(base_url: str) -> list[Any]:
        api = anthropic.AsyncAnthropic(base_url=base_url, api_key=SECRET)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "How many orders?"}]
        out = []
        while True:
            resp = await api.messages.create(
                model=MODEL, max_tokens=1000, tools=TOOLS, messages=messages
            )
            out.append(resp)
            if resp.stop_reason != "tool_use":
                return out
            messages.append({"role": "assistant", "content": resp.content})
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": b.id, "content": "ok"}
                        for b in resp.content
                        if b.type == "tool_use"
                    ],
                }
            )

    with FakeAnthropic(LOOP_SPEC) as fake:
        replies = asyncio.run(loop(fake.base_url))
        async_headers = [r.headers.get("x-stainless-async") for r in fake.calls()]
    assert [r.stop_reason for r in replies] == ["tool_use", "tool_use", "end_turn"]
    assert replies[-1].content[0].text == "There are 42."
    assert all(h and h != "false" for h in async_headers)


def test_streaming_reassembles_tool_use_and_text() -> None:
    spec = ScriptSpec.model_validate(
        {
            "answerer": {
                "default": [
                    [
                        {"text": "Let me look that up in the model first."},
                        {
                            "tool": "execute_query",
                            "input": {"sql": "select {question} -- " + "x" * 60},
                        },
                    ],
                ]
            }
        }
    )
    with FakeAnthropic(spec) as fake:
        api = client(fake)
        messages = [{"role": "user", "content": "'q'"}]
        with api.messages.stream(
            model=MODEL, max_tokens=1000, tools=TOOLS, messages=messages
        ) as stream:
            final = stream.get_final_message()
        events = list(
            api.messages.create(
                model=MODEL, max_tokens=1000, tools=TOOLS, messages=messages, stream=True
            )
        )
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "text"
    assert final.content[0].text == "Let me look that up in the model first."
    assert final.content[1].type == "tool_use"
    assert final.content[1].input == {"sql": "select 'q' -- " + "x" * 60}
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    json_deltas = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(json_deltas) > 1
    assert json.loads("".join(json_deltas)) == final.content[1].input
    assert events[-2].usage.output_tokens == final.usage.output_tokens > 1


def test_usage_reports_cache_creation_then_cache_read() -> None:
    cached_tools = [dict(t) for t in TOOLS]
    cached_tools[-1]["cache_control"] = {"type": "ephemeral"}
    system = [
        {
            "type": "text",
            # Over the 4,096-token floor an unknown model (this one) is given.
            "text": "You answer questions. " * 800,
            "cache_control": {"type": "ephemeral"},
        }
    ]
    with FakeAnthropic(LOOP_SPEC) as fake:
        api = client(fake)

        def ask(question: str, **kw: Any) -> Any:
            messages = [{"role": "user", "content": question}]
            return api.messages.create(model=MODEL, max_tokens=500, messages=messages, **kw).usage

        first = ask("How many orders?", tools=cached_tools, system=system)
        second = ask("How many users?", tools=cached_tools, system=system)
        plain = ask("How many orders?", tools=TOOLS)
        plain_again = ask("How many orders?", tools=TOOLS)
    assert first.cache_creation_input_tokens > 100 and first.cache_read_input_tokens == 0
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    assert second.cache_creation_input_tokens == 0
    assert first.input_tokens > 0 and first.output_tokens > 0
    assert (plain.cache_creation_input_tokens, plain.cache_read_input_tokens) == (0, 0)
    assert plain == plain_again  # deterministic


def test_overloaded_burst_survived_by_sdk_retries_with_retry_after_ms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fault = {"role": "answerer", "status": 529, "retry_after_ms": 20, "times": 3}
    spec = ScriptSpec.model_validate({**LOOP_SPEC.model_dump(), "faults": [fault]})
    # What the SDK decided to wait between its retries, read where it sleeps (its module's
    # `time.sleep`), rather than inferred from how long the calls took on this machine.
    import anthropic._base_client as base_client

    waits: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if threading.current_thread() is threading.main_thread():
            waits.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(base_client.time, "sleep", sleep)
    with FakeAnthropic(spec) as fake:
        resp = client(fake, max_retries=3).messages.create(
            model=MODEL, max_tokens=100, tools=TOOLS, messages=[{"role": "user", "content": "q"}]
        )
        log = fake.calls()
    assert resp.stop_reason == "tool_use"
    assert [r.status for r in log] == [529, 529, 529, 200]
    assert [r.headers["x-stainless-retry-count"] for r in log] == ["0", "1", "2", "3"]
    assert waits == [0.02, 0.02, 0.02]  # retry-after-ms, not the SDK's backoff of 0.5 s and up


def test_rate_limit_with_retry_after_zero_then_success() -> None:
    spec = ScriptSpec.model_validate(
        {
            "answerer": {"default": [{"text": "fine"}]},
            "faults": [{"status": 429, "retry_after": 0, "times": 1}],
        }
    )
    with FakeAnthropic(spec) as fake:
        resp = client(fake, max_retries=2).messages.create(
            model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "q"}]
        )
        log = fake.calls()
    assert resp.content[0].text == "fine"
    assert [(r.status, r.error) for r in log] == [(429, "rate_limit_error"), (200, None)]


@pytest.mark.parametrize(
    ("status", "error_class", "error_type"),
    [
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (503, anthropic.ServiceUnavailableError, "api_error"),
    ],
)
def test_fault_statuses_map_to_sdk_errors(
    status: int, error_class: type[anthropic.APIStatusError], error_type: str
) -> None:
    def policy(request: FakeRequest) -> Fault:
        return Fault(status=status, retry_after=0.01)

    with FakeAnthropic(policy) as fake:
        with pytest.raises(error_class) as info:
            client(fake, max_retries=0).messages.create(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "q"}]
            )
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == error_type
    assert info.value.status_code == status
    assert info.value.response.headers["retry-after"] == "0.01"


def test_malformed_body_surfaces_as_sdk_error() -> None:
    spec = ScriptSpec.model_validate({"faults": [{"kind": "malformed", "times": 5}]})
    with FakeAnthropic(spec) as fake:
        with pytest.raises(
            (anthropic.APIResponseValidationError, json.JSONDecodeError, ValueError)
        ):
            client(fake, max_retries=0).messages.create(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "q"}]
            )
        assert [r.outcome for r in fake.calls()] == ["malformed"]


def test_hang_longer_than_client_timeout_times_out() -> None:
    # The fake never answers (until it stops), so the only way out of the call is the client's
    # own timeout: no race between the hang's length and the machine's speed.
    spec = ScriptSpec.model_validate({"faults": [{"kind": "hang", "seconds": None}]})
    with FakeAnthropic(spec) as fake:
        # APITimeoutError normally; under load httpcore's read timeout can surface as the
        # connection error it subclasses. Either way the client gave up on the hang.
        with pytest.raises(anthropic.APIConnectionError):
            client(fake, max_retries=0, timeout=0.2).messages.create(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "q"}]
            )
        assert [r.outcome for r in fake.calls()] == ["hang"]


def test_latency_delays_the_reply() -> None:
    spec = ScriptSpec.model_validate({"answerer": {"default": [{"text": "slow"}]}, "latency": 0.3})
    with FakeAnthropic(spec) as fake:
        start = time.monotonic()
        client(fake).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "q"}]
        )
        assert time.monotonic() - start >= 0.3


def test_temperature_is_rejected_with_400() -> None:
    with FakeAnthropic(LOOP_SPEC) as fake:
        with pytest.raises(anthropic.BadRequestError) as info:
            client(fake).messages.create(
                model=MODEL,
                max_tokens=10,
                messages=[{"role": "user", "content": "q"}],
                extra_body={"temperature": 0},
            )
        assert fake.calls()[0].outcome == "invalid"
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "temperature" in info.value.body["error"]["message"]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"tools": [{"name": "bad name!", "input_schema": {"type": "object"}}]}, "pattern"),
        ({"messages": []}, "messages"),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "toolu_a", "name": "t", "input": {}}
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "toolu_b", "content": "x"}
                        ],
                    },
                ]
            },
            "toolu_b",
        ),
    ],
)
def test_invalid_requests_are_rejected(kwargs: dict[str, Any], needle: str) -> None:
    call: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "q"}],
    }
    call.update(kwargs)
    with FakeAnthropic(LOOP_SPEC) as fake:
        with pytest.raises(anthropic.BadRequestError) as info:
            client(fake).messages.create(**call)
    assert needle in info.value.body["error"]["message"]


def test_request_log_redacts_the_api_key() -> None:
    with FakeAnthropic(LOOP_SPEC) as fake:
        client(fake).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "q"}]
        )
        with urllib.request.urlopen(fake.base_url + "/_fake/requests") as resp:
            raw = resp.read().decode()
        logged = fake.calls()[0].headers
    assert SECRET not in raw
    assert SECRET not in json.dumps(logged)
    secret_headers = {k: v for k, v in logged.items() if k in ("x-api-key", "authorization")}
    assert secret_headers and set(secret_headers.values()) == {"REDACTED"}
    assert logged["anthropic-version"] == "2026-10-21"


def test_judge_and_answerer_are_routed_by_the_judge_marker() -> None:
    spec = ScriptSpec.model_validate(
        {
            "answerer": {"default": [{"text": "answer text"}]},
            "judge": {
                "by_substring": {
                    "orders": [
                        {"text": "no json here"},
                        {"text": "```json\n{broken\n```"},
                        {"verdict": "no_match", "confidence": 8, "why": "off by one"},
                    ]
                },
                "default": {"verdict": "match"},
            },
        }
    )
    with FakeAnthropic(spec) as fake:
        api = client(fake)

        def judge(question: str) -> str:
            msg = api.messages.create(
                model=MODEL,
                max_tokens=800,
                system=JUDGE_SYSTEM,
                messages=[{"role": "user", "content": f"QUESTION:\n{question}\nANSWER: 41"}],
            )
            return msg.content[0].text

        replies = [judge("How many orders?") for _ in range(4)]
        other = judge("How many users?")
        answer = api.messages.create(
            model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "How many orders?"}]
        )
        roles = [r.role for r in fake.calls()]
    assert replies[:2] == ["no json here", "```json\n{broken\n```"]
    for text in replies[2:]:
        fenced = text.split("```json\n", 1)[1].split("```", 1)[0]
        assert json.loads(fenced)["verdict"] == "no_match"
        assert text.index("```json") > 0  # prose first
    verdict = json.loads(other.split("```json\n", 1)[1].split("```", 1)[0])
    assert set(verdict) == {
        "verdict",
        "confidence",
        "why",
        "column_pairing",
        "gold_status",
        "gold_note",
    }
    assert verdict["verdict"] == "match"
    assert answer.content[0].text == "answer text"
    assert roles == ["judge"] * 5 + ["answerer"]


def test_model_query_templating_from_cases_file_and_final_query_tool(tmp_path: Path) -> None:
    cases = [
        {
            "qid": "a",
            "question": "How many orders?",
            "modelQuery": "run: orders -> { aggregate: n }",
            "golden": {"kind": "scalar", "value": 7},
        },
        {"qid": "b", "question": "How many users?", "modelQuery": "run: users -> { aggregate: n }"},
    ]
    (tmp_path / "cases.jsonl").write_text("\n".join(json.dumps(c) for c in cases) + "\n")
    spec = ScriptSpec.model_validate(
        {
            "cases_file": str(tmp_path / "cases.jsonl"),
            "answerer": {
                "default": [
                    {
                        "tool": "execute_query",
                        "input": {"sql": "{modelQuery}", "qid": "{qid}", "gold": "{golden.value}"},
                    },
                    {"declare_final": "{modelQuery}"},
                    {"text": "done"},
                ]
            },
        }
    )
    final_tool = {"name": "submit_final_query", "input_schema": {"type": "object"}}
    with FakeAnthropic(spec) as fake:
        api = client(fake)
        offered = _loop_with_tools(api, "How many orders?", [*TOOLS, final_tool])
        not_offered = _loop_with_tools(api, "How many users?", TOOLS)
    calls = [b for r in offered for b in r.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in calls] == [
        ("execute_query", {"sql": "run: orders -> { aggregate: n }", "qid": "a", "gold": 7}),
        ("submit_final_query", {"query": "run: orders -> { aggregate: n }"}),
    ]
    calls = [b for r in not_offered for b in r.content if b.type == "tool_use"]
    assert [b.name for b in calls] == ["execute_query"]
    assert calls[0].input["sql"] == "run: users -> { aggregate: n }"
    assert not_offered[-1].content[0].text == "done"


def _loop_with_tools(
    api: anthropic.Anthropic, question: str, tools: list[dict[str, Any]]
) -> list[Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    out = []
    while len(out) < 6:
        resp = api.messages.create(model=MODEL, max_tokens=1000, tools=tools, messages=messages)
        out.append(resp)
        if resp.stop_reason != "tool_use":
            break
        messages.append({"role": "assistant", "content": resp.content})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": b.id, "content": "ok"}
                    for b in resp.content
                    if b.type == "tool_use"
                ],
            }
        )
    return out


def test_endpoint_down_fails_every_call() -> None:
    spec = ScriptSpec.model_validate(
        {"down": {"status": 503, "retry_after_ms": 1}, "answerer": {"default": [{"text": "x"}]}}
    )
    with FakeAnthropic(spec) as fake:
        api = client(fake, max_retries=1)
        for _ in range(3):
            with pytest.raises(anthropic.ServiceUnavailableError):
                api.messages.create(
                    model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "q"}]
                )
        assert [r.status for r in fake.calls()] == [503] * 6


def test_disconnect_is_a_connection_error() -> None:
    spec = ScriptSpec.model_validate({"down": {"kind": "disconnect"}})
    with FakeAnthropic(spec) as fake:
        with pytest.raises(anthropic.APIConnectionError):
            client(fake, max_retries=0).messages.create(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "q"}]
            )


def test_callable_policy_sees_the_parsed_request_and_max_tokens_truncates() -> None:
    seen: list[FakeRequest] = []

    def policy(request: FakeRequest) -> Reply:
        seen.append(request)
        if request.turn == 1:
            return Reply(tool_calls=[ToolCall("get_context", {"q": request.question})])
        return Reply(text="word " * 1000)  # 5000 chars: more than max_tokens=1000 allows

    with FakeAnthropic(policy) as fake:
        replies = run_loop(client(fake), "Top brands?")
    assert [r.stop_reason for r in replies] == ["tool_use", "max_tokens"]
    assert replies[1].usage.output_tokens == 1000
    assert replies[1].content[0].text == ("word " * 1000)[:4000]
    assert [s.call_index for s in seen] == [0, 1]
    assert seen[1].exchanges[0].name == "get_context"
    assert seen[1].exchanges[0].result == "ran get_context"
    assert seen[1].question == "Top brands?" and seen[1].role == "answerer"


def test_subprocess_mode_with_policy_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        json.dumps({"qid": "a", "question": "How many?", "modelQuery": "run: t -> {n}"}) + "\n"
    )
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(
        json.dumps(
            {
                "cases_file": "cases.jsonl",  # relative to the spec file
                "answerer": {
                    "default": [{"tool": "execute_query", "input": {"sql": "{modelQuery}"}}]
                },
            }
        )
    )
    with start_fake_anthropic_process(spec_file) as proc:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", proc.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
        resp = anthropic.Anthropic().messages.create(
            model=MODEL,
            max_tokens=100,
            tools=TOOLS,
            messages=[{"role": "user", "content": "How many?"}],
        )
        log = fetch_requests(proc.url)
        proc.reset()
        after_reset = proc.requests()
        pid = proc.process.pid
    assert proc.url.startswith("http://127.0.0.1:")
    assert resp.content[0].input == {"sql": "run: t -> {n}"}
    assert [(r.role, r.question, r.status) for r in log] == [("answerer", "How many?", 200)]
    assert SECRET not in json.dumps([r.model_dump() for r in log])
    assert after_reset == []
    assert proc.process.poll() is not None and pid > 0


def test_a_broken_policy_is_a_readable_500_that_is_not_retried() -> None:
    def policy(request: FakeRequest) -> Reply:
        raise KeyError("no such case")

    with FakeAnthropic(policy) as fake:
        with pytest.raises(anthropic.InternalServerError) as info:
            client(fake, max_retries=2).messages.create(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "q"}]
            )
        assert len(fake.calls()) == 1
    assert "KeyError" in info.value.body["error"]["message"]
    assert info.value.response.headers["x-should-retry"] == "false"


def test_turn_numbers_group_steps_and_exact_question_beats_substring() -> None:
    spec = ScriptSpec.model_validate(
        {
            "answerer": {
                "by_question": {
                    "How many orders?": [
                        {"tool": "get_context", "input": {"q": "orders"}, "turn": 1},
                        {"tool": "execute_query", "input": {"sql": "select 1"}, "turn": 1},
                        {"text": "one"},
                    ]
                },
                "by_substring": {"orders": [{"text": "from the substring script"}]},
            }
        }
    )
    with FakeAnthropic(spec) as fake:
        api = client(fake)
        exact = run_loop(api, "How many orders?")
        substring = run_loop(api, "List the orders")
        unscripted = run_loop(api, "Something else")
    assert [b.name for b in exact[0].content] == ["get_context", "execute_query"]
    assert [r.stop_reason for r in exact] == ["tool_use", "end_turn"]
    assert exact[1].content[0].text == "one"
    assert substring[0].content[0].text == "from the substring script"
    assert unscripted[0].content[0].text == NO_SCRIPT_TEXT


def test_faults_target_a_role_after_n_calls() -> None:
    fault = {"role": "judge", "status": 500, "after": 1, "retry_after_ms": 1}
    spec = ScriptSpec.model_validate(
        {
            "answerer": {"default": [{"text": "answer"}]},
            "judge": {"default": {"verdict": "match"}},
            "faults": [fault],
        }
    )
    with FakeAnthropic(spec) as fake:
        api = client(fake, max_retries=0)

        def call(system: str | None) -> str:
            extra = {"system": system} if system else {}
            msg = api.messages.create(
                model=MODEL, max_tokens=300, messages=[{"role": "user", "content": "q"}], **extra
            )
            return msg.content[0].text

        assert call(None) == "answer"
        assert "```json" in call(JUDGE_SYSTEM)
        assert call(None) == "answer"  # the judge's fault never hits the answerer
        with pytest.raises(anthropic.InternalServerError):
            call(JUDGE_SYSTEM)
        assert "```json" in call(JUDGE_SYSTEM)  # times=1: consumed
        statuses = [(r.role, r.status) for r in fake.calls()]
    assert statuses == [
        ("answerer", 200),
        ("judge", 200),
        ("answerer", 200),
        ("judge", 500),
        ("judge", 200),
    ]


def test_reset_rewinds_judge_lists_and_clears_the_log() -> None:
    spec = ScriptSpec.model_validate({"judge": {"default": [{"text": "first"}, {"text": "next"}]}})
    with FakeAnthropic(spec) as fake:
        api = client(fake)

        def judge() -> str:
            msg = api.messages.create(
                model=MODEL,
                max_tokens=50,
                system=[{"type": "text", "text": JUDGE_SYSTEM}],
                messages=[{"role": "user", "content": "judge this"}],
            )
            return msg.content[0].text

        before = [judge(), judge(), judge()]
        reset_fake(fake.base_url)
        cleared = fetch_requests(fake.base_url)
        after = judge()
    assert before == ["first", "next", "next"]  # the last entry repeats
    assert cleared == []
    assert after == "first"


def test_policy_file_with_a_typo_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"answerer": {"defualt": [{"text": "x"}]}}))
    with pytest.raises(ScriptError, match="defualt") as info:
        ScriptSpec.load(path)
    assert str(path) in str(info.value)
    with pytest.raises(ValidationError, match="exactly one of"):
        ScriptSpec.model_validate({"answerer": {"default": [{"tool": "t", "text": "both"}]}})


def test_templates_keep_unknown_placeholders_and_embed_non_strings_as_json() -> None:
    values = template_values("Q?", {"qid": "a", "golden": {"value": {"n": 7}, "status": "ok"}})
    filled = fill(
        {
            "sql": "run: t -> { where: x = {golden.value} } {nope}",
            "v": "{value}",
            "q": "{question}",
        },
        values,
    )
    assert filled == {
        "sql": 'run: t -> { where: x = {"n": 7} } {nope}',
        "v": {"n": 7},
        "q": "Q?",
    }


def test_bearer_token_is_redacted_and_the_policy_sees_system_text() -> None:
    seen: list[FakeRequest] = []

    def policy(request: FakeRequest) -> Reply:
        seen.append(request)
        return Reply(text="ok")

    with FakeAnthropic(policy) as fake:
        api = anthropic.Anthropic(base_url=fake.base_url, auth_token=SECRET)
        api.messages.create(
            model=MODEL,
            max_tokens=20,
            system=[{"type": "text", "text": "be brief"}, {"type": "text", "text": JUDGE_SYSTEM}],
            messages=[{"role": "user", "content": "q"}],
        )
        logged = fetch_requests(fake.base_url)[0]
    assert logged.headers["authorization"] == "REDACTED"
    assert SECRET not in json.dumps(logged.model_dump())
    assert seen[0].role == "judge" and "be brief" in seen[0].system
    assert seen[0].headers["authorization"] == "REDACTED"


def test_concurrent_async_calls_are_served_in_parallel() -> None:
    # Every reply is held until all 40 requests have reached the fake: served one at a time,
    # the first would be held forever and the client's timeout fails the test, whatever the
    # machine's speed. (The fake calls a policy under its lock, so the count is exact.)
    inner = ScriptSpec.model_validate({"answerer": {"default": [{"text": "ok"}]}}).policy()
    all_in = threading.Event()
    arrived = []

    def policy(request: FakeRequest) -> Outcome:
        arrived.append(request.call_index)
        if len(arrived) == 40:
            all_in.set()
        outcome = inner(request)
        assert isinstance(outcome, Reply)
        return dataclasses.replace(outcome, held_until=all_in)

    async def burst(base_url: str) -> None:
        api = anthropic.AsyncAnthropic(
            base_url=base_url, api_key=SECRET, max_retries=0, timeout=EVENT_CEILING_S
        )
        await asyncio.gather(
            *(
                api.messages.create(
                    model=MODEL, max_tokens=10, messages=[{"role": "user", "content": f"q{i}"}]
                )
                for i in range(40)
            )
        )

    with FakeAnthropic(policy) as fake:
        asyncio.run(burst(fake.base_url))
        served = fake.calls()
    assert len(served) == 40 and {r.status for r in served} == {200}
    assert sorted(r.call_index for r in served) == list(range(40))
    assert all_in.is_set()


def test_any_role_fault_counts_every_request_and_final_query_stays_text() -> None:
    spec = ScriptSpec.model_validate(
        {
            "answerer": {"default": [{"declare_final": "{golden.value}"}]},
            "judge": {"default": {"verdict": "match"}},
            "faults": [{"role": "any", "status": 503, "after": 2}],
        }
    )
    policy = spec.policy()
    tools = [{"name": "submit_final_query", "input_schema": {"type": "object"}}]

    def ask(system: str) -> Any:
        body = {"model": MODEL, "max_tokens": 9, "system": system, "tools": tools}
        body["messages"] = [{"role": "user", "content": "q"}]
        return policy(parse_request(body, {"X-Api-Key": SECRET}, 0))

    outcomes = [ask(JUDGE_SYSTEM), ask("plain"), ask("plain"), ask(JUDGE_SYSTEM)]
    assert [type(o).__name__ for o in outcomes] == ["Reply", "Reply", "Fault", "Reply"]
    assert outcomes[1].tool_calls[0].input == {"query": "{golden.value}"}  # no case: kept
    assert outcomes[2].status == 503


def test_a_cycled_judge_list_starts_over_per_call() -> None:
    # Verdicts that vary per sample and per judge sample (issue 18): the list starts over.
    spec = ScriptSpec.model_validate(
        {"judge": {"default": [{"text": "one"}, {"text": "two"}], "cycle": True}}
    )
    with FakeAnthropic(spec) as fake:
        api = client(fake)
        said = [
            api.messages.create(
                model=MODEL,
                max_tokens=50,
                system=[{"type": "text", "text": JUDGE_SYSTEM}],
                messages=[{"role": "user", "content": "judge this"}],
            )
            .content[0]
            .text
            for _ in range(5)
        ]
    assert said == ["one", "two", "one", "two", "one"]


def test_a_slow_case_s_replies_take_the_latency_its_question_names() -> None:
    # The bench's uneven workload: a few cases slow among quick ones (bench/workload.py).
    from pytest_evalloop.testing.policies import FakeRequest

    spec = ScriptSpec.model_validate(
        {
            "answerer": {"default": [{"text": "a"}], "latency_by_substring": {"(#3)": 0.5}},
            "judge": {"default": {"verdict": "match"}},
            "latency": 0.01,
        }
    )
    policy = spec.policy()

    def latency(role: str, question: str) -> float:
        request = FakeRequest(
            role=role,  # type: ignore[arg-type]
            model=MODEL,
            system="",
            messages=[],
            tools=[],
            question=question,
            exchanges=[],
            turn=1,
            headers={},
            call_index=0,
            max_tokens=10,
        )
        reply = policy(request)
        assert isinstance(reply, Reply)
        return reply.latency

    assert latency("answerer", "How many? (#3)") == 0.5
    assert latency("answerer", "How many? (#30)") == 0.01  # "(#3)" is no part of "(#30)"
    assert latency("judge", "How many? (#3)") == 0.01  # the judge's calls stay as they are
