"""A lean HTTP/1.1 transport for the ``anthropic`` SDK's httpx2 client, and the client itself.

Why: at 64 calls in flight, httpcore2's connection pool costs milliseconds of CPU per call (it
re-checks every pooled connection on each request and on each release, through anyio). This
transport keeps what the SDK needs and nothing more: HTTP/1.1 over asyncio streams, a LIFO
free list of keep-alive connections per origin, content-length, chunked and close-delimited
bodies, the request's connect/read/write timeouts, and one immediate re-send of a request
whose reused keep-alive connection turns out to have been closed by the server while idle
(no byte of a response arrived). That re-send is no less safe than what the SDK does anyway:
it re-sends a request after any connection error, only after a backoff. The SDK keeps its
own retries, backoff and retry-after handling above this; errors are httpx2's own exception
types, which the SDK maps to `APIConnectionError` / `APITimeoutError`. There is no cap on
connections in use (so no pool timeout): the run's `--eval-concurrency` bounds them.

:func:`sdk_http_client` falls back to the SDK's default transport when a proxy is configured
in the environment (this transport does not speak to proxies).
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, NamedTuple

# Imported only when a client is built, right after `anthropic`, which imports httpx2 anyway.
import httpx2

if TYPE_CHECKING:
    from pytest_evalloop.ratelimit import RunLimiter

READ_LIMIT = 1 << 20
"""Most bytes one header block or chunk-size line may take (a bigger one is a protocol error)."""
KEEPALIVE_EXPIRY_S = 5.0
"""An idle connection older than this is closed instead of reused (httpx's default)."""
MAX_IDLE_PER_ORIGIN = 100
"""Idle connections kept per origin (the SDK's default max_keepalive_connections)."""
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")
_NO_BODY_STATUS = frozenset({204, 304})
# The SDK's own socket options: TCP keep-alive probes after 60 s idle, every 60 s, 5 times.
_KEEPALIVE_OPTIONS = [
    (socket.IPPROTO_TCP, name, value)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 60), ("TCP_KEEPCNT", 5))
    if hasattr(socket, name)
]


