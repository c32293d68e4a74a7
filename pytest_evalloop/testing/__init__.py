"""Offline testing helpers: a loopback fake of the Anthropic Messages API and its policies.

Names are loaded on first use (PEP 562), so ``import pytest_evalloop.testing`` costs nothing
and never imports ``anthropic`` or ``mcp``; it also keeps
``python -m pytest_evalloop.testing.fake_anthropic`` free of runpy's double-import warning.
See ``docs/testing.md``.

The top layer of the declared order (``tests/test_architecture.py``): the fakes may import any
part of the package (the stand-in ``claude`` speaks in its records), and nothing in the
package imports them; only the tests and the benchmarks do.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_evalloop.testing.fake_anthropic import (
        URL_LINE_PREFIX,
        FakeAnthropic,
        RecordedRequest,
    )
    from pytest_evalloop.testing.fake_anthropic_process import (
        FakeAnthropicProcess,
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
        Outcome,
        Policy,
        Reply,
        ScriptError,
        ScriptPolicy,
        ScriptSpec,
        ToolCall,
        ToolExchange,
        render_verdict,
    )

__all__ = [
    "AnswererScripts",
    "AnswererStep",
    "Disconnect",
    "FINAL_QUERY_TOOL",
    "FakeAnthropic",
    "FakeAnthropicProcess",
    "FakeRequest",
    "Fault",
    "FaultSpec",
    "Hang",
    "JUDGE_MARKER",
    "JudgeScripts",
    "JudgeText",
    "JudgeVerdict",
    "Malformed",
    "Outcome",
    "Policy",
    "RecordedRequest",
    "Reply",
    "ScriptError",
    "ScriptPolicy",
    "ScriptSpec",
    "ToolCall",
    "ToolExchange",
    "URL_LINE_PREFIX",
    "fetch_requests",
    "render_verdict",
    "reset_fake",
    "start_fake_anthropic_process",
]

_FAKE_NAMES = frozenset({"URL_LINE_PREFIX", "FakeAnthropic", "RecordedRequest"})
_PROCESS_NAMES = frozenset(
    {"FakeAnthropicProcess", "fetch_requests", "reset_fake", "start_fake_anthropic_process"}
)
# Which submodule defines each public name; nothing is imported until it is used.
_EXPORTS = {
    name: (
        "pytest_evalloop.testing.fake_anthropic"
        if name in _FAKE_NAMES
        else "pytest_evalloop.testing.fake_anthropic_process"
        if name in _PROCESS_NAMES
        else "pytest_evalloop.testing.policies"
    )
    for name in __all__
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
