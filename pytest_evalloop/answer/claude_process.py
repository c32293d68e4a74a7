"""Running the ``claude`` CLI: one planned invocation as a child process under a deadline.

The child gets its own process group, so a timeout or a refused credential stops the MCP server
it started too; stdout is read as stream-json events, stderr kept as a short tail for error
messages. ``cli_version`` and ``claude_version`` ask the CLI what it is.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_evalloop.answer.claude_env import stderr_tail
from pytest_evalloop.answer.claude_stream import stream_event
from pytest_evalloop.failures import HarnessError

__all__ = ["Invocation", "claude_version", "cli_version", "run_cli"]

STDERR_TAIL_LINES = 20
KILL_GRACE_S = 2.0
_LINE_LIMIT = 32 * 1024 * 1024  # one stream-json line can carry a large tool result
_AUTH_FAILED = "authentication_failed"
"""``system``/``api_retry`` ``error`` of a rejected credential: no retry can fix it."""


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


def claude_version(executable: str = "claude", timeout_s: float = 30.0) -> str | None:
    """The version number in ``executable --version`` (``"2.1.332 (Claude Code)"`` gives
    ``"2.1.332"``); None when it cannot run or prints no version."""
    match = re.match(r"v?(\d+(?:\.\d+)+\S*)", cli_version(executable, timeout_s))
    return match.group(1) if match else None


async def run_cli(
    invocation: Invocation, timeout_s: float
) -> tuple[list[dict[str, Any]], int, list[str]]:
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
        async with asyncio.timeout(timeout_s):
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
            f"the claude CLI did not finish within {timeout_s:g} s "
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
