"""The claude-code answerer against the real Claude Code CLI, offline.

The CLI (`@anthropic-ai/claude-code`, pinned in `.ci/run`) talks to the loopback fake Messages
API through `ANTHROPIC_BASE_URL`, with its non-essential traffic off; it starts the embedded
MCP server itself from the config the answerer writes. Skipped when no working `claude` is
found: `$EVALLOOP_CLAUDE_CODE`, `claude` on PATH, or the `.ci/run` cache directory.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_evalloop.answer.claude_code import ClaudeCodeAnswerer
from pytest_evalloop.answer.claude_process import claude_version
from pytest_evalloop.failures import HarnessError
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic, FaultSpec, ScriptSpec
from tests.conftest import SECRET
from tests.test_claude_code import run_answer
from tests.test_run import make_set

PINNED = "2.1.332"
SCORED, PEEKED = "ecom_order_count", "ecom_accounts_never_ordered"
TOOLS = ["mcp__data__execute_query", "mcp__data__get_context"]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "evalloop" / "claude-code"


def find_real_cli() -> str | None:
    """The first `claude` whose `--version` works."""
    candidates = [
        os.environ.get("EVALLOOP_CLAUDE_CODE"),
        shutil.which("claude"),
        str(_cache_dir() / "node_modules" / ".bin" / "claude"),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and claude_version(candidate):
            return candidate
    return None


CLI = find_real_cli()
pytestmark = pytest.mark.skipif(
    CLI is None, reason="the real Claude Code CLI is not installed (.ci/run installs it)"
)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The CLI's environment: offline, a neutral $TMPDIR to check afterwards, the CLI on PATH."""
    assert CLI is not None
    host_tmp = tmp_path / "host-tmp"
    host_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(host_tmp))
    monkeypatch.setenv("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    monkeypatch.setenv("PATH", f"{Path(CLI).parent}{os.pathsep}{os.environ['PATH']}")
    yield host_tmp


def test_the_pinned_version_is_installed() -> None:
    assert CLI is not None and claude_version(CLI) == PINNED


def test_a_run_scores_a_spilled_case_and_catches_refused_host_tools(
    pytester: pytest.Pytester, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_dir = make_set(pytester.path, [SCORED, PEEKED])
    question = {c.qid: c.question for _, c in sets.load_cases(set_dir).rows}
    cases = str(set_dir / "cases.jsonl")
    spec = {
        "cases_file": cases,
        "answerer": {
            "by_question": {
                question[SCORED]: [
                    {"tool": "mcp__data__get_context", "input": {"query": "{question}"}},
                    {"tool": "mcp__data__execute_query", "input": {"sql": "{modelQuery}"}},
                    {"text": "Here it is.\n\nFinal query:\n```sql\n{modelQuery}\n```"},
                ],
                question[PEEKED]: [
                    {"tool": "Read", "input": {"file_path": cases}},
                    {"tool": "Bash", "input": {"command": f"cat {cases}"}},
                    {"text": "Done.\n\nFinal query:\n```sql\nSELECT 1\n```"},
                ],
            }
        },
        "judge": {"default": {"verdict": "match"}},
    }
    with FakeAnthropic(ScriptSpec.model_validate(spec)) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
        # The endpoint answers the configured alias with a dated id, as the API does.
        fake.served_models = {"claude-sonnet-4-6": "claude-sonnet-4-6-20260101"}
        # The context result (~3 KB) is over this limit: the CLI saves it to a file.
        monkeypatch.setenv("MAX_MCP_OUTPUT_TOKENS", "300")
        result = pytester.runpytest_subprocess(
            str(set_dir),
            "--eval-answerer=claude-code",
            "--eval-answerer-model=claude-sonnet-4-6",
            "--eval-attempt-timeout=240",
            "-rA",
        )
        cli_calls = [r for r in fake.calls("answerer")]
    out = result.stdout.str()
    assert result.parseoutcomes().get("passed") == 1, out
    assert result.parseoutcomes().get("errors") == 1, out
    assert cli_calls and all(r.tools == TOOLS for r in cli_calls), "the API saw other tools"

    [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    attempts = {k[0]: a for k, a in read.attempts().items()}
    scores = {k[0]: s for k, s in read.scores().items()}
    recalls = {e.qid: e.recall for e in read.of_kind("retrieval_score")}
    scored, peeked = attempts[SCORED], attempts[PEEKED]
    assert scored.contaminated is False and scored.submitted
    assert scores[SCORED].verdict == "match"
    assert recalls[SCORED] == 1.0  # the spilled context result was read back
    assert peeked.contaminated is True and scores[PEEKED].verdict is None
    reasons = " ".join(peeked.contamination_reasons)
    assert "Read touched protected path" in reasons and "Bash touched protected path" in reasons

    assert scored.transcript_path is not None
    transcript = json.loads((run_dir / scored.transcript_path).read_text(encoding="utf-8"))
    events = transcript["messages"]
    init = next(e for e in events if e.get("subtype") == "init")
    assert init["claude_code_version"] == PINNED
    assert sorted(init["tools"]) == TOOLS  # the session's tools: exactly the target's
    assert "eval" not in Path(init["cwd"]).relative_to(offline.resolve()).as_posix().lower()
    spilled = [
        block["content"]
        for e in events
        if e["type"] == "user"
        for block in e["message"]["content"]
        if isinstance(block.get("content"), str) and "Output has been saved to" in block["content"]
    ]
    assert spilled, "MAX_MCP_OUTPUT_TOKENS=300 should have made the CLI spill the context result"
    peek_events = json.loads((run_dir / str(peeked.transcript_path)).read_text(encoding="utf-8"))[
        "messages"
    ]
    refusals = [e.get("tool_use_result") for e in peek_events if e["type"] == "user"]
    assert any("No such tool available: Read" in str(r) for r in refusals)
    assert peek_events[-1]["permission_denials"] == []
    assert list(offline.iterdir()) == [], "the CLI left files in $TMPDIR"
    # What answered is pinned, not what was asked for (the init event echoes the latter).
    assert init["model"] == "claude-sonnet-4-6"
    assert scored.model == "claude-sonnet-4-6-20260101"
    pinned = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    assert pinned["answererModel"] == "claude-sonnet-4-6-20260101"
    assert pinned["answererModelConfigured"] == "claude-sonnet-4-6"


def test_a_refused_key_fails_at_the_first_retry(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = ScriptSpec(down=FaultSpec(status=401, message="invalid x-api-key"))
    with FakeAnthropic(spec) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
        answerer = ClaudeCodeAnswerer(
            model="claude-sonnet-4-6", executable=str(CLI), max_turns=4, timeout_s=240
        )
        with pytest.raises(HarnessError, match="could not authenticate") as raised:
            run_answer(answerer)
        calls = len(fake.calls())
    # The CLI would retry for about three minutes, past the 240 s limit ("did not finish"), with
    # a request per retry; the first api_retry event ends it.
    assert calls <= 2, calls
    assert SECRET not in str(raised.value)
    assert list(offline.iterdir()) == []
