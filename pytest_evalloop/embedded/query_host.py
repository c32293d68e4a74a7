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
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import itertools
import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb

__all__ = ["GRACE_S", "Limits", "QueryHost", "json_safe", "locked_config"]

# How long past the time limit the parent waits before it kills the child: the watchdog's
# interrupt stops an ordinary query at the limit, and turning its rows into JSON takes a moment.
GRACE_S = 1.0
# A child that has not said it is ready by then (a cold interpreter on a loaded machine takes
# a second or two) is treated as failed to start.
STARTUP_TIMEOUT_S = 60.0
# Rows are fetched and measured in batches, so the byte cap stops the fetch early.
FETCH_BATCH = 128
# DuckDB's own memory_limit, as a share of the process cap: the rest is the interpreter,
# DuckDB's code and threads, and what is allocated outside the buffer manager.
DUCKDB_SHARE = 0.75
# At most this many DuckDB threads: every thread's stack counts against the memory cap, and the
# answerer's small queries gain nothing from more.
MAX_THREADS = 4
# A child whose data segment is above this share of its cap after a query retires: the memory
# a failed heavy query leaves mapped (DuckDB's allocator keeps it for reuse) would otherwise
# leave the next query too little room. Ordinary queries keep it under 10%.
RETIRE_SHARE = 0.5
# The environment the child keeps; everything else (API keys, tokens) stays out of it.
CHILD_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "SYSTEMROOT")


