"""One budget for the whole loop: every paid step runs under what is left of it.

`evalloop loop --budget-usd X` keeps one count (`model_api.spend.SpendCeiling`, the session
spending rule of docs/spend.md) over every step it pays for:

- a pytest run (the baseline, each blind arm) is handed what is left as `--eval-max-cost`, so
  its own attempts reserve against it and stop before it; what the run spent (its run.json
  `spend`, unknown costs at their whole reservation) is then counted;
- a step in this process (diagnose, improve, the expert review) reserves each Messages API
  call before it is sent: the most that call can cost (its request's size as an upper bound of
  its input tokens, within the model's context window, at the dearest input price; its
  `max_tokens` at the output price), settled with what it cost. A call that cannot fit stops
  the loop before it is sent (`BudgetStop`).

So what the loop spends never passes the budget; its last line says what it spent against it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_evalloop.model_api.pricing import PriceTable, Usage
from pytest_evalloop.model_api.spend import GO, RoleBound, SpendCeiling, role_bound

REQUEST_MARGIN_TOKENS = 2_048
"""Tokens a request may carry beyond its bytes (the API's own tool-use preamble)."""
LEAST_CHILD_USD = 1e-6
"""A pytest step is handed at least this much, else the loop stops before it."""


class BudgetStop(Exception):
    """The next paid step cannot fit in what is left of the budget: the message says so."""


def call_bound(request: dict[str, Any], prices: PriceTable) -> float | None:
    """The most one Messages API call can cost (None: its model has no price).

    Every token stands for at least one byte of what is sent, so the request's JSON bytes plus
    `REQUEST_MARGIN_TOKENS` bound its input tokens (and the context window bounds them too)."""
    model = str(request.get("model", ""))
    sent = {k: request.get(k) for k in ("system", "tools", "messages")}
    size = len(json.dumps(sent, ensure_ascii=False, default=str).encode("utf-8"))
    tokens = min(prices.context(model), size + REQUEST_MARGIN_TOKENS)
    out = int(request.get("max_tokens") or 0)
    return role_bound(RoleBound("step", model, 1, tokens, out), prices)


class LoopBudget:
    """The loop's budget (None: no budget, only counted) and what its steps spent."""

    def __init__(self, usd: float | None, prices: PriceTable | None = None) -> None:
        self.usd = usd
        self.prices = prices or PriceTable()
        self.ceiling = SpendCeiling(usd) if usd is not None else None
        self.spent = 0.0
        self.unknown = 0

    def left(self) -> float | None:
        if self.ceiling is None or self.usd is None:
            return None
        state = self.ceiling.state()
        return max(0.0, self.usd - (state.spent + state.holding) / 1e9)

    def _count(self, cost: float | None) -> None:
        if cost is None:
            self.unknown += 1
        else:
            self.spent = round(self.spent + cost, 9)

    # --- a pytest run ---------------------------------------------------------------------

    def run_step(self, step: str, run: Any) -> Any:
        """Run one pytest step under what is left: `run(extra_args)` returns the run directory
        it wrote (or None); its spend is counted after it."""
        if self.ceiling is None:
            run_dir = run([])
            if run_dir is not None:
                self._count(run_cost(run_dir))
            return run_dir
        left = self.left() or 0.0
        if left < LEAST_CHILD_USD:
            raise BudgetStop(self.stopped(f"nothing is left for {step}"))
        # Rounded down: the step may spend no more than what is left.
        handed = int(left * 1e6) / 1e6
        admission = self.ceiling.reserve(handed, what=step)
        if admission.kind != GO:  # pragma: no cover - one step at a time holds nothing else
            raise BudgetStop(self.stopped(admission.reason or f"{step} cannot start"))
        cost: float | None = None
        try:
            run_dir = run([f"--eval-max-cost={handed:.6f}"])
            cost = run_cost(run_dir) if run_dir is not None else 0.0
            return run_dir
        finally:
            self.ceiling.settle(admission, cost)
            self._count(cost)

    # --- a step in this process -----------------------------------------------------------

    def client(self, inner: Any) -> Any:
        """`inner` (an `AsyncAnthropic`) with every Messages API call reserved first."""
        return _BudgetedClient(inner, self)

    def reserve_call(self, request: dict[str, Any]) -> Any:
        if self.ceiling is None:
            return None
        bound = call_bound(request, self.prices)
        admission = self.ceiling.reserve(bound, what=f"one call of {request.get('model')}")
        if admission.kind != GO:
            left = self.left() or 0.0
            most = "an unknown amount (no price)" if bound is None else f"up to ${bound:.4f}"
            raise BudgetStop(
                self.stopped(
                    f"the next call of {request.get('model')} reserves {most} and ${left:.4f} "
                    "is left"
                )
            )
        return admission

    def settle_call(self, admission: Any, model: str, usage: Any) -> None:
        cost = None if usage is None else self.prices.cost(model, Usage.of_reply(usage))
        if admission is not None and self.ceiling is not None:
            self.ceiling.settle(admission, cost)
        self._count(cost)

    # --- words ----------------------------------------------------------------------------

    def stopped(self, why: str) -> str:
        assert self.usd is not None
        return f"stopped before the budget: ${self.spent:.4f} of ${self.usd:.2f} spent; {why}"

    def last_line(self) -> str:
        unknown = f" (and {self.unknown} step(s) of unknown cost)" if self.unknown else ""
        if self.usd is None:
            return f"spent ${self.spent:.4f}{unknown}; no budget (--budget-usd sets one)"
        return f"spent ${self.spent:.4f} of budget ${self.usd:.2f}{unknown}"


def run_cost(run_dir: Path) -> float | None:
    """What one pytest run spent: its ceiling's count when it ran under one (unknown costs at
    their reservation), else the sum of its roles' costs (None when one is unknown)."""
    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.measure import aggregates

    try:
        info = ledger_reader.read_run_info(run_dir)
    except (OSError, ValueError):
        return None
    spend = info.spend or {}
    if isinstance(spend.get("spentUsd"), (int, float)):
        return float(spend["spentUsd"])
    total = 0.0
    for cost in aggregates.role_costs(ledger_reader.read_run(run_dir)).values():
        if cost.cost_usd is None:
            return None
        total += cost.cost_usd
    return total


class _BudgetedMessages:
    def __init__(self, inner: Any, budget: LoopBudget) -> None:
        self._inner = inner
        self._budget = budget

    async def create(self, **request: Any) -> Any:
        admission = self._budget.reserve_call(request)
        reply = None
        try:
            reply = await self._inner.create(**request)
            return reply
        finally:
            usage = getattr(reply, "usage", None)
            model = getattr(reply, "model", None) or str(request.get("model", ""))
            self._budget.settle_call(admission, model, usage)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _BudgetedClient:
    """An `AsyncAnthropic` whose `messages.create` goes through the loop's budget."""

    def __init__(self, inner: Any, budget: LoopBudget) -> None:
        self._inner = inner
        self.messages = _BudgetedMessages(inner.messages, budget)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
