"""The ``claude-code`` answerer: the Claude Code CLI run headless against the target's MCP tools.

One fresh ``claude -p`` process per attempt, in a neutrally named scratch directory outside the
repository (its own ``TMPDIR`` inside it), with a generated MCP config naming only the target
(``--strict-mcp-config``), no built-in tools (``--tools ""``), an allow-list of exactly the
target's tools and a deny-list of every built-in tool by name as well. The CLI's ``stream-json`` output is
the host-side log: every ``tool_use`` in it becomes a :class:`~pytest_evalloop.roles.contract.ToolUse`
row (MCP or not), so a denied ``Read`` of ``evals/`` still reaches the contamination check.
See ``docs/claude-code.md``.

This module plans the run and makes the answer record; ``claude_env`` says what the child is
given, ``claude_process`` runs it, ``claude_stream`` reads what it printed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop.answer.answerer import (
    SYSTEM_PROMPT,
    SYSTEM_PROMPT_SHA,
    extract_declared_final,
    extract_reported_calls,
)
from pytest_evalloop.answer.claude_env import child_env, scratch_problem, stderr_tail
from pytest_evalloop.answer.claude_process import Invocation, cli_version, run_cli
from pytest_evalloop.answer.claude_stream import (
    SERVER_NAME,
    as_int,
    check_servers,
    check_tools,
    init_model,
    parse_stream,
    trim_event,
    usage_of,
)
from pytest_evalloop.failures import HarnessError
from pytest_evalloop.model_api.pricing import PriceTable, price_table
from pytest_evalloop.roles.contract import AnswerRecord, TargetSession

if TYPE_CHECKING:
    from pytest_evalloop.options import Settings

__all__ = ["DENIED_BUILTIN_TOOLS", "ClaudeCodeAnswerer"]

DENIED_BUILTIN_TOOLS: tuple[str, ...] = (
    # Files and shell: the answerer may learn nothing from the host, only from the target.
    "Bash",
    "BashOutput",
    "KillShell",
    "Read",
    "Write",
    "Edit",
    "MultiEdit",
    "NotebookEdit",
    "NotebookRead",
    "Glob",
    "Grep",
    "LS",
    # The network and other agents.
    "WebFetch",
    "WebSearch",
    "Task",
    "Agent",
    "TaskOutput",
    "TaskStop",
    "TaskCreate",
    "TaskGet",
    "TaskList",
    "TaskUpdate",
    "SendMessage",
    "ListAgents",
    "Workflow",
    "RemoteTrigger",
    # Skills, plans and questions to a user who is not there.
    "Skill",
    "SlashCommand",
    "TodoWrite",
    "AskUserQuestion",
    "EnterPlanMode",
    "ExitPlanMode",
    "ToolSearch",
    "Monitor",
    "CronCreate",
    "CronDelete",
    "CronList",
    "ScheduleWakeup",
    "PushNotification",
    "EnterWorktree",
    "ExitWorktree",
    "DesignSync",
    "Artifact",
    "ShareOnboardingGuide",
    "ReportFindings",
    # MCP resources would bypass the tool allow-list.
    "ListMcpResourcesTool",
    "ReadMcpResourceTool",
    "ReadMcpResourceDirTool",
)

CLI_OUTPUT_VARIABLE = "CLAUDE_CODE_MAX_OUTPUT_TOKENS"
CLI_OUTPUT_TOKENS = 32_000
"""The longest reply the CLI asks for, unless `CLAUDE_CODE_MAX_OUTPUT_TOKENS` sets another: the
CLI is handed the value the spend ceiling's bound assumes, so the two cannot differ."""


def cli_output_tokens(environ: Mapping[str, str] | None = None) -> int:
    """The reply limit the CLI runs with: the user's variable when it is a number, else ours."""
    raw = (os.environ if environ is None else environ).get(CLI_OUTPUT_VARIABLE, "")
    return int(raw) if raw.strip().isdigit() and int(raw) > 0 else CLI_OUTPUT_TOKENS


