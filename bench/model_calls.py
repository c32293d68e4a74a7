"""CPU per Messages API call in this process, through the real `anthropic` SDK.

Starts the fake Anthropic endpoint as a separate process (its CPU never counts), then for each
client configuration and each concurrency sends calls shaped like an answerer turn (system
prompt, two tools, a few turns of history) through `endpoint.create_message`, and prints the
process CPU (user + system, every thread) per call. Run from the repository root:

    .venv/bin/python bench/model_calls.py
    .venv/bin/python bench/model_calls.py --calls 1280 --repeat 5 --latency 0.05

Configurations:
- `sdk`: `anthropic.AsyncAnthropic()` as a user would build it (the SDK's default httpx2 client);
- `sdk-aiohttp`: the SDK with its own `anthropic.DefaultAioHttpClient()` (the `aiohttp` extra),
  nothing of ours: the client the plugin builds on;
- `ours`: what the plugin hands out: `ClientFactory` (the SDK's aiohttp client under our
  `LimitedTransport`) with a `RunLimiter` on a state directory and no rpm/tpm (the default run).
- `ours-rpm`: the same with `--eval-rpm` set far above what the bench reaches (the limiter
  reserves under its file lock on every call, but never waits).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_evalloop.answer.answerer import SYSTEM_PROMPT
from pytest_evalloop.answer.backends import ClientFactory
from pytest_evalloop.model_api.endpoint import create_message
from pytest_evalloop.model_api.ratelimit import RunLimiter
from pytest_evalloop.testing import ScriptSpec, start_fake_anthropic_process

TOOLS: list[dict[str, Any]] = [
    {
        "name": "get_context",
        "description": "Search the data model for sources, measures and dimensions. " * 4,
        "input_schema": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "terms to look up"}},
            "required": ["query"],
        },
    },
    {
        "name": "execute_query",
        "description": "Run one read-only query against the model and return its rows. " * 4,
        "input_schema": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "the query"}},
            "required": ["query"],
        },
        "cache_control": {"type": "ephemeral"},
    },
]
CONFIGS = "sdk,sdk-aiohttp,ours,ours-rpm"
SYSTEM = [{"type": "text", "text": SYSTEM_PROMPT, "cache_control": {"type": "ephemeral"}}]


def history(index: int) -> list[dict[str, Any]]:
    """Three turns of an answerer's conversation (about 4 KB), unique per call."""
    rows = "\n".join(f"| 2024-{m:02d} | {1000 + 17 * m} | {m * 3.5:.2f} |" for m in range(1, 13))
    return [
        {"role": "user", "content": f"What was the revenue per month in 2024? (#{index})"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look up the definitions first."},
                {
                    "type": "tool_use",
                    "id": "toolu_a1",
                    "name": "get_context",
                    "input": {"query": "revenue"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_a1",
                    "content": [{"type": "text", "text": "measure revenue: sum(price) " * 60}],
                }
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_a2",
                    "name": "execute_query",
                    "input": {"query": "run: orders -> { aggregate: revenue }"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_a2",
                    "content": [{"type": "text", "text": rows}],
                }
            ],
        },
    ]


def make_client(name: str, state_dir: Path) -> Callable[[], Any]:
    """A factory for the named configuration (called on the loop that will use it)."""
    if name == "sdk":
        import anthropic

        return lambda: anthropic.AsyncAnthropic(max_retries=2)
    if name == "sdk-aiohttp":
        import anthropic

        return lambda: anthropic.AsyncAnthropic(
            max_retries=2, http_client=anthropic.DefaultAioHttpClient()
        )
    if name == "ours":
        return ClientFactory(2, limiter=RunLimiter(state_dir, rpm=0, tpm=0))
    if name == "ours-rpm":
        return ClientFactory(2, limiter=RunLimiter(state_dir, rpm=10_000_000, tpm=0))
    raise SystemExit(f"unknown configuration {name!r}; choose from {CONFIGS}")


async def run_calls(client: Any, calls: int, in_flight: int, offset: int) -> None:
    """Send `calls` calls with at most `in_flight` at once; every one must succeed."""
    gate = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with gate:
            message = await create_message(client, "claude-bench", 256, SYSTEM, TOOLS, history(i))
            assert message.usage.output_tokens >= 0

    await asyncio.gather(*(one(offset + i) for i in range(calls)))


async def measure(
    name: str, state_dir: Path, calls: int, in_flight: int, repeat: int
) -> list[tuple[float, float]]:
    """(CPU, system CPU) ms per call for each of `repeat` rounds, after one warm-up round."""
    factory = make_client(name, state_dir)
    client = factory()
    await run_calls(client, max(in_flight, 8), in_flight, 0)  # warm: connections, imports
    out = []
    for r in range(repeat):
        before = resource.getrusage(resource.RUSAGE_SELF)
        await run_calls(client, calls, in_flight, (r + 1) * calls)
        after = resource.getrusage(resource.RUSAGE_SELF)
        user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
        out.append((1000 * (user + system) / calls, 1000 * system / calls))
    if isinstance(factory, ClientFactory):
        await factory.release()
    else:
        await client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=640, help="calls per round (default 640)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per row (default 3)")
    parser.add_argument("--configs", default=CONFIGS, help=f"default {CONFIGS}")
    parser.add_argument("--in-flight", default="1,64", help="concurrencies (default 1,64)")
    parser.add_argument("--latency", default="0,0.05", help="fake latencies in s (default 0,0.05)")
    args = parser.parse_args(argv)
    import os

    print(
        f"{'config':10} {'latency':>7} {'flight':>6} {'cpu ms':>8} {'of: sys':>8}  (cpu ms/call per round)"
    )
    for latency in (float(x) for x in args.latency.split(",")):
        fake = start_fake_anthropic_process(ScriptSpec(latency=latency))
        os.environ.update(fake.env())
        try:
            for name in args.configs.split(","):
                for flight in (int(x) for x in args.in_flight.split(",")):
                    calls = args.calls if flight > 1 or latency == 0 else max(20, args.calls // 8)
                    with tempfile.TemporaryDirectory(prefix="bench-limiter-") as tmp:
                        rounds = asyncio.run(measure(name, Path(tmp), calls, flight, args.repeat))
                    cpu = statistics.median(r[0] for r in rounds)
                    sys_ms = statistics.median(r[1] for r in rounds)
                    shown = " ".join(f"{r[0]:.2f}" for r in rounds)
                    print(
                        f"{name:10} {latency:7.3f} {flight:6d} {cpu:8.3f} {sys_ms:8.3f}  ({shown})",
                        flush=True,
                    )
        finally:
            fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
