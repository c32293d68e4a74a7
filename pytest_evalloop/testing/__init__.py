"""Offline testing helpers: a loopback fake of the Anthropic Messages API and its policies.

Importing this package is light: it loads pydantic and the standard library, never
``anthropic`` or ``mcp``. See ``docs/testing.md``.
"""

from __future__ import annotations

from pytest_evalloop.testing.fake_anthropic import (
    URL_LINE_PREFIX,
    FakeAnthropic,
    FakeAnthropicProcess,
    RecordedRequest,
    fetch_requests,
    reset_fake,
    start_fake_anthropic_process,
)
from pytest_evalloop.testing.policies import (
    FINAL_QUERY_TOOL,
    JUDGE_MARKER,
    AnswererScripts,
    AnswererStep,
    Disconnect,
    FakeRequest,
    Fault,
    FaultSpec,
    Hang,
    JudgeScripts,
    JudgeText,
    JudgeVerdict,
    Malformed,
    Policy,
    Reply,
    ScriptPolicy,
    ScriptSpec,
    ToolCall,
    ToolExchange,
)

__all__ = [
    "FINAL_QUERY_TOOL",
    "JUDGE_MARKER",
    "URL_LINE_PREFIX",
    "AnswererScripts",
    "AnswererStep",
    "Disconnect",
    "FakeAnthropic",
    "FakeAnthropicProcess",
    "FakeRequest",
    "Fault",
    "FaultSpec",
    "Hang",
    "JudgeScripts",
    "JudgeText",
    "JudgeVerdict",
    "Malformed",
    "Policy",
    "RecordedRequest",
    "Reply",
    "ScriptPolicy",
    "ScriptSpec",
    "ToolCall",
    "ToolExchange",
    "fetch_requests",
    "reset_fake",
    "start_fake_anthropic_process",
]
