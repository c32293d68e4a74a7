"""Which attempts of a run are scored already: the resume rule, across sessions and within one.

An attempt that has a score is never answered again. That holds for `--eval-resume` (a run an
earlier session left unfinished) and within one session: when an xdist worker dies, xdist hands
the items it had not reported to another worker, and the dead worker may have scored some of
them already, since it starts items ahead of their turn. So every process looks an attempt up
here right before answering it, not when it is scheduled.

Cheap on purpose, since it is asked once per attempt: the index remembers how far it read
`events.jsonl` and reads only what was appended since (nothing but a `stat` when nothing was),
and of that it parses the score lines only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic_core import from_json

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader

# Our writer puts `kind` first; a line of another writer may put it anywhere.
_SCORE_LINE = b'{"kind": "score"'
_OURS = b'{"kind": "'


class ScoredAttempts:
    """The score of each attempt `(qid, sample)` of one run, as far as its ledger says now.

    Not thread-safe: one runtime asks it from its event loop only.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / ledger.EVENTS_FILE
        self._offset = 0
        self._inode: int | None = None
        self._scores: dict[tuple[str, int | None], list[Any]] = {}

    def get(self, qid: str, sample: int | None) -> Any | None:
        """The attempt's counted score event (`judgesamples.counted`), or None."""
        from pytest_evalloop.judge.judgesamples import counted

        self._catch_up()
        found = self._scores.get((qid, sample))
        return counted(found) if found else None

    def _catch_up(self) -> None:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return
        if stat.st_ino != self._inode or stat.st_size < self._offset:
            # Not the file we read (replaced by hand): start over.
            self._inode, self._offset, self._scores = stat.st_ino, 0, {}
        if stat.st_size == self._offset:
            return
        with open(self.path, "rb") as handle:
            handle.seek(self._offset)
            appended = handle.read(stat.st_size - self._offset)
        # Whole lines only: a line being written now is read on the next look.
        whole = appended.rfind(b"\n") + 1
        for line in appended[:whole].split(b"\n"):
            if line.startswith(_SCORE_LINE) or (b"score" in line and not line.startswith(_OURS)):
                self._take(line)
        self._offset += whole

    def _take(self, line: bytes) -> None:
        try:
            data = from_json(line)
        except ValueError:
            return  # a torn line: `evalloop validate` reports it, it scores nothing
        if isinstance(data, dict) and data.get("kind") == "score" and "qid" in data:
            key = (str(data["qid"]), data.get("sample"))
            self._scores.setdefault(key, []).append(ledger_reader.LightEvent(data))
