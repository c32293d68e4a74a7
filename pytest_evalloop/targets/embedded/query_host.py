"""The child process that runs the answerer's SQL, under hard memory, time and reply limits.

Why a child process: DuckDB's `memory_limit` only governs the memory its buffer manager hands
out. An expression that builds one huge value (`SELECT len(range(80000000))`, a list of 80
million numbers) allocates outside it: measured in the pytest process, 7 GB against the 2 GB
limit. The same expression never checks for an interrupt, so it ran 14-16 s against a 10 s
time limit. A model can write any SQL, so neither limit held for every query, and breaking
one cost the whole run. Here each limit is held by something the query cannot get around:

- **Memory**: the child's data segment is capped by the kernel (`RLIMIT_DATA`, set by the
  child on itself before DuckDB loads). An allocation past it fails; DuckDB turns that into an
  out-of-memory error and Python into MemoryError, and the query is refused. DuckDB's own
  `memory_limit` is set below the cap so buffer-managed work (joins, sorts, aggregates) stops
  first with DuckDB's own error.
- **Time**: a watchdog in the child interrupts the query at the limit (what stops ordinary
  runaways); the parent waits for the reply until the limit plus `GRACE_S`, and past that kills
  the child and starts a fresh one. A query that ignores interrupts costs only itself: the
  other queries the killed child was running are sent again, once, to the new one (they are
  read-only, so running one twice is harmless).
- **Headroom**: a child left holding more than half its cap after a query (a heavy query's
  memory stays mapped for reuse) says so and is retired: new queries go to a fresh child, and
  the old one exits once its last query is answered.
- **Reply size**: the child stops adding rows once their JSON reaches `reply_bytes`, and
  refuses a query whose first row alone is larger. The parent never receives more.

The child also gets a minimal environment (no API keys or tokens), and exits when its stdin
closes, so it never outlives the process that started it.

Protocol: one JSON object per line. The parent sends `{"id", "sql"}`; the child first says
`{"ready": true}` (or `{"fatal": message}`), then answers each request with
`{"id", "columns", "rowCount", "rowCapHit", "byteCapHit"}`, a tab and the rows' JSON array, or
`{"id", "error": "refused"|"failed", "message"}`, and says `{"retire": true}` once it should
get no more requests.

This module is the host's side (starting the child, sending it queries, waiting, replacing
it); `query_child` is the child's, `query_limits` what both agree on.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_evalloop.targets.embedded.query_limits import (
    TEST_GATE_ENV,
    HostError,
    Limits,
    time_limit_text,
)

__all__ = ["GRACE_S", "QueryHost"]

# How long past the time limit the parent waits before it kills the child: the watchdog's
# interrupt stops an ordinary query at the limit, and turning its rows into JSON takes a moment.
GRACE_S = 1.0
# A child that has not said it is ready by then (a cold interpreter on a loaded machine takes
# a second or two) is treated as failed to start.
STARTUP_TIMEOUT_S = 60.0
# The environment the child keeps; everything else (API keys, tokens) stays out of it.
CHILD_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "SYSTEMROOT", TEST_GATE_ENV)


class QueryHost:
    """Runs SQL texts in a child process over one read-only snapshot file, under `limits`.

    Thread-safe: any number of threads may call `run` at once; the child runs their queries
    concurrently, each on its own cursor.
    """

    def __init__(self, snapshot: Path, limits: Limits) -> None:
        self.snapshot = snapshot
        self.limits = limits
        self._lock = threading.Lock()
        self._closed = False
        # Started now, without waiting: the child loads while the caller gets on with its work.
        self._slot = _Slot(self._spawn())
        # A host dropped without close() (a server nobody closes) still ends its child. The
        # slot, not the host, is what the finalizer and the child's reader thread hold.
        weakref.finalize(self, self._slot.hang_up)

    def run(self, sql: str) -> dict[str, Any]:
        """The child's reply to `sql` (columns, rows, counts); raises HostError when refused."""
        for _ in range(2):
            child = self._current()
            try:
                reply = child.ask(sql)
            except _Overran:
                self._replace(child)
                raise HostError(time_limit_text(self.limits.timeout_s), refused=True) from None
            if reply is not None:
                return _decode(reply)
            # The child stopped under this query (killed for another one's overrun, or dead
            # on its own): run it once more on a fresh child.
            self._replace(child)
        raise HostError(
            "query failed: the query engine stopped twice while running it (it may have run "
            f"out of memory, limit {self.limits.memory_mb} MB); aggregate or filter more",
            refused=False,
        )

    def close(self) -> None:
        """Stop the child (it also stops by itself when this process ends)."""
        with self._lock:
            self._closed = True
            child = self._slot.child
        child.stop()

    @property
    def pid(self) -> int:
        """The current child's process id (for tests and measurements)."""
        return self._current().proc.pid

    def _current(self) -> _Child:
        with self._lock:
            if self._closed:
                raise HostError("query failed: the query engine was closed", refused=False)
            if self._slot.child.dead:
                self._slot.child = self._spawn()
            return self._slot.child

    def _spawn(self) -> _Child:
        # Weakly: the child's reader thread must not keep this host alive.
        return _Child.spawn(self.snapshot, self.limits, on_retire=weakref.WeakMethod(self._retire))

    def _replace(self, child: _Child) -> None:
        child.kill()
        self._retire(child)

    def _retire(self, child: _Child) -> None:
        # New queries go to a fresh child; the old one finishes what it has (see _Child).
        with self._lock:
            if self._slot.child is child and not self._closed:
                self._slot.child = self._spawn()


