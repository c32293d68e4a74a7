"""One rate limit for the whole run: requests and tokens per minute, shared by every process.

Every process of a session (the controller and each xdist worker) opens a :class:`RunLimiter`
on the same state directory. The budget lives in one small JSON file there, read and rewritten
under ``fcntl.flock``: two token buckets with continuous refill (requests, tokens), a
``paused_until`` time, and the times of the last ``rpm`` requests let through (the window: at most
``rpm`` requests in any 60 seconds, whatever the bucket's burst allows). A caller computes its slot under the lock, reserves it, releases the
lock and only then sleeps, so the lock is held for microseconds and N processes draw from ONE
budget. A 429/529 carrying ``retry-after`` pauses everyone: the pause bumps an epoch, and every
reservation made before it is re-queued after the pause instead of firing in a burst.

Times in the file are wall-clock (``time.time()``) because they are shared between processes
and ``retry-after`` is wall-clock too.

:class:`LimitedTransport` plugs the limiter into the ``anthropic`` SDK's HTTP stack (httpx2), so
every Messages API call, retries included, goes through it, and reads the API's own rate-limit
headers on every reply (`headroom_wait`): processes on other machines share the key's budget
but not this file, so what the API says is left is how they slow down together.

Across machines (`--eval-shard=I/N`), each shard's limiter takes its share of the run's limits
(`share`) by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The arithmetic lives in `budget`; its names stay importable from here, where the limiter is.
from pytest_evalloop.model_api.budget import BURST_SECONDS as BURST_SECONDS
from pytest_evalloop.model_api.budget import WINDOW_S as WINDOW_S
from pytest_evalloop.model_api.budget import Bucket as Bucket
from pytest_evalloop.model_api.budget import Grant as Grant
from pytest_evalloop.model_api.budget import LimiterState as LimiterState
from pytest_evalloop.model_api.budget import Limits as Limits
from pytest_evalloop.model_api.budget import paused as paused
from pytest_evalloop.model_api.budget import plan as plan
from pytest_evalloop.model_api.budget import refill as refill
from pytest_evalloop.model_api.budget import reserve as reserve
from pytest_evalloop.model_api.budget import settled as settled
from pytest_evalloop.model_api.budget import share as share
from pytest_evalloop.model_api.budget import windowed as windowed

if TYPE_CHECKING:
    import httpx2

DEFAULT_PAUSE_S = 1.0
"""Pause after a 429/529 that names no retry-after (the SDK's own backoff starts at 0.5 s)."""
MAX_PAUSE_S = 600.0
"""A retry-after longer than this is capped: a broken header must not freeze the run for hours."""
CHARS_PER_TOKEN = 4
"""Rough size of a token in request-body bytes; settled against real usage after the call."""
STATE_FILE = "limiter.json"
STAT_MARGIN_S = 1.0
"""A state file written less than this long ago is re-read on every peek (see FileStore.peek)."""


# --- where the state lives -----------------------------------------------------------------


class MemoryStore:
    """The state in this process only (unit tests, or a run with one process)."""

    def __init__(self, initial: LimiterState) -> None:
        self._state = initial
        self._lock = threading.Lock()

    def update(self, change: Callable[[LimiterState], tuple[LimiterState, Any]]) -> Any:
        """Apply `change` atomically; return what it returned beside the new state."""
        with self._lock:
            self._state, out = change(self._state)
            return out

    def read(self) -> LimiterState:
        """The current state."""
        with self._lock:
            return self._state

    peek = read  # in memory, reading is already cheap


class FileStore:
    """The state in `<dir>/limiter.json`, changed under an exclusive `flock`.

    The file is opened afresh for each change: a descriptor inherited across `fork` shares its
    lock with the parent, and would let two processes into the critical section together.
    """

    def __init__(self, state_dir: Path, initial: Callable[[], LimiterState]) -> None:
        self.path = state_dir / STATE_FILE
        self._initial = initial
        self._peeked: tuple[tuple[int, int, int, int], LimiterState] | None = None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            # Created on first use, so a session that never calls the API leaves nothing behind.
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _load(self, fd: int) -> LimiterState:
        raw = os.pread(fd, 1 << 16, 0)
        if not raw:
            return self._initial()
        try:
            return LimiterState.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError):
            # A torn write from a killed process: start a fresh budget rather than fail the run.
            return self._initial()

    def update(self, change: Callable[[LimiterState], tuple[LimiterState, Any]]) -> Any:
        """Apply `change` under the lock; return what it returned beside the new state."""
        with self._locked() as fd:
            state, out = change(self._load(fd))
            data = json.dumps(state.to_json()).encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            return out

    def read(self) -> LimiterState:
        """The current state."""
        with self._locked() as fd:
            return self._load(fd)

    def peek(self) -> LimiterState:
        """The current state, re-read only when the file changed since the last peek.

        For the path that only needs to see a pause (no rpm/tpm): an `os.stat` per request
        instead of open + flock + read + parse. Sound because every writer replaces the content
        under the lock, which moves the file's (inode, size, mtime, ctime) key, and a state is
        only cached when its file was last written more than `STAT_MARGIN_S` before it was
        read: a later write then lands at a later time, so its mtime differs even on a file
        system whose timestamps are coarser than the gap between two writes.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self._initial()  # nobody has written a state (so no pause) yet
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        cached = self._peeked
        if cached is not None and cached[0] == key:
            return cached[1]
        with self._locked() as fd:
            state = self._load(fd)
            # Stat again under the lock: the key must describe the bytes just read.
            st = os.fstat(fd)
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if time.time() - st.st_mtime_ns / 1e9 > STAT_MARGIN_S:
            self._peeked = (key, state)
        else:
            self._peeked = None
        return state


# --- the limiter ---------------------------------------------------------------------------


@dataclass
class LimiterStats:
    """What one process's limiter did; `merge_stats` sums these across processes.

    `waits` counts requests the limiter held back; `wait_seconds` sums their waits (so with
    many requests in flight it can exceed the wall time); a pause counts where it was called.
    """

    requests: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    max_wait_seconds: float = 0.0
    pauses: int = 0
    paused_seconds: float = 0.0
    tokens_estimated: int = 0
    tokens_settled: int = 0
    header_pauses: int = 0
    header_paused_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "waits": self.waits,
            "waitSeconds": round(self.wait_seconds, 3),
            "maxWaitSeconds": round(self.max_wait_seconds, 3),
            "pauses": self.pauses,
            "pausedSeconds": round(self.paused_seconds, 3),
            "tokensEstimated": self.tokens_estimated,
            "tokensSettled": self.tokens_settled,
            "headerPauses": self.header_pauses,
            "headerPausedSeconds": round(self.header_paused_seconds, 3),
        }


_MAX_KEYS = ("maxWaitSeconds",)
_SAME_KEYS = ("rpm", "tpm")


def merge_stats(parts: Iterable[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Sum per-process `RunLimiter.stats()` into one dict for run.json's `limiter`.

    Counts and seconds add up, maxima take the max, the limits are the run's own. None when no
    process reported anything.
    """
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in (part or {}).items():
            if key in _SAME_KEYS:
                merged.setdefault(key, value)
            elif key in _MAX_KEYS:
                merged[key] = max(merged.get(key, 0.0), value)
            elif isinstance(value, int | float):
                merged[key] = merged.get(key, 0) + value
    for key, value in merged.items():
        if isinstance(value, float):
            merged[key] = round(value, 3)
    return merged or None


