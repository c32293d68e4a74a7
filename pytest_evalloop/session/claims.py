"""Which live process writes a run: a session's claim on its run directories.

Two sessions appending to one ledger answer and score the same cases twice, and both exit 0.
So each process of a session holds the runs it writes (`WriterClaims`), and `--eval-resume`
from another session asks whether any live process does (`written_elsewhere`) before it adopts
a run. The claim is an advisory lock, shared, on the run's `.writing.lock`: the kernel drops it
with the process that held it, a kill included, so a crashed run is never left claimed.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from pytest_evalloop.ledger import files

WRITING_FILE = ".writing.lock"
"""In a run directory: held (a shared lock) by each process of the session writing the run."""


class WriterClaims:
    """The runs this process appends to, each held by a shared lock on its `.writing.lock`
    until `release`. Another session's `--eval-resume` asks for that lock exclusively and is
    refused while any process of the writing session holds it: two sessions appending to one
    ledger would answer and score the same cases twice. A lock goes with the process that
    held it, a kill included, so a crashed run is never left claimed."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}

    def claim(self, run_dir: Path) -> None:
        """Hold `run_dir` for this process (again: nothing more)."""
        if run_dir in self._fds:
            return
        fd = files.open_regular(run_dir / WRITING_FILE, os.O_RDWR | os.O_CREAT, shared_ok=True)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        self._fds[run_dir] = fd

    def closing(self, run_dir: Path) -> bool:
        """Hold `run_dir` alone while it is closed and sealed (this process's own claim made
        exclusive, or a new one): False when another process still holds it, a worker still
        appending after the controller alone was interrupted. Kept until `release`."""
        fd = self._fds.get(run_dir)
        if fd is None:
            fd = files.open_regular(run_dir / WRITING_FILE, os.O_RDWR | os.O_CREAT, shared_ok=True)
            self._fds[run_dir] = fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        """Let every claimed run go (the session stopped writing them)."""
        while self._fds:
            os.close(self._fds.popitem()[1])


def written_elsewhere(run_dir: Path) -> bool:
    """Whether a live process holds `run_dir`'s writer claim (`WriterClaims`)."""
    path = run_dir / WRITING_FILE
    if not os.path.lexists(path):
        return False
    fd = files.open_regular(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # the lock, when it was had, goes with the descriptor
    return False
