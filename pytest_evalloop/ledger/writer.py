"""Writing a run directory: `events.jsonl` appended under a lock, `run.json` replaced whole.

Crash safety lives here: an event line goes out in one `write` under an exclusive `flock` and is
fsynced, a torn tail left by a kill is sealed before the next line, and `run.json` is written
to a temp file, fsynced and renamed. Every line is built by the contract (`ledger.strict_dump`)
and passes the one redaction on its way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import os
import re
import stat
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

from pydantic import BaseModel

from pytest_evalloop.ledger import files
from pytest_evalloop.ledger import seal as ledger_seal
from pytest_evalloop.ledger.contract import (
    EVENTS_FILE,
    RUN_FILE,
    LedgerWriteError,
    RunInfo,
    now_iso,
    strict_dump,
)
from pytest_evalloop.model_api.redaction import redact


def contained_dir(root: Path, name: str) -> Path:
    """`root / name`, refused (ValueError) unless it is a direct child of `root` on disk too.

    Collection already refuses qids outside `sets.QID_PATTERN`; this is the second fence, at the
    one place artifact paths are built, so a name that slipped through (`..`, `/`, NUL, an
    absolute path, a symlink planted under `root`) can never make a write land outside the run.
    """
    if not name or "\0" in name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"{name!r} cannot name a directory under {root}")
    path = root / name
    try:
        planted = stat.S_ISLNK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return path  # made here, by the caller: a plain child of `root`
    except OSError:
        planted = True  # asked again the long way below, which says what is wrong
    # A name that is no link is a child of `root` wherever `root` itself leads: only a link
    # needs both sides resolved (each a walk of every folder above it, per attempt).
    if not planted:
        return path
    try:
        inside = path.resolve().parent == root.resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links (RuntimeError before 3.13)
        raise ValueError(f"{path} cannot be resolved ({exc}); refusing to write there") from None
    if not inside:
        raise ValueError(f"{root / name} resolves outside {root}; refusing to write there")
    return path


class LedgerWriter:
    """Appends events to one run's `events.jsonl`: one complete line per event, never rewritten.

    Safe across processes (xdist workers append to the same file): each line goes out in a
    single `write` under an exclusive `flock`, then is fsynced, so a kill at any moment leaves
    every earlier line whole.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / EVENTS_FILE
        run_dir.mkdir(parents=True, exist_ok=True)

    def append(self, *events: BaseModel) -> None:
        """Validate and append events in one locked write."""
        payload = self._payload(events)
        if payload:
            self._append_payload(payload)

    async def append_async(self, *events: BaseModel) -> None:
        """`append` from an event loop: the same lines, lock, chain, order and fsyncs.

        Why: a thread's every system call gives the interpreter lock back and must wait to
        take it again from the busy loop (two context switches, often more). Run on a thread,
        an append's twenty calls cost more CPU than the append itself (measured at 500 cases:
        about 40 switches an attempt). Here the loop makes the quick calls itself (open, lock,
        the chain's entries) and hands a thread only what waits on the disk: the chain's fsync,
        the line's write and its fsync, in that order, in one hop. The lock is taken without
        waiting; when another writer holds it (another process, or a thread appending with
        `append`), the whole append waits for it on a thread, as `append` does.

        The loop's own appends to one ledger go one at a time (`_LoopAppends`): an append
        waiting on a thread for the lock another of the loop's appends held would take a
        thread the holder's write then waited for, and with every thread so taken the run
        hung (a 4,000-case run at concurrency 128 did). The appends that queue while one is
        written go out together in the next (a group commit): one by one, each waited for
        every hop before it, and an attempt spent 50-150 ms waiting to be written (measured
        at 500 cases, concurrency 64: the ledger's lock busy 40% of the run). Each append
        still returns only once its own lines are durable; lines and their order are as if
        written one append at a time.
        """
        payload = self._payload(events)
        if not payload:
            return
        group = _LoopAppends.of(self.path)
        mine = _Queued(payload, asyncio.get_running_loop().create_future())
        group.queue.append(mine)
        try:
            async with group.lock:
                if mine in group.queue:  # no earlier append took it: this one writes the queue
                    batch = group.queue[:]
                    group.queue.clear()
                    # A task: cancelling this append ends its wait, never the write, which
                    # settles every append it took when it ends.
                    write = asyncio.ensure_future(
                        self._append_now(b"".join(queued.payload for queued in batch))
                    )
                    write.add_done_callback(functools.partial(_settle, batch))
                    group.writing.add(write)  # kept, so it runs to its end (`writes_done`)
                    write.add_done_callback(group.writing.discard)
                    # Waited for, not raised here: its error reaches this append as it
                    # reaches every other one it took, through `done`.
                    await asyncio.wait({write})
        except asyncio.CancelledError:
            if mine in group.queue:
                group.queue.remove(mine)  # taken by no write: never written
            raise
        await asyncio.shield(mine.done)

    async def _append_now(self, payload: bytes) -> None:
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            await _hop(self._append_payload, payload)
            return
        except BaseException:
            os.close(fd)
            raise
        try:
            chain = self._chain(fd, payload)
        except BaseException:
            os.close(fd)
            raise
        # The thread owns both descriptors from here (it closes them): a cancelled wait
        # must not close a descriptor the thread is still writing through.
        await _hop(_finish, fd, chain, payload)

    def _append_payload(self, payload: bytes) -> None:
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            chain = self._chain(fd, payload)
        except BaseException:
            os.close(fd)
            raise
        _finish(fd, chain, payload)

    @staticmethod
    def _payload(events: Sequence[BaseModel]) -> bytes:
        if not events:
            return b""
        stamp = now_iso()
        lines = []
        for event in events:
            if getattr(event, "at", "set") is None:
                event.at = stamp  # type: ignore[attr-defined]
            lines.append(json.dumps(strict_dump(event), ensure_ascii=False, sort_keys=False))
        # Every line passes the one redaction: error text may carry an echoed credential.
        return files.json_bytes(redact("\n".join(lines)) + "\n")

    def _open(self) -> int:
        # Never through a link or into a pipe (whose open would wait for a reader): `files`.
        # Read too: the torn-tail check reads the last byte through the same descriptor.
        return files.open_regular(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT)

    def _chain(self, fd: int, payload: bytes) -> int | None:
        """Under the lock: seal a torn tail, then write (not yet sync) the payload's chain
        entries. Returns the chain's descriptor for `_finish`, or None for an unchained run."""
        # A run killed mid-write (by something stronger than us) may have left a partial last
        # line; ending it keeps our new line intact, and validate still reports the torn one.
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.write(fd, b"\n")
            size += 1
        return ledger_seal.write_entries(self.run_dir, payload, size)


