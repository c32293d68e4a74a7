"""The rewrite under every action: find the row, let the action edit a copy, write the change.

Only the changed row of `cases.jsonl` differs afterwards, byte for byte (its own JSON style and
line ending kept); the question and its seal never move; `set.json` `datasetVersion` is bumped
in place; one line goes to `golden-changes.jsonl`. Files are replaced through a rename, never
left half written.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pytest_evalloop.goldens.change import (
    CHANGES_FILE,
    Action,
    Change,
    ChangeRecord,
    Edit,
    GoldenRefused,
    GoldenUsageError,
)
from pytest_evalloop.identity import person
from pytest_evalloop.sets import cases as sets

#: golden keys whose whole content is not repeated in a change record (they only grow)
_GROWING_KEYS = frozenset({"history", "attestations"})


@dataclass
class Context:
    """What an action's edit is told about the row it changes: where, by whom, when."""

    set_dir: Path
    config: sets.SetConfig
    qid: str
    line: int
    by: str
    now: str
    today: str

    @property
    def where(self) -> str:
        return f"{self.set_dir / sets.CASES_FILE}:{self.line}"


def apply_change(
    set_dir: Path,
    qid: str,
    action: Action,
    *,
    by: str | None,
    why: str | None,
    edit: Callable[[dict[str, Any], Context], Edit],
) -> Change:
    """Find the row, let `edit` change a copy, and write the change everywhere it must go."""
    set_dir = Path(set_dir)
    config = load_config(set_dir)
    cases_path = set_dir / sets.CASES_FILE
    if not cases_path.is_file():
        raise GoldenUsageError(f"{cases_path}: missing; give a set directory")
    lines = cases_path.read_bytes().splitlines(keepends=True)
    index, old_row = _find_row(cases_path, lines, qid)
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    ctx = Context(
        set_dir=set_dir,
        config=config,
        qid=qid,
        line=index + 1,
        by=person(by),
        now=now.isoformat().replace("+00:00", "Z"),
        today=now.date().isoformat(),
    )
    done = edit(copy.deepcopy(old_row), ctx)
    new_row = done.row
    if done.bump_revision:
        _bump_revision(new_row, old_row)
    _check_row(new_row, old_row, ctx)
    old_sha = sets.dataset_sha(set_dir)
    lines[index] = _encode_like(new_row, lines[index])
    _write_atomic(cases_path, b"".join(lines))
    old_version, new_version = _bump_dataset_version(set_dir / sets.SET_FILE)
    record = ChangeRecord(
        at=ctx.now,
        action=action,
        qid=qid,
        by=ctx.by,
        why=why,
        line=ctx.line,
        old_golden_revision=golden_revision(old_row),
        new_golden_revision=golden_revision(new_row),
        old_status=(old_row.get("golden") or {}).get("status"),
        new_status=(new_row.get("golden") or {}).get("status"),
        old_dataset_version=old_version,
        new_dataset_version=new_version,
        old_dataset_sha=old_sha,
        new_dataset_sha=sets.dataset_sha(set_dir),
        changed=_changes(old_row, new_row),
        forced=done.forced,
        drift=done.drift,
    )
    _append_line(set_dir / CHANGES_FILE, record.model_dump_json(by_alias=True))
    return Change(
        set_dir=set_dir, record=record, scored_in=runs_that_scored(set_dir, qid), notes=done.notes
    )


def load_config(set_dir: Path) -> sets.SetConfig:
    """The set's set.json; a directory that is not a set is a usage error."""
    try:
        return sets.load_set_config(set_dir)
    except sets.SetError as exc:
        raise GoldenUsageError(
            f"{exc}; give a set directory (set.json beside cases.jsonl)"
        ) from exc


def _find_row(path: Path, lines: list[bytes], qid: str) -> tuple[int, dict[str, Any]]:
    """The index and parsed row of `qid`; a duplicate or unparseable target row is an error."""
    found: list[tuple[int, dict[str, Any]]] = []
    # A cheap pre-filter; a qid may be written raw or \u-escaped.
    needles = {qid.encode("utf-8"), json.dumps(qid)[1:-1].encode("ascii")}
    for index, raw in enumerate(lines):
        if not any(needle in raw for needle in needles):
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise GoldenUsageError(
                f"{path}:{index + 1}: invalid JSON at column {exc.colno} ({exc.msg}) on a line "
                f"naming {qid!r}; fix the line first"
            ) from exc
        if isinstance(row, dict) and row.get("qid") == qid:
            found.append((index, row))
    if not found:
        raise GoldenUsageError(
            f"{path}: no case with qid {qid!r}; list the qids with "
            f"`pytest {path.parent} --collect-only -q`"
        )
    if len(found) > 1:
        where = ", ".join(str(i + 1) for i, _ in found)
        raise GoldenUsageError(f"{path}: qid {qid!r} is on lines {where}; make qids unique first")
    index, row = found[0]
    question = row.get("question")
    stored = row.get("questionSha")
    problem = (
        sets.seal_problem(question, stored)
        if isinstance(question, str) and isinstance(stored, str)
        else None
    )
    if problem is not None:
        raise GoldenUsageError(
            f"{path}:{index + 1}: {qid}: {problem}; restore the seal before changing its golden"
        )
    return index, row


