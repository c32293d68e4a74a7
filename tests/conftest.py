"""Shared fixtures of pytest-evalloop's own suite."""

from __future__ import annotations

import gc
import os
import shutil
import signal
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

# In-process pytester runs restore sys.modules afterwards, and native extensions (duckdb, numpy,
# cryptography under mcp) cannot be imported twice in one process: tests that run items against
# a target use `runpytest_subprocess` (see tests/test_run.py). The report's chart engine is one
# such extension too, but it is only ever imported in its own chart process (charts._ChartProcess).
from pytest_evalloop.targets.malloy import install as malloy_install
from pytest_evalloop.testing import FakeAnthropic
from tests import forkserver
from tests.forkserver import OFF_ENV, ForkServer
from tests.querygate import query_gate  # noqa: F401  (a fixture, offered to every test)

# pytester points HOME at a temporary folder; keep the generated example data in one cache for
# the whole suite (and its subprocesses) instead of regenerating it per test.
os.environ.setdefault("EVALLOOP_CACHE_DIR", str(Path.home() / ".cache" / "pytest-evalloop"))
# The same for the malloy target's npm tree: under pytester's HOME, every child run that starts
# the real compiler reinstalled it from the registry (`npm ci`, then `npm install`: ~13 s of CPU
# each, three times a suite) and started with an empty package-check cache beside it.
os.environ.setdefault("EVALLOOP_MALLOY_SERVER_DIR", str(malloy_install.install_root()))

# pytest-randomly shuffles this suite (its seed is printed in the header; `--randomly-seed=<seed>`
# replays it). The pytest runs a test starts keep the order they were written in: tests assert
# on it (`-x`, the order of a run's lines). Those runs hold no Hypothesis test, and its plugin
# imports the whole library when a session ends (measured: 1-2 s of CPU per child run without
# bytecode), so they run without it.
NO_SHUFFLE = "-p no:randomly -p no:hypothesispytest"
NO_SUGAR = "-p no:sugar"
"""pytest-sugar (installed for tests/test_other_plugins.py) would replace the reporter of every
child run on a terminal (tests/test_progress.py's pty); the tests that want it take it out."""
CHILD_ADDOPTS = f"{NO_SHUFFLE} {NO_SUGAR} --eval-report-charts=off"
"""What every pytest run a test starts gets: also no charts (the chart process, a Python start
and the report's imports, is ~0.2 s of CPU per run, and the suite starts hundreds of runs); the
report's own tests (tests/reportruns.py) draw them."""

# The suite starts hundreds of Python processes (child pytest runs, query hosts, MCP servers);
# with PYTHONDONTWRITEBYTECODE set (some machines set it globally) each one recompiles and
# re-rewrites every module it imports: 2 s of CPU before a child run collects its first case.
# The suite's processes write and share bytecode caches (CPython and pytest both write them
# atomically), so a process started after this point imports from them.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# A shell without job control starts a background command (`make test &`) with SIGINT ignored,
# and every process it starts inherits that: the Ctrl-C tests' signals then did nothing (one
# waited out its bound, four failed). Python's own handler again, as from a terminal; this
# process's children get the default action, as they would from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MALLOY_SET = SHARED / "reference" / "malloy-samples" / "evals" / "ecommerce"
EXAMPLE_SET = REPO / "evals" / "ecommerce"
SECRET = "test-key-SECRET-4f9a"
"""The API key the fake endpoint sees (tests check it never lands in a run directory)."""


@pytest.fixture(params=[[], ["-n", "0"], ["-n", "2"]], ids=["plain", "n0", "n2"])
def plugin_args(request: pytest.FixtureRequest) -> list[str]:
    """Run an end-to-end test plain, under `-n 0` and under `-n 2`."""
    return list(request.param)


@pytest.fixture(scope="session", autouse=True)
def _child_runs_options() -> Iterator[None]:
    """Each test process: the pytest runs its tests start get CHILD_ADDOPTS. Set here, not
    when this file is imported: xdist starts its workers after that, and they would inherit
    `-p no:randomly` and run this suite unshuffled."""
    before = os.environ.get("PYTEST_ADDOPTS")
    os.environ["PYTEST_ADDOPTS"] = CHILD_ADDOPTS
    yield
    if before is None:
        os.environ.pop("PYTEST_ADDOPTS", None)
    else:
        os.environ["PYTEST_ADDOPTS"] = before