def proxy_configured(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether the environment names an HTTP proxy (then the SDK's own transport is used)."""
    return any(environ.get(name) or environ.get(name.upper()) for name in PROXY_VARIABLES)


class _Connection:
    """One keep-alive HTTP/1.1 connection."""

    __slots__ = ("reader", "writer", "idle_since", "reused")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0
        self.reused = False

    def usable(self, now: float, expiry: float) -> bool:
        """Still open, not half-closed by the server, nothing unexpected buffered, not stale.

        O(1), and only for the connection about to be used (httpcore2 checks every pooled
        connection, with a getpeername each, on every request and every release).
        """
        # Bytes nobody asked for would put the next response out of step.
        stray: bytes = getattr(self.reader, "_buffer", b"")
        return (
            not self.writer.is_closing()
            and not self.reader.at_eof()
            and not stray
            and now - self.idle_since < expiry
        )

    def close(self) -> None:
        self.writer.close()


class _Disconnected(Exception):
    """The server closed a connection before sending any of the response."""


class Http11Transport(httpx2.AsyncBaseTransport):
    """An httpx2 transport speaking HTTP/1.1 with keep-alive, bound to one event loop.

    ``ssl_context`` is used for https origins (default: httpx2's, as the SDK's client builds
    it, made on first use).
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_expiry: float = KEEPALIVE_EXPIRY_S,
        max_idle: int = MAX_IDLE_PER_ORIGIN,
    ) -> None:
        self._ssl_context = ssl_context
        self._expiry = keepalive_expiry
        self._max_idle = max_idle
        self._idle: dict[tuple[bytes, bytes, int], list[_Connection]] = {}
        self._closed = False
        self.opened = 0
        """Connections opened so far (tests read it to see that connections are reused)."""
        self.resent = 0
        """Requests sent again because their reused connection had been closed while idle."""

    # ---- the transport interface

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send one request and return its response (the body may still be streaming)."""
        if self._closed:
            raise RuntimeError("the HTTP transport is closed; build a new client")
        url = request.url
        origin = (url.raw_scheme, url.raw_host, url.port or (443 if url.scheme == "https" else 80))
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        preamble = _request_head(request)
        body = _request_body(request)
        conn = self._take(origin)
        if conn is not None:
            try:
                return await self._exchange(conn, origin, request, preamble, body, timeouts)
            except _Disconnected:
                self.resent += 1  # closed while idle: one more try, on a fresh connection
        conn = await self._open(origin, request, timeouts)
        try:
            return await self._exchange(conn, origin, request, preamble, body, timeouts)
        except _Disconnected:
            raise _error(
                "RemoteProtocolError", "Server disconnected without sending a response.", request
            ) from None

    async def aclose(self) -> None:
        """Close every idle connection; connections in use close when their response ends."""
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    # ---- the pool

    def _take(self, origin: tuple[bytes, bytes, int]) -> _Connection | None:
        free = self._idle.get(origin)
        now = time.monotonic()
        while free:
            conn = free.pop()  # LIFO: the most recently used connection is the likeliest alive
            if conn.usable(now, self._expiry):
                conn.reused = True
                return conn
            conn.close()
        return None

    def _give_back(self, origin: tuple[bytes, bytes, int], conn: _Connection) -> None:
        free = self._idle.setdefault(origin, [])
        if self._closed or len(free) >= self._max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        free.append(conn)

    async def _open(
        self,
        origin: tuple[bytes, bytes, int],
        request: httpx2.Request,
        timeouts: dict[str, float | None],
    ) -> _Connection:
        scheme, host_bytes, port = origin
        host = host_bytes.decode("ascii")
        tls = self._tls() if scheme == b"https" else None
        try:
            async with asyncio.timeout(timeouts.get("connect")):
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                    limit=READ_LIMIT,
                )
        except TimeoutError:
            raise _error(
                "ConnectTimeout", f"connecting to {host}:{port} timed out", request
            ) from None
        except OSError as exc:  # ssl.SSLError is an OSError too
            raise _error("ConnectError", f"connecting to {host}:{port}: {exc}", request) from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for level, name, value in _KEEPALIVE_OPTIONS:
                sock.setsockopt(level, getattr(socket, name), value)
        self.opened += 1
        return _Connection(reader, writer)

    def _tls(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            self._ssl_context = httpx2.create_ssl_context()
        return self._ssl_context

    # ---- one exchange

    async def _exchange(
        self,
        conn: _Connection,
        origin: tuple[bytes, bytes, int],
        request: httpx2.Request,
        preamble: bytes,
        body: bytes | None,
        timeouts: dict[str, float | None],
    ) -> httpx2.Response:
        try:
            await self._send(conn, request, preamble, body, timeouts)
            head = await self._read_head(conn, request, timeouts)
            return await self._response(conn, origin, request, head, timeouts)
        except BaseException:
            # Cancelled or failed half-way: the stream is out of step, never reuse it.
            conn.close()
            raise

    async def _send(
        self,
        conn: _Connection,
        request: httpx2.Request,
        preamble: bytes,
        body: bytes | None,
        timeouts: dict[str, float | None],
    ) -> None:
        writer = conn.writer
        try:
            if body is not None:
                writer.write(preamble + body)  # one write, one syscall for a small request
            else:
                writer.write(preamble)
                async for chunk in _streamed_body(request):
                    writer.write(chunk)
                    await self._drain(writer, request, timeouts)
            if writer.transport.get_write_buffer_size():
                await self._drain(writer, request, timeouts)
        except (ConnectionError, OSError) as exc:
            if conn.reused:
                raise _Disconnected from exc
            raise _error("WriteError", f"sending the request: {exc}", request) from exc

    async def _drain(
        self, writer: asyncio.StreamWriter, request: httpx2.Request, timeouts: dict[str, Any]
    ) -> None:
        try:
            async with asyncio.timeout(timeouts.get("write")):
                await writer.drain()
        except TimeoutError:
            raise _error("WriteTimeout", "sending the request timed out", request) from None

    async def _read_head(
        self, conn: _Connection, request: httpx2.Request, timeouts: dict[str, Any]
    ) -> Head:
        while True:
            try:
                async with asyncio.timeout(timeouts.get("read")):
                    block = await conn.reader.readuntil(b"\r\n\r\n")
            except TimeoutError:
                raise _error("ReadTimeout", "waiting for the response timed out", request) from None
            except asyncio.IncompleteReadError as exc:
                if not exc.partial and conn.reused:
                    raise _Disconnected from exc
                raise _error(
                    "RemoteProtocolError",
                    "Server disconnected without sending a response.",
                    request,
                ) from exc
            except asyncio.LimitOverrunError as exc:
                raise _error("RemoteProtocolError", "response headers too large", request) from exc
            except (ConnectionError, OSError) as exc:
                if conn.reused:
                    raise _Disconnected from exc
                raise _error("ReadError", f"reading the response: {exc}", request) from exc
            head = parse_head(block, request)
            if head.status >= 200 or head.status == 101:
                return head
            # 1xx informational (100 Continue, 103 Early Hints): the real response follows.

    async def _response(
        self,
        conn: _Connection,
        origin: tuple[bytes, bytes, int],
        request: httpx2.Request,
        head: Head,
        timeouts: dict[str, Any],
    ) -> httpx2.Response:
        status, headers = head.status, head.headers
        framing = _framing(request, status, headers)
        extensions = {"http_version": head.version, "reason_phrase": head.reason}
        keep = _keep_alive(request, head)
        if isinstance(framing, int):
            # A sized body is read now: the SDK reads a JSON reply whole anyway, and the
            # connection goes back to the pool at once.
            data = b""
            if framing:
                data = await _read_exactly(conn, framing, request, timeouts)
            if keep:
                self._give_back(origin, conn)
            else:
                conn.close()
            return httpx2.Response(
                status, headers=headers, stream=httpx2.ByteStream(data), extensions=extensions
            )
        stream = _BodyStream(self, conn, origin, request, framing, keep, timeouts)
        return httpx2.Response(status, headers=headers, stream=stream, extensions=extensions)


class _BodyStream(httpx2.AsyncByteStream):
    """A chunked or close-delimited response body, read as the caller iterates it.

    The connection returns to the pool when the body ended cleanly, and is closed otherwise
    (including when the caller closes the response before reading it all).
    """

    def __init__(
        self,
        transport: Http11Transport,
        conn: _Connection,
        origin: tuple[bytes, bytes, int],
        request: httpx2.Request,
        framing: str,
        keep: bool,
        timeouts: dict[str, Any],
    ) -> None:
        self._transport = transport
        self._conn: _Connection | None = conn
        self._origin = origin
        self._request = request
        self._chunked = framing == "chunked"
        self._keep = keep
        self._timeouts = timeouts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        try:
            parts = _chunks(conn, self._request, self._timeouts) if self._chunked else None
            if parts is not None:
                async for part in parts:
                    yield part
            else:
                async for part in _until_close(conn, self._request, self._timeouts):
                    yield part
        except BaseException:
            self._finish(clean=False)
            raise
        self._finish(clean=self._chunked)

    def _finish(self, *, clean: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if clean and self._keep:
            self._transport._give_back(self._origin, conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        """Closing before the end leaves unread bytes on the connection: close it too."""
        self._finish(clean=False)


async def _chunks(
    conn: _Connection, request: httpx2.Request, timeouts: dict[str, Any]
) -> AsyncIterator[bytes]:
    while True:
        line = await _read_line(conn, request, timeouts)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _error(
                "RemoteProtocolError", f"bad chunk size line {line[:40]!r}", request
            ) from None
        if size == 0:
            while (await _read_line(conn, request, timeouts)).strip():
                pass  # trailers: not used by this API
            return
        data = await _read_exactly(conn, size + 2, request, timeouts)
        if data[-2:] != b"\r\n":
            raise _error("RemoteProtocolError", "chunk not followed by CRLF", request)
        yield data[:-2]


async def _until_close(
    conn: _Connection, request: httpx2.Request, timeouts: dict[str, Any]
) -> AsyncIterator[bytes]:
    while True:
        try:
            async with asyncio.timeout(timeouts.get("read")):
                data = await conn.reader.read(65536)
        except TimeoutError:
            raise _error("ReadTimeout", "reading the response body timed out", request) from None
        except (ConnectionError, OSError) as exc:
            raise _error("ReadError", f"reading the response body: {exc}", request) from exc
        if not data:
            return
        yield data


async def _read_line(conn: _Connection, request: httpx2.Request, timeouts: dict[str, Any]) -> bytes:
    try:
        async with asyncio.timeout(timeouts.get("read")):
            return await conn.reader.readuntil(b"\r\n")
    except TimeoutError:
        raise _error("ReadTimeout", "reading the response body timed out", request) from None
    except asyncio.IncompleteReadError as exc:
        raise _error(
            "RemoteProtocolError", "connection closed inside a chunked body", request
        ) from exc
    except asyncio.LimitOverrunError as exc:
        raise _error("RemoteProtocolError", "chunk size line too long", request) from exc
    except (ConnectionError, OSError) as exc:
        raise _error("ReadError", f"reading the response body: {exc}", request) from exc


async def _read_exactly(
    conn: _Connection, size: int, request: httpx2.Request, timeouts: dict[str, Any]
) -> bytes:
    if len(getattr(conn.reader, "_buffer", b"")) >= size:
        # Already here (a small reply comes with its head): no wait, so no timer to arm.
        return await conn.reader.readexactly(size)
    try:
        async with asyncio.timeout(timeouts.get("read")):
            return await conn.reader.readexactly(size)
    except TimeoutError:
        raise _error("ReadTimeout", "reading the response body timed out", request) from None
    except asyncio.IncompleteReadError as exc:
        raise _error(
            "RemoteProtocolError",
            f"connection closed after {len(exc.partial)} of {size} body bytes",
            request,
        ) from exc
    except (ConnectionError, OSError) as exc:
        raise _error("ReadError", f"reading the response body: {exc}", request) from exc


# ---- the wire format (pure) ----------------------------------------------------------------


def _request_head(request: httpx2.Request) -> bytes:
    """The request line and headers as sent (httpx2 already set Host and the body framing)."""
    url = request.url
    lines = [request.method.encode("ascii"), b" ", url.raw_path, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def _request_body(request: httpx2.Request) -> bytes | None:
    """The whole body when httpx2 holds it in memory (the SDK's JSON), else None: stream it."""
    try:
        return request.content
    except httpx2.RequestNotRead:
        return None


async def _streamed_body(request: httpx2.Request) -> AsyncIterator[bytes]:
    chunked = request.headers.get("transfer-encoding", "").lower() == "chunked"
    async for part in request.stream:  # type: ignore[union-attr]
        if not part:
            continue
        yield b"%x\r\n%s\r\n" % (len(part), part) if chunked else part
    if chunked:
        yield b"0\r\n\r\n"


class Head(NamedTuple):
    """A parsed response head."""

    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    version: bytes


def parse_head(block: bytes, request: Any = None) -> Head:
    """Parse a response head (status line and headers, ending in a blank line)."""
    lines = block[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise _error("RemoteProtocolError", f"bad status line {lines[0][:80]!r}", request)
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            raise _error("RemoteProtocolError", f"bad header line {line[:80]!r}", request)
        headers.append((name, value.strip()))
    reason = parts[2] if len(parts) > 2 else b""
    return Head(int(parts[1]), reason, headers, parts[0])


def _framing(request: httpx2.Request, status: int, headers: list[tuple[bytes, bytes]]) -> int | str:
    """How the body is delimited: its length, "chunked", or "close" (read to the end)."""
    if request.method == "HEAD" or status in _NO_BODY_STATUS or status < 200:
        return 0
    length: int | None = None
    for name, value in headers:
        lower = name.lower()
        if lower == b"transfer-encoding" and value.lower().endswith(b"chunked"):
            return "chunked"  # chunked wins over any content-length (RFC 9112 6.3)
        if lower == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise _error(
                    "RemoteProtocolError", f"bad content-length {value!r}", request
                ) from None
            if length < 0:
                raise _error("RemoteProtocolError", f"bad content-length {value!r}", request)
    return "close" if length is None else length


def _keep_alive(request: httpx2.Request, head: Head) -> bool:
    """Whether the connection may carry another request after this response."""
    token = b"keep-alive" if head.version == b"HTTP/1.0" else b"close"
    said = any(n.lower() == b"connection" and token in v.lower() for n, v in head.headers)
    # HTTP/1.1 stays open unless either side says close; 1.0 closes unless the server says not.
    server_keeps = said if head.version == b"HTTP/1.0" else not said
    return server_keeps and "close" not in request.headers.get("connection", "").lower()


def _error(kind: str, message: str, request: Any) -> Exception:
    """An httpx2 transport error of the named type (the SDK maps these to its own errors)."""
    cls = getattr(httpx2, kind)
    exc: Exception = cls(message, request=request) if request is not None else cls(message)
    return exc


# ---- the SDK's client ------------------------------------------------------------------------


def sdk_http_client(limiter: RunLimiter | None = None) -> Any:
    """The ``http_client`` for ``anthropic.AsyncAnthropic``: the SDK's defaults on our transport.

    Built as ``anthropic.DefaultAsyncHttpxClient`` (its timeouts and redirect settings stay the
    SDK's own) with :class:`Http11Transport` underneath, unless the environment names a proxy:
    then the SDK's own transport (and proxy mounts) is kept. With a ``limiter`` every transport
    is wrapped in :class:`~pytest_evalloop.ratelimit.LimitedTransport`.
    """
    import anthropic

    if proxy_configured():
        client: Any = anthropic.DefaultAsyncHttpxClient()
    else:
        client = anthropic.DefaultAsyncHttpxClient(transport=Http11Transport())
    if limiter is not None:
        from pytest_evalloop.ratelimit import wrap_transports

        wrap_transports(client, limiter)
    return client
