"""The chain and the seal: what a run's ledger held, so that a change to it shows.

**The chain** is kept as the ledger is written. Every line the writer appends to
`events.jsonl` gets one entry in `events.chain` (written first, under the same lock): the
chain value after that line and the byte offset where the line ends. The value after line i
covers every line up to i, so an edited, deleted, reordered or inserted line, a truncated
tail, or a line appended around the writer all show at the first line where the file and the
chain part (`verify` names it). A run killed mid-run keeps its chain: `--eval-resume` checks it
before appending, so an interrupted run edited by hand is never finished as if it were whole.

**The seal** is made when a run closes (complete, interrupted, aborted or invalid): run.json
`seal` records how many chained lines the run had and the chain value there, a digest of
run.json's keys and one of `artifacts/`; the sidecar `seal.json` keeps a digest per key and
per file, so a check names the key or the file that changed. Later stages (a review, diagnose,
the gate's record) append through the writer, so their lines are chained too; lines that
count (attempts, scores) appended after the seal are reported. run.json keys later stages
rewrite (`POST_CLOSE_KEYS`) go through `writer.update_run_info`, which checks the seal and
records the new digest; any other key, or any edit around the writer, breaks it.

A seal is tamper-evidence, not a signature: whoever runs this code can re-seal an edited run.
It catches the hand edit, the copy whose id was changed, the deleted seal, the truncated tail:
the ways a ledger stops being what was measured without anyone meaning to forge it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from pytest_evalloop.ledger import files
from pytest_evalloop.ledger.contract import ARTIFACTS_DIR, EVENTS_FILE, RUN_FILE
from pytest_evalloop.ledger.files import CHAIN_FILE, SEAL_FILE

SEAL_FORMAT = 2
SHORT = 16
"""Hex characters of a chain value (64 bits: a changed line keeps its old value once in 2^64)."""
START = hashlib.sha256(b"pytest-evalloop chain v2").hexdigest()[:SHORT]
ENTRY = SHORT + 1 + 12 + 1
"""Bytes of one chain entry, newline included."""
COUNTED_KINDS = (b'{"kind": "attempt"', b'{"kind": "score"', b'{"kind": "retrieval_score"')
"""Lines that change a run's figures: never appended to a sealed run."""

POST_CLOSE_KEYS = frozenset(
    {
        "gate",
        "pairedTests",
        "mode",
        "totals",
        "costs",
        "diagnoserModel",
        "diagnoseVersion",
        "diagnoseSha",
        "improverModel",
        "improveVersion",
        "improveSha",
    }
)
"""run.json keys a later stage may rewrite on a sealed run (through `writer.update_run_info`,
which records their new digest): the gate's record, totals after a review, diagnose's and
improve's own pins and costs. Every other key (the identity, the pins, the status, the
selection, the session) is fixed once the run is sealed."""


# --- the chain -----------------------------------------------------------------------------


def step(previous: str, line: bytes) -> str:
    """The chain value after one more line (its bytes without the newline)."""
    return hashlib.sha256(bytes.fromhex(previous) + line).hexdigest()[:SHORT]


BATCH_MARK = ":"
"""Between value and offset in the first entry of each append (a space in the others)."""


def entry(value: str, end: int, *, first: bool = False) -> bytes:
    """One chain entry: the value after a line and the offset where the line ends; `first`
    marks the first line of one append, so that what a kill mid-append left can be told
    apart from lines cut by hand (`drop_unwritten`)."""
    return f"{value}{BATCH_MARK if first else ' '}{end:012d}\n".encode("ascii")


def _parse(raw: bytes) -> tuple[str, int] | None:
    parsed = _parse_entry(raw)
    return None if parsed is None else parsed[:2]


def _parse_entry(raw: bytes) -> tuple[str, int, bool] | None:
    """(value, end, first of its append); None when garbled. Chains written before the mark
    existed have a space in every entry: no entry of theirs is marked first."""
    first = raw[SHORT : SHORT + 1] == BATCH_MARK.encode("ascii")
    if first:
        raw = raw[:SHORT] + b" " + raw[SHORT + 1 :]
    try:
        value, end = raw.decode("ascii").split()
        return value, int(end), first
    except ValueError:
        return None


