"""`evalloop improve`: one smallest, probed model edit for one model-owned issue.

The conductor refuses before it pays (an issue another owner holds, a remote target, a dirty
tree, a doubted golden among the issue's cases, an issue with no evidence), then gives a fresh
improver the issue, its dev cases (transcripts and goldens) and the model files, with the
target's own context and query tools to probe the data and `propose_edit`. What the agent
proposes lands in a working copy; the conductor checks it mechanically (probe receipts, the
expert test, the copy loads and its touched sources answer, the golden audit) and writes one
`candidate` event, whatever the outcome. Only a candidate every check passed is applied to the
working tree, where the acceptance check finds it.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop.diagnose import bounds
from pytest_evalloop.diagnose.evidence import read_artifact
from pytest_evalloop.improve import agent, audit, expert, repo
from pytest_evalloop.improve import workcopy as wc
from pytest_evalloop.improve.reviewer import REVIEW_VERSION, review_edit
from pytest_evalloop.improve.workcopy import ImproveRefused
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import vocabulary
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.measure import aggregates
from pytest_evalloop.model_api.pricing import Usage
from pytest_evalloop.sets import cases as sets

if TYPE_CHECKING:
    import anthropic

    from pytest_evalloop.model_api.pricing import PriceTable

TRANSCRIPT_CHARS = 12_000
NEXT_STEP = {
    "dataset": "the golden side door (evalloop golden repair / hold), not a model edit",
    "retrieval": "the retrieval engine's owners; a model edit cannot fix ranking",
    "agent-skill": "the answerer's skill or prompt owners; the model is not what failed",
    "judge": "a person's review in evalloop view: the rows match the golden, so the judge's "
    "verdict is what is in doubt, not the model",
}


@dataclass
class Result:
    """What one improve wrote."""

    candidate: ledger.CandidateEvent
    applied: bool = False
    notes: list[str] = field(default_factory=list)


def guard(run_dir: Path, set_dir: Path, issue_id: str) -> tuple[Any, Any, wc.ModelFiles, Path]:
    """Every refusal that costs nothing: (read, issue, model files, repository root)."""
    read = ledger_reader.read_run(run_dir)
    if read.info is None:
        raise ImproveRefused(f"{run_dir}: no readable run.json; give a run directory")
    from pytest_evalloop.improve.acceptance import baseline_refusals

    narrowed = baseline_refusals(run_dir)
    if narrowed:
        # Its acceptance check would refuse this baseline: refuse before the improver is paid.
        raise ImproveRefused(
            f"{run_dir.name} cannot be the baseline of an acceptance check: " + "; ".join(narrowed)
        )
    issues = read.issues()
    refused = bounds.refused_declaration(run_dir, issue_id)
    if refused:
        raise ImproveRefused(
            f"issue {issue_id} breaks the ledger contract: {'; '.join(refused)} "
            f"(`evalloop validate {run_dir}` lists it)"
        )
    if issue_id not in issues:
        known = ", ".join(issues) or f"none (run `evalloop diagnose {run_dir}` first)"
        raise ImproveRefused(f"no issue {issue_id!r} in {run_dir}; issues: {known}")
    issue = issues[issue_id]
    cases = bounds.set_cases(set_dir)
    if cases is None:
        raise ImproveRefused(f"{set_dir}: no loadable {sets.CASES_FILE}; fix the set first")
    # The code table's owners hold here even for a line a grandfathered diagnose wrote.
    law = vocabulary.owner_problem(issue.component, issue.owner, issue.primary_code)
    problems = [law] if law else []
    problems += bounds.issue_bounds(issue.qids, issue.owner, cases)
    if problems:
        raise ImproveRefused(f"issue {issue_id}: {'; '.join(problems)}")
    if issue.owner != "model":
        raise ImproveRefused(
            f"issue {issue_id} is owned by {issue.owner!r}, and improve edits only model-owned "
            f"issues; it goes to {NEXT_STEP.get(issue.owner, 'its owner')}"
        )
    status = read.issue_statuses().get(issue_id)
    if status is not None and status.status in ("fixed", "rejected", "deferred"):
        raise ImproveRefused(
            f"issue {issue_id} is {status.status}; reopen it first "
            f"(evalloop issue {run_dir} {issue_id} --status open)"
        )
    if not issue.qids or not issue.diagnosis.strip():
        raise ImproveRefused(
            f"issue {issue_id} carries no diagnosis evidence (no cases or no diagnosis): "
            "silence entitles no edit"
        )
    doubted = {str(d.get("qid")) for d in read.info.doubted_goldens}
    held = sorted(doubted & set(issue.qids))
    if held:
        raise ImproveRefused(
            f"the judge doubted the golden of {', '.join(held)}: settle it through the golden "
            "side door (evalloop golden repair / hold) before any edit"
        )
    config = sets.load_set_config(set_dir)
    files = wc.model_files(set_dir, config, read.info.target)
    root = repo.repo_root(set_dir)
    if root is None:
        raise ImproveRefused(
            f"{set_dir} is in no git repository: a checkpoint is a commit, so without git "
            "there is no rollback and no improve; `git init` the model's repository first"
        )
    # Anything a run of the set reads: the model, the set folder, an untracked conftest.py.
    dirty = repo.dirty_read(root, set_dir, files.files)
    if dirty:
        raise ImproveRefused(
            f"uncommitted changes in {', '.join(dirty)}: a dirty tree pins nothing (pytest reads "
            "these); commit or stash them (or finish the pending candidate with evalloop "
            "accept) first"
        )
    return read, issue, files, root


async def improve_issue(
    run_dir: Path,
    set_dir: Path,
    issue_id: str,
    *,
    client: anthropic.AsyncAnthropic,
    model: str,
    prices: PriceTable,
    probes: bool = True,
    reviewer: str | None = None,
) -> Result:
    """Run the improver on one issue and write its `candidate` (see the module docstring);
    with `reviewer` (a model), a proposed candidate gets the expert review's flags."""
    read, issue, files, root = guard(run_dir, set_dir, issue_id)
    loaded = sets.load_cases(set_dir)
    cases = {c.qid: c for _, c in loaded.rows}
    before = {
        name: path.read_text(encoding="utf-8")
        for name, path in zip(files.names, files.files, strict=True)
    }
    state = dict(before)
    experts = expert_cases(set_dir, cases)

    async def on_edit(arguments: dict[str, Any]) -> tuple[bool, str]:
        nonlocal state
        try:
            edit = wc.Edit.model_validate(arguments)
        except ValueError as exc:
            return False, f"refused: not an edit ({exc}); give file, old and new"
        after, problems = wc.apply_edits(state, [edit])
        if not problems:
            # The improver is told why, never a holdout case or its answer.
            found = expert.expert_problems(state[edit.file], after[edit.file], experts)
            problems = [p.shown for p in found]
        if problems:
            return False, "refused, not applied: " + "; ".join(problems)
        with tempfile.TemporaryDirectory(prefix="evalloop-edit-") as scratch:
            copy = wc.working_copy(files, after, Path(scratch))
            root_copy = _package_copy(files, copy)
            problem = audit.load_problem(files.kind, copy, root_copy)
        if problem is not None:
            return False, f"refused, not applied: the edited model does not load: {problem}"
        state = after
        return True, f"applied to the working copy of {edit.file}; the model loads"

    prompt = _prompt(read, issue, cases, set_dir, files, before)
    target = session = None
    tools: list[dict[str, Any]] = [agent.edit_tool(files.names)]
    try:
        if probes:
            target, session, probe_tools = await _open_target(set_dir)
            tools = [*probe_tools, *tools]
        outcome = await agent.improve(client, model, prompt, session, tools, on_edit)
    finally:
        if target is not None:
            await target.close()
    candidate = await _candidate(read, issue, files, cases, before, state, outcome, root, experts)
    cost = prices.cost(outcome.model or model, outcome.usage)
    usage = Usage()
    usage.add(outcome.usage)
    if reviewer is not None and candidate.status == "proposed":
        # Only what every mechanical check passed is worth a reader's call.
        review = await review_edit(client, reviewer, before, state, experts)
        review_cost = prices.cost(review.model, review.usage)
        usage.add(review.usage)
        cost = None if cost is None or review_cost is None else round(cost + review_cost, 6)
        candidate.expert_flags = review.flags
        candidate.expert_review = {
            "model": review.model,
            "version": REVIEW_VERSION,
            "flags": len(review.flags),
            "costUsd": review_cost,
            **({"problem": review.problem} if review.problem else {}),
        }
    # The improver's cost includes its expert review (one role, one line of cost).
    candidate.input_tokens = usage.input_tokens
    candidate.output_tokens = usage.output_tokens
    candidate.cache_read_tokens = usage.cache_read_tokens
    candidate.cache_creation_tokens = usage.cache_creation_tokens
    candidate.cost_usd = cost
    candidate.model = outcome.model or model
    result = Result(candidate=candidate)
    if candidate.status == "proposed":
        for name, text in state.items():
            if text != before[name]:
                path = files.path(name)
                assert path is not None  # names come from files
                path.write_text(text, encoding="utf-8")
        result.applied = True
    events: list[Any] = [candidate]
    if candidate.status == "proposed":
        events.append(
            ledger.IssueStatusEvent(
                issue_id=issue_id,
                status="batched",
                by="improve",
                note=f"candidate {candidate.candidate_id} awaits the acceptance check",
            )
        )
    ledger_writer.LedgerWriter(run_dir).append(*events)
    _record_run(run_dir, model)
    return result


