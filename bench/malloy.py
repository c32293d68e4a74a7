"""What the malloy target costs: start-up, per-call cost of getContext and executeQuery, RSS.

Starts the answerer's server of `evals/ecommerce-malloy` through the real MCP client, times
the start (spawn, compile the model, MCP handshake), then N calls of each tool (the reference
set's questions and modelQuery strings), and reads the server's resident memory from /proc.

`--run N` measures whole runs instead, side by side in one invocation: `pytest <set>` of N
synthetic cases on the embedded target (bench/workload.py's set) and N on the malloy target (the
set's verified cases cycled, each with a unique qid and question), both against the fake
endpoint with no latency, the same script shape (two context calls, two queries, the final
text; one judge call), alternating `--repeat` times. Prints one JSON object either way.

Run: `python bench/malloy.py [--calls N]` or `python bench/malloy.py --run 100`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import runpy
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


def _ok(result: Any, tool: str, arguments: dict[str, Any]) -> Any:
    """`result`, or a stop naming the call: an error reply is fast and would time nothing."""
    if result.is_error:
        text = " ".join(getattr(part, "text", "") for part in result.content)
        raise RuntimeError(f"{tool} {json.dumps(arguments)[:300]} failed: {text[:600]}")
    return result


async def bench(calls: int) -> dict[str, Any]:
    from mcp import Client

    from pytest_evalloop.targets.malloy.install import ensure_server
    from pytest_evalloop.targets.malloy.package import server_parameters

    ensure_server()
    runpy.run_path(str(SET_DIR / "conftest.py"))  # the generated tables, linked from the cache
    cases = [json.loads(x) for x in (SET_DIR / "cases.jsonl").read_text().splitlines() if x]
    queries = [c["modelQuery"] for c in cases if c.get("modelQuery")]
    questions = [c["question"] for c in cases]
    before = _node_pids()
    start = time.perf_counter()
    async with Client(server_parameters(SET_DIR / "ecommerce"), mode="legacy") as client:
        started = time.perf_counter() - start

        async def timed(tool: str, arguments: dict[str, Any], into: list[float]) -> None:
            t = time.perf_counter()
            result = await client.call_tool(tool, arguments)
            into.append(time.perf_counter() - t)
            _ok(result, tool, arguments)

        def query(i: int) -> dict[str, Any]:
            return {**ARGS, "modelPath": "ecommerce.malloy", "query": queries[i % len(queries)]}

        ctx: list[float] = []
        run: list[float] = []
        again: list[float] = []
        for i in range(calls):
            await timed("malloy_getContext", {**ARGS, "query": questions[i % len(questions)]}, ctx)
            await timed("malloy_executeQuery", query(i), run)
        # The same texts again: what an answerer's repeated query and the conductor's
        # re-execution cost once the text has been compiled (the server keeps compiles).
        for i in range(calls):
            await timed("malloy_executeQuery", query(i), again)
        t = time.perf_counter()
        many = [{**ARGS, "modelPath": "ecommerce.malloy", "query": q} for q in queries]
        replies = await asyncio.gather(
            *(client.call_tool("malloy_executeQuery", arguments) for arguments in many)
        )
        concurrent = time.perf_counter() - t
        for reply, arguments in zip(replies, many, strict=True):
            _ok(reply, "malloy_executeQuery", arguments)
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
        "execute_query_again_ms": {
            "median": round(statistics.median(again) * 1000, 1),
            "max": round(max(again) * 1000, 1),
        },
        "distinct_queries": len(set(queries[i % len(queries)] for i in range(calls))),
        "execute_45_concurrent_s": round(concurrent, 3),
        "server_rss_mb": [round(r, 1) for r in rss if r is not None],
        "calls": calls,
    }


PUBLISHER_SCRIPT: list[dict[str, Any]] = [
    {"tool": "malloy_getContext", "input": {**ARGS, "query": "{question}"}},
    {
        "tool": "malloy_getContext",
        "input": {**ARGS, "query": "measures and dimensions: {question}"},
    },
    {
        "tool": "malloy_executeQuery",
        "input": {**ARGS, "modelPath": "ecommerce.malloy", "query": "{modelQuery}"},
    },
    {
        "tool": "malloy_executeQuery",
        "input": {**ARGS, "modelPath": "ecommerce.malloy", "query": "{modelQuery}"},
    },
    {"text": "The answer follows.\n\nFinal query:\n```malloy\n{modelQuery}\n```"},
]


def malloy_set(root: Path, n: int) -> Path:
    """N cases cycling over the malloy set's verified cases with a modelQuery, in a copy of the
    set whose data folder links to the real one."""
    import shutil

    from pytest_evalloop.sets.cases import question_sha

    runpy.run_path(str(SET_DIR / "conftest.py"))  # the generated tables, linked from the cache
    set_dir = root / "evals" / "bench-malloy"
    set_dir.mkdir(parents=True)
    shutil.copyfile(SET_DIR / "set.json", set_dir / "set.json")
    for package in ("ecommerce", "ecommerce-truth"):
        (set_dir / package).mkdir()
        for path in (SET_DIR / package).iterdir():
            if path.suffix in (".malloy", ".json"):
                shutil.copyfile(path, set_dir / package / path.name)
    (set_dir / "ecommerce" / "data").symlink_to(SET_DIR / "ecommerce" / "data")
    (set_dir / "ecommerce-truth" / "data").symlink_to("../ecommerce/data")
    base = [
        row
        for row in map(json.loads, (SET_DIR / "cases.jsonl").read_text().splitlines())
        if row.get("modelQuery") and row["golden"]["status"] == "verified"
    ]
    rows = []
    for i in range(n):
        row = json.loads(json.dumps(base[i % len(base)]))
        row["qid"] = f"{row['qid']}_{i:05d}"
        row["question"] = f"{row['question']} (#{i})"
        row["questionSha"] = question_sha(row["question"])
        rows.append(json.dumps(row))
    (set_dir / "cases.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return set_dir


def run_pair(n: int, repeat: int, concurrency: int) -> dict[str, Any]:
    """Wall, CPU and peak RSS of `pytest <set>` with N cases on each target, alternating."""
    import os
    import re
    import tempfile

    sys.path.insert(0, str(REPO / "bench"))
    import processes
    import workload

    results: dict[str, list[Any]] = {"embedded": [], "malloy": []}
    with tempfile.TemporaryDirectory(prefix="bench-malloy-") as tmp:
        work = Path(tmp)
        sets = {
            "embedded": (workload.make_set(work / "embedded", n), workload.ANSWERER_SCRIPT),
            "malloy": (malloy_set(work / "malloy", n), PUBLISHER_SCRIPT),
        }
        fakes = {}
        for name, (set_dir, script) in sets.items():
            spec = workload.script_spec(set_dir / "cases.jsonl", 0.0)
            spec["answerer"] = {"default": script}
            spec_file = work / f"spec-{name}.json"
            spec_file.write_text(json.dumps(spec), encoding="utf-8")
            fakes[name] = processes.start_fake({"BENCH_SPEC": str(spec_file)})
        try:
            for i in range(repeat + 1):  # the first round warms caches and is not counted
                for name, (set_dir, _) in sets.items():
                    fake = fakes[name]
                    fake.reset()
                    env = {**os.environ, **fake.env()}
                    env.pop("PYTEST_ADDOPTS", None)
                    cmd = [
                        processes.PYTHON,
                        "-m",
                        "pytest",
                        str(set_dir),
                        "-q",
                        "-p",
                        "no:cacheprovider",
                        f"--eval-concurrency={concurrency}",
                        f"--eval-label={name}-{i}",
                        f"--eval-runs-dir={work / 'runs'}",
                    ]
                    measured = processes.measure(cmd, env, work, timeout=1800.0)
                    found = re.search(r"(\d+) passed", measured.output)
                    if measured.returncode != 0 or not found or int(found.group(1)) != n:
                        raise RuntimeError(f"{name} run did not pass {n} cases:\n{measured.tail()}")
                    if i:
                        results[name].append(measured)
        finally:
            for fake in fakes.values():
                fake.stop()

    def figures(runs: list[Any]) -> dict[str, Any]:
        return {
            "wall_s": [round(r.wall, 2) for r in runs],
            "wall_median_s": round(statistics.median(r.wall for r in runs), 2),
            "cpu_s": [round(r.cpu, 2) for r in runs],
            "max_rss_mb": round(max(r.max_rss_mb for r in runs), 1),
        }

    out: dict[str, Any] = {"cases": n, "concurrency": concurrency, "repeat": repeat}
    out.update({name: figures(runs) for name, runs in results.items()})
    out["malloy_over_embedded_wall"] = round(
        out["malloy"]["wall_median_s"] / out["embedded"]["wall_median_s"], 2
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=45)
    parser.add_argument("--run", type=int, default=0, help="cases per whole run (0: per call)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if args.run:
        print(json.dumps(run_pair(args.run, args.repeat, args.concurrency), indent=2))
    else:
        print(json.dumps(asyncio.run(bench(args.calls)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
