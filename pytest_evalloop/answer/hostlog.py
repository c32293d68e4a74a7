"""The host-side log of the plugin's own target session, for answerers it cannot vouch for.

The built-in backends keep a host-side tool log of their own (the Messages API loop calls the
tools itself; the `claude` CLI's stream-json is read by the host): they say so with
`host_side_tool_log = True`. An answerer of the user's own (`evalloop_answerer`) reports its
`tool_log` itself, and a report is no host log: an answerer that read `cases.jsonl` through the
session and returned an empty log would pass. So every attempt is answered through a
`HostLoggedSession`, which logs each call the plugin's session serves, and for an answerer
without a host-side log of its own the contamination check reads *that* log (`host_rows`),
whatever the answerer reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_evalloop.roles import AnswerRecord, TargetSession, ToolOutcome, ToolUse

UNVERIFIED = "contamination_unknown"
"""The score reason of an attempt no host log covers: no verdict, never a clean pass."""


class HostLoggedSession:
    """A target session that logs every call it serves (`log`), then answers as the session."""

    def __init__(self, session: TargetSession) -> None:
        self._session = session
        self.name = session.name
        self.log: list[ToolUse] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Call the tool through the plugin's session, logging it on the host side."""
        from pytest_evalloop.answer.answerer import log_row

        try:
            outcome = await self._session.call(tool, arguments)
        except Exception as exc:
            self.log.append(
                ToolUse(tool=tool, input=dict(arguments), ok=False, error=str(exc)[:2_000])
            )
            raise
        self.log.append(log_row(self._session, tool, dict(arguments), outcome))
        return outcome


def vouches(answerer: Any) -> bool:
    """Whether the answerer's own tool log is a host-side log (the built-in backends)."""
    return getattr(answerer, "host_side_tool_log", False) is True


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
