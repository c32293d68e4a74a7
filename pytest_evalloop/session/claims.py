"""Which live process writes a run: a session's claim on its run directories.

Two sessions appending to one ledger answer and score the same cases twice, and both exit 0.
So each process of a session holds the runs it writes (`WriterClaims`), and `--eval-resume`
from another session asks whether any live process does (`written_elsewhere`) before it adopts
a run. The claim is an advisory lock, shared, on the run directory itself: no file in it can be
deleted or swapped to drop the claim, and the kernel drops it with the process that held it, a
kill included, so a crashed run is never left claimed. Resumes of one run take their turn
(`resuming`), so two started at once cannot both find it unclaimed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pytest_evalloop.ledger import files

RESUME_FILE = ".resume.lock"
"""In a run directory: held while a session checks and adopts the run (`resuming`)."""

CLOSE_WAIT_SECONDS = 10.0
"""How long a close waits for the session's other processes to let a run go (a worker ending
on Ctrl-C); xdist gives its workers as long to exit."""


def _open_dir(run_dir: Path) -> int:
    return os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


class WriterClaims:
    """The runs this process appends to, each held by a shared lock on the run directory until
    `release`. Another session's `--eval-resume` asks for it exclusively and is refused while
    any process of the writing session holds it."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        self.interrupted_again = False
        """A second Ctrl-C came while the first was being reported (`hold_interrupts`): the
        close does not wait for other processes then."""

    def hold_interrupts(self) -> None:
        """After a first Ctrl-C, keep a second one for the close instead of raising it into
        pytest's report of the first (a double tap landed there: a traceback, status -2, and
        then the close's full wait for the Ctrl-C already pressed). Only on the main thread,
        and only over Python's default handler (one the user or another plugin set stays
        theirs); `release` gives the default back."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._again)

    def interrupt_again(self) -> None:
        """A second Ctrl-C came while the first was acted on: the close waits no more."""
        self.interrupted_again = True

    def _again(self, signum: int, frame: Any) -> None:
        self.interrupt_again()

    def claim(self, run_dir: Path) -> None:
        """Hold `run_dir` for this process (again: nothing more)."""
        if run_dir in self._fds:
            return
        fd = _open_dir(run_dir)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        self._fds[run_dir] = fd

    def closing(
        self,
        run_dir: Path,
        wait: float = CLOSE_WAIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        on_wait: Callable[[float], None] | None = None,
    ) -> bool:
        """Hold `run_dir` alone while it is closed and sealed (this process's own claim made
        exclusive, or a new one), waiting up to `wait` seconds for other processes to let it
        go: False when one still holds it then (a worker still appending after the controller
        alone was stopped). `on_wait(wait)` is called once, when the wait begins (a person
        at the terminal should know why the session has not ended). Kept until `release`."""
        fd = self._fds.get(run_dir)
        if fd is None:
            fd = self._fds[run_dir] = _open_dir(run_dir)
        deadline = clock() + wait
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    if self.interrupted_again or clock() >= deadline:
                        return False
                if on_wait is not None:
                    on_wait(wait)
                    on_wait = None
                time.sleep(0.05)
        except KeyboardInterrupt:
            return False  # a second Ctrl-C ends the wait: the run is left open, not sealed

    def holding(self) -> bool:
        """Whether this process still holds a run (`release` not called since its claim)."""
        return bool(self._fds)

    def release(self) -> None:
        """Let every claimed run go (the session stopped writing them), and Ctrl-C back to
        Python's default handler if `hold_interrupts` took it."""
        while self._fds:
            os.close(self._fds.popitem()[1])
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) == self._again
        ):
            signal.signal(signal.SIGINT, signal.default_int_handler)


def written_elsewhere(run_dir: Path) -> bool:
    """Whether a live process holds `run_dir`'s writer claim (`WriterClaims`)."""
    fd = _open_dir(run_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # the lock, when it was had, goes with the descriptor
    return False


@contextlib.contextmanager
def resuming(run_dir: Path) -> Iterator[None]:
    """One resume of `run_dir` at a time, from its check to its claim."""
    fd = files.open_regular(run_dir / RESUME_FILE, os.O_RDWR | os.O_CREAT, shared_ok=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
