"""A loopback fake of the Anthropic Messages API, driven by policies: the server.

In-process::

    with FakeAnthropic(spec_or_callable) as fake:
        client = anthropic.Anthropic(base_url=fake.base_url, api_key="sk-fake")

As a separate process (shared by pytester runs and xdist workers)::

    python -m pytest_evalloop.testing.fake_anthropic --policy-file spec.json [--port N]

prints ``EVALLOOP_FAKE_ANTHROPIC_URL=http://127.0.0.1:PORT`` once it accepts connections
(`fake_anthropic_process` starts one and talks to it). This module owns the HTTP side: routes,
the request log, faults; what the API refuses, counts and sends is `messages_api`, what the
model says is the policy (`policies`). The standard library serves HTTP, so importing this
module stays light.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import importlib
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel, Field

from pytest_evalloop.testing.messages_api import (
    InvalidRequest,
    PromptCache,
    RequestLimit,
    content_blocks,
    error_body,
    render_message,
    sse_events,
    validate_body,
)
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
)

URL_LINE_PREFIX = "EVALLOOP_FAKE_ANTHROPIC_URL="
BATCHES_PATH = "/v1/messages/batches"


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
    rate_headers: Mapping[str, str] = {}
    """The key's rate-limit headers, sent with the reply to this request (`RequestLimit`)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Keep test output quiet; the request log is the record."""

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        if self.path.split("?")[0] == "/_fake/requests":
            data = [r.model_dump() for r in self.server.fake.requests]
            self._send_json(200, data)
        elif self.path.split("?")[0] == "/_fake/health":
            self._send_json(200, {"ok": True})
        elif self.path.split("?")[0].startswith(BATCHES_PATH + "/"):
            self.server.fake.handle_batch_get(self, self.path.split("?")[0])
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
        elif path == BATCHES_PATH:
            self.server.fake.handle_batch_create(self, raw)
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
            for name, value in {**(headers or {}), **self.rate_headers}.items():
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
        self,
        policy: Policy | ScriptSpec | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        rate_limit: RequestLimit | None = None,
        cache_clock: Callable[[], float] | None = None,
    ) -> None:
        self.policy = as_policy(policy)
        self.rate_limit = rate_limit
        """One key's requests-per-minute limit shared by every client: over it, a 429."""
        self._address = (host, port)
        self._lock = threading.Lock()
        self._log: list[RecordedRequest] = []
        self._calls = 0
        self._stopping = threading.Event()
        self.cache = PromptCache() if cache_clock is None else PromptCache(cache_clock)
        """The prompt cache, by the API's rules; `cache_clock` moves its TTLs in tests."""
        self.served_models: dict[str, str] = {}
        """A requested model id -> the id the reply names (as the API serves an alias as a
        dated snapshot); unlisted ids are served as asked."""
        self.context_windows: dict[str, int] = {}
        """A model id -> the most input tokens one request may carry (unlisted: the standard
        200,000); a longer prompt gets the API's 400, `prompt is too long`."""
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._batches: dict[str, dict[str, Any]] = {}
        self.batch_result: Callable[[FakeRequest], str | None] | None = None
        """Batches API: force a request's result type (`expired`, `canceled`, `errored`), or
        None to answer it as /v1/messages would."""

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
            validate_body(body, self.context_windows)
        except (json.JSONDecodeError, InvalidRequest) as exc:
            entry.status, entry.outcome, entry.error = 400, "invalid", str(exc)
            self._record(entry)
            handler._send_json(
                400,
                error_body("invalid_request_error", str(exc), request_id),
                {"request-id": request_id},
            )
            return
        if self.rate_limit is not None:
            allowed, handler.rate_headers = self.rate_limit.take()
            if not allowed:
                entry.status, entry.outcome, entry.error = 429, "rate_limited", "rate_limit_error"
                self._record(entry)
                message = f"fake-anthropic: over {self.rate_limit.rpm} requests per minute"
                handler._send_json(
                    429,
                    error_body("rate_limit_error", message, request_id),
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

    # ---- /v1/messages/batches (the Message Batches API; every batch ends at once)

    def handle_batch_create(self, handler: _Handler, raw: bytes) -> None:
        """Create a batch: each request is answered as /v1/messages would answer it."""
        try:
            body = json.loads(raw or b"null")
            requests = body.get("requests") if isinstance(body, dict) else None
            if not isinstance(requests, list) or not requests:
                raise InvalidRequest("requests: Field required, a non-empty list")
            lines = [self._batch_item(item) for item in requests]
        except (json.JSONDecodeError, InvalidRequest) as exc:
            handler._send_json(400, error_body("invalid_request_error", str(exc), "req_fake"))
            return
        with self._lock:
            batch_id = f"msgbatch_fake_{len(self._batches):06d}"
            self._batches[batch_id] = {"lines": lines}
        handler._send_json(200, self._batch_object(handler, batch_id))

    def _batch_item(self, item: Any) -> dict[str, Any]:
        custom_id = item.get("custom_id") if isinstance(item, dict) else None
        params = item.get("params") if isinstance(item, dict) else None
        if not isinstance(custom_id, str) or not isinstance(params, dict):
            raise InvalidRequest("requests.N: custom_id (a string) and params are required")
        with self._lock:
            index = self._calls
            self._calls += 1
        entry = RecordedRequest(call_index=index, path=BATCHES_PATH)
        try:
            validate_body(params, self.context_windows)
        except InvalidRequest as exc:
            entry.status, entry.outcome, entry.error = 400, "invalid", str(exc)
            self._record(entry)
            return _errored(custom_id, "invalid_request_error", str(exc))
        request = parse_request(params, {}, index)
        entry.role, entry.model, entry.question = request.role, request.model, request.question
        forced = self.batch_result(request) if self.batch_result is not None else None
        with self._lock:
            outcome = self.policy(request)
        if isinstance(outcome, str):
            outcome = Reply(text=outcome)
        if forced in ("expired", "canceled"):
            entry.outcome = forced
            self._record(entry)
            return {"custom_id": custom_id, "result": {"type": forced}}
        if forced == "errored" or not isinstance(outcome, Reply):
            kind = outcome.type if isinstance(outcome, Fault) else "api_error"
            entry.outcome = "errored"
            self._record(entry)
            return _errored(custom_id, kind, f"fake-anthropic: batch request {kind}")
        blocks, stop_reason, output_tokens = content_blocks(outcome, request)
        cached = self.cache.usage(params)
        usage = {
            "input_tokens": cached.input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": cached.cache_creation_input_tokens,
            "cache_read_input_tokens": cached.cache_read_input_tokens,
        }
        entry.stop_reason, entry.input_tokens, entry.output_tokens = (
            stop_reason,
            cached.input_tokens,
            output_tokens,
        )
        self._record(entry)
        message = render_message(request, blocks, stop_reason, usage)
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": message}}

    def _batch_object(self, handler: _Handler, batch_id: str) -> dict[str, Any]:
        lines = self._batches[batch_id]["lines"]
        counts = {k: 0 for k in ("processing", "succeeded", "errored", "canceled", "expired")}
        for line in lines:
            counts[line["result"]["type"]] += 1
        host, port = handler.server.server_address[:2]
        stamp = "2026-01-01T00:00:00Z"
        return {
            "id": batch_id,
            "type": "message_batch",
            "processing_status": "ended",
            "request_counts": counts,
            "created_at": stamp,
            "ended_at": stamp,
            "expires_at": stamp,
            "archived_at": None,
            "cancel_initiated_at": None,
            "results_url": f"http://{host!s}:{port}{BATCHES_PATH}/{batch_id}/results",
        }

    def handle_batch_get(self, handler: _Handler, path: str) -> None:
        """Retrieve a batch, or its results as JSON lines."""
        rest = path[len(BATCHES_PATH) + 1 :]
        batch_id, _, tail = rest.partition("/")
        if batch_id not in self._batches or tail not in ("", "results"):
            handler._send_json(
                404, error_body("not_found_error", f"no batch {batch_id!r}", "req_fake")
            )
            return
        if tail == "":
            handler._send_json(200, self._batch_object(handler, batch_id))
            return
        lines = self._batches[batch_id]["lines"]
        body = "".join(json.dumps(line) + "\n" for line in lines).encode()
        handler._send(200, body, "application/binary")

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
        if isinstance(outcome, Reply) and outcome.held_until is not None:
            # Woken by the test's event or by stop(), whichever comes first: not a deadline.
            while not (outcome.held_until.wait(0.05) or self._stopping.is_set()):
                pass
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
        blocks, stop_reason, output_tokens = content_blocks(reply, request)
        cached = self.cache.usage(request.body)
        uncached, created, read = cached[:3]
        usage: dict[str, Any] = {
            "input_tokens": uncached,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": cached.ephemeral_5m_input_tokens,
                "ephemeral_1h_input_tokens": cached.ephemeral_1h_input_tokens,
            },
        }
        entry.stop_reason = stop_reason
        entry.input_tokens, entry.output_tokens = uncached, output_tokens
        entry.cache_creation_input_tokens, entry.cache_read_input_tokens = created, read
        message = render_message(request, blocks, stop_reason, usage)
        message["model"] = self.served_models.get(request.model, request.model)
        headers = {"request-id": request_id}
        if request.stream:
            handler._send(200, sse_events(message), "text/event-stream; charset=utf-8", headers)
        else:
            handler._send_json(200, message, headers)


def _errored(custom_id: str, kind: str, message: str) -> dict[str, Any]:
    error = {"type": "error", "error": {"type": kind, "message": message}}
    return {"custom_id": custom_id, "result": {"type": "errored", "error": error}}


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
