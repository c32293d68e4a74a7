"""The claude-code answerer, end to end through the fake `claude` against the real embedded target.

The fake CLI is a separate process that really connects to the embedded MCP server over stdio
(from the MCP config the answerer writes) and prints stream-json; the harness side talks to the
same set through an in-process session, as the plugin would.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.answer.answerer import SYSTEM_PROMPT, choose_final_query
from pytest_evalloop.answer.claude_code import DENIED_BUILTIN_TOOLS, ClaudeCodeAnswerer
from pytest_evalloop.answer.contamination import ToolUse as LogRow
from pytest_evalloop.answer.contamination import check_contamination
from pytest_evalloop.failures import HarnessError
from pytest_evalloop.options import Settings
from pytest_evalloop.roles.contract import AnswerRecord
from pytest_evalloop.testing.fake_claude import install_fake_claude

from .conftest import EXAMPLE_SET, REPO
from .querygate import EVENT_CEILING_S

QUESTION = "How many customer accounts have never placed an order?"
GOLDEN = {"accounts_without_orders": 4712}
HOST_TOOLS_TO_DENY = {
    "Bash",
    "Read",
    "Write",
    "Edit",
    "Glob",
    "Grep",
    "WebFetch",
    "WebSearch",
    "Task",
    "NotebookEdit",
}


class EmbeddedSession:
    """The harness's session on the embedded target, plus how the CLI reaches it over stdio.

    Stands in for target.py's session until it offers `mcp_server_config()` itself.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def mcp_server_config(self) -> dict[str, Any]:
        from pytest_evalloop.targets.embedded.data import ensure_data

        return {
            "type": "stdio",
            "command": sys.executable,
            "args": [
                "-m",
                "pytest_evalloop.targets.embedded.server",
                str(EXAMPLE_SET),
                "--transport",
                "stdio",
            ],
            "env": {"EVALLOOP_CACHE_DIR": str(ensure_data().parent)},
        }


class NoConfigSession(EmbeddedSession):
    mcp_server_config = None  # type: ignore[assignment]


def run_answer(
    answerer: ClaudeCodeAnswerer, question: str = QUESTION, session_type: type = EmbeddedSession
) -> tuple[AnswerRecord, list[dict[str, Any]]]:
    """Answer through a fresh in-process session; also re-execute the chosen final query."""
    from pytest_evalloop.targets.embedded.server import build_server
    from pytest_evalloop.targets.profiles import EMBEDDED
    from pytest_evalloop.targets.target import MCPTarget

    async def main() -> tuple[AnswerRecord, list[dict[str, Any]]]:
        target = MCPTarget(build_server(EXAMPLE_SET), EMBEDDED, name="embedded:ecommerce")
        session = session_type(await target.open())
        try:
            record = await answerer.answer(question, session)
            final, _ = choose_final_query(record.declared_final, record.tool_log)
            rows = (await session.execute(final)).rows if final else []
            return record, rows
        finally:
            await target.close()

    return asyncio.run(main())


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    """Write a policy and a `claude` shim for it; returns (shim, record file)."""

    def make(policy: dict[str, Any]) -> tuple[Path, Path]:
        record = tmp_path / "record.jsonl"
        policy = {"record_file": str(record), **policy}
        policy_file = tmp_path / "policy.json"
        policy_file.write_text(json.dumps(policy), encoding="utf-8")
        return install_fake_claude(tmp_path / "bin", policy_file), record

    return make


def answerer(shim: Path, *, timeout_s: float = 30.0, max_turns: int = 8) -> ClaudeCodeAnswerer:
    return ClaudeCodeAnswerer(
        model="claude-sonnet-4-6", executable=str(shim), max_turns=max_turns, timeout_s=timeout_s
    )


