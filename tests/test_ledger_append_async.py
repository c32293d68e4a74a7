"""The ledger's append from an event loop (issue 49's per-case CPU) writes what `append` writes.

`LedgerWriter.append_async` makes an append's quick calls on the loop and hands a thread only
the chain's fsync, the line's write and its fsync. These tests hold it to the synchronous
`append`, kept as the oracle: the same bytes in `events.jsonl` and in the chain for any mix of
the two and any torn tail a kill left, a lock held elsewhere waited for, and a cancelled wait
that neither loses the line nor leaks a descriptor. The environment's credentials, now
remembered between calls, are held to a fresh scan after any change to the environment.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_evalloop.answer import pipeline
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import seal
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.model_api import redaction
from pytest_evalloop.sets.cases import Case
from tests.conftest import HANG_GUARD_S

AT = "2026-12-05T00:00:00Z"


def _info(run_id: str) -> ledger.RunInfo:
    return ledger.RunInfo.model_validate(
        {
            "runId": run_id,
            "label": run_id,
            "target": "embedded:ecommerce",
            "answererModel": "claude-x",
            "phase": "baseline",
            "started": AT,
            "judgeModel": "claude-y",
            "judgeVersion": "1",
            "rubricSha": "abc",
            "datasetVersion": 1,
            "datasetSha": "def",
        }
    )


def _events(qid: str, verdict: str, words: str) -> list[Any]:
    attempt = ledger.AttemptEvent(
        at=AT,
        qid=qid,
        sample=None,
        phase="baseline",
        question_sha="0" * 16,
        submitted=True,
        final_query=f"SELECT '{words}'",
        contaminated=False,
    )
    score = ledger.ScoreEvent(
        at=AT,
        qid=qid,
        sample=None,
        phase="baseline",
        verdict=verdict,  # type: ignore[arg-type]
        reason=words,
        contaminated=False,
    )
    return [attempt, score]


def _new_run(root: Path, name: str) -> Path:
    run = root / name
    ledger_writer.write_run_info(run, _info(name))
    return run


def _files(run: Path) -> tuple[bytes, bytes]:
    return (run / ledger.EVENTS_FILE).read_bytes(), (run / seal.CHAIN_FILE).read_bytes()


BATCH = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["match", "no_match"]),
    st.text(st.characters(codec="utf-8"), max_size=40),
    st.booleans(),  # through append_async (True) or append
    st.binary(max_size=30).filter(lambda b: b"\n" not in b),  # a torn tail before it, or none
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(BATCH, min_size=1, max_size=6))
def test_append_async_writes_the_bytes_append_writes(
    tmp_path: Path, batches: list[tuple[str, str, str, bool, bytes]]
) -> None:
    root = tmp_path / f"r{os.urandom(6).hex()}"
    oracle, tried = _new_run(root, "oracle"), _new_run(root, "tried")

    async def play() -> None:
        for qid, verdict, words, on_loop, torn in batches:
            for run in (oracle, tried):
                if torn:  # what a kill mid-write leaves: a partial last line
                    with open(run / ledger.EVENTS_FILE, "ab") as handle:
                        handle.write(torn)
            ledger_writer.LedgerWriter(oracle).append(*_events(qid, verdict, words))
            writer = ledger_writer.LedgerWriter(tried)
            if on_loop:
                await writer.append_async(*_events(qid, verdict, words))
            else:
                writer.append(*_events(qid, verdict, words))

    asyncio.run(play())
    assert _files(tried) == _files(oracle)
    # A torn tail is named by the chain check, as it is for the oracle; without one, clean.
    assert seal.verify(tried).errors == seal.verify(oracle).errors
    if not any(torn for *_, torn in batches):
        assert seal.verify(tried).errors == []


def _open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")
def test_a_lock_held_elsewhere_is_waited_for_off_the_loop(tmp_path: Path) -> None:
    run = _new_run(tmp_path, "locked")
    ledger_writer.LedgerWriter(run).append(*_events("a", "match", "first"))
    before = (run / ledger.EVENTS_FILE).read_bytes()
    holder = os.open(run / ledger.EVENTS_FILE, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another writer (a worker process) is mid-append

    async def play() -> None:
        task = asyncio.create_task(
            ledger_writer.LedgerWriter(run).append_async(*_events("b", "match", "second"))
        )
        ticks = 0
        while not task.done() and ticks < 50:
            await asyncio.sleep(0)  # the loop runs on: the append waits on a thread
            ticks += 1
        assert not task.done()
        assert (run / ledger.EVENTS_FILE).read_bytes() == before
        os.close(holder)  # the other writer is done; the waiting append goes on
        await task

    asyncio.run(play())
    read = (run / ledger.EVENTS_FILE).read_bytes()
    assert read.startswith(before) and read.count(b"\n") == before.count(b"\n") + 2
    assert seal.verify(run).errors == []


class _GatedExecutor(concurrent.futures.ThreadPoolExecutor):
    """A loop's default executor whose jobs wait for `gate`: the test decides when the
    hop's thread runs, so a cancel lands while the hop is surely pending."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__(max_workers=1)
        self.gate = gate

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        def gated() -> Any:
            self.gate.wait()
            return fn(*args, **kwargs)

        return super().submit(gated)


