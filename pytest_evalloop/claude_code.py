"""The ``claude-code`` answerer: the Claude Code CLI run headless against the target's MCP tools.

One fresh ``claude -p`` process per attempt, in a neutrally named scratch directory outside the
repository (its own ``TMPDIR`` inside it), with a generated MCP config naming only the target
(``--strict-mcp-config``), no built-in tools (``--tools ""``), an allow-list of exactly the
target's tools and a deny-list of every built-in tool by name as well. The CLI's ``stream-json`` output is
the host-side log: every ``tool_use`` in it becomes a :class:`~pytest_evalloop.roles.ToolUse`
row (MCP or not), so a denied ``Read`` of ``evals/`` still reaches the contamination check.
See ``docs/claude-code.md``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop.answerer import (
    SYSTEM_PROMPT,
    extract_declared_final,
    extract_reported_calls,
    log_row,
)
from pytest_evalloop.bridge import truncate_text
from pytest_evalloop.claude_env import child_env, stderr_tail
from pytest_evalloop.pricing import PriceTable, price_table
from pytest_evalloop.roles import (
    AnswerRecord,
    HarnessError,
    TargetSession,
    ToolOutcome,
    ToolUse,
    Usage,
)

if TYPE_CHECKING:
    from pytest_evalloop.options import Settings

__all__ = [
    "DENIED_BUILTIN_TOOLS",
    "SERVER_NAME",
    "ClaudeCodeAnswerer",
    "Invocation",
    "ParsedStream",
    "claude_version",
    "parse_stream",
]

SERVER_NAME = "data"
"""The MCP server's name in the generated config; tools read ``mcp__data__<tool>``. Neutral on
purpose: the answerer must get no hint that it is being evaluated."""

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

TRANSCRIPT_RESULT_CHARS = 4_000
"""Each tool result is kept in the transcript up to this many characters."""
STDERR_TAIL_LINES = 20
KILL_GRACE_S = 2.0
_LINE_LIMIT = 32 * 1024 * 1024  # one stream-json line can carry a large tool result
# "...Output has been saved to /abs/tool-results/x.txt." ends a sentence: the final "." is not
# part of the path (file names the CLI picks end in an extension, never in a dot).
_SPILLED = re.compile(r"(?:Full output saved to|Output has been saved to):?\s*(\S+?)\.?(?=\s|$)")
_SPILL_NOTE_CHARS = 4_000
"""A tool result longer than this is a real result, not the CLI's note about a spilled one."""
_AUTH_FAILED = "authentication_failed"
"""``system``/``api_retry`` ``error`` of a rejected credential: no retry can fix it."""
_STOPS = {"success": "end_turn", "error_max_turns": "max_turns", "error_max_budget_usd": "budget"}


@dataclass
class Invocation:
    """One planned CLI run: the argv, the scratch directories, the environment."""

    argv: list[str]
    root: Path
    """The scratch directory holding everything below; removed after the attempt."""
    cwd: Path
    mcp_config: Path
    env: dict[str, str]
    allowed: list[str]