def test_correct_answer_parses_tools_final_query_usage_and_cost(fake: Any) -> None:
    shim, _ = fake(
        {
            "cases_file": str(EXAMPLE_SET / "cases.jsonl"),
            "cost_usd": 0.0123,
            "by_question": {
                QUESTION: [
                    {"tool": "get_context", "input": {"query": "customer accounts orders"}},
                    [
                        {"text": "Counting accounts without orders."},
                        {"tool": "execute_query", "input": {"sql": "SELECT nonsense FROM nowhere"}},
                    ],
                    {"tool": "execute_query", "input": {"sql": "{modelQuery}"}},
                    {"text": "4,712 accounts.\n\nFinal query:\n```sql\n{modelQuery}\n```"},
                ]
            },
        }
    )
    record, rows = run_answer(answerer(shim))

    assert [(u.tool, u.role, u.is_mcp, u.ok) for u in record.tool_log] == [
        ("get_context", "context", True, True),
        ("execute_query", "query", True, False),
        ("execute_query", "query", True, True),
    ]
    context = record.tool_log[0]
    assert context.targets == "customer accounts orders"
    assert context.trace_id
    assert "source:users:users" in {r["id"] for r in context.context_results}
    assert "nowhere" in (record.tool_log[1].error or "").lower()
    assert record.declared_final is not None and "customer_facts" in record.declared_final
    assert rows == [GOLDEN]
    assert record.answer_text is not None and record.answer_text.startswith("4,712 accounts.")
    # Four assistant turns at the fake's default per-turn usage; cost as the CLI reported it.
    assert record.num_turns == 4
    assert record.usage.input_tokens == 4 * 1_200
    assert record.usage.output_tokens == 4 * 150
    assert record.usage.cache_read_tokens == 4 * 900
    assert record.usage.cache_creation_tokens == 4 * 300
    assert record.usage.calls == 4
    assert record.cost_usd == 0.0123
    assert record.stop == "end_turn"
    assert (record.reported_calls, record.reported_calls_status) == (None, "missing")
    assert [e["type"] for e in record.transcript][0] == "system"
    assert record.transcript[-1]["type"] == "result"


def test_the_model_recorded_is_the_one_the_endpoint_served(fake: Any) -> None:
    # The init event echoes --model; the assistant messages name what answered.
    shim, _ = fake(
        {
            "served_models": {"claude-sonnet-4-6": "claude-sonnet-4-6-20260101"},
            "default": [{"text": "No idea."}],
        }
    )
    record, _ = run_answer(answerer(shim))
    assert record.model == "claude-sonnet-4-6-20260101"
    assert record.transcript[0]["model"] == "claude-sonnet-4-6"


def test_the_clis_own_synthetic_messages_name_no_served_model() -> None:
    from pytest_evalloop.answer.claude_stream import SYNTHETIC_MODEL, parse_stream

    def assistant(model: str, n: int) -> dict[str, Any]:
        message = {"id": f"m{n}", "model": model, "content": [{"type": "text", "text": "x"}]}
        return {"type": "assistant", "message": message}

    served = parse_stream([assistant("ans-2026-01", 1), assistant(SYNTHETIC_MODEL, 2)], None)  # type: ignore[arg-type]
    assert served.served_model == "ans-2026-01"
    assert parse_stream([assistant(SYNTHETIC_MODEL, 1)], None).served_model is None  # type: ignore[arg-type]


def test_contamination_attempt_is_logged_and_flagged(fake: Any) -> None:
    shim, _ = fake(
        {
            "default": [
                {"builtin": "Read", "input": {"file_path": "evals/ecommerce/cases.jsonl"}},
                {"tool": "get_context", "input": {"query": "{question}"}},
                {"text": "I could not find it."},
            ]
        }
    )
    record, _ = run_answer(answerer(shim))

    read = record.tool_log[0]
    assert (read.tool, read.is_mcp, read.input) == (
        "Read",
        False,
        {"file_path": "evals/ecommerce/cases.jsonl"},
    )
    # As the real CLI answers with no built-in tools in the session: no such tool, and no
    # permission question (so nothing in the result's permission_denials).
    assert read.ok is False and "No such tool available: Read" in (read.error or "")
    result = record.transcript[-1]
    assert result["type"] == "result" and result["permission_denials"] == []
    log = [LogRow(tool=u.tool, input=u.input, is_mcp=u.is_mcp) for u in record.tool_log]
    found = check_contamination(
        log, reported_calls=None, protected_paths=[EXAMPLE_SET], model_paths=[]
    )
    assert found.contaminated is True
    assert any(r.startswith("Read touched protected path") for r in found.reasons)
    clean = check_contamination(
        log[1:], reported_calls=None, protected_paths=[EXAMPLE_SET], model_paths=[]
    )
    assert clean.contaminated is False


