"""Progress of a run: the counters, their sum over xdist workers, and the terminal display."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pyte
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalloop.answer.pipeline import ItemResult
from pytest_evalloop.display import ProgressReporter
from pytest_evalloop.model_api.ratelimit import RunLimiter
from pytest_evalloop.progress import (
    ProgressModel,
    ProgressPublisher,
    ProgressSnapshot,
    count_eval_ids,
    final_text,
    fit,
    parse_snapshot,
    progress_file,
    read_snapshots,
    result_cost,
    status_fields,
    status_text,
    write_snapshot,
)
from tests.querygate import EVENT_CEILING_S


def _result(status: str = "match", **extra: object) -> ItemResult:
    return ItemResult.model_validate({"qid": "q1", "sample": None, "status": status, **extra})


def test_the_status_line_text() -> None:
    snap = ProgressSnapshot(done=120, in_flight=64, waiting=3, cost_usd=4.2149)
    assert status_text(snap, 500) == (
        "evalloop: 120/500 done, 64 in flight, 3 waiting on the rate limit, $4.21 so far"
    )
    quiet = ProgressSnapshot(done=2, in_flight=1, errors=1, cost_usd=None)
    assert status_text(quiet) == (
        "evalloop: 2 done, 1 in flight, 1 error, cost unknown (a model has no price)"
    )


def test_rate_and_eta_once_an_item_is_done() -> None:
    snap = ProgressSnapshot(done=10, in_flight=2, cost_usd=1.0)
    assert status_text(snap, 40, elapsed_s=5.0) == (
        "evalloop: 10/40 done, 2 in flight, 2.0/s, ETA 15 s, $1.00 so far"
    )
    slow = ProgressSnapshot(done=3, in_flight=8, cost_usd=0.5)
    assert status_text(slow, 500, elapsed_s=120.0) == (
        "evalloop: 3/500 done, 8 in flight, 1.5/min, ETA 5h31m, $0.50 so far"
    )
    assert status_text(ProgressSnapshot(in_flight=4), 9, elapsed_s=30.0) == (
        "evalloop: 0/9 done, 4 in flight, $0.00 so far"  # no rate before the first is done
    )
    assert final_text(ProgressSnapshot(done=44, errors=1, cost_usd=1.234), 44, 21.0) == (
        "evalloop: 44/44 done in 21 s (2.1/s), $1.23 spent, 1 error"
    )


def test_a_narrow_terminal_drops_whole_fields() -> None:
    snap = ProgressSnapshot(done=10, in_flight=2, waiting=3, cost_usd=1.0)
    assert status_text(snap, 40, 5.0, width=50) == "evalloop: 10/40 done, ETA 15 s, $1.00 so far"
    assert status_text(snap, 40, 5.0, width=30) == "evalloop: 10/40 done"
    assert status_text(snap, 40, 5.0, width=10) == ""


@given(
    done=st.integers(0, 10_000),
    left=st.integers(0, 10_000),
    in_flight=st.integers(0, 500),
    waiting=st.integers(0, 500),
    errors=st.integers(0, 50),
    cost=st.one_of(st.none(), st.floats(0, 1e6)),
    elapsed=st.one_of(st.none(), st.floats(0.001, 1e6)),
    width=st.integers(0, 200),
)
def test_the_line_fits_and_never_cuts_a_field(
    done: int,
    left: int,
    in_flight: int,
    waiting: int,
    errors: int,
    cost: float | None,
    elapsed: float | None,
    width: int,
) -> None:
    snap = ProgressSnapshot(
        done=done, in_flight=in_flight, waiting=waiting, errors=errors, cost_usd=cost
    )
    fields = status_fields(snap, done + left, elapsed)
    line = fit(fields, width)
    assert len(line) <= width
    if line:
        shown = line.split(", ")
        assert shown[0] == fields[0]  # the head first, always
        assert all(part in fields for part in shown)  # whole fields, in order
        assert [f for f in fields if f in shown] == shown


def test_a_result_costs_both_roles_and_is_unknown_without_a_price() -> None:
    priced = _result(answerer_cost=0.25, judge_cost=0.5, answerer_usage={"input_tokens": 9})
    assert result_cost(priced) == 0.75
    assert result_cost(priced.model_dump(mode="json")) == 0.75
    unpriced = _result(answerer_cost=None, judge_cost=0.5, answerer_usage={"input_tokens": 9})
    assert result_cost(unpriced) is None
    # A role that never ran (a harness error before the judge) costs nothing, not "unknown".
    assert result_cost(_result("harness_error", answerer_cost=0.1)) == 0.1


def test_the_model_counts_items_and_reads_the_limiter_waiters() -> None:
    limiter = RunLimiter(None, rpm=0, tpm=0)
    model = ProgressModel(limiter)
    for _ in range(3):
        model.started()
    model.finished_result(_result(answerer_cost=1.0, judge_cost=0.5))
    model.finished_result(_result("harness_error"))
    limiter.waiting = 2  # what RunLimiter.acquire keeps while requests sleep
    assert model.snapshot() == ProgressSnapshot(
        done=2, in_flight=1, waiting=2, errors=1, cost_usd=1.5
    )
    model.finished_result(_result(answerer_cost=None, answerer_usage={"output_tokens": 3}))
    assert model.snapshot().cost_usd is None
    model.abandoned()
    assert model.snapshot().in_flight == 0


def test_a_worker_file_that_is_not_a_snapshot_is_skipped_never_raised_or_waited_on(
    tmp_path: Path,
) -> None:
    import os

    write_snapshot(progress_file(tmp_path, "gw0"), ProgressSnapshot(done=3))
    (tmp_path / "progress-gw1.json").write_bytes(b'{"done": 1, "label": "\xff\xfe"}')
    (tmp_path / "progress-gw2.json").mkdir()
    os.mkfifo(tmp_path / "progress-gw3.json")  # its open would wait for a writer for ever
    (tmp_path / "progress-gw4.json").symlink_to(progress_file(tmp_path, "gw0"))
    # Counters no worker writes: below zero, not numbers, no finite cost, or a file too big
    # to be one (it was read whole at every refresh).
    for name, text in {
        "gw5": '{"done": -100, "in_flight": -50}',
        "gw6": '{"done": true, "errors": "7"}',
        "gw7": '{"done": 1, "cost_usd": NaN}',
        "gw8": '{"cost_usd": -2.5}',
        "gw9": '{"done": 1}' + " " * 5000,
        "gw10": '{"done": 1, "cost_usd": 1e308}',  # two of them summed to infinity
        "gw11": '{"done": 1' + "0" * 400 + "}",  # a count no float holds: the rate raised
    }.items():
        (tmp_path / f"progress-{name}.json").write_text(text)
    assert read_snapshots(tmp_path) == [ProgressSnapshot(done=3)]


def test_counters_are_summed_across_worker_files(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    write_snapshot(progress_file(tmp_path, "gw0"), ProgressSnapshot(done=3, in_flight=2))
    write_snapshot(
        progress_file(tmp_path, "gw1"),
        ProgressSnapshot(done=4, in_flight=1, waiting=5, errors=1, cost_usd=0.75),
    )
    (tmp_path / "progress-gw2.json").write_text("{not json")  # a torn file is skipped
    (tmp_path / "limiter.json").write_text("{}")  # not a progress file
    assert len(read_snapshots(tmp_path)) == 2
    local = ProgressModel()
    local.started()
    reporter = ProgressReporter(pytestconfig, tmp_path, local)
    reporter.total = 20
    assert reporter.snapshot() == ProgressSnapshot(
        done=7, in_flight=4, waiting=5, errors=1, cost_usd=0.75
    )
    assert reporter.text() == (
        "evalloop: 7/20 done, 4 in flight, 5 waiting on the rate limit, 1 error, $0.75 so far"
    )
    write_snapshot(progress_file(tmp_path, "gw0"), ProgressSnapshot(done=3, cost_usd=None))
    assert reporter.snapshot().cost_usd is None


def test_the_publisher_rewrites_the_file_when_counters_change(tmp_path: Path) -> None:
    model = ProgressModel()
    path = progress_file(tmp_path, "gw3")
    publisher = ProgressPublisher(model, path, every_s=0.05)
    publisher.start()
    assert parse_snapshot(path.read_text()).in_flight == 0
    model.started()
    deadline = time.monotonic() + EVENT_CEILING_S  # only how long before the test fails
    while parse_snapshot(path.read_text()).in_flight != 1:
        assert time.monotonic() < deadline, "the publisher never wrote the change"
        time.sleep(0.02)
    model.finished(cost_usd=0.5)
    publisher.stop()
    assert parse_snapshot(path.read_text()) == ProgressSnapshot(done=1, cost_usd=0.5)
    assert [p.name for p in tmp_path.iterdir()] == ["progress-gw3.json"]  # no temp files left


def test_eval_items_are_counted_from_node_ids() -> None:
    ids = [
        "evals/shop/cases.jsonl::q1",
        "evals/shop/cases.jsonl::q2[s1]",
        "evals/shop/judge-regressions.jsonl::f1",
        "tests/test_x.py::test_cases",
        "cases.jsonl::q3",
    ]
    assert count_eval_ids(ids) == 4


# --- the display, through real pytest sessions -----------------------------------------------

WATCH = """
import time
from pathlib import Path
from pytest_evalloop.display import ProgressReporter

