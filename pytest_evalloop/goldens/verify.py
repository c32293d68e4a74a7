"""Making a golden `verified`: `promote` (two derivations on the truth data agree) and `attest`
(a named person vouches for it); and the re-derivation that `promote` and `repair` both run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_evalloop.goldens.change import (
    HELD_STATUSES,
    Change,
    Edit,
    GoldenRefused,
    GoldenUsageError,
)
from pytest_evalloop.goldens.rewrite import Context, apply_change, golden_of, golden_revision
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.targets.embedded.goldens import NOTHING_TO_DERIVE, ModelQueryRunner


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

    def edit(row: dict[str, Any], ctx: Context) -> Edit:
        golden = golden_of(row, ctx)
        status = golden.get("status")
        if status not in (None, "provisional"):
            raise GoldenRefused(
                f"{ctx.where}: golden of {qid} is {status!r}, not provisional; promote only "
                f"lifts provisional goldens ({_status_hint(status)})"
            )
        _require_derivable(golden, ctx)
        _require_two_derivations(golden, ctx)
        runner = model_query_runner or default_runner(ctx, row)
        drifts = drift_messages(row, ctx.set_dir, runner)
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

    return apply_change(set_dir, qid, "promote", by=by, why=None, edit=edit)


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

    def edit(row: dict[str, Any], ctx: Context) -> Edit:
        golden = golden_of(row, ctx)
        status = golden.get("status")
        if status in HELD_STATUSES or status == "verified_wrong":
            raise GoldenRefused(
                f"{ctx.where}: golden of {qid} is {status!r}; an attestation cannot vouch for a "
                f"held or wrong key ({_status_hint(status)})"
            )
        contradicted = _truth_contradicts(row, golden, ctx)
        if contradicted:
            raise GoldenRefused(
                f"{ctx.where}: golden of {qid} is contradicted by the truth data; not attested:"
                "\n  " + "\n  ".join(contradicted) + "\nfix the value with `evalloop golden "
                "repair` (or the canonical query, or the truth data), then attest it"
            )
        entry: dict[str, Any] = {"by": name, "at": ctx.now, "goldenRevision": golden_revision(row)}
        if note:
            entry["note"] = note
        golden.setdefault("attestations", []).append(entry)
        golden["status"] = "verified"
        golden["verifiedBy"] = f"attested by {name} ({ctx.today})"
        return Edit(row=row, bump_revision=False)

    return apply_change(set_dir, qid, "attest", by=name, why=note, edit=edit)


def _truth_contradicts(row: dict[str, Any], golden: dict[str, Any], ctx: Context) -> list[str]:
    """What the truth connection derives against the stored golden ([] when it agrees, or when
    there is nothing to derive on: no embedded set, a kind without a value, no canonical
    query). A person's word vouches for a key the data cannot check, never against the data."""
    if not ctx.embedded or golden.get("kind") in NOTHING_TO_DERIVE:
        return []
    if not golden.get("canonicalQuery"):
        return []
    return [m for m in drift_messages(row, ctx.set_dir, None) if "route canonical" in m]


def _status_hint(status: Any) -> str:
    if status in HELD_STATUSES:
        return "it is held: `release` it, or `repair` it with a new value"
    if status == "verified":
        return "it is already verified; `attest` adds a person's word to it"
    return "repair it, or hold it"


def _require_derivable(golden: dict[str, Any], ctx: Context) -> None:
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


def _require_two_derivations(golden: dict[str, Any], ctx: Context) -> None:
    from pytest_evalloop.targets.embedded.goldens import derivation_problems

    problems = derivation_problems(ctx.qid, golden)
    if problems:
        raise GoldenRefused(
            f"{ctx.where}: golden of {ctx.qid} is not derived two ways; not promoted:\n  "
            + "\n  ".join(problems)
            + "\nadd the missing derivation (`evalloop golden repair --second-query ...`) or "
            "have a person attest the golden"
        )


def drift_messages(
    row: dict[str, Any], set_dir: Path, runner: ModelQueryRunner | None
) -> list[str]:
    from pytest_evalloop.targets.embedded.goldens import verify_case

    return [
        f"route {d.route}: {d.message}"
        for d in verify_case(row, set_dir, model_query_runner=runner)
    ]


def default_runner(ctx: Context, row: dict[str, Any]) -> ModelQueryRunner | None:
    """The answerer-facing query path of the set's own model, when the case has a modelQuery."""
    model_file = (ctx.config.target or {}).get("model")
    if not row.get("modelQuery") or not model_file:
        return None
    from pytest_evalloop.targets.embedded.goldens import data_dir_for
    from pytest_evalloop.targets.embedded.model import SemanticModel
    from pytest_evalloop.targets.embedded.sandbox import Sandbox

    sandbox = Sandbox(SemanticModel.load(ctx.set_dir / str(model_file)), data_dir_for(ctx.set_dir))

    def run(sql: str) -> list[dict[str, Any]]:
        return sandbox.execute(sql).rows

    return run
