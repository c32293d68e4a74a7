"""The ``anthropic`` skill backend: the catalog offered as a ``Skill`` tool over the Messages API.

The model gets a ``Skill`` tool whose description lists every model-invocable skill of the
sandbox (``name: description``, capped as Claude Code caps its listing) and whose result is the
SKILL.md body, as Claude Code loads a skill; plus file tools confined to the sandbox repository
(``Read`` and ``LS``; ``Write`` too in full mode). The run is written down as Claude Code
stream-json events (``system/init``, ``assistant``, ``user``, ``result``) with Claude Code's
tool names and input keys, so the grading module's detector, ``forbid``, rubric rules, question
heuristic and ledger read it unchanged. See docs/skills.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pytest_evalloop.failures import HarnessError
from pytest_evalloop.model_api.pricing import PriceTable
from pytest_evalloop.model_api.toolloop import Conversation, LoopPolicy, before_deadline, converse
from pytest_evalloop.skills.frontmatter import SKILL_FILE, split_frontmatter
from pytest_evalloop.targets.bridge import truncate_text

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import Message

SKILL_AGENT_VERSION = "1"
"""Bump when the system prompt, the tool descriptions or the loop's rules change."""

SKILL_TOOL, READ_TOOL, LIST_TOOL, WRITE_TOOL = "Skill", "Read", "LS", "Write"
SKILLS_DIR = Path(".claude") / "skills"
MAX_TURNS: dict[str, int] = {"activation": 8, "full": 30}
LISTING_CAP = 1_536
"""Characters of ``description`` + ``when_to_use`` per skill, as Claude Code's listing."""
READ_CHARS = 50_000
LIST_ENTRIES = 500
MEMORY_CHARS = 20_000
EVENT_RESULT_CHARS = 4_000
"""Each tool result is kept in the transcript up to this many characters (the model gets all
of a result up to ``READ_CHARS``)."""

SYSTEM_PROMPT = """\
You are a coding agent working in the user's repository. The repository is your working \
directory: every path you give a tool is relative to it, and nothing outside it can be reached.

Skills are packaged instructions for particular kinds of work. The Skill tool lists the skills \
installed in this repository, each with a description of when it applies. When the user's \
request matches a skill's description, call the Skill tool with that skill's name before you \
start the work, then follow the instructions it returns. Do not load a skill whose description \
does not fit the request; answer such requests directly.

Use the file tools to look at the repository and, when a write tool is offered, to change it. \
When you are done, reply with a short account of what you did or found.
"""

SKILL_TOOL_TEXT = """\
Load a skill: packaged instructions for one kind of task. When the user's request matches one \
of the skills below, call this tool with the skill's name before doing the work; the result is \
the skill's instructions, and its base directory (for any files the instructions mention). \
Skip it when no skill fits.

Available skills:
"""

_FILE_TOOLS: dict[str, dict[str, Any]] = {
    READ_TOOL: {
        "description": "Read a text file of the repository. `file_path` is relative to the "
        "repository root.",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string", "description": "The file to read"}},
            "required": ["file_path"],
        },
    },
    LIST_TOOL: {
        "description": "List the entries of a directory of the repository (directories end "
        "with '/'). `path` is relative to the repository root; omit it for the root.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "The directory"}},
        },
    },
    WRITE_TOOL: {
        "description": "Write a file of the repository, replacing any previous content; "
        "missing parent directories are created. `file_path` is relative to the repository "
        "root.",
        "input_schema": {
            "type": "object",
            "properties": {
                "file_path": {"type": "string", "description": "The file to write"},
                "content": {"type": "string", "description": "The whole new content"},
            },
            "required": ["file_path", "content"],
        },
    },
}


# --- the catalog ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogSkill:
    """One installed skill as the agent can see and load it."""

    id: str
    listing: str
    """``description`` (and ``when_to_use``), capped at :data:`LISTING_CAP`."""
    body: str
    model_invocable: bool


def load_catalog(repo: Path) -> list[CatalogSkill]:
    """The skills installed under ``<repo>/.claude/skills``, by id.

    A SKILL.md without valid frontmatter or a description is left out: Claude Code would have
    nothing to list for it either, and the runner then reports the skill as not visible (an
    isolation error), never as a negative.
    """
    out = []
    for path in sorted((repo / SKILLS_DIR).glob(f"*/{SKILL_FILE}")):
        meta, error, body = split_frontmatter(path.read_text(encoding="utf-8"))
        if error or meta is None or not isinstance(meta.get("description"), str):
            continue
        listing = " ".join(
            str(meta[k]).strip() for k in ("description", "when_to_use") if meta.get(k)
        )
        if len(listing) > LISTING_CAP:
            listing = listing[: LISTING_CAP - 1] + "…"
        manual = meta.get("disable-model-invocation") is True
        out.append(CatalogSkill(path.parent.name, listing, body.strip(), not manual))
    return out