SHOWN = Path(__file__).with_name("shown.log")

class Watched(ProgressReporter):
    # Logs each text it shows, so a test can wait until the display has caught up.
    def _plain_line(self, text):
        super()._plain_line(text)
        with SHOWN.open("a") as log:
            log.write(text + "\\n")

    def _draw(self, text):
        super()._draw(text)
        with SHOWN.open("a") as log:
            log.write(text + "\\n")

def wait_shown(part):
    # An event (the display showed `part`), not a time; the ceiling only fails the test.
    end = time.monotonic() + 120
    while not (SHOWN.is_file() and part in SHOWN.read_text()):
        assert time.monotonic() < end, f"the display never showed {part!r}"
        time.sleep(0.01)
"""
"""A reporter that logs what it shows, and a wait for it: the items below finish only once the
display has shown the state they are in, so no line depends on how fast the machine is."""

CONFTEST = (
    WATCH
    + """
import pytest
from pytest_evalloop.progress import ProgressModel

MODEL = ProgressModel()

def pytest_configure(config):
    # Replace the plugin's own reporter with one driven by this test's model.
    config.pluginmanager.unregister(name="evalloop-progress")
    # A clock that stands still: no rate or ETA, so each text is known in advance.
    reporter = Watched(config, local=MODEL, plain_every_s=0.2, tick_s=0.05, clock=lambda: 0.0)
    config.pluginmanager.register(reporter, "evalloop-progress")

