"""The fake ``claude``'s policy: which script answers a question, and the steps of a script.

Steps of a script (one per assistant turn; a list of steps is one turn)::

    {"tool": "get_context", "input": {"query": "{question}"}}      MCP call, as mcp__<server>__tool
    {"builtin": "Read", "input": {"file_path": "evals/x/cases.jsonl"}}   a host tool
    {"text": "The answer is ..."}
    {"crash": 2}          exit with that code mid-stream
    {"sleep": 5}          wait (seconds)
    {"raw": "not json"}   print a line as is
    {"skill": "run-triage"}   a Skill tool call (``"key": "command"`` for the legacy shape)
    {"api_error": 401, "retry_delay": 0.5}   the API refuses: ``retries`` api_retry events,
                          ``retry_delay`` s apart, then an error result and exit 1

Skills installed under ``.claude/skills/<id>/SKILL.md`` (in the working directory or HOME) are
listed in the init event's ``skills`` and ``slash_commands``, and a prompt starting with
``/<id>`` is expanded as the real CLI does: a ``<command-name>/<id></command-name>`` user
message and no ``Skill`` call.

Strings in inputs and texts are templated: ``{question}`` and, with ``cases_file``, the case's
fields (``{modelQuery}``, ``{golden.value}``, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    # A typo in a policy must fail loudly instead of silently scripting nothing.
    model_config = ConfigDict(extra="forbid")


class McpStep(_Strict):
    """Call a tool of the MCP server (the only one, or ``server``)."""

    tool: str
    input: dict[str, Any] = Field(default_factory=dict)
    server: str | None = None


class BuiltinStep(_Strict):
    """Use a host tool (Read, Bash, Grep, ...); ``result`` is its output when allowed."""

    builtin: str
    input: dict[str, Any] = Field(default_factory=dict)
    result: str | None = None


class TextStep(_Strict):
    text: str


class CrashStep(_Strict):
    crash: int


class SleepStep(_Strict):
    sleep: float


class RawStep(_Strict):
    raw: str


class ApiErrorStep(_Strict):
    """Every API request of this turn fails with ``api_error`` (an HTTP status): the CLI
    retries ``retries`` times, printing an ``api_retry`` event before each wait, then ends."""

    api_error: int
    retries: int = 10
    retry_delay: float = 0.5


class SkillStep(_Strict):
    """Invoke a skill through the ``Skill`` tool, as the model does.

    ``key`` picks the input shape (``skill`` in current CLIs, ``command`` in older ones). When
    the skill is installed (``.claude/skills/<id>/SKILL.md`` under the working directory or
    HOME) the result is "Launching skill: <id>" followed by the injected "Base directory for
    this skill" message with the body; otherwise an error result.
    """

    skill: str
    key: Literal["skill", "command", "name"] = "skill"
    args: str | None = None


Step = McpStep | BuiltinStep | TextStep | CrashStep | SleepStep | RawStep | SkillStep | ApiErrorStep
Script = list[Step | list[Step]]


class TurnUsage(_Strict):
    """Tokens reported per assistant turn (summed into the result event)."""

    input_tokens: int = 1_200
    output_tokens: int = 150
    cache_read_input_tokens: int = 900
    cache_creation_input_tokens: int = 300


class FakeClaudePolicy(_Strict):
    """The fake's script: by exact question, by substring of it, else ``default``."""

    by_question: dict[str, Script] = Field(default_factory=dict)
    by_substring: dict[str, Script] = Field(default_factory=dict)
    default: Script | None = None
    cases_file: str | None = None
    usage_per_turn: TurnUsage = Field(default_factory=TurnUsage)
    cost_usd: float | None = None
    """Reported as ``total_cost_usd``; default: the usage at list price (0 when unknown)."""
    record_file: str | None = None
    """Each run appends one JSON line here: argv, pid, cwd, HOME, env, the MCP config."""
    new_builtins: list[str] = Field(default_factory=list)
    """Built-in tools of a newer CLI, beyond ``BUILTIN_TOOLS`` (no deny-list names them yet)."""
    ignore_tools_flag: bool = False
    """Behave like a CLI older than ``--tools``: every built-in tool stays in the session."""
    served_models: dict[str, str] = Field(default_factory=dict)
    """``--model`` -> the model the assistant messages name (an endpoint serving an alias as
    a dated id); the init event still echoes ``--model``, as the real CLI's does."""

    @classmethod
    def from_file(cls, path: str | Path) -> FakeClaudePolicy:
        """Load a policy; a relative ``cases_file``/``record_file`` is relative to it."""
        path = Path(path)
        policy = cls.model_validate_json(path.read_text(encoding="utf-8"))
        updates = {
            key: str((path.parent / value).resolve())
            for key in ("cases_file", "record_file")
            if (value := getattr(policy, key)) and not Path(value).is_absolute()
        }
        return policy.model_copy(update=updates)

    def script_for(self, question: str) -> Script:
        """The script for a question; an empty one says it has none."""
        if question in self.by_question:
            return self.by_question[question]
        for key, script in self.by_substring.items():
            if key in question:
                return script
        return self.default or [TextStep(text="The fake has no script for this question.")]
