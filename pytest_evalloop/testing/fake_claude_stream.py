"""The fake ``claude``'s stream writer: one scripted run, printed as Claude Code's stream-json.

`ScriptedRun` connects to the MCP servers of ``--mcp-config``, plays the policy's script turn by
turn (real MCP calls, built-in tools granted or denied as the CLI's flags say, skills, spills of
large results), and prints the events Claude Code 2.1.332 prints, ending with its ``result``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop.model_api.pricing import PriceTable, Usage
from pytest_evalloop.testing.fake_claude_policy import (
    ApiErrorStep,
    BuiltinStep,
    CrashStep,
    FakeClaudePolicy,
    McpStep,
    RawStep,
    SkillStep,
    SleepStep,
    Step,
    TextStep,
)
from pytest_evalloop.testing.policies import fill, load_cases, template_values

if TYPE_CHECKING:
    from mcp import Client

VERSION = "2.1.332"
"""The real CLI's version whose shapes this fake follows."""
# What Claude Code 2.1.332 offers before --tools / --disallowedTools remove some (its init event).
BUILTIN_TOOLS = (
    "Task",
    "Bash",
    "CronCreate",
    "CronDelete",
    "CronList",
    "Edit",
    "EnterWorktree",
    "ExitWorktree",
    "Glob",
    "Grep",
    "ListAgents",
    "ListMcpResourcesTool",
    "NotebookEdit",
    "Read",
    "ReadMcpResourceDirTool",
    "ReadMcpResourceTool",
    "ReportFindings",
    "ScheduleWakeup",
    "SendMessage",
    "Skill",
    "TaskCreate",
    "TaskGet",
    "TaskList",
    "TaskStop",
    "TaskUpdate",
    "ToolSearch",
    "WebFetch",
    "WebSearch",
    "Workflow",
    "Write",
)
READ_LINE_LIMIT = 2_000
MCP_OUTPUT_TOKENS = 25_000
"""The CLI's default limit on one MCP result (``$MAX_MCP_OUTPUT_TOKENS`` overrides it)."""
CHARS_PER_TOKEN = 4
_API_ERRORS = {
    401: ("authentication_failed", "Failed to authenticate. API Error: 401"),
    403: ("permission_denied", "API Error: 403"),
    429: ("rate_limit", "API Error: Request rejected (429)"),
    500: ("server_error", "API Error: 500"),
    529: ("overloaded", "API Error: Repeated 529 Overloaded errors"),
}


def _tool_names(values: list[str]) -> set[str]:
    # The real CLI takes comma- or space-separated lists.
    return {name for value in values for name in value.replace(",", " ").split() if name}