@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    session.config.pluginmanager.get_plugin("evalloop-progress").total = len(session.items)
"""
)

TESTS = """
from conftest import MODEL, wait_shown

def test_one():
    MODEL.started()
    MODEL.started()
    wait_shown("0/2 done, 2 in flight")
    MODEL.finished(cost_usd=1.25)

def test_two():
    wait_shown("1/2 done, 1 in flight")
    MODEL.finished(cost_usd=1.0)
"""


@pytest.fixture
def session_dir(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_work=TESTS)
    return pytester


def test_a_plain_line_every_interval_when_verbose(session_dir: pytest.Pytester) -> None:
    result = session_dir.runpytest_subprocess("-v", "-p", "no:xdist")
    result.assert_outcomes(passed=2)
    lines = [ln for ln in result.outlines if ln.startswith("evalloop: ")]
    assert "evalloop: 0/2 done, 2 in flight, $0.00 so far" in lines
    assert "evalloop: 1/2 done, 1 in flight, $1.25 so far" in lines
    assert lines[-1] == "evalloop: 2/2 done in 0 s, $2.25 spent"  # the final line
    # pytest's own lines stay whole around ours.
    assert any(re.match(r"test_work.py::test_two PASSED\s+\[100%\]", ln) for ln in result.outlines)


def test_nothing_under_quiet(session_dir: pytest.Pytester) -> None:
    # Nothing is shown under -q, so nothing is waited for either.
    session_dir.makepyfile(test_work=TESTS.replace('wait_shown("', '("'))
    result = session_dir.runpytest_subprocess("-q", "-p", "no:xdist")
    result.assert_outcomes(passed=2)
    assert "evalloop:" not in result.stdout.str()


COLUMNS, ROWS = 80, 24


def _screen(raw: bytes) -> list[str]:
    """What an 80-column terminal shows after `raw` (pyte, a VT100 emulator): the live display's
    cursor moves and erasures applied as a terminal applies them."""
    screen = pyte.Screen(COLUMNS, ROWS)
    stream = pyte.Stream(screen)
    stream.feed(raw.decode().replace("\n", "\r\n"))
    return [line.rstrip() for line in screen.display]


def _on_a_terminal(cwd: Path, *args: str, **extra_env: str) -> tuple[list[str], int]:
    """pytest run on an 80-column pseudo-terminal: the screen it leaves and its exit status."""
    raw, returncode = _terminal_bytes(cwd, *args, **extra_env)
    return _screen(raw), returncode


def _terminal_bytes(cwd: Path, *args: str, **extra_env: str) -> tuple[bytes, int]:
    """pytest run on an 80-column pseudo-terminal: every byte it wrote (what a live area showed
    and then erased too), and its exit status."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": str(COLUMNS), "LINES": str(ROWS), "PY_COLORS": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        stdout=slave,
        stderr=slave,
        env={**env, **extra_env},
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    return b"".join(chunks), proc.returncode


