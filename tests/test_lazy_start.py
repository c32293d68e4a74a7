"""A session that names no set pays for none of the eval machinery, and one that finds a set
only while collecting still runs it whole.

The runtime (the pipeline, the judge and their pydantic models) is made at configure when the
command line asks for an eval, and otherwise on first need: when collection finds a case.
"""

from __future__ import annotations

import json
import sys

import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import seal
from pytest_evalloop.measure.gate import EXIT_RUN_UNFINISHED
from pytest_evalloop.testing import FakeAnthropic
from tests.test_gate import QIDS, script
from tests.test_run import make_set

# What a project's own test session must not import with the plugin loaded: the eval
# machinery (the runtime, the pipeline, the judge, the ledger's models) and what it stands on.
HEAVY = (
    "pydantic",
    "pytest_evalloop.runtime",
    "pytest_evalloop.answer.pipeline",
    "pytest_evalloop.judge.judge",
    "pytest_evalloop.ledger.contract",
    "pytest_evalloop.sets.cases",
    "anthropic",
    "mcp",
)

RECORDER = """
import json, sys

def pytest_unconfigure(config):
    with open({out!r}, "w") as handle:
        json.dump(sorted(sys.modules), handle)
"""


@pytest.mark.cold_start  # a fresh interpreter: the suite's fork server has loaded everything
@pytest.mark.parametrize(
    "args",
    [[], ["--collect-only"], ["-n", "2"], ["--eval-report=off", "-x"], ["-o", "eval_label=mine"]],
    ids=["plain", "collect-only", "n2", "flags", "ini-label"],
)
def test_a_session_that_names_no_set_imports_none_of_the_eval_machinery(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    # Only the plugins an install of pytest-evalloop brings: the suite's own (hypothesis,
    # pytest-html, ...) import pydantic themselves.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    modules = pytester.path / "modules.json"
    pytester.makeconftest(RECORDER.format(out=str(modules)))
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")
    plugins = ["-p", "evalloop", "-p", "xdist", "-p", "syrupy", "-p", "anyio"]
    result = pytester.runpytest_subprocess(*plugins, "-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    loaded = set(json.loads(modules.read_text()))
    assert "pytest_evalloop.plugin" in loaded  # the recorder saw the plugin's session
    assert sorted(m for m in HEAVY if m in loaded) == []


def test_a_set_found_by_walking_a_folder_still_runs_whole(
    pytester: pytest.Pytester, fake: FakeAnthropic, plugin_args: list[str]
) -> None:
    shop = make_set(pytester.path, QIDS)
    fake.policy = script(shop, {QIDS[1]}).policy()
    result = _walk_evals(pytester, plugin_args)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    assert result.parseoutcomes()["passed"] == len(QIDS) - 1
    (run_dir,) = [p.parent for p in (shop / "runs").glob("*/run.json")]
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    assert read.info is not None and read.info.status == "complete"
    check = seal.verify(run_dir)
    assert check.sealed and check.errors == []  # closed and sealed by this session
    assert f"evalloop: {read.info.label or run_dir.name}" in result.stdout.str()


INTERRUPTED = """
import signal, sys
import pytest

code = pytest.main(sys.argv[1:])
# Python's own handler again: a later Ctrl-C in this program raises KeyboardInterrupt.
print("exit", int(code), "default" if signal.getsignal(signal.SIGINT) is signal.default_int_handler else "taken")
"""


@pytest.mark.parametrize("with_set", [False, True], ids=["plain", "eval"])
def test_ctrl_c_is_pythons_again_when_a_session_ends(
    pytester: pytest.Pytester, fake: FakeAnthropic, with_set: bool
) -> None:
    # A Ctrl-C (a KeyboardInterrupt out of a test) in a session run by `pytest.main()`, as an
    # IDE or a script runs it: once it returns, SIGINT has Python's default handler back, and
    # a plain session never took it.
    args = ["-p", "no:cacheprovider", "-p", "evalloop", "-q"]
    if with_set:
        shop = make_set(pytester.path, QIDS[:2])
        fake.policy = script(shop, set()).policy()
        args.append(str(shop))
    pytester.makepyfile(test_stop="def test_stop():\n    raise KeyboardInterrupt\n")
    args.append("test_stop.py")
    script_file = pytester.makepyfile(run_main=INTERRUPTED)
    result = pytester.run(sys.executable, str(script_file), *args)
    # An interrupted run exits 8 (it did not finish), a plain session pytest's 2.
    code = EXIT_RUN_UNFINISHED if with_set else int(pytest.ExitCode.INTERRUPTED)
    assert f"exit {code} default" in result.stdout.str(), result.stdout.str() + result.stderr.str()


@pytest.fixture
def no_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def _walk_evals(pytester: pytest.Pytester, plugin_args: list[str]) -> pytest.RunResult:
    """pytest given the folder above the set: nothing at configure says it is an eval."""
    return pytester.runpytest_subprocess(
        str(pytester.path / "evals"), "-p", "no:cacheprovider", *plugin_args
    )


@pytest.mark.parametrize("plugin_args", [[], ["-n", "0"]], ids=["plain", "n0"])
def test_a_set_found_by_walking_a_folder_without_a_key_is_one_usage_error(
    pytester: pytest.Pytester, no_endpoint: None, plugin_args: list[str]
) -> None:
    # What naming the set says at configure, said once collection found it: exit 4, one
    # message naming what to set, nothing answered, no run directory, no traceback. (Not under
    # xdist: its controller loads no conftest beside a set, where the roles may be brought.)
    shop = make_set(pytester.path, QIDS[:3])
    result = _walk_evals(pytester, plugin_args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert out.count("ERROR: no Anthropic endpoint configured: set ANTHROPIC_API_KEY") == 1, out
    assert "-m 'not evalloop' runs the other tests without them" in out
    assert "Traceback" not in out and "UsageError" not in out
    assert not (shop / "runs").exists()


def test_roles_a_conftest_brings_need_no_key_when_the_set_is_found_by_walking(
    pytester: pytest.Pytester, no_endpoint: None, plugin_args: list[str]
) -> None:
    # The documented layout (conftest_examples/README.md): no key, no base URL, the roles in
    # conftests beside the set or the folder above it, which only collection loads.
    from tests.test_examples import use_example

    shop = make_set(pytester.path, QIDS[:2])
    use_example("own_answerer", shop.parent)
    use_example("own_judge", shop)
    result = _walk_evals(pytester, plugin_args)
    out = result.stdout.str()
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), out
    assert "no Anthropic endpoint configured" not in out + result.stderr.str()
    (run_dir,) = [p.parent for p in (shop / "runs").glob("*/run.json")]
    info = ledger_reader.read_run(run_dir).info
    assert info is not None and info.status == "complete"
    assert info.answerer == "measure-lookup"
