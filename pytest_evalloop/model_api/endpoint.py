"""One Messages API call, for the answerer and the judge alike, and what its failures mean.

Whatever the endpoint does wrong — an HTTP error once the SDK's retries are spent, a timeout, a
refused connection, a 200 whose body is not a message (an HTML page from a proxy, broken JSON)
— comes out of :func:`create_message` as a :class:`HarnessError` naming the status and the
endpoint, never a credential. A harness error is an attempt event with `error`, counted by the
abort rule; never a Python traceback, never a verdict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pytest_evalloop.failures import HarnessError
from pytest_evalloop.model_api.redaction import environment_secrets, redact

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import Message

BODY_SHOWN = 80
"""How much of an unusable reply's body a harness error quotes."""


def public_url(client: anthropic.AsyncAnthropic) -> str:
    """The client's base URL without any user:password part."""
    parts = urlsplit(str(client.base_url))
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


ANTHROPIC_HOST = "api.anthropic.com"
"""Anthropic's own endpoint (the SDK's default): the one whose bills the price table is."""


def endpoint_host(environ: Any = None) -> str | None:
    """The host (and port) of an Anthropic-compatible endpoint other than Anthropic's that this
    process talks to (`ANTHROPIC_BASE_URL`), or None for Anthropic's own. Never its userinfo."""
    import os

    raw = (os.environ if environ is None else environ).get("ANTHROPIC_BASE_URL") or ""
    parts = urlsplit(raw.strip())
    host = parts.hostname
    if not host or host == ANTHROPIC_HOST:
        return None
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{host}:{port}" if port else host


def list_price_note(host: str | None) -> str:
    """What a cost figure says when it was not billed by Anthropic: the price table's list
    prices times the tokens the endpoint reported (a gateway, a proxy, the loopback fake)."""
    return f" (priced at list; endpoint: {host})" if host else ""


async def create_message(
    client: anthropic.AsyncAnthropic,
    model: str,
    max_tokens: int,
    system: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    messages: list[dict[str, Any]],
) -> Message:
    """One Messages API call (`tools` None: none offered); every failure is a HarnessError."""
    import anthropic

    extra: dict[str, Any] = {} if tools is None else {"tools": tools}
    try:
        reply = await client.messages.create(
            model=model,
            max_tokens=max_tokens,
            system=system,  # type: ignore[arg-type]
            messages=messages,  # type: ignore[arg-type]
            **extra,
        )
    except anthropic.APIError as exc:
        raise HarnessError(describe_failure(exc, client, model), refused=refused(exc)) from exc
    except ValueError as exc:
        # The SDK decodes a JSON-typed 200 body itself; broken JSON raises here.
        raise HarnessError(_unusable(client, model, exc, getattr(exc, "doc", None))) from exc
    problem = _not_a_message(reply)
    if problem is not None:
        body = reply if isinstance(reply, str) else None
        raise HarnessError(_unusable(client, model, problem, body))
    return reply


def _not_a_message(reply: Any) -> str | None:
    """Why a 200 reply is not a usable message, or None when it is one."""
    from anthropic.types import Message

    if isinstance(reply, str):
        # The SDK hands back a body that was not typed as JSON (an HTML error page) as text.
        return "the body is not JSON"
    if not isinstance(reply, Message):
        return f"the body is a {type(reply).__name__}, not a message"
    try:
        # The SDK builds the reply without validating it: a JSON object that is not a message
        # has none of these.
        usage, content = reply.usage, reply.content
        counts = (usage.input_tokens, usage.output_tokens)
    except AttributeError as exc:
        return f"the JSON is not a message ({exc})"
    if not isinstance(content, list) or not all(isinstance(n, int) for n in counts):
        return "the JSON is not a message (no content list or token counts)"
    return None


def _unusable(client: anthropic.AsyncAnthropic, model: str, problem: Any, body: str | None) -> str:
    secrets = _secrets(client)
    # Each part redacted as it came, before it is folded and quoted: `repr` escapes a quote
    # or a control character in a credential, and its plain form would no longer be found.
    what = f"{type(problem).__name__}: {problem}" if isinstance(problem, Exception) else problem
    what = redact(str(what), secrets)
    starts = ""
    if body:
        head = " ".join(redact(body, secrets).split())[:BODY_SHOWN]
        starts = f"; it starts {head!r}"
    text = (
        f"the Anthropic Messages API at {public_url(client)} gave an unusable reply for model "
        f"{model!r} ({what}{starts}); check ANTHROPIC_BASE_URL: a proxy or gateway may be "
        "answering in its place"
    )
    return redact(text, secrets)


def refused(exc: Exception) -> Literal["too_long", "invalid"] | None:
    """Whether the API refused the request for what it carried: `too_long` (HTTP 413, or a
    400 saying the prompt outgrew the model's context window), `invalid` (another 400)."""
    import anthropic

    if not isinstance(exc, anthropic.APIStatusError) or exc.status_code not in (400, 413):
        return None
    said = (exc.api_message or "").lower()
    return "too_long" if exc.status_code == 413 or "prompt is too long" in said else "invalid"


def describe_failure(exc: Exception, client: anthropic.AsyncAnthropic, model: str) -> str:
    """A HarnessError message naming the status and endpoint, never a credential."""
    import anthropic

    url = public_url(client)
    if isinstance(exc, anthropic.APIStatusError):
        detail = f"HTTP {exc.status_code}" + (f" {exc.type}" if exc.type else "")
        said = f": {exc.api_message}" if exc.api_message else ""
        if refused(exc) == "too_long":
            text = (
                f"the Anthropic Messages API at {url} refused the request for model {model!r} "
                f"as too long ({detail}{said}): what the request carried outgrew the model's "
                "context window"
            )
        elif exc.status_code in (400, 401, 403, 404):
            text = (
                f"the Anthropic Messages API at {url} rejected the request for model {model!r} "
                f"({detail}{said}); check ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL and the model id"
            )
        else:
            text = (
                f"the Anthropic Messages API at {url} answered {detail}{said} for model "
                f"{model!r} after {client.max_retries} retries; the endpoint is overloaded or "
                "down: retry later, lower --eval-concurrency or raise --eval-retries"
            )
    elif isinstance(exc, anthropic.APITimeoutError):
        text = (
            f"the Anthropic Messages API at {url} timed out after {client.max_retries} retries "
            f"(each request waits --eval-request-timeout={_seconds(client.timeout)} s); the "
            "endpoint is hung or slow: check it, or raise --eval-request-timeout"
        )
    elif isinstance(exc, anthropic.APIConnectionError):
        text = (
            f"the Anthropic Messages API at {url} was unreachable after {client.max_retries} "
            f"retries ({type(exc).__name__}); check ANTHROPIC_BASE_URL and the network"
        )
    else:
        text = (
            f"the Anthropic Messages API at {url} gave an unusable reply for model {model!r} "
            f"({type(exc).__name__}: {exc})"
        )
    return redact(text, _secrets(client))


def _seconds(timeout: Any) -> str:
    # The SDK keeps a float, or an httpx-style Timeout whose read limit is what hangs.
    value = getattr(timeout, "read", timeout)
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def _secrets(client: anthropic.AsyncAnthropic) -> list[str]:
    # The client's own credentials too: a key passed as an argument is in no environment.
    given = [getattr(client, "api_key", None), getattr(client, "auth_token", None)]
    named = {f"GIVEN_KEY_{i}": s for i, s in enumerate(given) if isinstance(s, str)}
    # Through the same reading as the environment's: their JSON-escaped forms too.
    return [*environment_secrets(), *environment_secrets(named)]
