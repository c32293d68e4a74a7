"""The host-side log of the plugin's own target session, for answerers it cannot vouch for.

The built-in backends keep a host-side tool log of their own (the Messages API loop calls the
tools itself; the `claude` CLI's stream-json is read by the host). Only they vouch for their
logs (`vouches`: an instance of one of the plugin's own classes, not a subclass, with none of
its methods replaced), never an attribute a user's class could set. An answerer of the user's
own (`evalloop_answerer`) reports its `tool_log` itself, and a report is no host log: an
answerer that read `cases.jsonl` through the session and returned an empty log would pass. So
it is handed a `HostLoggedSession`, which exposes only calls it logs (`call`, and `execute`,
logged as a query call) and the session's plain descriptions, never the session behind it,
and the contamination check reads *that* log (`host_rows`), whatever the answerer reports.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pytest_evalloop.roles.contract import (
    AnswerRecord,
    ContextResult,
    FinalCall,
    QueryOutcome,
    TargetSession,
    ToolOutcome,
    ToolRole,
    ToolSpec,
    ToolUse,
)

UNVERIFIED = "contamination_unknown"
"""The score reason of an attempt no host log covers: no verdict, never a clean pass."""


class HostLoggedSession:
    """A target session that logs every call it serves (`log`), then answers as the session.

    It forwards nothing else: an answerer of the user's own reaches the target through `call`
    and `execute`, both logged, and reads what the session describes (`name`, `instructions`,
    `list_tools`, `role_of`, `query_of`, `context_results`); the session behind it, its MCP
    client and its launch command are not attributes of this object. (Python hides nothing
    from code that digs through an object's internals on purpose; such code reads files with
    its own hands, which no log of the plugin's can see: docs/judge.md says so.)
    """

    __slots__ = ("name", "instructions", "log", "__inner")

    def __init__(self, session: TargetSession) -> None:
        self.__inner = session
        self.name = session.name
        self.instructions: str | None = getattr(session, "instructions", None)
        """The target's MCP `instructions` (what it says about using its tools), or None."""
        self.log: list[ToolUse] = []

    async def list_tools(self) -> list[ToolSpec]:
        """The tools the answerer may use."""
        return await self.__inner.list_tools()

    def role_of(self, tool: str) -> ToolRole | None:
        """Whether a tool is the context tool, the query tool, or neither."""
        return self.__inner.role_of(tool)

    def query_of(self, tool: str, arguments: dict[str, Any]) -> str | None:
        """The query text of a query-tool call."""
        return self.__inner.query_of(tool, arguments)

    def context_results(self, outcome: ToolOutcome) -> list[ContextResult]:
        """The ranked entities of a context-tool result."""
        return self.__inner.context_results(outcome)

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Call the tool through the plugin's session, logging it on the host side."""
        from pytest_evalloop.answer.answerer import log_row

        try:
            outcome = await self.__inner.call(tool, arguments)
        except Exception as exc:
            self.log.append(
                ToolUse(tool=tool, input=dict(arguments), ok=False, error=str(exc)[:2_000])
            )
            raise
        self.log.append(log_row(self.__inner, tool, dict(arguments), outcome))
        return outcome

    async def execute(self, query: str, call: FinalCall | None = None) -> QueryOutcome:
        """Run a query as the conductor would, logged as a query call of the answerer's."""
        from pytest_evalloop.answer.reexecution import reexecute

        inner = self.__inner
        profile = getattr(inner, "profile", None)
        tool = (call.tool if call else None) or getattr(profile, "query_tool", None) or "execute"
        arguments = {**((call.arguments or {}) if call else {}), "query": query}
        row = ToolUse(tool=tool, input=arguments, role="query", query=query)
        self.log.append(row)
        try:
            outcome = await reexecute(inner, call or FinalCall(query=query, source="declared"))
        except Exception as exc:
            row.ok, row.error = False, str(exc)[:2_000]
            raise
        if outcome.error is not None:
            row.ok, row.error = False, outcome.error[:2_000]
        return outcome


def vouches(answerer: Any) -> bool:
    """Whether the answerer's own tool log is a host-side log: an instance of one of the
    plugin's own backends exactly (a subclass may answer any way it likes), none of whose
    methods the instance replaces. Nothing an answerer says about itself counts."""
    own = type(answerer)
    if own not in _own_backends():
        return False
    methods = {name for name, value in vars(own).items() if callable(value)}
    return not methods & set(getattr(answerer, "__dict__", {}))


@functools.cache
def _own_backends() -> frozenset[type]:
    from pytest_evalloop.answer.answerer import AnthropicAnswerer
    from pytest_evalloop.answer.claude_code import ClaudeCodeAnswerer
    from pytest_evalloop.answer.replay import ReplayAnswerer

    return frozenset({AnthropicAnswerer, ClaudeCodeAnswerer, ReplayAnswerer})


def host_rows(reported: list[ToolUse], seen: list[ToolUse]) -> tuple[list[ToolUse], list[str]]:
    """The tool log to check for an answerer that does not vouch for its own, and why no host
    log covers it (empty when one does).

    The host's log of the plugin's session, plus the file tools the answerer reports (only it
    can tell of those, and they can only add findings). MCP calls it reports that never went
    through the session are calls no host saw; an answer with no call through the session at
    all has no host log.
    """
    own_files = [use for use in reported if not use.is_mcp]
    unseen = len([u for u in reported if u.is_mcp]) - len(seen)
    why = []
    if unseen > 0:
        why.append(
            f"the answerer reported {unseen} MCP call(s) the host never saw (not made through "
            "the plugin's target session): no host log covers them"
        )
    if not seen:
        why.append(
            "no call went through the plugin's target session: no host-side log covers this "
            "answer (an answerer of your own must call the tools through the session it is given)"
        )
    return [*seen, *own_files], why


def checked_record(
    answerer: Any, record: AnswerRecord, seen: list[ToolUse]
) -> tuple[AnswerRecord, list[str]]:
    """The record whose tool log is checked (the host's, for an answerer that does not vouch
    for its own), and why no host log covers it."""
    if vouches(answerer):
        return record, []
    rows, why = host_rows(record.tool_log, seen)
    return record.model_copy(update={"tool_log": rows}), why


def check_attempt(
    record: AnswerRecord, protected: list[Path], model_paths: list[Path], unverified: list[str]
) -> Any:
    """The contamination check of one attempt's (host-side) tool log; with nothing found and
    no host log covering the answer, `"unknown"`, never a clean pass (seed 004)."""
    from pytest_evalloop.answer.contamination import ContaminationResult, check_contamination
    from pytest_evalloop.answer.contamination import ToolUse as LogRow

    rows = [
        LogRow(tool=u.tool, input=u.input, is_mcp=u.is_mcp, refused=_refused(u))
        for u in record.tool_log
    ]
    found = check_contamination(
        rows,
        reported_calls=record.reported_calls,
        protected_paths=protected,
        model_paths=model_paths,
    )
    if unverified and found.contaminated is False:
        return ContaminationResult(contaminated="unknown", reasons=unverified)
    return found


def _refused(use: ToolUse) -> bool:
    # The embedded sandbox's refusals start "query refused:"; Publisher's say "refused" too.
    return not use.ok and "refused" in (use.error or "").lower()
