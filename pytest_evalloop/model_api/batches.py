"""One Messages API call through the Message Batches API (`--eval-judge-batch`): half the price,
no latency promise.

:func:`create_message_batched` has :func:`endpoint.create_message`'s signature and contract: it
returns the reply as a ``Message`` or raises :class:`HarnessError`. It submits a batch of one
request (the discount is per request, not per batch size, so the judge's concurrency carries
over unchanged), polls until the batch has ended, and reads its one result. A result that
``errored``, ``expired`` or was ``canceled`` is a harness error for that attempt, never a
verdict.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Literal

from pytest_evalloop.failures import HarnessError
from pytest_evalloop.model_api.endpoint import describe_failure, public_url, refused

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import Message

BATCH_PRICE_FACTOR = 0.5
"""What a batched request costs against the same request online (the API's batch discount)."""

POLL_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Waits between polls of a batch's status: short first, then once a minute."""


async def create_message_batched(
    client: anthropic.AsyncAnthropic,
    model: str,
    max_tokens: int,
    system: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    messages: list[dict[str, Any]],
    *,
    poll: tuple[float, ...] = POLL_SECONDS,
) -> Message:
    """One request as a batch of one; every failure (and a result that is not a success) is a
    HarnessError naming the batch and what happened."""
    import anthropic

    params: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "system": system,
        "messages": messages,
    }
    if tools is not None:
        params["tools"] = tools
    custom_id = "evalloop-0"
    try:
        batch = await client.messages.batches.create(
            requests=[{"custom_id": custom_id, "params": params}]  # type: ignore[typeddict-item]
        )
        waits = 0
        while batch.processing_status != "ended":
            await asyncio.sleep(poll[min(waits, len(poll) - 1)])
            waits += 1
            batch = await client.messages.batches.retrieve(batch.id)
        results = await client.messages.batches.results(batch.id)
        found = [entry async for entry in results if entry.custom_id == custom_id]
    except anthropic.APIError as exc:
        raise HarnessError(describe_failure(exc, client, model), refused=refused(exc)) from exc
    if not found:
        raise HarnessError(
            f"the Message Batches API at {public_url(client)} ended batch {batch.id} without "
            f"a result for its request (model {model!r})"
        )
    result = found[0].result
    if result.type == "succeeded":
        return result.message
    said = ""
    why: Literal["too_long", "invalid"] | None = None
    if result.type == "errored":
        error = getattr(getattr(result, "error", None), "error", None)
        kind, message = getattr(error, "type", "?"), str(getattr(error, "message", ""))
        said = f": {kind}: {message}"
        if kind == "invalid_request_error":
            why = "too_long" if "prompt is too long" in message.lower() else "invalid"
    raise HarnessError(
        f"the Message Batches API at {public_url(client)} gave no reply for model {model!r}: "
        f"batch {batch.id}'s request {result.type}{said}; rejudge it again, or without "
        "--eval-judge-batch",
        refused=why,
    )
