"""The rate limit's arithmetic, pure: token buckets, the 60-second window, pauses.

What one reservation does to the shared state (`plan`), and what a pause (`paused`) or a settled
token estimate (`settled`) does to it. `pytest_evalloop.model_api.ratelimit` keeps the state in a
file every process of a session shares and applies these under its lock.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

BURST_SECONDS = 2.0
"""How many seconds of budget a bucket may hold: a small burst after a quiet spell."""
WINDOW_S = 60.0
"""The span `rpm` counts over: no 60-second window, ends included, holds more than `rpm` grants."""
WINDOW_MARGIN_S = 0.05
"""How much more than `WINDOW_S` must separate a grant from the one `rpm` grants before it: the
ends of a closed window both count, and a process may wake a little after its slot."""


@dataclass(frozen=True)
class Bucket:
    """A token bucket: `level` units available at time `stamp` (negative: reserved ahead)."""

    level: float
    stamp: float


def refill(bucket: Bucket, now: float, rate: float, capacity: float) -> Bucket:
    """The bucket at `now`: refilled at `rate` per second, never above `capacity`.

    A stamp in the future (set by a pause) means nothing refills before it.
    """
    if now <= bucket.stamp:
        return bucket
    return Bucket(min(capacity, bucket.level + (now - bucket.stamp) * rate), now)


def reserve(
    bucket: Bucket, cost: float, now: float, rate: float, capacity: float
) -> tuple[Bucket, float]:
    """Reserve `cost` units: the bucket after the debit, and the time the caller may go.

    The caller may go once the level is back to `min(cost, capacity)`; a cost larger than the
    bucket leaves it in debt, which later callers wait out, so the average rate holds.
    """
    current = refill(bucket, now, rate, capacity)
    need = min(cost, capacity)
    ready_at = current.stamp + max(0.0, need - current.level) / rate
    return Bucket(current.level - cost, current.stamp), ready_at


@dataclass(frozen=True)
class Limits:
    """Requests and tokens per minute (0: that dimension is unlimited)."""

    rpm: int = 0
    tpm: int = 0

    @property
    def request_rate(self) -> float:
        return self.rpm / 60.0

    @property
    def token_rate(self) -> float:
        return self.tpm / 60.0

    @property
    def request_capacity(self) -> float:
        return max(1.0, self.request_rate * BURST_SECONDS)

    @property
    def token_capacity(self) -> float:
        return max(1.0, self.token_rate * BURST_SECONDS)


def share(limit: int, count: int) -> int:
    """One of `count` shards' part of a per-minute limit (0 stays unlimited; never below 1).

    Rounded down, so N shards on one key together never ask for more than the key allows.
    """
    if limit <= 0:
        return 0
    return max(1, limit // max(1, count))


@dataclass(frozen=True)
class LimiterState:
    """What the shared file holds."""

    requests: Bucket
    tokens: Bucket
    paused_until: float = 0.0
    epoch: int = 0
    window: tuple[float, ...] = ()
    """The times granted to the last (at most `rpm`) requests, oldest first; grants are made in
    time order, so this is sorted."""

    @classmethod
    def fresh(cls, limits: Limits, now: float) -> LimiterState:
        """A new budget: one request may go at once (then paced), the token bucket is full."""
        return cls(Bucket(1.0, now), Bucket(limits.token_capacity, now))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LimiterState:
        return cls(
            requests=Bucket(**data["requests"]),
            tokens=Bucket(**data["tokens"]),
            paused_until=float(data["paused_until"]),
            epoch=int(data["epoch"]),
            window=tuple(float(t) for t in data.get("window", ())),
        )


@dataclass(frozen=True)
class Grant:
    """A reserved slot: go at `at` unless a pause (a new epoch) came first."""

    at: float
    token_ready: float
    epoch: int


def plan(
    state: LimiterState,
    limits: Limits,
    now: float,
    tokens: int,
    *,
    not_before: float = 0.0,
    requeued: float | None = None,
) -> tuple[LimiterState, Grant]:
    """Reserve one request (and `tokens` tokens) in the shared state; when may it go?

    `requeued` is the slot of a reservation a pause overtook: it never went, so it leaves the
    window; `not_before` is when its tokens were ready (they are reserved once).
    """
    request_at = token_at = now
    requests, token_bucket = state.requests, state.tokens
    if limits.rpm > 0:
        requests, request_at = reserve(
            requests, 1.0, now, limits.request_rate, limits.request_capacity
        )
    if limits.tpm > 0 and tokens > 0:
        token_bucket, token_at = reserve(
            token_bucket, float(tokens), now, limits.token_rate, limits.token_capacity
        )
    at = max(request_at, token_at, state.paused_until, not_before)
    window = state.window
    if limits.rpm > 0:
        window, at = windowed(window, limits.rpm, now, at, requeued)
    new = replace(state, requests=requests, tokens=token_bucket, window=window)
    return new, Grant(at=at, token_ready=token_at, epoch=state.epoch)


def windowed(
    window: tuple[float, ...], rpm: int, now: float, at: float, requeued: float | None = None
) -> tuple[tuple[float, ...], float]:
    """The earliest slot from `at` that keeps every 60-second window at `rpm` grants or fewer,
    and the window with it added.

    The bucket alone lets its burst (two seconds' worth) plus a minute's refill into one minute:
    rpm + 1 at 60 rpm. Grants go in time order (never before the latest one), so a slot is free
    once the grant `rpm` places back is more than `WINDOW_S` old. Grants too old to bind any
    later slot are dropped, so the file holds at most `rpm` times.
    """
    kept = list(window)
    if requeued is not None and requeued in kept:
        kept.remove(requeued)
    if kept:
        at = max(at, kept[-1])
    if len(kept) >= rpm:
        at = max(at, kept[-rpm] + WINDOW_S + WINDOW_MARGIN_S)
    kept.append(at)
    horizon = now - WINDOW_S - WINDOW_MARGIN_S
    return tuple(t for t in kept[-rpm:] if t >= horizon), at


def settled(state: LimiterState, limits: Limits, now: float, correction: int) -> LimiterState:
    """Give back (positive) or take (negative) tokens once a call's real usage is known."""
    if limits.tpm <= 0 or correction == 0:
        return state
    bucket = refill(state.tokens, now, limits.token_rate, limits.token_capacity)
    level = min(limits.token_capacity, bucket.level + correction)
    return replace(state, tokens=Bucket(level, bucket.stamp))


def paused(state: LimiterState, now: float, seconds: float) -> LimiterState:
    """Everyone waits until `now + seconds`; then requests resume one at a time, paced."""
    until = max(state.paused_until, now + seconds)
    # Level 1 at the pause's end: one request may go then, the rest follow at the refill rate
    # instead of all the waiters firing together into the endpoint that just refused us.
    requests = Bucket(1.0, max(until, state.requests.stamp))
    return replace(state, requests=requests, paused_until=until, epoch=state.epoch + 1)
