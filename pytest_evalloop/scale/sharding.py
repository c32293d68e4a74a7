"""How case items are spread over xdist workers so each worker can start its items ahead.

In-process concurrency needs to know which items this process will run next. Under plain xdist
a worker learns that one item at a time. So, when `--dist` is the default `load`, the controller
uses :class:`ShardScheduling`: the case items are dealt round-robin into one shard per worker, and
each shard goes to one worker whole. Every process computes the same shards from the same
collection, so a worker that receives one item of a shard knows the rest of it. Other tests keep
one scope each, as under `load`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import pytest

_CASE_NODE = re.compile(r"(^|/)(cases|judge-regressions)\.jsonl::")


def is_case_node(nodeid: str) -> bool:
    """Whether a node id is one of our case items."""
    return bool(_CASE_NODE.search(nodeid))


def shards(nodeids: Sequence[str], count: int) -> dict[str, int]:
    """Case node ids → shard number, dealt round-robin in collection order."""
    cases = [n for n in nodeids if is_case_node(n)]
    return {nodeid: index % max(count, 1) for index, nodeid in enumerate(cases)}


def make_scheduler(config: Any, log: Any) -> Any:
    """The controller's scheduler for a `load` run (imports xdist only when it is used)."""
    from xdist.scheduler import LoadScopeScheduling

    class ShardScheduling(LoadScopeScheduling):
        """`loadscope`, with one scope per shard of case items and one per other test."""

        _shards: dict[str, int] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._shards is None:
                self._shards = shards(self.collection or [], self.numnodes)
            shard = self._shards.get(nodeid)
            return nodeid if shard is None else f"evalloop-shard-{shard}"

    return ShardScheduling(config, log)


CRASH_RERUN_ATTR = "evalloop_crash_rerun"
"""Set on the crash reports this plugin turned into reruns: the only reports it words."""


def runs_workers(config: Any) -> bool:
    """Whether this process is an xdist controller with workers (`-n N`, `--dist`, `--tx`):
    the only place a worker can crash under an item (xdist's own test, `is_xdist_controller`)."""
    if hasattr(config, "workerinput"):
        return False
    return getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None))


class CrashReruns:
    """Controller, under xdist: a case whose worker died while running it is run again, once.

    The shard scheduler puts a dead worker's unfinished items back in its queue, the crashed
    one among them, and a replacement worker runs them (a case the dead worker had scored is
    read back from the ledger, not answered again). xdist still logs the crash as a failure,
    so pytest would count that case twice, fail the session while the ledger says it matched,
    and exit by pytest's count rather than the run's. The crash report becomes a rerun (letter
    `R`, counted nowhere) when the item is queued again; if no worker runs it after all (no
    worker left to), its failure is logged at the end and the run closes interrupted.

    Registered only when the session runs workers (`runs_workers`), and it words only the
    reports it turned into reruns (`CRASH_RERUN_ATTR`): pytest-rerunfailures' reruns stay its
    own, counted as `N rerun`.
    """

    def __init__(self) -> None:
        self.waiting: dict[str, pytest.TestReport] = {}
        """Crashed items queued again, with the failure each keeps if it never runs."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """Turn the crash into a rerun when the scheduler will run the item again."""
        if not queued_again(sched, crashitem):
            return
        kept = copy.copy(report)
        self.waiting[crashitem] = kept
        report.outcome = "rerun"  # type: ignore[assignment]
        setattr(report, CRASH_RERUN_ATTR, True)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport) -> tuple[str, str, str] | None:
        """A crash this plugin queued again is shown as `R` and counted in no category; any
        other report is left to its owner (controller)."""
        if getattr(report, CRASH_RERUN_ATTR, False):
            return "", "R", "RERUN"
        return None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The item ran again: its crash is no longer an outcome of its own."""
        if report.when in ("setup", "call") and report.outcome != "rerun":
            self.waiting.pop(report.nodeid, None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Before the runs close: a crashed item nobody ran again is a failure, and the
        session is cut short (its runs close interrupted; `--eval-resume` finishes them)."""
        if not self.waiting:
            return
        for report in self.waiting.values():
            session.config.hook.pytest_runtest_logreport(report=report)
        names = ", ".join(sorted(self.waiting))
        session.shouldfail = (
            f"evalloop: the worker running {names} crashed and no worker ran it again; "
            "the run is interrupted (--eval-resume finishes it)"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.waiting.clear()


def queued_again(sched: Any, nodeid: str) -> bool:
    """Whether a scope scheduler holds `nodeid` unfinished in its queue or in a worker's work
    (where `remove_node` put the dead worker's units back); xdist's plain `load` never does."""
    units = [*getattr(sched, "workqueue", {}).values()]
    for assigned in getattr(sched, "assigned_work", {}).values():
        units.extend(assigned.values())
    return any(unit.get(nodeid) is False for unit in units)