def base_directory(skill_id: str) -> str:
    """Where a skill lives, as the file tools take it (relative to the repository)."""
    return (SKILLS_DIR / skill_id).as_posix()


def loaded_text(skill: CatalogSkill) -> str:
    """What loading a skill gives the model: its base directory, then the SKILL.md body."""
    return f"Base directory for this skill: {base_directory(skill.id)}\n\n{skill.body}"


def skill_tool(catalog: list[CatalogSkill]) -> dict[str, Any]:
    """The ``Skill`` tool: the listing in its description, input ``{"skill": "<id>"}``."""
    invocable = [s for s in catalog if s.model_invocable]
    listing = "\n".join(f"- {s.id}: {s.listing}" for s in invocable) or "(none)"
    skill_input: dict[str, Any] = {"type": "string", "description": "The skill's name"}
    if invocable:
        skill_input["enum"] = [s.id for s in invocable]
    return {
        "name": SKILL_TOOL,
        "description": SKILL_TOOL_TEXT + listing,
        "input_schema": {
            "type": "object",
            "properties": {
                "skill": skill_input,
                "args": {"type": "string", "description": "Optional arguments for the skill"},
            },
            "required": ["skill"],
        },
    }


def tools_for(catalog: list[CatalogSkill], mode: str) -> list[dict[str, Any]]:
    """Skill, Read and LS; Write too in full mode. The last tool carries the cache mark."""
    names = [READ_TOOL, LIST_TOOL] + ([WRITE_TOOL] if mode == "full" else [])
    tools = [skill_tool(catalog), *({"name": n, **_FILE_TOOLS[n]} for n in names)]
    tools[-1] = {**tools[-1], "cache_control": {"type": "ephemeral"}}
    return tools


def system_prompt(repo: Path) -> str:
    """The system prompt, plus the repository's ``CLAUDE.md`` as project instructions (Claude
    Code loads it as memory; the question preference lives there)."""
    memory = repo / "CLAUDE.md"
    if not memory.is_file():
        return SYSTEM_PROMPT
    text = truncate_text(memory.read_text("utf-8", "replace").strip(), MEMORY_CHARS)
    return f"{SYSTEM_PROMPT}\n# Project instructions (CLAUDE.md)\n\n{text}\n"


def prompt_sha() -> str:
    """sha256 (16 hex) over the system prompt and the tool texts: a run pin, since any wording
    change moves trigger rates."""
    pinned = {"system": SYSTEM_PROMPT, "skill": SKILL_TOOL_TEXT, "files": _FILE_TOOLS}
    return hashlib.sha256(json.dumps(pinned, sort_keys=True).encode()).hexdigest()[:16]


# --- the file tools ---------------------------------------------------------------------------


class ToolRefused(Exception):
    """A tool call the sandbox refuses; its message goes back to the model as a tool error."""