async def _hop(work: Callable[..., None], *args: Any) -> None:
    """`work(*args)` on a thread of the loop's executor, or here when none can be had.

    An executor that is shut down (the interpreter ending while attempts were in flight)
    refuses new work: the chain's entries are written by then, and entries left without their
    lines would make the run look cut by hand. So the append ends here, as `append` would."""
    loop = asyncio.get_running_loop()
    try:
        done = loop.run_in_executor(None, work, *args)
    except RuntimeError:
        work(*args)
        return
    # Shielded: a cancel (the session stopping with attempts in flight) ends the wait, never
    # the work. A queued job whose future was cancelled never ran, and its append kept the
    # ledger's lock and its chain entries for good: the session's own close then waited on
    # that lock for ever.
    await asyncio.shield(done)


@dataclass(eq=False)
class _Queued:
    """One append waiting to be written, and what its writer settles when it is."""

    payload: bytes
    done: asyncio.Future[None]


@dataclass
class _LoopAppends:
    """A loop's appends to one ledger: one written at a time, the rest queued for the next."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queue: list[_Queued] = field(default_factory=list)
    writing: set[asyncio.Future[None]] = field(default_factory=set)

    @classmethod
    def of(cls, path: Path) -> _LoopAppends:
        """The running loop's for `path`, made on first use (an asyncio lock belongs to one
        loop, and goes with it)."""
        groups = _LOOP_APPENDS.setdefault(asyncio.get_running_loop(), {})
        group = groups.get(path)
        if group is None:
            group = groups[path] = cls()
        return group


_LOOP_APPENDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Path, _LoopAppends]]
_LOOP_APPENDS = weakref.WeakKeyDictionary()


async def writes_done() -> None:
    """Wait for this loop's ledger writes under way, the writes of appends cancelled since
    included (a write outlives its append's wait).

    Why: a session stopped by `-x` or Ctrl-C cancels its attempts, and the writes they began
    go on; a close that read the ledger before they ended counted fewer attempts in run.json
    than the seal it then made over the whole file held."""
    groups = _LOOP_APPENDS.get(asyncio.get_running_loop(), {}).values()
    mine = [write for group in groups for write in group.writing]
    if mine:
        await asyncio.wait(mine)


def _settle(batch: list[_Queued], write: asyncio.Future[None]) -> None:
    """Tell every append a write took how it went (each raises the write's error)."""
    error = None if write.cancelled() else write.exception()
    for queued in batch:
        if queued.done.done():
            continue
        if write.cancelled():
            queued.done.cancel()
        elif error is not None:
            queued.done.set_exception(error)
        else:
            queued.done.set_result(None)


def _finish(fd: int, chain: int | None, payload: bytes) -> None:
    """The chain's entries made durable, then the lines written and made durable; closes both
    descriptors (which releases the lock). The chain first: a kill between the two leaves an
    entry for a line never written (dropped by the next append), never a line no entry covers.
    """
    try:
        if chain is not None:
            try:
                os.fsync(chain)
            finally:
                os.close(chain)
        files.write_whole(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_events(
    run_dir: Path, drop: Callable[[dict[str, Any]], bool], events: Sequence[BaseModel]
) -> int:
    """Replace a re-runnable stage's own lines: those `drop` selects go, `events` are appended.

    The one sanctioned exception to append-only (seed 004): diagnose re-run replaces its own
    earlier events, so a crash-and-rerun does not duplicate issues. Every other line is kept
    byte for byte, in order. The new file is written beside the old one, fsynced and renamed
    under the ledger's lock, so a reader sees the old ledger or the new one. Returns how many
    lines were dropped. Only for a run nothing is appending to (the caller checks its status).
    """
    path = run_dir / EVENTS_FILE
    stamp = now_iso()
    new: list[bytes] = []
    for event in events:
        if getattr(event, "at", "set") is None:
            event.at = stamp  # type: ignore[attr-defined]
        # Only the new lines pass the redaction: the kept ones are another stage's, untouched.
        text = redact(json.dumps(strict_dump(event), ensure_ascii=False))
        new.append(files.json_bytes(text))
    fd = files.open_regular(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        chained = os.path.lexists(run_dir / ledger_seal.CHAIN_FILE)
        if chained:
            broken = ledger_seal.verify(run_dir, lock_held=True).broken
            if broken is not None:
                # Rewriting would chain a change made by hand as if it were the ledger's.
                raise ValueError(f"{run_dir}: {broken}; refusing to rewrite a changed ledger")
        kept: list[bytes] = []
        dropped = 0
        for line in files.read_bytes(path).split(b"\n"):
            if not line:
                continue
            try:
                data = json.loads(line)
            except ValueError:
                data = None  # a torn line is not ours to judge: it stays, and validate says so
            if isinstance(data, dict) and drop(data):
                dropped += 1
            else:
                kept.append(line)
        lines = [*kept, *new]
        payload = b"\n".join(lines) + b"\n" if lines else b""
        tmp = run_dir / f".{EVENTS_FILE}.{os.getpid()}.tmp"
        with os.fdopen(_fresh(tmp), "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        if chained:
            chain = run_dir / f".{ledger_seal.CHAIN_FILE}.{os.getpid()}.tmp"
            with os.fdopen(_fresh(chain), "wb") as handle:
                handle.write(ledger_seal.file_entries(payload))
            os.replace(chain, run_dir / ledger_seal.CHAIN_FILE)
        os.replace(tmp, path)
    finally:
        os.close(fd)
    return dropped


def write_run_info(run_dir: Path, info: RunInfo) -> None:
    """Write `run.json` atomically (temp file, fsync, rename): readers never see half of it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    data = strict_dump(info)
    _write_json(run_dir / RUN_FILE, {k: v for k, v in data.items() if v is not None})


def _fresh(tmp: Path) -> int:
    """A temporary file made afresh, to write: never opened through what is already there (a
    link planted under its name would write out of the run, a pipe would wait)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(tmp, flags, 0o644)
    except FileExistsError:
        os.unlink(tmp)  # a leftover (or a planted link or pipe): the name, not what it names
        return os.open(tmp, flags, 0o644)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    # `abortReason` and `invalidReason` quote error text: it passes the one redaction.
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    _write_atomically(path, lambda out: out.write(text))


_T = TypeVar("_T")


class _Redacting:
    """A text file that passes every write through the one redaction (a piece at a time)."""

    def __init__(self, handle: TextIO) -> None:
        self.handle = handle

    def write(self, text: str) -> int:
        return self.handle.write(redact(text))


def _write_atomically(path: Path, fill: Callable[[Any], _T]) -> _T:
    """Write `path` through a fresh temporary beside it, renamed over it once fsynced; `fill`
    writes the text (redacted as it goes) and its result is returned."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    handle = os.fdopen(_fresh(tmp), "w", encoding="utf-8")
    try:
        with handle:
            result = fill(_Redacting(handle))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        # Nothing half-written is left in the run (an artifact unreadable mid-seal, a kill).
        tmp.unlink(missing_ok=True)
        raise
    return result


def _raw_info(run_dir: Path) -> dict[str, Any]:
    data = json.loads(files.read_text(run_dir / RUN_FILE))
    if not isinstance(data, dict):
        raise ValueError(f"{run_dir / RUN_FILE} is not a JSON object")
    return data


def update_run_info(run_dir: Path, **changes: Any) -> RunInfo:
    """Read `run.json`, apply changes (contract names or field names), write it back atomically.

    Only the changed keys are rewritten: every other key keeps the bytes it was written with,
    so a sealed key stays what the seal recorded (`seal.POST_CLOSE_KEYS`).
    """
    with _run_lock(run_dir):
        raw = _raw_info(run_dir)
        fields = RunInfo.model_fields
        named = {(fields[k].alias or k) if k in fields else k: v for k, v in changes.items()}
        sidecar = _sealed_sidecar(run_dir, raw, named)
        updated = RunInfo.model_validate({**raw, **named})
        # The contract refuses unknown fields and wrong types, as a whole write would.
        dumped = strict_dump(updated)
        for key in named:
            if dumped.get(key) is None:
                raw.pop(key, None)
            else:
                raw[key] = dumped[key]
        if sidecar is not None:
            ledger_seal.resealed_info(raw, sidecar)
            _write_json(run_dir / ledger_seal.SEAL_FILE, sidecar)
        _write_json(run_dir / RUN_FILE, raw)
        return updated


def _sealed_sidecar(
    run_dir: Path, raw: dict[str, Any], named: dict[str, Any]
) -> dict[str, Any] | None:
    """On a sealed run: refuse a change to a sealed key, or to a run.json changed by hand, and
    return the sidecar whose digests the write then renews; None on an open run."""
    if not isinstance(raw.get("seal"), dict):
        return None
    fixed = sorted(k for k in named if k not in ledger_seal.POST_CLOSE_KEYS)
    if fixed:
        raise LedgerWriteError(
            f"{run_dir / RUN_FILE}: {', '.join(fixed)} cannot change after the run was sealed"
        )
    sidecar = ledger_seal.read_sidecar(run_dir) or {}
    check = ledger_seal.SealCheck(sealed=True)
    ledger_seal.check_info(raw, raw["seal"], sidecar, check)
    if check.errors:
        raise ValueError(f"{run_dir}: {check.errors[0]}; refusing to record on a changed run")
    return sidecar


def seal_run(run_dir: Path) -> dict[str, Any]:
    """Seal a run as it is on disk now (`ledger.seal`): run.json's `seal` record and the
    sidecar; returns the record. Called when a run closes, and by `evalloop merge`."""
    with _run_lock(run_dir):
        fd = files.open_regular(run_dir / EVENTS_FILE, os.O_RDONLY | os.O_CREAT)
        try:
            # Under the events lock too: no line lands between the chain and the record.
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = _raw_info(run_dir)
            raw.pop("seal", None)
            at = now_iso()
            record = _write_atomically(
                run_dir / ledger_seal.SEAL_FILE,
                lambda out: ledger_seal.compute(run_dir, raw, at=at, sidecar=out),
            )
            _write_json(run_dir / RUN_FILE, {**raw, "seal": record})
        finally:
            os.close(fd)
    return record


def unseal_run(run_dir: Path) -> None:
    """Drop a run's seal: `--eval-resume` reopens a run (after checking it), and the seal is
    made anew when the resumed run closes."""
    with _run_lock(run_dir):
        raw = _raw_info(run_dir)
        if raw.pop("seal", None) is not None:
            _write_json(run_dir / RUN_FILE, raw)
        with contextlib.suppress(FileNotFoundError):
            (run_dir / ledger_seal.SEAL_FILE).unlink()


@contextlib.contextmanager
def _run_lock(run_dir: Path) -> Iterator[None]:
    # A pipe planted as the lock would hold its open forever: refused like a ledger file.
    fd = files.open_regular(run_dir / ".lock", os.O_WRONLY | os.O_CREAT, shared_ok=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# --- labels ----------------------------------------------------------------------------

_LABEL = re.compile(r"^(?P<stem>.+)-(?P<nn>\d+)$")


def next_label(runs_dir: Path, set_name: str, phase: str) -> str:
    """`<set>-<phase>-<nn>` with nn the smallest unused number among sibling runs.

    Both directory names and the `label` inside each sibling's `run.json` count as used,
    since `--eval-label` and renamed directories can make the two differ.
    """
    stem = f"{set_name}-{phase}"
    used: set[int] = set()
    if runs_dir.is_dir():
        for child in runs_dir.iterdir():
            names = [child.name]
            label = _label_of(child)
            if label:
                names.append(label)
            for name in names:
                match = _LABEL.match(name)
                if match and match["stem"] == stem:
                    used.add(int(match["nn"]))
    nn = 1
    while nn in used:
        nn += 1
    return f"{stem}-{nn:02d}"


def _label_of(run_dir: Path) -> str | None:
    try:
        data = json.loads(files.read_text(run_dir / RUN_FILE))
    except (OSError, ValueError):
        return None
    label = data.get("label") if isinstance(data, dict) else None
    return label if isinstance(label, str) else None
