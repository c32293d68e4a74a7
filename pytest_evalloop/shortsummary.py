"""Our outcome words in pytest's "short test summary info" (`-rs`, `-ra`, `-rA`).

pytest lists only its own categories there (failed, error, skipped, …). near_match,
needs_human, unscored and the other words an eval item reports under are categories of their
own, so that the final line counts them apart; without this plugin `-ra` would never name
them, and a reviewer would have to scroll back through `-v` lines to find which cases were
not decided and why.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import Any

import pytest

REPORT_ATTR = "evalloop"
"""The attribute on a test report that carries the item's eval result (set by the plugin).

Whole until the item's reports are all logged (every `pytest_runtest_logreport`, wrappers
included, sees it); from its `pytest_runtest_logfinish` on only `keptreports.slimmed` of it
stays, since pytest keeps every report until the session ends. The whole results reach
`pytest_evalloop_run_finished`."""


_PYTEST_CHARS = {
    "f": "failed",
    "E": "error",
    "s": "skipped",
    "x": "xfailed",
    "X": "xpassed",
    "p": "passed",
}
"""The report chars pytest's own short summary acts on, and the category each lists."""


def eval_lines(stats: dict[str, list[Any]], word_of: Any) -> list[str]:
    """One line per eval item reported under a category of ours: `WORD nodeid - reason`.

    ``word_of(report)`` gives the item's verbose status word (pytest's own teststatus hook)."""
    lines = []
    for category, reports in stats.items():
        if category in _PYTEST_CHARS.values() or not category:
            continue
        for report in reports:
            if not getattr(report, REPORT_ATTR, None) or report.when not in ("call", "setup"):
                continue
            if report.outcome == "rerun":
                continue  # its plugin lists reruns (pytest-rerunfailures' `-rR`)
            reason = skip_text(report)
            line = f"{word_of(report)} {report.nodeid}"
            lines.append(f"{line} - {reason}" if reason else line)
    return lines


def skip_text(report: Any) -> str:
    """The reason an item was skipped with, without pytest's "Skipped: " prefix, nor the
    outcome word the line already leads with (`items.with_outcome`)."""
    longrepr = report.longrepr
    if not (isinstance(longrepr, tuple) and len(longrepr) == 3):
        return ""
    text = str(longrepr[2]).removeprefix("Skipped: ")
    status = (getattr(report, REPORT_ATTR, None) or {}).get("status")
    if status and (text == status or text.startswith(f"{status}: ")):
        text = text[len(status) :].removeprefix(": ")
    return text


def _pytest_printed(stats: dict[str, list[Any]], chars: Iterable[str]) -> bool:
    """Whether pytest's own short summary had lines (and so printed its header)."""
    return any(stats.get(_PYTEST_CHARS[c]) for c in chars if c in _PYTEST_CHARS)


class WhyFirst:
    """A failure report whose one-line form says why (a no_match's judge's why).

    pytest's short summary (`-ra`) puts `longrepr.reprcrash.message` after a failed item's id;
    our reports are plain text, so the line said only `NO_MATCH <id>`. Put on the controller's
    reports just before the summary (a report from an xdist worker arrives as text), it prints
    the same lines as the text did.
    """

    def __init__(self, text: str, why: str) -> None:
        self.text = text
        self.reprcrash = _Crash(why)

    def toterminal(self, tw: Any) -> None:
        for line in self.text.splitlines():
            tw.line(line)

    def __str__(self) -> str:
        return self.text


class _Crash:
    def __init__(self, message: str) -> None:
        self.message = message


def lead_with_why(reports: Iterable[Any]) -> None:
    """Give each failed eval item's report a one-line message: a no_match's judge's why, a
    contaminated attempt's reasons."""
    for report in reports:
        result = getattr(report, REPORT_ATTR, None) or {}
        if not isinstance(report.longrepr, str):
            continue
        why = ""
        if result.get("status") == "no_match":
            why = " ".join(str(result.get("why") or "").split())
        elif result.get("status") == "contaminated":
            lines = report.longrepr.splitlines()
            why = next((line for line in lines if line.startswith("contaminated: ")), "")
        if why:
            report.longrepr = WhyFirst(report.longrepr, why)


class ShortSummary:
    """Adds our categories' lines to the short test summary (controller)."""

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> Generator[None, None, None]:
        """Runs outside pytest's own summary wrapper, so its lines follow pytest's (controller)."""
        stats = terminalreporter.stats
        lead_with_why([*stats.get("failed", []), *stats.get("error", [])])
        yield
        chars = terminalreporter.reportchars
        if "s" not in chars:
            return
        config = terminalreporter.config

        def word(report: Any) -> str:
            _category, _short, verbose = config.hook.pytest_report_teststatus(
                report=report, config=config
            )
            return verbose if isinstance(verbose, str) else str(verbose[0])

        lines = eval_lines(terminalreporter.stats, word)
        if not lines:
            return
        if not _pytest_printed(terminalreporter.stats, chars):
            terminalreporter.write_sep("=", "short test summary info", cyan=True, bold=True)
        for line in lines:
            terminalreporter.write_line(line)
