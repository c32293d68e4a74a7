"""What the malloy target costs: start-up, per-call cost of getContext and executeQuery, RSS.

Starts the answerer's server of `evals/ecommerce-malloy` through the real MCP client, times
the start (spawn, compile the model, MCP handshake), then N calls of each tool (the reference
set's questions and modelQuery strings), and reads the server's resident memory from /proc.
Run: `python bench/malloy.py [--calls N]`. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SET_DIR = REPO / "evals" / "ecommerce-malloy"
ARGS = {"environmentName": "local", "packageName": "ecommerce"}


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _node_pids() -> set[int]:
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(part.endswith(b"server.mjs") for part in cmd) and str(
                SET_DIR
            ).encode() in b" ".join(cmd):
                pids.add(int(proc.name))
    return pids


async def bench(calls: int) -> dict[str, Any]:
    from mcp import Client

    from pytest_evalloop.targets.malloy.install import ensure_server
    from pytest_evalloop.targets.malloy.package import server_parameters

    ensure_server()
    cases = [json.loads(x) for x in (SET_DIR / "cases.jsonl").read_text().splitlines() if x]
    queries = [c["modelQuery"] for c in cases if c.get("modelQuery")]
    questions = [c["question"] for c in cases]
    before = _node_pids()
    start = time.perf_counter()
    async with Client(server_parameters(SET_DIR / "ecommerce"), mode="legacy") as client:
        started = time.perf_counter() - start
        ctx, run = [], []
        for i in range(calls):
            t = time.perf_counter()
            await client.call_tool(
                "malloy_getContext", {**ARGS, "query": questions[i % len(questions)]}
            )
            ctx.append(time.perf_counter() - t)
            t = time.perf_counter()
            await client.call_tool(
                "malloy_executeQuery",
                {**ARGS, "modelPath": "ecommerce.malloy", "query": queries[i % len(queries)]},
            )
            run.append(time.perf_counter() - t)
        t = time.perf_counter()
        await asyncio.gather(
            *(
                client.call_tool(
                    "malloy_executeQuery",
                    {**ARGS, "modelPath": "ecommerce.malloy", "query": q},
                )
                for q in queries
            )
        )
        concurrent = time.perf_counter() - t
        rss = [_rss_mb(p) for p in _node_pids() - before]
    return {
        "startup_s": round(started, 3),
        "get_context_ms": {
            "median": round(statistics.median(ctx) * 1000, 1),
            "max": round(max(ctx) * 1000, 1),
        },
        "execute_query_ms": {
            "median": round(statistics.median(run) * 1000, 1),
            "max": round(max(run) * 1000, 1),
        },
        "execute_45_concurrent_s": round(concurrent, 3),
        "server_rss_mb": [round(r, 1) for r in rss if r is not None],
        "calls": calls,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=45)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    print(json.dumps(asyncio.run(bench(args.calls)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
