"""A loopback fake of the Anthropic Messages API, driven by policies.

In-process::

    with FakeAnthropic(spec_or_callable) as fake:
        client = anthropic.Anthropic(base_url=fake.base_url, api_key="sk-fake")

As a separate process (shared by pytester runs and xdist workers)::

    python -m pytest_evalloop.testing.fake_anthropic --policy-file spec.json [--port N]

prints ``EVALLOOP_FAKE_ANTHROPIC_URL=http://127.0.0.1:PORT`` once it accepts connections.
The standard library serves HTTP, so importing this module stays light.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import importlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel, Field

from pytest_evalloop.testing.policies import (
    Disconnect,
    FakeRequest,
    Fault,
    Hang,
    Malformed,
    Outcome,
    Policy,
    Reply,
    ScriptSpec,
    as_policy,
    parse_request,
    redact_headers,
    tool_use_id,
)

URL_LINE_PREFIX = "EVALLOOP_FAKE_ANTHROPIC_URL="
API_VERSION = "2026-10-21"
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_REMOVED_SAMPLING = ("temperature", "top_p", "top_k")
# Rough chars-per-token of English and JSON; good enough for plausible, stable counts.
_CHARS_PER_TOKEN = 4


class RecordedRequest(BaseModel):
    """One request the fake served, as tests see it (credentials redacted)."""

    call_index: int
    path: str
    received_at: float = Field(default_factory=time.time)
    """Wall-clock time (time.time) the fake read the request: benchmarks time a run's phases."""
    role: str | None = None
    model: str | None = None
    question: str | None = None
    turn: int | None = None
    tools: list[str] = Field(default_factory=list)
    stream: bool = False
    headers: dict[str, str] = Field(default_factory=dict)
    status: int = 200
    outcome: str = "reply"
    stop_reason: str | None = None
    error: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


# --------------------------------------------------------------------------- validation


class InvalidRequest(Exception):
    """The body breaks a rule the real API enforces; becomes a 400 invalid_request_error."""


def validate_body(body: Any) -> None:
    """Raise :class:`InvalidRequest` where the real Messages API would answer 400."""
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


