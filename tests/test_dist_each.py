"""`--dist each` runs every test in every xdist worker: for eval cases, every attempt once per
worker in one run, paid as often, and a ledger that fails validation. It is refused before
anything is answered, whether the set is named or found under a folder walked."""

from __future__ import annotations

import pytest

from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import QIDS, make_set, spec


@pytest.mark.parametrize("walked", [False, True], ids=["named", "walked"])
def test_dist_each_is_refused_before_any_case_is_answered(
    pytester: pytest.Pytester, fake: FakeAnthropic, walked: bool
) -> None:
    set_dir = make_set(pytester.path, QIDS[:2])
    fake.policy = spec(set_dir).policy()
    where = str(pytester.path / "evals") if walked else str(set_dir)
    result = pytester.runpytest_subprocess(
        where, "-p", "no:cacheprovider", "-n", "2", "--dist", "each"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["ERROR: --dist each runs every case in every xdist worker*"])
    assert fake.calls() == []
    assert not (set_dir / "runs").exists()


def test_dist_each_still_runs_plain_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "each")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["*2 passed*"])


def test_dist_each_only_lists_cases_under_collect_only(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = make_set(pytester.path, QIDS[:2])
    result = pytester.runpytest_subprocess(
        str(set_dir), "-p", "no:cacheprovider", "-n", "2", "--dist", "each", "--collect-only"
    )
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    assert fake.calls() == [] and not (set_dir / "runs").exists()