class ScriptedRun:
    """Plays one script against the configured MCP servers, printing stream-json."""

    def __init__(
        self,
        args: argparse.Namespace,
        policy: FakeClaudePolicy,
        question: str,
        servers: dict[str, dict[str, Any]],
        python: str | None = None,
    ) -> None:
        self.args = args
        self.python = python  # a launcher for `python -m` servers (fake_claude.PYTHON_ENV)
        self.policy = policy
        self.question = question
        self.servers = servers
        self.allowed = _tool_names(args.allowedTools)
        self.denied = _tool_names(args.disallowedTools)
        every = [*BUILTIN_TOOLS, *policy.new_builtins]
        offered = (
            set(every)
            if args.tools is None or policy.ignore_tools_flag
            else _tool_names(args.tools) & set(every)
        )
        self.builtins = [t for t in every if t in offered and t not in self.denied]
        self.session_id = str(uuid.uuid4())
        self.clients: dict[str, Client] = {}
        self.status: dict[str, str] = {}
        self.mcp_tools: list[str] = []
        self.denials: list[dict[str, Any]] = []
        self.turns = 0
        self.usage = Usage()
        self.last_text = ""
        self.started = time.monotonic()
        case = load_cases(policy.cases_file).get(question) if policy.cases_file else None
        self.values = template_values(question, case)
        self.skills = _installed_skills()
        self.injections: list[str] = []

    async def play(self) -> int:
        self._leave_temporary_files()
        async with contextlib.AsyncExitStack() as stack:
            for name, config in self.servers.items():
                await self._connect(stack, name, config)
            self._emit(self._init_event())
            self._expand_slash_command()
            for entry in self.policy.script_for(self.question):
                steps = entry if isinstance(entry, list) else [entry]
                if self.args.max_turns is not None and self.turns >= self.args.max_turns:
                    self._emit(self._result("error_max_turns"))
                    return 1
                failing = next((s for s in steps if isinstance(s, ApiErrorStep)), None)
                if failing is not None:
                    self._api_failure(failing)
                    return 1
                await self._turn(steps)
            self._emit(self._result("success"))
        return 0

    def _leave_temporary_files(self) -> None:
        """What the real CLI leaves in ``$TMPDIR`` on every run (a marker and a socket dir)."""
        base = Path(tempfile.gettempdir())
        slug = re.sub(r"[^A-Za-z0-9]", "-", os.getcwd())
        marker = base / f"claude-{os.getuid()}" / slug / self.session_id / "started"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        (base / "cc-socks").mkdir(exist_ok=True)

    def _api_failure(self, step: ApiErrorStep) -> None:
        """The CLI's retries of a refused request, then its error result."""
        error, said = _API_ERRORS.get(step.api_error, ("unknown", f"API Error: {step.api_error}"))
        for attempt in range(1, step.retries + 1):
            delay = step.retry_delay * 2 ** min(attempt - 1, 4)
            self._emit(
                {
                    "type": "system",
                    "subtype": "api_retry",
                    "attempt": attempt,
                    "max_retries": step.retries,
                    "retry_delay_ms": int(delay * 1000),
                    "error_status": step.api_error,
                    "error": error,
                    "session_id": self.session_id,
                    "uuid": str(uuid.uuid4()),
                }
            )
            time.sleep(delay)
        body = {"type": "error", "error": {"type": "api_error", "message": "refused"}}
        result = self._result("success")
        result.update(
            is_error=True,
            result=f"{said} {json.dumps(body)}",
            api_error_status=step.api_error,
            stop_reason="stop_sequence",
            terminal_reason="api_error",
        )
        self._emit(result)

    async def _connect(
        self, stack: contextlib.AsyncExitStack, name: str, config: dict[str, Any]
    ) -> None:
        from mcp import Client, StdioServerParameters

        kind = config.get("type") or ("http" if config.get("url") else "stdio")
        try:
            if kind == "stdio":
                command = [str(config["command"]), *(str(a) for a in config.get("args", []))]
                if self.python and command[0] == sys.executable and command[1:2] == ["-m"]:
                    command[:1] = shlex.split(self.python)  # the same module, launched warm
                server: Any = StdioServerParameters(
                    command=command[0],
                    args=command[1:],
                    # Like the real CLI: the server inherits our environment plus its own.
                    env={**os.environ, **{k: str(v) for k, v in config.get("env", {}).items()}},
                    cwd=config.get("cwd"),
                )
            else:
                server = str(config["url"])
            client = await stack.enter_async_context(Client(server, read_timeout_seconds=60))
            listed = await client.list_tools()
        except Exception as exc:  # a dead server is reported in init, as the real CLI does
            print(f"fake claude: MCP server {name!r} failed: {exc}", file=sys.stderr)
            self.status[name] = "failed"
            return
        self.clients[name] = client
        self.status[name] = "connected"
        self.mcp_tools += [f"mcp__{name}__{tool.name}" for tool in listed.tools]

    def _expand_slash_command(self) -> None:
        """``/<id> ...`` names an installed skill: the CLI expands it before the model runs."""
        head = self.question.split(maxsplit=1)[0] if self.question.strip() else ""
        name = head[1:] if head.startswith("/") else ""
        if name in self.skills:
            body = self.skills[name].read_text(encoding="utf-8")
            text = f"<command-name>/{name}</command-name>\n{body}"
            self._emit(self._user_text(text))

    def _user_text(self, text: str) -> dict[str, Any]:
        return {
            "type": "user",
            "message": {"role": "user", "content": [{"type": "text", "text": text}]},
            "parent_tool_use_id": None,
            "session_id": self.session_id,
        }

    def _init_event(self) -> dict[str, Any]:
        home = Path.home()
        project = home / ".claude" / "projects" / self._project_slug()
        return {
            "type": "system",
            "subtype": "init",
            "cwd": os.getcwd(),
            "session_id": self.session_id,
            "tools": self.builtins + sorted(t for t in self.mcp_tools if t not in self.denied),
            "mcp_servers": [
                {"name": n, "status": s, "source": "dynamic"} for n, s in self.status.items()
            ],
            "model": self.args.model,
            "permissionMode": self.args.permission_mode,
            "slash_commands": list(self.skills),
            "skills": list(self.skills),
            "apiKeySource": "ANTHROPIC_API_KEY" if os.environ.get("ANTHROPIC_API_KEY") else "none",
            "claude_code_version": VERSION,
            "output_style": "default",
            "uuid": str(uuid.uuid4()),
            "memory_paths": {"auto": f"{project}/memory/"},
            "original_cwd": os.getcwd(),
            "messaging_socket_path": str(
                Path(tempfile.gettempdir()) / "cc-socks" / f"{os.getpid()}.sock"
            ),
        }

    def _project_slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9]", "-", os.getcwd())

    async def _turn(self, steps: list[Step]) -> None:
        """One assistant message (one event per block, sharing its id), then its results."""
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        uses: list[tuple[str, McpStep | BuiltinStep]] = []
        texts: list[str] = []
        self.turns += 1
        self.usage.add(self._turn_usage())
        for step in steps:
            block = self._block(step, uses, texts)
            if block is not None:
                self._emit(self._assistant(message_id, block))
        if texts:
            self.last_text = "\n\n".join(texts)
        for use_id, use in uses:
            content, is_error = await self._execute(use_id, use)
            if isinstance(use, McpStep) and not is_error:
                content = self._spill(use, content)
            self._emit(self._tool_result(use_id, content, is_error))
        for text in self.injections:
            self._emit(self._user_text(text))
        self.injections.clear()

    def _block(
        self, step: Step, uses: list[tuple[str, McpStep | BuiltinStep]], texts: list[str]
    ) -> dict[str, Any] | None:
        if isinstance(step, CrashStep):
            print("fake claude: the process crashed (scripted)", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(step.crash)
        if isinstance(step, SleepStep):
            time.sleep(step.sleep)  # blocking on purpose: a hung CLI does not answer signals late
            return None
        if isinstance(step, RawStep):
            print(step.raw, flush=True)
            return None
        if isinstance(step, ApiErrorStep):
            return None  # played before the turn (see play)
        if isinstance(step, TextStep):
            text = str(fill(step.text, self.values))
            texts.append(text)
            return {"type": "text", "text": text}
        use_id = f"toolu_{uuid.uuid4().hex[:24]}"
        if isinstance(step, SkillStep):
            step = _skill_use(step)
        use = step.model_copy(update={"input": fill(step.input, self.values)})
        uses.append((use_id, use))
        return {"type": "tool_use", "id": use_id, "name": self._name(use), "input": use.input}

    def _name(self, step: McpStep | BuiltinStep) -> str:
        if isinstance(step, BuiltinStep):
            return step.builtin
        server = step.server or next(iter(self.servers), "none")
        return f"mcp__{server}__{step.tool}"

    def _spill(self, step: McpStep, content: str | list[dict[str, Any]]) -> str | list[Any]:
        """A result over the output limit goes to a file; the model gets the CLI's note."""
        text = content if isinstance(content, str) else "\n".join(b["text"] for b in content)
        limit = int(os.environ.get("MAX_MCP_OUTPUT_TOKENS") or MCP_OUTPUT_TOKENS)
        if len(text) <= limit * CHARS_PER_TOKEN:
            return content
        folder = (
            Path.home()
            / ".claude"
            / "projects"
            / self._project_slug()
            / self.session_id
            / "tool-results"
        )
        folder.mkdir(parents=True, exist_ok=True)
        server = step.server or next(iter(self.servers), "none")
        path = (
            folder
            / f"mcp-{server}-{step.tool}-{int(time.time() * 1000)}-{uuid.uuid4().hex[:6]}.txt"
        )
        path.write_text(text, encoding="utf-8")
        lines = text.count("\n") + 1
        return (
            f"Error: result ({len(text):,} characters across {lines:,} line"
            f"{'s' if lines != 1 else ''}) exceeds maximum allowed tokens. Output has been saved "
            f"to {path}.\nFormat: Plain text\nSearch within the file for specific content, and "
            "use jq if the content is JSON.\n"
            f"- You MUST read the content from the file at {path} in sequential chunks until "
            "100% of the content has been read.\n"
        )

    async def _execute(
        self, use_id: str, step: McpStep | BuiltinStep
    ) -> tuple[str | list[dict[str, Any]], bool]:
        name = self._name(step)
        if isinstance(step, BuiltinStep) and name not in self.builtins:
            # Not in the session at all (--tools, --disallowedTools): no permission question.
            return (
                f"<tool_use_error>Error: No such tool available: {name}. {name} is disabled "
                "for this session, in subagents as well as here.</tool_use_error>",
                True,
            )
        if name == "Skill":
            return self._skill(step)
        if name in self.denied or name not in self.allowed:
            self.denials.append(
                {"tool_name": name, "tool_use_id": use_id, "tool_input": step.input}
            )
            return (
                f"Claude requested permissions to use {name}, but you haven't granted it yet.",
                True,
            )
        if isinstance(step, BuiltinStep):
            return self._builtin(step)
        server = name.split("__")[1]
        client = self.clients.get(server)
        if client is None:
            return f"MCP server {server!r} is not connected", True
        return await _call(client, step.tool, step.input)

    def _skill(self, step: McpStep | BuiltinStep) -> tuple[str, bool]:
        """The Skill tool needs no permission in the real CLI: it loads the skill's body."""
        raw = next((step.input[k] for k in ("skill", "command", "name") if k in step.input), "")
        name = str(raw).lstrip("/").split(":")[-1]
        if name not in self.skills:
            return f"<tool_use_error>Unknown skill: {name}</tool_use_error>", True
        body = self.skills[name].read_text(encoding="utf-8")
        self.injections.append(
            f"Base directory for this skill: {self.skills[name].parent}\n\n{body}"
        )
        return f"Launching skill: {name}", False

    def _builtin(self, step: BuiltinStep) -> tuple[str, bool]:
        if step.builtin == "Read" and step.result is None:
            path = Path(str(step.input.get("file_path", "")))
            try:
                lines = path.read_text(encoding="utf-8").splitlines()[:READ_LINE_LIMIT]
            except OSError as exc:
                return (
                    f"<tool_use_error>File does not exist: {path} ({exc.strerror})</tool_use_error>",
                    True,
                )
            return "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(lines, 1)), False
        return step.result if step.result is not None else "(no output)", False

    def _turn_usage(self) -> Usage:
        u = self.policy.usage_per_turn
        return Usage(
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cache_read_tokens=u.cache_read_input_tokens,
            cache_creation_tokens=u.cache_creation_input_tokens,
            calls=1,
        )

    def _assistant(self, message_id: str, block: dict[str, Any]) -> dict[str, Any]:
        u = self.policy.usage_per_turn
        return {
            "type": "assistant",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": self.policy.served_models.get(self.args.model, self.args.model),
                "content": [block],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": u.model_dump(),
            },
            "parent_tool_use_id": None,
            "session_id": self.session_id,
        }

    def _tool_result(
        self, use_id: str, content: str | list[dict[str, Any]], is_error: bool
    ) -> dict[str, Any]:
        block: dict[str, Any] = {"tool_use_id": use_id, "type": "tool_result", "content": content}
        if is_error:
            block["is_error"] = True
        # The CLI repeats the result beside the message: an error as its bare text, an MCP
        # result as {"content": ...}.
        if isinstance(content, str) and is_error:
            shown: Any = re.sub(r"</?tool_use_error>", "", content)
        else:
            shown = {"content": content}
        return {
            "type": "user",
            "message": {"role": "user", "content": [block]},
            "parent_tool_use_id": None,
            "session_id": self.session_id,
            "uuid": str(uuid.uuid4()),
            "tool_use_result": shown,
        }

    def _result(self, subtype: str) -> dict[str, Any]:
        cost = self.policy.cost_usd
        if cost is None:
            cost = PriceTable().cost(self.args.model, self.usage) or 0.0
        elapsed = int((time.monotonic() - self.started) * 1000)
        return {
            "type": "result",
            "subtype": subtype,
            "is_error": subtype != "success",
            "duration_ms": elapsed,
            "duration_api_ms": elapsed // 2,
            "num_turns": self.turns,
            "result": self.last_text if subtype == "success" else "",
            "session_id": self.session_id,
            "total_cost_usd": cost,
            "usage": {
                "input_tokens": self.usage.input_tokens,
                "cache_creation_input_tokens": self.usage.cache_creation_tokens,
                "cache_read_input_tokens": self.usage.cache_read_tokens,
                "output_tokens": self.usage.output_tokens,
                "server_tool_use": {"web_search_requests": 0},
                "service_tier": "standard",
            },
            "permission_denials": self.denials,
            "stop_reason": "end_turn" if subtype == "success" else None,
            "terminal_reason": "completed" if subtype == "success" else subtype,
            "api_error_status": None,
            "uuid": str(uuid.uuid4()),
        }

    def _emit(self, event: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


def _skill_use(step: SkillStep) -> BuiltinStep:
    arguments: dict[str, Any] = {step.key: step.skill}
    if step.args is not None:
        arguments["args"] = step.args
    return BuiltinStep(builtin="Skill", input=arguments)


def _installed_skills() -> dict[str, Path]:
    """Skill id -> SKILL.md: the project's ``.claude/skills`` wins over the personal ones."""
    found: dict[str, Path] = {}
    for base in (Path.home(), Path.cwd()):
        for path in sorted((base / ".claude" / "skills").glob("*/SKILL.md")):
            found[path.parent.name] = path
    return found


async def _call(
    client: Client, tool: str, arguments: dict[str, Any]
) -> tuple[str | list[dict[str, Any]], bool]:
    """One real MCP call, its result as tool_result content blocks."""
    import mcp.types as mt
    from mcp import MCPError

    try:
        result = await client.call_tool(tool, arguments)
    except MCPError as exc:
        return f"MCP error {exc.code}: {exc.message}", True
    blocks: list[dict[str, Any]] = []
    for block in result.content:
        if isinstance(block, mt.TextContent):
            blocks.append({"type": "text", "text": block.text})
        elif isinstance(block, mt.EmbeddedResource) and isinstance(
            block.resource, mt.TextResourceContents
        ):
            blocks.append({"type": "text", "text": block.resource.text})
        else:
            blocks.append({"type": "text", "text": f"[{block.type} content]"})
    return blocks, bool(result.is_error)