def _segments(body: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """The prompt in cache order (tools, system, messages) as (text, ends a cache breakpoint)."""
    out: list[tuple[str, bool]] = []
    for tool in body.get("tools") or []:
        out.append((json.dumps(tool, sort_keys=True), "cache_control" in tool))
    system = body.get("system")
    if isinstance(system, str):
        out.append((system, False))
    for block in system if isinstance(system, list) else []:
        out.append(
            (
                json.dumps(block, sort_keys=True),
                isinstance(block, dict) and "cache_control" in block,
            )
        )
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            out.append((message["role"] + ":" + content, False))
            continue
        for block in content:
            out.append(
                (
                    message["role"] + ":" + json.dumps(block, sort_keys=True),
                    "cache_control" in block,
                )
            )
    if body.get("cache_control") and out:
        # A top-level cache_control marks the last cacheable block.
        out[-1] = (out[-1][0], True)
    return out


class PromptCache:
    """Which prompt prefixes were written to the (fake) cache, shared by all clients."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget every cached prefix."""
        with self._lock:
            self._keys.clear()

    def usage(self, body: Mapping[str, Any]) -> tuple[int, int, int]:
        """Return (uncached input tokens, cache creation tokens, cache read tokens)."""
        digest = hashlib.sha256(str(body.get("model")).encode())
        cumulative = 0
        breakpoints: list[tuple[str, int]] = []
        for text, is_breakpoint in _segments(body):
            digest.update(text.encode("utf-8"))
            cumulative += count_tokens(text)
            if is_breakpoint:
                breakpoints.append((digest.copy().hexdigest(), cumulative))
        total = cumulative + 8  # per-request framing overhead
        if not breakpoints:
            return total, 0, 0
        with self._lock:
            read = max((n for key, n in breakpoints if key in self._keys), default=0)
            self._keys.update(key for key, _ in breakpoints)
        cached = breakpoints[-1][1]
        return total - cached, cached - read, read


# --------------------------------------------------------------------------- message rendering


def _content_blocks(reply: Reply, request: FakeRequest) -> tuple[list[dict[str, Any]], str, int]:
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


def _message(
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
                "usage": {"output_tokens": usage["output_tokens"]},
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


# --------------------------------------------------------------------------- the server


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # The stdlib default backlog of 5 drops bursts of concurrent connects (xdist workers,
    # --eval-concurrency), and each dropped SYN costs the client a 1 s retransmit.
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], fake: FakeAnthropic) -> None:
        self.fake = fake
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes on a keep-alive connection; without
    # TCP_NODELAY each reply waits ~40 ms for the client's delayed ACK.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Keep test output quiet; the request log is the record."""

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        if self.path.split("?")[0] == "/_fake/requests":
            data = [r.model_dump() for r in self.server.fake.requests]
            self._send_json(200, data)
        elif self.path.split("?")[0] == "/_fake/health":
            self._send_json(200, {"ok": True})
        else:
            self._send_json(
                404, error_body("not_found_error", f"no route GET {self.path}", "req_fake")
            )

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        path = self.path.split("?")[0]
        if path == "/_fake/reset":
            self.server.fake.reset()
            self._send_json(200, {"ok": True})
        elif path == "/v1/messages":
            self.server.fake.handle_messages(self, raw)
        else:
            self._send_json(
                404, error_body("not_found_error", f"no route POST {self.path}", "req_fake")
            )

    def _send(
        self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (timeout); nothing left to tell it.
            self.close_connection = True

    def _send_json(self, status: int, data: Any, headers: Mapping[str, str] | None = None) -> None:
        self._send(status, json.dumps(data).encode(), "application/json", headers)


class FakeAnthropic:
    """The fake Messages API server; a context manager serving from a background thread.

    ``policy`` is a callable policy, a :class:`ScriptSpec`, or ``None`` (an empty spec).
    """

    def __init__(
        self, policy: Policy | ScriptSpec | None = None, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.policy = as_policy(policy)
        self._address = (host, port)
        self._lock = threading.Lock()
        self._log: list[RecordedRequest] = []
        self._calls = 0
        self._stopping = threading.Event()
        self.cache = PromptCache()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle

    def start(self) -> FakeAnthropic:
        """Bind and serve in a daemon thread; returns self."""
        self._stopping.clear()
        self._server = _Server(self._address, self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; hanging handlers are released at once."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def serve_forever(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve in the calling thread until interrupted (the subprocess mode).

        ``on_ready`` gets the base URL once the socket is bound.
        """
        self._server = _Server(self._address, self)
        try:
            if on_ready is not None:
                on_ready(self.base_url)
            self._server.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            pass
        finally:
            self._stopping.set()
            self._server.server_close()

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``: pass as ``base_url`` or ``ANTHROPIC_BASE_URL``."""
        if self._server is None:
            raise RuntimeError(
                "FakeAnthropic is not running; use it as a context manager or call start()"
            )
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def env(self, api_key: str = "fake-key-not-a-secret") -> dict[str, str]:
        """Environment variables that point the anthropic SDK at this fake."""
        return {"ANTHROPIC_BASE_URL": self.base_url, "ANTHROPIC_API_KEY": api_key}

    # ---- the record

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request served so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._log)

    def calls(self, role: str | None = None) -> list[RecordedRequest]:
        """The ``/v1/messages`` requests, optionally only those of one role."""
        return [
            r
            for r in self.requests
            if r.path == "/v1/messages" and (role is None or r.role == role)
        ]

    def reset(self) -> None:
        """Forget the request log and the prompt cache, and rewind the policy if it can."""
        with self._lock:
            self._log.clear()
            self._calls = 0
        self.cache.clear()
        reset = getattr(self.policy, "reset", None)
        if callable(reset):
            reset()

    def _record(self, entry: RecordedRequest) -> None:
        with self._lock:
            self._log.append(entry)

    # ---- /v1/messages

    def handle_messages(self, handler: _Handler, raw: bytes) -> None:
        """Validate, ask the policy, and send the reply or fault."""
        with self._lock:
            index = self._calls
            self._calls += 1
        request_id = f"req_fake_{index:06d}"
        headers = {k: v for k, v in handler.headers.items()}
        entry = RecordedRequest(
            call_index=index, path="/v1/messages", headers=redact_headers(headers)
        )
        try:
            body = json.loads(raw or b"null")
            validate_body(body)
        except (json.JSONDecodeError, InvalidRequest) as exc:
            entry.status, entry.outcome, entry.error = 400, "invalid", str(exc)
            self._record(entry)
            handler._send_json(
                400,
                error_body("invalid_request_error", str(exc), request_id),
                {"request-id": request_id},
            )
            return
        request = parse_request(body, headers, index)
        entry.role, entry.model, entry.question = request.role, request.model, request.question
        entry.turn, entry.tools, entry.stream = request.turn, request.tool_names, request.stream
        try:
            with self._lock:
                outcome = self.policy(request)
            if isinstance(outcome, str):
                outcome = Reply(text=outcome)
            if not isinstance(outcome, Reply | Fault | Malformed | Hang | Disconnect):
                raise TypeError(
                    f"the policy returned {outcome!r}; return a Reply, Fault, Malformed, Hang, Disconnect or str"
                )
        except Exception as exc:
            # Any policy bug must reach the test as a readable, non-retried 500,
            # not as a dropped connection.
            outcome = Fault(
                status=500,
                error_type="api_error",
                message=f"fake-anthropic policy error: {type(exc).__name__}: {exc}",
                should_retry=False,
            )
        self._record(entry)
        self._respond(handler, request, outcome, entry, request_id, headers)

    def _respond(
        self,
        handler: _Handler,
        request: FakeRequest,
        outcome: Outcome,
        entry: RecordedRequest,
        request_id: str,
        raw_headers: Mapping[str, str],
    ) -> None:
        if isinstance(outcome, Disconnect | Hang):
            entry.outcome, entry.status = type(outcome).__name__.lower(), 0
            if isinstance(outcome, Hang):
                self._stopping.wait(outcome.seconds)
            handler.close_connection = True
            return
        self._stopping.wait(outcome.latency)
        if isinstance(outcome, Malformed):
            entry.outcome, entry.status = "malformed", outcome.status
            content_type = "text/event-stream" if request.stream else "application/json"
            body = outcome.body.encode()
            if outcome.content_type is not None:
                content_type = outcome.content_type
            elif request.stream:
                body = b"event: message_start\ndata: " + body + b"\n\n"
            handler._send(outcome.status, body, content_type, {"request-id": request_id})
            return
        if isinstance(outcome, Fault):
            entry.outcome, entry.status, entry.error = "fault", outcome.status, outcome.type
            message = (
                outcome.message or f"fake-anthropic: injected {outcome.type} ({outcome.status})"
            )
            if outcome.echo_credentials:
                entry.outcome = "gateway"
                message = gateway_message(raw_headers)
            handler._send_json(
                outcome.status,
                error_body(outcome.type, message, request_id),
                _fault_headers(outcome, request_id),
            )
            return
        self._send_reply(handler, request, outcome, entry, request_id)

    def _send_reply(
        self,
        handler: _Handler,
        request: FakeRequest,
        reply: Reply,
        entry: RecordedRequest,
        request_id: str,
    ) -> None:
        blocks, stop_reason, output_tokens = _content_blocks(reply, request)
        uncached, created, read = self.cache.usage(request.body)
        usage = {
            "input_tokens": uncached,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read,
        }
        entry.stop_reason = stop_reason
        entry.input_tokens, entry.output_tokens = uncached, output_tokens
        entry.cache_creation_input_tokens, entry.cache_read_input_tokens = created, read
        message = _message(request, blocks, stop_reason, usage)
        headers = {"request-id": request_id}
        if request.stream:
            handler._send(200, sse_events(message), "text/event-stream; charset=utf-8", headers)
        else:
            handler._send_json(200, message, headers)


def gateway_message(headers: Mapping[str, str]) -> str:
    """What a careless gateway says when it refuses a request: its credentials, verbatim (and a
    Basic header decoded to the user:password it carries)."""
    said = []
    lowered = {k.lower(): v for k, v in headers.items()}
    for name in ("x-api-key", "authorization", "proxy-authorization"):
        value = lowered.get(name)
        if not value:
            continue
        said.append(f"{name}: {value}")
        scheme, _, encoded = value.partition(" ")
        if scheme.lower() == "basic":
            with contextlib.suppress(ValueError):
                said.append(f"user:password {base64.b64decode(encoded).decode()}")
    return "gateway: upstream refused the credentials " + ("; ".join(said) or "(none sent)")


def _fault_headers(fault: Fault, request_id: str) -> dict[str, str]:
    headers = {"request-id": request_id}
    if fault.retry_after is not None:
        headers["retry-after"] = f"{fault.retry_after:g}"
    if fault.retry_after_ms is not None:
        headers["retry-after-ms"] = f"{fault.retry_after_ms:g}"
    if fault.should_retry is not None:
        headers["x-should-retry"] = "true" if fault.should_retry else "false"
    return headers


# --------------------------------------------------------------------------- remote helpers


def fetch_requests(url: str, timeout: float = 10.0) -> list[RecordedRequest]:
    """Read the request log of a fake at ``url`` (``GET /_fake/requests``)."""
    with urllib.request.urlopen(url.rstrip("/") + "/_fake/requests", timeout=timeout) as resp:
        return [RecordedRequest.model_validate(r) for r in json.loads(resp.read())]


def reset_fake(url: str, timeout: float = 10.0) -> None:
    """Clear the log, cache and script positions of a fake at ``url`` (``POST /_fake/reset``)."""
    req = urllib.request.Request(url.rstrip("/") + "/_fake/reset", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=timeout):
        pass


class FakeAnthropicProcess:
    """A fake running in a child process: ``url``, ``stop()``, ``requests()``, ``reset()``."""

    def __init__(
        self, process: subprocess.Popen[str], url: str, cleanup: Sequence[Path] = ()
    ) -> None:
        self.process = process
        self.url = url
        self._cleanup = list(cleanup)

    def requests(self) -> list[RecordedRequest]:
        """The child's request log."""
        return fetch_requests(self.url)

    def reset(self) -> None:
        """Reset the child's log, cache and scripts."""
        reset_fake(self.url)

    def env(self, api_key: str = "fake-key-not-a-secret") -> dict[str, str]:
        """Environment variables that point the anthropic SDK at this fake."""
        return {"ANTHROPIC_BASE_URL": self.url, "ANTHROPIC_API_KEY": api_key}

    def stop(self) -> None:
        """Terminate the child (kill after 5 s) and remove temporary files."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        for path in self._cleanup:
            with contextlib.suppress(OSError):
                path.unlink()

    def __enter__(self) -> FakeAnthropicProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_fake_anthropic_process(
    policy: ScriptSpec | str | Path,
    *,
    port: int = 0,
    startup_timeout: float = 20.0,
    python: str = sys.executable,
) -> FakeAnthropicProcess:
    """Start ``python -m pytest_evalloop.testing.fake_anthropic`` and wait for its URL line.

    ``policy`` is a spec object (written to a temporary file) or the path of a spec JSON file.
    """
    cleanup: list[Path] = []
    if isinstance(policy, ScriptSpec):
        if policy.cases_file and not Path(policy.cases_file).is_absolute():
            policy = policy.model_copy(
                update={"cases_file": str(Path(policy.cases_file).resolve())}
            )
        fd, name = tempfile.mkstemp(prefix="evalloop-fake-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(policy.model_dump_json())
        policy = Path(name)
        cleanup.append(policy)
    err_fd, err_name = tempfile.mkstemp(prefix="evalloop-fake-", suffix=".stderr")
    cleanup.append(Path(err_name))
    cmd = [
        python,
        "-m",
        "pytest_evalloop.testing.fake_anthropic",
        "--policy-file",
        str(policy),
        "--port",
        str(port),
    ]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_fd, text=True)
    os.close(err_fd)
    url = _wait_for_url(process, startup_timeout)
    if url is None:
        process.kill()
        process.wait(timeout=5)
        detail = Path(err_name).read_text(encoding="utf-8", errors="replace")[-2000:]
        for path in cleanup:
            with contextlib.suppress(OSError):
                path.unlink()
        raise RuntimeError(
            f"the fake Anthropic process ({' '.join(cmd)}) did not print {URL_LINE_PREFIX}... "
            f"within {startup_timeout} s; its stderr:\n{detail}"
        )
    return FakeAnthropicProcess(process, url, cleanup)


def _wait_for_url(process: subprocess.Popen[str], timeout: float) -> str | None:
    found: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(URL_LINE_PREFIX):
                found.append(line[len(URL_LINE_PREFIX) :].strip())
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while reader.is_alive() and time.monotonic() < deadline:
        reader.join(timeout=0.05)
    return found[0] if found else None


# --------------------------------------------------------------------------- command line


def _load_callable(target: str) -> Policy:
    module_name, _, attr = target.partition(":")
    if not attr:
        raise SystemExit(f"--policy {target!r}: expected 'package.module:callable'")
    obj = getattr(importlib.import_module(module_name), attr)
    return obj() if isinstance(obj, type) else obj


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the fake until killed, after printing the ``EVALLOOP_FAKE_ANTHROPIC_URL=`` line."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_evalloop.testing.fake_anthropic", description=main.__doc__
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--policy-file", type=Path, help="a ScriptSpec JSON file")
    source.add_argument("--policy", help="a callable policy as package.module:name")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 = any free port)")
    args = parser.parse_args(argv)
    policy: Policy | ScriptSpec | None = None
    if args.policy_file is not None:
        try:
            policy = ScriptSpec.load(args.policy_file)
        except (OSError, ValueError) as exc:
            parser.error(f"--policy-file {args.policy_file}: {exc}")
    elif args.policy is not None:
        policy = _load_callable(args.policy)
    fake = FakeAnthropic(policy, port=args.port)
    fake.serve_forever(lambda url: print(f"{URL_LINE_PREFIX}{url}", flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
