"""Prompt caching as the Messages API does it: the per-model floor, and where we put breakpoints.

The API caches the prompt prefix ending at a ``cache_control`` breakpoint (render order tools,
system, messages; at most :data:`MAX_BREAKPOINTS` per request) only when that prefix reaches
the model's **minimum cacheable length**; below it the request is billed in full and both
cache counters stay 0, silently. :data:`MIN_CACHEABLE_TOKENS` is that floor per model, from
the API's prompt caching documentation ("Cache limitations", as of 2026-11):

- 4,096 tokens: Claude Opus 4.6, Opus 4.5, Haiku 4.5
- 2,048 tokens: Claude Sonnet 4.6, Haiku 3.5, Haiku 3
- 1,024 tokens: Claude Sonnet 4.5, Sonnet 4, Opus 4.1, Opus 4, Sonnet 3.7

An unknown model takes the most conservative floor (:data:`UNKNOWN_FLOOR`). A read looks for
a cached prefix at the breakpoint and at most :data:`LOOKBACK_BLOCKS` block boundaries before
it; a cache entry lives 5 minutes (or 1 hour with ``"ttl": "1h"``) from its last use.

:func:`conversation_request` marks a tool-use conversation so each turn reads the turns before
it: the stable prefix (the last tool, the system prompt) and two breakpoints that move with the
conversation, the end of the previous request (an exact hit, however many blocks the last turn
added) and the end of this one (what the next turn reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_evalloop.model_api.endpoint import list_price_note

MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
EPHEMERAL: dict[str, Any] = {"type": "ephemeral"}

MIN_CACHEABLE_TOKENS: dict[str, int] = {
    "claude-opus-4-6": 4096,
    "claude-opus-4-5": 4096,
    "claude-haiku-4-5": 4096,
    "claude-sonnet-4-6": 2048,
    "claude-3-5-haiku": 2048,
    "claude-3-haiku": 2048,
    "claude-sonnet-4-5": 1024,
    "claude-sonnet-4-0": 1024,
    "claude-sonnet-4": 1024,
    "claude-opus-4-1": 1024,
    "claude-opus-4-0": 1024,
    "claude-opus-4": 1024,
    "claude-3-7-sonnet": 1024,
}
UNKNOWN_FLOOR = max(MIN_CACHEABLE_TOKENS.values())


def min_cacheable_tokens(model: str) -> int:
    """The model's floor: its id, else the longest known id it extends by a date or
    ``-latest`` tail, else the most conservative floor."""
    from pytest_evalloop.model_api.pricing import _ID_TAIL

    if model in MIN_CACHEABLE_TOKENS:
        return MIN_CACHEABLE_TOKENS[model]
    known = [
        k
        for k in MIN_CACHEABLE_TOKENS
        if model.startswith(k) and _ID_TAIL.fullmatch(model[len(k) :])
    ]
    return MIN_CACHEABLE_TOKENS[max(known, key=len)] if known else UNKNOWN_FLOOR


def _mark_last_block(message: dict[str, Any]) -> None:
    content = message.get("content")
    if isinstance(content, str):
        message["content"] = [{"type": "text", "text": content, "cache_control": EPHEMERAL}]
    elif isinstance(content, list) and content:
        content[-1] = {**content[-1], "cache_control": EPHEMERAL}


def conversation_request(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of a conversation (ending in a user turn) with its two moving breakpoints: the
    last block of the previous request's final user turn, and the last block of this one.
    The caller's list (the transcript) is left unmarked."""
    out = [dict(m) for m in messages]
    for m in out:
        if isinstance(m.get("content"), list):
            m["content"] = list(m["content"])
    if len(out) >= 3:
        _mark_last_block(out[-3])
    if out:
        _mark_last_block(out[-1])
    return out


def cache_note(role: str, model: str, calls: int, read: int, written: int) -> str | None:
    """The summary's line when a role marked prefixes but its cache never formed."""
    if calls == 0 or read or written:
        return None
    floor = min_cacheable_tokens(model)
    return (
        f"cache cannot form for the {role}: no marked prefix reached {floor:,} tokens for "
        f"{model} (the API's minimum cacheable length); its input is billed uncached"
    )


def cache_lines(
    costs: Mapping[str, Any],
    models: Mapping[str, str | None],
    cost_figures: Mapping[str, Mapping[str, float | None]],
    endpoint: str | None = None,
) -> list[str]:
    """Per role: the share of input read from the cache, the cost per case and the uncached
    cost (run.json `costFigures`), and once per role whose cache never formed, why. `costs`
    are `ledger.RoleCost` records; the terminal, report.html and the Markdown summary all
    print these lines. `endpoint`: a host other than Anthropic's, said on each cost line
    (`endpoint.list_price_note`)."""
    lines = []
    for role in ("answerer", "judge"):
        cost, found = costs.get(role), cost_figures.get(role) or {}
        if cost is None or cost.calls == 0:
            continue
        share, per_case, uncached = (
            found.get("cacheReadShare"),
            found.get("costPerCaseUsd"),
            found.get("uncachedCostUsd"),
        )
        parts = [] if share is None else [f"{share:.1%} of input tokens read from the cache"]
        if per_case is not None:
            parts.append(f"${per_case:.4f} a case")
        if uncached is not None:
            parts.append(f"${uncached:.4f} the same calls uncached")
        if parts:
            lines.append(f"{role} cost: " + ", ".join(parts) + list_price_note(endpoint))
        model = models.get(role)
        note = model and cache_note(
            role, model, cost.calls, cost.cache_read_tokens, cost.cache_creation_tokens
        )
        if note:
            lines.append(note)
    return lines
