"""The query process's side: cap its own memory, open the snapshot locked, answer requests.

Started by `query_host.QueryHost` as `python -c ... main(<config>)`; the protocol (one JSON
object per line each way) and the reasons for each limit are in `query_host`'s docstring.
Each request runs on its own cursor in its own thread, interrupted by one watchdog at the time
limit; the rows are encoded to JSON here, within the row and byte caps.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import itertools
import json
import math
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pytest_evalloop.targets.embedded.query_limits import (
    TEST_GATE_ENV,
    HostError,
    Limits,
    locked_config,
    memory_text,
    time_limit_text,
)

if TYPE_CHECKING:
    import duckdb

__all__ = ["json_safe", "main", "row_dict", "unique_columns"]

# Rows are fetched and measured in batches, so the byte cap stops the fetch early.
FETCH_BATCH = 128
# At most this many DuckDB threads: every thread's stack counts against the memory cap, and the
# answerer's small queries gain nothing from more.
MAX_THREADS = 4
# A child whose data segment is above this share of its cap after a query retires: the memory
# a failed heavy query leaves mapped (DuckDB's allocator keeps it for reuse) would otherwise
# leave the next query too little room. Ordinary queries keep it under 10%.
RETIRE_SHARE = 0.5


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
        gate_dir = os.environ.get(TEST_GATE_ENV)
        if gate_dir:
            _TestGate(Path(gate_dir)).define(con)
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


class _TestGate:
    """The test suite's SQL function `evalloop_test_gate(name)`, defined only under
    TEST_GATE_ENV: it writes `<name>.<pid>.started` in the gate directory, then blocks until
    `<name>.open` exists there (forever if it never does) and returns 1. A Python function
    never checks DuckDB's interrupt, so a gated query can be stopped only by replacing the
    process: the path a query that ignores the interrupt takes."""

    POLL_S = 0.01  # how often the closed gate looks for the test's file, not a deadline

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def define(self, con: duckdb.DuckDBPyConnection) -> None:
        con.create_function(
            "evalloop_test_gate", self.wait, ["VARCHAR"], "BIGINT", side_effects=True
        )

    def wait(self, name: str) -> int:
        (self.directory / f"{name}.{os.getpid()}.started").touch()
        while not (self.directory / f"{name}.open").exists():
            time.sleep(self.POLL_S)
        return 1


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
