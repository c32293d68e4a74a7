"""The Messages API as the fake speaks it: what the real API refuses, counts and sends.

Request validation (the 400s the real API answers), the deterministic token counts and the
shared prompt cache behind the usage figures, and the rendering of a policy's reply as a
message, as its server-sent-event stream, or as the API's error envelope. No I/O: the server
in `fake_anthropic` calls these.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from pytest_evalloop.model_api.caching import (
    LOOKBACK_BLOCKS,
    MAX_BREAKPOINTS,
    TTL_SECONDS,
    min_cacheable_tokens,
)
from pytest_evalloop.model_api.pricing import STANDARD_CONTEXT
from pytest_evalloop.testing.policies import FakeRequest, Reply, tool_use_id

API_VERSION = "2026-10-21"
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_REMOVED_SAMPLING = ("temperature", "top_p", "top_k")
# Rough chars-per-token of English and JSON; good enough for plausible, stable counts.
_CHARS_PER_TOKEN = 4


# --------------------------------------------------------------------------- validation


class InvalidRequest(Exception):
    """The body breaks a rule the real API enforces; becomes a 400 invalid_request_error."""


def validate_body(body: Any, context_windows: Mapping[str, int] | None = None) -> None:
    """Raise :class:`InvalidRequest` where the real Messages API would answer 400: a prompt
    longer than its model's context window too (`context_windows`, else the standard one)."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    for name in _REMOVED_SAMPLING:
        if name in body:
            raise InvalidRequest(
                f"{name}: this parameter is not supported with anthropic-version {API_VERSION}; "
                "remove it from the request (sampling settings were retired)"
            )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: Field required (a non-empty model id string)")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise InvalidRequest(
            f"max_tokens: Field required, a non-negative integer; got {max_tokens!r}"
        )
    if "stream" in body and not isinstance(body["stream"], bool):
        raise InvalidRequest(f"stream: Input should be a valid boolean; got {body['stream']!r}")
    _validate_tools(body.get("tools"))
    _validate_messages(body.get("messages"))
    found = breakpoint_count(body)
    if found > MAX_BREAKPOINTS:
        raise InvalidRequest(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {found}."
        )
    window = (context_windows or {}).get(model, STANDARD_CONTEXT)
    points = prefix_points(body)
    prompt = (points[-1].end if points else 0) + FRAMING_TOKENS
    if prompt > window:
        # The API's own words; such a request is refused before anything is billed.
        raise InvalidRequest(f"prompt is too long: {prompt} tokens > {window} maximum")


