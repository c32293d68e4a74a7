"""A run's own files are regular files its writer made, or they are refused before a byte is read.

A name in a run directory can be anything on disk: a directory, a named pipe (whose open waits
for a writer that never comes, and whose read waits for bytes that never come), a device, a
socket, a symbolic link (dangling; to a file under /proc, which states 0 bytes and reads a
process's environment; out of the run, where an append would land in someone else's file). None
of them is a ledger, so every read and every write of `run.json`, `events.jsonl`,
`events.chain` and `seal.json` goes through here: each such file is refused by what it is, with
its path and what to do, and the writer never opens one either. Looking is `lstat` (never
following a link, never opening a pipe); opening is `O_NOFOLLOW | O_NONBLOCK`, then `fstat` on
what was opened, so a file swapped for a pipe between the look and the open is refused too,
never waited on.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO

# A run directory's names. Here, not beside the models that read them: pytest's collection asks
# of every folder whether it is a run (`items.is_run_dir`), and reads none.
RUN_FILE = "run.json"
EVENTS_FILE = "events.jsonl"
ARTIFACTS_DIR = "artifacts"

CHAIN_FILE = "events.chain"
"""One fixed-width entry per line of events.jsonl: `<16 hex chain value> <12-digit end offset>`."""
SEAL_FILE = "seal.json"
"""A closed run's sidecar: a digest per run.json key and per artifact file."""
LEDGER_FILES = (RUN_FILE, EVENTS_FILE, CHAIN_FILE, SEAL_FILE)
"""What a run directory's record is made of: each is a regular file, when it is there at all."""

FIX = (
    "a run's ledger files are regular files its writer made: put the run's own file back "
    "(from a copy of the run) or run it again"
)
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class LedgerFileError(OSError, ValueError):
    """A ledger file that is there but is not a regular file this user can read.

    Both an OSError (readers that treat an unreadable file as "cannot be read" catch that) and
    a ValueError (every command line turns one into a line on stderr and its usage status).
    """


def problem(path: Path) -> str | None:
    """What makes `path` no ledger file, in words after "<path> is", or None when it is a
    regular file this user can open, or is not there at all (each caller says what a missing
    file means: a missing chain is a warning, a missing run.json no run)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"a path that cannot be examined ({exc.strerror}); {FIX}"
    if stat.S_ISLNK(mode):
        # A link is refused wherever it points: the writer would append through it, out of
        # the run, and a reader would read what no writer wrote (a /proc file, a stranger's).
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        gone = "" if os.path.exists(path) else ", which does not exist"
        return f"a symbolic link (to {target}{gone}), not the run's own file; {FIX}"
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "a special file")
        return f"{kind}, not a regular file; {FIX}"
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as exc:
        # A mode of 000, say; root opens it anyway, so this is only ever another user's case.
        return f"a file this user cannot open ({exc.strerror}); give it read access (chmod u+r)"
    return None


def refusal(path: Path) -> str | None:
    """`problem` as one sentence naming the file, or None."""
    found = problem(path)
    return f"{path} is {found}" if found else None


def run_refusals(run_dir: Path) -> list[tuple[Path, str]]:
    """Each ledger file of `run_dir` that is refused, with its `problem`: asked before a run is
    read at all, so a run with one such file is refused whole, up front."""
    found = ((run_dir / name, problem(run_dir / name)) for name in LEDGER_FILES)
    return [(path, what) for path, what in found if what]


def refusal_lines(run_dir: Path) -> list[str]:
    """`run_refusals` as sentences naming each file: what a command prints before it stops."""
    return [f"{path} is {what}" for path, what in run_refusals(run_dir)]


def not_a_run(run_dir: Path) -> str | None:
    """Why a command given `run_dir` as a run refuses it before reading: it holds no run.json
    at all, or a ledger file is refused (`refusal_lines`); None when it can be read."""
    if not os.path.lexists(run_dir / RUN_FILE):
        return f"{run_dir} has no run.json; give a run directory (<set>/runs/<runId>)"
    return "; ".join(refusal_lines(run_dir)) or None


def open_regular(
    path: Path, flags: int = os.O_RDONLY, mode: int = 0o644, *, shared_ok: bool = False
) -> int:
    """`os.open` for a ledger file: refused (LedgerFileError) unless what opens is a regular
    file, and, opened to write, one no other name shares (a hard link: `shared_ok` for a lock
    file, whose bytes nobody reads). A file that is not there raises FileNotFoundError, as
    `os.open` does (with `os.O_CREAT` in `flags` it is made)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise LedgerFileError(refusal(path) or f"{path} cannot be opened; {FIX}") from None
        raise
    except OSError as exc:
        # ELOOP (a link), EISDIR, ENXIO (a pipe nobody reads, opened to write), EACCES.
        found = refusal(path) or f"{path} cannot be opened ({exc.strerror}); {FIX}"
        raise LedgerFileError(found) from None
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        raise LedgerFileError(refusal(path) or f"{path} is not a regular file; {FIX}")
    if flags & (os.O_WRONLY | os.O_RDWR) and opened.st_nlink > 1 and not shared_ok:
        # A copy made with hard links (`cp -al`, `ln`): a line written here would land in the
        # other run too, and break its chain.
        os.close(fd)
        raise LedgerFileError(
            f"{path} has {opened.st_nlink} hard links: another run shares this file, and "
            "writing to it would change that run too; copy a run with `cp -a`, not `cp -al`"
        )
    # Non-blocking was only for the open (a pipe's open would wait); a regular file ignores it.
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def write_whole(fd: int, data: bytes) -> None:
    """All of `data` out through `fd`: a regular file takes it in one write, but a signal may
    still cut one short."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def open_binary(path: Path) -> BinaryIO:
    """A ledger file opened to read, buffered (for reading it line by line)."""
    return os.fdopen(open_regular(path), "rb")


def read_bytes(path: Path) -> bytes:
    """A ledger file's bytes."""
    with open_binary(path) as handle:
        return handle.read()


def read_text(path: Path) -> str:
    """A ledger file's text (UTF-8)."""
    return read_bytes(path).decode("utf-8")


def artifact_bytes(path: str | os.PathLike[str]) -> bytes | None:
    """The bytes of a run's artifact, or None when it is not one: not there, unreadable, or not
    a regular file of the run (a pipe would make the reader wait for ever, a link would bring
    in a file no writer of the run wrote and no seal covers)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder, a pipe, a socket, a device
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as handle:
        try:
            return handle.read()
        except OSError:
            return None


def json_bytes(text: str) -> bytes:
    """JSON text as the UTF-8 bytes a file holds.

    A lone surrogate (half a UTF-16 pair: a model's reply may escape one, `"\\ud83d"`, and
    json.loads gives it back as is) has no UTF-8 form, and writing it failed the attempt. Inside
    a JSON string it goes as its own escape, which reads back as the same text."""
    return text.encode("utf-8", "backslashreplace")
