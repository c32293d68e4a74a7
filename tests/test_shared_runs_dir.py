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
