"""What a model's tokens cost: list prices in USD per million tokens, and the cost of a Usage.

An unknown model costs ``None``, never 0: a run that reports "$0.00" for a model we have no
price for would read as free. Users add or override prices with a JSON file
(``PriceTable.from_file``) or ``PriceTable(extra=...)``.

The defaults are Anthropic's public list prices for the standard (not batch) API. Cache reads
cost 0.1x the input price and cache writes 1.25x (the 5-minute cache; the answerer only asks for
that one). Long-context surcharges (over 200k input tokens) are not modelled: our prompts stay
far below them.

`Usage`, a role's tokens over one attempt, is defined here beside what it costs, so the
Messages API layer needs nothing from the roles that report it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

_PER = 1_000_000
STANDARD_CONTEXT = 200_000
"""The context window of every model in the defaults: the API refuses a longer prompt (the
1M-token window needs a beta header the harness never sends)."""
# A dated or aliased id extends a known id by one of these tails: claude-x-20260101, -latest.
_ID_TAIL = re.compile(r"-(?:\d{8}|latest)")


class Usage(BaseModel):
    """Token usage of one role over one attempt."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0
    calls: int = 0

    @classmethod
    def of_reply(cls, usage: Any) -> Usage:
        """One Messages API call's usage (the SDK's `message.usage`), as one call."""
        return cls(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_input_tokens or 0,
            cache_creation_tokens=usage.cache_creation_input_tokens or 0,
            calls=1,
        )

    def add(self, other: Usage) -> None:
        """Accumulate another usage into this one."""
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_creation_tokens += other.cache_creation_tokens
        self.calls += other.calls


MAX_PRICE = 1_000_000.0
"""The dearest price a price file may give, USD per million tokens: a million times the
dearest model's. Beyond it a cost stops being a sum of money (at 1e308 every run's cost was
infinite, written into its ledger as a word JSON does not have)."""

_Usd = Annotated[float, Field(ge=0, le=MAX_PRICE, allow_inf_nan=False)]

MAX_CONTEXT = 1_000_000_000
"""The widest context window a price file may give, in tokens: the spend ceiling multiplies
it by prices, and a window of 10**400 tokens overflowed it mid-run."""


class Price(BaseModel):
    """List prices of one model, USD per million tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: _Usd
    output: _Usd
    cache_read: _Usd
    cache_write: _Usd
    context: Annotated[int, Field(gt=0, le=MAX_CONTEXT)] | None = None
    """The most input tokens one request may carry (None: `STANDARD_CONTEXT`). The spend
    ceiling's bound reads it (`model_api.spend`); a gateway model with a wider window sets it."""

    @property
    def dearest_input(self) -> float:
        """The highest price an input token can cost: read, written to the cache or neither."""
        return max(self.input, self.cache_read, self.cache_write)


def _list_price(input_usd: float, output_usd: float) -> Price:
    """A price with Anthropic's cache multipliers: read 0.1x input, 5-minute write 1.25x."""
    return Price(
        input=input_usd,
        output=output_usd,
        cache_read=round(input_usd * 0.1, 6),
        cache_write=round(input_usd * 1.25, 6),
    )


DEFAULT_PRICES: dict[str, Price] = {
    "claude-opus-4-6": _list_price(5.0, 25.0),
    "claude-opus-4-5": _list_price(5.0, 25.0),
    "claude-opus-4-1": _list_price(15.0, 75.0),
    "claude-opus-4-0": _list_price(15.0, 75.0),
    "claude-opus-4": _list_price(15.0, 75.0),
    "claude-sonnet-4-6": _list_price(3.0, 15.0),
    "claude-sonnet-4-5": _list_price(3.0, 15.0),
    "claude-sonnet-4-0": _list_price(3.0, 15.0),
    "claude-sonnet-4": _list_price(3.0, 15.0),
    "claude-3-7-sonnet": _list_price(3.0, 15.0),
    "claude-haiku-4-5": _list_price(1.0, 5.0),
    "claude-3-5-haiku": _list_price(0.8, 4.0),
    "claude-3-haiku": _list_price(0.25, 1.25),
}


