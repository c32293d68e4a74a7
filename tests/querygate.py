"""A gate the test opens: a query that is in flight until the test says it may finish.

The query process defines `evalloop_test_gate(name)` when TEST_GATE_ENV names a directory
(`targets/embedded/query_child._TestGate`). A test runs `SELECT evalloop_test_gate('g') AS n`, waits
for the `started` file that proves the query is running in a known process, does what it
tests (kill that process, close the target, cancel the caller), and then opens the gate or
leaves it shut for a query that never finishes. Nothing here depends on how fast the machine
is: every wait is for an event, and its ceiling is only how long to wait before calling the
test failed.
"""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

import pytest

from pytest_evalloop.targets.embedded.query_limits import TEST_GATE_ENV

# Only how long a wait for an event may take before the test fails: never a race.
EVENT_CEILING_S = 120.0


class QueryGate:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @staticmethod
    def sql(name: str = "g") -> str:
        return f"SELECT evalloop_test_gate('{name}') AS n"

    def started_pids(self, name: str = "g") -> set[int]:
        return {int(p.name.split(".")[1]) for p in self.directory.glob(f"{name}.*.started")}

    def wait_started(self, name: str = "g", *, count: int = 1) -> set[int]:
        """The pids of the query processes running gate `name`, once `count` have started."""
        end = time.monotonic() + EVENT_CEILING_S
        while len(pids := self.started_pids(name)) < count:
            if time.monotonic() > end:
                raise AssertionError(f"gate {name!r}: {len(pids)} of {count} queries started")
            time.sleep(0.01)
        return pids

    def open(self, name: str = "g") -> None:
        (self.directory / f"{name}.open").touch()


def wait_exited(pid: int) -> None:
    """Return once process `pid` has ended (a SIGKILL is delivered asynchronously).

    A pidfd turns readable when its process exits, reaped or not: the wait is for that event.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # already gone and reaped
    try:
        ready, _, _ = select.select([fd], [], [], EVENT_CEILING_S)
    finally:
        os.close(fd)
    if not ready:
        raise AssertionError(f"process {pid} was still running {EVENT_CEILING_S} s after its kill")


@pytest.fixture
def query_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> QueryGate:
    directory = tmp_path / "query-gate"
    directory.mkdir()
    monkeypatch.setenv(TEST_GATE_ENV, str(directory))
    return QueryGate(directory)
