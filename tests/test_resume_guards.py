"""`--eval-resume` against what a kill leaves and what another live session is writing.

A kill between the chain's fsync and the lines' write leaves entries for lines never written:
resume drops exactly that append and no more (`seal.drop_unwritten`). A run another session
is writing now is never adopted (`session.claims`): two sessions appending to one ledger would
answer and score the same cases twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import seal, writer
from pytest_evalloop.session.claims import WriterClaims, written_elsewhere
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from pytest_evalloop.testing.policies import FakeRequest, Outcome
from tests.conftest import HANG_GUARD_S
from tests.test_gate import QIDS, Held, questions, run, script, spawn_pytest
from tests.test_run import make_set

# --- the kill window, unit by unit ------------------------------------------------------------

_line = st.binary(min_size=0, max_size=40).map(lambda b: b.replace(b"\n", b"_"))
_batches = st.lists(st.lists(_line, min_size=1, max_size=4), min_size=0, max_size=6)


def _ledger(tmp: Path, batches: list[list[bytes]]) -> Path:
    """A run directory written the way the writer writes: each append's entries chained and
    synced, then its lines."""
    run_dir = tmp / f"run{len(list(tmp.iterdir()))}"
    run_dir.mkdir()
    (run_dir / ledger.RUN_FILE).write_text(json.dumps({"status": "running"}))
    (run_dir / ledger.EVENTS_FILE).write_bytes(b"")
    for batch in batches:
        _append(run_dir, batch)
    return run_dir


def _append(run_dir: Path, batch: list[bytes], *, lines_too: bool = True) -> None:
    events = run_dir / ledger.EVENTS_FILE
    payload = b"".join(line + b"\n" for line in batch)
    seal.append_entries(run_dir, payload, events.stat().st_size)
    if lines_too:
        with open(events, "ab") as handle:
            handle.write(payload)


@settings(max_examples=60, deadline=None)
@given(batches=_batches, last=st.lists(_line, min_size=1, max_size=4))
def test_a_kill_after_the_chains_fsync_is_dropped_and_the_run_verifies(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[bytes]], last: list[bytes]
) -> None:
    run_dir = _ledger(tmp_path_factory.mktemp("kill"), batches)
    _append(run_dir, last, lines_too=False)  # killed between the chain's fsync and the lines
    assert seal.verify(run_dir).errors  # as it was: refused as cut
    assert seal.drop_unwritten(run_dir) == len(last)
    check = seal.verify(run_dir)
    assert check.errors == [] and check.chained
    # And the writer goes on from there: the next append chains on.
    _append(run_dir, [b'{"kind": "attempt"}'])
    assert seal.verify(run_dir).errors == []


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.lists(_line, min_size=1, max_size=4), min_size=2, max_size=6),
    cut=st.integers(min_value=1, max_value=20),
)
def test_lines_cut_by_hand_beyond_the_last_append_are_still_refused(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[bytes]], cut: int
) -> None:
    run_dir = _ledger(tmp_path_factory.mktemp("cut"), batches)
    events = run_dir / ledger.EVENTS_FILE
    lines = events.read_bytes().split(b"\n")[:-1]
    cut = min(cut, len(lines))
    events.write_bytes(b"".join(line + b"\n" for line in lines[: len(lines) - cut]))
    dropped = seal.drop_unwritten(run_dir)
    if cut == len(batches[-1]):
        # Exactly the last append's lines: the same bytes a kill leaves, the one cut let through.
        assert dropped == cut and seal.verify(run_dir).errors == []
    else:
        assert dropped == 0
        assert any("are gone" in e for e in seal.verify(run_dir).errors)
        # Nor does the writer's next append (a review, a live session's next case) wipe it.
        _append(run_dir, [b'{"kind": "review"}'])
        assert seal.verify(run_dir).errors


def test_a_cut_mid_line_and_a_chain_without_marks_are_left_to_verify(tmp_path: Path) -> None:
    run_dir = _ledger(tmp_path, [[b"one", b"two"], [b"three", b"four"]])
    events = run_dir / ledger.EVENTS_FILE
    whole = events.read_bytes()
    events.write_bytes(whole[:-3])  # into the last line
    assert seal.drop_unwritten(run_dir) == 0
    assert seal.verify(run_dir).errors
    events.write_bytes(whole[: whole.index(b"three")])  # the last append's lines, whole
    chain = run_dir / seal.CHAIN_FILE
    marked = chain.read_bytes()
    # A chain written before appends were marked: nothing tells a kill from a cut there.
    chain.write_bytes(marked.replace(seal.BATCH_MARK.encode(), b" "))
    assert seal.drop_unwritten(run_dir) == 0
    chain.write_bytes(marked)
    assert seal.drop_unwritten(run_dir) == 2
    assert seal.verify(run_dir).errors == []


def test_a_claim_is_seen_until_it_is_released(tmp_path: Path) -> None:
    assert not written_elsewhere(tmp_path)
    first, second = WriterClaims(), WriterClaims()
    first.claim(tmp_path)
    second.claim(tmp_path)  # the session's other processes share it
    first.claim(tmp_path)  # again: nothing more
    assert written_elsewhere(tmp_path)
    first.release()
    assert written_elsewhere(tmp_path)
    second.release()
    assert not written_elsewhere(tmp_path)
    # The claim is the directory's own lock: no file in it can be removed to drop it.
    first.claim(tmp_path)
    for found in tmp_path.iterdir():
        found.unlink()
    assert written_elsewhere(tmp_path)
    first.release()


def test_a_second_ctrl_c_while_the_first_is_reported_ends_the_close_at_once(
    tmp_path: Path,
) -> None:
    worker, controller = WriterClaims(), WriterClaims()
    worker.claim(tmp_path)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    controller.hold_interrupts()  # pytest_keyboard_interrupt: the first Ctrl-C is reported
    try:
        signal.raise_signal(signal.SIGINT)  # the second: kept, not raised into the report
        assert controller.interrupted_again
        said: list[float] = []
        # No wait and no notice for a Ctrl-C already pressed: the clock is never read twice.
        ticks = iter([0.0])
        assert not controller.closing(tmp_path, clock=lambda: next(ticks), on_wait=said.append)
        assert said == []
    finally:
        controller.release()
        worker.release()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_a_close_waits_for_the_sessions_other_processes_then_gives_up(tmp_path: Path) -> None:
    worker, controller = WriterClaims(), WriterClaims()
    worker.claim(tmp_path)
    ticks = iter(range(1000))
    said: list[float] = []
    # A clock the test moves: one tick a look, so the wait ends after `wait` looks.
    assert not controller.closing(
        tmp_path, wait=3, clock=lambda: float(next(ticks)), on_wait=said.append
    )
    assert said == [3]  # the wait is announced once, with its length
    worker.release()
    assert controller.closing(
        tmp_path, wait=3, clock=lambda: float(next(ticks)), on_wait=said.append
    )
    assert said == [3]  # no wait, no notice
    assert written_elsewhere(tmp_path)  # held alone until released
    controller.release()


@pytest.mark.timeout(HANG_GUARD_S)  # a regression reads /dev/zero forever: it fails, never hangs
def test_odd_artifacts_are_sealed_and_checked_without_an_error_or_a_hang(tmp_path: Path) -> None:
    run_dir = _ledger(tmp_path, [[b"one"]])
    odd = os.fsencode(run_dir / ledger.ARTIFACTS_DIR) + b"/q\xff"
    os.makedirs(odd)
    with open(odd + b"/a\xfe.json", "wb") as handle:
        handle.write(b"{}")
    writer.seal_run(run_dir)
    assert seal.verify(run_dir).errors == []  # a name that is not UTF-8 seals as its bytes
    with open(odd + b"/a\xfe.json", "wb") as handle:
        handle.write(b"{1}")
    assert any("changed" in e for e in seal.verify(run_dir).errors)
    os.unlink(odd + b"/a\xfe.json")
    os.symlink("/dev/zero", odd + b"/a\xfe.json")  # swapped for a link to an endless device
    name = (odd + b"/a\xfe.json").decode("utf-8", "surrogateescape")
    assert seal._file_sha(name) == seal._NOT_A_FILE
    assert seal.verify(run_dir).errors


# --- end to end: a live session, then its kill -------------------------------------------------


class Announced(Held):
    """`Held`, and `reached` is set when the first held case's first call comes in: the
    session that sent it is alive and holds the run (it opened it before its first case), and
    with one case at a time the cases before it are scored."""

    def __init__(self, inner: Any, held: set[str], release: threading.Event) -> None:
        super().__init__(inner, held, release)
        self.reached = threading.Event()

    def __call__(self, request: FakeRequest) -> Outcome:
        outcome = super().__call__(request)
        if getattr(outcome, "held_until", None) is self.release:
            self.reached.set()
        return outcome


@dataclasses.dataclass
class HeldSession:
    """A session of the shop set in a child process whose fourth case and later wait for the
    test's `release`: alive, with three scored, for as long as the test needs it."""

    shop: Path
    spec: ScriptSpec
    policy: Announced
    proc: subprocess.Popen[str]
    run_dir: Path

    @property
    def events(self) -> Path:
        return self.run_dir / ledger.EVENTS_FILE

    @property
    def release(self) -> threading.Event:
        return self.policy.release

    def wait_for_a_held_case(self) -> None:
        """Until a held case's first call reached the fake (the policy's event, bounded)."""
        assert self.policy.reached.wait(180), "no held case reached the fake endpoint"

    def end(self) -> None:
        """Kill what is left of it (its workers too), then let the held replies go."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.release.set()


def held_session(
    pytester: pytest.Pytester, fake: FakeAnthropic, label: str, *args: str, stdout: Any = None
) -> HeldSession:
    shop = make_set(pytester.path, QIDS)
    spec = script(shop, set())
    asked = questions(shop)
    policy = Announced(spec.policy(), {asked[q] for q in QIDS[3:]}, threading.Event())
    fake.policy = policy
    proc = spawn_pytest(
        pytester.path,
        shop,
        "--eval-concurrency=1",
        f"--eval-label={label}",
        *args,
        stdout=stdout if stdout is not None else subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return HeldSession(shop, spec, policy, proc, shop / "runs" / label)


def resumes_whole(pytester: pytest.Pytester, fake: FakeAnthropic, live: HeldSession) -> None:
    """`--eval-resume` finishes the run: every case scored once, the ledger whole."""
    fake.policy = live.spec.policy()
    resumed = run(pytester, live.shop, f"--eval-resume={live.run_dir.name}")
    assert resumed.ret == 0, resumed.stdout.str() + resumed.stderr.str()
    read = ledger_reader.read_run(live.run_dir)
    assert read.errors == []
    assert sorted(s.qid for s in read.of_kind("score")) == sorted(QIDS)
    assert read.info is not None and read.info.status == "complete"
    assert seal.verify(live.run_dir).errors == []


def test_a_run_being_written_is_not_resumed_and_its_kill_window_is(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    live = held_session(pytester, fake, "live")
    try:
        live.wait_for_a_held_case()
        second = run(pytester, live.shop, "--eval-resume=live")
        assert second.ret == pytest.ExitCode.USAGE_ERROR, second.stdout.str()
        said = " ".join((second.stdout.str() + second.stderr.str()).split())
        assert "live is being written by another session now" in said
        assert live.events.read_text().count('"kind": "score"') == 3  # nothing answered twice
    finally:
        live.end()
    # Killed between the chain's fsync and the lines' write of one more case's append.
    line = json.dumps({"kind": "attempt", "qid": QIDS[3], "note": "never written"}).encode()
    seal.append_entries(live.run_dir, line + b"\n", live.events.stat().st_size)
    resumes_whole(pytester, fake, live)


def test_a_controller_stopped_alone_leaves_its_workers_run_open_to_resume(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    live = held_session(pytester, fake, "alone", "-n", "2", stdout=subprocess.PIPE)
    try:
        # A worker waits on a held reply: it holds its claim on the run.
        live.wait_for_a_held_case()
        # ... and the controller has heard of the run: an item's report reached it (its
        # progress dot). Under -n 2 a worker may reach a held case first, before any report
        # of the other's arrived; stopped then, the controller knows of no run to wait for.
        assert live.proc.stdout is not None
        said = ""
        while "." not in said.rsplit("bringing up nodes...", 1)[-1]:
            char = live.proc.stdout.read(1)
            assert char, f"the session ended before any item was reported: {said}"
            said += char
        os.kill(live.proc.pid, signal.SIGINT)  # the controller only, not its workers
        # The close waits for the workers (up to claims.CLOSE_WAIT_SECONDS; its expiry is the
        # fake-clock test above) and says so; a second Ctrl-C ends the wait.
        for line in live.proc.stdout:
            said += line
            if "press Ctrl-C again to leave it open for --eval-resume" in line:
                break
        assert "evalloop: waiting up to 10 s for this session's other processes" in said, said
        os.kill(live.proc.pid, signal.SIGINT)
        assert live.proc.wait(timeout=180) == 8  # the run did not finish
        info = json.loads((live.run_dir / ledger.RUN_FILE).read_text())
        # Not sealed over a worker still appending: left running for a resume.
        assert info["status"] == "running" and "seal" not in info
    finally:
        live.end()
    resumes_whole(pytester, fake, live)