def cli_version(executable: str, timeout_s: float = 30.0) -> str:
    """The CLI's own `--version` line; a failure is recorded as such, never as a version."""
    import subprocess

    try:
        done = subprocess.run(
            [executable, "--version"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({executable} --version failed: {type(exc).__name__})"
    line = (done.stdout or "").strip().splitlines()
    if done.returncode != 0 or not line:
        return f"unknown ({executable} --version exited {done.returncode})"
    return line[0].strip()


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
            events, code, stderr = await self._run(invocation)
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
        if root.is_relative_to(repo):
            shutil.rmtree(root, ignore_errors=True)
            raise HarnessError(
                f"the claude-code answerer's scratch directory {root} would sit inside the "
                f"working directory {repo}, where the CLI could find the eval set; point TMPDIR "
                "outside the repository"
            )
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
        return Invocation(argv, root, cwd, config, env, allowed)

    async def _run(self, invocation: Invocation) -> tuple[list[dict[str, Any]], int, list[str]]:
        """Run the CLI to completion or the deadline; its events, exit code and stderr tail."""
        try:
            process = await asyncio.create_subprocess_exec(
                *invocation.argv,
                cwd=invocation.cwd,
                env=invocation.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group: a timeout kills the MCP child too
                limit=_LINE_LIMIT,
            )
        except OSError as exc:
            raise HarnessError(
                f"could not start the claude CLI {invocation.argv[0]!r} ({exc.strerror or exc}); "
                "check that it is installed and executable"
            ) from exc
        events: list[dict[str, Any]] = []
        stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        assert process.stdout is not None and process.stderr is not None
        errors = asyncio.create_task(_read_lines(process.stderr, stderr))
        try:
            async with asyncio.timeout(self.timeout_s):
                refused = await _read_events(process.stdout, events)
                if refused is not None:
                    await _kill_group(process)
                    raise HarnessError(
                        f"the claude CLI could not authenticate: the API answered "
                        f"{refused.get('error_status') or 'an error'} ({_AUTH_FAILED}) and the "
                        f"attempt was stopped at the first of its retries; "
                        f"{stderr_tail(stderr, invocation.env)}check ANTHROPIC_API_KEY (or the "
                        "CLI's login) and ANTHROPIC_BASE_URL"
                    )
                code = await process.wait()
            # Something the CLI started may still hold stderr open after it exited: give it a
            # moment, then stop the stragglers rather than wait for the deadline.
            await asyncio.wait({errors}, timeout=KILL_GRACE_S)
            if not errors.done():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
        except TimeoutError:
            await _kill_group(process)
            raise HarnessError(
                f"the claude CLI did not finish within {self.timeout_s:g} s "
                f"(--eval-attempt-timeout) after {len(events)} stream-json events and was "
                f"killed; {stderr_tail(stderr, invocation.env)}raise the timeout or lower "
                "--eval-max-turns"
            ) from None
        except BaseException:
            await _kill_group(process)
            raise
        finally:
            # Once the group is dead the pipe closes; reading it to the end lets asyncio close
            # the transport before the loop ends (else: "unclosed transport" at shutdown).
            await asyncio.wait({errors}, timeout=KILL_GRACE_S)
            errors.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await errors
        return events, code, list(stderr)

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
        _check_servers(events, tail)
        _check_tools(events, invocation.allowed, tail)
        subtype = str(result.get("subtype") or "")
        if result.get("is_error") and subtype not in ("error_max_turns", "error_max_budget_usd"):
            said = str(result.get("result") or "")[:300]
            raise HarnessError(
                f"the claude CLI reported an error (subtype {subtype or 'unknown'!r}, exit code "
                f"{code}): {said!r}; {tail}check its login or API key and the model id"
            )
        spill_dirs = [invocation.root, Path(invocation.env["HOME"]) / ".claude"]
        parsed = parse_stream(events, session, cwd=invocation.cwd, spill_dirs=spill_dirs)
        model = _init_model(events) or self.model
        usage = _usage(result, parsed.api_calls)
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
            num_turns=_int(result.get("num_turns")) or parsed.api_calls,
            stop=_STOPS.get(subtype, subtype or "unknown"),
            transcript=[_trim(e) for e in events],
        )


@dataclass
class ParsedStream:
    """What a stream-json transcript says the answerer did."""

    log: list[ToolUse] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    """Assistant text blocks, in order."""
    api_calls: int = 0

    def answer_text(self, result: Mapping[str, Any]) -> str | None:
        """The final reply: the result event's text, else the last assistant text."""
        text = result.get("result")
        if isinstance(text, str) and text.strip():
            return text
        return self.texts[-1] if self.texts else None


def parse_stream(
    events: list[dict[str, Any]],
    session: TargetSession,
    *,
    cwd: Path | None = None,
    spill_dirs: Iterable[Path] | None = None,
) -> ParsedStream:
    """The tool log of a stream-json transcript: one row per ``tool_use`` block, in order,
    completed by the ``tool_result`` with the same id (ok/error, context results).

    ``mcp__<server>__<tool>`` names are MCP calls of the bare tool (roles only for our own
    server); anything else is a host tool, logged with its input as given. A result the CLI
    spilled to a file is read back when the file lies under one of ``spill_dirs`` (anywhere
    when None).
    """
    dirs = None if spill_dirs is None else [Path(d).resolve() for d in spill_dirs]
    parsed = ParsedStream()
    uses: dict[str, tuple[int, str, dict[str, Any]]] = {}
    message_ids: set[str] = set()
    for event in events:
        message = event.get("message")
        if not isinstance(message, dict):
            continue
        blocks = message.get("content")
        blocks = blocks if isinstance(blocks, list) else []
        if event.get("type") == "assistant":
            message_ids.add(str(message.get("id") or len(message_ids)))
            for block in blocks:
                _assistant_block(block, parsed, uses, session)
        elif event.get("type") == "user":
            for block in blocks:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    _complete(block, parsed, uses, session, cwd, dirs)
    parsed.api_calls = len(message_ids)
    return parsed


def _assistant_block(
    block: Any,
    parsed: ParsedStream,
    uses: dict[str, tuple[int, str, dict[str, Any]]],
    session: TargetSession,
) -> None:
    if not isinstance(block, dict):
        return
    if block.get("type") == "text" and block.get("text"):
        parsed.texts.append(str(block["text"]))
    if block.get("type") != "tool_use":
        return
    name = str(block.get("name") or "")
    arguments = block.get("input")
    arguments = dict(arguments) if isinstance(arguments, dict) else {}
    bare = _our_tool(name)
    if bare is not None:
        row = ToolUse(tool=bare, input=arguments, is_mcp=True, role=session.role_of(bare))
        if row.role == "query":
            row.query = session.query_of(bare, arguments)
    else:
        row = ToolUse(tool=name, input=arguments, is_mcp=name.startswith("mcp__"))
    uses[str(block.get("id"))] = (len(parsed.log), bare or name, arguments)
    parsed.log.append(row)


def _complete(
    block: dict[str, Any],
    parsed: ParsedStream,
    uses: dict[str, tuple[int, str, dict[str, Any]]],
    session: TargetSession,
    cwd: Path | None,
    spill_dirs: list[Path] | None,
) -> None:
    """Fill a logged tool use from its ``tool_result``."""
    found = uses.get(str(block.get("tool_use_id")))
    if found is None:
        return
    index, tool, arguments = found
    row = parsed.log[index]
    outcome = _outcome(block, cwd, spill_dirs)
    if row.is_mcp and row.tool == tool and session.role_of(tool) is not None:
        parsed.log[index] = log_row(session, tool, arguments, outcome)
        return
    row.ok = not outcome.is_error
    row.error = outcome.error


def _our_tool(name: str) -> str | None:
    prefix = f"mcp__{SERVER_NAME}__"
    return name[len(prefix) :] if name.startswith(prefix) and len(name) > len(prefix) else None


def _outcome(
    block: Mapping[str, Any], cwd: Path | None, spill_dirs: list[Path] | None = None
) -> ToolOutcome:
    """A ``tool_result`` block as a ToolOutcome; JSON text becomes the payload."""
    content = block.get("content")
    texts: list[str] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif part.get("type") == "resource" and isinstance(part.get("resource"), dict):
                texts.append(str(part["resource"].get("text", "")))
    texts = [_unspill(t, cwd, spill_dirs) for t in texts]
    text = "\n".join(texts)
    payload = next((p for p in map(_json_value, texts) if p is not None), None)
    is_error = bool(block.get("is_error"))
    error = None
    if is_error:
        said = payload.get("error") if isinstance(payload, dict) else None
        error = (str(said) if said else text)[:2_000]
    return ToolOutcome(text=text, payload=payload, is_error=is_error, error=error)


def _json_value(text: str) -> Any:
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _unspill(text: str, cwd: Path | None, spill_dirs: list[Path] | None = None) -> str:
    """The CLI saves a large tool result to a file and says where; read it back while the
    scratch directory still exists (a file that is gone, or lies outside ``spill_dirs``,
    leaves the note as it was)."""
    match = _SPILLED.search(text)
    if match is None or len(text) > _SPILL_NOTE_CHARS:
        return text
    path = Path(match.group(1))
    if not path.is_absolute() and cwd is not None:
        path = cwd / path
    try:
        path = path.resolve()
        if spill_dirs is not None and not any(path.is_relative_to(d) for d in spill_dirs):
            return text  # a note naming a file elsewhere is not the CLI's spill
        return path.read_text(encoding="utf-8")
    except OSError:
        return text


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


async def _read_events(
    stream: asyncio.StreamReader, events: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """Collect each stdout line that is a JSON object (the CLI prints nothing else there).

    Stops at the first ``system``/``api_retry`` event saying the credential was refused and
    returns it: the CLI would retry for minutes a request no retry can fix."""
    async for raw in stream:
        event = stream_event(raw.decode("utf-8", "replace"))
        if event is None:
            continue
        events.append(event)
        if _auth_failure(event):
            return event
    return None


def _auth_failure(event: Mapping[str, Any]) -> bool:
    return (
        event.get("type") == "system"
        and event.get("subtype") == "api_retry"
        and event.get("error") == _AUTH_FAILED
    )


def claude_version(executable: str = "claude", timeout_s: float = 30.0) -> str | None:
    """The version number in ``executable --version`` (``"2.1.332 (Claude Code)"`` gives
    ``"2.1.332"``); None when it cannot run or prints no version."""
    match = re.match(r"v?(\d+(?:\.\d+)+\S*)", cli_version(executable, timeout_s))
    return match.group(1) if match else None


def stream_event(line: str) -> dict[str, Any] | None:
    """One line of the CLI's stream-json output as an event, or None when it is not one."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


async def _read_lines(stream: asyncio.StreamReader, tail: collections.deque[str]) -> None:
    async for raw in stream:
        line = raw.decode("utf-8", "replace").rstrip()
        if line:
            tail.append(line)


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    """Stop the CLI and everything it started (the MCP server): TERM, then KILL."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), KILL_GRACE_S)
    # The CLI may be gone while a server it started is still shutting down (or ignoring TERM).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    if process.returncode is None:
        await process.wait()


def _check_servers(events: list[dict[str, Any]], tail: str) -> None:
    """A target the CLI could not connect to is the harness's failure, not a wrong answer."""
    init = next(
        (e for e in events if e.get("type") == "system" and e.get("subtype") == "init"), None
    )
    servers = init.get("mcp_servers") if init else None
    for server in servers if isinstance(servers, list) else []:
        if isinstance(server, dict) and server.get("name") == SERVER_NAME:
            status = server.get("status")
            if status != "connected":
                raise HarnessError(
                    f"the claude CLI could not connect to the target's MCP server (status "
                    f"{status!r}); {tail}check the server command or URL it was given"
                )


def _check_tools(events: list[dict[str, Any]], allowed: list[str], tail: str) -> None:
    """The session must offer the target's tools and nothing else: a built-in tool in it (a
    CLI that ignored ``--tools ""``) would let the answerer reach the host."""
    init = next(
        (e for e in events if e.get("type") == "system" and e.get("subtype") == "init"), None
    )
    tools = init.get("tools") if init else None
    if not isinstance(tools, list):
        return
    extra = sorted(str(t) for t in tools if str(t) not in allowed)
    if extra:
        raise HarnessError(
            f"the claude CLI's session offered tools beyond the target's: {extra}; {tail}"
            'use a CLI that supports --tools "" (2.1.332 or later)'
        )


def _init_model(events: list[dict[str, Any]]) -> str | None:
    for event in events:
        if event.get("type") == "system" and event.get("subtype") == "init":
            model = event.get("model")
            return str(model) if model else None
    return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _usage(result: Mapping[str, Any], api_calls: int) -> Usage:
    raw = result.get("usage")
    raw = raw if isinstance(raw, dict) else {}
    return Usage(
        input_tokens=_int(raw.get("input_tokens")),
        output_tokens=_int(raw.get("output_tokens")),
        cache_read_tokens=_int(raw.get("cache_read_input_tokens")),
        cache_creation_tokens=_int(raw.get("cache_creation_input_tokens")),
        calls=api_calls or _int(result.get("num_turns")),
    )


def _trim(event: dict[str, Any]) -> dict[str, Any]:
    """An event with each tool result cut to a few KB; tool inputs are kept whole."""
    message = event.get("message")
    if event.get("type") != "user" or not isinstance(message, dict):
        return event
    content = message.get("content")
    if not isinstance(content, list):
        return event
    blocks = [_trim_result(b) if isinstance(b, dict) else b for b in content]
    return {**event, "message": {**message, "content": blocks}}


def _trim_result(block: dict[str, Any]) -> dict[str, Any]:
    content = block.get("content")
    if isinstance(content, str):
        return {**block, "content": truncate_text(content, TRANSCRIPT_RESULT_CHARS)}
    if isinstance(content, list):
        parts = [
            {**p, "text": truncate_text(str(p["text"]), TRANSCRIPT_RESULT_CHARS)}
            if isinstance(p, dict) and "text" in p
            else p
            for p in content
        ]
        return {**block, "content": parts}
    return block