@dataclass(frozen=True)
class Limits:
    """What one query may take."""

    timeout_s: float = 10.0
    row_cap: int = 1000
    reply_bytes: int = 1_000_000
    """At most this many bytes of JSON for the reply's rows."""
    memory_mb: int = 2048
    """The query process's whole data memory (the kernel's RLIMIT_DATA on the child)."""

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be positive, got {value}"
            for name, value in asdict(self).items()
            if not value > 0
        ]
        if self.memory_mb < 256:
            problems.append(f"memory_mb must be at least 256, got {self.memory_mb}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def duckdb_memory_mb(self) -> int:
        """DuckDB's own `memory_limit`, below the process cap."""
        return int(self.memory_mb * DUCKDB_SHARE)


def locked_config(memory_mb: int) -> dict[str, str | bool | int | float | list[str]]:
    """The configuration every sandbox database is created with (see docs/embedded-target.md).

    Every lock is part of the configuration, so no statement ever runs on an unlocked
    database. Python replacement scans would let `FROM some_name` read a Python variable of a
    calling frame; an empty temp_directory stops spilling to disk.
    """
    return {
        "python_enable_replacements": False,
        "temp_directory": "",
        "memory_limit": f"{memory_mb}MB",
        "enable_external_access": False,
        "allow_community_extensions": False,
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "lock_configuration": True,
    }


class HostError(Exception):
    """A query the host could not answer; `refused` says whether it was the query's fault."""

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


# --- the parent side -----------------------------------------------------------------------


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
        package_root = str(Path(__file__).resolve().parents[2])
        boot = (
            f"import sys; sys.path.insert(0, {package_root!r}); "
            "from pytest_evalloop.embedded.query_host import main; sys.exit(main(sys.argv[1:]))"
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
        """End the child: close its stdin (it exits), then kill it if it lingers."""
        stdin = self.proc.stdin
        try:
            if stdin is not None:
                stdin.close()
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()

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


def time_limit_text(timeout_s: float) -> str:
    """What the answerer reads when its query ran past the time limit."""
    return (
        f"query stopped: it ran past the time limit of {timeout_s:g} s; "
        "aggregate or filter more so it finishes sooner"
    )


# --- the child side ------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """The child: cap memory, open the snapshot locked, answer requests until stdin closes."""
    config = json.loads(argv[0])
    snapshot = Path(config.pop("snapshot"))
    limits = Limits(**config)
    # The protocol gets its own copy of the pipe, and file descriptor 1 goes to /dev/null: no
    # stray write to stdout (DuckDB's progress bar on a slow query, which cannot be switched
    # off once the configuration is locked; any library's print) can tear a reply.
    protocol = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    out = _Out(protocol)
    _cap_memory(limits.memory_mb * 1024 * 1024)
    try:
        import duckdb

        settings = locked_config(limits.duckdb_memory_mb)
        settings["threads"] = max(1, min(MAX_THREADS, os.cpu_count() or 1))
        con = duckdb.connect(str(snapshot), read_only=True, config=settings)
    except Exception as exc:  # reported to the parent, which names it to the caller
        out.send({"fatal": f"{type(exc).__name__}: {_first_line(exc)}"})
        return 1
    out.send({"ready": True})
    cursors = threading.Lock()
    watchdog = _Watchdog()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        with cursors:
            cur = con.cursor()
        args = (cur, request, limits, watchdog, out)
        threading.Thread(target=_answer, args=args, daemon=True).start()
    # stdin closed: the parent is done with us (or gone). Skip DuckDB's teardown of queries
    # still running; nothing here needs saving.
    out.flush()
    os._exit(0)


def _cap_memory(limit: int) -> None:
    try:
        import resource
    except ImportError:  # not a POSIX system: DuckDB's memory_limit and the time limit remain
        return
    data = getattr(resource, "RLIMIT_DATA", None)
    if data is not None:
        resource.setrlimit(data, (limit, limit))


class _Out:
    """Replies to the parent, one whole line at a time from any thread."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._retired = False

    def retire_once(self, heavy: bool) -> bool:
        """True the first time `heavy` is true: the one moment to ask for retirement."""
        with self._lock:
            if not heavy or self._retired:
                return False
            self._retired = True
            return True

    def send(self, message: dict[str, Any]) -> None:
        self.send_text(json.dumps(message))

    def send_text(self, text: str) -> None:
        data = text.encode("utf-8") + b"\n"
        with self._lock:
            self._stream.write(data)
            self._stream.flush()

    def flush(self) -> None:
        with self._lock:
            self._stream.flush()


def _answer(
    cur: duckdb.DuckDBPyConnection,
    request: dict[str, Any],
    limits: Limits,
    watchdog: _Watchdog,
    out: _Out,
) -> None:
    key = request.get("id")
    try:
        head, rows = _run(cur, str(request.get("sql", "")), limits, watchdog)
        out.send_text(f'{{"id": {json.dumps(key)}, {head[1:]}\t{rows}')
    except HostError as exc:
        kind = "refused" if exc.refused else "failed"
        out.send({"id": key, "error": kind, "message": str(exc)})
    except MemoryError:
        out.send({"id": key, "error": "refused", "message": memory_text(limits.memory_mb)})
    except Exception as exc:  # never leave the parent waiting for a reply that will not come
        message = f"query failed: {type(exc).__name__}: {_first_line(exc)}"
        out.send({"id": key, "error": "failed", "message": message})
    finally:
        cur.close()
    if out.retire_once(_data_bytes() > limits.memory_mb * 1024 * 1024 * RETIRE_SHARE):
        out.send({"retire": True})


def _data_bytes() -> int:
    """The size of this process's data segment, what RLIMIT_DATA caps (0 where unknown)."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            fields = handle.read().split()
    except OSError:
        return 0
    return int(fields[5]) * os.sysconf("SC_PAGE_SIZE")


def memory_text(memory_mb: int) -> str:
    """What the answerer reads when its query needed more memory than the limit."""
    return (
        f"query stopped: it needed more memory than the limit of {memory_mb} MB; aggregate or "
        "filter more, and build smaller lists and strings"
    )


def _run(
    cur: duckdb.DuckDBPyConnection, sql: str, limits: Limits, watchdog: _Watchdog
) -> tuple[str, str]:
    """A reply's header (columns and counts, as a JSON object) and its rows (a JSON array)."""
    import duckdb

    ticket = watchdog.watch(cur, limits.timeout_s)
    try:
        cur.execute(sql)
        columns = unique_columns([d[0] for d in cur.description or []])
        rows, count, row_cap_hit, byte_cap_hit = _rows_json(cur, columns, limits)
    except duckdb.InterruptException:
        raise HostError(time_limit_text(limits.timeout_s), refused=True) from None
    except duckdb.OutOfMemoryException:
        raise HostError(memory_text(limits.memory_mb), refused=True) from None
    except duckdb.PermissionException as exc:
        raise HostError(
            "query refused: it tried to reach something outside the model's sources "
            f"({_first_line(exc)}); query only the sources listed by get_context",
            refused=True,
        ) from None
    except duckdb.Error as exc:
        raise HostError(f"query failed: {_first_line(exc, keep=6)}", refused=False) from None
    finally:
        watchdog.release(ticket)
    head = json.dumps(
        {
            "columns": columns,
            "rowCount": count,
            "rowCapHit": row_cap_hit,
            "byteCapHit": byte_cap_hit,
        }
    )
    return head, rows


def _rows_json(
    cur: duckdb.DuckDBPyConnection, columns: list[str], limits: Limits
) -> tuple[str, int, bool, bool]:
    """The rows as a JSON array within the row cap and the byte cap, with both flags."""
    parts: list[str] = []
    size = 2  # the brackets
    count = 0
    row_cap_hit = byte_cap_hit = False
    while not (row_cap_hit or byte_cap_hit):
        # One row past the cap tells us the cap was hit without fetching everything.
        batch = cur.fetchmany(min(FETCH_BATCH, limits.row_cap + 1 - count))
        if not batch:
            break
        if count + len(batch) > limits.row_cap:
            batch = batch[: limits.row_cap - count]
            row_cap_hit = True
        rows = [row_dict(columns, r) for r in batch]
        text = json.dumps(rows)[1:-1]
        if size + len(text) + 2 <= limits.reply_bytes:
            if text:
                parts.append(text)
                size += len(text) + 2
                count += len(rows)
            continue
        for row in rows:  # the batch does not fit whole: keep the rows that do
            one = json.dumps(row)
            if size + len(one) + 2 > limits.reply_bytes:
                byte_cap_hit = True
                if count == 0:
                    raise HostError(_too_big_text(len(one), limits.reply_bytes), refused=True)
                break
            parts.append(one)
            size += len(one) + 2
            count += 1
    return "[" + ", ".join(parts) + "]", count, row_cap_hit, byte_cap_hit


def _too_big_text(row_bytes: int, cap: int) -> str:
    return (
        f"query refused: its first row alone is {row_bytes:,} bytes of JSON, over the reply "
        f"limit of {cap:,} bytes; select fewer or shorter columns (e.g. left(col, 200), "
        "length(col))"
    )


class _Watchdog:
    """One daemon thread that interrupts queries past their deadline.

    A `threading.Timer` per query starts and tears down an OS thread each time; this keeps one
    thread per process, woken only when a deadline it must act on comes sooner than planned.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, duckdb.DuckDBPyConnection]] = {}
        self._tickets = itertools.count()
        self._wake_at: float | None = None
        self._thread: threading.Thread | None = None

    def watch(self, cur: duckdb.DuckDBPyConnection, timeout_s: float) -> int:
        """Interrupt `cur` once `timeout_s` has passed, unless released first; returns a ticket."""
        deadline = time.monotonic() + timeout_s
        ticket = next(self._tickets)
        with self._cond:
            self._due[ticket] = (deadline, cur)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="evalloop-sandbox-watchdog", daemon=True
                )
                self._thread.start()
            elif self._wake_at is None or deadline < self._wake_at:
                self._cond.notify()
        return ticket

    def release(self, ticket: int) -> None:
        """The query finished: forget its deadline."""
        with self._cond:
            self._due.pop(ticket, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for ticket, (deadline, cur) in list(self._due.items()):
                    if deadline <= now:
                        del self._due[ticket]
                        cur.interrupt()
                self._wake_at = min((d for d, _ in self._due.values()), default=None)
                self._cond.wait(None if self._wake_at is None else self._wake_at - now)


def unique_columns(columns: list[str]) -> list[str]:
    """Column names made unique (`a`, `a_2`): rows become dicts, and none may be lost."""
    seen: dict[str, int] = {}
    unique = []
    for name in columns:
        count = seen.get(name, 0)
        seen[name] = count + 1
        unique.append(name if count == 0 else f"{name}_{count + 1}")
    return unique


def row_dict(columns: list[str], row: tuple[Any, ...]) -> dict[str, Any]:
    """One row as a JSON-safe dict."""
    return {name: json_safe(value) for name, value in zip(columns, row, strict=True)}


def json_safe(value: Any) -> Any:
    """Turn a DuckDB value into something `json.dumps` accepts, losing as little as possible."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        # NaN and infinity are not JSON; say what they were rather than dropping them.
        return value if math.isfinite(value) else str(value)
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [json_safe(v) for v in value]
    return str(value)


def _first_line(exc: BaseException, keep: int = 1) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:keep]) or type(exc).__name__
