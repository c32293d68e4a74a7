"""What a run's report shows, gathered from its ledger: pure data, no markup.

:func:`build` reads a run directory (and optionally a baseline run) and returns a
:class:`Report`: the pins, the tally of :mod:`pytest_evalloop.measure.aggregates` (the one rule
every figure is counted under, so the page's counts are the terminal summary's), the costs of
:func:`pytest_evalloop.measure.aggregates.role_costs`, the flip table of
:mod:`pytest_evalloop.measure.comparison` and the gate of :mod:`pytest_evalloop.measure.gate`, and
one :class:`CaseView` per attempt with what its drill-down shows. Rendering is
:mod:`pytest_evalloop.report.html`'s; the Markdown summary for CI is :func:`markdown`.

Every text taken from a run (answers, rows, questions, tool results, the judge's why) is
untrusted. This module keeps it as plain data; escaping is the renderer's job.

Large runs: long texts (answer, transcript, rows) share a budget of :data:`TEXT_BUDGET`
characters over the whole report, so a 10,000-case run stays a file a browser opens; whatever
was cut says so and names the artifact file that holds it whole.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger.files import artifact_bytes
from pytest_evalloop.ledger.gcpolicy import gc_paused
from pytest_evalloop.measure import aggregates, agreement, caveats, figures, significance
from pytest_evalloop.measure.comparison import Comparison, UnreadableRunError, compare, run_view
from pytest_evalloop.measure.gate import GateVerdict, decide_gate
from pytest_evalloop.measure.shardrule import SHARDS_TITLE, shard_note

TEXT_BUDGET = 9_000_000
"""Characters of long text (answer, transcript, rows) a report carries at most, all cases."""
CASE_TEXT_MAX = 60_000
"""...and at most this many for one case, however small the run."""
CASE_TEXT_MIN = 400
"""...and at least this many for one case, however large the run."""
ROWS_SHOWN = 50
"""Prediction rows shown per case (the artifact holds them all)."""
TRANSCRIPT_CASES = 2_000
"""Above this many attempts a report carries no transcripts (each case names its file):
a few hundred characters of each would say little, and reading 10,000 of them is most of
the time a report takes."""
READ_KINDS = aggregates.KINDS
"""The event kinds a report reads: the tally's (attempts, scores, retrieval scores), which also
hold the costs and the drill-downs; tool-call lines (most of a ledger) are skipped unparsed."""
DIAGNOSE_KINDS = frozenset({"diagnosis", "clustering", "issue", "issue_status"})
"""What `evalloop diagnose` wrote: a failed case's diagnosis and the run's clusters."""


@dataclass
class CaseView:
    """One attempt as its drill-down shows it (all strings are run text: untrusted)."""

    qid: str
    sample: int | None
    outcome: str
    verdict: str | None
    split: str | None = None
    tags: list[str] = field(default_factory=list)
    coverage: str | None = None
    question: str | None = None
    golden: dict[str, Any] | None = None
    final_query: str | None = None
    final_query_source: str | None = None
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    rows_note: str | None = None
    answer: str | None = None
    confidence: int | None = None
    gold_status: str | None = None
    gold_note: str | None = None
    why: str | None = None
    reason: str | None = None
    recall: float | None = None
    precision: float | None = None
    entities: list[dict[str, Any]] = field(default_factory=list)
    transcript: list[dict[str, str]] = field(default_factory=list)
    transcript_note: str | None = None
    contamination: list[str] = field(default_factory=list)
    cost_usd: float | None = None
    turns: int | None = None
    wall_seconds: float | None = None
    error: str | None = None
    diagnosis: dict[str, Any] | None = None
    """What `evalloop diagnose` said of this attempt: status, component, code, owner, why."""
    settled_by: str | None = None
    """The person whose review decided this attempt's verdict (`aggregates.settled_scores`)."""
    judge_verdict: str | None = None
    """What the judge said, when a person settled the attempt."""
    people_disagree: str | None = None
    """Who ruled what, when people disagree on the attempt (it counts as needs_human)."""
    not_reviewable: str | None = None
    """Why a person may not review this attempt (`aggregates.review_refusal`); None: they may."""

    @property
    def key(self) -> str:
        """The attempt's id in the page: the qid, with `[sN]` for samples."""
        return self.qid if self.sample is None else f"{self.qid}[s{self.sample}]"