def expert_cases(set_dir: Path, cases: dict[str, sets.Case]) -> list[expert.Case]:
    """Every case of the set, dev and holdout, with its golden as stored (artifacts read)."""
    out = []
    for case in cases.values():
        try:
            value = sets.golden_value(set_dir, case.golden) if case.golden else None
        except (OSError, ValueError):
            value = case.golden.value if case.golden else None
        out.append(expert.Case(case.qid, case.question, case.split, value))
    return out


def _package_copy(files: wc.ModelFiles, copy: Path) -> Path | None:
    if files.package_root is None:
        return None
    return copy / wc.rel(files.set_dir, files.package_root)


async def _open_target(set_dir: Path) -> tuple[Any, Any, list[dict[str, Any]]]:
    from pytest_evalloop.targets.bridge import anthropic_tools
    from pytest_evalloop.targets.choice import build_target

    config = sets.load_set_config(set_dir)
    target = build_target(set_dir, config, target=None, tool_profile=None)
    session = await target.open()
    # The probes are the answerer's own two tools, nothing else: context and query.
    specs = [t for t in await session.list_tools() if session.role_of(t.name) is not None]
    return target, session, anthropic_tools(specs, cache=False)


def _prompt(
    read: ledger_reader.RunLedger,
    issue: ledger.IssueEvent,
    cases: dict[str, sets.Case],
    set_dir: Path,
    files: wc.ModelFiles,
    before: dict[str, str],
) -> str:
    """The improver's user message: the issue, its dev cases, the model files (all fenced)."""
    attempts = read.attempts()
    scores = read.scores()
    diagnoses = {d.qid: d for d in read.of_kind("diagnosis")}
    shown_cases = []
    for qid in issue.qids:
        case = cases.get(qid)
        if case is None or case.split != "dev":
            continue  # improve reads dev cases only: holdout is what makes the check evidence
        key = next((k for k in attempts if k[0] == qid), None)
        attempt = attempts.get(key) if key else None
        score = scores.get(key) if key else None
        transcript = _transcript(read.run_dir, attempt)
        g = case.golden
        shown_cases.append(
            {
                "qid": qid,
                "question": case.question,
                "golden": {
                    "kind": g.kind if g else None,
                    "status": g.status if g else None,
                    "value": sets.golden_value(set_dir, g) if g else None,
                    "rubric": g.rubric if g else None,
                },
                "verdict": score.verdict if score else None,
                "judge_why": (score.why or score.reason) if score else None,
                "answer": attempt.answer_text if attempt else None,
                "final_query": attempt.final_query if attempt else None,
                "diagnosis": diagnoses[qid].diagnosis if qid in diagnoses else None,
                "transcript": transcript,
            }
        )
    issue_view = issue.model_dump(mode="json", by_alias=True, exclude_none=True)
    sections = [
        ("ISSUE", agent.shown(issue_view)),
        ("DEV_CASES", agent.shown(shown_cases)),
        *[(f"MODEL_FILE {name}", text) for name, text in before.items()],
    ]
    head = (
        f"Issue {issue.issue_id}. Propose one smallest edit by your instructions. Model files: "
        f"{', '.join(files.names)} ({files.kind} target)."
    )
    return agent.fenced_prompt(head, sections)


