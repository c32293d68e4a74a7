"""The progress display of a run, on the controller: a live status line on a terminal, plain
periodic lines elsewhere, and a final line that stays.

Mode, fixed when the test loop starts: `off` under `-q` (or with no terminal reporter);
`live` on a terminal at the default verbosity; `plain` otherwise (a CI log, `-v`).

- **live**: rich's live display (`rich.live.Live`, imported only here and only then) owns the
  bottom of the terminal: the line pytest is writing (its file name and progress characters)
  and under it the status (`progress.status_text`), redrawn in place every `tick_s` and after
  each item. pytest's terminal writer is pointed at a small file object for the loop: each line
  pytest finishes is printed above the live area, the line it is still writing is drawn as its
  first row, so pytest's own layout is kept and the status never shares its row.
- **plain**: a line every `plain_every_s`, put between pytest's lines.

Every line is fitted to the terminal's width by leaving whole fields out (`progress.fit`),
never by cutting one. When the loop ends the live area is cleared and one final line
(`progress.final_text`) is written through pytest's reporter, where it stays.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, TextIO, cast

import pytest

from pytest_evalloop import steps
from pytest_evalloop.options import answers_no_case
from pytest_evalloop.progress import (
    ProgressModel,
    ProgressPublisher,
    ProgressSnapshot,
    count_eval_ids,
    final_text,
    progress_file,
    read_snapshots,
    status_text,
)
from pytest_evalloop.steps import own_row

PLAIN_EVERY_S = 30.0
TICK_S = 0.5


def start_display(config: pytest.Config, session_id: str) -> None:
    """One rate limit for the session's processes, its progress counters (`PROGRESS_KEY`, fed
    by the runtime), where step lines go and, on the controller, the display (every process)."""
    import shutil

    from pytest_evalloop.model_api.ratelimit import RunLimiter, session_state_dir
    from pytest_evalloop.stash import LIMITER_KEY, PROGRESS_KEY, SETTINGS_KEY

    settings = config.stash[SETTINGS_KEY]
    state_dir = session_state_dir(session_id)
    rpm, tpm = settings.limiter_rates
    limiter = RunLimiter(state_dir, rpm=rpm, tpm=tpm)
    config.stash[LIMITER_KEY] = limiter
    progress = config.stash[PROGRESS_KEY] = ProgressModel(limiter)
    worker = getattr(config, "workerinput", None)
    plugins = config.pluginmanager
    steps.set_writer(
        steps.silent
        if worker is not None
        else steps.to_terminal(lambda: plugins.get_plugin("terminalreporter"))
    )
    config.add_cleanup(lambda: steps.set_writer(None))
    if worker is not None:
        publisher = ProgressPublisher(progress, progress_file(state_dir, worker["workerid"]))
        publisher.start()
        plugins.register(LastCounts(publisher), "evalloop-progress-publisher")
        config.add_cleanup(publisher.stop)
        return
    if not settings.verify_goldens and not settings.check_judge:
        plugins.register(ProgressReporter(config, state_dir, progress), "evalloop-progress")
    config.add_cleanup(lambda: shutil.rmtree(state_dir, ignore_errors=True))


class LastCounts:
    """Publishes a worker's last counters as its items end (a plugin in an xdist worker)."""

    def __init__(self, publisher: Any) -> None:
        self.publisher = publisher

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self) -> Generator[None, object, object]:
        """Publish before this worker tells the controller it is done (worker): the controller
        writes the final line from the workers' files once every worker is, and a publish left
        to the timer or to the worker's cleanup could come after it."""
        try:
            return (yield)
        finally:
            self.publisher.stop()