def test_live_on_a_terminal(session_dir: pytest.Pytester) -> None:
    screen, returncode = _on_a_terminal(session_dir.path, "-p", "no:xdist")
    shown = (session_dir.path / "shown.log").read_text()
    assert "evalloop: 0/2 done, 2 in flight, $0.00 so far" in shown
    assert "evalloop: 1/2 done, 1 in flight, $1.25 so far" in shown
    # The live area is gone; pytest's line is whole, and under it the final line stays.
    at = next(i for i, line in enumerate(screen) if line.startswith("test_work.py"))
    assert re.fullmatch(r"test_work\.py \.\.\s+\[100%\]", screen[at]), screen
    assert screen[at + 1] == "evalloop: 2/2 done in 0 s, $2.25 spent", screen
    assert [line for line in screen if "evalloop:" in line] == [screen[at + 1]], screen
    assert returncode == 0


XDIST_CONFTEST = (
    WATCH
    + """
import os
import pytest
from pathlib import Path
from pytest_evalloop.display import LastCounts
from pytest_evalloop.progress import ProgressModel, ProgressPublisher, progress_file

STATE = Path(os.environ["PROGRESS_STATE"])
MODEL = ProgressModel()

def pytest_configure(config):
    worker = getattr(config, "workerinput", None)
    if worker is None:
        config.pluginmanager.unregister(name="evalloop-progress")
        reporter = Watched(config, STATE, plain_every_s=0.2, tick_s=0.05, clock=lambda: 0.0)
        config.pluginmanager.register(reporter, "evalloop-progress")
    else:
        publisher = ProgressPublisher(MODEL, progress_file(STATE, worker["workerid"]), 0.05)
        publisher.start()
        config.pluginmanager.register(LastCounts(publisher))
        config.add_cleanup(publisher.stop)

@pytest.hookimpl(trylast=True, optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    node.config.pluginmanager.get_plugin("evalloop-progress").total = len(ids)
"""
)