def _transcript(run_dir: Path, attempt: Any) -> str:

    if attempt is None:
        return "(no attempt)"
    data = read_artifact(run_dir, attempt.transcript_path)
    text = json.dumps(data, ensure_ascii=False) if data else "(not kept)"
    return text if len(text) <= TRANSCRIPT_CHARS else "[... cut]" + text[-TRANSCRIPT_CHARS:]


def _norm(query: str | None) -> str:
    return re.sub(r"\s+", " ", query or "").strip().rstrip(";").lower()


def receipt_problems(reply: agent.ImproveReply, calls: list[dict[str, Any]]) -> list[str]:
    """Every reported probe must be a query the conductor saw run (a probe receipt)."""
    ran = {_norm(c.get("query")) for c in calls if c.get("query")}
    ran |= {_norm(json.dumps(c.get("input"), sort_keys=True)) for c in calls}
    if not reply.probes:
        return ["no probe receipts: every factual claim needs a query that was run"]
    if not ran:
        return ["no probe receipts: the improver ran no query or context call"]
    unseen = [p.query for p in reply.probes if _norm(p.query) not in ran]
    if unseen:
        return [f"probe never run (no receipt): {q[:120]!r}" for q in unseen]
    return []


async def _candidate(
    read: ledger_reader.RunLedger,
    issue: ledger.IssueEvent,
    files: wc.ModelFiles,
    cases: dict[str, sets.Case],
    before: dict[str, str],
    after: dict[str, str],
    outcome: agent.Outcome,
    root: Path,
    experts: list[expert.Case],
) -> ledger.CandidateEvent:
    n = len(read.of_kind("candidate")) + 1
    assert read.info is not None
    applied = [e for e in outcome.edits if e.get("applied")]
    touched = [name for name in files.names if before[name] != after[name]]
    reply = outcome.reply
    candidate = ledger.CandidateEvent(
        candidateId=f"{read.info.run_id}:cand-{n:02d}",
        issue_ids=[issue.issue_id],
        files=touched,
        diffSummary=wc.diff_summary(before, after),
        probes=outcome.calls,
        edits=[{"file": e["file"], "old": e["old"], "new": e["new"]} for e in applied],
        baseGitSha=repo.head_sha(root),
        attempts=outcome.attempts,
        improve_version=agent.IMPROVE_VERSION,
        report=outcome.text[-6000:] or None,
    )
    refusals: list[str] = []
    if reply is None:
        refusals += outcome.problems or ["no reply object"]
    else:
        candidate.edit_tier = reply.edit_tier
        candidate.disagreement = reply.disagreement
        candidate.probes = [*[p.model_dump() for p in reply.probes], *outcome.calls]
    no_edit = reply is not None and not touched and reply.edit.strip().upper().startswith("NONE")
    if no_edit:
        candidate.status = "no_edit"
        candidate.refusals = [f"the improver proposed no edit: {reply.edit if reply else ''}"]
        return candidate
    if reply is not None:
        if not touched:
            refusals.append("the reply names an edit, but no propose_edit call was applied")
            refusals += [str(e["answer"]) for e in outcome.edits if not e.get("applied")]
        refusals += receipt_problems(reply, outcome.calls)
        for name in touched:
            refusals += [p.text for p in expert.expert_problems(before[name], after[name], experts)]
    mechanical = wc.meaning_changed(files.kind, before, after)
    reported = reply.meaning_changed if reply else []
    candidate.meaning_changed = sorted(set(mechanical) | set(reported))
    if touched:
        sources = wc.touched_sources(files.kind, before, after)
        with tempfile.TemporaryDirectory(prefix="evalloop-candidate-") as scratch:
            copy = wc.working_copy(files, after, Path(scratch))
            checks, suspects, golden_audit = await audit.check_copy(
                files.kind,
                copy,
                _package_copy(files, copy),
                sources,
                list(cases.values()),
                candidate.meaning_changed,
                files.set_dir,
            )
        golden_audit["model"] = ", ".join(touched)
        candidate.checks = checks
        candidate.golden_audit = golden_audit
        refusals += [
            f"check {c['check']} {c.get('source', '')}".rstrip() + f" failed: {c['detail']}"
            for c in checks
            if not c["ok"]
        ]
        reported_suspects = (
            [s.model_dump(mode="json") for s in reply.golden_suspect] if reply else []
        )
        seen = {s["qid"] for s in suspects}
        candidate.golden_suspect = [
            *suspects,
            *[s for s in reported_suspects if s["qid"] not in seen],
        ]
        candidate.file_shas = {name: _text_sha(after[name]) for name in touched}
    candidate.refusals = list(dict.fromkeys(refusals))
    candidate.status = "refused" if candidate.refusals else "proposed"
    return candidate


def _text_sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _record_run(run_dir: Path, model: str) -> None:

    info = ledger_reader.read_run_info(run_dir)
    read = ledger_reader.read_run(run_dir)
    costs = {k: v.model_dump() for k, v in aggregates.role_costs(read).items()}
    ledger_writer.update_run_info(
        run_dir,
        improverModel=model,
        improveVersion=agent.IMPROVE_VERSION,
        improveSha=agent.doctrine_sha(),
        mode="improve",
        costs={**(info.model_dump(by_alias=True).get("costs") or {}), **costs},
    )
