"""`bench/throughput.py` and `bench/malloy.py` run: a small configuration of it, end to end, in the suite.

Nothing ran the bench, so a change elsewhere (a label check, a moved module) broke it silently
for a release. This runs it as a script on a few dozen cases at 10 ms a call, no inspect-ai and
no `-n` rows, and checks it measured every row it reports. Its figures are not asserted: a
test never races the clock; the bench prints them beside their targets.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
CASES = 24
FLIPS_CASES = 100
"""Enough cases that the two grown runs disagree (every 97th and every 89th case no_match)."""


def test_the_bench_runs_and_reports_every_row() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, str(BENCH / "throughput.py"), "--cases", str(CASES)]
        + ["--latency", "0.01", "--concurrency", "8", "--workers", "1", "--serial-cases", "4"]
        + ["--collect-cases", str(FLIPS_CASES), "--repeat", "1"]
        + ["--no-inspect", "--no-n4", "--no-rpm"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rows = {
        match.group(1).strip(): match.groups()[1:]
        for match in re.finditer(
            r"^(\S.*?)\s+(\d+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+\d+",
            done.stdout,
            re.M,
        )
    }
    calls = str(6 * CASES)
    assert rows == {
        "evalloop": (str(CASES), calls),
        "floor (SDKs alone)": (str(CASES), calls),
        "evalloop, report off": (str(CASES), calls),
        "evalloop-small": (str(CASES // 5), str(6 * (CASES // 5))),
        "evalloop, 1 in 16 slow": (str(CASES), calls),
        "floor, 1 in 16 slow": (str(CASES), calls),
        "serial": ("4", "24"),
    }
    for figure in (
        "ours over the floor",
        "marginal (startup excluded)",
        "RSS growth",
        "uneven latency: ours / the floor",
    ):
        assert figure in done.stdout
    assert re.search(rf"collect\s+[\d.]+ s \({FLIPS_CASES} cases", done.stdout)
    assert re.search(rf"evalloop flips\s+[\d.]+ s \(2 x {FLIPS_CASES} cases", done.stdout)


@pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="bench/malloy.py needs node and npm on PATH (install Node.js 20+)",
)
def test_the_malloy_bench_runs_its_calls() -> None:
    # Its calls failed at once (the set's tables were never generated) and it timed the error
    # replies; it now stops on an error reply, so a run that prints figures made real calls.
    done = subprocess.run(
        [sys.executable, str(BENCH / "malloy.py"), "--calls", "3"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    figures = json.loads(done.stdout)
    assert figures["calls"] == 3
    assert figures["execute_query_ms"]["median"] > 0
    assert figures["server_rss_mb"]