def _bump_revision(new_row: dict[str, Any], old_row: dict[str, Any]) -> None:
    # A row without goldenRevision holds revision 1, as in the reference sets.
    revision = (golden_revision(old_row) or 1) + 1
    if "goldenRevision" in new_row:
        new_row["goldenRevision"] = revision
        return
    items = list(new_row.items())
    new_row.clear()
    for key, value in items:
        new_row[key] = value
        if key == "golden":
            new_row["goldenRevision"] = revision
    new_row.setdefault("goldenRevision", revision)


def _check_row(new_row: dict[str, Any], old_row: dict[str, Any], ctx: Context) -> None:
    """Never write a row the loader would reject, nor one whose question moved."""
    for sealed in ("qid", "question", "questionSha"):
        if new_row.get(sealed) != old_row.get(sealed):  # pragma: no cover - a bug guard
            raise AssertionError(f"{ctx.where}: {sealed} of {ctx.qid} changed")
    try:
        sets.Case.model_validate(new_row)
    except ValidationError as exc:
        raise GoldenUsageError(
            f"{ctx.where}: the changed row of {ctx.qid} would not load: {exc.errors()[0]['msg']}"
            f" at {'.'.join(str(p) for p in exc.errors()[0]['loc'])}; fix the given value"
        ) from exc


def _changes(old_row: dict[str, Any], new_row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    changed: dict[str, dict[str, Any]] = {}
    if old_row.get("goldenRevision") != new_row.get("goldenRevision"):
        changed["goldenRevision"] = {
            "from": old_row.get("goldenRevision"),
            "to": new_row.get("goldenRevision"),
        }
    old, new = old_row.get("golden") or {}, new_row.get("golden") or {}
    for key in dict.fromkeys([*old, *new]):
        if old.get(key) == new.get(key):
            continue
        if key in _GROWING_KEYS:
            # Only the entry counts: the entries themselves are in the row.
            changed[f"golden.{key}"] = {
                "from": f"{len(old.get(key) or [])} entries",
                "to": f"{len(new.get(key) or [])} entries",
            }
        else:
            changed[f"golden.{key}"] = {"from": old.get(key), "to": new.get(key)}
    return changed


def _encode_like(row: dict[str, Any], original: bytes) -> bytes:
    """`row` as one JSON line in the style of `original` (separators, escaping, line ending)."""
    ending = original[len(original.rstrip(b"\r\n")) :] or b"\n"
    text = original.rstrip(b"\r\n").decode("utf-8")
    parsed = json.loads(text)
    styles = [
        (seps, ascii_only) for seps in ((", ", ": "), (",", ":")) for ascii_only in (False, True)
    ]
    seps, ascii_only = next(
        (s for s in styles if json.dumps(parsed, separators=s[0], ensure_ascii=s[1]) == text),
        ((", ", ": "), text.isascii()),
    )
    return json.dumps(row, separators=seps, ensure_ascii=ascii_only).encode("utf-8") + ending


_VERSION = re.compile(rb'("datasetVersion"\s*:\s*)(-?\d+)')


def _bump_dataset_version(path: Path) -> tuple[int | None, int]:
    """Raise `datasetVersion` by one in place; every other byte of set.json stays as it was."""
    data = path.read_bytes()
    match = _VERSION.search(data)
    if match is not None:
        old = int(match.group(2))
        new_data = data[: match.start(2)] + str(old + 1).encode() + data[match.end(2) :]
        _write_atomic(path, new_data)
        return old, old + 1
    if b'"datasetVersion"' in data:
        raise GoldenUsageError(
            f"{path}: datasetVersion is not an integer; set it to one (e.g. 1) and retry"
        )
    # No version yet: the set was version 1; insert 2 right after the opening brace, indented
    # like the first key so the file keeps its style.
    brace = data.index(b"{")
    rest = data[brace + 1 :]
    indent = re.match(rb"\s*", rest)
    lead = indent.group(0) if indent and indent.group(0) else b" "
    new_data = data[: brace + 1] + lead + b'"datasetVersion": 2,' + rest
    _write_atomic(path, new_data)
    return None, 2


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` through a temporary file and a rename: never half a file."""
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if path.exists():
            os.chmod(temp, path.stat().st_mode & 0o777)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _append_line(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def runs_that_scored(set_dir: Path, qid: str) -> list[str]:
    """Run directories under `<set>/runs` holding a `score` event for `qid`, oldest name first."""
    runs_dir = Path(set_dir) / "runs"
    found = []
    for events in sorted(runs_dir.glob("*/events.jsonl")):
        with events.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if qid not in line or '"score"' not in line:
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if event.get("kind") == "score" and event.get("qid") == qid:
                    found.append(str(events.parent))
                    break
    return found


def golden_of(row: dict[str, Any], ctx: Context) -> dict[str, Any]:
    golden = row.get("golden")
    if not isinstance(golden, dict):
        raise GoldenRefused(
            f"{ctx.where}: {row.get('qid')} has no golden; create one with "
            "`evalloop golden repair --kind ... --value ...`"
        )
    return golden


def golden_revision(row: dict[str, Any]) -> int | None:
    value = row.get("goldenRevision")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
