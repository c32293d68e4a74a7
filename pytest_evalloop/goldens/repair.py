"""Moving a golden's key or its place in scoring: `repair` (a new value, the old one kept in
`golden.history`), `hold` (ambiguous or invalid: not scored) and `release` (undo a hold). Each
bumps the row's `goldenRevision`, so old scores keep the revision they were judged under.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Literal

from pytest_evalloop.goldens.change import (
    HELD_STATUSES,
    Change,
    Edit,
    GoldenRefused,
    GoldenUsageError,
)
from pytest_evalloop.goldens.rederive import Rederivation
from pytest_evalloop.goldens.rewrite import Context, apply_change, golden_of, golden_revision
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.targets.embedded.goldens import NOTHING_TO_DERIVE, ModelQueryRunner


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
    target: str | None = None,
) -> Change:
    """Replace a golden's value (or artifact) and bump `goldenRevision`; the old key is kept.

    The previous value goes to `golden.history` with its revision, status, the reason and the
    date. On a set with a truth connection (an embedded target, or a Malloy truth package) the
    new golden is re-derived on it and a drift refuses the repair unless `force` (then the
    drift is recorded). On a set without one the new golden is `provisional` until someone
    attests it.
    """
    _require_reason("repair", qid, reason)

    def edit(row: dict[str, Any], ctx: Context) -> Edit:
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
        rederive = Rederivation(ctx.set_dir, ctx.config, target=target)
        try:
            drifts = _repair_drift(row, rederive, model_query_runner)
        finally:
            rederive.close()
        if drifts and not force:
            raise GoldenRefused(
                f"{ctx.where}: the new golden of {qid} does not re-derive on the truth "
                "connection; not repaired:\n  "
                + "\n  ".join(drifts)
                + "\nfix the value (or pass --canonical-query/--second-query), or pass --force"
                " to record the override"
            )
        golden["status"], golden["verifiedBy"] = _repaired_status(
            row, ctx, drifts, truth=rederive.has_truth
        )
        golden.setdefault("history", []).append(_history_entry(old, row, ctx, reason))
        return Edit(row=row, bump_revision=True, forced=bool(drifts), drift=drifts)

    return apply_change(set_dir, qid, "repair", by=by, why=reason, edit=edit)


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

    def edit(row: dict[str, Any], ctx: Context) -> Edit:
        golden = golden_of(row, ctx)
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

    return apply_change(set_dir, qid, "hold", by=by, why=reason, edit=edit)


def release(set_dir: Path, qid: str, *, reason: str, by: str | None = None) -> Change:
    """Undo a hold: the golden returns to the status it had before (`provisional` if unknown)."""
    _require_reason("release", qid, reason)

    def edit(row: dict[str, Any], ctx: Context) -> Edit:
        golden = golden_of(row, ctx)
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

    return apply_change(set_dir, qid, "release", by=by, why=reason, edit=edit)


def _require_reason(action: str, qid: str, reason: str) -> None:
    if not (reason or "").strip():
        raise GoldenUsageError(f"{action} of {qid} needs --reason '<why>': the change is recorded")


def _set_key(golden: dict[str, Any], ctx: Context, *, value: Any, rows_file: Path | None) -> None:
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


def _artifact_path(rows_file: Path, ctx: Context) -> str:
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


def _check_shape(golden: dict[str, Any], ctx: Context) -> None:
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


def _repair_drift(
    row: dict[str, Any], rederive: Rederivation, runner: ModelQueryRunner | None
) -> list[str]:
    golden = row["golden"]
    if not rederive.has_truth or golden.get("kind") in NOTHING_TO_DERIVE:
        return []
    return rederive.drift_messages(row, runner or rederive.model_runner(row))


def _repaired_status(
    row: dict[str, Any], ctx: Context, drifts: list[str], *, truth: bool
) -> tuple[str, str]:
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
    if truth:
        return "verified", (
            f"repair by {ctx.by}: re-derived by canonicalQuery and verification.secondQuery on the"
            f" truth connection ({ctx.today})"
        )
    return "provisional", f"repair by {ctx.by}: not re-derived, no truth connection ({ctx.today})"


def _history_entry(
    old: dict[str, Any], row: dict[str, Any], ctx: Context, reason: str
) -> dict[str, Any]:
    entry: dict[str, Any] = {"goldenRevision": golden_revision(row), "status": old.get("status")}
    for key in ("kind", "value", "path", "canonicalQuery", "verifiedBy"):
        if key in old:
            entry[key] = old[key]
    second = (old.get("verification") or {}).get("secondQuery")
    if second is not None:
        entry["secondQuery"] = second
    entry.update({"replaced": ctx.now, "by": ctx.by, "reason": reason})
    return entry