@pytest.fixture(scope="session", autouse=True)
def fork_server(
    _child_runs_options: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ForkServer | None]:
    """This test process's warm interpreter for child pytest runs (tests/forkserver.py), or
    None when EVALLOOP_TEST_FORKSERVER=0 or it could not start (runs then start cold)."""
    if os.environ.get(OFF_ENV) == "0":
        yield None
        return
    server = ForkServer(tmp_path_factory.mktemp("forkserver"), os.environ)
    if not server.ready:
        server.close()
        sys.stderr.write(f"the fork server did not start (see {server.log}): runs start cold\n")
        yield None
        return
    forkserver.current = server
    yield server
    forkserver.current = None
    server.close()


@pytest.fixture
def pytester(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    fork_server: ForkServer | None,
    request: pytest.FixtureRequest,
) -> pytest.Pytester:
    """pytester, with CHILD_ADDOPTS again (it clears PYTEST_ADDOPTS when it starts), whose
    `runpytest_subprocess` forks its run from the fork server."""
    monkeypatch.setenv("PYTEST_ADDOPTS", CHILD_ADDOPTS)
    if fork_server is not None and request.node.get_closest_marker("cold_start") is None:
        monkeypatch.setattr(pytester, "popen", _forked_popen(pytester, fork_server))
    return pytester


@pytest.fixture(autouse=True)
def _fake_claude_forks(
    monkeypatch: pytest.MonkeyPatch, fork_server: ForkServer | None, request: pytest.FixtureRequest
) -> None:
    """A fake `claude` shim installed during a test runs warm: the CLI and the Python MCP
    servers it starts fork from the fork server (tests/forkserver.py `fake_claude_command`).
    A `cold_start` test gets the real processes: a timeout's kill of the CLI's process group
    reaches them only then."""
    from pytest_evalloop.testing.fake_claude import PYTHON_ENV

    if fork_server is not None and request.node.get_closest_marker("cold_start") is None:
        monkeypatch.setenv(PYTHON_ENV, forkserver.fake_claude_command(fork_server))
    else:
        monkeypatch.delenv(PYTHON_ENV, raising=False)


def _forked_popen(pytester: pytest.Pytester, server: ForkServer) -> Any:
    cold = pytester.popen

    def popen(
        cmdargs: Any, stdout: Any = None, stderr: Any = None, stdin: Any = None, **kw: Any
    ) -> Any:
        argv = [os.fspath(a) for a in cmdargs]
        # Only what runpytest_subprocess starts: `python -mpytest ...` into pytester's files.
        forkable = (
            argv[:2] == [sys.executable, "-mpytest"]
            and stdin is pytester.CLOSE_STDIN
            and not kw
            and hasattr(stdout, "fileno")
            and hasattr(stderr, "fileno")
        )
        if not forkable:
            return cold(cmdargs, stdout=stdout, stderr=stderr, stdin=stdin, **kw)
        env = os.environ.copy()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
        return server.spawn(
            argv[2:], cwd=os.getcwd(), env=env, stdout=stdout.fileno(), stderr=stderr.fileno()
        )

    return popen


@pytest.fixture
def malloy_set(tmp_path: Path) -> Path:
    """A private copy of the real malloy-samples eval set (49 cases), safe to corrupt."""
    if not MALLOY_SET.is_dir():
        pytest.fail(
            f"the reference set is missing at {MALLOY_SET}; shared/ must sit beside the repo"
        )
    target = tmp_path / "evals" / "ecommerce"
    shutil.copytree(MALLOY_SET, target)
    return target


# Test modules that build their own `AsyncAnthropic` clients on short-lived loops.
_SDK_CLIENT_MODULES = {
    "test_answerer",
    "test_diagnose_agent",
    "test_fake_anthropic",
    "test_judge",
    "test_ratelimit",
    "test_skills_anthropic",
    "test_skills_run",
}


