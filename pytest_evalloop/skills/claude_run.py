"""One headless ``claude -p`` run in a sandbox: its command line, its allow-listed environment,
the process under a deadline, and whether the provider finished it (a run it did not finish is an
error, never a negative).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pytest_evalloop.skills.sandbox import RunError, Sandbox
from pytest_evalloop.skills.scenarios import Scenario

Mode = Literal["activation", "full"]


MAX_TURNS: dict[str, int] = {"activation": 8, "full": 30}
PERMISSION_MODE: dict[str, str] = {"activation": "default", "full": "acceptEdits"}
READ_ONLY_DENIED = ("Edit", "Write", "MultiEdit", "NotebookEdit")
# Pre-approved in full mode so that "asked the user" measures real questions, not permission
# prompts for harmless inspection.
FULL_MODE_ALLOWED = (
    "Bash(git status:*)",
    "Bash(git diff:*)",
    "Bash(git log:*)",
    "Bash(npm test:*)",
    "Bash(node --test:*)",
    "Bash(pytest:*)",
)
KILL_GRACE_S = 5.0
_ENV_KEEP = re.compile(
    r"^(PATH|LANG|LANGUAGE|TZ|TMPDIR|TERM|USER|LOGNAME|SHELL|NO_COLOR|SSL_CERT_FILE|SSL_CERT_DIR|"
    r"NODE_EXTRA_CA_CERTS|(HTTPS?|NO|ALL)_PROXY|(https?|no)_proxy|LC_\w+|ANTHROPIC_\w+|"
    r"CLAUDE_CODE_\w+|AWS_\w+|GOOGLE_\w+|CLOUD_ML_\w+|VERTEX_\w+|EVALLOOP_\w+)$"
)
_ENV_DROPPED = frozenset({"CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_PROJECT_DIR"})


@dataclass
class CliRun:
    """What the CLI printed and how it ended."""

    events: list[dict[str, Any]]
    exit_code: int | None
    stderr: str
    seconds: float
    timed_out: bool = False


def claude_argv(executable: str, prompt: str, *, mode: Mode, model: str | None = None) -> list[str]:
    """The headless command line of one run (activation: read-only, 8 turns; full: edits
    accepted, 30 turns)."""
    # A prompt starting with "-" would read as a flag; a leading space changes nothing else.
    argv = [executable, "-p", f" {prompt}" if prompt.startswith("-") else prompt]
    argv += ["--output-format", "stream-json", "--verbose", "--no-session-persistence"]
    argv += ["--max-turns", str(MAX_TURNS[mode]), "--permission-mode", PERMISSION_MODE[mode]]
    if mode == "activation":
        argv += ["--disallowedTools", *READ_ONLY_DENIED]
    else:
        argv += ["--allowedTools", *FULL_MODE_ALLOWED]
    if model:
        argv += ["--model", model]
    return argv


def prompt_for(scenario: Scenario) -> str:
    """The prompt as sent: an explicit scenario types ``/<id>`` first."""
    text = scenario.prompt.strip()
    return f"/{scenario.skill} {text}" if scenario.invocation == "explicit" else text


def cli_env(box: Sandbox, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """An allow-listed environment with the isolated HOME and ``bin/`` first on PATH."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if _ENV_KEEP.match(k) and k not in _ENV_DROPPED}
    env["PATH"] = f"{box.bin}{os.pathsep}{environ.get('PATH', os.defpath)}"
    env["HOME"] = str(box.home)
    env["PWD"] = str(box.repo)
    return env


def run_cli(argv: list[str], *, cwd: Path, env: dict[str, str], timeout_s: float) -> CliRun:
    """Run the CLI to its end or the deadline (then TERM, and KILL after a grace period)."""
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: a timeout stops what it started too
        )
    except OSError as exc:
        raise RunError(
            "provider", f"could not start {argv[0]!r} ({exc.strerror or exc}); is it installed?"
        ) from exc
    timed_out = False
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _signal_group(process.pid, signal.SIGTERM)
        try:
            out, err = process.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            out, err = process.communicate()
    events = list(_events(out.decode("utf-8", "replace")))
    return CliRun(
        events=events,
        exit_code=process.returncode,
        stderr=err.decode("utf-8", "replace")[-2_000:],
        seconds=round(time.monotonic() - started, 3),
        timed_out=timed_out,
    )


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _events(text: str) -> Iterable[dict[str, Any]]:
    from pytest_evalloop.answer.claude_stream import stream_event

    for line in text.splitlines():
        event = stream_event(line)
        if event is not None:
            yield event


def provider_error(run: CliRun, timeout_s: float, env: Mapping[str, str]) -> str | None:
    """Why a run is not scorable (timeout, crash, error result), or None when it is.

    ``error_max_turns`` is scored: the agent ran out of turns, which says something about it.
    """
    tail = _redact(run.stderr.strip()[-500:], env)
    said = f"; stderr ends: {tail}" if tail else ""
    if run.timed_out:
        return f"the CLI did not finish within {timeout_s:g} s and was killed{said}"
    result = next((e for e in reversed(run.events) if e.get("type") == "result"), None)
    if result is None:
        return f"the CLI exited with code {run.exit_code} before its result event{said}"
    subtype = str(result.get("subtype") or "")
    if subtype == "error_max_turns":
        return None
    if run.exit_code != 0 or result.get("is_error"):
        return f"the CLI ended with {subtype or 'an error'} (exit code {run.exit_code}){said}"
    return None


def _redact(text: str, env: Mapping[str, str]) -> str:
    from pytest_evalloop.model_api.redaction import environment_secrets, redact

    return redact(text, environment_secrets(env) + environment_secrets())