def _cancel_an_append_at_its_hop(
    tmp_path: Path, executor: Callable[[threading.Event], concurrent.futures.Executor]
) -> None:
    """Cancel an append waiting on its hop, the loop's executor made by `executor(gate)` (the
    hop runs once `gate` is set): the line still lands once, the ledger's lock and both
    descriptors are let go."""
    run = _new_run(tmp_path, "cancelled")
    ledger_writer.LedgerWriter(run).append(*_events("a", "match", "first"))
    before = (run / ledger.EVENTS_FILE).read_bytes()
    gate = threading.Event()
    opened = _open_descriptors()

    async def play() -> None:
        asyncio.get_running_loop().set_default_executor(executor(gate))
        task = asyncio.create_task(
            ledger_writer.LedgerWriter(run).append_async(*_events("b", "no_match", "second"))
        )
        await asyncio.sleep(0)  # the task runs up to its hop, which waits for the gate
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Cancelled, and the hop still holds the line and both descriptors (and the lock).
        assert (run / ledger.EVENTS_FILE).read_bytes() == before
        gate.set()

    asyncio.run(play())  # waits for the executor: the hop runs to its end
    read = (run / ledger.EVENTS_FILE).read_bytes()
    assert read.startswith(before) and read.count(b"\n") == before.count(b"\n") + 2
    assert seal.verify(run).errors == []  # under a shared lock: it was let go
    assert _open_descriptors() <= opened


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")
def test_a_cancelled_wait_neither_loses_the_line_nor_leaks_a_descriptor(tmp_path: Path) -> None:
    _cancel_an_append_at_its_hop(tmp_path, _GatedExecutor)  # the hop's job is running


def _one_busy_thread(gate: threading.Event) -> concurrent.futures.Executor:
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    executor.submit(gate.wait)  # the one thread is taken: the hop's job is queued behind it
    return executor


@pytest.mark.timeout(HANG_GUARD_S)  # a regression's lock is never let go: it fails, never hangs
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")
def test_a_cancel_while_the_hop_is_queued_still_writes_and_lets_the_lock_go(
    tmp_path: Path,
) -> None:
    _cancel_an_append_at_its_hop(tmp_path, _one_busy_thread)


CROWD = """
import asyncio, concurrent.futures, sys
from pathlib import Path
from tests.test_ledger_append_async import _events, _new_run
from pytest_evalloop.ledger import writer as ledger_writer

run = _new_run(Path(sys.argv[1]), "crowded")

async def play():
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=2)
    )
    appends = []
    for i in range(1500):
        writer = ledger_writer.LedgerWriter(run)
        appends.append(asyncio.create_task(writer.append_async(*_events(f"q{i}", "match", "x"))))
        if i % 3 == 0:
            await asyncio.sleep(0)  # attempts end while others are still appending
    await asyncio.gather(*appends)

asyncio.run(play())
"""


