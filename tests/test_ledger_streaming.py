"""The ledger is read line by line (issue 49's flat memory), and finds what a whole read found.

`reader.read_run` and the chain check in `seal.verify` once read `events.jsonl` whole and split
it: at 4,000 cases, 40 MB more at the peak of a run's close. They now stream it. These tests
hold the streaming readers to the whole-file reading they replaced, kept here as the oracle,
over any damage to a real run's ledger: a cut anywhere (a torn tail), a byte changed, a line
break added or lost, a blank line, a line appended without its newline.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader, seal
from pytest_evalloop.measure import aggregates
from tests.reportruns import two_runs


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed six-case run (its ledger chained and sealed), made once per module."""
    _, _, after, _ = two_runs(tmp_path_factory.mktemp("streaming"))
    return after


def whole_file_chain_errors(run_dir: Path) -> list[str]:
    """The chain check as it read the ledger before: the whole file, split on newlines."""
    data = (run_dir / ledger.EVENTS_FILE).read_bytes()
    chain = (run_dir / seal.CHAIN_FILE).read_bytes()
    size = seal.ENTRY
    entries = [seal._parse(chain[i : i + size]) for i in range(0, len(chain) // size * size, size)]
    lines = data.split(b"\n")
    torn = lines.pop() if lines else b""
    value = seal.START
    sealed_lines = int((reader.read_run_info(run_dir).seal or {}).get("lines") or 0)
    for number, line in enumerate(lines, start=1):
        if number > len(entries):
            return [
                f"{ledger.EVENTS_FILE} line {number} is not in the chain: it was written around "
                "the ledger's writer (or the chain was cut)"
            ]
        value = seal.step(value, line)
        recorded = entries[number - 1]
        if recorded is None or recorded[0] != value:
            return [
                f"{ledger.EVENTS_FILE} line {number} changed after it was written (the first "
                f"changed line of {len(lines)}; or it was written around the ledger's writer)"
            ]
        if number > sealed_lines and line.startswith(seal.COUNTED_KINDS):
            kind = line.split(b'"')[3].decode("ascii", "replace")
            return [
                f"{ledger.EVENTS_FILE} line {number} adds a {kind} line after the run was sealed"
            ]
    if torn:
        return [f"{ledger.EVENTS_FILE} ends in a torn line (line {len(lines) + 1})"]
    if len(entries) > len(lines):
        return [
            f"{ledger.EVENTS_FILE} ends at line {len(lines)}, but the chain holds {len(entries)} "
            f"lines: lines {len(lines) + 1}-{len(entries)} are gone (truncated after they were "
            "written)"
        ]
    return []


def whole_file_read(run_dir: Path, kinds: frozenset[str] | None, validate: bool) -> Any:
    """`read_run`'s events loop as it read the ledger before: the whole file, split."""
    out = reader.RunLedger(run_dir=run_dir, info=None)
    path = run_dir / ledger.EVENTS_FILE
    lines = path.read_bytes().split(b"\n")
    torn_tail = bool(lines and lines[-1])
    last = len(lines)
    skip = () if kinds is None else reader._prefixes(k for k in reader._MODELS if k not in kinds)
    light = (
        ()
        if validate
        else reader._prefixes(k for k in reader._MODELS if kinds is None or k in kinds)
    )
    read_light = reader._light_reader(None)
    for index, line in enumerate(lines, start=1):
        if not line or (index != last and line.startswith(skip) and line.endswith(b"}")):
            continue
        whole = index != last or not torn_tail
        if light and whole and line.startswith(light):
            event = read_light(line)
            if event is not None:
                out.events.append(event)
                continue
        elif not line.strip():
            continue
        elif whole and line.endswith(b"}"):
            handled, event = reader._fast_parse(line, kinds)
            if handled:
                if event is not None:
                    out.events.append(event)
                continue
        reader._read_tolerantly(out, f"{path}:{index}", line, index == last, torn_tail, kinds)
    return out


def _shape(events: list[Any]) -> list[tuple[Any, ...]]:
    return [(type(e).__name__, e.kind, e.qid, getattr(e, "sample", None)) for e in events]


def damaged(run_dir: Path, where: Path, how: str, at: int, byte: int) -> Path:
    target = where / "run"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(run_dir, target)
    path = target / ledger.EVENTS_FILE
    data = bytearray(path.read_bytes())
    at %= len(data) + 1
    if how == "cut":
        del data[at:]
    elif how == "byte" and at < len(data):
        data[at] = byte
    elif how == "newline":
        data[at:at] = b"\n"
    elif how == "join" and b"\n" in data:
        del data[data.index(b"\n")]
    elif how == "blank":
        data[at:at] = b"\n\n"
    elif how == "tail":
        data += b'{"kind": "score", "qid": "x"}'
    path.write_bytes(bytes(data))
    return target


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    how=st.sampled_from(["none", "cut", "byte", "newline", "join", "blank", "tail"]),
    at=st.integers(min_value=0),
    byte=st.integers(min_value=0, max_value=255),
)
@example(how="cut", at=10**9, byte=0)  # nothing cut: the intact ledger
@example(how="cut", at=0, byte=0)  # an empty ledger
def test_streaming_reads_find_what_whole_reads_found(
    run_dir: Path, tmp_path: Path, how: str, at: int, byte: int
) -> None:
    run = damaged(run_dir, tmp_path, how, at, byte)
    assert seal.verify(run).errors[:1] == whole_file_chain_errors(run)
    for kinds, validate in ((None, True), (aggregates.KINDS, False), (None, False)):
        streamed = reader.RunLedger(run_dir=run, info=None)
        reader._read_events_into(streamed, kinds, validate, None)
        whole = whole_file_read(run, kinds, validate)
        assert _shape(streamed.events) == _shape(whole.events)
        assert [(f.level, f.where, f.message) for f in streamed.findings] == [
            (f.level, f.where, f.message) for f in whole.findings
        ]


def test_a_ledger_whose_size_says_empty_is_never_read_as_empty(
    run_dir: Path, tmp_path: Path
) -> None:
    # A file under /proc states 0 bytes and reads its content: a ledger linked to one, its
    # chain deleted, once read as an empty ledger no chain need cover (found by issue 49's
    # hostile pass). A ledger file is the run's own regular file (`ledger.files`): the link is
    # an error before a byte of it is read.
    run = damaged(run_dir, tmp_path, "none", 0, 0)
    (run / seal.CHAIN_FILE).unlink()
    (run / ledger.EVENTS_FILE).unlink()
    (run / ledger.EVENTS_FILE).symlink_to("/proc/self/status")
    assert (run / ledger.EVENTS_FILE).stat().st_size == 0
    check = seal.verify(run)
    assert check.broken is not None
    assert "symbolic link (to /proc/self/status)" in check.broken


def test_a_run_being_written_is_read_between_two_appends(run_dir: Path, tmp_path: Path) -> None:
    # The writer chains a line, then writes it, both under the ledger's exclusive lock. A check
    # that read the chain and then the file in that gap saw an entry with no line (and blamed a
    # write around the writer: issue 49's hostile pass, a validate beside a live run). The
    # check reads under the lock, shared, so it waits for the append to finish, whenever it
    # comes: this test holds the lock while the check starts, and only then writes the line.
    run = damaged(run_dir, tmp_path, "none", 0, 0)
    events = run / ledger.EVENTS_FILE
    line = next(
        x for x in events.read_bytes().split(b"\n") if x.startswith(b'{"kind": "tool_call"')
    )
    fd = os.open(events, os.O_WRONLY | os.O_APPEND)
    checks: list[seal.SealCheck] = []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        seal.append_entries(run, line + b"\n", os.fstat(fd).st_size)  # the chain first
        reader_thread = threading.Thread(target=lambda: checks.append(seal.verify(run)))
        reader_thread.start()
        reader_thread.join(timeout=0.5)  # it waits for the lock: it cannot have read yet
        assert not checks
        os.write(fd, line + b"\n")
    finally:
        os.close(fd)  # the lock goes with it
    reader_thread.join()
    assert checks and checks[0].errors == []


def rglob_artifacts_digest(run_dir: Path) -> str:
    """The seal's `artifacts` digest as it was computed before: rglob, a dict of every file's
    digest, then the sorted pairs as one JSON text."""
    import hashlib

    root = run_dir / "artifacts"
    out: dict[str, str] = {}
    if root.is_dir():
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            out[path.relative_to(run_dir).as_posix()] = hashlib.sha256(
                path.read_bytes()
            ).hexdigest()
    return seal._digest(sorted(out.items()))


NAME = st.text(alphabet="ab-_.é0", min_size=1, max_size=4).filter(lambda n: n not in (".", ".."))
TREE = st.lists(
    st.tuples(st.lists(NAME, min_size=1, max_size=3), st.binary(max_size=40)), max_size=12
)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tree=TREE, links=st.booleans())
def test_the_artifacts_digest_walked_is_the_digest_the_seal_recorded(
    tmp_path_factory: pytest.TempPathFactory, tree: list[tuple[list[str], bytes]], links: bool
) -> None:
    # Any tree of files (nested folders, names that sort differently as paths and as text:
    # "a-b" against "a/b"), with links to a file and to a folder that no seal counts.
    run = tmp_path_factory.mktemp("art")
    root = run / "artifacts"
    root.mkdir()
    for parts, data in tree:
        path = root.joinpath(*parts)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            continue  # a name already used as a folder, or a file where a folder goes
    if links:
        outside = run / "outside"
        outside.mkdir()
        (outside / "x").write_bytes(b"not counted")
        (root / "to-folder").symlink_to(outside, target_is_directory=True)
        (root / "to-file").symlink_to(outside / "x")
    assert seal.artifacts_digest(run)[0] == rglob_artifacts_digest(run)
    held = seal.artifact_digests(run)
    assert seal.artifacts_digest(run)[0] == seal._digest(sorted(held.items()))
    # The seal writes its sidecar as it walks: the same JSON as the dict it once held whole.
    out = io.StringIO()
    info = {"runId": "r", "label": 'a "quoted" l\u00e9bel'}
    record = seal.compute(run, info, at="now", sidecar=out)
    sidecar = {"format": seal.SEAL_FORMAT, "info": seal.key_digests(info), "artifacts": held}
    assert json.loads(out.getvalue()) == sidecar
    assert (record["artifacts"], record["files"]) == (seal._digest(sorted(held.items())), len(held))


