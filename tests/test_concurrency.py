"""In-process concurrency: same outcomes and order as one-at-a-time, -x, and interruption."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure.gate import EXIT_RUN_UNFINISHED
from pytest_evalloop.testing import FakeAnthropic
from pytest_evalloop.testing.policies import FakeRequest, Outcome
from tests.test_gate import QIDS, Held, questions, script, spawn_pytest
from tests.test_run import make_set


def _events(run_dir: Path) -> list[tuple[Any, ...]]:
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    keep = ("qid", "sample", "verdict", "reason", "final_query", "submitted", "tool", "query")
    return sorted(
        tuple((k, str(getattr(e, k, None))) for k in ("kind", *keep)) for e in read.events
    )


def test_concurrency_changes_neither_outcomes_nor_order_nor_ledger(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop = make_set(pytester.path, QIDS)
    spec = script(shop, {QIDS[1], QIDS[6]})
    fake.policy = spec.model_copy(update={"latency": 0.05}).policy()
    one = pytester.runpytest_subprocess(
        str(shop), "-v", "-p", "no:cacheprovider", "--eval-concurrency=1", "--eval-label=one"
    )
    many = pytester.runpytest_subprocess(
        str(shop), "-v", "-p", "no:cacheprovider", "--eval-concurrency=32", "--eval-label=many"
    )
    assert one.ret == many.ret == pytest.ExitCode.TESTS_FAILED
    assert one.parseoutcomes() == many.parseoutcomes()
    order = [
        line.split("::", 1)[1].split()[0]
        for line in one.outlines
        if "cases.jsonl::" in line and "%]" in line
    ]
    order_many = [
        line.split("::", 1)[1].split()[0]
        for line in many.outlines
        if "cases.jsonl::" in line and "%]" in line
    ]
    assert order == order_many == QIDS
    assert _events(shop / "runs" / "one") == _events(shop / "runs" / "many")


def test_exitfirst_stops_scheduling_after_the_first_no_match(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop = make_set(pytester.path, QIDS)
    fake.policy = script(shop, {QIDS[2]}).model_copy(update={"latency": 0.05}).policy()
    result = pytester.runpytest_subprocess(
        str(shop), "-x", "-p", "no:cacheprovider", "--eval-concurrency=2", "--eval-label=x"
    )
    result.assert_outcomes(passed=2, failed=1)
    started = {r.question for r in fake.calls("answerer") if r.turn == 1}
    # Items 1-3 ran; at most the one item scheduled ahead of the failure had started.
    assert 3 <= len(started) <= 4
    read = ledger_reader.read_run(shop / "runs" / "x")
    assert read.errors == []
    assert len(read.scores()) <= 4


class HeldUntilAsked:
    """A question's first turn held until another question's first turn comes in: the held
    case can be let go only by a run that starts the other while it is still waited on."""

    def __init__(self, inner: Any, held: str, until: str) -> None:
        self.asked = threading.Event()
        self.held = Held(inner, {held}, self.asked)
        self.until = until

    def __call__(self, request: FakeRequest) -> Outcome:
        if request.role == "answerer" and request.turn == 1 and request.question == self.until:
            self.asked.set()
        return self.held(request)


def test_a_slot_an_attempt_frees_is_filled_while_a_slower_one_is_waited_on(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # Items were started only when pytest moved on to the next one: behind one slow case,
    # every slot the others freed stayed empty until it ended (a slow case in a real run held
    # the whole concurrency back). Here the first case can end only once the third started.
    shop = make_set(pytester.path, QIDS[:4])
    asked = questions(shop)
    policy = HeldUntilAsked(script(shop, set()).policy(), asked[QIDS[0]], asked[QIDS[2]])
    fake.policy = policy
    proc = spawn_pytest(
        pytester.path,
        shop,
        "--eval-concurrency=2",
        "--eval-label=refill",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        out, _ = proc.communicate(timeout=120)  # a guard for a hang, not a measure
    except subprocess.TimeoutExpired:
        out = None
    started_third = policy.asked.is_set()
    policy.asked.set()  # a run that never asked it is let go, to fail below
    if out is None:
        out, _ = proc.communicate(timeout=120)
    assert started_third and proc.returncode == 0, out
    firsts = [r.question for r in fake.calls("answerer") if r.turn == 1]
    # The second case ended and the third took its slot: all while the first was held.
    assert set(firsts[:2]) == {asked[q] for q in QIDS[:2]} and firsts[2] == asked[QIDS[2]]
    read = ledger_reader.read_run(shop / "runs" / "refill")
    assert read.errors == [] and len(read.scores()) == 4


class _HeldUntilJudged:
    """The first case held until the second one is judged; the cases asked by the time the
    first one is judged are kept."""

    def __init__(self, inner: Any, first: str, second: str) -> None:
        self.judged = threading.Event()
        self.held = Held(inner, {first}, self.judged)
        self.first, self.second = first, second
        self.asked_before_first_judged: set[str] = set()
        self._asked: set[str] = set()

    def __call__(self, request: FakeRequest) -> Outcome:
        if request.role == "answerer" and request.turn == 1:
            self._asked.add(request.question)
        if request.role == "judge" and self.second in request.user_text:
            self.judged.set()
        if request.role == "judge" and self.first in request.user_text:
            self.asked_before_first_judged = set(self._asked)
        return self.held(request)


@pytest.mark.parametrize("stop", ["-x", "--sw"])
def test_a_session_that_stops_at_a_failure_starts_nothing_past_the_slots(
    pytester: pytest.Pytester, fake: FakeAnthropic, stop: str
) -> None:
    # Slots refill while a slow case is waited on, but a session that stops at its first
    # failure would answer (and pay for) cases past it that it never reports: there, nothing
    # starts beyond the concurrency (found by the hostile pass for --sw).
    shop = make_set(pytester.path, QIDS[:6])
    asked = questions(shop)
    policy = _HeldUntilJudged(script(shop, set()).policy(), asked[QIDS[0]], asked[QIDS[1]])
    fake.policy = policy
    result = pytester.runpytest_subprocess(
        str(shop), stop, "--eval-concurrency=2", "--eval-label=stops"
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert policy.judged.is_set()
    # The second case ended while the first was held: its slot stayed empty until the first
    # was done (with the slots refilled, the third started in it at once).
    assert policy.asked_before_first_judged == {asked[QIDS[0]], asked[QIDS[1]]}


@contextlib.contextmanager
def sigint_not_ignored() -> Iterator[None]:
    """Children started inside take Ctrl-C as Python's default does, however this process was
    started (main thread).

    A shell starts a background job (`make test &`, a CI step's `cmd &`) with SIGINT ignored,
    this process and its xdist workers inherit that, and an ignored signal stays ignored across
    `exec`: a child started as is never sees the test's SIGINT, and hangs. A signal with a
    handler is reset to its default by `exec` instead, and the child's Python then installs its
    own KeyboardInterrupt handler.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_interrupted_concurrent_run_leaves_a_valid_ledger(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop = make_set(pytester.path, QIDS)
    # Every case after the first is held until the interrupt has been sent: it lands while
    # the run is going, on any machine.
    release = threading.Event()
    asked = questions(shop)
    fake.policy = Held(script(shop, set()).policy(), {asked[q] for q in QIDS[1:]}, release)
    with sigint_not_ignored():
        proc = spawn_pytest(
            pytester.path,
            shop,
            "--eval-concurrency=8",
            "--eval-label=int",
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    events = shop / "runs" / "int" / ledger.EVENTS_FILE
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (
        events.is_file() and '"kind": "score"' in events.read_text()
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    try:
        # The held cases are let go only once the child has exited: had the interrupt been
        # lost, they could not finish the run behind its back (the child would hang instead).
        out, _ = proc.communicate(timeout=120)
    finally:
        release.set()
    # Interrupted: the run did not finish, and says so by its own exit status (issue 45).
    assert proc.returncode == EXIT_RUN_UNFINISHED, out
    read = ledger_reader.read_run(shop / "runs" / "int")
    assert read.errors == [], [str(f) for f in read.errors]
    assert read.info is not None and read.info.status == "interrupted"
    assert 1 <= len(read.scores()) <= len(QIDS)


@pytest.mark.parametrize("walked", [False, True], ids=["named", "walked"])
def test_an_early_ctrl_c_under_xdist_closes_the_run_its_workers_opened(
    pytester: pytest.Pytester, fake: FakeAnthropic, walked: bool
) -> None:
    # Every case is held: the Ctrl-C comes once a worker has opened the run and asked the
    # model, before any result could reach the controller. The controller knew no run then,
    # and left this one `running`, with no summary.
    shop = make_set(pytester.path, QIDS)
    where = shop.parent if walked else shop
    code, out = interrupted_while_held(pytester, fake, shop, where, "early", "-n", "2")
    assert code == EXIT_RUN_UNFINISHED, out
    closed_interrupted(shop / "runs" / "early", out)


def interrupted_while_held(
    pytester: pytest.Pytester,
    fake: FakeAnthropic,
    shop: Path,
    where: Path,
    label: str,
    *args: str,
) -> tuple[int, str]:
    """A run of `where` whose every model call is held, Ctrl-C'd (its whole process group, as
    a terminal's reaches every process of the job) once it has opened its run and asked the
    model: before any result could reach pytest. Its exit status and output."""
    release = threading.Event()
    held = Asked(script(shop, set()).policy(), set(questions(shop).values()), release)
    fake.policy = held
    with sigint_not_ignored():
        proc = spawn_pytest(
            pytester.path,
            where,
            f"--eval-label={label}",
            *args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # The first model call comes after its run was opened (run.json written): no clock.
    assert held.asked.wait(timeout=180), "no model call came"
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        release.set()
    return proc.returncode, out


class Asked(Held):
    """Held, and an event set when the first model call arrives."""

    def __init__(self, inner: Any, held: set[str], release: threading.Event) -> None:
        super().__init__(inner, held, release)
        self.asked = threading.Event()

    def __call__(self, request: FakeRequest) -> Outcome:
        outcome = super().__call__(request)
        self.asked.set()
        return outcome


def closed_interrupted(run_dir: Path, out: str) -> None:
    """The run closed as interrupted, said so, and validates."""
    assert f"run: {run_dir.name} (interrupted)" in out, out
    read = ledger_reader.read_run(run_dir)
    assert read.errors == [], [str(f) for f in read.errors]
    assert read.info is not None and read.info.status == "interrupted", out


WORKER_DIES = """
import os
import signal

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    outcome = yield
    if hasattr(item.config, "workerinput"):
        # The attempt ran (the run is open, its lines written); the worker dies before
        # its report can name the run to the controller.
        os.kill(os.getpid(), signal.SIGKILL)
    return outcome
"""


def test_a_run_whose_workers_all_died_before_any_report_is_closed_not_left_running(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop = make_set(pytester.path, QIDS)
    (shop / "conftest.py").write_text(WORKER_DIES, encoding="utf-8")
    fake.policy = script(shop, set()).policy()
    result = pytester.runpytest_subprocess(
        str(shop),
        "-p",
        "no:cacheprovider",
        "-n",
        "2",
        "--max-worker-restart=0",
        "--eval-label=lost",
    )
    closed_interrupted(shop / "runs" / "lost", result.stdout.str())


DOUBLE_TAP = """
import os
import signal

import pytest


@pytest.hookimpl(trylast=True)
def pytest_keyboard_interrupt(excinfo):
    # A second Ctrl-C while pytest reports the first: a double tap on the keys.
    os.kill(os.getpid(), signal.SIGINT)
"""


def test_a_double_tap_of_ctrl_c_in_one_process_closes_the_run_without_a_traceback(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # The second Ctrl-C used to be raised into pytest's report of the first: two
    # KeyboardInterrupt tracebacks, and the process died of SIGINT instead of exiting 8.
    shop = make_set(pytester.path, QIDS)
    (shop / "conftest.py").write_text(DOUBLE_TAP, encoding="utf-8")
    code, out = interrupted_while_held(pytester, fake, shop, shop, "tap")
    assert code == EXIT_RUN_UNFINISHED, out
    assert "Traceback" not in out, out
    closed_interrupted(shop / "runs" / "tap", out)


@pytest.fixture
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running on its own thread, as the runtime's is."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def drained(loop: asyncio.AbstractEventLoop) -> None:
    """Return once the loop has run every callback handed to it before this call (FIFO)."""
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result()


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """SIGINT at Python's default handler for the test (the latch takes only that one over)."""
    with sigint_not_ignored():
        yield


def installed(latch: Any, in_flight: Any, hand_off: Any) -> Callable[[int, Any], None]:
    """Install `latch` and return the SIGINT handler it put in place."""
    latch.install(in_flight, hand_off)
    handler = signal.getsignal(signal.SIGINT)
    assert callable(handler) and handler is not signal.default_int_handler
    return handler


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the point
@pytest.mark.usefixtures("default_sigint")
def test_an_interrupt_a_finalizer_swallowed_still_stops_the_wait(
    loop_thread: asyncio.AbstractEventLoop,
) -> None:
    # CPython may run the SIGINT handler inside a finalizer, where the KeyboardInterrupt is
    # printed and dropped; the latch must still wake the main thread off an attempt that
    # never finishes, and refuse to wait on the next one.
    from pytest_evalloop.latch import InterruptLatch

    never: concurrent.futures.Future[int] = concurrent.futures.Future()
    latch = InterruptLatch()
    handler = installed(latch, lambda: [never], loop_thread.call_soon_threadsafe)

    class Swallows:
        def __del__(self) -> None:
            handler(signal.SIGINT, None)  # raises; CPython ignores it here

    Swallows()
    assert latch.tripped
    drained(loop_thread)
    assert never.cancelled()
    with pytest.raises(KeyboardInterrupt):
        latch.result(never)
    with pytest.raises(KeyboardInterrupt):
        latch.result(concurrent.futures.Future())
    latch.restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("default_sigint")
def test_an_interrupt_inside_a_lock_a_done_callback_takes_cannot_deadlock() -> None:
    # Ctrl-C can land while the main thread holds a lock (the progress counters' while an item
    # is scheduled), and a cancelled attempt's done-callback takes that lock to count it
    # abandoned: had the handler cancelled on the spot, the callback would wait on its own
    # thread forever. The handler must only hand the cancelling on (the runtime hands it to
    # its loop), to run once the interrupted code has let go.
    from pytest_evalloop.latch import InterruptLatch

    counters = threading.Lock()
    seen: list[bool] = []

    def abandoned(future: concurrent.futures.Future[int]) -> None:
        got = counters.acquire(blocking=False)  # blocking here is the deadlock
        if got:
            counters.release()
        seen.append(got)

    attempt: concurrent.futures.Future[int] = concurrent.futures.Future()
    attempt.add_done_callback(abandoned)
    handed: list[Callable[[], None]] = []
    handler = installed(InterruptLatch(), lambda: [attempt], handed.append)
    with pytest.raises(KeyboardInterrupt), counters:
        handler(signal.SIGINT, None)
    assert seen == [] and not attempt.cancelled(), "the handler ran the callbacks itself"
    assert len(handed) == 1
    handed[0]()
    assert attempt.cancelled() and seen == [True]


def test_the_latch_leaves_a_handler_someone_else_set_alone() -> None:
    from pytest_evalloop.latch import InterruptLatch

    def theirs(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, theirs)
    try:
        latch = InterruptLatch()
        latch.install(list, lambda call: call())
        assert signal.getsignal(signal.SIGINT) is theirs
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        done.set_result(3)
        assert latch.result(done) == 3
    finally:
        signal.signal(signal.SIGINT, previous)