_STOPS = {"success": "end_turn", "error_max_turns": "max_turns", "error_max_budget_usd": "budget"}


class ClaudeCodeAnswerer:
    """Answers with the ``claude`` CLI headless (implements :class:`~roles.Answerer`).

    The session must say how the CLI reaches the target: ``session.mcp_server_config()``
    returns the ``mcpServers`` entry (``{"type": "stdio", "command", "args", "env"}`` or
    ``{"type": "http", "url"}``).
    """

    backend = "claude-code"

    def __init__(
        self,
        *,
        model: str,
        executable: str = "claude",
        max_turns: int,
        timeout_s: float,
        prices: PriceTable | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.model = model
        self.executable = executable
        self.max_turns = max_turns
        self.timeout_s = timeout_s
        self.prices = prices if prices is not None else PriceTable()
        self._version: str | None = None

    prompt_sha = SYSTEM_PROMPT_SHA
    """The system prompt it appends, hashed: the run's `answererPromptSha` pin."""

    @property
    def version(self) -> str:
        """What `claude --version` prints (asked once): pinned as the run's answererVersion."""
        if self._version is None:
            self._version = cli_version(self.executable)
        return self._version

    @classmethod
    def from_settings(cls, settings: Settings) -> ClaudeCodeAnswerer:
        """The answerer ``--eval-answerer=claude-code`` asks for; a UsageError when the
        ``claude`` executable is not on PATH."""
        import pytest

        found = shutil.which("claude")
        if found is None:
            raise pytest.UsageError(
                "--eval-answerer=claude-code runs the Claude Code CLI, but no `claude` "
                "executable is on PATH; install it (npm install -g @anthropic-ai/claude-code) "
                "and log in or set ANTHROPIC_API_KEY, or use --eval-answerer=anthropic"
            )
        return cls(
            model=settings.answerer_model,
            executable=found,
            max_turns=settings.max_turns,
            timeout_s=settings.attempt_timeout,
            prices=price_table(settings.prices),
        )

    async def answer(self, question: str, session: TargetSession) -> AnswerRecord:
        """Answer ``question`` through one ``claude -p`` run; raise HarnessError when the CLI
        crashes, times out, cannot reach the target or prints no usable transcript."""
        server = _server_config(session)
        tools = [spec.name for spec in await session.list_tools()]
        started = time.monotonic()
        invocation = self.plan(question, server, tools)
        try:
            events, code, stderr = await run_cli(invocation, self.timeout_s)
            record = self._record(events, code, stderr, session, invocation)
        finally:
            shutil.rmtree(invocation.root, ignore_errors=True)
        record.wall_seconds = round(time.monotonic() - started, 3)
        return record

    def plan(self, question: str, server: Mapping[str, Any], tools: list[str]) -> Invocation:
        """Create the scratch directories and MCP config, and build the command line."""
        # The CLI tells the model its working directory ("Primary working directory: ..."):
        # tempfile's own neutral name, nothing saying "eval" (see docs/claude-code.md).
        root = Path(tempfile.mkdtemp()).resolve()
        repo = Path.cwd().resolve()
        problem = scratch_problem(root.parent, repo)
        if problem is not None:
            shutil.rmtree(root, ignore_errors=True)
            raise HarnessError(problem)
        cwd, home, tmp = root / "work", root / "home", root / "tmp"
        for directory in (cwd, home, tmp):
            directory.mkdir()
        config = root / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {SERVER_NAME: dict(server)}}), "utf-8")
        allowed = [f"mcp__{SERVER_NAME}__{tool}" for tool in tools]
        # A prompt starting with "-" would read as a flag; a leading space changes nothing else.
        prompt = f" {question}" if question.startswith("-") else question
        argv = [
            self.executable,
            "-p",
            prompt,
            "--model",
            self.model,
            "--output-format",
            "stream-json",
            "--verbose",
            "--max-turns",
            str(self.max_turns),
            "--setting-sources",
            "project",
            "--strict-mcp-config",
            "--mcp-config",
            str(config),
            # No built-in tool at all, whatever its name (the deny-list below names today's).
            "--tools",
            "",
            "--allowedTools",
            *allowed,
            "--disallowedTools",
            *DENIED_BUILTIN_TOOLS,
            "--append-system-prompt",
            SYSTEM_PROMPT,
        ]
        env = child_env(os.environ, home=home, cwd=cwd, tmp=tmp, hidden=repo)
        env[CLI_OUTPUT_VARIABLE] = str(cli_output_tokens(env))
        return Invocation(argv, root, cwd, config, env, allowed)

    def _record(
        self,
        events: list[dict[str, Any]],
        code: int,
        stderr: list[str],
        session: TargetSession,
        invocation: Invocation,
    ) -> AnswerRecord:
        """The AnswerRecord of a finished run, or HarnessError when the run is unusable."""
        result = next((e for e in reversed(events) if e.get("type") == "result"), None)
        tail = stderr_tail(stderr, invocation.env)
        if result is None:
            if code != 0:
                raise HarnessError(
                    f"the claude CLI exited with code {code} before its result event "
                    f"({len(events)} stream-json events); {tail}check the CLI's login and the "
                    "model id"
                )
            raise HarnessError(
                f"the claude CLI exited with code 0 but printed no result event "
                f"({len(events)} stream-json events parsed); {tail}check that it supports "
                "--output-format stream-json --verbose"
            )
        check_servers(events, tail)
        check_tools(events, invocation.allowed, tail)
        subtype = str(result.get("subtype") or "")
        if result.get("is_error") and subtype not in ("error_max_turns", "error_max_budget_usd"):
            said = str(result.get("result") or "")[:300]
            raise HarnessError(
                f"the claude CLI reported an error (subtype {subtype or 'unknown'!r}, exit code "
                f"{code}): {said!r}; {tail}check its login or API key and the model id"
            )
        spill_dirs = [invocation.root, Path(invocation.env["HOME"]) / ".claude"]
        parsed = parse_stream(events, session, cwd=invocation.cwd, spill_dirs=spill_dirs)
        model = parsed.served_model or init_model(events) or self.model
        usage = usage_of(result, parsed.api_calls)
        cost = result.get("total_cost_usd")
        reported, report_status = extract_reported_calls(parsed.answer_text(result))
        return AnswerRecord(
            answer_text=parsed.answer_text(result),
            tool_log=parsed.log,
            declared_final=extract_declared_final(parsed.answer_text(result)),
            reported_calls=reported,
            reported_calls_status=report_status,
            usage=usage,
            cost_usd=float(cost)
            if isinstance(cost, int | float)
            else self.prices.cost(model, usage),
            model=model,
            num_turns=as_int(result.get("num_turns")) or parsed.api_calls,
            stop=_STOPS.get(subtype, subtype or "unknown"),
            transcript=[trim_event(e) for e in events],
        )


def _server_config(session: TargetSession) -> dict[str, Any]:
    """The ``mcpServers`` entry through which the CLI reaches the session's target."""
    accessor = getattr(session, "mcp_server_config", None)
    if not callable(accessor):
        raise HarnessError(
            f"target {session.name!r} cannot be handed to the claude CLI: its session has no "
            "mcp_server_config() saying how to reach the server (stdio command or URL); use "
            "--eval-answerer=anthropic, or a target that provides it"
        )
    config = accessor()
    if not isinstance(config, dict) or not (config.get("command") or config.get("url")):
        raise HarnessError(
            f"target {session.name!r}: mcp_server_config() returned {config!r}; it must be an "
            'mcpServers entry with a "command" (stdio) or a "url" (http)'
        )
    hidden = getattr(getattr(session, "profile", None), "hidden_args", None)
    if hidden:
        raise HarnessError(
            f"target {session.name!r}: its tool profile hides arguments {hidden}, which the "
            "claude CLI would not fill in (it calls the server directly); use "
            "--eval-answerer=anthropic with this profile"
        )
    return dict(config)
