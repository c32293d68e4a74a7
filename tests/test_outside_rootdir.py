"""A set outside pytest's rootdir, under xdist: the controller learns the selection from the
workers' node ids, which name such a file relative to the path it was found under
(`cases.jsonl::q`), not to the rootdir. Read from the rootdir, that was no set: an
INTERNALERROR before anything ran."""

from __future__ import annotations

import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import QIDS, make_set, spec


def test_a_set_outside_the_rootdir_runs_under_xdist(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop = make_set(pytester.path / "elsewhere", QIDS[:2])
    fake.policy = spec(shop).policy()
    root = pytester.mkdir("project")
    result = pytester.runpytest_subprocess(
        str(shop), "-p", "no:cacheprovider", "-n", "2", f"--rootdir={root}", "--eval-label=out"
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*2 passed*"])
    read = ledger_reader.read_run(shop / "runs" / "out")
    assert read.errors == [] and read.info is not None and read.info.status == "complete"
