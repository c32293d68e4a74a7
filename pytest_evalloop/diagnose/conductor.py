"""Diagnosing a stored run: evidence, one agent per case, clustering, issue events.

The conductor picks the attempts (`evidence.select`: dev only; never contaminated, harness
errors or doubted goldens, which go straight to a `dataset` issue), gathers each one's
evidence, runs the diagnose agent on it, clusters what was diagnosed, and writes the stage's
events: one `diagnosis` per attempt looked at, one `clustering`, one `issue` per cluster and its
`issue_status: open`. A re-run replaces diagnose's own earlier lines (`writer.replace_events`)
and never touches another stage's, nor a status a person or the loop recorded.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop.diagnose import agent, claims
from pytest_evalloop.diagnose import evidence as ev
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.ledger.vocabulary import JUDGE
from pytest_evalloop.measure import aggregates
from pytest_evalloop.sets import cases as sets

if TYPE_CHECKING:
    import anthropic

    from pytest_evalloop.model_api.pricing import PriceTable, Usage
    from pytest_evalloop.roles.contract import TargetSession

TRANSCRIPT_CHARS = 20_000
"""How much of the answerer's transcript a diagnose prompt shows (the end is kept)."""
_LEVELS = ("low", "medium", "high")
_SUFFICIENCY_WORST_FIRST = ("unknown", "insufficient", "sufficient")
OWN_KINDS = frozenset({"diagnosis", "clustering", "issue"})


class DiagnoseError(ValueError):
    """The run cannot be diagnosed as asked (still running, no cases file, unreadable)."""


@dataclass
class Result:
    """What one diagnose run wrote and why it left the rest alone."""

    diagnoses: list[ledger.DiagnosisEvent] = field(default_factory=list)
    clustering: ledger.ClusteringEvent | None = None
    issues: list[ledger.IssueEvent] = field(default_factory=list)
    statuses: list[ledger.IssueStatusEvent] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    eligibility: str = "0 / 0"
    replaced: int = 0


def load_cases(set_dir: Path) -> dict[str, sets.Case]:
    """The set's cases by qid; a broken cases.jsonl is an error naming its first bad line."""
    loaded = sets.load_cases(set_dir)
    if not loaded.rows and loaded.errors:
        first = loaded.errors[0]
        raise DiagnoseError(f"{first.path}:{first.line}: {first.message}")
    return {case.qid: case for _, case in loaded.rows}


async def diagnose_run(
    run_dir: Path,
    set_dir: Path,
    *,
    client: anthropic.AsyncAnthropic,
    model: str,
    prices: PriceTable,
    session: TargetSession | None = None,
    tools: list[dict[str, Any]] | None = None,
    max_cases: int | None = None,
) -> Result:
    """Diagnose the run's failed dev attempts and write the stage's events."""
    read = ledger_reader.read_run(run_dir)
    if read.info is None:
        raise DiagnoseError(f"{run_dir}: no readable run.json; give a run directory")
    if read.info.status == "running":
        raise DiagnoseError(f"{run_dir}: the run is still running; diagnose it once it ends")
    cases = load_cases(set_dir)
    # A person's review settles what the judge said: an overruled no_match is no failure.
    scores = aggregates.settled_scores(read)
    chosen, skipped = ev.select(read.attempts(), scores, cases)
    result = Result(skipped={_label(k): why for k, why in skipped.items()})
    config = sets.load_set_config(set_dir)
    calls = _calls_by_attempt(read)
    retrievals = {(e.qid, e.sample): e for e in read.of_kind("retrieval_score") if e.qid}
    seen: set[str] = set()
    spent = 0
    gathered: dict[str, ev.Evidence] = {}
    for pick in chosen:
        key = (pick.qid, pick.sample)
        if pick.qid in seen:
            result.skipped[_label(key)] = "another sample of this case is diagnosed"
            continue
        if pick.route == "agent" and max_cases is not None and spent >= max_cases:
            result.skipped[_label(key)] = f"beyond --max-cases {max_cases}"
            continue
        seen.add(pick.qid)
        case, attempt, score = cases[pick.qid], read.attempts().get(key), scores.get(key)
        if attempt is None:
            result.skipped[_label(key)] = "no attempt event"
            continue
        golden = sets.golden_value(set_dir, case.golden)
        prediction = ev.read_artifact(run_dir, attempt.prediction_path)
        transcript = ev.read_artifact(run_dir, attempt.transcript_path)
        evidence = ev.gather(
            attempt,
            calls.get(key, []),
            score,
            retrievals.get(key),
            case,
            golden,
            prediction,
            ev.transcript_kept(transcript),
        )
        gathered[pick.qid] = evidence
        if pick.route == "dataset":
            result.diagnoses.append(_dataset_diagnosis(pick, score, evidence))
            continue
        if evidence.judge_suspect:
            # The rows are the golden's: no rung of the ladder applies, and no agent is paid.
            result.diagnoses.append(_judge_diagnosis(pick, attempt.phase, evidence))
            continue
        spent += 1
        definitions = _definitions(set_dir, config, case)
        prompt = case_prompt(case, golden, score, attempt, transcript, definitions, evidence)
        outcome = await agent.diagnose_case(client, model, prompt, evidence, session, tools)
        result.diagnoses.append(_case_event(pick, attempt.phase, evidence, outcome, prices))
    await _cluster(result, read.info.run_id, gathered, client, model, prices)
    if result.clustering is not None:
        result.clustering.mode = ledger.raised_mode(read.info.mode, "triage")
    result.eligibility = ev.eligibility(
        [gathered[d.qid] for d in result.diagnoses if d.status == "diagnosed"]
    )
    result.replaced = _write(run_dir, read, result)
    return result


