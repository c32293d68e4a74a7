"""Mechanical evidence per failed attempt, free: what the ledger already holds, no model call.

Which attempts a diagnosis may look at (`select`), and for each (`gather`): what the answerer
asked the context tool for, which needed entities came back, by which route and at what rank,
which returned entities the final query used and which it left unused, `mustNotUse` entities
used, query errors, not-submitted, a refusal on an answerable case or an answer on an absent
one, the failure shape against the golden (`shapes`), construction eligibility and what can be
said of sufficiency. Everything here is a pure function of ledger events, the case and the
artifacts; the diagnose agent is shown the result and refines it, never the other way round.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from pytest_evalloop.diagnose.shapes import Shape, failure_shapes, golden_rows, rows_match
from pytest_evalloop.ledger.files import artifact_bytes
from pytest_evalloop.measure import aggregates
from pytest_evalloop.sets import cases as sets

Route = Literal["agent", "dataset"]


# --- which attempts ----------------------------------------------------------------------


@dataclass(frozen=True)
class Selected:
    """An attempt chosen for diagnosis: by the agent, or straight to a `dataset` issue."""

    qid: str
    sample: int | None
    route: Route
    why: str


def select(
    attempts: Mapping[tuple[str, int | None], Any],
    scores: Mapping[tuple[str, int | None], Any],
    cases: Mapping[str, sets.Case],
) -> tuple[list[Selected], dict[tuple[str, int | None], str]]:
    """The attempts to diagnose, and every other attempt with why not (one rule, pure).

    Dev only: a holdout attempt is never shown to a diagnosis, so the acceptance check keeps
    something improve never saw. Contaminated attempts and harness errors are not model work.
    A golden the judge showed wrong (`gold_wrong`) or doubted (`suspect`) goes straight to a
    `dataset` issue for the golden side door. Of the rest, `no_match` and a not-submitted
    attempt are failures; a pass, near_match, needs_human or another unscorable one is not.
    """
    chosen: list[Selected] = []
    skipped: dict[tuple[str, int | None], str] = {}
    for key in sorted(set(attempts) | set(scores), key=lambda k: (k[0], k[1] or 0)):
        qid, sample = key
        attempt, score = attempts.get(key), scores.get(key)
        case = cases.get(qid)
        word = aggregates.outcome(score, attempt)
        if case is None:
            skipped[key] = "not in cases.jsonl"
        elif case.split != "dev":
            skipped[key] = "holdout (never shown to diagnose)"
        elif word == "contaminated":
            skipped[key] = "contaminated (harness or ops, not model work)"
        elif word == "harness_error" or (attempt is not None and attempt.error):
            skipped[key] = "harness error (never diagnose a sick system)"
        elif word == "gold_wrong":
            chosen.append(Selected(qid, sample, "dataset", "the judge showed the golden wrong"))
        elif score is not None and score.gold_status == "suspect":
            chosen.append(Selected(qid, sample, "dataset", "the judge doubted the golden"))
        elif word == "no_match":
            chosen.append(Selected(qid, sample, "agent", "no_match"))
        elif word == "unscored" and score is not None and score.reason == "not_submitted":
            chosen.append(Selected(qid, sample, "agent", "not submitted"))
        else:
            skipped[key] = f"not a failure ({word})"
    return chosen, skipped


# --- what one attempt shows --------------------------------------------------------------


class Ask(BaseModel):
    """One context-tool call: what was asked, how much came back."""

    seq: int | None
    targets: str | list[str] | None
    result_count: int | None
    trace_id: str | None
    error: str | None = None


class Needed(BaseModel):
    """One entity the case needs, and what became of it."""

    id: str
    group: int | None
    """Its requiredAnyOf group (any one of a group suffices); None: required itself."""
    delivery: str
    rank: int | None
    asked_by: int | None
    """The `seq` of the context call that returned it best."""
    used: bool


class Evidence(BaseModel):
    """The mechanical evidence of one failed attempt."""

    qid: str
    sample: int | None
    verdict: str | None
    judge_why: str | None
    gold_status: str | None
    submitted: bool
    asked: list[Ask] = Field(default_factory=list)
    needed: list[Needed] = Field(default_factory=list)
    used: list[str] = Field(default_factory=list)
    """Returned entities the final query referenced."""
    needed_unused: list[str] = Field(default_factory=list)
    """Needed entities returned and then left out of the final query."""
    must_not_use_used: list[str] = Field(default_factory=list)
    query_errors: list[str] = Field(default_factory=list)
    refusal: Literal["refusal_on_answerable", "answer_on_absent"] | None = None
    shapes: list[Shape] = Field(default_factory=list)
    rows_match: bool | None = None
    """The re-executed rows are the golden's (every golden column paired, no shape); None:
    nothing to compare (no rows, or a golden without rows)."""
    settled_by: str | None = None
    """Who settled the verdict when a person did (`evalloop review`): the judge's word is then
    no longer what is diagnosed."""
    judge_suspect: bool = False
    """The rows match the golden and only the judge said otherwise: a case for a person's
    review, never for the ladder (`judge_suspect`)."""
    eligible: bool
    """Every needed entity came back: a construction diagnosis is even possible."""
    sufficiency: Literal["sufficient", "insufficient", "unknown"]
    """`unknown` wherever the rendered tool result was not kept (no transcript)."""
    counts: dict[str, int | None] = Field(default_factory=dict)
    trace_ids: list[str] = Field(default_factory=list)


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def query_words(query: str | None) -> set[str]:
    """The identifiers of a query, lower-cased (what `uses` matches entity names against)."""
    return {w.casefold() for w in _WORD.findall(query or "")}


def uses(entity_id: str, words: set[str]) -> bool:
    """Whether a query whose identifiers are `words` references the entity `kind:source:name`.

    A source is used when its name appears; a field or join when its name and its source's do
    (an alias hides the source: the agent resolves those, this does not guess).
    """
    parts = entity_id.split(":")
    if len(parts) != 3:
        return False
    kind, source, name = (p.casefold() for p in parts)
    if kind == "source":
        return name in words
    return name in words and source in words


def gather(
    attempt: Any,
    tool_calls: Sequence[Any],
    score: Any | None,
    retrieval: Any | None,
    case: sets.Case,
    golden_value: Any,
    prediction: Mapping[str, Any] | None,
    transcript_kept: bool,
) -> Evidence:
    """The evidence of one attempt, from its events, its case and its artifacts (pure)."""
    golden = case.golden
    words = query_words(attempt.final_query)
    asks = [c for c in tool_calls if (c.role or _role(c.tool)) == "context"]
    asked = [
        Ask(
            seq=c.seq,
            targets=c.targets,
            result_count=(c.ranked_summary or {}).get("resultCount"),
            trace_id=c.trace_id,
            error=c.error,
        )
        for c in asks
    ]
    returned = _returned(asks)
    needed = [
        Needed(
            id=e["id"],
            group=e.get("group"),
            delivery=e.get("delivery", "missing"),
            rank=e.get("rank"),
            asked_by=_best_call(e["id"], asks),
            used=uses(e["id"], words),
        )
        for e in (retrieval.entities if retrieval is not None else [])
        if isinstance(e, dict) and "id" in e
    ]
    must_not = list(golden.must_not_use) if golden else []
    errors = [c.error for c in tool_calls if c.error and (c.role or _role(c.tool)) == "query"]
    complete = _all_delivered(needed, case)
    kind = golden.kind if golden else ""
    match = _rows_match(kind, golden_value, prediction, score)
    settled_by = getattr(score, "settled_by", None) if score is not None else None
    verdict = score.verdict if score is not None else None
    return Evidence(
        qid=attempt.qid,
        sample=attempt.sample,
        verdict=verdict,
        judge_why=(score.why or score.reason) if score is not None else None,
        gold_status=score.gold_status if score is not None else None,
        submitted=bool(attempt.submitted),
        asked=asked,
        needed=needed,
        used=[e for e in returned if uses(e, words)],
        needed_unused=[n.id for n in needed if n.delivery != "missing" and not n.used],
        must_not_use_used=[m for m in must_not if _names(m, words)],
        query_errors=errors,
        refusal=_refusal(kind, attempt),
        shapes=_shapes(kind, golden_value, prediction, score),
        rows_match=match,
        settled_by=settled_by,
        judge_suspect=judge_suspect(match, verdict, settled_by),
        eligible=complete is True,
        sufficiency=_sufficiency(complete, transcript_kept),
        counts={
            "n_get_context": attempt.n_get_context,
            "n_execute": attempt.n_execute,
            "n_execute_errors": attempt.n_execute_errors,
            "num_turns": attempt.num_turns,
        },
        trace_ids=[c.trace_id for c in asks if c.trace_id],
    )


def _role(tool: str) -> str | None:
    return {"get_context": "context", "execute_query": "query"}.get(tool)


def _returned(asks: Sequence[Any]) -> list[str]:
    seen: dict[str, None] = {}
    for call in asks:
        for entity in (call.ranked_summary or {}).get("entityIds") or []:
            seen.setdefault(str(entity), None)
    return list(seen)


def _best_call(entity_id: str, asks: Sequence[Any]) -> int | None:
    best: tuple[int, int | None] | None = None
    for call in asks:
        summary = call.ranked_summary or {}
        ids, ranks = summary.get("entityIds") or [], summary.get("ranks") or []
        if entity_id in ids:
            position = ids.index(entity_id)
            rank = ranks[position] if position < len(ranks) else position + 1
            if best is None or rank < best[0]:
                best = (rank, call.seq)
    return best[1] if best else None


def _all_delivered(needed: list[Needed], case: sets.Case) -> bool | None:
    """True: every required entity and one of each group came back; None: nothing to say."""
    expected = case.expected_entities
    if expected is None or not (expected.required or expected.required_any_of) or not needed:
        return None
    singles = [n for n in needed if n.group is None]
    groups: dict[int, bool] = {}
    for n in needed:
        if n.group is not None:
            groups[n.group] = groups.get(n.group, False) or n.delivery != "missing"
    return all(n.delivery != "missing" for n in singles) and all(groups.values())


def _sufficiency(complete: bool | None, transcript_kept: bool) -> Any:
    # A needed entity the server never returned was never in the context, whatever the host
    # kept; one it returned was in the context only if the rendered result survives.
    if complete is False:
        return "insufficient"
    return "sufficient" if complete and transcript_kept else "unknown"


def _names(name: str, words: set[str]) -> bool:
    return name.split(":")[-1].casefold() in words


def _refusal(kind: str, attempt: Any) -> Any:
    if kind == "unanswerable" and attempt.submitted:
        return "answer_on_absent"
    if kind and kind != "unanswerable" and not attempt.submitted:
        return "refusal_on_answerable"
    return None


def _shapes(
    kind: str, golden_value: Any, prediction: Mapping[str, Any] | None, score: Any | None
) -> list[Shape]:
    gold = golden_rows(kind, golden_value)
    rows = (prediction or {}).get("rows")
    if gold is None or not isinstance(rows, list):
        return []
    pairing = score.column_pairing if score is not None else None
    return failure_shapes(gold, [r for r in rows if isinstance(r, dict)], pairing)


def _rows_match(
    kind: str, golden_value: Any, prediction: Mapping[str, Any] | None, score: Any | None
) -> bool | None:
    gold = golden_rows(kind, golden_value)
    stored = prediction or {}
    rows = stored.get("rows")
    # Only every row, re-executed without an error, can show the answer was right.
    partial = stored.get("truncated") or stored.get("error") or stored.get("re_executed") is False
    if gold is None or not isinstance(rows, list) or partial:
        return None
    pairing = score.column_pairing if score is not None else None
    return rows_match(gold, [r for r in rows if isinstance(r, dict)], pairing)


def judge_suspect(match: bool | None, verdict: str | None, settled_by: str | None) -> bool:
    """A judge suspect: the rows match the golden, the judge said no_match, and no person has
    settled it (a person who upheld the no_match saw more than the rows: the ladder takes it)."""
    return match is True and verdict == "no_match" and settled_by is None


def read_artifact(run_dir: Path, relative: str | None) -> Any:
    """A JSON artifact of the run, or None when it is absent or unreadable."""
    if not relative:
        return None
    raw = artifact_bytes(run_dir / relative)  # never a pipe nor a link
    try:
        return None if raw is None else json.loads(raw.decode("utf-8"))
    except ValueError:
        return None


def transcript_kept(transcript: Any) -> bool:
    """Whether a stored transcript still holds the rendered tool results the answerer saw."""
    return "tool_result" in json.dumps(transcript) if transcript is not None else False


def eligibility(evidence: Sequence[Evidence]) -> str:
    """Construction eligibility over attempts as `eligible / total` (a conditional, not a
    causal comparison)."""
    return f"{sum(e.eligible for e in evidence)} / {len(evidence)}"