class ProgressReporter:
    """Shows the run's progress in pytest's terminal (a plugin on the controller)."""

    def __init__(
        self,
        config: pytest.Config,
        state_dir: Path | None = None,
        local: ProgressModel | None = None,
        *,
        plain_every_s: float = PLAIN_EVERY_S,
        tick_s: float = TICK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.state_dir = state_dir
        self.local = local
        self.plain_every_s = plain_every_s
        self.tick_s = tick_s
        self.clock = clock
        self.total: int | None = None
        self.mode = "off"
        self.started: float | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_plain = 0.0
        self._stream: TextIO | None = None
        self._own_stream = False
        self._live: Any = None
        self._pytest_file: Any = None
        self._open_line = ""
        """What pytest wrote of the line it has not finished (live mode)."""

    # --- figures ---

    def snapshot(self) -> ProgressSnapshot:
        """The run's counters now: this process's model plus every worker's file."""
        parts = [self.local.snapshot()] if self.local is not None else []
        if self.state_dir is not None:
            parts.extend(read_snapshots(self.state_dir))
        return ProgressSnapshot.combine(parts)

    def elapsed(self) -> float | None:
        return None if self.started is None else max(0.0, self.clock() - self.started)

    def text(self, width: int | None = None) -> str:
        """The status line now, fitted to `width`; none while no case item is known (a session
        of plain tests, or before xdist's workers have collected)."""
        if not self.total:
            return ""
        return status_text(self.snapshot(), self.total, self.elapsed(), width)

    # --- collection: how many items there are ---

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Count the case items this process collected (no xdist)."""
        from pytest_evalloop.items import CaseItem

        self.total = sum(isinstance(item, CaseItem) for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """Count the case items from the ids a worker collected (each collects them all)."""

        self.total = max(self.total or 0, count_eval_ids(ids))
        self._begin_if_due()

    # --- the loop: start and stop ---

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        """Show progress while the items run, then the final line (controller). tryfirst: the
        outermost wrapper, so pytest's own wrapper has written its deferred `[100%]` (through
        the live display) before the final line goes under it."""
        # No case item collected here (without xdist, collection is done): nothing to show.
        self.mode = "off" if self.total == 0 else self._choose_mode()
        if self.mode != "off":
            self.started = self.clock()
            self._begin_if_due()
        try:
            return (yield)
        finally:
            self.stop()

    def _begin_if_due(self) -> None:
        """Take the terminal once a case item is known: at once without xdist, else when the
        workers' collection names one. A session of plain tests never has it taken."""
        if self.mode == "off" or not self.total or self._thread is not None:
            return
        if self._stop.is_set():
            return
        reporter = self._reporter()
        self._stream = _terminal_stream(reporter)
        self._own_stream = self._stream is not getattr(reporter._tw, "_file", None)
        self._last_plain = time.monotonic()
        if self.mode == "live" and self._stream is not None:
            self._start_live(reporter)
        self._thread = threading.Thread(
            target=self._tick, name="evalloop-progress-display", daemon=True
        )
        self._thread.start()

    def _choose_mode(self) -> str:
        verbosity = self.config.get_verbosity()
        reporter = self._reporter()
        if verbosity < 0 or reporter is None or answers_no_case(self.config.option):
            return "off"  # (nothing runs under --collect-only: "0/44 done" would be false)
        if verbosity == 0 and reporter.isatty():
            return "live"
        return "plain"

    def stop(self) -> None:
        """Stop the timer, clear the live area, give pytest its file back and write the final
        line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        with self._lock:
            self._stop_live()
            if self.mode != "off" and self.total:
                reporter = self._reporter()
                elapsed = self.elapsed() or 0.0
                line = final_text(self.snapshot(), self.total, elapsed, reporter._tw.fullwidth - 1)
                if line:
                    own_row(reporter)
                    reporter.write_line(line)
            if self._own_stream and self._stream is not None:
                self._stream.close()
            self._stream = None

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.refresh()

    def refresh(self) -> None:
        """Redraw the live status, or print the plain line when its interval has passed."""
        if self.mode == "off" or not self.total:
            return
        with self._lock:
            if self._stop.is_set():
                return
            if self.mode == "live":
                self._draw(self.text(self._width()))
            elif time.monotonic() - self._last_plain >= self.plain_every_s:
                self._last_plain = time.monotonic()
                text = self.text(self._width())
                if text:
                    self._plain_line(text)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logfinish(self) -> Generator[None, object, object]:
        """Hold the display while pytest writes, then redraw at once (controller)."""
        with self._holding():
            result = yield
        self.refresh()
        return result

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logstart(self) -> Generator[None, object, object]:
        """Hold the display while pytest writes (controller)."""
        self._begin_if_due()  # a total another plugin set after the workers' collection
        with self._holding():
            return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logreport(self) -> Generator[None, object, object]:
        """Hold the display while pytest writes (controller)."""
        with self._holding():
            return (yield)

    @contextlib.contextmanager
    def _holding(self) -> Generator[None, None, None]:
        with self._lock:
            yield

    # --- live mode ---

    def _reporter(self) -> Any:
        return self.config.pluginmanager.get_plugin("terminalreporter")

    def _width(self) -> int:
        # Asked of the terminal's own duplicate descriptor: while an item runs, pytest's capture
        # points fd 1 at a file, and the writer's width then falls back to 80 columns.
        # $COLUMNS still wins, as it does for pytest's own writer.
        columns = 0
        if not os.environ.get("COLUMNS"):
            try:
                columns = os.get_terminal_size(self._stream.fileno()).columns  # type: ignore[union-attr]
            except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
                columns = 0
        return (columns or int(self._reporter()._tw.fullwidth)) - 1

    def _start_live(self, reporter: Any) -> None:
        from rich.console import Console
        from rich.live import Live

        console = Console(
            file=self._stream,
            force_terminal=True,
            width=self._width() + 1,
            highlight=False,
            markup=False,
            emoji=False,
        )
        self._live = Live(
            console=console,
            auto_refresh=False,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()
        self._pytest_file = reporter._tw._file
        reporter._tw._file = _LineSplitter(self)

    def _stop_live(self) -> None:
        if self._live is None:
            return
        live, self._live = self._live, None
        live.stop()  # transient: the live area is cleared
        reporter = self._reporter()
        reporter._tw._file = self._pytest_file
        if self._open_line:
            # pytest's unfinished line, back where pytest expects it to be.
            self._pytest_file.write(self._open_line)
            self._pytest_file.flush()
            self._open_line = ""

    def _renderable(self, status: str) -> Any:
        from rich.console import Group
        from rich.text import Text

        rows = [Text(status, no_wrap=True, overflow="crop")] if status else []
        if self._open_line:
            rows.insert(0, Text.from_ansi(self._open_line, no_wrap=True, overflow="crop"))
        return Group(*rows)

    def _draw(self, text: str) -> None:
        """Redraw the live area (pytest's open line, then `text`)."""
        if self._live is None:
            return
        self._live.console.width = self._width() + 1
        self._live.update(self._renderable(text), refresh=True)

    def take_write(self, data: str) -> None:
        """What pytest's terminal writer writes while the live display runs (live mode)."""
        from rich.text import Text

        with self._lock:
            if self._live is None:
                return
            pending = self._open_line + data
            *finished, self._open_line = pending.split("\n")
            for line in finished:
                # A carriage return starts the line over (xdist's rewritten status lines).
                shown = line.rsplit("\r", 1)[-1]
                self._live.console.print(Text.from_ansi(shown), soft_wrap=True)
            self._open_line = self._open_line.rsplit("\r", 1)[-1]
            self._draw(self.text(self._width()))

    # --- plain mode ---

    def _plain_line(self, text: str) -> None:
        if self._stream is None:
            return
        reporter = self._reporter()
        tw = reporter._tw
        line = tw._current_line
        if reporter.currentfspath == -2:
            # pytest finished this line and defers its newline: put ours after it and leave
            # ours open, so pytest's next write starts a fresh line as it would have.
            self._stream.write("\n" + text)
            tw._current_line = text
        elif line:
            # A line pytest is still writing (progress characters, or a test id awaiting its
            # outcome): put ours above it by repeating it below, and pytest carries on there.
            self._stream.write("\n" + text + "\n" + line)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()


class _LineSplitter(io.TextIOBase):
    """pytest's terminal file while the live display runs: hands every write to the display."""

    def __init__(self, reporter: ProgressReporter) -> None:
        self.reporter = reporter

    def write(self, data: str) -> int:
        self.reporter.take_write(data)
        return len(data)

    def flush(self) -> None:
        """Each write is drawn when it is made."""

    def isatty(self) -> bool:
        return True


def _terminal_stream(reporter: Any) -> TextIO | None:
    """A stream onto pytest's terminal that output capturing cannot swallow.

    Without xdist the timer writes while an item runs, when pytest's capturing has fd 1 pointed
    at a temporary file; a duplicate of the terminal's descriptor taken before the loop starts
    still reaches the terminal. Writes there also bypass the terminal writer's line accounting.
    """
    file = getattr(getattr(reporter, "_tw", None), "_file", None)
    if file is None:
        return None
    try:
        fd = os.dup(file.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return cast("TextIO", file)  # not a real file (an in-process pytester run)
    encoding = getattr(file, "encoding", None) or "utf-8"
    return open(fd, "w", encoding=encoding, errors="replace", closefd=True)  # noqa: SIM115