@dataclass
class FlipView:
    """One flipped case, both sides (baseline first)."""

    qid: str
    direction: str
    baseline: CaseView | None
    current: CaseView | None
    query_diff: list[str]


@dataclass
class BaselineView:
    """The comparison against a baseline, as the report shows it."""

    name: str
    run_dir: Path
    comparison: Comparison
    verdict: GateVerdict
    recorded_gate: dict[str, Any] | None
    flipped: list[FlipView]
    paired_lines: list[str]
    """The paired tests beside the bar, in the terminal summary's words (significance.lines)."""

    @property
    def context_lines(self) -> list[str]:
        """What every view prints above the flips: what was compared and left out, whose
        verdicts people settled, and why the runs cannot carry a decision (when they cannot)."""
        c = self.comparison
        lines = [c.coverage] if c.coverage else []
        lines += c.settled_by_people
        lines += [f"cannot carry a decision: {why}" for why in c.refused]
        return lines

    @property
    def table(self) -> dict[str, int]:
        """The flip table's rows, in the order the page and the Markdown list them."""
        c = self.comparison
        return {
            "better": len(c.better),
            "worse": len(c.worse),
            "stable pass": len(c.stable_pass),
            "stable fail": len(c.stable_fail),
            "undecided after a pass": len(c.undecided),  # a lost decision, read as worse
            "unscored / neither": len(c.neither),
        }

    @property
    def _recorded(self) -> dict[str, Any] | None:
        """The gate this run recorded against this baseline, while its flips still stand (a
        review since may have changed them: then the decision is the one computed now)."""
        gate = self.recorded_gate
        if not gate or gate.get("baseline") not in (self.comparison.baseline_run_id, None):
            return None
        counts = (gate.get("better"), gate.get("worse"))
        return gate if counts == (self.verdict.better, self.verdict.worse) else None

    @property
    def stale(self) -> bool:
        """Whether a recorded gate's flips no longer stand (people settled verdicts since)."""
        return (
            bool(self.recorded_gate)
            and self._recorded is None
            and (
                (self.recorded_gate or {}).get("baseline")
                in (self.comparison.baseline_run_id, None)
            )
        )

    @property
    def decision(self) -> str:
        """The gate's decision: the one this run recorded, else what the bar says now."""
        recorded = self._recorded
        return str(recorded.get("decision")) if recorded else self.verdict.decision

    @property
    def mode(self) -> str:
        """Which gate decided (`bar`, `bar+significant`, ...): the recorded one, else the bar's."""
        recorded = self._recorded
        return str(recorded.get("gate") or self.verdict.gate) if recorded else self.verdict.gate

    @property
    def reason(self) -> str:
        """Why the gate decided so."""
        recorded = self._recorded
        if recorded is None:
            if self.stale:
                gate = self.recorded_gate or {}
                return (
                    f"{self.verdict.reason} (recorded when the run closed: {gate.get('decision')}"
                    f" with {gate.get('better')} better, {gate.get('worse')} worse; the flips "
                    "changed since, as people settled verdicts: gate again with `evalloop gate`)"
                )
            return self.verdict.reason
        failure = recorded.get("harnessFailure")
        reason = str(recorded.get("reason"))
        return f"harness failure: {failure}; {reason}" if failure else reason


def _cost_notes(info: ledger.RunInfo, costs: dict[str, ledger.RoleCost]) -> list[str]:
    from pytest_evalloop.model_api.caching import cache_lines

    models = {"answerer": info.answerer_model, "judge": info.judge_model}
    return cache_lines(costs, models, info.cost_figures, (info.spend or {}).get("endpoint"))


