"""The three roles of an eval and the records they exchange.

- A **target** serves MCP tools over the user's data; the answerer sees only its tools, and the
  conductor re-executes the final query through the same target.
- An **answerer** answers one question with those tools and returns an :class:`AnswerRecord`,
  including the host-side log of every tool use (the contamination check reads it).
- A **judge** scores one attempt against the golden.

Users supply their own through the `evalloop_answerer` / `evalloop_judge` / `evalloop_target`
fixtures; anything with these methods works (structural typing).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from pytest_evalloop.ledger.contract import ReportStatus
from pytest_evalloop.model_api.pricing import Usage

if TYPE_CHECKING:
    from pytest_evalloop.judge.judge import JudgeMaterials, JudgeOutcome

ToolRole = Literal["context", "query"]


class ToolSpec(BaseModel):
    """A tool as the target lists it."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)


class ToolOutcome(BaseModel):
    """One tool call's result, normalised across targets and tool profiles."""

    text: str
    """What the answerer is shown (JSON payloads as text)."""
    payload: Any = None
    """The decoded JSON payload, when the result carried one."""
    is_error: bool = False
    error: str | None = None


class QueryOutcome(BaseModel):
    """Rows from re-executing a query (the conductor's own run, never the answerer's report)."""

    columns: list[str] = Field(default_factory=list)
    rows: list[dict[str, Any]] = Field(default_factory=list)
    truncated: bool = False
    """The target capped the result (row cap, `_limit_hit`, `_rows_truncated`)."""
    error: str | None = None
    """The target's error: the query was run and failed."""
    not_run: str | None = None
    """Why the query was not run at all (no target for a stored prediction, nothing stored to
    replay): rows are unavailable, which is not a failure of the query."""
    meta: dict[str, Any] = Field(default_factory=dict)
    call: dict[str, Any] | None = None
    """What the conductor sent: `{"tool", "arguments", "query_arg"}` (the arguments include the
    query text, under `query_arg`)."""


class ToolUse(BaseModel):
    """One row of the host-side tool log: every tool the answerer used, MCP or not."""

    tool: str
    input: dict[str, Any] = Field(default_factory=dict)
    is_mcp: bool = True
    role: ToolRole | None = None
    """What an MCP call was for (context retrieval or a query), per the tool profile."""
    ok: bool = True
    error: str | None = None
    trace_id: str | None = None
    query: str | None = None
    """The query text, for query-tool calls."""
    context_results: list[dict[str, Any]] = Field(default_factory=list)
    """Ranked entities a context call returned (id, kind, name, source, doc, rank)."""
    targets: str | list[str] | None = None
    """What a context call asked for (its search terms)."""


FinalSource = Literal["declared", "last_successful", "last_call", "none"]


class FinalCall(BaseModel):
    """The final query of an attempt and the query-tool call that re-executes it.

    ``exact`` calls are replayed as the answerer made them (same tool, same arguments, query
    included). A declared query the answerer never ran as such borrows the arguments of its
    last query call (package, model, givens), with the declared text as the query; a stored
    prediction carries only the arguments it recorded. Either is ``exact=False``: the target's
    defaults fill what the borrowed arguments lack.
    """

    query: str | None
    source: FinalSource
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    exact: bool = False
    seq: int | None = None
    """1-based position in the tool log of the call replayed (the `seq` of its `tool_call`
    event); None when no call carried this query."""


class AnswerRecord(BaseModel):
    """What an answerer did for one attempt."""

    answer_text: str | None = None
    tool_log: list[ToolUse] = Field(default_factory=list)
    declared_final: str | None = None
    """A final query the answerer declared explicitly (beats the last query call)."""
    answer_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    """One id per answer made (`comparable` tells two runs that hold the same answers from two
    that answered); a replayed record carries the stored answer's, which the rejudge keeps."""
    final_source: FinalSource | None = None
    """Set on a replayed record only: how its source run chose the final query, so a rejudge
    records the same source instead of calling every stored query "declared"."""
    reported_calls: int | None = None
    """Tool calls the answerer says it made (the "Tool calls:" line of its answer)."""
    reported_calls_status: ReportStatus | None = None
    """Whether the answer carried that report; None when the answerer was never asked for one
    (an answerer of your own): recorded as missing, since rule 3 could not be checked."""
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float | None = None
    """None when the model's price is unknown: never reported as 0."""
    model: str | None = None
    num_turns: int = 0
    wall_seconds: float = 0.0
    stop: str = "end_turn"
    """Why the loop ended: end_turn, max_turns, timeout, token_budget, refusal, ..."""
    transcript: list[dict[str, Any]] = Field(default_factory=list)
    served_revision: str | None = None
    """The revision the target reported serving (`servedRevision` in a tool payload)."""
    served_model_sha: str | None = None
    """The content sha the target reported for the model (`sourceContentSha` in a payload)."""


class ContextResult(BaseModel):
    """One entity a context-tool call returned, at its rank (1 = first) in that call."""

    id: str | None = None
    kind: str
    name: str
    source: str
    doc: str = ""
    rank: int


@runtime_checkable
class TargetSession(Protocol):
    """An open connection to a target's MCP tools (optionally with `instructions`: what the
    server said about using its tools when it was connected, which both answerer backends
    show the model)."""

    name: str

    async def list_tools(self) -> list[ToolSpec]:
        """The tools the answerer may use (exactly these, nothing else)."""
        ...

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Call one tool; tool-level errors come back as `is_error`, transport failures raise."""
        ...

    def role_of(self, tool: str) -> ToolRole | None:
        """Whether a tool is the context tool, the query tool, or neither."""
        ...

    def query_of(self, tool: str, arguments: dict[str, Any]) -> str | None:
        """The query text of a query-tool call (what re-execution replays)."""
        ...

    def context_results(self, outcome: ToolOutcome) -> list[ContextResult]:
        """The ranked entities of a context-tool result, with ids `kind:source:name`."""
        ...

    async def execute(self, query: str, call: FinalCall | None = None) -> QueryOutcome:
        """Re-execute a query through the target's query tool, as the conductor.

        With ``call``, repeat that call of the answerer's (its tool and arguments); without,
        run ``query`` with the target's default arguments. A session whose ``execute`` takes
        no ``call`` is given the query text alone.
        """
        ...


@runtime_checkable
class Target(Protocol):
    """Something that serves the answerer's tools; opened once per process."""

    name: str
    """Recorded as `target` in run.json: which server answered."""

    async def open(self) -> TargetSession:
        """Connect (once per process; the session is shared by concurrent attempts)."""
        ...

    async def close(self) -> None:
        """Disconnect."""
        ...


@runtime_checkable
class RestartingTarget(Protocol):
    """A target whose dead server is restarted a bounded number of times (the malloy target).

    The runtime opens such a target again when its session died (`broken`), and stops the run
    as soon as `stop_reason` is set: the restarts are spent, so every later case would only be
    another harness error.
    """

    @property
    def stop_reason(self) -> str | None:
        """Why the run must stop now, or None."""
        ...


@runtime_checkable
class Answerer(Protocol):
    """Answers one question using only the target's tools."""

    backend: str
    model: str

    async def answer(self, question: str, session: TargetSession) -> AnswerRecord:
        """Answer; raise :class:`HarnessError` when the endpoint is down after retries."""
        ...


@runtime_checkable
class Judge(Protocol):
    """Scores one attempt against the golden; fresh per call, never shares a conversation."""

    model: str
    version: str
    rubric_sha: str

    async def judge(self, materials: JudgeMaterials) -> JudgeOutcome:
        """Return the verdict; raise :class:`HarnessError` when the endpoint is down."""
        ...
