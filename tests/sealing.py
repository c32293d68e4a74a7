"""Tests that set a scenario up by editing a stored run by hand make it a run that closed so.

An edit to `events.jsonl`, `run.json` or `artifacts/` breaks the run's chain and seal (that is
what they are for: `ledger.seal`). A test that means "a run that closed with these lines" (a
harness error, a second judge, a case in two shards) chains the lines as they now are and seals
the run again, as the writer would have had it written them.
"""

from __future__ import annotations

from pathlib import Path

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import seal
from pytest_evalloop.ledger.writer import seal_run


def closed_as_is(run_dir: Path) -> None:
    """Chain `run_dir`'s events as they are on disk and seal it."""
    data = (run_dir / ledger.EVENTS_FILE).read_bytes()
    (run_dir / seal.CHAIN_FILE).write_bytes(seal.file_entries(data))
    seal_run(run_dir)