def test_the_calls_report_is_read_and_an_inflated_one_is_contamination(fake: Any) -> None:
    final = "4,712 accounts.\n\nFinal query:\n```sql\n{modelQuery}\n```\n\nTool calls: "
    calls = [
        {"tool": "get_context", "input": {"query": "customer accounts orders"}},
        {"tool": "execute_query", "input": {"sql": "{modelQuery}"}},
    ]
    records = {}
    for claimed in ("2", "7"):
        shim, _ = fake(
            {
                "cases_file": str(EXAMPLE_SET / "cases.jsonl"),
                "by_question": {QUESTION: [*calls, {"text": final + claimed}]},
            }
        )
        records[claimed], _ = run_answer(answerer(shim))
    honest, inflated = records["2"], records["7"]

    assert (honest.reported_calls, honest.reported_calls_status) == (2, "reported")
    assert (inflated.reported_calls, inflated.reported_calls_status) == (7, "reported")
    assert inflated.declared_final is not None and "customer_facts" in inflated.declared_final

    def check(record: AnswerRecord) -> list[str]:
        log = [LogRow(tool=u.tool, input=u.input, is_mcp=u.is_mcp) for u in record.tool_log]
        return check_contamination(
            log,
            reported_calls=record.reported_calls,
            protected_paths=[EXAMPLE_SET],
            model_paths=[],
        ).reasons

    assert check(honest) == []
    assert check(inflated) == ["claimed 7 MCP calls; the host logged 2"]


def test_every_spelling_of_the_eval_layout_is_caught_through_the_cli(fake: Any) -> None:
    """Issue 13 point 10, as the CLI logs them: denied, still in the host log, still caught."""
    attempts = [
        {"builtin": "Bash", "input": {"command": "ls evals/"}},
        {"builtin": "Glob", "input": {"pattern": "evals/**"}},
        {"builtin": "Glob", "input": {"pattern": "**/*.jsonl"}},
        {"builtin": "Bash", "input": {"command": "find . -name cases.jsonl"}},
        {"builtin": "Grep", "input": {"pattern": "4712", "path": "evals"}},
        {"builtin": "Read", "input": {"file_path": str(EXAMPLE_SET / "gold" / "x.json")}},
        {"builtin": "Bash", "input": {"command": "cat ../../evals/ecommerce/cases.jsonl"}},
        {"builtin": "Bash", "input": {"command": "type ..\\evals\\ecommerce\\set.json"}},
    ]
    shim, _ = fake(
        {
            "default": [
                *attempts,
                {"tool": "get_context", "input": {"query": "evals of accounts without orders"}},
                {"text": "I could not find it."},
            ]
        }
    )
    record, _ = run_answer(answerer(shim, max_turns=len(attempts) + 2))

    assert [u.tool for u in record.tool_log][: len(attempts)] == [a["builtin"] for a in attempts]
    assert all(not u.ok for u in record.tool_log[: len(attempts)])  # all denied by the CLI
    reasons = []
    for use in record.tool_log:
        row = LogRow(tool=use.tool, input=use.input, is_mcp=use.is_mcp)
        found = check_contamination(
            [row], reported_calls=None, protected_paths=[EXAMPLE_SET], model_paths=[]
        )
        reasons.append(found.reasons)
    set_path = f"protected path {EXAMPLE_SET}"
    assert reasons == [
        ["Bash touched protected path evals/"],
        ["Glob touched protected path evals/"],
        ["Glob searched for the answer key's files: '**/*.jsonl' matches cases.jsonl"],
        [f"Bash touched {set_path}"],
        ["Grep touched protected path evals"],
        [f"Read touched {set_path}"],
        [f"Bash touched {set_path}"],
        [f"Bash touched {set_path}"],
        [],  # an MCP query that says "evals" is a question's words, not a path
    ]