def test_many_appends_at_once_on_one_loop_all_land(tmp_path: Path) -> None:
    """1,500 attempts appending on one loop as others end, with two threads to hop to: every
    line lands, chained. An append that waited for the ledger's lock on a thread could fill
    the pool while the lock's holder, another of the loop's appends, waited in the pool's
    queue for a thread to write on: the process hung (a 4,000-case bench run at concurrency
    128 did; this script did one time in three). In a child process, so a hang is a failure
    at the bound, not a stuck suite; a run that passes never waits on the bound."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", CROWD, str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "crowded"
    assert (run / ledger.EVENTS_FILE).read_bytes().count(b"\n") == 3000
    assert seal.verify(run).errors == []


def test_the_lock_holder_never_waits_behind_appends_waiting_for_it(tmp_path: Path) -> None:
    """Another writer holds the lock while two appends wait for it on the pool's two threads;
    it lets go and a third append starts on the loop at once. The third must not take the
    lock and then queue its write behind the two threads that wait for that very lock."""
    run = _new_run(tmp_path, "handover")
    holder = os.open(run / ledger.EVENTS_FILE, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)

    async def play() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=2))
        waiting = [
            asyncio.create_task(
                ledger_writer.LedgerWriter(run).append_async(*_events(q, "match", q))
            )
            for q in ("a", "b")
        ]
        for _ in range(20):
            await asyncio.sleep(0)
        os.close(holder)  # and at once, before the waiting threads wake:
        third = ledger_writer.LedgerWriter(run).append_async(*_events("c", "match", "c"))
        await asyncio.wait_for(asyncio.gather(third, *waiting), timeout=120)

    asyncio.run(play())
    assert (run / ledger.EVENTS_FILE).read_bytes().count(b"\n") == 6
    assert seal.verify(run).errors == []


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("held", [False, True], ids=["free", "held-then-freed"])
def test_an_append_when_no_thread_can_be_had_ends_on_the_loop(tmp_path: Path, held: bool) -> None:
    """The interpreter ending while attempts are in flight shuts the executor down: an append
    that wrote its chain entries then still writes its lines (here, on the loop), and one
    that found the lock taken appends as `append` does. Never entries without their lines."""
    run = _new_run(tmp_path, "ending")
    ledger_writer.LedgerWriter(run).append(*_events("a", "match", "first"))
    opened = _open_descriptors()

    async def play() -> None:
        closed = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        closed.shutdown()
        asyncio.get_running_loop().set_default_executor(closed)
        await ledger_writer.LedgerWriter(run).append_async(*_events("b", "match", "second"))

    if held:
        holder = os.open(run / ledger.EVENTS_FILE, os.O_RDONLY)
        fcntl.flock(holder, fcntl.LOCK_EX)
        # Freed before the loop's blocking wait: the wait itself is what is tried.
        threading.Timer(0, os.close, (holder,)).start()
    asyncio.run(play())
    assert (run / ledger.EVENTS_FILE).read_bytes().count(b"\n") == 4
    assert seal.verify(run).errors == []
    assert _open_descriptors() <= opened


@pytest.mark.parametrize("planted", ["symlink", "hardlink", "fifo", "directory"])
def test_an_artifact_is_never_written_through_what_was_planted_there(
    tmp_path: Path, planted: str
) -> None:
    """A link, a second name of a file outside the run, a pipe (whose open would stop the
    event loop until a reader came) or a directory where an artifact goes: refused with an
    error naming the file, and nothing outside the run changes, not even by truncation."""
    outside = tmp_path / "outside.json"
    outside.write_text("untouched")
    where = tmp_path / "run" / "artifacts" / "q1"
    where.mkdir(parents=True)
    target = where / "answer.json"
    if planted == "symlink":
        target.symlink_to(outside)
    elif planted == "hardlink":
        os.link(outside, target)
    elif planted == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    with pytest.raises(OSError, match="answer.json"):
        pipeline._write_artifacts([(target, b'{"answer": 1}')])
    assert outside.read_text() == "untouched"


def test_an_artifacts_directory_replaced_by_a_link_is_refused(tmp_path: Path) -> None:
    """`artifacts/` itself made a link to a directory outside the run: the fence refuses it
    (resolving both sides, it once compared the outside directory with itself)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "artifacts").symlink_to(outside, target_is_directory=True)
    case = Case.model_validate({"qid": "q1", "question": "How many?", "split": "dev"})
    attempt = pipeline.AttemptContext(
        run_dir=run, set_dir=tmp_path, case=case, sample=None, phase="baseline"
    )
    with pytest.raises(ValueError, match="symbolic link"):
        attempt.artifact_dir  # noqa: B018 -- the property is what is tried
    assert list(outside.iterdir()) == []


NAMES = st.sampled_from(
    [
        "EVALLOOP_T_TOKEN",
        "EVALLOOP_T_PLAIN",
        "EVALLOOP_T_URL",
        "PYTEST_CURRENT_TEST",
        "EVALLOOP_T_Key",
    ]
)
VALUES = st.sampled_from(
    [
        "tok-0123456789abcdef",
        "short",
        "svc://user123:pass-word-9@gateway",
        "svc://gateway/path",
        'quo"te-secret\\value',
        "tests/x.py::t (call)",
    ]
)
CHANGE = st.tuples(NAMES, st.one_of(st.none(), VALUES))  # None: the variable is removed


