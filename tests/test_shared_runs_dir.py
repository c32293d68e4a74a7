"""Sets (and skill catalogs) that share one `--eval-runs-dir` in one session: each keeps its
own run. Every process of a session finds its run by the session's id and the set's folder
(`runs._find_session_run`); by the id alone, the first set's run took them all."""

from __future__ import annotations

import pytest

from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import QIDS, make_set, spec


def test_sets_sharing_one_runs_folder_keep_a_run_each(
    pytester: pytest.Pytester, fake: FakeAnthropic, plugin_args: list[str]
) -> None:
    # Runs were found by session id alone: the second set took the first set's run, which
    # then held every attempt of both (and validated), and the second had no run at all.
    import shutil

    from pytest_evalloop.ledger import reader as ledger_reader

    shop = make_set(pytester.path, QIDS[:2])
    other = shop.parent / "shop2"
    shutil.copytree(shop, other)
    fake.policy = spec(shop).policy()  # the oracle answers by question: both sets alike
    shared = pytester.path / "shared"
    result = pytester.runpytest_subprocess(
        str(shop.parent), "-p", "no:cacheprovider", f"--eval-runs-dir={shared}", *plugin_args
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    runs = sorted(p for p in shared.iterdir() if p.is_dir())
    assert len(runs) == 2, runs
    by_set = {}
    for run_dir in runs:
        read = ledger_reader.read_run(run_dir)
        assert read.errors == [], [str(f) for f in read.errors]
        assert read.info is not None and read.info.status == "complete"
        by_set[read.info.set_dir] = len(read.scores())
    assert by_set == {str(shop.resolve()): 2, str(other.resolve()): 2}


@pytest.mark.parametrize("runs_dir", [False, True], ids=["beside", "shared"])
def test_a_set_named_twice_through_a_link_answers_each_case_once(
    pytester: pytest.Pytester, fake: FakeAnthropic, plugin_args: list[str], runs_dir: bool
) -> None:
    # pytest collects a file once per path it is named by: both copies went into the set's one
    # run, every case answered twice, the run invalid, and the session still exited 0.
    from pytest_evalloop.ledger import reader as ledger_reader

    shop = make_set(pytester.path, QIDS[:2])
    link = shop.parent / "lnk"
    link.symlink_to(shop)
    fake.policy = spec(shop).policy()
    shared = pytester.path / "shared"
    extra = [f"--eval-runs-dir={shared}"] if runs_dir else []
    result = pytester.runpytest_subprocess(
        str(shop), str(link), "-p", "no:cacheprovider", "--eval-label=once", *extra, *plugin_args
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["*2 passed*"])  # (xdist shows no worker's deselected)
    assert len(fake.calls("judge")) == 2
    read = ledger_reader.read_run((shared if runs_dir else shop / "runs") / "once")
    assert read.errors == [], [str(f) for f in read.errors]
    assert read.info is not None and read.info.status == "complete"
    assert len(read.scores()) == 2