class PriceTable:
    """Prices by model id: the defaults, overridden and extended by ``extra``."""

    def __init__(self, extra: dict[str, Price] | None = None) -> None:
        self.prices: dict[str, Price] = {**DEFAULT_PRICES, **(extra or {})}

    def scaled(self, factor: float) -> PriceTable:
        """Every price times `factor` (the Message Batches API's discount: 0.5)."""
        out = PriceTable()
        out.prices = {
            model: Price(
                input=p.input * factor,
                output=p.output * factor,
                cache_read=p.cache_read * factor,
                cache_write=p.cache_write * factor,
                context=p.context,
            )
            for model, p in self.prices.items()
        }
        return out

    @classmethod
    def from_file(cls, path: Path) -> PriceTable:
        """Defaults plus the prices in a JSON file ``{"model-id": {"input": .., "output": ..,
        "cache_read": .., "cache_write": ..}}``."""
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            # ValueError: broken JSON, or bytes that are not UTF-8; RecursionError: nesting
            # deeper than the parser goes.
            raise ValueError(f"price file {path}: cannot read it as JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise ValueError(
                f'price file {path}: expected an object {{"model-id": {{"input": ..}}}}, '
                f"got {type(raw).__name__}"
            )
        extra: dict[str, Price] = {}
        for model, fields in raw.items():
            try:
                extra[model] = Price.model_validate(fields)
            except ValidationError as exc:
                raise ValueError(
                    f"price file {path}: model {model!r} needs numbers from 0 to {MAX_PRICE:,.0f} "
                    f"for input, output, cache_read and cache_write (USD per million tokens), "
                    f"and optionally its context window in tokens (context); "
                    + "; ".join(
                        f"{'.'.join(map(str, e['loc'])) or 'the entry'} = {e.get('input')!r}: "
                        f"{e['msg']}"
                        for e in exc.errors()
                    )
                ) from exc
        return cls(extra)

    def price(self, model: str) -> Price | None:
        """The model's price: its exact id, else the longest known id it extends by a date
        or ``-latest`` tail (``claude-haiku-4-5-20251001``). ``None`` when unknown."""
        if model in self.prices:
            return self.prices[model]
        # Only a date-like tail counts: ``claude-opus-4-7`` must not inherit ``claude-opus-4``.
        known = [
            k for k in self.prices if model.startswith(k) and _ID_TAIL.fullmatch(model[len(k) :])
        ]
        return self.prices[max(known, key=len)] if known else None

    def context(self, model: str) -> int:
        """The most input tokens one request to `model` may carry (`Price.context`)."""
        price = self.price(model)
        return price.context if price is not None and price.context else STANDARD_CONTEXT

    def cost(self, model: str, usage: Usage) -> float | None:
        """USD for ``usage`` on ``model``; ``None`` (never 0) when the price is unknown."""
        price = self.price(model)
        if price is None:
            return None
        total = (
            usage.input_tokens * price.input
            + usage.output_tokens * price.output
            + usage.cache_read_tokens * price.cache_read
            + usage.cache_creation_tokens * price.cache_write
        )
        return total / _PER


def cost_figures(
    prices: PriceTable,
    model: str | None,
    *,
    input_tokens: int,
    output_tokens: int,
    cache_read_tokens: int,
    cache_creation_tokens: int,
    cost_usd: float | None,
    cases: int,
) -> dict[str, float | None]:
    """A role's cost figures over a run: the share of its input tokens read from the cache,
    its cost per case, and what the same calls would have cost with no cache at all (every
    input token at the input price). None where it cannot be known (no input, no price)."""
    total_in = input_tokens + cache_read_tokens + cache_creation_tokens
    price = prices.price(model) if model else None
    uncached = (
        None
        if price is None
        else round((total_in * price.input + output_tokens * price.output) / _PER, 6)
    )
    return {
        "cacheReadShare": round(cache_read_tokens / total_in, 4) if total_in else None,
        "costPerCaseUsd": round(cost_usd / cases, 6) if cost_usd is not None and cases else None,
        "uncachedCostUsd": uncached,
    }


def price_table(path: Path | None) -> PriceTable:
    """The default price table, extended by `--eval-prices` when given (every role's prices)."""
    return PriceTable.from_file(path) if path else PriceTable()