@dataclass
class Report:
    """Everything a run's report shows."""

    run_dir: Path
    info: ledger.RunInfo
    tally: aggregates.Tally
    costs: dict[str, ledger.RoleCost]
    cases: list[CaseView]
    interval: tuple[float, float, str] | None
    figures: list[str] = field(default_factory=list)
    """The repeat, judge-sample and precision lines, as the terminal prints them."""
    cost_notes: list[str] = field(default_factory=list)
    """Per role: cache-read share, cost per case, uncached cost, and a cache that cannot form
    (`caching.cache_lines`, as the terminal prints them)."""
    baseline: BaselineView | None = None
    truncated_cases: int = 0
    issues: list[dict[str, Any]] = field(default_factory=list)
    """The run's issues (clusters), most cases first, each with its latest status."""
    agreement: list[str] = field(default_factory=list)
    """The judge's agreement with people, as the set's last `--eval-check-judge` recorded it."""

    @property
    def name(self) -> str:
        """The run's label, else its id."""
        return self.info.label or self.info.run_id

    @property
    def pins(self) -> list[tuple[str, Any]]:
        """The header's pins, in reading order (unset ones left out)."""
        info = self.info.model_dump(by_alias=True)
        names = (
            ("dataset", "setName"),
            ("dataset version", "datasetVersion"),
            ("dataset sha", "datasetSha"),
            ("model under test", "modelSha"),
            ("served revision", "servedRevision"),
            ("target", "target"),
            ("target profile", "targetProfile"),
            ("MCP URL", "mcpUrl"),
            ("answerer", "answerer"),
            ("answerer model", "answererModel"),
            ("answerer version", "answererVersion"),
            ("answerer prompt sha", "answererPromptSha"),
            ("judge model", "judgeModel"),
            ("judge version", "judgeVersion"),
            ("rubric sha", "rubricSha"),
            ("judge prompt sha", "judgePromptSha"),
            ("harness", "harnessVersion"),
            ("harness commit", "harnessCommit"),
            ("rejudge of", "rejudgeOf"),
        )
        shown = [(title, info[key]) for title, key in names if info.get(key) not in (None, "")]
        note = shard_note(self.info)
        return shown + ([(SHARDS_TITLE, note)] if note else [])

    @property
    def duration_seconds(self) -> float | None:
        """From `started` to `finished`, None while the run is open."""
        from datetime import datetime

        if not self.info.finished:
            return None
        try:
            start = datetime.fromisoformat(self.info.started)
            end = datetime.fromisoformat(self.info.finished)
        except ValueError:
            return None
        return (end - start).total_seconds()

    @property
    def left_out(self) -> list[tuple[str, int, str]]:
        """What is not in the aggregates and why: (outcome, attempts, why)."""
        why = {
            "contaminated": "the host log showed contamination (each attempt's reasons say "
            "what was seen); out of every aggregate",
            "harness_error": "the harness could not finish the attempt; out of every aggregate",
            "gold_wrong": "the judge showed the golden wrong; out of every aggregate",
            "near_match": "neither pass nor fail: counted, not in the pass rate",
            "needs_human": "neither pass nor fail: counted, not in the pass rate",
            "unscored": "not scored: counted, not in the pass rate",
        }
        outcomes = self.tally.outcomes
        return [(word, outcomes[word], text) for word, text in why.items() if outcomes.get(word)]


def build(run_dir: Path, *, baseline_dir: Path | None = None) -> Report:
    """The report of a run directory (and, with `baseline_dir`, its comparison)."""
    read = ledger_reader.read_run(run_dir, kinds=READ_KINDS | DIAGNOSE_KINDS, validate=False)
    if read.info is None:
        problems = "; ".join(f.message for f in read.errors) or "unreadable"
        raise UnreadableRunError(
            f"run {run_dir} cannot be read ({problems}); check it with `evalloop validate {run_dir}`"
        )
    # A view per attempt (and a dict per artifact), none in a reference cycle: the collector's
    # passes over them cost a third of a 10,000-case report's time (see gc_paused).
    with gc_paused():
        tally = _tally(read)
        set_cases = _set_cases(read.run_dir)
        cases = _case_views(read, tally, set_cases)
        truncated = _fit_budget(read.run_dir, cases)
        report = Report(
            run_dir=run_dir,
            info=read.info,
            tally=tally,
            costs=aggregates.role_costs(read),
            cost_notes=_cost_notes(read.info, aggregates.role_costs(read)),
            cases=cases,
            interval=figures.pass_rate_interval(tally),
            # A light read cannot recount judge samples: the figures run.json recorded from
            # `judgesamples.summary` when the run closed are the ones the terminal printed.
            figures=figures.figure_lines(tally, (read.info.totals or {}).get("judgeSamples")),
            truncated_cases=truncated,
            issues=_issues(read),
            agreement=agreement.shown(run_dir.parent.parent),
        )
        if baseline_dir is not None:
            report.baseline = _baseline(read, tally, baseline_dir, cases, set_cases)
    return report


def _tally(read: ledger_reader.RunLedger) -> aggregates.Tally:
    """The run's tally; a run changed after it closed is counted as invalid (its pass rate
    withheld, with the first change named), since its lines are no longer what was measured."""
    from pytest_evalloop.ledger.seal import verify

    broken = verify(read.run_dir).broken
    if broken is None:
        return aggregates.tally(read)
    return aggregates.tally(
        read, status="invalid", invalid_reason=f"changed after it closed: {broken}"
    )