def whole_chain_append(chain: bytes, payload: bytes, events_size: int) -> bytes:
    """The chain file after `append_entries`, read whole and walked forward: the entries past
    the events file's end are dropped only when they are one append a kill stopped (the first
    marked, no other, starting where the file ends); any other shortfall is kept as evidence,
    and the new entries chain on from the last one."""
    if not chain and events_size > 0:
        return chain
    size = seal.ENTRY
    entries = [
        seal._parse_entry(chain[i : i + size]) for i in range(0, len(chain) // size * size, size)
    ]
    past = 0  # the entries at the end that parse and end past the file
    for parsed in reversed(entries):
        if parsed is None or parsed[1] <= events_size:
            break
        past += 1
    kept = len(entries)
    last = entries[-1] if entries else None
    value = last[0] if last else seal.START
    if past:
        tail = entries[kept - past :]
        before = entries[kept - past - 1] if kept > past else None
        starts_there = (before is not None and before[1] == events_size) or (
            kept == past and events_size == 0
        )
        marks = [p[2] for p in tail if p is not None]
        if marks[0] and not any(marks[1:]) and starts_there:
            kept -= past
            value = before[0] if before is not None else seal.START
    return chain[: kept * size] + seal.entries_for(payload, value, events_size)


def _chain_entries(ends: st.SearchStrategy[int]) -> st.SearchStrategy[bytes]:
    value = st.text(alphabet="0123456789abcdef", min_size=seal.SHORT, max_size=seal.SHORT)
    damaged = st.binary(min_size=seal.ENTRY, max_size=seal.ENTRY)
    return st.one_of(st.builds(seal.entry, value, ends, first=st.booleans()), damaged)


@settings(max_examples=60, deadline=None)
@given(
    good=st.lists(_chain_entries(st.integers(0, 2000)), max_size=20),
    # Entries for lines a kill stopped (past the events file's end) or damaged, up to more
    # than the block the walk back reads at a time.
    stale=st.lists(_chain_entries(st.integers(2001, 10**6)), max_size=150),
    tail=st.binary(max_size=seal.ENTRY - 1),
    events_size=st.integers(min_value=0, max_value=2000),
    payload=st.lists(st.binary(max_size=20).filter(lambda b: b"\n" not in b), max_size=3),
)
@example(  # one append a kill stopped, starting where the file ends: dropped
    good=[seal.entry("ab" * 8, 10, first=True), seal.entry("cd" * 8, 25)],
    stale=[seal.entry("ef" * 8, 30, first=True), seal.entry("ef" * 8, 40)],
    tail=b"01",
    events_size=25,
    payload=[b'{"kind": "x"}'],
)
@example(  # two appends past the end: a cut, kept as evidence
    good=[seal.entry("ab" * 8, 10, first=True), seal.entry("cd" * 8, 25)],
    stale=[seal.entry("ef" * 8, 30, first=True), seal.entry("ef" * 8, 40, first=True)],
    tail=b"",
    events_size=25,
    payload=[b'{"kind": "x"}'],
)
@example(  # more stale entries than one block: the walk back reads a second
    good=[seal.entry("ab" * 8, 10), seal.entry("cd" * 8, 20)],
    stale=[seal.entry("ef" * 8, 5000 + i) for i in range(150)],
    tail=b"0123",
    events_size=25,
    payload=[b'{"kind": "x"}'],
)
def test_an_append_reads_the_chain_from_its_end_and_writes_what_a_whole_read_wrote(
    tmp_path_factory: pytest.TempPathFactory,
    good: list[bytes],
    stale: list[bytes],
    tail: bytes,
    events_size: int,
    payload: list[bytes],
) -> None:
    """Any chain (entries past the events file's end, damaged ones, a torn tail) and any
    append: the chain reads back its last good entry from its end, as a whole read did."""
    run = tmp_path_factory.mktemp("chain")
    chain = b"".join(good + stale) + tail
    (run / seal.CHAIN_FILE).write_bytes(chain)
    lines = b"".join(line + b"\n" for line in payload)
    seal.append_entries(run, lines, events_size)
    assert (run / seal.CHAIN_FILE).read_bytes() == whole_chain_append(chain, lines, events_size)
