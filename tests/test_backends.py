"""The SDK client the plugin hands out: the SDK's aiohttp client (or its default), the run's limiter
on top, against the loopback fake through the real `anthropic` SDK."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.answer.backends import ClientFactory, sdk_http_client, tracing_configured
from pytest_evalloop.model_api.ratelimit import LimitedTransport, RunLimiter
from pytest_evalloop.testing import FakeAnthropic, FaultSpec, ScriptSpec


def _aiohttp_transport() -> type:
    from anthropic._vendor.httpx_aiohttp import AiohttpTransport

    return AiohttpTransport


def test_the_client_is_the_sdks_aiohttp_client_under_the_limiter(tmp_path: Path) -> None:
    import anthropic

    plain = sdk_http_client()
    assert isinstance(plain, anthropic.DefaultAioHttpClient)
    assert isinstance(plain._transport, _aiohttp_transport())
    limited = sdk_http_client(RunLimiter(tmp_path, rpm=0, tpm=0))
    assert isinstance(limited._transport, LimitedTransport)
    assert isinstance(limited._transport.inner, _aiohttp_transport())


def test_clients_share_one_tls_context_that_follows_the_cert_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import ssl

    first, second = sdk_http_client(), sdk_http_client()
    context = first._transport.ssl_context
    assert context is second._transport.ssl_context  # the CA store is loaded once
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    # A CA file named in the environment is read, as the SDK's own client reads it.
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "no-such-bundle.pem"))
    with pytest.raises(OSError):
        sdk_http_client()


def test_a_proxy_in_the_environment_is_the_sdks_own_mount_and_is_limited(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    client = sdk_http_client(RunLimiter(tmp_path, rpm=0, tpm=0))
    mounts = [m for m in client._mounts.values() if m is not None]
    assert mounts, "the SDK's client mounts a proxy transport for HTTPS_PROXY"
    for mount in mounts:
        assert isinstance(mount, LimitedTransport)
        assert str(mount.inner.proxy.url) == "http://127.0.0.1:9"


def test_without_aiohttp_the_sdks_default_client_is_used(tmp_path: Path) -> None:
    # A fresh interpreter in which aiohttp cannot be imported (as when the extra is missing).
    code = (
        "import sys; sys.modules['aiohttp'] = None\n"
        "import anthropic, json, pathlib\n"
        "from pytest_evalloop.answer.backends import sdk_http_client\n"
        "from pytest_evalloop.model_api.ratelimit import RunLimiter\n"
        "c = sdk_http_client(RunLimiter(pathlib.Path(sys.argv[1]), rpm=0, tpm=0))\n"
        "print(json.dumps([type(c).__name__, type(c._transport.inner).__name__]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(out.stdout) == ["_DefaultAsyncHttpxClient", "AsyncHTTPTransport"]


def test_calls_retries_and_streams_go_through_the_sdk_over_aiohttp(tmp_path: Path) -> None:
    import anthropic

    spec = ScriptSpec(faults=[FaultSpec(status=429, retry_after_ms=50, after=3)])
    limiter = RunLimiter(tmp_path, rpm=0, tpm=0)
    with FakeAnthropic(spec) as fake:

        async def scenario() -> tuple[list[str], str]:
            client = anthropic.AsyncAnthropic(
                api_key="sk-test",
                base_url=fake.base_url,
                max_retries=2,
                http_client=sdk_http_client(limiter),
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
                stops = list(await asyncio.gather(*(ask(i) for i in range(12))))
                async with client.messages.stream(
                    model="claude-test",
                    max_tokens=20,
                    messages=[{"role": "user", "content": "stream please"}],
                ) as stream:
                    text = await stream.get_final_text()
                return stops, text
            finally:
                await client.close()

        stops, text = asyncio.run(scenario())
        assert stops == ["end_turn"] * 12 and text
        statuses = [r.status for r in fake.requests]
        assert statuses.count(429) == 1 and statuses.count(200) == 13
        assert [r.stream for r in fake.requests][-1] is True
    # Every call went through the limiter, the SDK's retry of the 429 included.
    assert limiter.stats()["requests"] == 14 and limiter.stats()["pauses"] == 1


def test_the_client_factory_builds_one_limited_client_per_loop_and_traces_only_with_a_provider(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from opentelemetry import trace

    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
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
        assert client._client.is_closed
        return client

    client = asyncio.run(scenario())
    assert client.open_telemetry["traces"]["enabled"] is tracing_configured()
    limited = client._client._transport
    assert isinstance(limited, LimitedTransport)
    assert isinstance(limited.inner, _aiohttp_transport())
