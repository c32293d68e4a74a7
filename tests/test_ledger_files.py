"""A run's ledger files that are not regular files are refused up front (`ledger.files`).

Found by a hostile review: `evalloop gate` printed a traceback when `events.jsonl` was a
directory or a link to a /proc file (the gate's record was appended through it), or when
`events.chain` was a directory; it hung for ever when any of `events.jsonl`, `events.chain`,
`run.json` or `seal.json` was a named pipe (so did validate, report, flips and noise on a pipe
for `seal.json`); and `evalloop flips` read a run whose `events.jsonl` was a pipe or a
directory as a run without events and exited 0. Every command now names the file, what it is
and what to do, and exits with its status for a run it cannot read: 2, or 7 under a gate.

Each kind of file is made by the test itself; none is opened by it. The gate runs in a child
process with a timeout: a regression that waits on a pipe fails the test instead of hanging the
suite (the timeout is a hang guard, never a measurement).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.cli import main as evalloop
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import files, seal
from pytest_evalloop.ledger.contract import ScoreEvent
from pytest_evalloop.ledger.reader import read_run
from pytest_evalloop.ledger.writer import LedgerWriter
from pytest_evalloop.measure.gate import EXIT_HARNESS_FAILURE
from tests.test_flips import write_run

BASE = {f"q{i}": "no_match" if i < 6 else "match" for i in range(10)}
FIXED = {q: "match" for q in BASE}

KINDS: dict[str, Callable[[Path], None]] = {
    "directory": lambda path: path.mkdir(),
    "dangling link": lambda path: path.symlink_to(path.parent / "nowhere"),
    # A process's environment, readable as a file that states 0 bytes.
    "link to /proc": lambda path: path.symlink_to(f"/proc/{os.getpid()}/environ"),
    "named pipe": lambda path: os.mkfifo(path),
}
SAID = {
    "directory": "is a directory, not a regular file",
    "dangling link": "nowhere, which does not exist), not the run's own file",
    "link to /proc": f"is a symbolic link (to /proc/{os.getpid()}/environ)",
    "named pipe": "is a named pipe (FIFO), not a regular file",
}
FILES = (ledger.RUN_FILE, ledger.EVENTS_FILE, seal.CHAIN_FILE, seal.SEAL_FILE)
HANG_GUARD_S = 120
"""A child command that has not ended by then waits on a pipe: a regression, reported as one."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs folder holding `base` and `cur`: two closed, sealed runs a gate accepts."""
    runs = tmp_path_factory.mktemp("pair") / "runs"
    write_run(runs, "base", BASE)
    write_run(runs, "cur", FIXED)
    return runs


def broken(pair: Path, tmp_path: Path, kind: str, name: str) -> tuple[Path, Path]:
    """A copy of the pair whose current run has `name` replaced by a file of `kind`."""
    runs = tmp_path / "runs"
    shutil.copytree(pair, runs, symlinks=True)
    path = runs / "cur" / name
    path.unlink()
    KINDS[kind](path)
    return runs / "base", runs / "cur"


