"""One line before each step of a session that can take longer than a second: installing the
Malloy server's npm tree, checking a Malloy package, starting a truth server, checking a set's
goldens, generating the example data. A user waiting on a silent terminal cannot tell work
from a hang; one line says what is happening and, for a step done once, that it is.

The steps run deep in the stages (a target, the data generator), far from pytest's terminal, so
the plugin hands this module where lines go (`set_writer`: the controller's terminal reporter;
nothing in an xdist worker, whose output would land inside the controller's live display); with
no writer set (a command other than pytest, a library call) a line goes to stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

_writer: Callable[[str], None] | None = None


def announce(text: str) -> None:
    """Say `evalloop: <text>` before a step that may take a while."""
    line = f"evalloop: {text}"
    writer = _writer
    if writer is None:
        print(line, file=sys.stderr, flush=True)
    else:
        writer(line)


def to_terminal(find_reporter: Callable[[], Any]) -> Callable[[str], None]:
    """A writer onto pytest's terminal reporter, looked up at each line (it is registered after
    the plugin configures), or stderr while there is none."""

    def write(line: str) -> None:
        reporter = find_reporter()
        if reporter is None:
            print(line, file=sys.stderr, flush=True)
        else:
            own_row(reporter)
            reporter.write_line(line)

    return write


def own_row(reporter: Any) -> None:
    """End the row pytest's terminal reporter left open, so the next line starts its own.
    `write_line` ends it only after a test file's name; under xdist the status line (`ready:
    1/2 workers`) and the run's `[100%]` stay open without one."""
    reporter.ensure_newline()
    if reporter._tw.width_of_current_line:
        reporter._tw.line()


def silent(_line: str) -> None:
    """The writer of a process whose lines nobody would see in place (an xdist worker)."""


def set_writer(writer: Callable[[str], None] | None) -> None:
    """Where `announce` writes from now on (None: stderr)."""
    global _writer
    _writer = writer