class SandboxFiles:
    """Read, list and (when ``writable``) write files, all confined to ``root``."""

    def __init__(self, root: Path, *, writable: bool) -> None:
        self.root = root.resolve()
        self.writable = writable

    def resolve(self, raw: Any, *, what: str = "file_path") -> Path:
        """The real path of ``raw`` (relative to the root, or absolute inside it); symlinks are
        followed first, so a link cannot lead out. Raises :class:`ToolRefused` outside."""
        if not isinstance(raw, str) or not raw.strip():
            raise ToolRefused(f"`{what}` must be a non-empty path string, got {raw!r}")
        path = Path(raw.strip())
        target = (path if path.is_absolute() else self.root / path).resolve()
        if not target.is_relative_to(self.root):
            raise ToolRefused(
                f"{raw!r} is outside the repository; only paths inside it can be used"
            )
        return target

    def read(self, arguments: dict[str, Any]) -> str:
        """The text of a file, cut at :data:`READ_CHARS`."""
        path = self.resolve(arguments.get("file_path"))
        if path.is_dir():
            raise ToolRefused(f"{self._rel(path)} is a directory; list it with {LIST_TOOL}")
        if not path.is_file():
            raise ToolRefused(f"{self._rel(path)} does not exist")
        text = path.read_text(encoding="utf-8", errors="replace")
        return truncate_text(text, READ_CHARS) if text else "(the file is empty)"

    def list(self, arguments: dict[str, Any]) -> str:
        """One entry a line, directories with a trailing ``/``; ``.git`` is left out."""
        raw = arguments.get("path")
        path = self.root if raw in (None, "", ".") else self.resolve(raw, what="path")
        if not path.is_dir():
            raise ToolRefused(f"{self._rel(path)} is not a directory")
        entries = sorted(p for p in path.iterdir() if p.name != ".git")
        lines = [p.name + ("/" if p.is_dir() else "") for p in entries[:LIST_ENTRIES]]
        if len(entries) > LIST_ENTRIES:
            lines.append(f"[... {len(entries) - LIST_ENTRIES} more entries]")
        return "\n".join(lines) or "(the directory is empty)"

    def write(self, arguments: dict[str, Any]) -> str:
        """Replace a file's content; ``.git`` is refused (it would rewrite the sandbox's own
        history, which the diff is read from)."""
        if not self.writable:
            raise ToolRefused(f"{WRITE_TOOL} is not available in this run")
        path = self.resolve(arguments.get("file_path"))
        content = arguments.get("content")
        if not isinstance(content, str):
            raise ToolRefused(f"`content` must be a string, got {type(content).__name__}")
        rel = path.relative_to(self.root)
        if rel.parts[:1] == (".git",):
            raise ToolRefused(f"{rel.as_posix()} is inside .git, which cannot be written")
        if path.is_dir():
            raise ToolRefused(f"{rel.as_posix()} is a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        return f"Wrote {len(content.encode())} bytes to {rel.as_posix()}"

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."


# --- the loop ---------------------------------------------------------------------------------


@dataclass
class AgentRun:
    """What one run produced: stream-json-shaped events, wall time, and a provider error (the
    endpoint failed after the SDK's retries, or the run hit its deadline) or None."""

    events: list[dict[str, Any]]
    seconds: float
    error: str | None = None


class AnthropicSkillAgent:
    """Runs one scenario prompt as a Messages API tool-use loop in a sandbox repository.

    ``client_factory`` is called once per run, inside the run's event loop; the agent closes
    that client when the run ends. Retries (and ``retry-after``) are the client's.
    """

    backend = "anthropic"

    def __init__(
        self,
        *,
        model: str,
        client_factory: Callable[[], anthropic.AsyncAnthropic],
        prices: PriceTable | None = None,
        max_output_tokens: int = 4096,
    ) -> None:
        self.model = model
        self.client_factory = client_factory
        self.prices = prices if prices is not None else PriceTable()
        self.max_output_tokens = max_output_tokens

    def run(
        self,
        repo: Path,
        prompt: str,
        *,
        mode: Literal["activation", "full"] = "activation",
        explicit_skill: str | None = None,
        timeout_s: float = 300.0,
    ) -> AgentRun:
        """Run to a final answer, ``error_max_turns``, a provider error or the deadline."""
        started = time.monotonic()
        events: list[dict[str, Any]] = []
        conv = Conversation(messages=[])
        error = asyncio.run(
            self._bounded(repo, prompt, mode, explicit_skill, timeout_s, events, conv)
        )
        events.append(self._result_event(conv, error))
        return AgentRun(events, round(time.monotonic() - started, 3), error)

    async def _bounded(
        self,
        repo: Path,
        prompt: str,
        mode: str,
        explicit_skill: str | None,
        timeout_s: float,
        events: list[dict[str, Any]],
        conv: Conversation,
    ) -> str | None:
        client = self.client_factory()
        work = self._loop(client, repo, prompt, mode, explicit_skill, events, conv)
        try:
            if await before_deadline(timeout_s, work):
                return f"the anthropic skill agent did not finish within {timeout_s:g} s"
        except HarnessError as exc:
            # The endpoint failed after the client's retries (the message names it, never
            # the key).
            return str(exc)
        finally:
            release = getattr(self.client_factory, "release", None)
            await (release() if release is not None else client.close())
        return None

    async def _loop(
        self,
        client: anthropic.AsyncAnthropic,
        repo: Path,
        prompt: str,
        mode: str,
        explicit_skill: str | None,
        events: list[dict[str, Any]],
        conv: Conversation,
    ) -> None:
        catalog = load_catalog(repo)
        tools = tools_for(catalog, mode)
        files = SandboxFiles(repo, writable=mode == "full")
        events.append(self._init_event(repo, catalog, tools))
        conv.messages.append({"role": "user", "content": _opening(prompt, catalog, explicit_skill)})

        async def run_tool(block: dict[str, Any]) -> dict[str, Any]:
            return _use_tool(block, catalog, files)

        def record(message: dict[str, Any], reply: Message | None) -> None:
            shown: dict[str, Any] = {**message, "content": _for_transcript(message["content"])}
            if reply is not None:
                shown.update(model=self.model, stop_reason=reply.stop_reason)
            events.append({"type": message["role"], "message": shown})

        policy = LoopPolicy(
            model=self.model,
            system=system_prompt(repo),
            max_output_tokens=self.max_output_tokens,
            # As `claude --max-turns`: out of turns is scored (error_max_turns), not an error.
            max_turns=MAX_TURNS.get(mode, MAX_TURNS["activation"]),
            tools=tools,
            run_tool=run_tool,
            # Claude Code runs the calls a reply makes, whatever its stop reason.
            stop_reason_decides=False,
            record=record,
        )
        await converse(client, policy, conv)

    def _init_event(
        self, repo: Path, catalog: list[CatalogSkill], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        ids = [s.id for s in catalog]
        return {
            "type": "system",
            "subtype": "init",
            "backend": self.backend,
            "agent_version": SKILL_AGENT_VERSION,
            "prompt_sha": prompt_sha(),
            "cwd": str(repo),
            "model": self.model,
            "tools": [t["name"] for t in tools],
            # Every loadable skill is visible (a manual one only to a typed /id), as in the CLI.
            "skills": ids,
            "slash_commands": ids,
        }

    def _result_event(self, conv: Conversation, error: str | None) -> dict[str, Any]:
        u = conv.usage
        subtype = "error_max_turns" if conv.stop == "max_turns" else "success"
        return {
            "type": "result",
            "subtype": "error_during_execution" if error else subtype,
            "is_error": error is not None,
            "result": conv.final_text or "",
            "num_turns": conv.turns,
            "usage": {
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "cache_read_input_tokens": u.cache_read_tokens,
                "cache_creation_input_tokens": u.cache_creation_tokens,
            },
            "total_cost_usd": self.prices.cost(self.model, u) if u.calls else None,
            **({"error": error} if error else {}),
        }


def _opening(prompt: str, catalog: list[CatalogSkill], explicit_skill: str | None) -> list[Any]:
    """The first user turn; an explicit ``/<id>`` prompt also carries the expanded skill, with
    the ``<command-name>`` marker Claude Code injects."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": prompt}]
    found = next((s for s in catalog if s.id == explicit_skill), None)
    if found is not None:
        text = f"<command-name>/{found.id}</command-name>\n{loaded_text(found)}"
        blocks.append({"type": "text", "text": text})
    return blocks


def _use_tool(
    block: dict[str, Any], catalog: list[CatalogSkill], files: SandboxFiles
) -> dict[str, Any]:
    """Run one ``tool_use``; a refusal or an unknown tool is a tool error the model reads."""
    name = str(block.get("name"))
    raw = block.get("input")
    arguments: dict[str, Any] = raw if isinstance(raw, dict) else {}
    handlers: dict[str, Callable[[dict[str, Any]], str]] = {
        SKILL_TOOL: lambda a: _load_skill(a, catalog),
        READ_TOOL: files.read,
        LIST_TOOL: files.list,
    }
    if files.writable:
        handlers[WRITE_TOOL] = files.write
    handler = handlers.get(name)
    try:
        if handler is None:
            raise ToolRefused(f"unknown tool {name!r}; the tools are: {', '.join(handlers)}")
        text, is_error = handler(arguments), False
    except ToolRefused as exc:
        text, is_error = str(exc), True
    except OSError as exc:
        text, is_error = f"{name} failed: {exc.strerror or exc}", True
    result = {"type": "tool_result", "tool_use_id": str(block.get("id")), "content": text}
    return {**result, "is_error": True} if is_error else result


def _load_skill(arguments: dict[str, Any], catalog: list[CatalogSkill]) -> str:
    """The SKILL.md body of the named skill (``/id`` and ``ns:id`` accepted, as the CLI)."""
    raw = next((arguments[k] for k in ("skill", "command", "name") if k in arguments), None)
    wanted = str(raw or "").strip().lstrip("/").split(":")[-1]
    found = next((s for s in catalog if s.id == wanted), None)
    if found is None:
        known = ", ".join(s.id for s in catalog if s.model_invocable) or "none"
        raise ToolRefused(f"Unknown skill: {raw!r}; the available skills are: {known}")
    if not found.model_invocable:
        raise ToolRefused(
            f"skill {found.id!r} can only be invoked by the user (disable-model-invocation)"
        )
    return loaded_text(found)


def _for_transcript(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy with each tool result cut to a few KB (the ledger keeps the transcript)."""
    return [
        dict(b, content=truncate_text(b["content"], EVENT_RESULT_CHARS))
        if b.get("type") == "tool_result" and isinstance(b.get("content"), str)
        else b
        for b in content
    ]