def snapshot(run_dir: Path) -> dict[str, bytes | str]:
    """What a run directory holds, without opening anything that is not a regular file."""
    out: dict[str, bytes | str] = {}
    for path in sorted(run_dir.iterdir()):
        if path.is_symlink():
            out[path.name] = f"link to {os.readlink(path)}"
        elif path.is_file():
            out[path.name] = path.read_bytes()
        else:
            out[path.name] = "not a file"
    return out


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_gate_refuses_a_ledger_file_that_is_not_a_regular_file(
    pair: Path, tmp_path: Path, kind: str, name: str
) -> None:
    base, cur = broken(pair, tmp_path, kind, name)
    before = snapshot(cur), snapshot(base)
    done = subprocess.run(
        [sys.executable, "-m", "pytest_evalloop.cli", "gate", str(base), str(cur)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == EXIT_HARNESS_FAILURE, done.stderr
    # One line: the file, what it is, what to do.
    assert done.stderr.startswith(f"evalloop gate: {cur / name} ")
    assert SAID[kind] in done.stderr and "run it again" in done.stderr
    # Refused before anything was written: no gate record on either run, no report.
    assert (snapshot(cur), snapshot(base)) == before


def test_the_gate_with_gate_off_exits_2_on_a_run_it_cannot_read(
    pair: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, cur = broken(pair, tmp_path, "directory", ledger.EVENTS_FILE)
    assert evalloop(["gate", str(base), str(cur), "--eval-gate=off"]) == 2
    assert SAID["directory"] in capsys.readouterr().err


def test_the_gate_names_the_run_it_could_not_read(
    pair: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A regular run.json that is not JSON is read, and found unreadable, by the gate's own
    # function: it once blamed the baseline for the current run.
    runs = tmp_path / "runs"
    shutil.copytree(pair, runs)
    (runs / "cur" / ledger.RUN_FILE).write_text("{not json\n")
    code = evalloop(["gate", str(runs / "base"), str(runs / "cur"), "--eval-report=off"])
    assert code == EXIT_HARNESS_FAILURE
    assert capsys.readouterr().out.startswith(f"this run: run {runs / 'cur'} cannot be read")


# Each command that reads a run directory, what it exits with for one it cannot read, and its
# arguments (the broken run is `cur`). `set.json` beside the runs only for review's set check.
COMMANDS: dict[str, tuple[int, Callable[[Path, Path], list[str]]]] = {
    "validate": (2, lambda base, cur: ["validate", str(cur)]),
    "report": (2, lambda base, cur: ["report", str(cur)]),
    "report --baseline": (2, lambda base, cur: ["report", str(base), "--baseline", str(cur)]),
    "flips": (2, lambda base, cur: ["flips", str(base), str(cur)]),
    "flips --gate": (EXIT_HARNESS_FAILURE, lambda b, c: ["flips", str(b), str(c), "--gate", "bar"]),
    "noise": (2, lambda base, cur: ["noise", str(base), str(cur)]),
    "issues": (2, lambda base, cur: ["issues", str(cur)]),
    "issue": (2, lambda base, cur: ["issue", str(cur), "i1", "--status", "fixed"]),
    "diagnose": (2, lambda base, cur: ["diagnose", str(cur)]),
    "improve": (2, lambda base, cur: ["improve", str(cur), "--issue", "i1"]),
    "review": (
        1,
        lambda base, cur: (
            ["review", str(cur), "q0", "--verdict", "match", "--why", "w"]
            + ["--by", "tester", "--set", str(cur.parent)]
        ),
    ),
    "merge": (1, lambda base, cur: ["merge", str(cur), str(base), "-o", str(cur.parent / "m")]),
}


@pytest.mark.timeout(HANG_GUARD_S)  # a regression waits on the pipe: it fails, never hangs
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_refuses_a_run_whose_ledger_is_not_a_regular_file(
    pair: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, kind: str
) -> None:
    base, cur = broken(pair, tmp_path, kind, ledger.EVENTS_FILE)
    (cur.parent / "set.json").write_text('{"name": "pair"}\n')
    before = snapshot(cur)
    code, argv = COMMANDS[command]
    assert evalloop(argv(base, cur)) == code
    err = capsys.readouterr().err
    assert "events.jsonl" in err and SAID[kind] in err, err
    assert snapshot(cur) == before  # nothing appended, through a link or otherwise


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_run_with_such_a_file_is_read_as_refused_whole(
    pair: Path, tmp_path: Path, kind: str, name: str
) -> None:
    # The one place every command reads through: the reader and the seal check refuse it
    # before a byte is read, naming the file.
    _, cur = broken(pair, tmp_path, kind, name)
    read = read_run(cur)
    assert read.info is None and read.events == []
    [error] = read.errors
    assert error.where == str(cur / name) and error.message.startswith(f"{name} is ")
    assert SAID[kind] in error.message
    check = seal.verify(cur)
    assert check.broken is not None and check.broken.startswith(f"{cur / name} is ")
    assert SAID[kind] in check.broken


@pytest.mark.timeout(HANG_GUARD_S)  # before: the append's open waited for a reader of the pipe
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_writer_never_appends_to_a_ledger_that_is_not_a_regular_file(
    pair: Path, tmp_path: Path, kind: str
) -> None:
    _, cur = broken(pair, tmp_path, kind, ledger.EVENTS_FILE)
    event = ScoreEvent(qid="q0", sample=None, phase="baseline", verdict="match", reason="r")
    with pytest.raises(files.LedgerFileError, match="events.jsonl is "):
        LedgerWriter(cur).append(event)
    assert not (cur / "nowhere").exists()  # a dangling link's target was never created


def test_the_writer_never_writes_through_a_link_out_of_the_run(pair: Path, tmp_path: Path) -> None:
    # A link planted as the ledger once took the gate's record into the file it named.
    outside = tmp_path / "someone-elses.txt"
    outside.write_text("theirs\n")
    _, cur = broken(pair, tmp_path, "directory", ledger.EVENTS_FILE)
    (cur / ledger.EVENTS_FILE).rmdir()
    (cur / ledger.EVENTS_FILE).symlink_to(outside)
    event = ScoreEvent(qid="q0", sample=None, phase="baseline", verdict="match", reason="r")
    with pytest.raises(files.LedgerFileError, match="symbolic link"):
        LedgerWriter(cur).append(event)
    assert outside.read_text() == "theirs\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens a file whatever its mode")
def test_a_ledger_file_this_user_cannot_read_is_named(
    pair: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, cur = broken(pair, tmp_path, "directory", ledger.EVENTS_FILE)
    (cur / ledger.EVENTS_FILE).rmdir()
    shutil.copy(base / ledger.EVENTS_FILE, cur / ledger.EVENTS_FILE)
    (cur / ledger.EVENTS_FILE).chmod(0)
    try:
        assert evalloop(["validate", str(cur)]) == 2
        assert evalloop(["flips", str(base), str(cur), "--gate", "bar"]) == EXIT_HARNESS_FAILURE
    finally:
        (cur / ledger.EVENTS_FILE).chmod(0o644)
    err = capsys.readouterr().err
    assert "events.jsonl is a file this user cannot open (Permission denied)" in err


def test_a_ledger_file_that_cannot_be_opened_is_named_as_root_too(
    pair: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test above as root, who opens any mode: the open fails as it would for another user.
    base, cur = broken(pair, tmp_path, "directory", ledger.EVENTS_FILE)
    (cur / ledger.EVENTS_FILE).rmdir()
    shutil.copy(base / ledger.EVENTS_FILE, cur / ledger.EVENTS_FILE)
    real_open = os.open

    def denied(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if Path(path) == cur / ledger.EVENTS_FILE:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    assert evalloop(["validate", str(cur)]) == 2
    assert evalloop(["flips", str(base), str(cur), "--gate", "bar"]) == EXIT_HARNESS_FAILURE
    err = capsys.readouterr().err
    assert "events.jsonl is a file this user cannot open (Permission denied)" in err


def test_plain_flips_reports_a_changed_ledger_and_leaves_the_exit_to_a_gate(
    pair: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/measurement.md: without a gate a run that cannot carry a decision (changed after it
    # closed, a torn line) is printed as a WARNING and the exit status is 0; --gate makes it 7.
    # Only a run that cannot be read at all exits 2 (the tests above).
    runs = tmp_path / "runs"
    shutil.copytree(pair, runs)
    events = runs / "cur" / ledger.EVENTS_FILE
    events.write_bytes(events.read_bytes().replace(b'"match"', b'"no_match"', 1))
    base, cur = str(runs / "base"), str(runs / "cur")
    assert evalloop(["flips", base, cur]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "WARNING: these runs cannot carry a decision" in out
    assert "events.jsonl line 2 changed after it was written" in out
    assert evalloop(["flips", base, cur, "--gate", "bar"]) == EXIT_HARNESS_FAILURE


def own_copy(pair: Path, tmp_path: Path) -> Path:
    """A copy of the pair's runs folder, this test's to change."""
    runs = tmp_path / "runs"
    shutil.copytree(pair, runs)
    return runs


def test_the_writer_never_appends_to_a_ledger_another_run_shares(
    pair: Path, tmp_path: Path
) -> None:
    # Found by the hostile pass: a copy made with `cp -al`, resumed, appended into the run it
    # was copied from, whose chain then broke.
    runs = own_copy(pair, tmp_path)
    original = runs / "cur"
    copy = runs / "copy"
    shutil.copytree(original, copy, copy_function=os.link)
    before = (original / ledger.EVENTS_FILE).read_bytes()
    event = ScoreEvent(qid="q0", sample=None, phase="baseline", verdict="match", reason="r")
    with pytest.raises(files.LedgerFileError, match="hard links: another run shares this file"):
        LedgerWriter(copy).append(event)
    assert (original / ledger.EVENTS_FILE).read_bytes() == before
    assert seal.verify(original).broken is None


def test_run_json_is_never_written_through_a_planted_temporary_name(
    pair: Path, tmp_path: Path
) -> None:
    # Found by the hostile pass: a link planted at run.json's temporary name took its bytes
    # out of the run; a pipe there made the write wait.
    from pytest_evalloop.ledger.writer import update_run_info

    run = own_copy(pair, tmp_path) / "cur"
    outside = tmp_path / "outside.txt"
    outside.write_text("theirs\n")
    (run / f".run.json.{os.getpid()}.tmp").symlink_to(outside)
    update_run_info(run, gate={"said": "renamed"})
    assert outside.read_text() == "theirs\n"
    assert not (run / ledger.RUN_FILE).is_symlink()
    os.mkfifo(run / f".run.json.{os.getpid()}.tmp")
    update_run_info(run, gate={"said": "again"})  # no wait on the pipe: its name is replaced
    assert '"again"' in (run / ledger.RUN_FILE).read_text()
    assert seal.verify(run).broken is None


@pytest.mark.timeout(HANG_GUARD_S)  # before: the report's open of a pipe waited for a writer
def test_an_artifact_is_read_only_as_a_regular_file_of_the_run(tmp_path: Path) -> None:
    # Found by the hostile pass: a pipe as an artifact hung `evalloop gate` (its report),
    # `evalloop report` and every page of `evalloop view`.
    from pytest_evalloop.diagnose.evidence import read_artifact
    from pytest_evalloop.report.report import _load_json

    (tmp_path / "ok.json").write_text('{"rows": [[1]]}')
    os.mkfifo(tmp_path / "pipe.json")
    outside = tmp_path.parent / "outside.json"
    outside.write_text('{"secret": 1}')
    (tmp_path / "link.json").symlink_to(outside)
    (tmp_path / "folder.json").mkdir()
    assert files.artifact_bytes(tmp_path / "ok.json") == b'{"rows": [[1]]}'
    for name in ("pipe.json", "link.json", "missing.json", "folder.json"):
        assert files.artifact_bytes(tmp_path / name) is None
        assert _load_json(str(tmp_path / name)) is None
        assert read_artifact(tmp_path, name) is None
    assert read_artifact(tmp_path, "ok.json") == {"rows": [[1]]}
