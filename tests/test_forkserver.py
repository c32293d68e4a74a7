"""The suite's fork server (tests/forkserver.py) gives a child run what a cold start gives it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forkserver

PROBE = """
import os, sys, tempfile

def pytest_sessionstart(session):
    print("SEEN", "cwd", os.getcwd())
    print("SEEN", "tmp", tempfile.gettempdir())
    print("SEEN", "var", os.environ.get("EVALLOOP_FORK_PROBE"))
    print("SEEN", "path0", sys.path[0])
    print("SEEN", "stdin", repr(sys.stdin.read()))
    # Not PYTEST_XDIST_WORKER: under xdist, this suite's own worker's value is inherited.
    workerinput = getattr(session.config, "workerinput", None)
    worker = workerinput["workerid"] if workerinput else "controller"
    print("SEEN", "worker", worker)
    # Imported before any session: a fork. Written to a file (a worker's stdout is execnet's).
    with open(os.path.join(str(session.config.rootpath), "warm." + worker), "w") as f:
        f.write(str("anthropic" in sys.modules))
"""


def _seen(lines: list[str]) -> list[str]:
    return sorted(line for line in lines if line.startswith("SEEN"))


def test_a_forked_run_sees_what_a_cold_run_sees(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert forkserver.current is not None, "the fork server did not start"
    pytester.makeconftest(PROBE)
    pytester.makepyfile(test_one="def test_one():\n    assert True\n")
    own_tmp = tmp_path / "own-tmp"
    own_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(own_tmp))
    monkeypatch.setenv("EVALLOOP_FORK_PROBE", "this test's value")
    forked = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    forked.assert_outcomes(passed=1)
    assert (pytester.path / "warm.controller").read_text() == "True"
    env = {**os.environ, "PYTHONPATH": str(pytester.path)}
    cold = subprocess.run(
        [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider"],
        cwd=pytester.path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cold.returncode == 0, cold.stdout
    assert _seen(forked.outlines) == _seen(cold.stdout.splitlines())
    assert f"SEEN tmp {own_tmp}" in forked.outlines  # not the server's cached $TMPDIR
    assert (pytester.path / "warm.controller").read_text() == "False"  # the cold run's, last


def test_a_forked_runs_workers_are_forks_and_report_back(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(PROBE)
    pytester.makepyfile(
        test_many="import pytest\n\n@pytest.mark.parametrize('n', range(4))\n"
        "def test_n(n):\n    assert n != 3\n"
    )
    result = pytester.runpytest_subprocess("-s", "-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1)  # a failure in a forked worker comes back
    warm = {p.name: p.read_text() for p in pytester.path.glob("warm.*")}
    assert warm == {"warm.controller": "True", "warm.gw0": "True", "warm.gw1": "True"}


def test_a_timeout_kills_the_forked_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_hang="import time\n\ndef test_hang():\n    time.sleep(3600)\n")
    with pytest.raises(pytester.TimeoutExpired):
        # The run sleeps an hour: only the timeout can end it, on any machine.
        pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=5)
