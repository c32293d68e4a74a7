"""Progress while a long run runs: done, in flight, waiting on the rate limit, cost so far.

Three parts:
- :class:`ProgressModel`, the counters one process's runtime updates (items started and
  finished, their cost) plus the limiter's count of requests sleeping for budget;
- :class:`ProgressPublisher`, which an xdist worker runs to rewrite its counters atomically
  into `<state dir>/progress-<worker>.json` at most every 0.5 s;
- :class:`ProgressReporter`, a plugin on the controller that sums its own model and the
  workers' files and shows one line: rewritten in place at the end of pytest's own progress
  line on a terminal at the default verbosity, a plain line every 30 s otherwise (CI logs,
  `-v`), nothing under `-q`.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from collections.abc import Generator, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

import pytest
from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    from pytest_evalloop.model_api.ratelimit import RunLimiter

PUBLISH_EVERY_S = 0.5
PLAIN_EVERY_S = 30.0
TICK_S = 0.5
FILE_PREFIX = "progress-"
EVAL_FILES = ("cases.jsonl", "judge-regressions.jsonl")
MIN_TAIL = 24
"""Narrower room than this at the end of the line: skip the in-place status this time."""


class ProgressSnapshot(BaseModel):
    """One process's counters at one moment (or their sum over processes)."""

    done: int = 0
    in_flight: int = 0
    waiting: int = 0
    errors: int = 0
    cost_usd: float | None = 0.0
    """Cost of the finished items; None once any of them used a model without a known price."""

    @classmethod
    def combine(cls, parts: Iterable[ProgressSnapshot]) -> ProgressSnapshot:
        """The sum over processes; the cost is unknown as soon as one part's is."""
        total = cls()
        for part in parts:
            total.done += part.done
            total.in_flight += part.in_flight
            total.waiting += part.waiting
            total.errors += part.errors
            if total.cost_usd is None or part.cost_usd is None:
                total.cost_usd = None
            else:
                total.cost_usd += part.cost_usd
        return total


def result_cost(result: Any) -> float | None:
    """What one item's result cost (answerer + judge); None when a used model has no price.

    Takes an `ItemResult` or its JSON dump (what crosses from an xdist worker).
    """
    data = result if isinstance(result, Mapping) else result.model_dump()
    total = 0.0
    for role in ("answerer", "judge"):
        cost = data.get(f"{role}_cost")
        usage = data.get(f"{role}_usage") or {}
        used = bool(usage.get("input_tokens") or usage.get("output_tokens"))
        if cost is None and used:
            return None
        total += cost or 0.0
    return total


class ProgressModel:
    """The counters of one process's runtime (thread-safe: callbacks land on other threads)."""

    def __init__(self, limiter: RunLimiter | None = None) -> None:
        self.limiter = limiter
        self._lock = threading.Lock()
        self._snap = ProgressSnapshot()

    def started(self) -> None:
        """An item's pipeline was scheduled."""
        with self._lock:
            self._snap.in_flight += 1

    def finished(self, *, error: bool = False, cost_usd: float | None = 0.0) -> None:
        """An item's pipeline ended (`error`: a harness error or contamination)."""
        with self._lock:
            snap = self._snap
            snap.in_flight = max(0, snap.in_flight - 1)
            snap.done += 1
            snap.errors += int(error)
            if snap.cost_usd is None or cost_usd is None:
                snap.cost_usd = None
            else:
                snap.cost_usd += cost_usd

    def finished_result(self, result: Any) -> None:
        """An item's pipeline ended with this `ItemResult`."""
        error = result.status in ("harness_error", "contaminated")
        self.finished(error=error, cost_usd=result_cost(result))

    def abandoned(self) -> None:
        """An item's pipeline was cancelled or crashed before a result: no longer in flight."""
        with self._lock:
            self._snap.in_flight = max(0, self._snap.in_flight - 1)

    def snapshot(self) -> ProgressSnapshot:
        """A copy of the counters now, with the limiter's current waiters."""
        with self._lock:
            snap = self._snap.model_copy()
        snap.waiting = self.limiter.waiting if self.limiter is not None else 0
        return snap


