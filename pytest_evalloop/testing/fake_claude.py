"""A stand-in ``claude`` executable: the Claude Code CLI's headless mode, scripted.

    python -m pytest_evalloop.testing.fake_claude -p QUESTION --output-format stream-json \
        --verbose --mcp-config FILE --strict-mcp-config --allowedTools ... --disallowedTools ...

It parses the flags the ``claude-code`` answerer passes, reads a policy (JSON, path in
``$EVALLOOP_FAKE_CLAUDE_POLICY``) and prints the stream-json Claude Code 2.1.332 prints (shapes
taken from live runs of it against the loopback fake): a ``system``/``init`` event,
``assistant`` events with ``text`` and ``tool_use`` blocks, ``user`` events with
``tool_result`` blocks and a ``tool_use_result``, ``system``/``api_retry`` events, and a final
``result`` event with usage, cost, turns and duration. MCP steps really call the server named in
``--mcp-config`` (stdio or HTTP, through ``mcp.Client``), so their results are real; a result
over ``$MAX_MCP_OUTPUT_TOKENS`` is saved under ``$HOME/.claude/projects`` and replaced by the
CLI's note saying where. A built-in tool the session lacks (``--tools``, ``--disallowedTools``)
gets "No such tool available", with nothing in ``permission_denials``; one the session has
but ``--allowedTools`` does not grant gets the permission denial, listed there. Like the real
CLI it leaves ``claude-<uid>/`` and ``cc-socks/`` in ``$TMPDIR``. Only the model's choices are
scripted.

The script itself (its steps, templating) is `fake_claude_policy`; playing it as stream-json
is `fake_claude_stream`. This module owns the command line: argv, the policy file, the shim.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from pytest_evalloop.testing.fake_claude_policy import FakeClaudePolicy
from pytest_evalloop.testing.fake_claude_stream import VERSION, ScriptedRun

__all__ = [
    "POLICY_ENV",
    "install_fake_claude",
    "main",
]

POLICY_ENV = "EVALLOOP_FAKE_CLAUDE_POLICY"
PYTHON_ENV = "EVALLOOP_FAKE_CLAUDE_PYTHON"
"""A command line to run Python with instead of this interpreter, read when the shim is
installed: the shim runs the fake with it, and so does the fake each MCP server that is this
Python run as `-m module` (a test suite's warm launcher; see tests/forkserver.py)."""
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|AUTH|CREDENTIAL", re.IGNORECASE)


def install_fake_claude(dir: Path, policy_file: Path) -> Path:
    """Write an executable ``claude`` shim into ``dir`` running this fake with ``policy_file``
    (unless ``$EVALLOOP_FAKE_CLAUDE_POLICY`` is already set); put ``dir`` on PATH to use it."""
    dir.mkdir(parents=True, exist_ok=True)
    shim = dir / "claude"
    policy = shlex.quote(str(Path(policy_file).resolve()))
    python = os.environ.get(PYTHON_ENV)
    lines = ["#!/bin/sh", f': "${{{POLICY_ENV}:={policy}}}"', f"export {POLICY_ENV}"]
    if python:
        lines += [f"{PYTHON_ENV}={shlex.quote(python)}", f"export {PYTHON_ENV}"]
    command = python or shlex.quote(sys.executable)
    lines.append(f'exec {command} -m pytest_evalloop.testing.fake_claude "$@"')
    shim.write_text("\n".join(lines) + "\n", encoding="utf-8")
    shim.chmod(0o755)
    return shim


# --- the command line -------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="claude", description="fake Claude Code CLI")
    parser.add_argument("prompt", nargs="?")
    parser.add_argument("-p", "--print", action="store_true", dest="print_mode")
    parser.add_argument("--model", default="claude-sonnet-4-6")
    parser.add_argument("--output-format", default="text")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--setting-sources", default=None)
    parser.add_argument("--strict-mcp-config", action="store_true")
    parser.add_argument("--mcp-config", nargs="+", default=[])
    parser.add_argument("--allowedTools", "--allowed-tools", nargs="+", default=[])
    parser.add_argument("--disallowedTools", "--disallowed-tools", nargs="+", default=[])
    parser.add_argument("--tools", nargs="+", default=None)
    parser.add_argument("--append-system-prompt", default=None)
    parser.add_argument("--system-prompt", default=None)
    parser.add_argument("--permission-mode", default="default")
    parser.add_argument("--no-session-persistence", action="store_true")
    parser.add_argument("--version", action="store_true")
    return parser


def _servers(paths: list[str]) -> dict[str, dict[str, Any]]:
    servers: dict[str, dict[str, Any]] = {}
    for item in paths:
        text = item if item.lstrip().startswith("{") else Path(item).read_text(encoding="utf-8")
        servers.update(json.loads(text).get("mcpServers", {}))
    return servers


def main(argv: list[str] | None = None) -> int:
    """Run like ``claude -p``; the exit code is the real CLI's (0, or 1 on an error result)."""
    # The launcher is the fake's own plumbing: not in what it records or hands a server.
    launcher = os.environ.pop(PYTHON_ENV, None)
    args = _parser().parse_args(argv)
    if args.version:
        print(f"{VERSION} (Claude Code)")
        return 0
    if not args.print_mode:
        print("fake claude: only -p (print mode) is supported", file=sys.stderr)
        return 1
    if args.output_format == "stream-json" and not args.verbose:
        print(
            "Error: When using --print, --output-format=stream-json requires --verbose",
            file=sys.stderr,
        )
        return 1
    if args.output_format != "stream-json":
        print("fake claude: only --output-format stream-json is supported", file=sys.stderr)
        return 1
    policy_path = os.environ.get(POLICY_ENV)
    if not policy_path:
        print(f"fake claude: set {POLICY_ENV} to a policy file", file=sys.stderr)
        return 1
    policy = FakeClaudePolicy.from_file(policy_path)
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    servers = _servers(args.mcp_config)
    if policy.record_file:
        _record(policy.record_file, argv if argv is not None else sys.argv[1:], servers)
    run = ScriptedRun(args, policy, prompt.strip(), servers, python=launcher)
    return asyncio.run(run.play())


def _record(path: str, argv: list[str], servers: dict[str, Any]) -> None:
    line = {
        "argv": argv,
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "home": os.environ.get("HOME"),
        # Values too, to prove what the CLI was given; never anything that looks secret.
        "env": {k: v for k, v in os.environ.items() if not _SECRET_NAME.search(k)},
        "mcp_servers": servers,
    }
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    sys.exit(main())
