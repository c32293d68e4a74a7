"""pytest's flags that run no test answer no case: an attempt runs in a fixture's setup
(`evalloop_runtime`), so `--setup-only`, which sets every fixture up and shows it, used to
answer and pay for every case it listed, and record a complete run of it."""

from __future__ import annotations

import pytest

from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import QIDS, make_set, spec


@pytest.mark.parametrize("flag", ["--setup-only", "--setup-plan"])
def test_a_session_that_runs_no_test_answers_no_case_and_opens_no_run(
    pytester: pytest.Pytester, fake: FakeAnthropic, plugin_args: list[str], flag: str
) -> None:
    set_dir = make_set(pytester.path, QIDS[:2])
    fake.policy = spec(set_dir).policy()
    result = pytester.runpytest_subprocess(
        str(set_dir), "-p", "no:cacheprovider", flag, *plugin_args
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    out = result.stdout.str()
    if "-n" not in plugin_args:  # (xdist's controller shows no worker's fixtures)
        # pytest shows the fixtures it set up (or would), the attempt's among them...
        assert "evalloop_runtime" in out, out
    # ...and nothing was asked of the endpoint, no run opened, no summary or progress written.
    assert fake.calls() == []
    assert not (set_dir / "runs").exists()
    assert "evalloop:" not in out and "verdicts:" not in out, out


def test_a_gate_asked_of_setup_only_is_refused(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = make_set(pytester.path, QIDS[:1])
    fake.policy = spec(set_dir).policy()
    result = pytester.runpytest_subprocess(
        str(set_dir), "-p", "no:cacheprovider", "--setup-only", "--eval-gate=bar"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--setup-only answers no case*"])
    assert fake.calls() == []