def entries_for(data: bytes, previous: str = START, offset: int = 0) -> bytes:
    """The chain entries of `data` (whole lines) appended at `offset`, after `previous`: one
    append, its first entry marked."""
    out: list[bytes] = []
    for line in data.split(b"\n")[:-1]:
        previous = step(previous, line)
        offset += len(line) + 1
        out.append(entry(previous, offset, first=not out))
    return b"".join(out)


def append_entries(run_dir: Path, payload: bytes, events_size: int) -> None:
    """Chain the lines of `payload` before they are appended at `events_size` (the writer's
    call, under the ledger's lock), durably: the entries are fsynced before this returns."""
    fd = write_entries(run_dir, payload, events_size)
    if fd is not None:
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_entries(run_dir: Path, payload: bytes, events_size: int) -> int | None:
    """`append_entries` up to its fsync: the chain's descriptor, entries written and not yet
    synced (the caller fsyncs it before the lines go out, then closes it), or None for a run
    without a chain. A run whose ledger predates chains (lines, no chain file) stays
    unchained; entries a crash left for lines never written are dropped first."""
    path = run_dir / CHAIN_FILE
    fd = files.open_regular(path, os.O_RDWR | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        if size == 0 and events_size > 0:
            os.close(fd)
            return None  # an unchained ledger (older than chains, or its chain was deleted)
        kept, value = _chain_end_for(fd, size, events_size)
        if kept != size:
            os.ftruncate(fd, kept)
        # Bytes after the last entry's end nobody chained (a line appended around the writer)
        # stay unchained and `verify` names them; what follows is chained from before them.
        os.pwrite(fd, entries_for(payload, value, events_size), kept)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _chain_end_for(fd: int, size: int, events_size: int) -> tuple[int, str]:
    """Where the next append's entries go in the chain (open at `fd`, `size` bytes) and the
    value they chain from: past one append a kill stopped (`_unwritten_append`), else after
    every entry, kept as evidence. Entries for lines cut by hand are never dropped here: the
    next line then fails the check at the cut, as it should."""
    found = _unwritten_append(fd, size, events_size)
    if found is not None:
        return found
    whole = size // ENTRY
    last = _parse_entry(os.pread(fd, ENTRY, (whole - 1) * ENTRY)) if whole else None
    return whole * ENTRY, last[0] if last else START


def _unwritten_append(fd: int, size: int, events_size: int) -> tuple[int, str] | None:
    """The chain's size and value once the entries of one append a kill stopped are dropped
    (a torn entry, the chain's own write cut short, goes too); the whole chain when nothing is
    past the events file's end. None when what is past it is not exactly one append (its
    first entry marked, no other) that begins where the file ends: a cut by hand."""
    whole = size // ENTRY
    dangling = 0
    while dangling < whole:
        parsed = _parse_entry(os.pread(fd, ENTRY, (whole - dangling - 1) * ENTRY))
        if parsed is None:
            return None
        value, end, first = parsed
        if end <= events_size:
            return None if dangling else (whole * ENTRY, value)
        dangling += 1
        if first:
            if dangling == whole:
                return (0, START) if events_size == 0 else None
            before = _parse_entry(os.pread(fd, ENTRY, (whole - dangling - 1) * ENTRY))
            if before is None or before[1] != events_size:
                return None
            return (whole - dangling) * ENTRY, before[0]
    return (0, START) if whole == 0 else None


def drop_unwritten(run_dir: Path) -> int:
    """Before a killed run is resumed: drop the chain's entries for the lines its last append
    never wrote; returns how many went (0: none, or what is missing is not one append's).

    A kill between the chain's fsync and the lines' write (one kill in five in a busy run)
    leaves entries past the events file's end, and `--eval-resume` refused such a run as cut
    by hand. Entries are dropped only when they are exactly one append's (the first marked,
    no other) and the file ends exactly where that append began: a tail cut by hand of more
    than the last append, or mid-line, is still refused. The last append's lines cut by hand
    look the same as that kill, byte for byte, and are the one cut this lets through: their
    cases are answered again. Done under the ledger's lock, so no live append is mistaken
    for a stopped one."""
    events = run_dir / EVENTS_FILE
    if not os.path.lexists(run_dir / CHAIN_FILE) or not os.path.lexists(events):
        return 0
    fd = files.open_regular(events, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        events_size = os.fstat(fd).st_size
        chain = files.open_regular(run_dir / CHAIN_FILE, os.O_RDWR)
        try:
            return _drop_last_append(chain, events_size)
        finally:
            os.close(chain)
    finally:
        os.close(fd)


def _drop_last_append(chain: int, events_size: int) -> int:
    size = os.fstat(chain).st_size
    found = _unwritten_append(chain, size, events_size)
    if found is None or found[0] == size:
        return 0
    os.ftruncate(chain, found[0])
    os.fsync(chain)
    return size // ENTRY - found[0] // ENTRY


def file_entries(data: bytes) -> bytes:
    """The whole chain of an events file's bytes (a merged run's, a rewritten ledger's)."""
    return entries_for(data if data.endswith(b"\n") or not data else data + b"\n")


# --- run.json and the artifacts ---------------------------------------------------------------


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    # surrogateescape: a file name that is not UTF-8 is hashed as its bytes, never an error.
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:SHORT]


def key_digests(info: dict[str, Any]) -> dict[str, str]:
    """A digest per run.json key (the seal record itself aside)."""
    return {key: _digest(value) for key, value in info.items() if key != "seal"}


def artifact_digests(run_dir: Path) -> dict[str, str]:
    """sha256 of every file under `artifacts/`, by its path relative to the run."""
    return {name: _file_sha(run_dir / name) for name in _artifact_names(run_dir)}


def _file_sha(path: Path | str) -> str:
    # os.open and a read, not `open` and hashlib.file_digest: at 4,000 cases the seal, a
    # report and an index row each hash 16,000 small files, and the buffered file object's
    # setup was most of each file's cost.
    # Non-blocking, no link followed, a regular file only: a file swapped after the walk for a
    # pipe, a device or a link to one (`/dev/zero` reads forever) gets a digest no file's
    # bytes give, and shows as changed, rather than stopping the seal.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return _NOT_A_FILE
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return _NOT_A_FILE
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


_NOT_A_FILE = "not-a-regular-file"
"""The digest of an artifact that was no regular file when hashed (no hex digest is this)."""


def _artifact_names(run_dir: Path) -> list[str]:
    """Every regular file under `artifacts/` (not through a link), as a path relative to the
    run, sorted. A walk of names, not `Path.rglob`: rglob keeps a set of every path it yielded,
    a 4,000-case run's 20,000 paths at once. Strings, not paths, and the directory entries'
    own types (a `stat` only where the filesystem gives none): a path object per file was
    half the cost of a close's seal."""
    names: list[str] = []
    stack = [ARTIFACTS_DIR]
    base = os.fspath(run_dir)
    while stack:
        relative = stack.pop()
        try:
            entries = os.scandir(os.path.join(base, relative))
        except (FileNotFoundError, NotADirectoryError):
            continue
        with entries:
            for found in entries:
                name = f"{relative}/{found.name}"
                if found.is_dir(follow_symlinks=False):  # links to folders are not followed
                    stack.append(name)
                elif found.is_file(follow_symlinks=False):
                    names.append(name)
    names.sort()
    return names


def unsealed_artifacts(run_dir: Path) -> list[str]:
    """What under `artifacts/` no seal counts (a link, a pipe, a device: anything but regular
    files and folders), as paths relative to the run, sorted."""
    found = []
    for folder, dirs, names in os.walk(run_dir / ARTIFACTS_DIR):
        for name in [*names, *dirs]:
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                found.append(Path(os.path.relpath(path, run_dir)).as_posix())
    return sorted(found)


def artifacts_digest(run_dir: Path, out: TextIO | None = None) -> tuple[str, int]:
    """`_digest(sorted(artifact_digests(run_dir).items()))`, the seal record's `artifacts`, and
    how many files it covers, without holding every file's digest: the same JSON text fed to
    the hash a pair at a time. With `out`, each pair is written there too, as the sidecar's
    `"name": "sha"` members, comma-separated."""
    text = hashlib.sha256(b"[")
    count = 0
    base = os.fspath(run_dir)
    pieces: list[str] = []
    for name in _artifact_names(run_dir):
        sha = _file_sha(os.path.join(base, name))
        quoted = json.dumps(name, ensure_ascii=False)
        # `json.dumps([name, sha], separators=(",", ":"))`, written out: a hex digest needs
        # no escaping.
        pair = f'{"," if count else ""}[{quoted},"{sha}"]'
        try:
            text.update(pair.encode("utf-8"))
            shown = quoted
        except UnicodeEncodeError:
            # A name that is not UTF-8 (a folder copied from elsewhere) is hashed as its
            # bytes, and written escaped in the UTF-8 sidecar (it reads back the same).
            text.update(pair.encode("utf-8", "surrogateescape"))
            shown = json.dumps(name)
        if out is not None:
            pieces.append(f'{"," if count else ""}\n    {shown}: "{sha}"')
            if len(pieces) >= _SIDECAR_BATCH:
                out.write("".join(pieces))
                pieces.clear()
        count += 1
    if out is not None and pieces:
        out.write("".join(pieces))
    text.update(b"]")
    return text.hexdigest()[:SHORT], count


_SIDECAR_BATCH = 256
"""Sidecar members written (and so redacted) at a time."""


def compute(run_dir: Path, info: dict[str, Any], *, at: str, sidecar: TextIO) -> dict[str, Any]:
    """The seal of a run as it is on disk now (`info`: its run.json as a dict, without
    `seal`): returns run.json's `seal` record and writes the sidecar's JSON to `sidecar`.

    Neither the chain nor a digest per artifact is held whole: at 4,000 cases they were
    the peak of a run's close (and they grow with the run)."""
    lines, last = _chain_end(run_dir / CHAIN_FILE)
    keys = key_digests(info)
    sidecar.write(f'{{\n  "format": {SEAL_FORMAT},\n  "info": ')
    sidecar.write(json.dumps(keys, ensure_ascii=False))
    sidecar.write(',\n  "artifacts": {')
    artifacts, files_count = artifacts_digest(run_dir, sidecar)
    sidecar.write("\n  }\n}\n")
    return {
        "format": SEAL_FORMAT,
        "lines": lines,
        "chain": last[0] if last else START,
        "info": _digest(sorted(keys.items())),
        "artifacts": artifacts,
        "files": files_count,
        "at": at,
    }


def _chain_end(chain_path: Path) -> tuple[int, tuple[str, int] | None]:
    """How many whole entries the chain has, and its last (None: none), read from its end."""
    # Present in any form, it is read (or refused: `files`), never taken for a missing chain.
    if not os.path.lexists(chain_path):
        return 0, None
    with files.open_binary(chain_path) as handle:
        whole = os.fstat(handle.fileno()).st_size // ENTRY * ENTRY
        if not whole:
            return 0, None
        handle.seek(whole - ENTRY)
        return whole // ENTRY, _parse(handle.read(ENTRY))


def resealed_info(info: dict[str, Any], sidecar: dict[str, Any]) -> None:
    """Record run.json's new digests after a later stage rewrote a post-close key (in place:
    `info['seal']` and the sidecar)."""
    keys = key_digests(info)
    sidecar["info"] = keys
    info["seal"]["info"] = _digest(sorted(keys.items()))


def read_sidecar(run_dir: Path) -> dict[str, Any] | None:
    """The sidecar, or None when it is missing or unreadable."""
    try:
        data = json.loads(files.read_text(run_dir / SEAL_FILE))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# --- checking ------------------------------------------------------------------------------------


@dataclass
class SealCheck:
    """What checking a run against its chain and seal found."""

    sealed: bool
    """Whether the run carries a seal (it closed)."""
    chained: bool = True
    """Whether its ledger carries a chain (every run written since chains existed does)."""
    errors: list[str] = field(default_factory=list)
    """Changes, first changed line first."""
    warnings: list[str] = field(default_factory=list)

    @property
    def broken(self) -> str | None:
        """The first change found, in words, or None when the run is as it was written."""
        return self.errors[0] if self.errors else None


def verify(run_dir: Path, *, lock_held: bool = False) -> SealCheck:
    """Check a run directory: its lines against the chain, and (when it closed) run.json and
    its artifacts against the seal. The ledger is read under its lock, shared (`lock_held`:
    the caller holds it, exclusively). A ledger file that is not a regular file (a directory,
    a pipe, a link: `ledger.files`) is an error, and nothing is read."""
    refused = files.refusal_lines(run_dir)
    if refused:
        return SealCheck(sealed=False, errors=refused)
    try:
        info = json.loads(files.read_text(run_dir / RUN_FILE))
    except (OSError, ValueError):
        return SealCheck(sealed=False, errors=["run.json cannot be read"])
    record = info.get("seal") if isinstance(info, dict) else None
    check = SealCheck(sealed=isinstance(record, dict))
    sealed_lines = int(record.get("lines") or 0) if isinstance(record, dict) else None
    try:
        _check_chain(run_dir, check, sealed_lines, record, lock_held)
    except files.LedgerFileError as exc:
        # Swapped for a pipe or a link after the look above: refused as the look would have.
        check.errors.append(str(exc))
        return check
    if not isinstance(record, dict):
        return check
    if record.get("format") != SEAL_FORMAT:
        check.errors.append(f"run.json seal has format {record.get('format')!r}, not {SEAL_FORMAT}")
        return check
    # The sidecar only says what changed: read when something did (at 4,000 cases it is 2 MB
    # of JSON, and a whole run's digests held as a dict were most of a close's peak).
    if _digest(sorted(key_digests(info).items())) != record.get("info"):
        check_info(info, record, read_sidecar(run_dir) or {}, check)
    if artifacts_digest(run_dir)[0] != record.get("artifacts"):
        _check_artifacts(run_dir, record, read_sidecar(run_dir) or {}, check)
    return check


def _check_chain(
    run_dir: Path, check: SealCheck, sealed_lines: int | None, record: Any, lock_held: bool
) -> None:
    events = run_dir / EVENTS_FILE
    path = run_dir / CHAIN_FILE
    if not os.path.lexists(path):
        # Whether it holds anything, read, not the size the filesystem states: a file under
        # /proc (or a FUSE mount) says 0 bytes and reads whatever it holds.
        if _holds_bytes(events):
            check.chained = False
            check.warnings.append(
                f"{EVENTS_FILE} carries no chain ({CHAIN_FILE} is missing: written before "
                "chains existed, or removed): what it held cannot be checked"
            )
        return
    # The ledger line by line, never whole: a 4,000-case ledger is 20 MB, twice that split.
    present = os.path.lexists(events)
    with files.open_binary(events) if present else contextlib.nullcontext(iter(())) as lines:
        if not lock_held and hasattr(lines, "fileno"):
            # The writer chains a line and writes it under the ledger's lock, exclusive: read
            # under it, shared, a run being written is seen between two appends, never with
            # a chain entry whose line is not out yet (a false "written around the writer").
            with contextlib.suppress(OSError):
                fcntl.flock(lines.fileno(), fcntl.LOCK_SH)
        with files.open_binary(path) as handle:
            # The chain too, an entry at a time in step with the lines: a 4,000-case run's
            # chain held as a list of entries was 16 MB at the peak of its close.
            entries = _Entries(handle, sealed_lines)
            chained, torn = _walk_chain(lines, entries, check, sealed_lines)
            total = entries.total()
    if check.errors:
        return
    if torn:
        check.errors.append(f"{EVENTS_FILE} ends in a torn line (line {chained + 1})")
        return
    if total > chained:
        check.errors.append(
            f"{EVENTS_FILE} ends at line {chained}, but the chain holds {total} lines: "
            f"lines {chained + 1}-{total} are gone (truncated after they were written)"
        )
        return
    if isinstance(record, dict) and sealed_lines:
        sealed_value = entries.sealed
        if sealed_value is None or sealed_value[0] != record.get("chain"):
            check.errors.append(
                f"{CHAIN_FILE} does not hold the value run.json's seal recorded at line "
                f"{sealed_lines}: the ledger was rewritten after the run closed"
            )


def _holds_bytes(path: Path) -> bool:
    try:
        with files.open_binary(path) as handle:
            return bool(handle.read(1))
    except OSError:
        return False


class _Entries:
    """A chain's entries read one at a time from its file (`ENTRY` bytes each; a short tail is
    no entry): how many were read, and the entry of the sealed line once read past it."""

    def __init__(self, handle: BinaryIO, sealed_lines: int | None) -> None:
        self._handle = handle
        self._sealed_lines = sealed_lines
        self.count = 0
        self.sealed: tuple[str, int] | None = None

    def next(self) -> tuple[bool, tuple[str, int] | None]:
        """(False, None) past the last entry, else (True, the entry, None when garbled)."""
        raw = self._handle.read(ENTRY)
        if len(raw) < ENTRY:
            return False, None
        self.count += 1
        entry = _parse(raw)
        if self.count == self._sealed_lines:
            self.sealed = entry
        return True, entry

    def total(self) -> int:
        """Read to the end: how many entries the chain holds."""
        while self.next()[0]:
            pass
        return self.count


def _walk_chain(
    lines: Iterable[bytes],
    entries: _Entries,
    check: SealCheck,
    sealed_lines: int | None,
) -> tuple[int, bool]:
    """Line i against entry i: the first line where the file and the chain part is named,
    whatever happened there (an edit, a deletion, an insertion, a reordering). Returns the
    count of whole lines and whether a torn one (no newline) ends the file."""
    value = START
    number = 0
    found: str | None = None
    torn = False
    for raw in lines:
        if not raw.endswith(b"\n"):
            torn = True  # only the last line can lack its newline
            break
        number += 1
        if found is not None:
            continue  # counting on: the message names the file's length
        line = raw[:-1]
        more, recorded = entries.next()
        if not more:
            check.errors.append(
                f"{EVENTS_FILE} line {number} is not in the chain: it was written around the "
                "ledger's writer (or the chain was cut)"
            )
            return number, False
        value = step(value, line)
        if recorded is None or recorded[0] != value:
            found = f"{EVENTS_FILE} line {number} changed after it was written (the first changed "
        elif sealed_lines is not None and number > sealed_lines and line.startswith(COUNTED_KINDS):
            kind = line.split(b'"')[3].decode("ascii", "replace")
            check.errors.append(
                f"{EVENTS_FILE} line {number} adds a {kind} line after the run was sealed"
            )
            return number, False
    if found is not None:
        check.errors.append(
            f"{found}line of {number}; or it was written around the ledger's writer)"
        )
    return number, torn


def check_info(
    info: dict[str, Any], record: dict[str, Any], sidecar: dict[str, Any], check: SealCheck
) -> None:
    now = key_digests(info)
    if _digest(sorted(now.items())) == record.get("info"):
        return
    keys = sidecar.get("info")
    was: dict[str, Any] = keys if isinstance(keys, dict) else {}
    changed = sorted(k for k in set(now) | set(was) if now.get(k) != was.get(k))
    named = ", ".join(changed) if was and changed else f"({SEAL_FILE} cannot say which)"
    check.errors.append(f"{RUN_FILE} changed after the run was sealed: {named}")


def _check_artifacts(
    run_dir: Path, record: dict[str, Any], sidecar: dict[str, Any], check: SealCheck
) -> None:
    recorded = sidecar.get("artifacts")
    was: dict[str, Any] | None = recorded if isinstance(recorded, dict) else None
    now = artifact_digests(run_dir)
    if was is not None:
        # Files added later are no change to what was measured (nothing counts from them).
        added = sorted(set(now) - set(was))
        if added:
            check.warnings.append(f"artifacts added after sealing: {', '.join(added[:5])}")
        now = {k: v for k, v in now.items() if k in was}
    if _digest(sorted(now.items())) == record.get("artifacts"):
        return
    if was is None:
        check.errors.append(f"artifacts changed after the run was sealed ({SEAL_FILE} is missing)")
        return
    gone = sorted(set(was) - set(now))
    changed = sorted(k for k in now if now[k] != was.get(k))
    parts = [f"{p} changed" for p in changed[:5]] + [f"{p} removed" for p in gone[:5]]
    check.errors.append(
        "artifacts changed after the run was sealed: " + (", ".join(parts) or "(unknown)")
    )