def _set_cases(run_dir: Path) -> dict[str, Any]:
    """The set's rows by qid (the set is the run directory's `../..`; {} when none loads)."""
    from pytest_evalloop.sets import cases as sets

    set_dir = run_dir.parent.parent
    if not (set_dir / sets.SET_FILE).is_file():
        return {}
    try:
        return dict(sets.shown_cases(set_dir))
    except OSError:
        return {}


def _case_views(
    read: ledger_reader.RunLedger,
    tally: aggregates.Tally,
    cases: dict[str, Any],
    only: set[str] | None = None,
) -> list[CaseView]:
    """A view per counted attempt (of the qids in `only`, when given), `cases` the set's rows."""
    attempts = read.attempts()
    scores = read.scores()
    retrieval = {(e.qid, e.sample): e for e in read.of_kind("retrieval_score") if e.qid}
    transcripts = len(tally.attempts) <= TRANSCRIPT_CASES
    run_dir = str(read.run_dir)
    diagnoses = {(d.qid, d.sample): d for d in read.of_kind("diagnosis")}
    views = []
    for counted in tally.attempts:
        if only is not None and counted.qid not in only:
            continue
        key = (counted.qid, counted.sample)
        attempt, score, ret = attempts.get(key), scores.get(key), retrieval.get(key)
        case = cases.get(counted.qid)
        view = CaseView(
            qid=counted.qid,
            sample=counted.sample,
            outcome=counted.outcome,
            verdict=counted.verdict,
            reason=counted.reason,
            gold_status=counted.gold_status,
            gold_note=counted.gold_note,
            recall=counted.recall,
            settled_by=counted.settled_by,
            judge_verdict=counted.judge_verdict,
            people_disagree=counted.people_disagree,
            not_reviewable=aggregates.review_refusal(score, attempt),
        )
        if case is not None:
            view.split, view.coverage = case["split"], case.get("coverage")
            view.tags = list(case.get("tags", ()))
            view.question = case["question"]
            view.golden = _golden(case.get("golden"))
        if score is not None:
            view.confidence, view.why = score.confidence, score.why
        if ret is not None:
            view.precision = ret.precision
            view.entities = list(ret.entities or [])
        if attempt is not None:
            view.final_query = attempt.final_query
            view.answer = attempt.answer_text
            view.contamination = list(attempt.contamination_reasons or [])
            view.cost_usd, view.turns = attempt.cost_usd, attempt.num_turns
            view.wall_seconds, view.error = attempt.wall_seconds, attempt.error
            _artifacts_into(view, run_dir, attempt, transcripts)
        if key in diagnoses:
            view.diagnosis = _diagnosis(diagnoses[key])
        views.append(view)
    return views


def _diagnosis(d: Any) -> dict[str, Any]:
    shown = ("status", "reason", "component", "primary_code", "owner", "sufficiency", "diagnosis")
    out = {name: getattr(d, name) for name in shown}
    out["contributing_codes"] = ", ".join(d.contributing_codes or [])
    out["shapes"] = "; ".join(s.get("detail", "") for s in (d.evidence or {}).get("shapes", []))
    return out


def _issues(read: ledger_reader.RunLedger) -> list[dict[str, Any]]:
    """The run's issues in file order (diagnose writes them most cases first), latest status."""
    statuses = {s.issue_id: s.status for s in read.of_kind("issue_status")}
    kept_apart = next((c.reasoning for c in read.of_kind("clustering") if c.reasoning), None)
    issues = {i.issue_id: i for i in read.of_kind("issue")}
    return [
        {
            "issue_id": i.issue_id,
            "status": statuses.get(i.issue_id, "(none)"),
            "owner": i.owner,
            "component": i.component,
            "codes": ", ".join([i.primary_code, *(i.contributing_codes or [])]),
            "qids": list(i.qids or []),
            "diagnosis": i.diagnosis,
            "evidence": i.evidence,
            "kept_apart": kept_apart,
        }
        for i in issues.values()
    ]


