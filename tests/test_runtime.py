"""The runtime's lookahead: how many attempts it keeps in flight, and in which order."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import Any

from pytest_evalloop.runtime import Roles, Runtime

ROLES = Roles(answerer=None, judge=None, target="target of the file")  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Item:
    nodeid: str
    parent: object = None  # one file: the look-ahead never stops at another's items

    def iter_markers(self) -> list[Any]:
        return []  # no skip mark: each may start ahead


class _Settings:
    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency


def _runtime(
    n: int, concurrency: int, shards: dict[str, int] | None = None
) -> tuple[Runtime, list[_Item]]:
    """A runtime planned to run n items, and those items in their order."""
    runtime = Runtime(_Settings(concurrency), "session")  # type: ignore[arg-type]
    order = [_Item(f"case_{i}") for i in range(n)]
    runtime.plan(order, shards)  # type: ignore[arg-type]
    return runtime, order


def _drive(planned: tuple[Runtime, list[_Item]], finish_before_report: bool = True) -> list[int]:
    """Report items in order as pytest would; return how many were in flight at each report.

    Every attempt finishes in the order it started, the way equal-latency attempts do.
    """
    runtime, order = planned
    in_flight_at_report = []
    started: list[str] = []
    futures: dict[str, concurrent.futures.Future[Any]] = runtime._futures

    def start(nodeid: str) -> None:
        if nodeid not in futures:
            # As Runtime._schedule hands a submitted attempt over.
            runtime._track(nodeid, concurrent.futures.Future())
            started.append(nodeid)

    for item in order:
        # As Runtime.run_item does: the item itself first, then what the window has room for.
        start(item.nodeid)
        for ahead, roles in runtime._lookahead(item, ROLES):  # type: ignore[arg-type]
            assert roles is ROLES  # one file: its own roles
            start(ahead.nodeid)
        in_flight_at_report.append(sum(1 for f in futures.values() if not f.done()))
        if finish_before_report:
            futures[item.nodeid].set_result(None)
        futures.pop(item.nodeid)
    assert started == [i.nodeid for i in order], "items must start in collection order"
    return in_flight_at_report


def test_the_window_stays_full_while_items_are_reported_in_order() -> None:
    in_flight = _drive(_runtime(200, concurrency=16))
    # Once the window has filled, every report happens with the full concurrency in flight
    # until the queue runs dry at the end.
    assert in_flight[:184] == [16] * 184
    assert in_flight[-1] == 1


def test_concurrency_one_never_looks_ahead() -> None:
    assert _drive(_runtime(20, concurrency=1)) == [1] * 20


def test_under_shards_an_item_only_pulls_items_of_its_own_shard() -> None:
    shards = {f"case_{i}": i % 2 for i in range(40)}
    runtime, order = _runtime(40, concurrency=4, shards=shards)
    first = order[0]
    ahead = runtime._lookahead(first, ROLES)  # type: ignore[arg-type]
    assert [i.nodeid for i, _ in ahead] == ["case_2", "case_4", "case_6", "case_8"]


def test_another_files_items_start_ahead_only_with_the_target_they_would_get() -> None:
    files = ["a", "a", "b", "b", "a", "c", "c"]
    order = [_Item(f"case_{i}", parent=name) for i, name in enumerate(files)]
    runtime = Runtime(_Settings(concurrency=8), "session")  # type: ignore[arg-type]
    runtime.plan(order)  # type: ignore[arg-type]
    # Without a way to know another file's target: stop at its first item.
    ahead = runtime._lookahead(order[0], ROLES)  # type: ignore[arg-type]
    assert [(i.nodeid, r) for i, r in ahead] == [("case_1", ROLES)]

    # With one: each goes with its own file's target, the rest of the roles the waiting item's;
    # a file whose target cannot be known ("c") stops the look-ahead there.
    def target_ahead(waiting: Any, item: Any) -> Any:
        return None if item.parent == "c" else f"{item.parent}!"

    runtime.target_ahead = target_ahead
    ahead = runtime._lookahead(order[0], ROLES)  # type: ignore[arg-type]
    assert [(i.nodeid, r.target) for i, r in ahead] == [
        ("case_2", "b!"),
        ("case_3", "b!"),
        ("case_4", "a!"),
    ]
    assert all(r.answerer is ROLES.answerer and r.judge is ROLES.judge for _, r in ahead)
    # Under -x (no slots past the concurrency) the next set starts once pytest reaches it.
    runtime, _ = _runtime(0, concurrency=8)
    runtime.plan(order)  # type: ignore[arg-type]
    runtime.target_ahead, runtime.ahead_slots = target_ahead, 0
    ahead = runtime._lookahead(order[0], ROLES)  # type: ignore[arg-type]
    assert [i.nodeid for i, _ in ahead] == ["case_1"]


def test_the_collector_is_tuned_while_the_loop_runs_and_restored_after() -> None:
    import gc

    from pytest_evalloop.ledger.gcpolicy import YOUNG_THRESHOLD as GC_YOUNG_THRESHOLD

    before = gc.get_threshold()
    runtime, _ = _runtime(1, concurrency=1)

    async def nothing() -> int:
        return 7

    assert runtime.call(nothing()) == 7
    assert gc.get_threshold()[0] == max(before[0], GC_YOUNG_THRESHOLD)
    runtime.close()
    assert gc.get_threshold() == before


def _interrupted(unlocated_at: int) -> BaseException:
    """A KeyboardInterrupt through two frames, with an entry that has no line number inserted
    after the `unlocated_at`-th entry (as CPython 3.11 leaves when the SIGINT handler runs at an
    instruction with no location: offset 0 of a function with a closure cell is one), chained
    under a second exception."""
    import types

    def inner() -> None:
        raise KeyboardInterrupt

    def outer() -> None:
        cell = inner
        (lambda: cell())()  # `cell` is a closure cell: outer's first instruction has no line

    try:
        outer()
    except KeyboardInterrupt as caught:
        error = caught
    entry = error.__traceback__
    assert entry is not None and entry.tb_next is not None
    outer_frame = entry.tb_next.tb_frame
    for _ in range(unlocated_at):
        assert entry is not None
        entry = entry.tb_next
    assert entry is not None and entry.tb_next is not None
    entry.tb_next = types.TracebackType(entry.tb_next, outer_frame, 0, -1)
    assert entry.tb_next.tb_lineno is None
    try:
        raise RuntimeError("while reporting it") from error
    except RuntimeError as wrapper:
        return wrapper


def test_a_ctrl_c_at_an_instruction_without_a_line_is_still_reported() -> None:
    import pytest

    from pytest_evalloop import plugin

    for where in (0, 1):
        error = _interrupted(where)
        excinfo = pytest.ExceptionInfo.from_exception(error)
        plugin.pytest_keyboard_interrupt(excinfo)
        text = str(excinfo.getrepr(funcargs=True))  # pytest's own interrupt report
        assert "raise KeyboardInterrupt" in text and "while reporting it" in text
        chained = error.__cause__
        assert chained is not None
        entry = chained.__traceback__
        while entry is not None:
            assert entry.tb_lineno is not None
            entry = entry.tb_next