@settings(max_examples=80, deadline=None)
@given(changes=st.lists(CHANGE, max_size=12))
def test_remembered_credentials_are_those_a_fresh_scan_finds(
    changes: list[tuple[str, str | None]],
) -> None:
    names = {name for name, _ in changes}
    saved = {name: os.environ.get(name) for name in names}
    try:
        redaction.environment_secrets()  # whatever it remembered from before
        for name, value in changes:
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
            fresh = redaction._secrets_in(redaction.environ_snapshot())
            assert redaction.environment_secrets() == fresh
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=12))
def test_appends_at_once_go_out_whole_in_call_order_and_a_cancel_never_tears_one(
    tmp_path: Path, plan: list[tuple[int, bool]]
) -> None:
    """The appends queued while one is written go out together (a group commit): each is
    whole and in the order it was asked for, whatever was cancelled and when. An append that
    returned is in the file; a cancelled one is there whole or not at all."""
    import json

    run = _new_run(tmp_path / f"r{os.urandom(6).hex()}", "crowd")

    async def play() -> list[Any]:
        tasks = []
        for i, (yields, _) in enumerate(plan):
            writer = ledger_writer.LedgerWriter(run)
            events = _events(f"q{i}", "match", "x" * i)
            tasks.append(asyncio.create_task(writer.append_async(*events)))
            for _ in range(yields):
                await asyncio.sleep(0)
        for task, (_, cancel) in zip(tasks, plan, strict=True):
            if cancel:
                task.cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = asyncio.run(play())
    events = run / ledger.EVENTS_FILE
    lines = events.read_bytes().splitlines() if events.exists() else []
    qids = [json.loads(line)["qid"] for line in lines]
    written = qids[0::2]
    assert qids[1::2] == written  # each append's two lines together
    assert written == sorted(written, key=lambda q: int(q[1:])) and len(set(written)) == len(
        written
    )
    returned = {f"q{i}" for i, outcome in enumerate(outcomes) if outcome is None}
    assert returned <= set(written)
    assert all(
        isinstance(outcome, asyncio.CancelledError)
        for i, outcome in enumerate(outcomes)
        if f"q{i}" not in returned
    )
    assert seal.verify(run).errors == []


def test_a_write_that_fails_fails_every_append_it_took(tmp_path: Path) -> None:
    run = _new_run(tmp_path, "broken")
    (run / seal.CHAIN_FILE).unlink(missing_ok=True)
    (run / seal.CHAIN_FILE).mkdir()  # no chain can be written: every append must say so

    async def play() -> list[Any]:
        appends = [
            ledger_writer.LedgerWriter(run).append_async(*_events(f"q{i}", "match", "x"))
            for i in range(4)
        ]
        return await asyncio.gather(*appends, return_exceptions=True)

    outcomes = asyncio.run(play())
    assert all(isinstance(outcome, OSError | ValueError) for outcome in outcomes), outcomes
    assert (run / ledger.EVENTS_FILE).read_bytes() == b""


def test_the_close_waits_for_the_write_of_an_append_cancelled_at_its_hop(tmp_path: Path) -> None:
    """Found by the hostile pass: `-x` cancelled an attempt whose lines were being written;
    the close counted the ledger before they landed and sealed them after, so run.json's
    totals were fewer than the sealed ledger's attempts. `writes_done` holds the close until
    every write under way has ended."""
    run = _new_run(tmp_path, "closing")
    gate = threading.Event()

    async def play() -> None:
        try:
            await closing_waits()
        finally:
            gate.set()  # a failed check must not leave the hop waiting for ever

    async def closing_waits() -> None:
        asyncio.get_running_loop().set_default_executor(_GatedExecutor(gate))
        task = asyncio.create_task(
            ledger_writer.LedgerWriter(run).append_async(*_events("b", "no_match", "x"))
        )
        await asyncio.sleep(0)  # up to its hop, which waits for the gate
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        closing = asyncio.create_task(ledger_writer.writes_done())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not closing.done()  # the write is still under way: the close waits
        assert (
            not (run / ledger.EVENTS_FILE).exists() or not (run / ledger.EVENTS_FILE).read_bytes()
        )
        gate.set()
        await closing
        # What the close reads now is what the seal will cover.
        assert (run / ledger.EVENTS_FILE).read_bytes().count(b"\n") == 2

    asyncio.run(play())
    assert seal.verify(run).errors == []