def _label(key: tuple[str, int | None]) -> str:
    return key[0] if key[1] is None else f"{key[0]}[s{key[1]}]"


def _calls_by_attempt(read: ledger_reader.RunLedger) -> dict[tuple[str, int | None], list[Any]]:
    out: dict[tuple[str, int | None], list[Any]] = {}
    for call in read.of_kind("tool_call"):
        out.setdefault((call.qid, call.sample), []).append(call)
    return out


def _definitions(set_dir: Path, config: sets.SetConfig, case: sets.Case) -> str:
    from pytest_evalloop.answer.materials import model_definitions

    try:
        return model_definitions(set_dir, config, case)
    except (OSError, ValueError) as exc:
        return f"(not available: {exc})"


def case_prompt(
    case: sets.Case,
    golden: Any,
    score: Any,
    attempt: Any,
    transcript: Any,
    definitions: str,
    evidence: ev.Evidence,
) -> str:
    """The diagnose agent's user message for one attempt: every piece of run text fenced."""
    g = case.golden
    shown_transcript = json.dumps(transcript, ensure_ascii=False) if transcript else ""
    if len(shown_transcript) > TRANSCRIPT_CHARS:
        shown_transcript = "[... earlier turns cut]" + shown_transcript[-TRANSCRIPT_CHARS:]
    sections = [
        ("QUESTION", case.question),
        ("GOLDEN", json.dumps({"kind": g.kind if g else None, "value": golden}, default=str)),
        ("CASE_RUBRIC", (g.rubric if g else None) or "(none)"),
        (
            "EXPECTED_ENTITIES",
            case.expected_entities.model_dump_json(by_alias=True)
            if case.expected_entities
            else "(none)",
        ),
        (
            "VERDICT",
            json.dumps(
                {
                    "verdict": score.verdict if score else None,
                    "why": (score.why or score.reason) if score else None,
                }
            ),
        ),
        ("ANSWER", attempt.answer_text or "(no prose answer)"),
        ("FINAL_QUERY", attempt.final_query or "(none: not submitted)"),
        ("TRANSCRIPT", shown_transcript or "(not kept)"),
        ("MODEL_DEFINITIONS", definitions or "(not available)"),
        ("MECHANICAL_EVIDENCE", evidence.model_dump_json(indent=1)),
    ]
    return agent.fenced(
        f"Case {case.qid}. Diagnose it by the ladder in your instructions.", sections
    )


def _costs(usage: Usage, model: str, prices: PriceTable) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_creation_tokens": usage.cache_creation_tokens,
        "cost_usd": prices.cost(model, usage),
        "model": model,
        "diagnose_version": agent.DIAGNOSE_VERSION,
    }


def _dataset_diagnosis(pick: ev.Selected, score: Any, evidence: ev.Evidence) -> Any:
    wrong = score is not None and score.gold_status == "verified_wrong"
    note = (score.gold_note if score is not None else None) or pick.why
    return ledger.DiagnosisEvent(
        qid=pick.qid,
        sample=pick.sample,
        phase=_phase(score),
        status="dataset",
        reason=pick.why,
        component="dataset",
        primary_code="BAD-REFERENCE" if wrong else "AMBIGUOUS-REFERENCE",
        owner="dataset",
        sufficiency="unknown",
        severity="high",
        confidence="high" if wrong else "medium",
        diagnosis=f"The judge's evidence against the golden: {note}",
        evidence=evidence.model_dump(mode="json"),
        traceIds=evidence.trace_ids,
        diagnose_version=agent.DIAGNOSE_VERSION,
    )


