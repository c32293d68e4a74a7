"""Running things for the benchmark: the fake endpoint, and measured child processes.

A measured child is reaped with ``os.wait4``, which returns the resource use of that child and
of every descendant it reaped (xdist workers): CPU seconds and peak RSS of that one run only.
The fake endpoint is another child of the bench, never reaped until the end, so its own CPU
never counts in a measured run's figures.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_evalloop.testing import URL_LINE_PREFIX, FakeAnthropicProcess

BENCH_DIR = Path(__file__).resolve().parent
PYTHON = sys.executable


@dataclass(frozen=True)
class Measured:
    """What one child run cost: wall seconds, CPU seconds, peak RSS (MB), exit status."""

    wall: float
    user: float
    system: float
    max_rss_mb: float
    returncode: int
    output: str

    @property
    def cpu(self) -> float:
        """User plus system CPU seconds of the child and its reaped descendants."""
        return self.user + self.system

    def tail(self, lines: int = 15) -> str:
        """The last lines of the child's combined output (for error messages)."""
        return "\n".join(self.output.rstrip().splitlines()[-lines:])


def measure(cmd: Sequence[str], env: Mapping[str, str], cwd: Path, timeout: float) -> Measured:
    """Run `cmd` to completion and measure it; output goes to a temp file, never a full pipe."""
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(
            list(cmd), cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT
        )
        status, usage = _wait4(proc, timeout)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    return Measured(
        wall=wall,
        user=usage.ru_utime,
        system=usage.ru_stime,
        max_rss_mb=usage.ru_maxrss / 1024.0,  # Linux reports kilobytes
        returncode=proc.returncode,
        output=text,
    )


def _wait4(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, resource.struct_rusage]:
    # wait4 blocks; a timer kills a child that overruns so the bench cannot hang forever.
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    return status, usage


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a live process has used so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def start_fake(
    policy_env: Mapping[str, str], startup_timeout: float = 30.0
) -> FakeAnthropicProcess:
    """Start the fake endpoint with `bench_policy:BenchPolicy`, configured by `policy_env`."""
    env = {**os.environ, **policy_env}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH")) if p)
    cmd = [
        PYTHON,
        "-m",
        "pytest_evalloop.testing.fake_anthropic",
        "--policy",
        os.environ.get("BENCH_POLICY_REF", "bench_policy:BenchPolicy"),
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    # readline blocks until the fake prints its line or exits; the timer ends a silent hang.
    timer = threading.Timer(startup_timeout, proc.kill)
    timer.start()
    try:
        line = proc.stdout.readline()
    finally:
        timer.cancel()
    if not line.startswith(URL_LINE_PREFIX):
        proc.kill()
        proc.wait(timeout=5)
        raise RuntimeError(
            f"the fake endpoint ({' '.join(cmd)}) did not print {URL_LINE_PREFIX}...; it said "
            f"{line!r}; run the command by hand with BENCH_SPEC set to see why"
        )
    return FakeAnthropicProcess(proc, line[len(URL_LINE_PREFIX) :].strip())