def _golden(golden: Any) -> dict[str, Any] | None:
    # `golden` is a row's `sets.ShownGolden`, a dict of the keys shown.
    if golden is None:
        return None
    value = golden.get("value")
    return {
        "status": golden.get("status"),
        "kind": golden["kind"],
        "value": None if value is None else json.dumps(value, ensure_ascii=False),
        "path": golden.get("path"),
        "rubric": golden.get("rubric"),
        "mustState": list(golden.get("mustState", ())),
    }


def _artifact(run_dir: str, stored: str | None) -> str | None:
    # Artifact paths are recorded relative to the run directory; nothing outside it is read.
    # A string check, not resolve(): resolving costs several stats per file, ×10,000 cases;
    # and a string join, not a Path (pathlib's parsing was a tenth of a 10,000-case report).
    if not stored or stored.startswith(("/", "\\")) or ".." in stored.replace("\\", "/").split("/"):
        return None
    return os.path.join(run_dir, stored)


def _load_json(path: str | None) -> Any:
    from pydantic_core import from_json

    if path is None:
        return None
    raw = artifact_bytes(path)  # never a pipe (a wait) nor a link (bytes no seal covers)
    if raw is None:
        return None
    try:
        # pydantic-core's parser (the ledger's) reads what `json` reads, the same values, in a
        # third of the time; what it refuses `json` may still read (a BOM, UTF-16, a lone
        # surrogate escape), so that is tried before giving up.
        return from_json(raw)
    except ValueError:
        pass
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _aliased(event: Any, name: str, alias: str) -> Any:
    # A light read keeps a line's JSON keys (the alias); a validated event has the field name.
    value = getattr(event, alias, None)
    return value if value is not None else getattr(event, name, None)


def _artifacts_into(view: CaseView, run_dir: str, attempt: Any, transcripts: bool) -> None:
    prediction_path = _aliased(attempt, "prediction_path", "predictionPath")
    predicted = _load_json(_artifact(run_dir, prediction_path))
    if isinstance(predicted, dict):
        view.final_query_source = predicted.get("final_query_source")
        view.columns = [str(c) for c in predicted.get("columns") or []]
        rows = predicted.get("rows") or []
        view.rows = [[_cell(row.get(c)) for c in view.columns] for row in rows[:ROWS_SHOWN]]
        notes = []
        if len(rows) > ROWS_SHOWN:
            notes.append(f"{ROWS_SHOWN} of {len(rows)} rows shown; all in {prediction_path}")
        if predicted.get("truncated"):
            notes.append("the target capped the result")
        if predicted.get("error"):
            notes.append(f"re-execution error: {predicted['error']}")
        view.rows_note = "; ".join(notes) or None
    transcript_path = _aliased(attempt, "transcript_path", "transcriptPath")
    if not transcripts:
        view.transcript_note = (
            f"not in reports of more than {TRANSCRIPT_CASES} attempts: see {transcript_path}"
        )
        return
    transcript = _load_json(_artifact(run_dir, transcript_path))
    if isinstance(transcript, dict):
        view.transcript = _transcript_steps(transcript.get("messages") or [])


def _cell(value: Any) -> str:
    return "NULL" if value is None else str(value)


def _transcript_steps(messages: list[Any]) -> list[dict[str, str]]:
    """The transcript as steps: text, tool call (name and input), tool result."""
    steps = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role", "?"))
        content = message.get("content")
        if isinstance(content, str):
            steps.append({"kind": "text", "role": role, "text": content})
            continue
        for block in content or []:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                steps.append({"kind": "text", "role": role, "text": str(block.get("text", ""))})
            elif kind == "tool_use":
                # Compact: `indent` would fall back to the pure-Python encoder (slow at 10,000).
                text = json.dumps(block.get("input"), ensure_ascii=False)
                steps.append({"kind": "call", "role": str(block.get("name")), "text": text})
            elif kind == "tool_result":
                steps.append({"kind": "result", "role": "result", "text": _result_text(block)})
    return steps


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        parts = [str(c.get("text", "")) if isinstance(c, dict) else str(c) for c in content]
        return "\n".join(parts)
    return "" if content is None else str(content)


