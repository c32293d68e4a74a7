"""The golden side door: `evalloop golden promote|attest|repair|hold|release <set> <qid>`.

Seed 004's rule: a golden that is wrong, doubted or not yet verified is fixed outside the
improve loop, and every fix is a recorded change. Each action here rewrites exactly one row of
`cases.jsonl` (every other line stays byte-identical, the question and its seal are never
touched), bumps `set.json` `datasetVersion` in place, and appends one line to
`<set>/golden-changes.jsonl` saying who changed what, when and why, with the old and new golden
revision and dataset sha. A change that moves the key a judge scores against (repair) or takes
a golden in or out of scoring (hold, release) also bumps the row's `goldenRevision`, so old
scores keep the revision they were judged under and never mix with new ones.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import getpass
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from pytest_evalloop import sets

CHANGES_FILE = "golden-changes.jsonl"
#: statuses a hold sets; a held golden is not scored (judge.golden_gate refuses it)
HELD_STATUSES = frozenset({"ambiguous", "invalid"})
#: golden kinds with no value to re-derive: only a person can vouch for them
NOTHING_TO_DERIVE = frozenset({"unanswerable", "criteria"})
#: golden keys whose whole content is not repeated in a change record (they only grow)
_GROWING_KEYS = frozenset({"history", "attestations"})

Action = Literal["promote", "attest", "repair", "hold", "release"]
ModelQueryRunner = Callable[[str], list[dict[str, Any]]]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2


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


@dataclass
class Change:
    """The outcome of one action: the record written and the runs that scored the case."""

    set_dir: Path
    record: ChangeRecord
    scored_in: list[str]

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


# ----------------------------------------------------------------------------- the actions


def promote(
    set_dir: Path,
    qid: str,
    *,
    by: str | None = None,
    model_query_runner: ModelQueryRunner | None = None,
) -> Change:
    """Make a provisional golden `verified` once two derivations on the truth data agree.

    Needs an embedded set (the truth connection), `verification.primaryAxis` and `variesAxis`
    naming different axes, and `verify_case` clean on the canonical query, the second query and
    (when the case has one) the model query. Anything else is refused with what is missing.
    The model query runs through `model_query_runner`, by default the set's own sandbox.
    """

    def edit(row: dict[str, Any], ctx: _Context) -> Edit:
        golden = _golden_of(row, ctx)
        status = golden.get("status")
        if status not in (None, "provisional"):
            raise GoldenRefused(
                f"{ctx.where}: golden of {qid} is {status!r}, not provisional; promote only "
                f"lifts provisional goldens ({_status_hint(status)})"
            )
        _require_derivable(golden, ctx)
        _require_two_derivations(golden, ctx)
        runner = model_query_runner or _default_runner(ctx, row)
        drifts = _drift_messages(row, ctx.set_dir, runner)
        if drifts:
            raise GoldenRefused(
                f"{ctx.where}: golden of {qid} does not re-derive; not promoted:\n  "
                + "\n  ".join(drifts)
                + "\nfix the value with `evalloop golden repair`, or the queries, then retry"
            )
        routes = "canonicalQuery and verification.secondQuery agreed on the truth connection"
        if row.get("modelQuery"):
            routes += "; modelQuery reproduced it through the answerer-facing query path"
        golden["status"] = "verified"
        golden["verifiedBy"] = f"promoted by {ctx.by}: {routes} ({ctx.today})"
        return Edit(row=row, bump_revision=False)

    return _apply(set_dir, qid, "promote", by=by, why=None, edit=edit)


def attest(set_dir: Path, qid: str, *, by: str, note: str | None = None) -> Change:
    """A named person vouches for a golden: it becomes `verified`, with who and when recorded.

    The attestation is appended to the golden's `attestations` list. A held golden (ambiguous,
    invalid) is refused: release or repair it instead.
    """
    name = (by or "").strip()
    if not name:
        raise GoldenUsageError(
            f"attest of {qid} needs the name of the person vouching for it: --by '<name>'"
        )

    def edit(row: dict[str, Any], ctx: _Context) -> Edit:
        golden = _golden_of(row, ctx)
        status = golden.get("status")
        if status in HELD_STATUSES or status == "verified_wrong":
            raise GoldenRefused(
                f"{ctx.where}: golden of {qid} is {status!r}; an attestation cannot vouch for a "
                f"held or wrong key ({_status_hint(status)})"
            )
        entry: dict[str, Any] = {"by": name, "at": ctx.now, "goldenRevision": _revision(row)}
        if note:
            entry["note"] = note
        golden.setdefault("attestations", []).append(entry)
        golden["status"] = "verified"
        golden["verifiedBy"] = f"attested by {name} ({ctx.today})"
        return Edit(row=row, bump_revision=False)

    return _apply(set_dir, qid, "attest", by=name, why=note, edit=edit)


def repair(
    set_dir: Path,
    qid: str,
    *,
    reason: str,
    value: Any = None,
    rows_file: Path | None = None,
    kind: str | None = None,
    canonical_query: str | None = None,
    second_query: str | None = None,
    primary_axis: str | None = None,
    varies_axis: str | None = None,
    force: bool = False,
    by: str | None = None,
    model_query_runner: ModelQueryRunner | None = None,
) -> Change:
    """Replace a golden's value (or artifact) and bump `goldenRevision`; the old key is kept.

    The previous value goes to `golden.history` with its revision, status, the reason and the
    date. On an embedded set the new golden is re-derived on the truth connection and a drift
    refuses the repair unless `force` (then the drift is recorded). On a set without a truth
    connection the new golden is `provisional` until someone attests it.
    """
    _require_reason("repair", qid, reason)

    def edit(row: dict[str, Any], ctx: _Context) -> Edit:
        old = copy.deepcopy(row.get("golden") or {})
        golden = row.setdefault("golden", {})
        new_kind = kind or golden.get("kind")
        if not new_kind:
            raise GoldenUsageError(f"{ctx.where}: {qid} has no golden kind; pass --kind")
        golden["kind"] = new_kind
        _set_key(golden, ctx, value=value, rows_file=rows_file)
        if canonical_query is not None:
            golden["canonicalQuery"] = canonical_query
        for key, given in (
            ("secondQuery", second_query),
            ("primaryAxis", primary_axis),
            ("variesAxis", varies_axis),
        ):
            if given is not None:
                golden.setdefault("verification", {})[key] = given
        _check_shape(golden, ctx)
        if _same_key(old, golden):
            raise GoldenRefused(
                f"{ctx.where}: the repair leaves the golden of {qid} as it was; give a "
                "different --value/--rows-file, --kind or query"
            )
        for held_key in ("reason", "heldFrom"):
            golden.pop(held_key, None)
        drifts = _repair_drift(row, ctx, model_query_runner)
        if drifts and not force:
            raise GoldenRefused(
                f"{ctx.where}: the new golden of {qid} does not re-derive on the truth "
                "connection; not repaired:\n  "
                + "\n  ".join(drifts)
                + "\nfix the value (or pass --canonical-query/--second-query), or pass --force"
                " to record the override"
            )
        golden["status"], golden["verifiedBy"] = _repaired_status(row, ctx, drifts)
        golden.setdefault("history", []).append(_history_entry(old, row, ctx, reason))
        return Edit(row=row, bump_revision=True, forced=bool(drifts), drift=drifts)

    return _apply(set_dir, qid, "repair", by=by, why=reason, edit=edit)


def hold(
    set_dir: Path,
    qid: str,
    *,
    reason: str,
    status: Literal["ambiguous", "invalid"] = "ambiguous",
    by: str | None = None,
) -> Change:
    """Mark a golden `ambiguous` (or `invalid`) so it is not scored; the old key stays.

    `reason` should name the defect and the competing replacements (not a new number). The
    status before the hold is kept in `golden.heldFrom` for `release`.
    """
    _require_reason("hold", qid, reason)
    if status not in HELD_STATUSES:
        raise GoldenUsageError(f"hold status must be ambiguous or invalid, got {status!r}")

    def edit(row: dict[str, Any], ctx: _Context) -> Edit:
        golden = _golden_of(row, ctx)
        current = golden.get("status")
        if current == status:
            raise GoldenRefused(
                f"{ctx.where}: golden of {qid} is already {status}; release or repair it"
            )
        if current not in HELD_STATUSES:
            golden["heldFrom"] = current
        golden["status"] = status
        golden["reason"] = reason
        return Edit(row=row, bump_revision=True)

    return _apply(set_dir, qid, "hold", by=by, why=reason, edit=edit)


def release(set_dir: Path, qid: str, *, reason: str, by: str | None = None) -> Change:
    """Undo a hold: the golden returns to the status it had before (`provisional` if unknown)."""
    _require_reason("release", qid, reason)

    def edit(row: dict[str, Any], ctx: _Context) -> Edit:
        golden = _golden_of(row, ctx)
        current = golden.get("status")
        if current not in HELD_STATUSES:
            raise GoldenRefused(
                f"{ctx.where}: golden of {qid} is {current!r}, not held (ambiguous/invalid); "
                "there is nothing to release"
            )
        before = golden.pop("heldFrom", "provisional")
        golden.pop("reason", None)
        if before is None:
            golden.pop("status", None)
        else:
            golden["status"] = before
        return Edit(row=row, bump_revision=True)

    return _apply(set_dir, qid, "release", by=by, why=reason, edit=edit)


# ----------------------------------------------------------------------------- rules


def _golden_of(row: dict[str, Any], ctx: _Context) -> dict[str, Any]:
    golden = row.get("golden")
    if not isinstance(golden, dict):
        raise GoldenRefused(
            f"{ctx.where}: {row.get('qid')} has no golden; create one with "
            "`evalloop golden repair --kind ... --value ...`"
        )
    return golden


def _status_hint(status: Any) -> str:
    if status in HELD_STATUSES:
        return "it is held: `release` it, or `repair` it with a new value"
    if status == "verified":
        return "it is already verified; `attest` adds a person's word to it"
    return "repair it, or hold it"


def _require_reason(action: str, qid: str, reason: str) -> None:
    if not (reason or "").strip():
        raise GoldenUsageError(f"{action} of {qid} needs --reason '<why>': the change is recorded")


def _require_derivable(golden: dict[str, Any], ctx: _Context) -> None:
    kind = golden.get("kind")
    if kind in NOTHING_TO_DERIVE:
        raise GoldenRefused(
            f"{ctx.where}: a {kind} golden has no value to re-derive; a person vouches for it "
            f'instead: `evalloop golden attest {ctx.set_dir} {ctx.qid} --by "<name>"`'
        )
    if not ctx.embedded:
        raise GoldenRefused(
            f"{ctx.where}: {ctx.set_dir / sets.SET_FILE} declares no embedded target, so this set "
            "has no truth connection to re-derive the golden on; not promoted. Have a person "
            f'check it and run `evalloop golden attest {ctx.set_dir} {ctx.qid} --by "<name>"`'
        )


def _require_two_derivations(golden: dict[str, Any], ctx: _Context) -> None:
    from pytest_evalloop.embedded.goldens import derivation_problems

    problems = derivation_problems(ctx.qid, golden)
    if problems:
        raise GoldenRefused(
            f"{ctx.where}: golden of {ctx.qid} is not derived two ways; not promoted:\n  "
            + "\n  ".join(problems)
            + "\nadd the missing derivation (`evalloop golden repair --second-query ...`) or "
            "have a person attest the golden"
        )


def _drift_messages(
    row: dict[str, Any], set_dir: Path, runner: ModelQueryRunner | None
) -> list[str]:
    from pytest_evalloop.embedded.goldens import verify_case

    return [
        f"route {d.route}: {d.message}"
        for d in verify_case(row, set_dir, model_query_runner=runner)
    ]


def _default_runner(ctx: _Context, row: dict[str, Any]) -> ModelQueryRunner | None:
    """The answerer-facing query path of the set's own model, when the case has a modelQuery."""
    model_file = (ctx.config.target or {}).get("model")
    if not row.get("modelQuery") or not model_file:
        return None
    from pytest_evalloop.embedded.goldens import data_dir_for
    from pytest_evalloop.embedded.model import SemanticModel
    from pytest_evalloop.embedded.sandbox import Sandbox

    sandbox = Sandbox(SemanticModel.load(ctx.set_dir / str(model_file)), data_dir_for(ctx.set_dir))

    def run(sql: str) -> list[dict[str, Any]]:
        return sandbox.execute(sql).rows

    return run


