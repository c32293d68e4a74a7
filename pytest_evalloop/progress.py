"""Progress while a long run runs: done, in flight, waiting on the rate limit, cost so far.

Three parts:
- :class:`ProgressModel`, the counters one process's runtime updates (items started and
  finished, their cost) plus the limiter's count of requests sleeping for budget;
- :class:`ProgressPublisher`, which an xdist worker runs to rewrite its counters atomically
  into `<state dir>/progress-<worker>.json` at most every 0.5 s;
- the text: the status line's fields, fitted to a width by leaving whole fields out.

The display on the controller, which sums its own model and the workers' files, is
`pytest_evalloop.display`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop.ledger.files import read_bytes

if TYPE_CHECKING:
    from pytest_evalloop.model_api.ratelimit import RunLimiter

PUBLISH_EVERY_S = 0.5
FILE_PREFIX = "progress-"
EVAL_FILES = ("cases.jsonl", "judge-regressions.jsonl")


@dataclasses.dataclass
class ProgressSnapshot:
    """One process's counters at one moment (or their sum over processes).

    A dataclass, validated by pydantic only where it crosses processes (`read_snapshots`):
    every pytest start makes one, and most runs (a project's own tests) never read one.
    """

    done: int = 0
    in_flight: int = 0
    waiting: int = 0
    errors: int = 0
    cost_usd: float | None = 0.0
    """Cost of the finished items; None once any of them used a model without a known price."""

    # How pydantic checks a published file (a plain dict: no pydantic import to define it):
    # `true` or `"7"` is no count, and NaN or Infinity no cost.
    __pydantic_config__ = {"strict": True, "allow_inf_nan": False}

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
            snap = dataclasses.replace(self._snap)
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
    tmp.write_text(json.dumps(dataclasses.asdict(snap)))
    os.replace(tmp, path)


def read_snapshots(state_dir: Path) -> list[ProgressSnapshot]:
    """Every worker's last published counters (unreadable files are skipped)."""
    if not state_dir.is_dir():
        return []
    snaps = []
    for path in sorted(state_dir.glob(f"{FILE_PREFIX}*.json")):
        try:
            if os.lstat(path).st_size > SNAPSHOT_MAX_BYTES:
                continue  # no worker writes that much: read whole at every refresh, it stalled
            # As a ledger file is read: never a pipe (its open would stall the display) or a
            # link; bytes that are not UTF-8 fail validation like any other bad file.
            snaps.append(parse_snapshot(read_bytes(path)))
        except (OSError, ValueError):  # ValueError: pydantic's ValidationError among them
            continue
    return snaps


SNAPSHOT_MAX_BYTES = 4096
"""A worker's counters take under 200 bytes; a file larger than this is none of them."""


def parse_snapshot(text: str | bytes) -> ProgressSnapshot:
    """A published file's counters, checked: whole numbers and a finite cost, none below zero
    (a ValueError, pydantic's `ValidationError` among them, when they are not)."""
    snap: ProgressSnapshot = _snapshot_adapter().validate_json(text)
    counts = (snap.done, snap.in_flight, snap.waiting, snap.errors, snap.cost_usd or 0)
    if min(counts) < 0:
        raise ValueError(f"a progress counter below zero: {snap}")
    if (snap.cost_usd or 0) > MAX_COST_USD:
        # Finite alone is not enough: two files of 1e308 each add up to infinity.
        raise ValueError(f"a progress cost no session spends: {snap}")
    if max(counts[:4]) > MAX_COUNT:
        # A 400-digit count fits the file and no float: the rate's division raised.
        raise ValueError(f"a progress count no session reaches: {snap.done}")
    return snap


MAX_COST_USD = 1e12
"""The most a published file's cost may be: far above any session's spend, and small enough
that the sum over every process of a session stays a finite number."""
MAX_COUNT = 2**53
"""The most a published file's count may be: exact as a float, so every rate and ETA made
from the sums is a number."""


@functools.cache
def _snapshot_adapter() -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(ProgressSnapshot)


class ProgressPublisher:
    """A daemon thread that publishes a model's counters when they change (an xdist worker)."""

    def __init__(self, model: ProgressModel, path: Path, every_s: float = PUBLISH_EVERY_S) -> None:
        self.model = model
        self.path = path
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: ProgressSnapshot | None = None
        self._writing = threading.Lock()
        """The thread and the final `stop` write through one temporary file name."""

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
        with self._writing:
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


def status_fields(
    snap: ProgressSnapshot, total: int | None = None, elapsed_s: float | None = None
) -> list[str]:
    """The status line's fields, the head first: `evalloop: 120/500 done`, `64 in flight`,
    `3 waiting on the rate limit`, `1 error` (harness errors and contaminated attempts), `2.1/s`, `ETA 3m10s`, `$4.21 so far`.

    Rate and ETA are the mean since the items started (`elapsed_s`), shown once one is done."""
    done = f"{snap.done}/{total}" if total else str(snap.done)
    fields = [f"evalloop: {done} done", f"{snap.in_flight} in flight"]
    if snap.waiting:
        fields.append(f"{snap.waiting} waiting on the rate limit")
    if snap.errors:
        fields.append(f"{snap.errors} error{'s' if snap.errors != 1 else ''}")
    if snap.done and elapsed_s:
        rate = snap.done / elapsed_s
        fields.append(rate_text(rate))
        if total and total > snap.done:
            fields.append(f"ETA {duration_text((total - snap.done) / rate)}")
    if snap.cost_usd is None:
        fields.append("cost unknown (a model has no price)")
    else:
        fields.append(f"${snap.cost_usd:.2f} so far")
    return fields


def status_text(
    snap: ProgressSnapshot,
    total: int | None = None,
    elapsed_s: float | None = None,
    width: int | None = None,
) -> str:
    """`evalloop: 120/500 done, 64 in flight, 2.1/s, ETA 3m10s, $4.21 so far`, fitted to
    `width` (`fit`)."""
    return fit(status_fields(snap, total, elapsed_s), width)


def final_text(
    snap: ProgressSnapshot, total: int | None, elapsed_s: float, width: int | None = None
) -> str:
    """The line that stays once the items ran: `evalloop: 44/44 done in 21 s (2.1/s), $1.23
    spent, 1 error`."""
    done = f"{snap.done}/{total}" if total else str(snap.done)
    head = f"evalloop: {done} done in {duration_text(elapsed_s)}"
    if snap.done and elapsed_s > 0:
        head += f" ({rate_text(snap.done / elapsed_s)})"
    fields = [head]
    fields.append(
        "cost unknown (a model has no price)"
        if snap.cost_usd is None
        else f"${snap.cost_usd:.2f} spent"
    )
    if snap.errors:
        fields.append(f"{snap.errors} error{'s' if snap.errors != 1 else ''}")
    return fit(fields, width)


DROP_ORDER = ("/s", "/min", "waiting on the rate limit", "in flight", "ETA ", " error")
"""Which fields give way first when the line is too wide (by a part of their text); the head
and the cost stay longest."""


def fit(fields: list[str], width: int | None) -> str:
    """The fields joined by ", ", whole fields left out (`DROP_ORDER`, then from the end) until
    the line fits in `width` columns; never a field cut. Empty when even the head does not fit."""
    kept = list(fields)
    if width is None:
        return ", ".join(kept)

    def wide(parts: list[str]) -> bool:
        return len(", ".join(parts)) > width

    for part in DROP_ORDER:
        if not wide(kept):
            break
        kept = [kept[0], *(f for f in kept[1:] if part not in f)]
    while len(kept) > 1 and wide(kept):
        kept.pop()
    return "" if wide(kept) else ", ".join(kept)


def rate_text(per_second: float) -> str:
    """`2.1/s`, or `4.0/min` under one a second."""
    return f"{per_second:.1f}/s" if per_second >= 1 else f"{per_second * 60:.1f}/min"


def duration_text(seconds: float) -> str:
    """`45 s`, `3m10s`, `1h05m`."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def count_eval_ids(nodeids: Iterable[str]) -> int:
    """How many node ids are evalloop items (`…/cases.jsonl::…`), from ids alone (xdist)."""
    count = 0
    for nodeid in nodeids:
        path = nodeid.split("::", 1)[0]
        count += path.rsplit("/", 1)[-1] in EVAL_FILES and "::" in nodeid
    return count