def _judge_diagnosis(pick: ev.Selected, phase: str, evidence: ev.Evidence) -> Any:
    return ledger.DiagnosisEvent(
        qid=pick.qid,
        sample=pick.sample,
        phase=phase,
        status="judge",
        reason="the re-executed rows match the golden; only the judge said no_match",
        component=JUDGE,
        primary_code="JUDGE-SUSPECT",
        owner=JUDGE,
        sufficiency=evidence.sufficiency,
        severity="medium",
        confidence="high",
        diagnosis=(
            "A judge suspect: the re-executed rows match the golden (every golden column, no "
            f"failure shape), yet the judge said no_match ({evidence.judge_why or 'no why'}). "
            "A person's review in evalloop view decides; no model edit follows from it."
        ),
        entity=f"the judge's verdict on {pick.qid}",
        evidence=evidence.model_dump(mode="json"),
        traceIds=evidence.trace_ids,
        diagnose_version=agent.DIAGNOSE_VERSION,
    )


def _phase(event: Any) -> str:
    return str(getattr(event, "phase", None) or "baseline")


def _case_event(
    pick: ev.Selected,
    phase: str,
    evidence: ev.Evidence,
    outcome: agent.Outcome,
    prices: PriceTable,
) -> ledger.DiagnosisEvent:
    common: dict[str, Any] = {
        "qid": pick.qid,
        "sample": pick.sample,
        "phase": phase,
        "probes": outcome.probes,
        "evidence": evidence.model_dump(mode="json"),
        "traceIds": evidence.trace_ids,
        "attempts": outcome.attempts,
        **_costs(outcome.usage, outcome.model, prices),
    }
    reply = outcome.reply
    if reply is None:
        why = "; ".join(outcome.problems) or "no reply"
        return ledger.DiagnosisEvent(status="undiagnosed", reason=why, **common)
    common["probes"] = [*[p.model_dump() for p in reply.probes], *outcome.probes]
    refused = "; ".join(outcome.refused)
    return ledger.DiagnosisEvent(
        status="diagnosed",
        reason=f"refused once: {refused}" if refused else None,
        entity=reply.entity,
        component=reply.component,
        primary_code=reply.primary_code,
        contributing_codes=reply.contributing_codes,
        owner=reply.owner,
        sufficiency=reply.sufficiency,
        severity=reply.severity,
        confidence=reply.confidence,
        diagnosis=reply.diagnosis,
        reasoning=reply.reasoning,
        sharedWith=reply.shared_with,
        **common,
    )


# --- clustering --------------------------------------------------------------------------


async def _cluster(
    result: Result,
    run_id: str,
    gathered: dict[str, ev.Evidence],
    client: anthropic.AsyncAnthropic,
    model: str,
    prices: PriceTable,
) -> None:
    by_qid = {d.qid: d for d in result.diagnoses}
    diagnosed = {
        d.qid: {
            "component": d.component,
            "primary_code": d.primary_code,
            "contributing_codes": d.contributing_codes,
            "owner": d.owner,
            "sufficiency": d.sufficiency,
            "entity": d.entity,
            "diagnosis": d.diagnosis,
            "sharedWith": d.shared_with,
        }
        for d in result.diagnoses
        if d.status == "diagnosed"
    }
    groups: list[tuple[str, list[str], str, str]] = []  # (slug, qids, rootCause, evidence)
    event = ledger.ClusteringEvent(status="clustered", diagnose_version=agent.DIAGNOSE_VERSION)
    shared = [g for g in claims.split_by_cause(diagnosed, diagnosed) if len(g) > 1]
    if not shared and len(diagnosed) > 1:
        # Only cases of one cause may share a cluster, and no two do: nothing to ask.
        event.reasoning = (
            "no two diagnoses name the same component, owner, code and entity: each case is a "
            "cluster of one (no clustering call)"
        )
    elif shared:
        outcome = await agent.cluster(client, model, diagnosed)
        costs = _costs(outcome.usage, outcome.model, prices)
        costs.pop("diagnose_version")
        event = ledger.ClusteringEvent(
            attempts=outcome.attempts, **costs, diagnose_version=agent.DIAGNOSE_VERSION
        )
        if outcome.reply is not None:
            event.reasoning = outcome.reply.reasoning
            groups = [
                (c.cluster_id, c.qids, c.root_cause, c.evidence) for c in outcome.reply.clusters
            ]
            if outcome.refused:
                event.reason = "refused once: " + "; ".join(outcome.refused)
        else:
            groups = _split(outcome, diagnosed, by_qid)
            event.status = "split" if groups else "singletons"
            event.reason = "; ".join(outcome.problems)
            event.reasoning = outcome.last.reasoning if groups else None
    if not groups:
        groups = [
            (_slug(by_qid[q]), [q], by_qid[q].diagnosis or "", "a cluster of one")
            for q in diagnosed
        ]
    for d in result.diagnoses:
        if d.status == "dataset":
            groups.append((f"golden-{d.qid}", [d.qid], d.diagnosis or "", d.reason or ""))
        elif d.status == "judge":
            slug = f"judge-{d.qid.lower().replace('_', '-')}"[:64]
            groups.append((slug, [d.qid], d.diagnosis or "", d.reason or ""))
    taken: set[str] = set()
    issues = []
    for slug, qids, root, why in groups:
        unique, n = slug, 1
        while unique in taken:  # a split part may be named like a cluster the reply kept
            n += 1
            unique = f"{slug[:60]}-{n}"
        taken.add(unique)
        issues.append(_issue(run_id, unique, qids, root, why, by_qid, gathered))
    issues.sort(key=lambda i: (-len(i.qids), i.owner != "model", i.issue_id))
    result.issues = issues
    event.issue_ids = [i.issue_id for i in issues]
    result.clustering = event


