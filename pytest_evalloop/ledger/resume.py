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
from pytest_evalloop.ledger import files
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
        # Per attempt (`_slot`), where its score lines start: one int for the one line most
        # attempts have, a list past that (a run of 50,000 attempts keeps 50,000 of these).
        self._scores: dict[str | tuple[str, Any], int | list[int]] = {}

    def get(self, qid: str, sample: int | None) -> Any | None:
        """The attempt's counted score event (`judgesamples.counted`), or None."""
        from pytest_evalloop.judge.judgesamples import counted

        self._catch_up()
        found = self._offsets(qid, sample)
        if not found:
            return None
        events = self._read_back(found, (qid, sample))
        if events is None:
            # The lines are not where they were read (the file rewritten in place): read it all
            # again, as for a file replaced.
            self._inode, self._offset, self._scores = None, 0, {}
            self._catch_up()
            found = self._offsets(qid, sample)
            events = self._read_back(found, (qid, sample)) if found else None
        return counted(events) if events else None

    def _offsets(self, qid: str, sample: int | None) -> list[int]:
        held = self._scores.get(_slot(qid, sample))
        if held is None:
            return []
        return [held] if isinstance(held, int) else held

    def _read_back(self, offsets: list[int], key: tuple[str, int | None]) -> list[Any] | None:
        # Only where each score line starts is kept (a run of 50,000 attempts would otherwise
        # hold every score in memory to the session's end); the few asked for are read again.
        events = []
        try:
            with files.open_binary(self.path) as handle:
                for offset in offsets:
                    handle.seek(offset)
                    data = from_json(handle.readline())
                    if not isinstance(data, dict) or data.get("kind") != "score":
                        return None
                    if _key(data) != key:
                        return None
                    events.append(ledger_reader.LightEvent(data))
        except (OSError, ValueError):
            return None
        return events

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
        try:
            handle = files.open_binary(self.path)
        except (files.LedgerFileError, FileNotFoundError):
            return  # not a ledger (a pipe, a link): the writer refuses it and says so
        with handle:
            handle.seek(self._offset)
            appended = handle.read(stat.st_size - self._offset)
        # Whole lines only: a line being written now is read on the next look.
        whole = appended.rfind(b"\n") + 1
        start = self._offset
        for line in appended[:whole].split(b"\n"):
            if line.startswith(_SCORE_LINE) or (b"score" in line and not line.startswith(_OURS)):
                self._take(line, start)
            start += len(line) + 1
        self._offset += whole

    def _take(self, line: bytes, offset: int) -> None:
        try:
            data = from_json(line)
        except ValueError:
            return  # a torn line: `evalloop validate` reports it, it scores nothing
        if isinstance(data, dict) and data.get("kind") == "score" and "qid" in data:
            slot = _slot(*_key(data))
            held = self._scores.get(slot)
            if held is None:
                self._scores[slot] = offset
            elif isinstance(held, int):
                self._scores[slot] = [held, offset]
            else:
                held.append(offset)


def _key(data: dict[str, Any]) -> tuple[str, int | None]:
    return (str(data.get("qid")), data.get("sample"))


def _slot(qid: str, sample: Any) -> str | tuple[str, Any]:
    """An attempt's key in the index: its qid alone when it has no sample (most runs)."""
    return qid if sample is None else (qid, sample)