@pytest.fixture(autouse=True)
def _dispose_sdk_clients(request: pytest.FixtureRequest) -> Iterator[None]:
    """Collect a test's leftover SDK clients while no event loop runs.

    An unclosed `AsyncAnthropic` schedules its own close on whatever loop is running when it
    is garbage-collected; collected later, inside another test's loop, that close touches
    sockets of a loop that is gone ("Event loop is closed"). Collected here, it does nothing.
    An anyio test runs with the collector paused, whatever module left a client: anyio's
    runner raises what a task scheduled on its loop raised, and a client collected there
    failed a test that never made one. (A full collection before each would cost 0.13 s a
    test; the pause costs nothing, and the test's own cycles wait until it ends.)
    """
    paused = request.node.get_closest_marker("anyio") is not None and gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()
    if request.module.__name__.rsplit(".", 1)[-1] in _SDK_CLIENT_MODULES:
        gc.collect()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    """A loopback fake of the Messages API, with the SDK's environment pointed at it."""
    with FakeAnthropic() as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
        yield server


# The tests that drive a real component, and what enables them when they skip.
REAL_COMPONENTS = {
    "tests/test_claude_code_real.py": "the pinned claude CLI",
    "tests/test_report.py": "a headless chromium",
}


# Modules whose module-scoped fixture makes real runs or starts servers (tens of seconds): each
# goes to one xdist worker as one unit, so its fixture runs once instead of once per worker
# (test_merge's five runs took 42 s on each of the two). xdist's own `--dist loadgroup` cannot
# do it on pytest 9 (it renames items through `_nodeid`, which pytest 9 no longer reads).
ONE_WORKER_MODULES = frozenset(
    {
        "test_diagnose_agent.py",
        "test_first_contact.py",
        "test_gate.py",
        "test_improve.py",
        "test_improve_malloy.py",
        "test_malloy_target.py",
        "test_merge.py",
        "test_other_plugins.py",
        "test_report.py",
        "test_sandbox.py",
        "test_view.py",
    }
)


@pytest.hookimpl(wrapper=True)  # around the plugin's own, which deals eval case items
def pytest_xdist_make_scheduler(
    config: pytest.Config, log: object
) -> Generator[None, object, object]:
    """Controller: `--dist load` for this suite, each of ONE_WORKER_MODULES one unit of work."""
    chosen = yield
    if config.getvalue("dist") != "load":
        return chosen
    from xdist.scheduler import LoadScopeScheduling

    class ModuleUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if Path(module).name in ONE_WORKER_MODULES else nodeid

    return ModuleUnits(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Each test process: the suite's own marker."""
    config.addinivalue_line(
        "markers",
        "cold_start: this test's child pytest runs and fake claude CLI start a fresh interpreter",
    )


HANG_GUARD_S = 300
"""No test waits on the clock, so none comes near this: it is only the line past which a hang is
reported as one (pytest-timeout, with every thread's stack) and the run goes on. The slowest
test takes ~40 s. A marker on this suite's tests rather than `timeout` in pyproject.toml, which
would apply to every run started in the checkout (`make eval` included)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test process: the hang guard on every test without a timeout of its own (unless
    the command line or PYTEST_TIMEOUT sets one)."""
    if config.getoption("timeout", None) is not None or os.environ.get("PYTEST_TIMEOUT"):
        return
    guard = pytest.mark.timeout(HANG_GUARD_S)
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(guard)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Controller: one closing line naming the real-component tests that skipped, so a run
    that is smaller than CI's says so, with the command that makes it whole."""
    skipped: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        path = str(getattr(report, "nodeid", "")).split("::", 1)[0]
        if path in REAL_COMPONENTS:
            skipped[path] = skipped.get(path, 0) + 1
    if skipped:
        named = "; ".join(
            f"{path} ({count}, needs {REAL_COMPONENTS[path]})" for path, count in skipped.items()
        )
        terminalreporter.write_line(
            f"real-component tests skipped: {named}; enable them with `make real-components`",
            yellow=True,
        )
    seed = getattr(terminalreporter.config.option, "randomly_seed", None)
    if isinstance(seed, int):  # pytest-randomly's header line is hidden under -q
        terminalreporter.write_line(f"random order: replay it with --randomly-seed={seed}")