def _split(
    outcome: agent.Outcome,
    diagnosed: dict[str, dict[str, Any]],
    by_qid: dict[str, ledger.DiagnosisEvent],
) -> list[tuple[str, list[str], str, str]]:
    """The last clustering reply with every cluster that joined different causes split by
    cause, when that was all that was wrong with it; [] otherwise (then: singletons)."""
    last = outcome.last
    if last is None or agent.placement_problems(last, diagnosed):
        return []
    mixed = agent.mixed_causes(last, diagnosed)
    groups = []
    for c in last.clusters:
        if c.cluster_id not in mixed:
            groups.append((c.cluster_id, c.qids, c.root_cause, c.evidence))
            continue
        for part in claims.split_by_cause(c.qids, diagnosed):
            first = by_qid[part[0]]
            slug = _slug(first) if len(part) == 1 else f"{c.cluster_id}-{_slug(first)}"[:64]
            causes = sorted({by_qid[q].diagnosis or "" for q in part})
            why = f"split from {c.cluster_id}, which joined different causes: {mixed[c.cluster_id]}"
            groups.append((slug, part, " ".join(causes), why))
    return groups


def _slug(d: ledger.DiagnosisEvent) -> str:
    return f"{(d.primary_code or 'case').lower()}-{d.qid.lower().replace('_', '-')}"[:64]


def _issue(
    run_id: str,
    slug: str,
    qids: list[str],
    root_cause: str,
    why: str,
    by_qid: dict[str, ledger.DiagnosisEvent],
    gathered: dict[str, ev.Evidence],
) -> ledger.IssueEvent:
    members = [by_qid[q] for q in qids]
    component = Counter(m.component for m in members).most_common(1)[0][0] or "dataset"
    codes = Counter(m.primary_code for m in members if m.component == component)
    primary = codes.most_common(1)[0][0] or ""
    contributing = sorted(
        {c for m in members for c in [m.primary_code or "", *m.contributing_codes]} - {primary, ""}
    )
    sufficiency = min(
        (m.sufficiency or "unknown" for m in members), key=_SUFFICIENCY_WORST_FIRST.index
    )
    entities = {claims.norm(m.entity) for m in members}
    return ledger.IssueEvent(
        issue_id=f"{run_id}:{slug}",
        qids=qids,
        primary_code=primary,
        contributing_codes=contributing,
        component=component,
        owner=members[0].owner or "dataset",
        severity=max((m.severity or "low" for m in members), key=_LEVELS.index),
        confidence=min((m.confidence or "low" for m in members), key=_LEVELS.index),
        sufficiency=sufficiency,
        traceIds=sorted({t for q in qids for t in gathered[q].trace_ids}),
        diagnosis=root_cause or "; ".join(m.diagnosis or "" for m in members),
        entity=members[0].entity if len(entities) == 1 else None,
        rootCause=root_cause or None,
        evidence=why or None,
        eligibility=ev.eligibility([gathered[q] for q in qids]),
        diagnose_version=agent.DIAGNOSE_VERSION,
    )


# --- writing -----------------------------------------------------------------------------


def _write(run_dir: Path, read: ledger_reader.RunLedger, result: Result) -> int:
    """Replace diagnose's own lines with this run's; a status others recorded stands."""
    foreign = {s.issue_id for s in read.of_kind("issue_status") if s.by != "diagnose"}
    fresh = {i.issue_id for i in result.issues}
    # An old issue someone gave a status keeps its declaration unless this run re-declares it.
    kept_issues = foreign - fresh
    result.statuses = [
        ledger.IssueStatusEvent(issue_id=i.issue_id, status="open", by="diagnose")
        for i in result.issues
        if i.issue_id not in foreign
    ]

    def drop(line: dict[str, Any]) -> bool:
        kind = line.get("kind")
        if kind == "issue":
            return line.get("issue_id") not in kept_issues
        if kind == "issue_status":
            return line.get("by") == "diagnose"
        return kind in OWN_KINDS

    events: list[Any] = [*result.diagnoses]
    if result.clustering is not None:
        events.append(result.clustering)
    events += [*result.issues, *result.statuses]
    return ledger_writer.replace_events(run_dir, drop, events)
