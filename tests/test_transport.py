"""The lean HTTP/1.1 transport, against real loopback servers (plain and TLS) and the SDK."""

from __future__ import annotations

import asyncio
import datetime
import gzip
import ipaddress
import json
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest

from pytest_evalloop.ratelimit import LimitedTransport, RunLimiter
from pytest_evalloop.transport import Http11Transport, parse_head, sdk_http_client


@dataclass
class Seen:
    """One request as the server read it."""

    connection: int
    method: str
    path: str
    body: bytes


Reply = bytes | None  # the raw response to write; None: close the connection without one
Respond = Callable[[int, Seen], Reply]


@dataclass
class Loopback:
    """A scriptable HTTP/1.1 server on 127.0.0.1 that counts connections and requests.

    `respond(index, seen)` gives each request's raw reply (None: drop the connection);
    `close_after` lists request indices after which the server closes the connection
    without having said so (what a server does to an idle keep-alive connection).
    """

    respond: Respond
    close_after: set[int] = field(default_factory=set)
    tls: ssl.SSLContext | None = None
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    _server: asyncio.Server | None = None

    async def __aenter__(self) -> Loopback:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                seen = Seen(number, method, path, body)
                self.seen.append(seen)
                index = len(self.seen) - 1
                reply = self.respond(index, seen)
                if reply is None:
                    return
                writer.write(reply)
                await writer.drain()
                if index in self.close_after:
                    return
        finally:
            writer.close()