def _set_key(golden: dict[str, Any], ctx: _Context, *, value: Any, rows_file: Path | None) -> None:
    """Put the new value (inline) or artifact path (`--rows-file`) on the golden."""
    if rows_file is not None:
        golden["path"] = _artifact_path(rows_file, ctx)
        golden.pop("value", None)
    elif value is not None:
        golden["value"] = value
        golden.pop("path", None)
    elif golden.get("kind") in NOTHING_TO_DERIVE:
        golden.pop("value", None)
        golden.pop("path", None)


def _artifact_path(rows_file: Path, ctx: _Context) -> str:
    path = Path(rows_file)
    resolved = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if not resolved.is_file() and not path.is_absolute():
        # `--rows-file gold/<qid>.json` names the artifact inside the set, from wherever it runs.
        resolved = (ctx.set_dir / path).resolve()
    if not resolved.is_file():
        raise GoldenUsageError(f"--rows-file {rows_file}: no such file; write the rows there first")
    root = ctx.set_dir.resolve()
    if not resolved.is_relative_to(root):
        raise GoldenUsageError(
            f"--rows-file {rows_file} is outside the set {ctx.set_dir}; gold artifacts live in the"
            " set directory (never in the served model's tree): move it there"
        )
    try:
        rows = json.loads(resolved.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise GoldenUsageError(
            f"--rows-file {rows_file}:{exc.lineno}: invalid JSON: {exc.msg}"
        ) from exc
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise GoldenUsageError(f"--rows-file {rows_file} must hold a JSON list of row objects")
    return resolved.relative_to(root).as_posix()


def _check_shape(golden: dict[str, Any], ctx: _Context) -> None:
    kind = golden.get("kind")
    try:
        value = sets.golden_value(ctx.set_dir, golden)
    except sets.GoldenArtifactError as exc:
        raise GoldenUsageError(f"{ctx.where}: repair of {ctx.qid}: {exc}") from exc
    problem = None
    if kind not in ("scalar", "rows", *NOTHING_TO_DERIVE):
        problem = f"kind {kind!r} is not one of scalar, rows, unanswerable, criteria"
    elif kind == "scalar" and not isinstance(value, dict):
        problem = f"a scalar golden value must be an object of named figures, got {value!r:.80}"
    elif kind == "rows" and not (
        isinstance(value, list) and all(isinstance(r, dict) for r in value)
    ):
        problem = f"a rows golden value must be a list of row objects, got {value!r:.80}"
    elif kind == "criteria" and not golden.get("rubric"):
        problem = "a criteria golden needs a rubric"
    if problem:
        raise GoldenUsageError(f"{ctx.where}: repair of {ctx.qid}: {problem}; fix --value/--kind")


def _same_key(old: dict[str, Any], new: dict[str, Any]) -> bool:
    keys = ("kind", "value", "path", "canonicalQuery")
    same = all(old.get(k) == new.get(k) for k in keys)
    old_v, new_v = old.get("verification") or {}, new.get("verification") or {}
    derivation = ("secondQuery", "primaryAxis", "variesAxis")
    return same and all(old_v.get(k) == new_v.get(k) for k in derivation)


def _repair_drift(row: dict[str, Any], ctx: _Context, runner: ModelQueryRunner | None) -> list[str]:
    golden = row["golden"]
    if not ctx.embedded or golden.get("kind") in NOTHING_TO_DERIVE:
        return []
    return _drift_messages(row, ctx.set_dir, runner or _default_runner(ctx, row))


def _repaired_status(row: dict[str, Any], ctx: _Context, drifts: list[str]) -> tuple[str, str]:
    kind = row["golden"].get("kind")
    if drifts:
        # Forced past its re-derivation, the key is someone's say-so: not verified (and so not
        # scored) until `promote` re-derives it or a person attests it.
        return "provisional", (
            f"repair forced by {ctx.by} over {len(drifts)} drift(s) ({ctx.today}); not verified "
            "until it re-derives (`evalloop golden promote`) or a person attests it"
        )
    if kind in NOTHING_TO_DERIVE:
        return "verified", f"repair by {ctx.by}: a {kind} golden, decided by a person ({ctx.today})"
    if ctx.embedded:
        return "verified", (
            f"repair by {ctx.by}: re-derived by canonicalQuery and verification.secondQuery on the"
            f" truth connection ({ctx.today})"
        )
    return "provisional", f"repair by {ctx.by}: not re-derived, no truth connection ({ctx.today})"


def _history_entry(
    old: dict[str, Any], row: dict[str, Any], ctx: _Context, reason: str
) -> dict[str, Any]:
    entry: dict[str, Any] = {"goldenRevision": _revision(row), "status": old.get("status")}
    for key in ("kind", "value", "path", "canonicalQuery", "verifiedBy"):
        if key in old:
            entry[key] = old[key]
    second = (old.get("verification") or {}).get("secondQuery")
    if second is not None:
        entry["secondQuery"] = second
    entry.update({"replaced": ctx.now, "by": ctx.by, "reason": reason})
    return entry


def _revision(row: dict[str, Any]) -> int | None:
    value = row.get("goldenRevision")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ----------------------------------------------------------------------------- the rewrite


@dataclass
class _Context:
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

    @property
    def embedded(self) -> bool:
        return (self.config.target or {}).get("kind") == "embedded"


def _apply(
    set_dir: Path,
    qid: str,
    action: Action,
    *,
    by: str | None,
    why: str | None,
    edit: Callable[[dict[str, Any], _Context], Edit],
) -> Change:
    """Find the row, let `edit` change a copy, and write the change everywhere it must go."""
    set_dir = Path(set_dir)
    try:
        config = sets.load_set_config(set_dir)
    except sets.SetError as exc:
        raise GoldenUsageError(
            f"{exc}; give a set directory (set.json beside cases.jsonl)"
        ) from exc
    cases_path = set_dir / sets.CASES_FILE
    if not cases_path.is_file():
        raise GoldenUsageError(f"{cases_path}: missing; give a set directory")
    lines = cases_path.read_bytes().splitlines(keepends=True)
    index, old_row = _find_row(cases_path, lines, qid)
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    ctx = _Context(
        set_dir=set_dir,
        config=config,
        qid=qid,
        line=index + 1,
        by=(by or "").strip() or _who(),
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
        old_golden_revision=_revision(old_row),
        new_golden_revision=_revision(new_row),
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
    return Change(set_dir=set_dir, record=record, scored_in=runs_that_scored(set_dir, qid))


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


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
    if isinstance(question, str) and stored and not sets.question_sha(question).startswith(stored):
        raise GoldenUsageError(
            f"{path}:{index + 1}: {qid}: question edited after sealing (questionSha {stored!r});"
            " restore the question before changing its golden"
        )
    return index, row


def _bump_revision(new_row: dict[str, Any], old_row: dict[str, Any]) -> None:
    # A row without goldenRevision holds revision 1, as in the reference sets.
    revision = (_revision(old_row) or 1) + 1
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


def _check_row(new_row: dict[str, Any], old_row: dict[str, Any], ctx: _Context) -> None:
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


def _short(value: Any, width: int = 100) -> str:
    if value is None:
        return "(absent)"
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


# ----------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    """The parser of `evalloop golden <action> <set dir> <qid> ...`."""
    parser = argparse.ArgumentParser(
        prog="evalloop golden",
        description="Change one golden through the side door: a recorded change with "
        "goldenRevision/datasetVersion bumps (docs/golden-side-door.md).",
    )
    sub = parser.add_subparsers(dest="action", required=True)

    def action(name: str, text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=text, description=text)
        cmd.add_argument("set_dir", type=Path, help="the set directory (set.json, cases.jsonl)")
        cmd.add_argument("qid", help="the case whose golden changes")
        return cmd

    cmd = action("promote", "provisional -> verified, once two derivations on the truth agree")
    cmd.add_argument("--by", help="who promotes it (default: the current user)")
    cmd = action("attest", "a named person vouches for the golden (status verified)")
    cmd.add_argument("--by", required=True, help="the person attesting (required)")
    cmd.add_argument("--note", help="what they checked")
    cmd = action("repair", "replace the golden's value; the old one goes to golden.history")
    key = cmd.add_mutually_exclusive_group()
    key.add_argument("--value", help="the new golden value as JSON")
    key.add_argument("--rows-file", type=Path, help="a JSON rows artifact inside the set dir")
    cmd.add_argument("--kind", choices=["scalar", "rows", "unanswerable", "criteria"])
    cmd.add_argument("--canonical-query", help="new golden.canonicalQuery (truth SQL)")
    cmd.add_argument("--second-query", help="new golden.verification.secondQuery")
    cmd.add_argument("--primary-axis", help="new verification.primaryAxis (canonical's route)")
    cmd.add_argument("--varies-axis", help="new verification.variesAxis (what the second varies)")
    cmd.add_argument("--reason", required=True, help="why the old golden was wrong")
    cmd.add_argument("--force", action="store_true", help="repair despite drift (recorded)")
    cmd.add_argument("--by", help="who repairs it (default: the current user)")
    cmd = action("hold", "mark the golden ambiguous (or invalid): it is not scored")
    cmd.add_argument("--reason", required=True, help="the defect and competing replacements")
    cmd.add_argument("--invalid", action="store_true", help="the question itself is unusable")
    cmd.add_argument("--by", help="who holds it (default: the current user)")
    cmd = action("release", "undo a hold: the golden returns to its status before the hold")
    cmd.add_argument("--reason", required=True, help="why the held key stands after all")
    cmd.add_argument("--by", help="who releases it (default: the current user)")
    return parser


def _run(args: argparse.Namespace) -> Change:
    common = {"by": args.by}
    if args.action == "promote":
        return promote(args.set_dir, args.qid, **common)
    if args.action == "attest":
        return attest(args.set_dir, args.qid, by=args.by, note=args.note)
    if args.action == "hold":
        status: Literal["ambiguous", "invalid"] = "invalid" if args.invalid else "ambiguous"
        return hold(args.set_dir, args.qid, reason=args.reason, status=status, **common)
    if args.action == "release":
        return release(args.set_dir, args.qid, reason=args.reason, **common)
    value = None
    if args.value is not None:
        try:
            value = json.loads(args.value)
        except json.JSONDecodeError as exc:
            raise GoldenUsageError(
                f"--value {args.value!r:.80} is not JSON ({exc.msg} at column {exc.colno}); "
                "quote it, e.g. --value '{\"orders\": 125}'"
            ) from exc
    elif args.rows_file is None and args.kind not in NOTHING_TO_DERIVE:
        raise GoldenUsageError(
            f"repair of {args.qid} needs the new key: --value '<json>' or --rows-file F "
            "(or --kind unanswerable/criteria)"
        )
    return repair(
        args.set_dir,
        args.qid,
        reason=args.reason,
        value=value,
        rows_file=args.rows_file,
        kind=args.kind,
        canonical_query=args.canonical_query,
        second_query=args.second_query,
        primary_axis=args.primary_axis,
        varies_axis=args.varies_axis,
        force=args.force,
        **common,
    )


def golden_main(argv: list[str]) -> int:
    """Run `evalloop golden ...`: 0 changed, 1 refused, 2 usage error."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_OK if exc.code in (0, None) else EXIT_USAGE
    try:
        change = _run(args)
    except GoldenUsageError as exc:
        print(f"evalloop golden {args.action}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except GoldenRefused as exc:
        print(f"evalloop golden {args.action}: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print("\n".join(change.lines()))
    return EXIT_OK
