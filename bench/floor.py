"""The floor: the headline's model and tool calls made by the required SDKs alone, no harness.

Any harness built on the real `anthropic` and `mcp` SDKs pays for importing them and for each
call through them. This process pays only that: it imports the two SDKs, serves the
benchmark's two tools from an in-process `MCPServer` (fixed replies as large as the embedded
target's: a 3.4 KB get_context result, a 0.2 KB query result), and plays every case of a set
as the fake endpoint's script does. Per case: answerer turns through
`AsyncAnthropic.messages.create` (the answerer's real system prompt, the tools, the growing
history), each tool call through an in-process `mcp.Client`, then one judge call with the
real doctrine. `--concurrency` cases run at once. There is no pytest, pipeline, ledger,
re-execution, retrieval scoring or artifact.

`throughput.py` runs it as a child process against the same fake, beside the headline run:
its wall and CPU are the least any harness on these SDKs can take on this machine, and the
headline minus the floor is what pytest-evalloop itself adds. Alone:

    .venv/bin/python bench/floor.py CASES_JSONL --concurrency 64   # ANTHROPIC_BASE_URL set

With `--processes W` it is the floor of `-n W`: W processes, each importing the SDKs and
playing every W-th case with `--concurrency` in flight, as W xdist workers would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

# Fixed tool replies, as large as the embedded target's replies in the headline run.
CONTEXT_REPLY = json.dumps(
    {
        "results": [
            {"id": f"source.field_{i}", "kind": "dimension", "doc": "x" * 280} for i in range(10)
        ]
    }
)
QUERY_REPLY = json.dumps({"columns": ["n"], "rows": [[i] for i in range(12)], "rowCount": 12})
MAX_TURNS = 8


def build_server() -> Any:
    """An in-process MCP server with the benchmark's two tools and fixed replies."""
    from mcp.server.mcpserver import MCPServer

    # Set up as the embedded target is, at the SDK's cheapest: no INFO logging (the SDK's
    # default configures a rich handler on the root logger), no OpenTelemetry middleware (its
    # documented opt-out), async tools (a plain function is run on a worker thread).
    server = MCPServer(name="floor", log_level="WARNING")
    server.middleware[:] = [
        layer for layer in server.middleware if type(layer).__name__ != "OpenTelemetryMiddleware"
    ]

    @server.tool(
        name="get_context", description="Search the model's sources.", structured_output=False
    )
    async def get_context(query: str) -> str:
        return CONTEXT_REPLY

    @server.tool(
        name="execute_query", description="Run one read-only SQL query.", structured_output=False
    )
    async def execute_query(sql: str) -> str:
        return QUERY_REPLY

    return server


async def play_case(
    client: Any, mcp_client: Any, tools: list[dict[str, Any]], question: str
) -> None:
    """One case: answerer turns (with their tool calls) until a text answer, then a judge call."""
    from pytest_evalloop.answer.answerer import SYSTEM_PROMPT
    from pytest_evalloop.judge.judge import render_doctrine

    system = [{"type": "text", "text": SYSTEM_PROMPT, "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    answer = ""
    for _ in range(MAX_TURNS):
        reply = await client.messages.create(
            model="claude-bench", max_tokens=4096, system=system, tools=tools, messages=messages
        )
        blocks = [block.model_dump(exclude_none=True) for block in reply.content]
        messages.append({"role": "assistant", "content": blocks})
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            answer = "".join(block.text for block in reply.content if block.type == "text")
            break
        results = []
        for use in uses:
            result = await mcp_client.call_tool(use.name, dict(use.input))
            text = "".join(getattr(part, "text", "") for part in result.content)
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "content": [{"type": "text", "text": text}],
                }
            )
        messages.append({"role": "user", "content": results})
    judge_system = [
        {"type": "text", "text": render_doctrine(), "cache_control": {"type": "ephemeral"}}
    ]
    prompt = f"Question:\n{question}\n\nAnswer:\n{answer}\n\nGolden rows:\n{QUERY_REPLY}\n"
    await client.messages.create(
        model="claude-bench",
        max_tokens=2048,
        system=judge_system,
        messages=[{"role": "user", "content": prompt}],
    )


async def play(questions: list[str], concurrency: int) -> None:
    """Every case, `concurrency` at once, over one SDK client and one MCP connection."""
    import anthropic
    from mcp import Client

    # The SDK's own client that the plugin uses (its aiohttp client, else its default one), and
    # no OpenTelemetry spans (none are exported here): the SDKs at their cheapest.
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        http_client: Any = anthropic.DefaultAsyncHttpxClient()
    else:
        http_client = anthropic.DefaultAioHttpClient()
    client = anthropic.AsyncAnthropic(http_client=http_client, max_retries=2, open_telemetry=False)
    gate = asyncio.Semaphore(concurrency)
    async with Client(build_server()) as mcp_client:
        listed = await mcp_client.list_tools()
        tools = [
            {"name": t.name, "description": t.description or "", "input_schema": t.input_schema}
            for t in listed.tools
        ]

        async def one(question: str) -> None:
            async with gate:
                await play_case(client, mcp_client, tools, question)

        await asyncio.gather(*(one(q) for q in questions))
    await client.close()


def fan_out(cases: Path, concurrency: int, processes: int) -> int | None:
    """W children, child i playing cases i, i+W, ...: the floor of `-n W` (the parent is idle)."""
    children = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                str(cases),
                "--concurrency",
                str(concurrency),
                "--shard",
                f"{index}/{processes}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for index in range(processes)
    ]
    played = 0
    for child in children:
        out, _ = child.communicate()
        if child.returncode != 0:
            print(f"floor: a child failed (exit {child.returncode}): {out}", file=sys.stderr)
            return None
        played += int(out.split()[1])
    return played


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", type=Path, help="the set's cases.jsonl (questions in order)")
    parser.add_argument(
        "--concurrency", type=int, default=64, help="cases in flight per process (default 64)"
    )
    parser.add_argument(
        "--processes", type=int, default=1, help="processes sharing the cases (default 1)"
    )
    parser.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.processes > 1:
        played = fan_out(args.cases, args.concurrency, args.processes)
        if played is None:
            return 1
        print(f"floor: {played} cases played")
        return 0
    index, count = (int(part) for part in args.shard.split("/"))
    lines = args.cases.read_text(encoding="utf-8").splitlines()
    questions = [json.loads(line)["question"] for line in lines if line.strip()][index::count]
    asyncio.run(play(questions, args.concurrency))
    print(f"floor: {len(questions)} cases played")
    return 0


if __name__ == "__main__":
    sys.exit(main())
