"""The runs index keeps each run's row between closes, and never shows a stale one.

The kept rows (`runs/.index-rows.json`) spare every close from reading the whole history of its
runs directory again; these tests hold that a kept row is only ever used for a run whose files
are as they were when it was made: whatever a hand edit changes (any byte of the ledger, run.json,
the chain, the seal or an artifact, the modification time put back afterwards), the index shows
what a fresh read of the ledger shows.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.report.runsindex import CACHE_FILE, files_stamp, index_rows
from tests.reportruns import two_runs


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs directory with two closed runs, `before` and `after`, made once per module."""
    set_dir, _, _, _ = two_runs(tmp_path_factory.mktemp("index-runs"))
    return set_dir / "runs"


def later() -> int:
    """A clock an hour ahead: every run's files count as settled (`FilesStamp.settled_before`)."""
    return time.time_ns() + 3600 * 10**9


def rows(runs: Path) -> list[dict[str, Any]]:
    """The index's rows, as a close an hour after the runs' last change reads them."""
    return index_rows(runs, clock=later)


def fresh_rows(runs: Path) -> list[dict[str, Any]]:
    """The rows made from the ledgers alone, no kept row read."""
    (runs / CACHE_FILE).unlink(missing_ok=True)
    return rows(runs)


def tick_past(run: Path) -> None:
    """Wait until the filesystem's clock has moved past every time the run's files carry, so an
    edit made next gets a later time (an order forced by watching the clock, not a sleep)."""
    newest = max(max(p.stat().st_ctime_ns, p.stat().st_mtime_ns) for p in run.rglob("*"))
    probe = run.parent / ".tick"
    while True:
        probe.write_bytes(b"")
        if probe.stat().st_ctime_ns > newest:
            probe.unlink()
            return


def copied(runs_dir: Path, where: Path) -> Path:
    target = where / "runs"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(runs_dir, target)
    return target


def test_a_kept_row_is_the_row_the_ledger_gives(runs_dir: Path, tmp_path: Path) -> None:
    runs = copied(runs_dir, tmp_path)
    made = fresh_rows(runs)
    assert (runs / CACHE_FILE).is_file()
    kept = rows(runs)
    assert kept == made
    after = {r["dir"]: r for r in kept}["after"]
    assert after["pass_rate"] == "83.3% (5/6)"


def test_each_row_is_kept_under_its_files_key(runs_dir: Path, tmp_path: Path) -> None:
    runs = copied(runs_dir, tmp_path)
    fresh_rows(runs)
    kept = json.loads((runs / CACHE_FILE).read_text())
    assert {name: entry["key"] for name, entry in kept["runs"].items()} == {
        name: files_stamp(runs / name).key for name in ("before", "after")
    }
    assert kept["runs"]["after"]["row"]["pass_rate"] == "83.3% (5/6)"


@pytest.mark.parametrize("garbage", ["", "{", "[]", '{"format": 1, "runs": {"after": 3}}'])
def test_a_broken_cache_is_made_again(runs_dir: Path, tmp_path: Path, garbage: str) -> None:
    runs = copied(runs_dir, tmp_path)
    made = fresh_rows(runs)
    (runs / CACHE_FILE).write_text(garbage)
    assert rows(runs) == made


def test_a_kept_row_with_a_forged_figure_is_not_believed_once_the_run_changes(
    runs_dir: Path, tmp_path: Path
) -> None:
    # A hand-edited cache can only lie about a run whose files it has the key of; the moment
    # the run changes, the row is made from the ledger again.
    runs = copied(runs_dir, tmp_path)
    fresh_rows(runs)
    data = json.loads((runs / CACHE_FILE).read_text())
    data["runs"]["after"]["row"]["pass_rate"] = "100.0% (6/6)"
    (runs / CACHE_FILE).write_text(json.dumps(data))
    events = runs / "after" / ledger.EVENTS_FILE
    tick_past(runs / "after")
    events.write_bytes(events.read_bytes())  # same bytes, a new write: the key moves
    assert {r["dir"]: r for r in rows(runs)}["after"]["pass_rate"] == "83.3% (5/6)"


def _files(run: Path) -> list[Path]:
    return sorted(p for p in run.rglob("*") if p.is_file())


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    which=st.sampled_from(["before", "after"]),
    file_pick=st.integers(min_value=0),
    offset_pick=st.integers(min_value=0),
    byte=st.integers(min_value=0, max_value=255),
)
@example(which="after", file_pick=0, offset_pick=0, byte=ord("x"))
def test_any_edit_with_its_time_put_back_shows_as_a_fresh_read_shows_it(
    runs_dir: Path, tmp_path: Path, which: str, file_pick: int, offset_pick: int, byte: int
) -> None:
    runs = copied(runs_dir, tmp_path)
    rows(runs)  # the rows kept, as a later close leaves them
    tick_past(runs)
    files = _files(runs / which)
    path = files[file_pick % len(files)]
    data = bytearray(path.read_bytes())
    if not data:
        return
    at = offset_pick % len(data)
    if data[at] == byte:
        byte = (byte + 1) % 256
    data[at] = byte
    before = path.stat()
    path.write_bytes(bytes(data))  # same size, one byte changed
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # its time put back
    shown = rows(runs)
    shutil.rmtree(tmp_path / "fresh", ignore_errors=True)
    assert shown == fresh_rows(copied(runs, tmp_path / "fresh"))
    if path.name == ledger.EVENTS_FILE or ledger.ARTIFACTS_DIR in path.relative_to(runs).parts:
        # Whatever the byte, a sealed run with a changed ledger or artifact is not what it was.
        # (The chain's own entries are an index into the ledger: a changed offset in one of
        # them, the ledger intact, may leave the evidence whole.)
        row = {r["dir"]: r for r in shown}[which]
        assert row["facts"].seal not in (None, "unsealed")


def test_a_run_changed_in_the_last_moment_is_not_kept(runs_dir: Path, tmp_path: Path) -> None:
    # Within a tick of the files' clock a same-size rewrite leaves every time as it was, so a
    # row is only kept for files that had settled when they were read.
    runs = copied(runs_dir, tmp_path)
    newest = max(max(p.stat().st_ctime_ns, p.stat().st_mtime_ns) for p in runs.rglob("*"))
    index_rows(runs, clock=lambda: newest)
    assert json.loads((runs / CACHE_FILE).read_text())["runs"] == {}
    rows(runs)
    assert set(json.loads((runs / CACHE_FILE).read_text())["runs"]) == {"before", "after"}


def test_a_folder_in_the_cache_file_s_place_leaves_no_litter(
    runs_dir: Path, tmp_path: Path
) -> None:
    runs = copied(runs_dir, tmp_path)
    made = fresh_rows(runs)
    (runs / CACHE_FILE).unlink()
    (runs / CACHE_FILE).mkdir()
    assert rows(runs) == made
    assert not [p.name for p in runs.iterdir() if p.name.startswith(f".{CACHE_FILE}")]


def test_a_run_whose_name_is_not_utf8_is_listed(runs_dir: Path, tmp_path: Path) -> None:
    runs = copied(runs_dir, tmp_path)
    odd = os.fsdecode(b"bad\xff")
    shutil.copytree(runs / "before", runs / odd)
    stamp = files_stamp(runs / odd)
    assert stamp.key != files_stamp(runs / "before").key
