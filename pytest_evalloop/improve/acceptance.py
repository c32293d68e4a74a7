"""`evalloop accept`: the acceptance check of one candidate, then revert or checkpoint.

Seed 004 (eval-loop, the acceptance check): the improver never accepts its own edit. Before any
run, an unsettled golden suspect halts the check. Then two independent blind arms (phase
`blind_gate`, both splits) answer the whole set with the edit served; the issue's qids are named
as targets before they start. The decision is `measure.gate`'s, called as it is (targeted mode
over both arms, `decide_gate` on each arm's comparison): no regression against the baseline,
every target fixed in both arms. The baseline's passing final queries are replayed on the edited
model; a changed or failing result is a regression candidate, and blocks unless both arms still
pass that case. The `acceptance_check` event is written before anything else moves. Rejected
or unresolved: the working copy is restored and the issue says so. Accepted: the issue is
`fixed` and a checkpoint is committed (`improve.checkpoint`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalloop.improve import checkpoint, repo, sidedoor
from pytest_evalloop.improve import workcopy as wc
from pytest_evalloop.improve.budget import BudgetStop, LoopBudget
from pytest_evalloop.improve.workcopy import ImproveRefused
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.measure import comparable
from pytest_evalloop.measure import comparison as cmp
from pytest_evalloop.measure import gate as gates
from pytest_evalloop.measure.comparable import DESIGN_KEYS
from pytest_evalloop.sets import cases as sets

ARMS = 2
PHASE = "blind_gate"
_SEVERITY = {"accepted": 0, "unresolved": 1, "rejected": 2, "refused": 3}

ArmRunner = Callable[[list[str], Path], subprocess.CompletedProcess[str]]
"""Runs one arm's pytest command line in a directory (a test may count or hold them)."""


