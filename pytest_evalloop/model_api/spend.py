"""The one spending rule: a ceiling is a reservation, not a report.

Before a paid step starts (an attempt: its answer and every judge call; any other paid step a
caller runs), it reserves the most it can cost (:func:`role_bound` of each role, summed). The
step starts only when what was spent plus what the steps in flight hold plus its own
reservation fit under the ceiling; when it ends, what it really cost is counted and the rest of
its reservation is released. So what a session spends never passes its ceiling, whatever the
number of steps in flight or of processes drawing from it:

    spent + held <= ceiling, and a step's cost <= its hold  =>  spent <= ceiling

:class:`SpendCeiling` keeps the count; every process of a pytest session (the controller and
each xdist worker) opens it on the session's shared state directory, the one the rate limiter
uses (`ratelimit.session_state_dir`), and changes `spend.json` there under `flock`. Without a
directory the count lives in memory (one process: a CLI step, a unit test).

:func:`admit` is the decision, pure: `GO` with a hold, `WAIT` (it would fit once steps in flight
release what they did not spend), or `STOP` with the reason (it cannot fit even then: the
ceiling is reached as far as this step is concerned; a stop is final for the session). A step
whose cost is unknown when it ends (a model without a price, a harness error that lost its
usage, a process that died holding it) is counted at its whole hold, never at $0.

Amounts are whole nano-dollars in the shared state, costs rounded up and the ceiling down, so a
sum of float prices can never round its way over the ceiling.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pytest_evalloop.model_api.pricing import PriceTable

NANO = 1_000_000_000
"""Nano-dollars per dollar: the unit of the shared count."""
STATE_FILE = "spend.json"
LOCK_FILE = "spend.lock"
POLL_SECONDS = 0.5
"""How often a waiting step looks again for holds other processes released (a release in its
own process wakes it at once)."""


def to_nano(usd: float, *, up: bool) -> int:
    """USD as whole nano-dollars, rounded up (a cost, a hold) or down (a ceiling)."""
    scaled = usd * NANO
    return math.ceil(scaled - 1e-6) if up else math.floor(scaled + 1e-6)


# --- the bound of a role -------------------------------------------------------------------


@dataclass(frozen=True)
class RoleBound:
    """The most one role can send and receive over one paid step.

    `calls` requests of at most `input_tokens` in and `output_tokens` out each (the model's
    context window and the request's max_tokens), and, with `total_tokens`, at most that many
    over all of them (the answerer's token budget, which it checks after each call: so its
    budget plus one more call). `price_factor` scales the price (the Message Batches API: 0.5).
    """

    role: str
    model: str
    calls: int
    input_tokens: int
    output_tokens: int
    total_tokens: int | None = None
    price_factor: float = 1.0
    note: str = ""
    """What the calls are, in words (`2 samples x 3 calls`)."""

    budget_note: str = ""
    """Where `total_tokens` comes from, in words (`--eval-max-tokens=400,000 + one request`)."""

    def text(self) -> str:
        """`judge <= 3 calls x (200,000 in + 2,048 out) at claude-opus-4-6`."""
        if self.calls == 0:
            return f"{self.role} free ({self.note or 'no call'})"
        shape = self.note or f"{self.calls} calls"
        within = ""
        if self.total_tokens is not None:
            within = f" within {self.budget_note or f'{self.total_tokens:,} tokens'}"
        half = " at the batch price" if self.price_factor != 1.0 else ""
        return (
            f"{self.role} <= {shape} x ({self.input_tokens:,} in + {self.output_tokens:,} out)"
            f"{within} at {self.model}{half}"
        )


def role_bound(bound: RoleBound, prices: PriceTable) -> float | None:
    """The most `bound`'s calls can cost in USD: every input token at the dearest input price
    (cached or not: a cache write costs more than a plain read), every output token at the
    output price. None when the model has no price: such a role cannot be bounded."""
    if bound.calls <= 0:
        return 0.0
    price = prices.price(bound.model)
    if price is None:
        return None
    caps = {
        "in": (bound.calls * bound.input_tokens, price.dearest_input),
        "out": (bound.calls * bound.output_tokens, price.output),
    }
    left = bound.total_tokens
    total = 0.0
    # Within a token budget, the budget goes to the dearer tokens first: the most it can cost.
    for tokens, per_million in sorted(caps.values(), key=lambda c: -c[1]):
        taken = tokens if left is None else min(tokens, left)
        total += taken * per_million
        if left is not None:
            left -= taken
    return total / 1_000_000 * bound.price_factor


@dataclass(frozen=True)
class Bound:
    """An attempt's reservation: the sum of its roles' bounds (None: one could not be priced)."""

    roles: tuple[RoleBound, ...]
    amounts: tuple[float | None, ...]

    @property
    def total(self) -> float | None:
        if any(a is None for a in self.amounts):
            return None
        return float(sum(a or 0.0 for a in self.amounts))

    def text(self) -> str:
        """Each role's bound and amount, for the stop reason, the estimate and the header."""
        parts = []
        for role, amount in zip(self.roles, self.amounts, strict=True):
            money = "no price (add it with --eval-prices)" if amount is None else f"${amount:.4f}"
            parts.append(f"{role.text()}: {money}")
        return "; ".join(parts)

    def short(self) -> str:
        """`answerer $3.0026 + judge $3.9036`: each role's part, for a stop reason."""
        return " + ".join(
            f"{r.role} {'unpriced' if a is None else f'${a:.4f}'}"
            for r, a in zip(self.roles, self.amounts, strict=True)
        )

    def unpriced(self) -> list[str]:
        """The models a reservation cannot price."""
        return [r.model for r, a in zip(self.roles, self.amounts, strict=True) if a is None]


def bound_of(roles: tuple[RoleBound, ...], prices: PriceTable) -> Bound:
    """Each role's bound priced (`role_bound`)."""
    return Bound(roles, tuple(role_bound(r, prices) for r in roles))


# --- the decision (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class SpendState:
    """What the shared file holds (nano-dollars)."""

    spent: int = 0
    held: dict[str, int] = field(default_factory=dict)
    """Each step in flight's hold, keyed `<pid>:<n>`."""
    steps: int = 0
    """Steps admitted so far."""
    unknown: int = 0
    """Steps counted at their whole hold (cost unknown when they ended)."""
    stopped: str | None = None
    """The reason the ceiling stopped the session (final once set)."""

    @property
    def holding(self) -> int:
        return sum(self.held.values())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpendState:
        return cls(
            spent=int(data["spent"]),
            held={str(k): int(v) for k, v in dict(data["held"]).items()},
            steps=int(data["steps"]),
            unknown=int(data["unknown"]),
            stopped=data.get("stopped"),
        )


GO: Literal["go"] = "go"
WAIT: Literal["wait"] = "wait"
STOP: Literal["stop"] = "stop"


@dataclass(frozen=True)
class Admission:
    """What :func:`admit` decided: `GO` (with the hold's key), `WAIT`, or `STOP` (why)."""

    kind: Literal["go", "wait", "stop"]
    key: str | None = None
    amount: int = 0
    reason: str | None = None


def stopped_text(spent_usd: float, ceiling_usd: float) -> str:
    """The words a run stopped by its ceiling says, with what it spent."""
    return f"stopped before the ceiling: ${spent_usd:.4f} of ${ceiling_usd:.4f}"


def admit(
    state: SpendState,
    ceiling: int,
    amount: int | None,
    key: str,
    *,
    alive: Callable[[str], bool] = lambda key: True,
    what: str = "",
) -> tuple[SpendState, Admission]:
    """May a step that can cost up to `amount` start? (`ceiling`, `amount`: nano-dollars;
    `amount` None: it cannot be priced; `alive`: whether a hold's owner still runs; `what`:
    the bound in words, for the reason.)

    A hold whose owner died is counted as spent in full first: it may have been spent.
    """
    dead = [k for k in state.held if not alive(k)]
    if dead:
        held = {k: v for k, v in state.held.items() if k not in dead}
        spent = state.spent + sum(state.held[k] for k in dead)
        state = replace(state, held=held, spent=spent, unknown=state.unknown + len(dead))
    if state.stopped is not None:
        return state, Admission(STOP, reason=state.stopped)
    if amount is None:
        reason = f"cannot reserve an attempt: {what or 'a model has no price'}"
        return replace(state, stopped=reason), Admission(STOP, reason=reason)
    if state.spent + state.holding + amount <= ceiling:
        held = {**state.held, key: amount}
        return replace(state, held=held, steps=state.steps + 1), Admission(GO, key, amount)
    if state.spent + amount <= ceiling:
        return state, Admission(WAIT)  # fits once the steps in flight release what they hold
    reason = (
        f"{stopped_text(state.spent / NANO, ceiling / NANO)}; the next attempt reserves up to "
        f"${amount / NANO:.4f} ({what or 'its most'}) and ${(ceiling - state.spent) / NANO:.4f} "
        "is left; finish the run with --eval-resume and a ceiling of its own"
    )
    return replace(state, stopped=reason), Admission(STOP, reason=reason)


def release(state: SpendState, key: str, cost: int | None) -> SpendState:
    """A step ended: count its cost (None: unknown, counted at its whole hold) and let the rest
    of its hold go. A cost above the hold is counted as it is: the count is the truth."""
    hold = state.held.get(key)
    if hold is None:
        return state  # released already (counted when its owner was found dead)
    held = {k: v for k, v in state.held.items() if k != key}
    spent = state.spent + (hold if cost is None else cost)
    return replace(state, held=held, spent=spent, unknown=state.unknown + (cost is None))


# --- where the count lives -----------------------------------------------------------------


def pid_alive(key: str) -> bool:
    """Whether the process named by a hold's key (`<pid>:<n>`) still runs."""
    try:
        os.kill(int(key.split(":", 1)[0]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True  # another user's process, or a key we did not write: leave it held
    return True


class SpendCeiling:
    """A ceiling in USD and the session's count against it, as seen from one process.

    `reserve(amount)` before a paid step, `settle(admission, cost)` after it (in a `finally`);
    `state()` for what was spent. With `state_dir`, every process opening the same directory
    shares one count (`spend.json`, changed under `flock`); without, it lives in memory.
    """

    def __init__(
        self,
        ceiling: float,
        state_dir: Path | None = None,
        *,
        alive: Callable[[str], bool] = pid_alive,
    ) -> None:
        if not 0 < ceiling < math.inf:
            raise ValueError(f"a spend ceiling must be a positive amount of USD, got {ceiling}")
        self.ceiling = ceiling
        self._ceiling = to_nano(ceiling, up=False)
        self.path = None if state_dir is None else state_dir / STATE_FILE
        self._alive = alive
        self._memory = SpendState()
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)

    def reserve(self, amount: float | None, *, what: str = "") -> Admission:
        """Ask to start a step that can cost up to `amount` USD (None: it cannot be priced)."""
        nano = None if amount is None else to_nano(amount, up=True)
        key = f"{os.getpid()}:{next(self._numbers)}"
        return self._update(
            lambda state: admit(state, self._ceiling, nano, key, alive=self._alive, what=what)
        )

    def settle(self, admission: Admission, cost: float | None) -> None:
        """The step `admission` let start has ended, having cost `cost` USD (None: unknown)."""
        if admission.key is None:
            return
        nano = None if cost is None else to_nano(max(0.0, cost), up=True)
        key = admission.key
        self._update(lambda state: (release(state, key, nano), None))

    def state(self) -> SpendState:
        """The count as it is now."""
        return self._update(lambda state: (state, state))

    def record(self, reserved: float | None) -> dict[str, Any]:
        """run.json `spend` under a ceiling: the ceiling, what was spent (unknown costs at
        their holds), what one attempt reserved, how many started, and whether it stopped."""
        state = self.state()
        return {
            "ceilingUsd": self.ceiling,
            "spentUsd": round(state.spent / NANO, 9),
            "reservedUsd": None if reserved is None else round(reserved, 9),
            "attempts": state.steps,
            "unknownCost": state.unknown,
            "stopped": state.stopped is not None,
        }

    def _update(self, change: Callable[[SpendState], tuple[SpendState, Any]]) -> Any:
        if self.path is None:
            with self._lock:
                self._memory, out = change(self._memory)
                return out
        with self._lock, _locked(self.path.with_name(LOCK_FILE)):
            try:
                raw = self.path.read_bytes()
            except FileNotFoundError:
                raw = b""
            state = _load(raw)
            new, out = change(state)
            if new != state:
                # Written whole and renamed into place: a process killed mid-write leaves the
                # last count, never half of one.
                data = json.dumps({**new.to_json(), "ceiling": self._ceiling}).encode()
                partial = self.path.with_name(f".{STATE_FILE}.{os.getpid()}")
                partial.write_bytes(data)
                os.replace(partial, self.path)
            return out


def _load(raw: bytes) -> SpendState:
    if not raw:
        return SpendState()
    # It is only ever replaced whole, so this is someone else's file: reading it as "nothing
    # spent" could let the ceiling be passed. It is an error the caller reports.
    try:
        return SpendState.from_json(json.loads(raw))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"the session's spend count cannot be read ({exc})") from exc


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Opened afresh each time: a descriptor inherited across fork would share its lock.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