def _validate_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise InvalidRequest("tools: Input should be a valid list")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise InvalidRequest(
                f"tools.{i}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'; got {name!r}"
            )
        if name in seen:
            raise InvalidRequest(f"tools: Tool names must be unique; {name!r} appears twice")
        seen.add(name)
        if tool.get("type", "custom") == "custom" and not isinstance(
            tool.get("input_schema"), dict
        ):
            raise InvalidRequest(f"tools.{i}.input_schema: Field required for tool {name!r}")


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def _validate_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: Field required, a non-empty list of messages")
    previous_uses: set[str] = set()
    previous_role: str | None = None
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in (
            "user",
            "assistant",
            "system",
        ):
            raise InvalidRequest(
                f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'"
            )
        content = message.get("content")
        if not isinstance(content, str | list):
            raise InvalidRequest(
                f"messages.{i}.content: Field required, a string or a list of blocks"
            )
        for j, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise InvalidRequest(f"messages.{i}.content.{j}.type: Field required")
        role = message["role"]
        if role == "system":
            continue
        results = {
            str(b.get("tool_use_id")) for b in _blocks(message) if b.get("type") == "tool_result"
        }
        if results and role != "user":
            raise InvalidRequest(
                f"messages.{i}: tool_result blocks may only appear in user messages"
            )
        stray = results - previous_uses
        if stray:
            raise InvalidRequest(
                f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{sorted(stray)}. Each `tool_result` block must have a corresponding `tool_use` "
                "block in the previous message."
            )
        missing = previous_uses - results
        if previous_role == "assistant" and missing:
            raise InvalidRequest(
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {sorted(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
        previous_uses = (
            {str(b.get("id")) for b in _blocks(message) if b.get("type") == "tool_use"}
            if role == "assistant"
            else set()
        )
        previous_role = role
    roles = [m["role"] for m in messages if m["role"] != "system"]
    if not roles or roles[0] != "user":
        raise InvalidRequest("messages.0.role: the first message must use the 'user' role")


# --------------------------------------------------------------------------- token accounting


def count_tokens(value: Any) -> int:
    """A deterministic token estimate: compact JSON length / 4, at least 1."""
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, sort_keys=True, separators=(",", ":"))
    )
    return max(1, math.ceil(len(text) / _CHARS_PER_TOKEN))


def _segments(body: Mapping[str, Any]) -> list[tuple[str, dict[str, Any] | None]]:
    """The prompt's blocks in render order (tools, system, messages) as (text, the block's
    cache_control or None); a top-level cache_control marks the last block (the API's
    automatic caching)."""
    out: list[tuple[str, dict[str, Any] | None]] = []

    def marker(block: Any) -> dict[str, Any] | None:
        found = block.get("cache_control") if isinstance(block, Mapping) else None
        return dict(found) if isinstance(found, Mapping) else None

    def text(block: Any) -> str:
        # Where the breakpoint sits is not part of the prompt: a block hashes the same marked
        # or not, so the next turn (which moves the mark) still matches this prefix.
        if isinstance(block, Mapping):
            block = {k: v for k, v in block.items() if k != "cache_control"}
        return json.dumps(block, sort_keys=True)

    for tool in body.get("tools") or []:
        out.append((text(tool), marker(tool)))
    # A string is one text block to the API: it hashes as that block would.
    system = body.get("system")
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    for block in system if isinstance(system, list) else []:
        out.append((text(block), marker(block)))
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for block in content:
            out.append((message["role"] + ":" + text(block), marker(block)))
    auto = body.get("cache_control")
    if isinstance(auto, Mapping) and out:
        out[-1] = (out[-1][0], dict(auto))
    return out


def breakpoint_count(body: Mapping[str, Any]) -> int:
    """How many cache breakpoints a request sets (the top-level one included)."""
    return sum(1 for _, mark in _segments(body) if mark is not None)


def _ttl(mark: Mapping[str, Any]) -> str:
    ttl = mark.get("ttl", "5m")
    return ttl if ttl in TTL_SECONDS else "5m"


FRAMING_TOKENS = 8
"""Input tokens of a request's own framing, counted in every request and never cached."""


class Prefix(NamedTuple):
    """The prompt up to the end of one block: what a cache entry there is keyed by."""

    key: str
    """Digest of the model and every block up to this one (where breakpoints sit aside)."""
    end: int
    """Tokens from the start of the prompt to the end of this block."""
    mark: dict[str, Any] | None
    """The block's cache_control, None when it is no breakpoint."""


def prefix_points(body: Mapping[str, Any]) -> list[Prefix]:
    """Every block boundary of a request in render order: the places a cache entry can sit.
    The cache below keys its entries by these; `bench/cost.py` reads them to find the best any
    marking could do."""
    digest = hashlib.sha256(str(body.get("model")).encode())
    out = []
    cumulative = 0
    for text, mark in _segments(body):
        digest.update(text.encode("utf-8"))
        cumulative += count_tokens(text)
        out.append(Prefix(digest.copy().hexdigest(), cumulative, mark))
    return out


class CacheUsage(NamedTuple):
    """One request's input tokens as the API reports them."""

    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    ephemeral_5m_input_tokens: int = 0
    ephemeral_1h_input_tokens: int = 0


class PromptCache:
    """The prompt cache shared by all clients, by the API's rules (`model_api.caching`).

    A prefix is written at each breakpoint whose prefix reaches the model's minimum cacheable
    length, and lives its TTL (5 minutes, or 1 hour when asked) from its last write or read. A
    request reads the longest cached prefix found at one of its breakpoints or up to
    `LOOKBACK_BLOCKS` block boundaries before it; nothing else is ever read. `clock` (seconds)
    is the test's to move: a TTL is tested by moving it, never by waiting.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: dict[str, tuple[float, float]] = {}
        """Prefix digest -> (expiry time, its TTL in seconds)."""
        self._lock = threading.Lock()
        self.clock = clock

    def clear(self) -> None:
        """Forget every cached prefix."""
        with self._lock:
            self._entries.clear()

    def usage(self, body: Mapping[str, Any]) -> CacheUsage:
        """Read and write the cache for one request: its usage figures."""
        model = str(body.get("model"))
        prefixes = prefix_points(body)
        keys = [p.key for p in prefixes]
        ends = [p.end for p in prefixes]
        marks = [p.mark for p in prefixes]
        total = (ends[-1] if ends else 0) + FRAMING_TOKENS
        points = [i for i, mark in enumerate(marks) if mark is not None]
        if not points:
            return CacheUsage(total, 0, 0)
        floor = min_cacheable_tokens(model)
        now = self.clock()
        with self._lock:
            # Each key looked up, never a scan of the entries: a scan made every request cost
            # as much as the cache was large, and a 4,000-case bench run (24,000 requests, tens
            # of thousands of live prefixes) spent more CPU in the fake than in the harness.
            entries = self._entries
            read_at = -1
            for point in points:
                for j in range(point, max(-1, point - LOOKBACK_BLOCKS - 1), -1):
                    entry = entries.get(keys[j])
                    if entry is not None and entry[0] > now:
                        read_at = max(read_at, j)
                        break
            if read_at >= 0:
                # A hit refreshes the entry's TTL.
                _, ttl = self._entries[keys[read_at]]
                self._entries[keys[read_at]] = (now + ttl, ttl)
            written = {"5m": 0, "1h": 0}
            start = ends[read_at] if read_at >= 0 else 0
            cached_end = start
            for point in points:
                mark = marks[point] or {}
                if ends[point] < floor or point <= read_at:
                    continue  # under the floor nothing is written, silently
                kind = _ttl(mark)
                lives = TTL_SECONDS[kind]
                self._entries[keys[point]] = (now + lives, lives)
                written[kind] += ends[point] - cached_end
                cached_end = ends[point]
        read = start
        created = cached_end - read
        return CacheUsage(total - cached_end, created, read, written["5m"], written["1h"])


# --------------------------------------------------------------------------- message rendering


def content_blocks(reply: Reply, request: FakeRequest) -> tuple[list[dict[str, Any]], str, int]:
    """Content blocks that fit the token budget, the stop reason and the output token count."""
    budget = request.max_tokens
    blocks: list[dict[str, Any]] = []
    used = 0
    truncated = False
    if reply.text:
        tokens = count_tokens(reply.text)
        text = reply.text
        if tokens > budget:
            text, tokens, truncated = text[: budget * _CHARS_PER_TOKEN], budget, True
        if text:
            blocks.append({"type": "text", "text": text})
        used += tokens
    for i, call in enumerate(reply.tool_calls):
        block = {
            "type": "tool_use",
            "id": call.id or tool_use_id(request, i),
            "name": call.name,
            "input": dict(call.input),
        }
        tokens = count_tokens(block)
        if truncated or used + tokens > budget:
            truncated = True
            break
        blocks.append(block)
        used += tokens
    if truncated:
        return blocks, "max_tokens", max(used, 0)
    default = "tool_use" if reply.tool_calls else "end_turn"
    return blocks, reply.stop_reason or default, max(used, 1)


def render_message(
    request: FakeRequest,
    blocks: list[dict[str, Any]],
    stop_reason: str | None,
    usage: dict[str, int],
) -> dict[str, Any]:
    return {
        "id": f"msg_fake_{request.call_index:06d}",
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }


def _sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _chunks(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


def sse_events(message: Mapping[str, Any]) -> bytes:
    """Render a finished message as the Messages API's streaming event sequence."""
    usage = dict(message["usage"])
    start = dict(message, content=[], stop_reason=None, usage=dict(usage, output_tokens=1))
    out = [_sse("message_start", {"type": "message_start", "message": start})]
    out.append(_sse("ping", {"type": "ping"}))
    for index, block in enumerate(message["content"]):
        first: dict[str, Any]
        if block["type"] == "text":
            first = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": c} for c in _chunks(block["text"], 24)]
        else:
            first = dict(block, input={})
            raw = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": c} for c in _chunks(raw, 16)]
        out.append(
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": first},
            )
        )
        for step in deltas:
            out.append(
                _sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": step},
                )
            )
        out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta: dict[str, Any] = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    out.append(
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": delta,
                # The API repeats the cumulative usage here, cache counters included.
                "usage": {k: v for k, v in usage.items() if k != "cache_creation"},
            },
        )
    )
    out.append(_sse("message_stop", {"type": "message_stop"}))
    return b"".join(out)