def _fit_budget(run_dir: Path, cases: list[CaseView]) -> int:
    """Cut each case's long texts to its share of TEXT_BUDGET; returns how many were cut."""
    if not cases:
        return 0
    share = max(CASE_TEXT_MIN, min(CASE_TEXT_MAX, TEXT_BUDGET // len(cases)))
    cut = 0
    for view in cases:
        left = share
        if view.answer and len(view.answer) > left // 2:
            view.answer = view.answer[: left // 2] + " …"
            cut += 1
        left -= len(view.answer or "")
        rows_size = sum(len(c) for row in view.rows for c in row)
        if rows_size > left // 2:
            keep, size = [], 0
            for row in view.rows:
                size += sum(len(c) for c in row)
                if size > left // 2:
                    break
                keep.append(row)
            view.rows_note = f"{len(keep)} rows shown (report size budget); all in artifacts"
            view.rows = keep
        left -= sum(len(c) for row in view.rows for c in row)
        view.transcript, note = _cut_transcript(view.transcript, max(left, CASE_TEXT_MIN // 2))
        if note:
            view.transcript_note = note
            cut += 1
    return cut


def _cut_transcript(steps: list[dict[str, str]], budget: int) -> tuple[list[dict[str, str]], str]:
    total = sum(len(s["text"]) for s in steps)
    if total <= budget:
        return steps, ""
    # Every step stays (the reader sees each call), each cut to an even share of the budget.
    each = max(40, budget // max(1, len(steps)))
    out = [{**s, "text": s["text"][:each] + " …"} if len(s["text"]) > each else s for s in steps]
    return out, f"cut to {each} characters a step ({total} in all); whole in transcript.json"


def _baseline(
    read: ledger_reader.RunLedger,
    tally: aggregates.Tally,
    baseline_dir: Path,
    cases: list[CaseView],
    set_cases: dict[str, Any],
) -> BaselineView:
    # One read of the baseline serves the comparison (its kinds and keys are a superset of
    # `comparison.read_compared`'s) and the flipped cases' drill-downs, and one tally of each run
    # serves the views, the comparison and the paired tests.
    base_read = ledger_reader.read_run(baseline_dir, kinds=READ_KINDS, validate=False)
    base_tally = aggregates.tally(base_read)
    base, cur = run_view(base_read, base_tally), run_view(read, tally)
    # Every case of either run, as the terminal's comparison does (`baseline.compare_run`).
    comparison = compare(base, cur)
    verdict = decide_gate("off", comparison, allow_pin_mismatch=False, targeted=None)
    base_cases: dict[str, CaseView] = {}
    flipped_qids = {f.qid for f in [*comparison.better, *comparison.worse]}
    if flipped_qids:
        # Only the flipped cases' views (their artifacts read): the page shows no other
        # baseline case. The set's rows are the current run's unless the baseline has its own.
        if baseline_dir.parent.parent != read.run_dir.parent.parent:
            set_cases = _set_cases(baseline_dir)
        for view in _case_views(base_read, base_tally, set_cases, flipped_qids):
            base_cases.setdefault(view.qid, view)
        _fit_budget(baseline_dir, list(base_cases.values()))
    mine: dict[str, CaseView] = {}
    for view in cases:
        mine.setdefault(view.qid, view)
    flipped = [
        FlipView(
            qid=f.qid,
            direction=direction,
            baseline=base_cases.get(f.qid),
            current=mine.get(f.qid),
            query_diff=query_diff(f.baseline.final_query, f.current.final_query),
        )
        for direction, group in (("worse", comparison.worse), ("better", comparison.better))
        for f in group
    ]

    paired = significance.paired_tests(comparison, base_read, read, (base_tally, tally))
    return BaselineView(
        name=base.name,
        run_dir=baseline_dir,
        comparison=comparison,
        verdict=verdict,
        recorded_gate=read.info.gate if read.info is not None else None,
        flipped=flipped,
        paired_lines=caveats.samples_note(comparison) + significance.lines(paired),
    )


def query_diff(before: str | None, after: str | None) -> list[str]:
    """The final queries as a unified diff, baseline to current (lines with +/-/space)."""
    a = (before or "").splitlines()
    b = (after or "").splitlines()
    lines = list(difflib.unified_diff(a, b, "baseline", "current", lineterm="", n=3))
    if not lines:
        return ["  " + line for line in a] or ["  (no final query on either side)"]
    return lines


def pass_rate_text(report: Report) -> str:
    """The pass rate as the page and the Markdown say it (withheld with its reason)."""
    tally = report.tally
    if tally.withheld is not None:
        return f"withheld ({tally.withheld})"
    if tally.pass_rate is None:
        return "n/a (no decided verdict)"
    text = f"{tally.pass_rate:.1%} ({tally.passed}/{tally.decided} decided)"
    return text + figures.interval_text(tally)
