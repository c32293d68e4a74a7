"""The built-in roles, built from settings: the default answerer, judge and target of a run.

The plugin's fixtures call these; a user's conftest that overrides a fixture never reaches them.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop.model_api.pricing import price_table
from pytest_evalloop.sets import cases as sets

if TYPE_CHECKING:
    import ssl

    import anthropic
    import pytest

    from pytest_evalloop.judge.judge import JudgeMaterials, JudgeOutcome
    from pytest_evalloop.model_api.pricing import PriceTable
    from pytest_evalloop.model_api.ratelimit import RunLimiter
    from pytest_evalloop.options import Settings
    from pytest_evalloop.roles.contract import Answerer, Target


class ClientFactory:
    """One `AsyncAnthropic` per event loop (an async HTTP client is bound to the loop it ran on).

    Retries with backoff honouring `retry-after` are the SDK's own, set to `--eval-retries`.
    HTTP goes through the SDK's own clients (`sdk_http_client`); the SDK's OpenTelemetry spans
    stay on only when a tracer provider is configured.
    With a `limiter`, every Messages API call (retries included) first waits for the run's
    shared budget, and a 429/529's retry-after pauses every process of the run.
    """

    def __init__(
        self, retries: int, timeout_s: float = 120.0, limiter: RunLimiter | None = None
    ) -> None:
        self.retries = retries
        self.timeout_s = timeout_s
        self.limiter = limiter
        # Keyed by the loop object itself, weakly: an id() of a closed loop can be reused by a
        # new one, which would hand out a client whose connections belong to a dead loop.
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, anthropic.AsyncAnthropic
        ]
        self._clients = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self) -> anthropic.AsyncAnthropic:
        key = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = self._build()
            return client

    def _build(self) -> anthropic.AsyncAnthropic:
        import os

        from pytest_evalloop.ledger.gcpolicy import imports_kept

        # The SDK's first import builds thousands of classes; with the GC paused it takes
        # about a fifth less (nothing it builds is garbage), and kept out of its way after.
        with imports_kept():
            import anthropic

        has_key = os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")
        # A keyless Anthropic-compatible endpoint (ANTHROPIC_BASE_URL alone) is allowed.
        extra: dict[str, Any] = {} if has_key else {"api_key": "unset"}
        if not tracing_configured():
            extra["open_telemetry"] = False
        return anthropic.AsyncAnthropic(
            max_retries=self.retries,
            timeout=self.timeout_s,
            http_client=sdk_http_client(self.limiter),
            **extra,
        )

    async def release(self) -> None:
        """Close and forget the running loop's client (call it on that loop, before it ends).

        An unclosed SDK client schedules its own close on whatever loop is running when it is
        garbage-collected, which may be another loop than the one its connections live on.
        """
        with self._lock:
            client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()


def sdk_http_client(limiter: RunLimiter | None = None) -> Any:
    """The ``http_client`` for ``anthropic.AsyncAnthropic``: one of the SDK's supported clients.

    ``anthropic.DefaultAioHttpClient()`` (the ``anthropic[aiohttp]`` extra, a dependency of the
    plugin) costs about a third less CPU per call than the SDK's default httpx2 pool at the
    concurrency a run has; where aiohttp is not installed, ``DefaultAsyncHttpxClient()``. Either
    keeps the SDK's timeouts, connection limits and proxy handling (``HTTPS_PROXY`` and the
    like). With a ``limiter``, its transports are wrapped so every Messages API call waits for
    the run's shared budget first (`ratelimit.LimitedTransport`).
    """
    import os

    import anthropic

    # The TLS context is what the client would build itself (verify=True), made once per
    # process: loading the CA store costs ~30 ms of CPU, and a run builds a client per loop.
    tls = shared_tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    try:
        import aiohttp  # noqa: F401 - the SDK has imported it already when it is installed
    except ImportError:
        client: Any = anthropic.DefaultAsyncHttpxClient(verify=tls)
    else:
        client = anthropic.DefaultAioHttpClient(verify=tls)
    if limiter is not None:
        from pytest_evalloop.model_api.ratelimit import wrap_transports

        wrap_transports(client, limiter)
    return client


@functools.cache
def shared_tls_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """The SDK's default TLS context (CA store, `SSL_CERT_FILE`/`SSL_CERT_DIR` honoured), once.

    Keyed by those two variables, so a process that changes them gets a context that reads
    the new ones. An `ssl.SSLContext` is safe to share between clients, loops and threads; the
    HTTP library's own docs advise reusing one.
    """
    import httpx2

    del cert_file, cert_dir  # the key only: create_ssl_context reads the environment itself
    return httpx2.create_ssl_context()


def tracing_configured(provider: Any = None) -> bool:
    """Whether OpenTelemetry has a tracer provider set (`provider`: the global one by default).

    Without one the SDK's spans are all non-recording and carry no trace context, yet it
    still builds each call's span attributes; the factory then turns its tracing off, which
    saves that work and changes nothing observable. A provider set after the loop's client
    was built is not seen by that client.
    """
    import os

    from opentelemetry import trace

    if os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"):
        return True  # named in the environment: OpenTelemetry loads it on first use
    current = trace.get_tracer_provider() if provider is None else provider
    return not isinstance(current, trace.ProxyTracerProvider)


@functools.lru_cache(maxsize=8)
class AnthropicJudge:
    """The default judge: a fresh Messages API call per attempt, doctrine as system prompt.

    `timeout_s` bounds the whole judging of one attempt, every call and retry included.
    """

    def __init__(
        self,
        *,
        model: str,
        client_factory: ClientFactory,
        prices: PriceTable,
        timeout_s: float = 300.0,
        batch: bool = False,
        samples: int = 1,
    ) -> None:
        from pytest_evalloop.judge import judge
        from pytest_evalloop.model_api.batches import BATCH_PRICE_FACTOR

        self.model = model
        self.version = judge.JUDGE_VERSION
        self.rubric_sha = judge.rubric_sha()
        self.prompt_sha = judge.case_prompt_sha()
        self.batch = batch
        """`--eval-judge-batch`: calls go through the Message Batches API, at its prices."""
        self.prices = prices.scaled(BATCH_PRICE_FACTOR) if batch else prices
        self.samples = samples
        """`--eval-judge-samples`: past 1, the case prompt is cached for the samples after the
        first; at 1 nothing reads it again, so its cache write premium is never paid."""
        self.timeout_s = timeout_s
        self._client_factory = client_factory

    async def judge(self, materials: JudgeMaterials) -> JudgeOutcome:
        """Judge one attempt; an endpoint failure or running out of time is a harness error."""
        from pytest_evalloop.failures import HarnessError
        from pytest_evalloop.judge import judge
        from pytest_evalloop.model_api.endpoint import public_url

        client = self._client_factory()
        deadline = asyncio.timeout(self.timeout_s)
        try:
            async with deadline:
                return await judge.judge_attempt(
                    client,
                    self.model,
                    materials,
                    batched=self.batch,
                    cache_case=self.samples > 1,
                )
        except TimeoutError:
            if not deadline.expired():
                raise
            raise HarnessError(
                f"the judge at {public_url(client)} did not finish within "
                f"--eval-judge-timeout={self.timeout_s:g} s; the endpoint is hung or slow: "
                "check it, or raise --eval-judge-timeout"
            ) from None


def user_supplies(config: pytest.Config, role: str) -> bool:
    """Whether a conftest or plugin already loaded overrides a role's fixture or hook, so the
    built-in one is never built."""
    import sys

    # Our own plugin module defines the default fixtures; it is looked up, not imported, so
    # this module stays below the plugin in the import graph.
    ours = sys.modules.get("pytest_evalloop.plugin")
    names = (f"evalloop_{role}", f"pytest_evalloop_make_{role}")
    return any(
        plugin is not ours and any(hasattr(plugin, name) for name in names)
        for plugin in config.pluginmanager.get_plugins()
    )


def default_answerer(settings: Settings, factory: ClientFactory) -> Answerer:
    """The answerer `--eval-answerer` names, configured from the settings."""
    if settings.answerer == "claude-code":
        from pytest_evalloop.answer.claude_code import ClaudeCodeAnswerer

        return ClaudeCodeAnswerer.from_settings(settings)
    from pytest_evalloop.answer.answerer import AnthropicAnswerer

    return AnthropicAnswerer(
        model=settings.answerer_model,
        client_factory=factory,
        max_turns=settings.max_turns,
        timeout_s=settings.attempt_timeout,
        max_tokens_budget=settings.max_tokens,
        prices=price_table(settings.prices),
    )


def default_judge(settings: Settings, factory: ClientFactory) -> AnthropicJudge:
    """The judge, configured from the settings."""
    return AnthropicJudge(
        model=settings.judge_model,
        client_factory=factory,
        prices=price_table(settings.prices),
        timeout_s=settings.judge_timeout,
        batch=settings.judge_batch,
        samples=settings.judge_samples,
    )


def default_target(set_dir: Path, config: sets.SetConfig, settings: Settings) -> Target:
    """The set's target: `--eval-target` when given, else the set's embedded server."""
    from pytest_evalloop.ledger.gcpolicy import imports_kept

    # Importing the MCP SDK and building the server create many long-lived objects and no
    # garbage: the collector's passes meanwhile are pure cost (about 0.2 s of startup).
    with imports_kept():
        from pytest_evalloop.targets.choice import build_target

        return build_target(
            set_dir, config, target=settings.target, tool_profile=settings.tool_profile
        )


def default_role_pins(
    settings: Settings, set_dir: Path, config: sets.SetConfig, *, roles: set[str]
) -> dict[str, Any]:
    """The run.json pins the built-in `roles` (of answerer, judge, target) will record for a
    set, known before any of them is built: what `--eval-resume` is checked against before
    collection. A role a conftest replaces is left out (it is checked when the run opens)."""
    pins: dict[str, Any] = {}
    if "answerer" in roles:
        pins.update(answerer=settings.answerer, answererModel=settings.answerer_model)
    if "judge" in roles:
        from pytest_evalloop.judge import judge

        pins.update(
            judgeModel=settings.judge_model,
            judgeVersion=judge.JUDGE_VERSION,
            rubricSha=judge.rubric_sha(),
        )
    if "target" in roles:
        from pytest_evalloop.targets.choice import target_pins

        pins.update(
            target_pins(set_dir, config, target=settings.target, tool_profile=settings.tool_profile)
        )
    return pins