class _Slot:
    """A host's current child."""

    def __init__(self, child: _Child) -> None:
        self.child = child

    def hang_up(self) -> None:
        """Close the current child's stdin, so it exits (without waiting for it)."""
        self.child.hang_up()


class _Overran(Exception):
    """The reply did not come by the time limit plus the grace."""


@dataclass
class _Pending:
    done: threading.Event
    reply: dict[str, Any] | None = None


class _Child:
    """One child process, its pending requests, and the thread reading its replies."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        limits: Limits,
        on_retire: Callable[[], Callable[[_Child], None] | None],
    ) -> None:
        self.proc = proc
        self.limits = limits
        self.on_retire = on_retire
        self.retiring = False
        self.ready = threading.Event()
        self.ready_at: float | None = None
        self.fatal: str | None = None
        self.dead = False
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._state = threading.Lock()
        self._write = threading.Lock()
        threading.Thread(target=self._read, name="evalloop-query-host", daemon=True).start()

    @classmethod
    def spawn(
        cls,
        snapshot: Path,
        limits: Limits,
        *,
        on_retire: Callable[[], Callable[[_Child], None] | None],
    ) -> _Child:
        package_root = str(Path(__file__).resolve().parents[3])
        boot = (
            f"import sys; sys.path.insert(0, {package_root!r}); "
            "from pytest_evalloop.targets.embedded.query_child import main; "
            "sys.exit(main(sys.argv[1:]))"
        )
        config = json.dumps({"snapshot": str(snapshot), **asdict(limits)})
        proc = subprocess.Popen(
            [sys.executable, "-c", boot, config],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=snapshot.parent,
            env={k: os.environ[k] for k in CHILD_ENV if k in os.environ},
            # Its own session: a Ctrl-C meant for pytest does not kill queries mid-reply.
            start_new_session=True,
        )
        return cls(proc, limits, on_retire)

    def ask(self, sql: str) -> dict[str, Any] | None:
        """The reply to `sql`, or None when the child stopped before replying."""
        pending = _Pending(threading.Event())
        with self._state:
            if self.dead:
                return None
            key = next(self._ids)
            self._pending[key] = pending
        line = json.dumps({"id": key, "sql": sql}).encode("utf-8") + b"\n"
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            with self._write:
                stdin.write(line)
                stdin.flush()
        except (OSError, ValueError):  # the child is gone (broken pipe, closed file)
            self._forget(key)
            return None
        sent = time.monotonic()
        if not self.ready.wait(STARTUP_TIMEOUT_S):
            self._forget(key)
            self.kill()
            raise HostError("query failed: the query engine did not start", refused=False)
        if self.fatal is not None:
            raise HostError(
                f"query failed: the query engine could not start: {self.fatal}", refused=False
            )
        # The limit counts from when the child could start on the query, not from its startup.
        start = max(sent, self.ready_at or sent)
        wait = start + self.limits.timeout_s + GRACE_S - time.monotonic()
        if pending.done.wait(max(wait, 0.0)):
            return pending.reply
        self._forget(key)
        raise _Overran

    def kill(self) -> None:
        """End the child now; its pending requests come back as None (see `_read`)."""
        if self.proc.poll() is None:
            self.proc.kill()

    def hang_up(self) -> None:
        """Close the child's stdin: it exits, and the reader thread reaps it."""
        stdin = self.proc.stdin
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.close()

    def stop(self) -> None:
        """End the child: close its stdin (it exits), kill it if it lingers, and reap it."""
        stdin = self.proc.stdin
        try:
            if stdin is not None:
                stdin.close()
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
            self.proc.wait()  # a SIGKILL cannot be ignored: this returns once it lands

    def _close_when_idle(self) -> None:
        # Closing stdin ends the child; a request that races it fails to write or is lost at
        # EOF, and either way is sent again to the fresh child.
        with self._state:
            idle = not self._pending
        stdin = self.proc.stdin
        if idle and stdin is not None:
            with contextlib.suppress(OSError), self._write:
                stdin.close()

    def _forget(self, key: int) -> None:
        with self._state:
            self._pending.pop(key, None)

    def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        try:
            for line in stdout:
                # A reply's rows follow its header after a tab (a header's JSON has none
                # unescaped): they stay text, so the tool's reply is spliced, not re-encoded.
                head, tab, rows = line.partition(b"\t")
                message = json.loads(head)
                if tab:
                    message["rowsJson"] = rows.rstrip(b"\n").decode("utf-8")
                if "ready" in message:
                    self.ready_at = time.monotonic()
                    self.ready.set()
                elif "fatal" in message:
                    self.fatal = str(message["fatal"])
                elif "retire" in message:
                    self.retiring = True
                    retire = self.on_retire()  # None once the host is gone
                    if retire is not None:
                        retire(self)
                else:
                    with self._state:
                        pending = self._pending.pop(message.get("id"), None)
                    if pending is not None:
                        pending.reply = message
                        pending.done.set()
                if self.retiring:
                    self._close_when_idle()
        except (OSError, ValueError):
            pass  # a torn last line of a killed child: it is gone either way
        finally:
            with self._state:
                self.dead = True
                lost = list(self._pending.values())
                self._pending.clear()
            self.ready.set()
            for pending in lost:
                pending.done.set()
            self.kill()
            self.proc.wait()  # reap it


def _decode(reply: dict[str, Any]) -> dict[str, Any]:
    error = reply.get("error")
    if error is not None:
        raise HostError(str(reply.get("message", "")), refused=error == "refused")
    return reply