def error_body(error_type: str, message: str, request_id: str) -> dict[str, Any]:
    """The real API's error envelope."""
    return {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": request_id,
    }


class RequestLimit:
    """One API key's requests-per-minute limit, as the API enforces it: a bucket refilled
    continuously at `rpm`/60 a second, holding at most `burst_seconds` of it (stricter than the
    API, whose bucket holds a minute: a client that keeps this one keeps the API's), and the
    `anthropic-ratelimit-requests-*` headers on every reply. Thread-safe: the fake serves each
    connection on its own thread.
    """

    def __init__(
        self, rpm: int, *, burst_seconds: float = 2.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.rpm = rpm
        self.rate = rpm / 60.0
        self.capacity = max(1.0, self.rate * burst_seconds)
        self._clock = clock
        self._level = self.capacity
        self._stamp = clock()
        self._lock = threading.Lock()
        self.log: list[tuple[float, int]] = []
        """Every request it counted: (time, 200 or 429)."""

    def take(self) -> tuple[bool, dict[str, str]]:
        """Count one request: whether it may go, and the headers its reply carries."""
        with self._lock:
            now = self._clock()
            self._level = min(self.capacity, self._level + (now - self._stamp) * self.rate)
            self._stamp = now
            allowed = self._level >= 1.0
            if allowed:
                self._level -= 1.0
            self.log.append((now, 200 if allowed else 429))
            full_in = (self.capacity - self._level) / self.rate
            headers = {
                "anthropic-ratelimit-requests-limit": str(self.rpm),
                "anthropic-ratelimit-requests-remaining": str(int(self._level)),
                "anthropic-ratelimit-requests-reset": _rfc3339(now + full_in),
            }
            if not allowed:
                headers["retry-after"] = str(max(1, math.ceil((1.0 - self._level) / self.rate)))
            return allowed, headers


def _rfc3339(stamp: float) -> str:
    from datetime import UTC, datetime

    return (
        datetime.fromtimestamp(stamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )
