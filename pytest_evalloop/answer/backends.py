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
    from pytest_evalloop.roles import Answerer, Target


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

        from pytest_evalloop.gcpolicy import gc_paused

        # The SDK's first import builds thousands of classes; with the GC paused it takes
        # about a fifth less (nothing it builds is garbage).
        with gc_paused():
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
    from pytest_evalloop.gcpolicy import gc_paused

    # Importing the MCP SDK and building the server create many long-lived objects and no
    # garbage: the collector's passes meanwhile are pure cost (about 0.2 s of startup).
    with gc_paused():
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


def _embedded_model_path(set_dir: Path, config: sets.SetConfig) -> Path | None:
    target = config.target or {}
    if target.get("kind") != "embedded" or not target.get("model"):
        return None
    return set_dir / str(target["model"])


def definitions_shared(set_dir: Path, config: sets.SetConfig) -> bool:
    """Whether the judge's model definitions are the same for every case of the set: a
    target's model source is; the embedded target's are the entities each case expects."""
    return _embedded_model_path(set_dir, config) is None


def model_paths(set_dir: Path, config: sets.SetConfig) -> list[Path]:
    """Files of the model under test (a file tool touching them is contamination)."""
    paths = []
    embedded = _embedded_model_path(set_dir, config)
    if embedded is not None:
        paths.append(embedded.resolve())
    extra = config.model_extra or {}
    for key in ("modelFile", "targetModelFile"):
        if isinstance(extra.get(key), str):
            paths.append((set_dir / extra[key]).resolve())
    served = served_model_file(set_dir, config)
    if served is not None and served.resolve() not in paths:
        paths.append(served.resolve())
    return paths


@functools.lru_cache(maxsize=16)
def _load_model(path: Path) -> Any:
    from pytest_evalloop.targets.embedded.model import SemanticModel

    return SemanticModel.load(path)


MODEL_SOURCE_CHARS = 60_000
"""The judge is shown at most this much of a model's source (the real ecommerce.malloy is 14 KB)."""
PACKAGE_SEARCH_LEVELS = 3
"""How far above the set directory `<targetPackage>/<targetModelPath>` is looked for."""


def model_definitions(
    set_dir: Path,
    config: sets.SetConfig,
    case: sets.Case,
    call_arguments: dict[str, Any] | None = None,
) -> str:
    """The model's definitions relevant to a case, for the judge (docs, SQL, joins).

    Embedded target: the entities the case expects, from the set's model file. Any other
    target: the source of the model the answerer's final call queried (its `packageName` /
    `modelPath`, else the set's `targetPackage` / `targetModelPath`), read by the conductor
    from the files beside the set; when there is none, a note saying why, which the judge
    is shown in place of definitions.
    """
    embedded = _embedded_model_path(set_dir, config)
    if embedded is not None:
        if not embedded.is_file():
            return ""
        expected = case.expected_entities
        ids: list[str] = []
        if expected is not None:
            ids = [*expected.required, *(i for g in expected.required_any_of for i in g)]
            ids += expected.acceptable
        text: str = _load_model(embedded).definitions_for(dict.fromkeys(ids))
        return text
    package, model_path = _model_named(config, call_arguments)
    if not model_path:
        return (
            "(not available: set.json names no targetModelPath, so the harness does not know "
            "which model file the target serves)"
        )
    found = served_model_file(set_dir, config, call_arguments)
    where = f"{package}/{model_path}" if package else model_path
    if found is None:
        return (
            f"(not available: the harness found no file for the model {where} beside the set; "
            "set.json can name it with targetModelFile, relative to the set)"
        )
    return _model_source(found, where, str(_display(found, set_dir)))


def _model_named(
    config: sets.SetConfig, call_arguments: dict[str, Any] | None
) -> tuple[str | None, str | None]:
    """The package and model path a call named, else the set's."""
    extra = config.model_extra or {}
    block = config.publisher or {}
    default_package = block.get("packageName") or extra.get("targetPackage")
    default_path = block.get("modelPath") or extra.get("targetModelPath")
    called = call_arguments or {}
    package = called.get("packageName") or default_package
    model_path = called.get("modelPath") or default_path
    return (
        str(package) if package else None,
        str(model_path) if model_path else None,
    )


def served_model_file(
    set_dir: Path, config: sets.SetConfig, call_arguments: dict[str, Any] | None = None
) -> Path | None:
    """The `.malloy` file of the model a non-embedded target serves, when it sits beside the set.

    `targetModelFile` (relative to the set) names the set's own model; otherwise the file is
    looked for as `<package>/<modelPath>` in the set directory and up to three levels above it
    (the malloy-samples layout: `evals/<set>/` beside the `<package>/` it evaluates). A path
    that leaves its package directory or is not a `.malloy` file is never read: the names can
    come from the answerer's call.
    """
    package, model_path = _model_named(config, call_arguments)
    extra = config.model_extra or {}
    default = _model_named(config, None)
    explicit = extra.get("targetModelFile")
    if isinstance(explicit, str) and (package, model_path) == default:
        path = set_dir / explicit
        return path if path.is_file() else None
    if not model_path or not model_path.endswith(".malloy"):
        return None
    if package is not None and (package in ("", ".", "..") or "/" in package or "\\" in package):
        return None
    roots = [set_dir, *list(set_dir.parents)[:PACKAGE_SEARCH_LEVELS]]
    for root in roots:
        home = root / package if package else root
        candidate = home / model_path
        try:
            inside = candidate.resolve().is_relative_to(home.resolve())
        except OSError:
            continue
        if inside and candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=32)
def _read_source(path: Path, mtime_ns: int) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _model_source(path: Path, name: str, display: str) -> str:
    try:
        text = _read_source(path, path.stat().st_mtime_ns)
    except OSError as exc:
        return f"(not available: the model file {display} could not be read: {exc.strerror})"
    head = f"Source of the model {name}, read by the harness from {display}:\n\n"
    if len(text) > MODEL_SOURCE_CHARS:
        cut = len(text) - MODEL_SOURCE_CHARS
        text = text[:MODEL_SOURCE_CHARS] + f"\n... ({cut} more characters not shown)"
    return head + text


def _display(path: Path, set_dir: Path) -> Path:
    # Relative to the set where possible: the judge needs no absolute paths of this machine.
    import os

    try:
        return Path(os.path.relpath(path, set_dir))
    except ValueError:
        return path
