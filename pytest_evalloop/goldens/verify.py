"""Making a golden `verified`: `promote` (two derivations on the truth data agree), `attest` (a
named person vouches for it, never against the truth data) and `attest_all` (every provisional
golden the truth data reproduces, one recorded change each). All re-derive on the set's truth
connection (`rederive.Rederivation`): the embedded target's tables or the Malloy truth package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalloop.goldens.change import (
    HELD_STATUSES,
    Change,
    Edit,
    GoldenRefused,
    GoldenUsageError,
)
from pytest_evalloop.goldens.rederive import Rederivation
from pytest_evalloop.goldens.rewrite import (
    Context,
    apply_change,
    golden_of,
    golden_revision,
    load_config,
)
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.targets.embedded.goldens import (
    NOTHING_TO_DERIVE,
    ModelQueryRunner,
    derivation_problems,
)


def promote(
    set_dir: Path,
    qid: str,
    *,
    by: str | None = None,
    model_query_runner: ModelQueryRunner | None = None,
    target: str | None = None,
) -> Change:
    """Make a provisional golden `verified` once two derivations on the truth data agree.

    Needs a truth connection, `verification.primaryAxis` and `variesAxis` naming different
    axes, and every route clean on the canonical query, the second query and (when the case
    has one) the model query, compared by value. Anything else is refused with what is missing.
    The model query runs through `model_query_runner`, by default the set's own answerer-facing
    query path (the embedded sandbox, or the Malloy package in restricted mode).
    """

    def edit(row: dict[str, Any], ctx: Context) -> Edit:
        golden = golden_of(row, ctx)
        status = golden.get("status")
        if status not in (None, "provisional"):
            raise GoldenRefused(
                f"{ctx.where}: golden of {qid} is {status!r}, not provisional; promote only "
                f"lifts provisional goldens ({_status_hint(status)})"
            )
        with _rederivation(ctx, target, None) as rederive:
            _require_derivable(golden, ctx, rederive)
            _require_two_derivations(golden, ctx)
            runner = model_query_runner or rederive.model_runner(row)
            found = rederive.derive(row, runner)
        drifts = [f"route {d.route}: {d.message}" for d in found.drifts]
        if drifts:
            raise GoldenRefused(
                f"{ctx.where}: golden of {qid} does not re-derive; not promoted:\n  "
                + "\n  ".join(drifts)
                + "\nfix the value with `evalloop golden repair`, or the queries, then retry"
            )
        routes = "canonicalQuery and verification.secondQuery agreed on the truth connection"
        if runner is not None:
            routes += "; modelQuery reproduced it through the answerer-facing query path"
        if found.paired:
            routes += f" (columns paired by value: {'; '.join(found.paired_lines())})"
        golden["status"] = "verified"
        golden["verifiedBy"] = f"promoted by {ctx.by}: {routes} ({ctx.today})"
        return Edit(row=row, bump_revision=False)

    return apply_change(set_dir, qid, "promote", by=by, why=None, edit=edit)


def attest(
    set_dir: Path,
    qid: str,
    *,
    by: str,
    note: str | None = None,
    target: str | None = None,
    rederive: Rederivation | None = None,
) -> Change:
    """A named person vouches for a golden: it becomes `verified`, with who and when recorded.

    The attestation is appended to the golden's `attestations` list. A held golden (ambiguous,
    invalid) is refused: release or repair it instead. On a set with a truth connection the
    canonical query runs first, and a golden it contradicts (or cannot derive) is refused.
    `rederive`, when given, is a truth connection shared by several attestations.
    """
    name = _name(by, qid)

    def edit(row: dict[str, Any], ctx: Context) -> Edit:
        golden = golden_of(row, ctx)
        status = golden.get("status")
        if status in HELD_STATUSES or status == "verified_wrong":
            raise GoldenRefused(
                f"{ctx.where}: golden of {qid} is {status!r}; an attestation cannot vouch for a "
                f"held or wrong key ({_status_hint(status)})"
            )
        with _rederivation(ctx, target, rederive) as shared:
            contradicted = _truth_contradicts(row, golden, shared)
            notes = _unchecked(golden, shared, name)
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
        return Edit(row=row, bump_revision=False, notes=notes)

    return apply_change(set_dir, qid, "attest", by=name, why=note, edit=edit)


@dataclass
class BulkAttestation:
    """`attest --all-provisional`: one change per golden attested, and each one refused."""

    set_dir: Path
    attested: list[Change] = field(default_factory=list)
    refused: dict[str, tuple[int, str]] = field(default_factory=dict)
    """qid -> its line of cases.jsonl and why it was not attested (contradicted, nothing to
    derive it by, no truth connection)."""

    def lines(self) -> list[str]:
        """The terminal report: what was attested, what was refused and why, what next."""
        out = [
            f"attest --all-provisional {self.set_dir}: {len(self.attested)} attested, "
            f"{len(self.refused)} refused"
        ]
        for change in self.attested:
            rec = change.record
            out.append(
                f"  attested {rec.qid} ({self.set_dir / sets.CASES_FILE}:{rec.line}): "
                f"datasetVersion {rec.old_dataset_version} -> {rec.new_dataset_version}"
            )
        for qid, (line, why) in self.refused.items():
            first, *rest = why.splitlines()
            out.append(f"  refused {qid} ({sets.CASES_FILE}:{line}): {first}")
            out.extend(f"    {text.strip()}" for text in rest)
        if self.attested:
            out.append(f"  recorded in {self.set_dir / 'golden-changes.jsonl'} (one line each)")
        if self.refused:
            out.append(
                "next: repair a contradicted golden (`evalloop golden repair`), or check a "
                "golden by hand and attest it alone (`evalloop golden attest <set> <qid> --by "
                '"<name>"`)'
            )
        return out


def attest_all(
    set_dir: Path, *, by: str, note: str | None = None, target: str | None = None
) -> BulkAttestation:
    """Attest every provisional golden of the set the truth data reproduces: one recorded
    change per golden (its own `golden-changes.jsonl` line and `datasetVersion` bump).

    A bulk attestation stands on the data: a golden the canonical query contradicts, one it
    cannot derive (no canonical query, a query that does not run) and one with no value to
    derive (unanswerable, criteria: a person attests each alone) are refused and listed. A set
    without a truth connection has nothing to reproduce its goldens: every one is refused.
    """
    name = _name(by, "--all-provisional")
    set_dir = Path(set_dir)
    config = load_config(set_dir)
    result = BulkAttestation(set_dir)
    provisional = [
        (line, case.raw())
        for line, case in sets.load_cases(set_dir).rows
        if case.golden is not None and case.golden.status == "provisional"
    ]
    if not provisional:
        return result
    rederive = Rederivation(set_dir, config, target=target)
    try:
        for line, row in provisional:
            qid = str(row["qid"])
            why = _cannot_bulk_attest(row, rederive)
            if why is not None:
                result.refused[qid] = (line, why)
                continue
            try:
                change = attest(set_dir, qid, by=name, note=note, target=target, rederive=rederive)
            except GoldenRefused as exc:
                result.refused[qid] = (line, str(exc))
            else:
                result.attested.append(change)
    finally:
        rederive.close()
    return result


def _cannot_bulk_attest(row: dict[str, Any], rederive: Rederivation) -> str | None:
    """Why a provisional golden is not attested in bulk (the data does not reproduce it)."""
    golden = row.get("golden") or {}
    kind = golden.get("kind")
    if not rederive.has_truth:
        from pytest_evalloop.targets.choice import no_truth_reason

        why = no_truth_reason(rederive.set_dir, rederive.config)
        return f"{why}: nothing reproduces the golden; check it and attest it alone"
    if kind in NOTHING_TO_DERIVE:
        return (
            f"the golden is {kind}: no value to re-derive; a person checks it and attests it alone"
        )
    if not golden.get("canonicalQuery"):
        return "no canonicalQuery derives the golden; check it and attest it alone"
    canonical = [d for d in rederive.derive(row).drifts if d.route == "canonical"]
    if any(d.problem == "disagrees" for d in canonical):
        return "contradicted by the truth data: " + "; ".join(d.detail for d in canonical)
    if canonical:
        return "; ".join(d.detail or d.message for d in canonical)
    return None


def _name(by: str, what: str) -> str:
    name = (by or "").strip()
    if not name:
        raise GoldenUsageError(
            f"attest of {what} needs the name of the person vouching for it: --by '<name>'"
        )
    return name


class _rederivation:
    """`with`: the shared Rederivation when given (left open), else one for this change."""

    def __init__(self, ctx: Context, target: str | None, shared: Rederivation | None) -> None:
        self.ctx, self.target, self.shared = ctx, target, shared
        self.own: Rederivation | None = None

    def __enter__(self) -> Rederivation:
        if self.shared is not None:
            return self.shared
        self.own = Rederivation(self.ctx.set_dir, self.ctx.config, target=self.target)
        return self.own

    def __exit__(self, *exc: object) -> None:
        if self.own is not None:
            self.own.close()


def _truth_contradicts(
    row: dict[str, Any], golden: dict[str, Any], rederive: Rederivation
) -> list[str]:
    """What the truth connection derives against the stored golden ([] when it agrees, or when
    there is nothing to derive on: no truth connection, a kind without a value, no canonical
    query). A person's word vouches for a key the data cannot check, never against the data;
    a canonical query that cannot run is no check at all, so it refuses too."""
    if not rederive.has_truth or golden.get("kind") in NOTHING_TO_DERIVE:
        return []
    if not golden.get("canonicalQuery"):
        return []
    return [m for m in rederive.drift_messages(row, None) if m.startswith("route canonical")]


def _unchecked(golden: dict[str, Any], rederive: Rederivation, name: str) -> list[str]:
    """What the report says when the attestation was not checked against the truth data."""
    if rederive.has_truth or golden.get("kind") in NOTHING_TO_DERIVE:
        return []
    from pytest_evalloop.targets.choice import no_truth_reason

    why = no_truth_reason(rederive.set_dir, rederive.config)
    return [f"not re-derived ({why}): the golden stands on {name}'s word alone"]


def _status_hint(status: Any) -> str:
    if status in HELD_STATUSES:
        return "it is held: `release` it, or `repair` it with a new value"
    if status == "verified":
        return "it is already verified; `attest` adds a person's word to it"
    return "repair it, or hold it"


def _require_derivable(golden: dict[str, Any], ctx: Context, rederive: Rederivation) -> None:
    kind = golden.get("kind")
    if kind in NOTHING_TO_DERIVE:
        raise GoldenRefused(
            f"{ctx.where}: a {kind} golden has no value to re-derive; a person vouches for it "
            f'instead: `evalloop golden attest {ctx.set_dir} {ctx.qid} --by "<name>"`'
        )
    if not rederive.has_truth:
        raise GoldenRefused(
            f"{ctx.where}: {ctx.set_dir / sets.SET_FILE} names no truth connection (no "
            "truthPackage, no embedded target), so the golden cannot be re-derived; not "
            f"promoted. Have a person check it and run `evalloop golden attest {ctx.set_dir} "
            f'{ctx.qid} --by "<name>"`'
        )


def _require_two_derivations(golden: dict[str, Any], ctx: Context) -> None:

    problems = derivation_problems(ctx.qid, golden)
    if problems:
        raise GoldenRefused(
            f"{ctx.where}: golden of {ctx.qid} is not derived two ways; not promoted:\n  "
            + "\n  ".join(problems)
            + "\nadd the missing derivation (`evalloop golden repair --second-query ...`) or "
            "have a person attest the golden"
        )