# --- across processes ------------------------------------------------------------------------


def progress_file(state_dir: Path, name: str) -> Path:
    """Where the process called `name` (an xdist worker id) publishes its counters."""
    return state_dir / f"{FILE_PREFIX}{name}.json"


def write_snapshot(path: Path, snap: ProgressSnapshot) -> None:
    """Replace `path` with `snap` atomically: a reader sees the old file or the new, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(snap.model_dump_json())
    os.replace(tmp, path)


def read_snapshots(state_dir: Path) -> list[ProgressSnapshot]:
    """Every worker's last published counters (unreadable files are skipped)."""
    if not state_dir.is_dir():
        return []
    snaps = []
    for path in sorted(state_dir.glob(f"{FILE_PREFIX}*.json")):
        try:
            snaps.append(ProgressSnapshot.model_validate_json(path.read_text()))
        except (OSError, ValidationError):
            continue
    return snaps


class ProgressPublisher:
    """A daemon thread that publishes a model's counters when they change (an xdist worker)."""

    def __init__(self, model: ProgressModel, path: Path, every_s: float = PUBLISH_EVERY_S) -> None:
        self.model = model
        self.path = path
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: ProgressSnapshot | None = None

    def start(self) -> None:
        """Publish now, then whenever the counters change, at most every `every_s`."""
        self.publish()
        self._thread = threading.Thread(target=self._run, name="evalloop-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.publish()

    def publish(self) -> None:
        """Write the counters if they changed since the last write."""
        snap = self.model.snapshot()
        if snap == self._last:
            return
        with contextlib.suppress(OSError):  # progress is advisory: never fail the run over it
            write_snapshot(self.path, snap)
            self._last = snap

    def stop(self) -> None:
        """Stop the thread and publish the final counters."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.publish()


# --- the text --------------------------------------------------------------------------------


def status_text(snap: ProgressSnapshot, total: int | None = None) -> str:
    """`evalloop: 120/500 done, 64 in flight, 3 waiting on the rate limit, $4.21 so far`."""
    done = f"{snap.done}/{total}" if total else str(snap.done)
    parts = [f"{done} done", f"{snap.in_flight} in flight"]
    if snap.waiting:
        parts.append(f"{snap.waiting} waiting on the rate limit")
    if snap.errors:
        parts.append(f"{snap.errors} harness error{'s' if snap.errors != 1 else ''}")
    if snap.cost_usd is None:
        parts.append("cost unknown (a model has no price)")
    else:
        parts.append(f"${snap.cost_usd:.2f} so far")
    return "evalloop: " + ", ".join(parts)


def count_eval_ids(nodeids: Iterable[str]) -> int:
    """How many node ids are evalloop items (`…/cases.jsonl::…`), from ids alone (xdist)."""
    count = 0
    for nodeid in nodeids:
        path = nodeid.split("::", 1)[0]
        count += path.rsplit("/", 1)[-1] in EVAL_FILES and "::" in nodeid
    return count


# --- the display (controller) ----------------------------------------------------------------


class ProgressReporter:
    """Shows the run's progress in pytest's terminal (a plugin on the controller).

    Display mode, fixed when the test loop starts: `off` under `-q` (or when nothing is
    evalloop's), `inplace` on a terminal at verbosity 0 (a status tail after pytest's own
    progress characters, rewritten by a timer thread), `plain` otherwise (one line every
    `plain_every_s`). The tail is written straight to the terminal's stream, outside pytest's
    line accounting, and erased before pytest writes a report, so pytest's own layout holds.
    """

    def __init__(
        self,
        config: pytest.Config,
        state_dir: Path | None = None,
        local: ProgressModel | None = None,
        *,
        plain_every_s: float = PLAIN_EVERY_S,
        tick_s: float = TICK_S,
    ) -> None:
        self.config = config
        self.state_dir = state_dir
        self.local = local
        self.plain_every_s = plain_every_s
        self.tick_s = tick_s
        self.total: int | None = None
        self.mode = "off"
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = 0
        self._last_plain = 0.0
        self._stream: TextIO | None = None
        self._own_stream = False

    # --- figures ---

    def snapshot(self) -> ProgressSnapshot:
        """The run's counters now: this process's model plus every worker's file."""
        parts = [self.local.snapshot()] if self.local is not None else []
        if self.state_dir is not None:
            parts.extend(read_snapshots(self.state_dir))
        return ProgressSnapshot.combine(parts)

    def text(self) -> str:
        """The status line now."""
        return status_text(self.snapshot(), self.total)

    # --- collection: how many items there are ---

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Count the case items this process collected (no xdist)."""
        from pytest_evalloop.items import CaseItem

        self.total = sum(isinstance(item, CaseItem) for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """Count the case items from the ids a worker collected (each collects them all)."""
        self.total = max(self.total or 0, count_eval_ids(ids))

    # --- the loop: start and stop the timer ---

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        """Show progress while the items run (trylast: erased before pytest's 100%)."""
        self.mode = self._choose_mode()
        if self.mode != "off":
            reporter = self._reporter()
            self._stream = _terminal_stream(reporter)
            self._own_stream = self._stream is not getattr(reporter._tw, "_file", None)
            self._last_plain = time.monotonic()
            self._thread = threading.Thread(
                target=self._tick, name="evalloop-progress-display", daemon=True
            )
            self._thread.start()
        try:
            return (yield)
        finally:
            self.stop()

    def _choose_mode(self) -> str:
        verbosity = self.config.get_verbosity()
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if verbosity < 0 or reporter is None:
            return "off"
        if verbosity == 0 and reporter.isatty():
            return "inplace"
        return "plain"

    def stop(self) -> None:
        """Stop the timer thread and erase the in-place tail."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        with self._lock:
            self._erase()
            if self._own_stream and self._stream is not None:
                self._stream.close()
            self._stream = None

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.refresh()

    def refresh(self) -> None:
        """Redraw the tail, or print the plain line when its interval has passed."""
        if self.mode == "off" or not self.total:
            return
        text = self.text()
        with self._lock:
            if self._stop.is_set():
                return
            if self.mode == "inplace":
                self._erase()
                self._draw(text)
            elif time.monotonic() - self._last_plain >= self.plain_every_s:
                self._last_plain = time.monotonic()
                self._plain_line(text)

    # --- pytest's own writes: keep the tail out of their way ---

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logstart(self) -> Generator[None, object, object]:
        """Hold the display while pytest writes (controller)."""
        with self._holding():
            return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logreport(self) -> Generator[None, object, object]:
        """Hold the display while pytest writes (controller)."""
        with self._holding():
            return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logfinish(self) -> Generator[None, object, object]:
        """Hold the display while pytest writes, then redraw at once (controller)."""
        with self._holding():
            result = yield
        self.refresh()
        return result

    @contextlib.contextmanager
    def _holding(self) -> Generator[None, None, None]:
        with self._lock:
            self._erase()
            yield

    # --- terminal output ---

    def _reporter(self) -> Any:
        return self.config.pluginmanager.get_plugin("terminalreporter")

    def _draw(self, text: str) -> None:
        if self._stream is None:
            return
        tw = self._reporter()._tw
        room = tw.fullwidth - tw.width_of_current_line - 1
        tail = ("  " + text)[:room]
        if len(tail) < MIN_TAIL:
            return
        self._stream.write(tail)
        self._stream.flush()
        self._shown = len(tail)

    def _erase(self) -> None:
        if not self._shown or self._stream is None:
            self._shown = 0
            return
        back = "\b" * self._shown
        self._stream.write(back + " " * self._shown + back)
        self._stream.flush()
        self._shown = 0

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


def _terminal_stream(reporter: Any) -> TextIO | None:
    """A stream onto pytest's terminal that output capturing cannot swallow.

    Without xdist the timer writes while an item runs, when pytest's capturing has fd 1 pointed
    at a temporary file; a duplicate of the terminal's descriptor taken before the loop starts
    still reaches the terminal. Writes there also bypass the terminal writer's line accounting,
    which is what lets the in-place tail be erased without pytest ever counting it.
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
