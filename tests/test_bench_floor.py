"""`bench/floor.py` makes the same model calls per case as the plugin does on the bench workload.

The floor is only a fair yardstick if it plays each case as the fake scripts it: five answerer
turns (the tool calls between them answered by its in-process MCP server) and one judge call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def bench_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    monkeypatch.syspath_prepend(str(BENCH))
    import processes
    import workload

    yield workload, processes


def test_floor_plays_every_case_with_the_workloads_calls(
    tmp_path: Path, bench_modules: tuple[Any, Any]
) -> None:
    workload, processes = bench_modules
    set_dir = workload.make_set(tmp_path, 3)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(workload.script_spec(set_dir / "cases.jsonl", 0.0)))
    fake = processes.start_fake({"BENCH_SPEC": str(spec)})
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH / "floor.py"), str(set_dir / "cases.jsonl")]
            + ["--concurrency", "2"],
            env={**os.environ, **fake.env()},
            capture_output=True,
            text=True,
            timeout=120,
        )
        calls = [r for r in fake.requests() if r.path == "/v1/messages"]
    finally:
        fake.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "floor: 3 cases played" in done.stdout
    assert all(r.status == 200 for r in calls)
    per_turn = Counter((r.role, r.turn) for r in calls)
    expected = {("answerer", t): 3 for t in range(1, workload.ANSWERER_CALLS + 1)}
    assert per_turn == {**expected, ("judge", 1): 3}
    assert {r.question for r in calls if r.role == "answerer"} == {
        json.loads(line)["question"] for line in (set_dir / "cases.jsonl").read_text().splitlines()
    }
