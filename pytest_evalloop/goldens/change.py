"""One recorded change to a golden: its log record, the two ways a change fails, the report.

`ChangeRecord` is a line of `<set>/golden-changes.jsonl`; `Change` is what an action returns
(the record and the runs that scored the case) and prints. A usage error (no such set or qid, a
bad value) exits 2, a refusal (drift, nothing derived it, the wrong status) exits 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from pytest_evalloop.sets import cases as sets

CHANGES_FILE = "golden-changes.jsonl"
#: statuses a hold sets; a held golden is not scored (judge.golden_gate refuses it)
HELD_STATUSES = frozenset({"ambiguous", "invalid"})

Action = Literal["promote", "attest", "repair", "hold", "release"]


class GoldenUsageError(Exception):
    """The command cannot run as given (no such set or qid, bad value): exit status 2."""


class GoldenRefused(Exception):
    """The change was understood and refused (drift, nothing derived it, wrong status): exit 1."""


class ChangeRecord(BaseModel):
    """One line of `golden-changes.jsonl`: a single recorded change to one golden."""

    # camelCase on disk, like every other file of a set
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    at: str
    action: Action
    qid: str
    by: str
    why: str | None = None
    line: int
    old_golden_revision: int | None
    new_golden_revision: int | None
    old_status: str | None
    new_status: str | None
    old_dataset_version: int | None
    new_dataset_version: int
    old_dataset_sha: str
    new_dataset_sha: str
    changed: dict[str, dict[str, Any]] = Field(default_factory=dict)
    forced: bool = False
    drift: list[str] = Field(default_factory=list)


@dataclass
class Edit:
    """What an action did to a row: the new row, and how the change is to be recorded."""

    row: dict[str, Any]
    bump_revision: bool
    forced: bool = False
    drift: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the report says besides the record (what was not re-derived, and why)."""


@dataclass
class Change:
    """The outcome of one action: the record written and the runs that scored the case."""

    set_dir: Path
    record: ChangeRecord
    scored_in: list[str]
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """What changed and what to do next, for the terminal."""
        rec = self.record
        out = [
            f"{rec.action} {rec.qid} ({self.set_dir / sets.CASES_FILE}:{rec.line}) by {rec.by}",
            f"  golden.status: {rec.old_status} -> {rec.new_status}",
            f"  goldenRevision: {rec.old_golden_revision} -> {rec.new_golden_revision}",
            f"  datasetVersion: {rec.old_dataset_version} -> {rec.new_dataset_version}",
            f"  datasetSha: {rec.old_dataset_sha[:12]} -> {rec.new_dataset_sha[:12]}",
        ]
        for key, diff in rec.changed.items():
            if key not in ("golden.status", "goldenRevision"):
                out.append(f"  {key}: {_short(diff.get('from'))} -> {_short(diff.get('to'))}")
        if rec.forced:
            out.append(f"  FORCED over {len(rec.drift)} drift(s): " + "; ".join(rec.drift))
        out.extend(f"  {note}" for note in self.notes)
        out.append(f"  recorded in {self.set_dir / CHANGES_FILE}")
        out.extend(self._next_steps())
        return out

    def _next_steps(self) -> list[str]:
        rec = self.record
        if rec.new_status in HELD_STATUSES:
            return [
                f"next: {rec.qid} is not scored (golden_{rec.new_status}) until "
                f"`evalloop golden release` or `evalloop golden repair`; its old scores keep "
                f"goldenRevision {rec.old_golden_revision} and must not enter an aggregate"
            ]
        if rec.new_status == "provisional" and rec.forced:
            return [
                f"next: the forced golden of {rec.qid} is provisional, so it is not scored, until "
                f"it re-derives: fix the value or the queries and run `evalloop golden promote "
                f"{self.set_dir} {rec.qid}`, or have a person check it and run `evalloop golden "
                f'attest {self.set_dir} {rec.qid} --by "<name>"`'
            ]
        if rec.new_status == "provisional":
            return [
                f"next: nothing re-derived the new value; once a person has checked it, run "
                f'`evalloop golden attest {self.set_dir} {rec.qid} --by "<name>"`'
            ]
        runs = self.scored_in or ["<run>"]
        steps = ["next: rejudge the runs that scored this case (stored answers, fresh judge):"]
        steps += [f"  pytest {self.set_dir} --eval-rejudge-from={run}" for run in runs]
        if not self.scored_in:
            steps.append(f"  (no run under {self.set_dir / 'runs'} has a score for {rec.qid})")
        return steps


def _short(value: Any, width: int = 100) -> str:
    if value is None:
        return "(absent)"
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."