def run_arm(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """One blind arm: `pytest` in a child, with this process's environment."""
    cmd = [sys.executable, "-m", "pytest", *argv]
    return subprocess.run(
        cmd, cwd=cwd, env=dict(os.environ), capture_output=True, text=True, check=False
    )


@dataclass
class AcceptResult:
    event: ledger.AcceptanceCheckEvent
    arms: list[Path] = field(default_factory=list)
    checkpoint: ledger.CheckpointEvent | None = None
    halted: bool = False
    reverted: bool = False
    lines: list[str] = field(default_factory=list)


# --- pure rules --------------------------------------------------------------------------


def holdout_delta(baseline: cmp.RunView, arms: list[cmp.RunView], holdout: set[str]) -> int | None:
    """Confident passes gained on the holdout slice, the worst arm's (None: nothing comparable).

    Per arm, over holdout cases with a confident verdict (match / no_match) in both that arm and
    the baseline: passes in the arm minus passes in the baseline. The least of the arms, because
    a gain that holds in one arm only is variance, not a fix.
    """
    deltas = []
    for arm in arms:
        both = [
            q
            for q in holdout
            if q in baseline.cases
            and q in arm.cases
            and baseline.cases[q].passed is not None
            and arm.cases[q].passed is not None
        ]
        if both:
            deltas.append(
                sum(bool(arm.cases[q].passed) for q in both)
                - sum(bool(baseline.cases[q].passed) for q in both)
            )
    return min(deltas) if deltas else None


def replay_regressions(replay: list[dict[str, Any]], arms: list[cmp.RunView]) -> list[str]:
    """Replayed passing queries whose result changed or failed, unless both arms still pass."""
    out = []
    for item in replay:
        if item["status"] == "same":
            continue
        still = all(arm.cases.get(item["qid"]) and arm.cases[item["qid"]].passed for arm in arms)
        if not still:
            out.append(item["qid"])
    return out


def worst(decisions: list[str]) -> str:
    """The most severe decision of several (refused > rejected > unresolved > accepted)."""
    return max(decisions, key=lambda d: _SEVERITY[d])


# --- the check ---------------------------------------------------------------------------


def find_candidate(read: ledger_reader.RunLedger, candidate_id: str) -> ledger.CandidateEvent:
    for event in read.of_kind("candidate"):
        if event.candidate_id == candidate_id:
            return event
    known = ", ".join(e.candidate_id or "?" for e in read.of_kind("candidate")) or "none"
    raise ImproveRefused(f"no candidate {candidate_id!r} in {read.run_dir}; candidates: {known}")


def _decided(
    read: ledger_reader.RunLedger, candidate_id: str
) -> ledger.AcceptanceCheckEvent | None:
    done = [
        e
        for e in read.of_kind("acceptance_check")
        if e.candidate_id == candidate_id and e.decision in ("accepted", "rejected")
    ]
    return done[-1] if done else None


def accept_candidate(
    run_dir: Path,
    set_dir: Path,
    candidate_id: str,
    *,
    dismissed: dict[str, str] | None = None,
    noise_band: int | None = None,
    runner: ArmRunner = run_arm,
    arm_args: list[str] | None = None,
    budget: LoopBudget | None = None,
    on_arm: Callable[[Path], None] | None = None,
) -> AcceptResult:
    """The acceptance check of one candidate (see the module docstring). Each arm runs under
    what is left of `budget` (the loop's); `on_arm` hears of each arm run as it is written."""
    read = ledger_reader.read_run(run_dir)
    if read.info is None:
        raise ImproveRefused(f"{run_dir}: no readable run.json; give the baseline run")
    candidate = find_candidate(read, candidate_id)
    if candidate.status != "proposed":
        raise ImproveRefused(
            f"candidate {candidate_id} is {candidate.status}: only a proposed candidate (every "
            f"check passed) is measured; why: {'; '.join(candidate.refusals) or 'none given'}"
        )
    done = _decided(read, candidate_id)
    if done is not None:
        raise ImproveRefused(f"candidate {candidate_id} was {done.decision} already")
    refused = baseline_refusals(run_dir)
    if refused:
        # Before any arm is paid for: two blind arms against a narrowed, unfinished or changed
        # baseline would decide nothing (the gate would refuse them after the spend).
        raise ImproveRefused(
            f"{run_dir.name} cannot be the baseline of an acceptance check: " + "; ".join(refused)
        )
    config = sets.load_set_config(set_dir)
    files = wc.model_files(set_dir, config, read.info.target)
    root = repo.repo_root(set_dir)
    if root is None:
        raise ImproveRefused(f"{set_dir} is in no git repository; nothing to checkpoint")
    for name in candidate.files:
        path = files.path(name)
        if path is None or not path.is_file() or wc.sha(path) != candidate.file_shas.get(name):
            raise ImproveRefused(
                f"{name} is not the candidate's bytes: the working tree must hold exactly "
                f"candidate {candidate_id} (re-run evalloop improve, or restore the tree)"
            )
    mine = {wc.rel(root, p) for p in (files.path(n) for n in candidate.files) if p}
    dirty = [d for d in repo.dirty_read(root, set_dir, files.files) if d not in mine]
    if dirty:
        raise ImproveRefused(
            f"uncommitted changes besides the candidate's in {', '.join(dirty)}: the arms would "
            "answer a set the candidate did not propose (pytest reads these); commit or stash "
            "them first"
        )
    base = {
        "issue_ids": candidate.issue_ids,
        "candidateId": candidate_id,
        "baselineRunId": read.info.run_id,
    }
    klass = "definition" if candidate.meaning_changed else "docs"
    dismissed = dismissed or {}
    targets = _issue_qids(read, candidate)
    rebase = sidedoor.checked(
        set_dir, root, read.info.dataset_sha, sets.dataset_sha(set_dir), targets
    )
    settled, pending = sidedoor.settled_suspects(
        candidate.golden_suspect, rebase, candidate.at, set(dismissed)
    )
    # An expert flag is settled only by a person: no side-door change makes a leak no leak.
    flagged = [f.get("qid") or "(unread review)" for f in candidate.expert_flags]
    flagged = [q for q in dict.fromkeys(flagged) if q not in dismissed]
    if pending or flagged:
        halts = []
        if pending:
            halts.append(
                f"golden suspect(s) {', '.join(pending)} unsettled; settle each through the "
                "golden side door (evalloop golden repair / hold / attest) or dismiss it "
                "explicitly (evalloop accept ... --dismiss-suspect QID WHY)"
            )
        if flagged:
            halts.append(
                f"the expert review flagged {', '.join(flagged)} (the edit may state an "
                "answer); a person reads the flag and dismisses it (--dismiss-suspect QID WHY), "
                "or the edit is reverted"
            )
        if rebase.refused:
            halts.append("side-door records not counted: " + "; ".join(rebase.refused))
        reason = f"halted before any run: {'; '.join(halts)}; then run the check again"
        event = ledger.AcceptanceCheckEvent.model_validate(
            {
                **base,
                "decision": "unresolved",
                "class": klass,
                "reason": reason,
            }
        )
        ledger_writer.LedgerWriter(run_dir).append(event)
        return AcceptResult(event=event, halted=True, lines=[event.reason or ""])
    arms = _run_arms(
        run_dir, set_dir, read.info, targets, runner, arm_args or [], root, budget, on_arm
    )
    result = _decide(
        read, set_dir, candidate, arms, targets, noise_band, klass, base, settled, dismissed
    )
    ledger_writer.LedgerWriter(run_dir).append(result.event)
    for arm in arms:
        if (arm / ledger.RUN_FILE).is_file():
            ledger_writer.update_run_info(arm, mode="improve")
    statuses: list[Any] = []
    if result.event.decision == "accepted":
        for issue_id in candidate.issue_ids:
            statuses.append(
                ledger.IssueStatusEvent(
                    issue_id=issue_id,
                    status="fixed",
                    by="loop",
                    note=f"candidate {candidate_id} accepted over {len(arms)} blind arms",
                )
            )
        ledger_writer.LedgerWriter(run_dir).append(*statuses)
        result.checkpoint = checkpoint.create(
            run_dir,
            set_dir,
            files,
            root,
            issue_ids=candidate.issue_ids,
            candidate_id=candidate_id,
            ledgers=[run_dir, *arms],
            regressions=result.event.regressions,
        )
    else:
        touched = [p for p in (files.path(n) for n in candidate.files) if p is not None]
        repo.checkout_files(root, candidate.base_git_sha or "HEAD", touched)
        result.reverted = True
        status: ledger.IssueStatus = (
            "rejected" if result.event.decision in ("rejected", "refused") else "open"
        )
        for issue_id in candidate.issue_ids:
            statuses.append(
                ledger.IssueStatusEvent(
                    issue_id=issue_id,
                    status=status,
                    by="loop",
                    note=f"candidate {candidate_id} {result.event.decision}, working copy "
                    f"restored: {result.event.reason}",
                )
            )
        ledger_writer.LedgerWriter(run_dir).append(*statuses)
    return result


def baseline_refusals(run_dir: Path) -> list[str]:
    """Why a run cannot be a decision's baseline (`comparable.alone`: not complete, not the whole
    split, a shard, changed after closing, mixed models; a harness failure); empty when it can."""

    view = cmp.run_view(cmp.read_compared(run_dir))
    assert view.facts is not None
    found = [r.text for r in comparable.alone(view.facts, "baseline")]
    if view.withheld:
        found.append(f"its pass rate is withheld ({view.withheld})")
    return found


def _issue_qids(read: ledger_reader.RunLedger, candidate: ledger.CandidateEvent) -> list[str]:
    issues = read.issues()
    out: list[str] = []
    for issue_id in candidate.issue_ids:
        issue = issues.get(issue_id)
        if issue is not None:
            out += issue.qids
    return list(dict.fromkeys(out))


def arm_command(
    set_dir: Path,
    runs_dir: Path,
    info: ledger.RunInfo,
    label: str,
    targets: list[str],
    extra: list[str],
) -> list[str]:
    """An arm's pytest arguments: the baseline's answerer and judge, phase blind_gate, the
    targets named before it starts. Nothing of the issue or the candidate reaches it."""
    argv = [
        str(set_dir),
        "-p",
        "no:cacheprovider",
        "-q",
        f"--eval-phase={PHASE}",
        f"--eval-label={label}",
        f"--eval-runs-dir={runs_dir}",
        f"--eval-answerer-model={info.answerer_model}",
        f"--baseline={info.run_id}",
        f"--eval-targets={','.join(targets)}",
        "--eval-gate=off",
    ]
    if info.judge_model:
        argv.append(f"--eval-judge-model={info.judge_model}")
    if info.answerer:
        argv.append(f"--eval-answerer={info.answerer}")
    # The baseline's design, so the arms measure what it measured.

    selection = info.selection or {}
    for key, option in DESIGN_KEYS:
        if selection.get(key) is not None:
            argv.append(f"{option}={selection[key]}")
    return [*argv, *extra]


def _run_arms(
    run_dir: Path,
    set_dir: Path,
    info: ledger.RunInfo,
    targets: list[str],
    runner: ArmRunner,
    extra: list[str],
    root: Path,
    budget: LoopBudget | None,
    on_arm: Callable[[Path], None] | None,
) -> list[Path]:
    runs_dir = run_dir.parent
    budget = budget or LoopBudget(None)
    arms = []
    for _ in range(ARMS):
        label = ledger_writer.next_label(runs_dir, info.set_name or set_dir.name, PHASE)

        def one(more: list[str], label: str = label) -> Path:
            done = runner(
                arm_command(set_dir, runs_dir, info, label, targets, [*extra, *more]), root
            )
            arm = runs_dir / label
            if not (arm / ledger.RUN_FILE).is_file():
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
                raise ImproveRefused(
                    f"blind arm {label} wrote no run (exit {done.returncode}):\n{tail}"
                )
            return arm

        arm = budget.run_step(f"blind arm {label}", one)
        if on_arm is not None:
            on_arm(arm)
        arms.append(arm)
        spend = ledger_reader.read_run_info(arm).spend or {}
        if spend.get("stopped"):
            # Not a decision: the edit stays in the tree for a check with more money.
            raise BudgetStop(
                f"blind arm {label} stopped before its share of the budget "
                f"(${float(spend.get('spentUsd') or 0):.4f} of "
                f"${float(spend.get('ceilingUsd') or 0):.4f}): no decision; the edit stays in "
                f"the working tree, run `evalloop accept {run_dir} --candidate ...` with more"
            )
    return arms


def _decide(
    read: ledger_reader.RunLedger,
    set_dir: Path,
    candidate: ledger.CandidateEvent,
    arms: list[Path],
    targets: list[str],
    noise_band: int | None,
    klass: str,
    base: dict[str, Any],
    settled: list[str],
    dismissed: dict[str, str],
) -> AcceptResult:
    baseline = cmp.run_view(cmp.read_compared(read.run_dir))
    views = [cmp.run_view(cmp.read_compared(arm)) for arm in arms]
    rebase = sidedoor.checked(
        set_dir,
        repo.repo_root(set_dir),
        read.info.dataset_sha if read.info else None,
        views[0].pins.get("datasetSha"),
        targets,
    )
    if rebase.reached and rebase.dropped:
        baseline, views = (
            _without(baseline, rebase.dropped),
            [_without(v, rebase.dropped) for v in views],
        )
    report = gates.targeted(baseline, views[0], views[1], targets, noise_band)
    verdicts = []
    better: set[str] = set()
    for i, view in enumerate(views):
        # The other arm rides along: the comparability rule checks both arms and the baseline
        # (finished, whole, sealed, independent of each other, one design).
        other = views[1 - i] if len(views) == 2 else None
        comparison = cmp.compare(baseline, view, second=other)
        if rebase.reached:
            # The dataset moved through the golden side door only: its pins are explained,
            # the cases it touched were handled above, every other pin still refuses.
            comparison.pin_diffs = [
                d for d in comparison.pin_diffs if d.name not in sidedoor.SIDE_DOOR_PINS
            ]
        better |= {f.qid for f in comparison.better}
        verdicts.append(
            gates.decide_gate("bar", comparison, allow_pin_mismatch=False, targeted=report)
        )
    decision = worst([v.decision for v in verdicts])
    reason = next(v.reason for v in verdicts if v.decision == decision)
    regressions = list(dict.fromkeys(q for v in verdicts for q in v.regressions))
    replay = _replay(read, set_dir)
    replayed = replay_regressions(replay, views)
    if replayed:
        regressions = list(dict.fromkeys([*regressions, *replayed]))
        if decision == "accepted":
            decision = "rejected"
            reason = (
                f"replayed passing queries changed on the edit and the arms do not clear "
                f"them: {', '.join(replayed)}"
            )
    cases = {c.qid: c for _, c in sets.load_cases(set_dir).rows}
    holdout = {q for q, c in cases.items() if c.split == "holdout"}
    delta = holdout_delta(baseline, views, holdout)
    notes = []
    if rebase.reached and rebase.actions:
        notes.append(
            "dataset moved by the golden side door only ("
            + ", ".join(f"{q} {'+'.join(a)}" for q, a in rebase.actions.items())
            + ")"
            + (
                f"; left out of the comparison: {', '.join(rebase.dropped)}"
                if rebase.dropped
                else ""
            )
        )
    if rebase.refused:
        notes.append("side-door records not counted: " + "; ".join(rebase.refused))
    if settled:
        notes.append(f"golden suspects settled: {', '.join(settled)}")
    for qid, why in dismissed.items():
        notes.append(f"suspect {qid} dismissed: {why}")
    event = ledger.AcceptanceCheckEvent.model_validate(
        {
            **base,
            "decision": decision,
            "class": klass,
            "finalRunIds": [v.run_id for v in views],
            "regressions": regressions,
            "holdoutDelta": delta,
            "reason": "; ".join([reason, *notes]),
            "gate": "bar",
            "better": sorted(better),
            "replay": replay,
        }
    )
    lines = [
        f"targets: {', '.join(f'{t.qid} {t.outcome}' for t in report.targets) or 'none'}",
        f"replayed {len(replay)} passing final queries: "
        f"{sum(r['status'] == 'same' for r in replay)} same, "
        f"{sum(r['status'] == 'changed' for r in replay)} changed, "
        f"{sum(r['status'] == 'error' for r in replay)} failed",
    ]
    return AcceptResult(event=event, arms=arms, lines=lines)


def _without(view: cmp.RunView, qids: list[str]) -> cmp.RunView:
    return view.model_copy(update={"cases": {q: c for q, c in view.cases.items() if q not in qids}})


def _replay(read: ledger_reader.RunLedger, set_dir: Path) -> list[dict[str, Any]]:
    """The baseline's passing final queries, run on the edited model (the working tree)."""
    import asyncio

    passing = []
    scores = read.scores()
    for key, attempt in read.attempts().items():
        score = scores.get(key)
        if score is not None and score.verdict == "match" and attempt.final_query:
            passing.append((attempt.qid, attempt.final_query, attempt.prediction_path))
    if not passing:
        return []
    return asyncio.run(_replay_async(read.run_dir, set_dir, passing))


async def _replay_async(
    run_dir: Path, set_dir: Path, passing: list[tuple[str, str, str | None]]
) -> list[dict[str, Any]]:
    from pytest_evalloop.diagnose.evidence import read_artifact
    from pytest_evalloop.targets.choice import build_target

    config = sets.load_set_config(set_dir)
    target = build_target(set_dir, config, target=None, tool_profile=None)
    session = await target.open()
    out = []
    try:
        for qid, query, prediction in passing:
            done = await session.execute(query)
            if done.error or done.not_run:
                out.append({"qid": qid, "status": "error", "detail": done.error or done.not_run})
                continue
            stored = read_artifact(run_dir, prediction) if prediction else None
            rows = stored.get("rows") if isinstance(stored, dict) else stored
            same = rows is None or same_rows(rows, done.rows)
            out.append({"qid": qid, "status": "same" if same else "changed"})
    finally:
        await target.close()
    return out


REPLAY_REL_TOL = 1e-6
"""How far a replayed number may move and still be the same result: a float summed in another
order (a different plan, thread count or engine build) differs in its last digits, which is no
change of meaning."""


def same_value(a: Any, b: Any) -> bool:
    """Two cells are the same: numbers within `REPLAY_REL_TOL` (relative), the rest equal."""
    import math

    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=REPLAY_REL_TOL, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def same_rows(stored: Any, got: Any) -> bool:
    """A replayed result is the stored one: the same rows in any order, numbers within the
    tolerance. Each stored row is matched to a distinct replayed row (a row order the engine
    does not promise is no change)."""
    if not isinstance(stored, list) or not isinstance(got, list):
        return same_value(stored, got)
    if len(stored) != len(got):
        return False
    left = list(got)
    for row in stored:
        match = next((i for i, other in enumerate(left) if same_value(row, other)), None)
        if match is None:
            return False
        left.pop(match)
    return True