def reply(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> bytes:
    """A content-length reply."""
    lines = [f"HTTP/1.1 {status} OK", f"content-length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(parts: list[bytes]) -> bytes:
    """A chunked reply, with a chunk extension and a trailer to skip."""
    out = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/plain\r\n\r\n"]
    out += [b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts]
    out.append(b"0\r\nx-trailer: yes\r\n\r\n")
    return b"".join(out)


def echo(index: int, seen: Seen) -> Reply:
    return reply(json.dumps({"index": index, "got": seen.body.decode()}).encode())


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(scenario())  # type: ignore[arg-type]


async def _client(transport: Http11Transport, **kwargs: Any) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=transport, **kwargs)


# --- keep-alive and the pool --------------------------------------------------------------


def test_requests_reuse_one_keep_alive_connection_and_bodies_round_trip() -> None:
    async def scenario() -> None:
        transport = Http11Transport()
        async with Loopback(echo) as server, await _client(transport) as client:
            for i in range(5):
                response = await client.post(f"{server.url}/v1/messages?i={i}", content=f"b{i}")
                assert response.json() == {"index": i, "got": f"b{i}"}
            assert [s.path for s in server.seen] == [f"/v1/messages?i={i}" for i in range(5)]
            assert server.connections == transport.opened == 1
            # Ten at once need up to ten connections; afterwards they are all reused.
            await asyncio.gather(*(client.post(server.url, content=b"x") for _ in range(10)))
            opened = transport.opened
            assert 1 <= opened <= 10
            await asyncio.gather(*(client.post(server.url, content=b"y") for _ in range(opened)))
            assert transport.opened == opened

    run(scenario)


def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def scenario() -> None:
        transport = Http11Transport()
        async with Loopback(echo, close_after={0}) as server, await _client(transport) as client:
            assert (await client.post(server.url, content=b"1")).json()["index"] == 0
            await asyncio.sleep(0.05)  # the server's FIN arrives while the connection is idle
            assert (await client.post(server.url, content=b"2")).json()["index"] == 1
            assert [s.connection for s in server.seen] == [1, 2]
            assert (transport.opened, transport.resent) == (2, 0)  # seen closed, not tried

    run(scenario)


def test_a_request_that_meets_a_close_in_flight_is_sent_once_more_on_a_new_connection() -> None:
    # The race a pool cannot see coming: the server drops the idle connection just as our
    # next request goes out on it. Connection 1 answers request 0 and then drops request 1.
    def respond(index: int, seen: Seen) -> Reply:
        return None if (index, seen.connection) == (1, 1) else echo(index, seen)

    async def scenario() -> None:
        transport = Http11Transport()
        async with Loopback(respond) as server, await _client(transport) as client:
            await client.post(server.url, content=b"first")
            response = await client.post(server.url, content=b"second")
            assert response.json() == {"index": 2, "got": "second"}
            assert [(s.connection, s.body) for s in server.seen] == [
                (1, b"first"),
                (1, b"second"),
                (2, b"second"),
            ]
            assert (transport.opened, transport.resent) == (2, 1)

    run(scenario)


def test_a_fresh_connection_dropped_without_a_reply_is_an_error_sent_once() -> None:
    async def scenario() -> None:
        transport = Http11Transport()
        async with Loopback(lambda i, s: None) as server, await _client(transport) as client:
            with pytest.raises(httpx2.RemoteProtocolError, match="without sending a response"):
                await client.post(server.url, content=b"x")
            assert len(server.seen) == 1

    run(scenario)


def test_idle_connections_past_the_expiry_are_replaced() -> None:
    async def scenario() -> None:
        transport = Http11Transport(keepalive_expiry=0.05)
        async with Loopback(echo) as server, await _client(transport) as client:
            await client.post(server.url, content=b"1")
            await asyncio.sleep(0.1)
            await client.post(server.url, content=b"2")
            assert transport.opened == server.connections == 2

    run(scenario)


# --- bodies ---------------------------------------------------------------------------------


def test_a_chunked_reply_is_read_whole_and_its_connection_reused() -> None:
    parts = [b"hello ", b"chunked " * 1000, b"world"]

    async def scenario() -> None:
        transport = Http11Transport()
        async with (
            Loopback(lambda i, s: chunked(parts)) as server,
            await _client(transport) as client,
        ):
            for _ in range(2):
                response = await client.get(server.url)
                assert response.content == b"".join(parts)
            assert transport.opened == 1

    run(scenario)


def test_a_stream_closed_early_drops_its_connection() -> None:
    parts = [b"event: one\n\n", b"event: two\n\n"]

    async def scenario() -> None:
        transport = Http11Transport()
        async with (
            Loopback(lambda i, s: chunked(parts)) as server,
            await _client(transport) as client,
        ):
            async with client.stream("GET", server.url) as response:
                first = await anext(response.aiter_raw())
                assert first == parts[0]
            assert (await client.get(server.url)).content == b"".join(parts)
            assert transport.opened == 2  # unread bytes: the first connection was not reused

    run(scenario)


def test_a_body_delimited_by_close_and_a_gzip_body() -> None:
    packed = gzip.compress(b"squeezed " * 50)

    def respond(index: int, seen: Seen) -> Reply:
        if index == 0:
            return b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end"
        return reply(packed, headers={"content-encoding": "gzip"})

    async def scenario() -> None:
        transport = Http11Transport()
        async with Loopback(respond, close_after={0}) as server, await _client(transport) as client:
            assert (await client.get(server.url)).text == "until the end"
            assert (await client.get(server.url)).text == "squeezed " * 50
            assert transport.opened == 2

    run(scenario)


def test_informational_replies_are_skipped_and_no_body_statuses_have_none() -> None:
    def respond(index: int, seen: Seen) -> Reply:
        if index == 0:
            return b"HTTP/1.1 100 Continue\r\n\r\n" + reply(b"after continue")
        return b"HTTP/1.1 204 No Content\r\n\r\n"

    async def scenario() -> None:
        transport = Http11Transport()
        async with Loopback(respond) as server, await _client(transport) as client:
            assert (await client.post(server.url, content=b"x")).text == "after continue"
            response = await client.delete(server.url)
            assert (response.status_code, response.content) == (204, b"")
            assert transport.opened == 1

    run(scenario)


def test_a_streamed_upload_is_sent_chunked() -> None:
    async def parts() -> Any:
        for part in (b"one,", b"two,", b"three"):
            yield part

    def respond(index: int, seen: Seen) -> Reply:
        return reply(seen.body)

    async def scenario() -> None:
        # The stub reads content-length bodies only: decode the chunked upload here instead.
        transport = Http11Transport()
        async with Loopback(respond) as server, await _client(transport) as client:
            request = client.build_request("POST", server.url, content=parts())
            assert request.headers["transfer-encoding"] == "chunked"
            preamble = await _raw_upload(server, request)
            assert preamble == b"4\r\none,\r\n4\r\ntwo,\r\n5\r\nthree\r\n0\r\n\r\n"

    run(scenario)


async def _raw_upload(server: Loopback, request: httpx2.Request) -> bytes:
    """Send `request` through the transport to a raw socket and return the body bytes sent."""
    received = asyncio.get_running_loop().create_future()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        received.set_result(await reader.readuntil(b"0\r\n\r\n"))
        writer.write(reply(b"ok"))
        await writer.drain()
        writer.close()

    sink_server = await asyncio.start_server(sink, "127.0.0.1", 0)
    port = sink_server.sockets[0].getsockname()[1]
    request.url = request.url.copy_with(port=port)
    request.headers["host"] = f"127.0.0.1:{port}"
    transport = Http11Transport()
    response = await transport.handle_async_request(request)
    assert await response.aread() == b"ok"
    sink_server.close()
    return bytes(await received)


# --- failures -------------------------------------------------------------------------------


def test_timeouts_and_refused_connections_are_httpx2_errors() -> None:
    def never(index: int, seen: Seen) -> Reply:
        return b""  # headers never come

    async def scenario() -> None:
        transport = Http11Transport()
        async with Loopback(never) as server, await _client(transport, timeout=0.2) as client:
            with pytest.raises(httpx2.ReadTimeout):
                await client.get(server.url)
            port = server.port
        with pytest.raises(httpx2.ConnectError, match=f"127.0.0.1:{port}"):
            async with await _client(Http11Transport()) as other:
                await other.get(f"http://127.0.0.1:{port}/")

    run(scenario)


@pytest.mark.parametrize(
    "head",
    [b"HTTP/1.1 abc OK\r\n\r\n", b"SPDY 200 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\n folded\r\n\r\n"],
)
def test_a_malformed_response_head_is_a_protocol_error(head: bytes) -> None:
    with pytest.raises(httpx2.RemoteProtocolError):
        parse_head(head)


def test_a_response_head_is_parsed() -> None:
    parsed = parse_head(b"HTTP/1.1 429 Too Many\r\nRetry-After:  3 \r\nX-A: b:c\r\n\r\n")
    assert parsed == (429, b"Too Many", [(b"Retry-After", b"3"), (b"X-A", b"b:c")], b"HTTP/1.1")


# --- TLS ----------------------------------------------------------------------------------


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, written as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "evalloop test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_https_to_a_self_signed_server_verifies_its_certificate(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)

    async def scenario() -> None:
        trusting = Http11Transport(ssl_context=ssl.create_default_context(cafile=str(cert)))
        async with Loopback(echo, tls=server_tls) as server:
            async with await _client(trusting) as client:
                for i in range(3):
                    assert (await client.post(server.url, content=b"s")).json()["index"] == i
                assert trusting.opened == 1
            # The default trust store does not know this certificate: refused, not sent.
            async with await _client(Http11Transport()) as client:
                with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                    await client.get(server.url)
            assert len(server.seen) == 3

    run(scenario)


# --- with the SDK -----------------------------------------------------------------------------


def _without_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clear every proxy variable, in both cases, so the client builds our transport."""
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def test_the_sdk_client_uses_this_transport_unless_a_proxy_is_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _without_proxies(monkeypatch)
    assert isinstance(sdk_http_client()._transport, Http11Transport)
    limited = sdk_http_client(RunLimiter(tmp_path, rpm=0, tpm=0))._transport
    assert isinstance(limited, LimitedTransport)
    assert isinstance(limited.inner, Http11Transport)
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    assert not isinstance(sdk_http_client()._transport, Http11Transport)


def test_the_sdk_over_this_transport_answers_retries_a_429_and_reuses_connections() -> None:
    import anthropic

    from pytest_evalloop.testing import FakeAnthropic, FaultSpec, ScriptSpec

    spec = ScriptSpec(faults=[FaultSpec(status=429, retry_after_ms=50, after=3)])
    with FakeAnthropic(spec) as fake:

        async def scenario() -> list[str]:
            http = sdk_http_client()
            client = anthropic.AsyncAnthropic(
                api_key="sk-test", base_url=fake.base_url, max_retries=2, http_client=http
            )
            gate = asyncio.Semaphore(4)

            async def ask(i: int) -> str:
                async with gate:
                    message = await client.messages.create(
                        model="claude-test",
                        max_tokens=20,
                        messages=[{"role": "user", "content": f"question {i}"}],
                    )
                    return message.stop_reason or ""

            try:
                return list(await asyncio.gather(*(ask(i) for i in range(12))))
            finally:
                assert http._transport.opened <= 4 + 1  # one more after the 429's retry at most
                await client.close()

        assert run(scenario) == ["end_turn"] * 12
        statuses = [r.status for r in fake.requests]
        assert statuses.count(429) == 1 and statuses.count(200) == 12


def test_a_streamed_sdk_call_over_this_transport() -> None:
    import anthropic

    from pytest_evalloop.testing import FakeAnthropic

    with FakeAnthropic() as fake:

        async def scenario() -> tuple[str, str | None]:
            client = anthropic.AsyncAnthropic(
                api_key="sk-test", base_url=fake.base_url, http_client=sdk_http_client()
            )
            try:
                async with client.messages.stream(
                    model="claude-test",
                    max_tokens=20,
                    messages=[{"role": "user", "content": "stream please"}],
                ) as stream:
                    message = await stream.get_final_message()
                    return await stream.get_final_text(), message.stop_reason
            finally:
                await client.close()

        text, stop = run(scenario)
        assert text and stop == "end_turn"
        assert [r.stream for r in fake.requests] == [True]


def test_the_client_factory_builds_on_this_transport_and_traces_only_with_a_provider(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from opentelemetry import trace

    from pytest_evalloop.backends import ClientFactory, tracing_configured

    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    _without_proxies(monkeypatch)
    assert not tracing_configured(trace.ProxyTracerProvider())  # what an unset global is
    assert tracing_configured(trace.NoOpTracerProvider())
    monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "sdk_tracer_provider")
    assert tracing_configured(trace.ProxyTracerProvider())
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER")
    factory = ClientFactory(retries=1, limiter=RunLimiter(tmp_path, rpm=0, tpm=0))

    async def scenario() -> Any:
        client = factory()
        assert factory() is client  # one client per loop
        await factory.release()
        return client

    client = run(scenario)
    assert client.open_telemetry["traces"]["enabled"] is tracing_configured()
    limited = client._client._transport
    assert isinstance(limited, LimitedTransport)
    assert isinstance(limited.inner, Http11Transport)