def test_command_line_is_fenced_and_runs_outside_the_repo(
    fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An environment full of pointers to the repository, as a developer's shell would have.
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PATH", f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("VIRTUAL_ENV", str(REPO / ".venv"))
    monkeypatch.setenv("CLAUDE_PROJECT_DIR", str(REPO))
    monkeypatch.setenv("ANTHROPIC_CUSTOM_HEADERS", f"x-origin: {REPO}")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-not-a-real-key")
    shim, record_file = fake({"default": [{"text": "Nothing to query."}]})
    run_answer(answerer(shim, max_turns=7))

    seen = json.loads(record_file.read_text(encoding="utf-8").splitlines()[0])
    argv: list[str] = seen["argv"]
    assert argv[:2] == ["-p", QUESTION]
    assert "--strict-mcp-config" in argv
    config_path = Path(argv[argv.index("--mcp-config") + 1])
    assert list(seen["mcp_servers"]) == ["data"]
    assert argv[argv.index("--tools") + 1] == ""  # no built-in tool, whatever its name
    allowed = argv[argv.index("--allowedTools") + 1 : argv.index("--disallowedTools")]
    assert sorted(allowed) == ["mcp__data__execute_query", "mcp__data__get_context"]
    denied = argv[argv.index("--disallowedTools") + 1 : argv.index("--append-system-prompt")]
    assert HOST_TOOLS_TO_DENY <= set(denied) and set(denied) == set(DENIED_BUILTIN_TOOLS)
    assert argv[argv.index("--append-system-prompt") + 1] == SYSTEM_PROMPT
    assert argv[argv.index("--max-turns") + 1] == "7"
    assert argv[argv.index("--model") + 1] == "claude-sonnet-4-6"
    assert argv[argv.index("--output-format") + 1] == "stream-json" and "--verbose" in argv
    cwd = Path(seen["cwd"])
    assert not cwd.is_relative_to(REPO) and not config_path.is_relative_to(REPO)
    assert not config_path.is_relative_to(cwd)  # the agent's directory holds nothing
    # An API key authenticates the CLI, so HOME is a scratch one: no user settings or skills.
    assert Path(seen["home"]) == cwd.parent / "home"
    assert "VIRTUAL_ENV" not in seen["env"] and "CLAUDE_PROJECT_DIR" not in seen["env"]
    leaks = {k for k, v in seen["env"].items() if str(REPO) in v}
    assert not leaks, f"environment variables naming the repository: {leaks}"
    assert not cwd.exists() and not config_path.exists(), "the scratch directory was not removed"


def test_crash_is_a_harness_error_with_exit_code_and_stderr(fake: Any) -> None:
    shim, _ = fake({"default": [{"tool": "get_context", "input": {"query": "x"}}, {"crash": 2}]})
    with pytest.raises(HarnessError) as raised:
        run_answer(answerer(shim))
    message = str(raised.value)
    assert "exited with code 2" in message
    assert "crashed (scripted)" in message


@pytest.mark.cold_start  # the CLI's process group is killed: the real processes
def test_timeout_kills_the_cli_within_the_limit(fake: Any) -> None:
    # The stand-in sleeps for an hour: only the 1.5 s limit can end this answer, however fast
    # or slow the machine (a broken limit fails at the suite's per-test timeout).
    shim, record_file = fake({"default": [{"text": "thinking"}, {"sleep": 3600}, {"text": "late"}]})
    with pytest.raises(HarnessError, match=r"did not finish within 1\.5 s"):
        run_answer(answerer(shim, timeout_s=1.5))
    seen = json.loads(record_file.read_text(encoding="utf-8"))
    with pytest.raises(ProcessLookupError):
        os.kill(seen["pid"], 0)
    assert not Path(seen["cwd"]).exists()
    # The MCP server the CLI started ran in the scratch directory: it must be gone too.
    # SIGKILL was sent; the wait is for the kernel to finish the exit, its ceiling only how
    # long before calling the test failed.
    deadline = time.monotonic() + EVENT_CEILING_S
    while _processes_in(seen["cwd"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_in(seen["cwd"]) == []


def _processes_in(directory: str) -> list[int]:
    """Pids of live (not zombie) processes whose working directory is `directory` (/proc)."""
    assert Path("/proc/self/cwd").exists(), "this check reads /proc"
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or not os.readlink(entry / "cwd").startswith(directory):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


def test_unparseable_output_is_a_harness_error(fake: Any) -> None:
    shim, _ = fake({"default": [{"raw": "this is not stream-json"}, {"crash": 0}]})
    with pytest.raises(HarnessError, match="printed no result event"):
        run_answer(answerer(shim))


def test_max_turns_is_an_answer_not_an_error(fake: Any) -> None:
    step = {"tool": "get_context", "input": {"query": "orders"}}
    shim, _ = fake({"default": [step, step, step, {"text": "done"}]})
    record, rows = run_answer(answerer(shim, max_turns=2))
    assert record.stop == "max_turns"
    assert len(record.tool_log) == 2 and rows == []


def test_unreachable_target_server_is_a_harness_error(fake: Any) -> None:
    class DeadServer(EmbeddedSession):
        def mcp_server_config(self) -> dict[str, Any]:
            return {
                "type": "stdio",
                "command": sys.executable,
                "args": ["-c", "raise SystemExit(3)"],
            }

    shim, _ = fake({"default": [{"text": "hello"}]})
    with pytest.raises(HarnessError, match="could not connect to the target's MCP server"):
        run_answer(answerer(shim), session_type=DeadServer)


def test_session_without_server_config_is_a_harness_error(fake: Any) -> None:
    shim, record_file = fake({"default": [{"text": "hello"}]})
    with pytest.raises(HarnessError, match="mcp_server_config"):
        run_answer(answerer(shim), session_type=NoConfigSession)
    assert not record_file.exists(), "the CLI must not start without a way to the target"


def _settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = dict(
        split="all",
        samples=1,
        answerer="claude-code",
        answerer_model="claude-haiku-4-5",
        judge_model="claude-opus-4-6",
        max_turns=5,
        attempt_timeout=42.0,
        max_tokens=1000,
        phase="baseline",
        label=None,
        runs_dir=None,
        target=None,
        tool_profile=None,
        concurrency=1,
        rpm=0,
        tpm=0,
        retries=0,
        verify_goldens=False,
        prices=None,
    )
    return Settings(**{**values, **overrides})


def test_missing_executable_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.UsageError, match=r"--eval-answerer=claude-code.*npm install"):
        ClaudeCodeAnswerer.from_settings(_settings())


def test_from_settings_finds_claude_on_path(
    fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shim, _ = fake({})
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    built = ClaudeCodeAnswerer.from_settings(_settings())
    assert Path(built.executable) == shim
    assert (built.model, built.max_turns, built.timeout_s) == ("claude-haiku-4-5", 5, 42.0)


# --- what live runs of the real CLI showed (issue 16, section 2) --------------------------------


def _init(record: AnswerRecord) -> dict[str, Any]:
    return next(e for e in record.transcript if e.get("subtype") == "init")


def test_a_spilled_context_result_is_read_back(fake: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Defect 1: "...Output has been saved to /.../tool-results/x.txt." -- the sentence's final
    # "." is not part of the path.
    monkeypatch.setenv("MAX_MCP_OUTPUT_TOKENS", "300")
    shim, _ = fake({"default": [{"tool": "get_context", "input": {"query": "orders"}}]})
    record, _ = run_answer(answerer(shim))
    [context] = record.tool_log
    note = record.transcript[2]["message"]["content"][0]["content"]
    assert isinstance(note, str) and re.search(r"Output has been saved to \S+\.txt\.\n", note)
    assert context.ok and context.trace_id
    assert "measure:orders:order_count" in {r["id"] for r in context.context_results}


@pytest.mark.cold_start  # the CLI's process group is killed: the real processes
def test_a_refused_credential_fails_the_attempt_at_the_first_retry(fake: Any) -> None:
    # Defect 2: the CLI retries a 401 ten times (minutes); the first retry event settles it.
    # The stand-in's second try would come an hour after the first, past the 240 s limit: only
    # the first retry event can end the attempt with "could not authenticate".
    shim, record_file = fake({"default": [{"api_error": 401, "retry_delay": 3600}]})
    with pytest.raises(HarnessError) as raised:
        run_answer(answerer(shim, timeout_s=240))
    assert "could not authenticate" in str(raised.value) and "401" in str(raised.value)
    seen = json.loads(record_file.read_text(encoding="utf-8"))
    with pytest.raises(ProcessLookupError):
        os.kill(seen["pid"], 0)


def test_the_cli_working_directory_names_no_harness(
    fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Defect 3: the CLI tells the model "Primary working directory: <cwd>".
    base = tmp_path / "host-tmp"
    base.mkdir()
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.setattr(tempfile, "tempdir", str(base))  # tempfile caches $TMPDIR
    shim, record_file = fake({"default": [{"text": "Nothing to query."}]})
    record, _ = run_answer(answerer(shim))
    cwd = Path(json.loads(record_file.read_text(encoding="utf-8"))["cwd"])
    ours = cwd.relative_to(base.resolve())  # the part the answerer names
    assert "eval" not in str(ours).lower() and "claude" not in str(ours).lower()
    assert _init(record)["cwd"] == str(cwd)


def test_the_cli_leaves_nothing_in_tmpdir(
    fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Defect 4: the CLI leaves claude-<uid>/ and cc-socks/ in its TMPDIR on every run.
    base = tmp_path / "host-tmp"
    base.mkdir()
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.setattr(tempfile, "tempdir", str(base))  # tempfile caches $TMPDIR
    shim, record_file = fake({"default": [{"tool": "get_context", "input": {"query": "x"}}]})
    run_answer(answerer(shim))
    seen = json.loads(record_file.read_text(encoding="utf-8"))
    child_tmp = Path(seen["env"]["TMPDIR"])
    assert child_tmp.parent == Path(seen["cwd"]).parent  # inside the scratch root
    assert list(base.iterdir()) == [], "the attempt left files in $TMPDIR"


def test_the_session_offers_exactly_the_targets_tools(fake: Any) -> None:
    # Defect 5: `--tools ""` removes every built-in tool, named in the deny-list or not.
    shim, _ = fake({"new_builtins": ["Scratchpad"], "default": [{"text": "Nothing to query."}]})
    record, _ = run_answer(answerer(shim))
    assert _init(record)["tools"] == ["mcp__data__execute_query", "mcp__data__get_context"]


def test_a_cli_that_keeps_built_in_tools_is_a_harness_error(fake: Any) -> None:
    policy = {"ignore_tools_flag": True, "new_builtins": ["Scratchpad"]}
    shim, _ = fake({**policy, "default": [{"text": "Nothing to query."}]})
    with pytest.raises(HarnessError, match=r"offered tools beyond the target's: \['Scratchpad'\]"):
        run_answer(answerer(shim))


def test_the_stand_in_speaks_the_real_clis_shapes(fake: Any) -> None:
    # Defect 6: the stand-in follows what Claude Code 2.1.332 prints.
    shim, _ = fake(
        {
            "default": [
                [
                    {"tool": "get_context", "input": {"query": "orders"}},
                    {"builtin": "Bash", "input": {"command": "cat evals/ecommerce/cases.jsonl"}},
                ],
                {"text": "Done."},
            ]
        }
    )
    record, _ = run_answer(answerer(shim))
    init = _init(record)
    assert init["claude_code_version"] == "2.1.332"
    assert init["mcp_servers"] == [{"name": "data", "status": "connected", "source": "dynamic"}]
    users = [e for e in record.transcript if e["type"] == "user"]
    mcp, bash = (e["message"]["content"][0] for e in users)
    assert "content" in users[0]["tool_use_result"]
    assert bash["is_error"] is True
    assert users[1]["tool_use_result"] == (
        "Error: No such tool available: Bash. Bash is disabled for this session, "
        "in subagents as well as here."
    )
    result = record.transcript[-1]
    assert result["subtype"] == "success" and result["is_error"] is False
    assert result["permission_denials"] == [] and result["terminal_reason"] == "completed"
    assert [(u.tool, u.ok) for u in record.tool_log] == [("get_context", True), ("Bash", False)]


def test_the_version_is_read_from_the_cli(fake: Any, tmp_path: Path) -> None:
    from pytest_evalloop.answer.claude_process import claude_version

    shim, _ = fake({})
    assert claude_version(str(shim)) == "2.1.332"
    assert claude_version(str(tmp_path / "missing")) is None


def test_a_tmpdir_inside_the_working_directory_is_one_usage_error(
    pytester: pytest.Pytester, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 point 9: it was one harness error per item, found as each attempt began."""
    from tests.test_run import QIDS, make_set

    shim, record_file = fake({"default": [{"text": "Nothing to query."}]})
    set_dir = make_set(pytester.path, QIDS[:3])
    inside = pytester.path / "scratch"
    inside.mkdir()
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("TMPDIR", str(inside))
    result = pytester.runpytest_subprocess(str(set_dir), "--eval-answerer=claude-code")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    err = result.stderr.str()
    assert err.count("--eval-answerer=claude-code: ") == 1, err
    assert f"TMPDIR={inside.resolve()}, inside the working directory" in err
    assert "point TMPDIR outside the repository" in err
    assert "HARNESS_ERROR" not in result.stdout.str() and not record_file.exists()
    # A TMPDIR elsewhere is no problem.
    from pytest_evalloop.answer.claude_env import scratch_problem

    assert scratch_problem(pytester.path.parent / "elsewhere", pytester.path) is None
    assert scratch_problem(inside, pytester.path) is not None