def test_workers_publish_and_the_controller_sums(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(XDIST_CONFTEST)
    pytester.makepyfile(test_work=TESTS.replace("test_two", "test_two_slow"))
    state = pytester.path / "state"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROGRESS_STATE", str(state))
        result = pytester.runpytest_subprocess("-n", "2", "-v")
    result.assert_outcomes(passed=2)
    lines = [ln for ln in result.outlines if ln.startswith("evalloop: ")]
    assert lines, result.outlines
    # Each worker ran one test; the controller's line is their sum.
    final = ProgressSnapshot.combine(read_snapshots(state))
    assert final.done == 2
    assert final.cost_usd == 2.25
    assert any(" in flight" in ln and "/2 done" in ln for ln in lines)


def test_live_under_xdist_every_line_of_ours_has_its_own_row(pytester: pytest.Pytester) -> None:
    # xdist leaves rows open that pytest's write_line does not end: its status line while the
    # workers start, and the `[100%]` of the run. A step line said while the status line is
    # open, and the final line, must each start a row of their own.
    pytester.makeconftest(
        XDIST_CONFTEST
        + """
from pytest_evalloop import steps

_count = pytest_xdist_node_collection_finished

@pytest.hookimpl(trylast=True, optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    steps.announce(f"a step after {node.gateway.id} collected")
    _count(node, ids)
"""
    )
    pytester.makepyfile(test_work=TESTS)
    # pytest-asyncio (a dev dependency) warns on each worker's stderr without this key.
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    screen, returncode = _on_a_terminal(
        pytester.path, "-n", "2", PROGRESS_STATE=str(pytester.path / "state")
    )
    assert returncode == 0, screen
    ours = [line for line in screen if "evalloop:" in line]
    assert len(ours) == 3, screen
    assert all(line.startswith("evalloop: ") for line in ours), screen
    at = next(i for i, line in enumerate(screen) if re.fullmatch(r"\.\.\s+\[100%\]", line))
    assert screen[at + 1] == "evalloop: 2/2 done in 0 s, $2.25 spent", screen


@pytest.mark.parametrize("args", [["-p", "no:xdist"], ["-n", "2"]], ids=["one", "n2"])
def test_a_session_of_plain_tests_shows_no_progress_line(
    pytester: pytest.Pytester, args: list[str]
) -> None:
    # A project's own tests with the plugin installed: no case item, so no evalloop line, live
    # or final, and the terminal never taken. A live display draws on each write pytest makes
    # (`take_write`), so the session's own progress characters are the moments to look at.
    pytester.makepyfile(
        test_plain="""
def test_one():
    pass

def test_two():
    pass
"""
    )
    quiet = ("-W", "ignore::pytest.PytestDeprecationWarning")  # a dev plugin's, at the top
    raw, returncode = _terminal_bytes(pytester.path, *quiet, *args)
    shown = raw.decode()
    assert returncode == 0, shown
    assert "2 passed" in shown
    # Every byte, not the screen left at the end: a live line is erased once the loop ends.
    assert "evalloop:" not in shown
    assert "\x1b[?25l" not in shown  # the terminal never taken (a live display hides the cursor)


def test_collect_only_shows_no_progress_line(session_dir: pytest.Pytester) -> None:
    # Nothing runs: a final "0/2 done" line would say the run happened and did nothing.
    result = session_dir.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only")
    assert result.ret == pytest.ExitCode.OK
    assert "evalloop:" not in result.stdout.str()


@given(
    files=st.lists(
        st.tuples(
            st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
            st.integers(min_value=-(10**30), max_value=10**400),
        ),
        max_size=12,
    )
)
def test_whatever_the_worker_files_say_the_sums_and_the_line_are_numbers(
    files: list[tuple[float | None, int]],
) -> None:
    import json

    parsed = []
    for cost, done in files:
        try:
            parsed.append(parse_snapshot(json.dumps({"done": done, "cost_usd": cost})))
        except ValueError:
            continue  # skipped, as read_snapshots skips it
    total = ProgressSnapshot.combine(parsed)
    assert total.cost_usd is None or 0 <= total.cost_usd < float("inf")
    fields = status_fields(total, total.done + 10, 1.5)  # the rate and the ETA are made
    assert fields and all(isinstance(field, str) for field in fields)