class RunLimiter:
    """The run's rate limit as seen from one process (shared through `state_dir`).

    With `state_dir=None` the budget lives in memory: one process only.
    """

    def __init__(
        self,
        state_dir: Path | None,
        *,
        rpm: int,
        tpm: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # `clock` is the wall clock every slot and pause is computed on; tests pass the clock
        # of an event loop whose time they control (looptime), so waits are exact, not raced.
        if rpm < 0 or tpm < 0:
            raise ValueError(
                f"rate limits must be >= 0 (0 means no limit), got rpm={rpm} tpm={tpm}; "
                "fix --eval-rpm / --eval-tpm"
            )
        self.limits = Limits(rpm=rpm, tpm=tpm)
        self._clock = clock
        self.state_dir = state_dir
        limits = self.limits
        self._store: MemoryStore | FileStore
        if state_dir is None:
            self._store = MemoryStore(LimiterState.fresh(limits, self._clock()))
        else:
            self._store = FileStore(state_dir, lambda: LimiterState.fresh(limits, self._clock()))
        self._stats = LimiterStats()
        self._stats_lock = threading.Lock()
        self.waiting = 0
        """Requests of this process sleeping in `acquire` right now (for progress)."""

    async def acquire(self, estimated_tokens: int = 0) -> float:
        """Wait until one request (of about `estimated_tokens`) may go; return seconds waited.

        Sleeps with `asyncio.sleep`, never blocking the loop; the file lock is held only while
        the slot is computed. A pause that lands while we sleep re-queues us behind it.
        """
        started = self._clock()
        tokens = max(0, int(estimated_tokens))
        token_ready = 0.0
        slept = False
        if self.limits.rpm <= 0 and self.limits.tpm <= 0:
            # No budget to draw from: only a shared pause (a 429's retry-after) can hold us,
            # so read the state instead of reserving under the lock.
            pause = self._store.peek().paused_until - self._clock()
            if pause > 0:
                await self._sleep(pause)
            waited = self._clock() - started
            self._record(waited if pause > 0 else 0.0, tokens)
            return waited
        requeued: float | None = None
        while True:
            grant: Grant = self._store.update(
                functools.partial(
                    self._plan, tokens=tokens, not_before=token_ready, requeued=requeued
                )
            )
            tokens = 0  # the tokens are reserved once; a re-queue only waits for them
            token_ready = max(token_ready, grant.token_ready)
            delay = grant.at - self._clock()
            if delay <= 0:
                break
            await self._sleep(delay)
            slept = True
            if self._store.read().epoch == grant.epoch:
                break
            requeued = grant.at  # a pause came first: this slot never went
        waited = self._clock() - started
        self._record(waited if slept else 0.0, max(0, int(estimated_tokens)))
        return waited

    def _plan(
        self, state: LimiterState, *, tokens: int, not_before: float, requeued: float | None
    ) -> tuple[LimiterState, Grant]:
        return plan(
            state, self.limits, self._clock(), tokens, not_before=not_before, requeued=requeued
        )

    async def _sleep(self, seconds: float) -> None:
        with self._stats_lock:
            self.waiting += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            with self._stats_lock:
                self.waiting -= 1

    def _record(self, waited: float, estimated: int) -> None:
        with self._stats_lock:
            stats = self._stats
            stats.requests += 1
            stats.tokens_estimated += estimated
            if waited > 0:
                stats.waits += 1
                stats.wait_seconds += waited
                stats.max_wait_seconds = max(stats.max_wait_seconds, waited)

    def settle(self, estimated: int, actual: int) -> None:
        """Correct the token bucket once a call's real usage is known."""
        with self._stats_lock:
            self._stats.tokens_settled += actual
        correction = estimated - actual
        if self.limits.tpm <= 0 or correction == 0:
            return
        self._store.update(
            lambda state: (settled(state, self.limits, self._clock(), correction), None)
        )

    def pause(self, seconds: float, *, from_headers: bool = False) -> None:
        """A 429/529 said wait (or, `from_headers`, the API's rate-limit headers said its
        budget is nearly spent): every process of the run waits until now + `seconds`."""
        seconds = min(max(0.0, seconds), MAX_PAUSE_S)
        with self._stats_lock:
            if from_headers:
                self._stats.header_pauses += 1
                self._stats.header_paused_seconds += seconds
            else:
                self._stats.pauses += 1
                self._stats.paused_seconds += seconds
        self._store.update(lambda state: (paused(state, self._clock(), seconds), None))

    def now(self) -> float:
        """The wall-clock time on this limiter's clock."""
        return self._clock()

    def paused_until(self) -> float:
        """The wall-clock time the run's pause ends (0 or past when not paused)."""
        return self._store.peek().paused_until

    def stats(self) -> dict[str, Any]:
        """This process's waits and pauses, for run.json `limiter` (sum with `merge_stats`)."""
        with self._stats_lock:
            out = self._stats.as_dict()
        out["rpm"], out["tpm"] = self.limits.rpm, self.limits.tpm
        return out


def session_state_dir(session_id: str, root: Path | None = None) -> Path:
    """The directory every process of one session shares (a temp dir named by the session)."""
    base = root if root is not None else Path(tempfile.gettempdir())
    return base / f"evalloop-{session_id}"


# --- the HTTP side -------------------------------------------------------------------------


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds a response asks us to wait: `retry-after-ms`, then `retry-after` (seconds)."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) / scale
        except ValueError:
            continue  # an HTTP date: rare from this API; the default pause covers it
    return None


RATE_HEADER = "anthropic-ratelimit-"
LOW_WATER = {"requests": 1.0, "tokens": 0.01, "input-tokens": 0.01, "output-tokens": 0.01}
"""How low a budget the API reports may run before we wait: requests as a count (another
request or two of ours may be in flight already), tokens as a share of the limit."""


def headroom_wait(headers: Any, now: float) -> float:
    """Seconds to wait before the next request, from the API's own rate-limit headers.

    The API sends, per budget (`requests`, `tokens`, `input-tokens`, `output-tokens`), its
    `anthropic-ratelimit-<budget>-limit`, `-remaining` and `-reset` (RFC 3339, when it is full
    again). Every shard on one key sees the same budget there, so reading it lets N shards slow
    down together before the API refuses them, with no coordinator. When a budget's remaining
    is at its low-water mark (`LOW_WATER`) or below, wait until it has refilled past the mark
    at the limit's own per-minute rate (never past its reset); 0 when no budget is low or the
    headers are absent or unreadable.
    """
    wait = 0.0
    for budget, mark in LOW_WATER.items():
        limit = _header_number(headers, f"{RATE_HEADER}{budget}-limit")
        remaining = _header_number(headers, f"{RATE_HEADER}{budget}-remaining")
        if not limit or remaining is None:
            continue
        low = mark if budget == "requests" else mark * limit
        if remaining > low:
            continue
        needed = (low + 1 - remaining) * 60.0 / limit
        reset = _header_time(headers, f"{RATE_HEADER}{budget}-reset")
        if reset is not None:
            needed = min(needed, max(0.0, reset - now))
        wait = max(wait, needed)
    return min(wait, MAX_PAUSE_S)


def _header_number(headers: Any, name: str) -> float | None:
    value = headers.get(name)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _header_time(headers: Any, name: str) -> float | None:
    from datetime import datetime

    value = headers.get(name)
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def estimate_tokens(body: bytes) -> int:
    """A cheap guess at a request's tokens from its body size (settled after the call)."""
    return max(1, len(body) // CHARS_PER_TOKEN)


def usage_tokens(payload: Any) -> int | None:
    """Tokens a Messages API reply counts against a per-minute budget.

    Input, cache writes and output; cache reads are left out, as the API's own input-token
    limits leave them out.
    """
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return None
    keys = ("input_tokens", "cache_creation_input_tokens", "output_tokens")
    return sum(int(usage.get(k) or 0) for k in keys)


def _is_messages_call(request: httpx2.Request) -> bool:
    return request.method == "POST" and request.url.path.rstrip("/").endswith("/messages")


class LimitedTransport:
    """An httpx2 async transport that sends each Messages API call through a `RunLimiter`.

    Wraps the transport the SDK would have used. Before each `POST .../messages`: acquire
    (tokens estimated from the body size). After: a 429/529 pauses the whole run for its
    retry-after; a JSON 200 settles the token estimate with the reply's usage. Other requests
    pass straight through. It implements `httpx2.AsyncBaseTransport`'s interface without
    inheriting from it, so importing this module never imports httpx2.
    """

    def __init__(self, inner: httpx2.AsyncBaseTransport, limiter: RunLimiter) -> None:
        self.inner = inner
        self.limiter = limiter

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send one request, waiting for the run's budget first when it is a Messages call."""
        if not _is_messages_call(request):
            return await self.inner.handle_async_request(request)
        estimate = _request_estimate(request)
        await self.limiter.acquire(estimate)
        response = await self.inner.handle_async_request(request)
        await self._after(response, estimate)
        return response

    async def _after(self, response: httpx2.Response, estimate: int) -> None:
        status = response.status_code
        if status in (429, 529):
            delay = retry_after_seconds(response.headers)
            self.limiter.pause(DEFAULT_PAUSE_S if delay is None else delay)
            return
        # The key's budget as the API counts it, shared with every other shard on the key.
        headroom = headroom_wait(response.headers, self.limiter.now())
        if headroom > 0:
            self.limiter.pause(headroom, from_headers=True)
        if status != 200 or self.limiter.limits.tpm <= 0:
            return  # nothing to settle against: no token budget
        if "json" not in response.headers.get("content-type", ""):
            return  # a stream's usage arrives in its events; the estimate stands
        # The SDK reads a JSON reply whole anyway; reading it here first costs nothing.
        await response.aread()
        try:
            actual = usage_tokens(json.loads(response.content))
        except ValueError:
            actual = None
        if actual is not None:
            self.limiter.settle(estimate, actual)

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self.inner.aclose()

    async def __aenter__(self) -> LimitedTransport:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.__aexit__(*exc)  # type: ignore[arg-type]


def _request_estimate(request: httpx2.Request) -> int:
    import httpx2

    try:
        return estimate_tokens(request.content)
    except httpx2.RequestNotRead:  # a streamed upload: its size is unknown until sent
        return 1


def wrap_transports(client: Any, limiter: RunLimiter) -> Any:
    """Wrap a built httpx2 `AsyncClient`'s transport and proxy mounts in `LimitedTransport`."""
    # httpx2 has no public setter for a built client's transports; these two attributes are
    # where AsyncClient keeps them (checked against httpx2 as pinned by anthropic 2.14).
    client._transport = LimitedTransport(client._transport, limiter)
    client._mounts = {
        pattern: None if inner is None else LimitedTransport(inner, limiter)
        for pattern, inner in client._mounts.items()
    }
    return client
