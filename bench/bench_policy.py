"""The fake endpoint's policy for the benchmark: the workload's script, plus what a bench needs.

Loaded by ``python -m pytest_evalloop.testing.fake_anthropic --policy bench_policy:BenchPolicy``
with ``bench/`` on ``PYTHONPATH``. Configured by environment variables, because the fake builds
the policy without arguments:

- ``BENCH_SPEC``: the ScriptSpec JSON file to play (required);
- ``BENCH_STAMPS``: a file that gets one line per request, ``<monotonic seconds> <status>``,
  so the bench can measure the achieved request rate and see bursts of 429s;
- ``BENCH_RPM_LIMIT``: enforce a requests-per-minute limit like a real endpoint (a token bucket
  holding ``BENCH_RPM_BURST`` requests, default 1): a request over it gets a 429 with
  ``retry-after``, so a client-side limiter that lets bursts through is seen failing;
- ``BENCH_KEEP_NAGLE=1``: leave the fake's sockets as they are (see :func:`disable_nagle`);
- ``BENCH_GRADER=inspect``: a request offering no tools and not carrying our judge doctrine is
  inspect-ai's model-graded scorer; it gets a ``GRADE: C`` reply with the answerer's latency.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest_evalloop.testing.fake_anthropic as fake_module
from pytest_evalloop.testing import FakeRequest, Fault, Outcome, Reply, ScriptSpec


class RateBucket:
    """A token bucket refilled at `rpm / 60` per second, holding at most `burst` tokens."""

    def __init__(self, rpm: float, burst: float = 1.0) -> None:
        self.rate = rpm / 60.0
        self.burst = burst
        self.tokens = burst
        self.stamp = time.monotonic()

    def take(self) -> float:
        """Take one token: 0.0 when granted, else the seconds until one will be available."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


def disable_nagle() -> bool:
    """Make the fake's replies leave at once; True when this changed anything.

    The fake's handler writes a reply's headers and body in two sends on a keep-alive
    connection; with Nagle's algorithm on, the body waits for the client's delayed ACK, about
    40 ms per call on Linux. A bench must add exactly the configured latency, so the serving
    process turns TCP_NODELAY on (a no-op once the fake does it itself).
    """
    module = sys.modules.get("__main__")
    handler = getattr(module, "_Handler", None) or getattr(fake_module, "_Handler", None)
    if handler is None or getattr(handler, "disable_nagle_algorithm", True):
        return False
    handler.disable_nagle_algorithm = True
    return True


class BenchPolicy:
    """Plays the workload's ScriptSpec; stamps requests; optionally limits rate and grades."""

    def __init__(self) -> None:
        if os.environ.get("BENCH_KEEP_NAGLE") != "1":
            disable_nagle()
        spec_path = os.environ.get("BENCH_SPEC")
        if not spec_path:
            raise SystemExit("bench_policy: set BENCH_SPEC to the ScriptSpec JSON file to play")
        self.spec = ScriptSpec.load(Path(spec_path))
        self.script = self.spec.policy()
        rpm = float(os.environ.get("BENCH_RPM_LIMIT") or 0)
        burst = float(os.environ.get("BENCH_RPM_BURST") or 1)
        self.bucket = RateBucket(rpm, burst) if rpm > 0 else None
        self.grader = os.environ.get("BENCH_GRADER") == "inspect"
        stamps = os.environ.get("BENCH_STAMPS")
        self._stamps: IO[str] | None = open(stamps, "a", buffering=1) if stamps else None  # noqa: SIM115
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Rewind the script (the fake's `POST /_fake/reset`)."""
        self.script.reset()

    def __call__(self, request: FakeRequest) -> Outcome:
        outcome = self._decide(request)
        if self._stamps is not None:
            status = outcome.status if isinstance(outcome, Fault) else 200
            with self._lock:
                self._stamps.write(f"{time.monotonic():.6f} {status}\n")
        return outcome

    def _decide(self, request: FakeRequest) -> Outcome:
        if self.bucket is not None:
            with self._lock:
                wait = self.bucket.take()
            if wait > 0:
                return Fault(status=429, retry_after=round(wait, 3), message="bench rate limit")
        if self.grader and not request.tools and request.role != "judge":
            latency = self.spec.latency
            return Reply(text="The submission matches the criterion.\n\nGRADE: C", latency=latency)
        outcome = self.script(request)
        return Reply(text=outcome) if isinstance(outcome, str) else outcome
