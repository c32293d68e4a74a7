"""The ledger contract: `run.json` and every event kind of `events.jsonl`, as pydantic models.

This module is the contract. Every line written to a run directory is built from these models
(`ledger_writer` writes them, `ledger_reader` reads them back), so a field rename that reaches
only one writer fails at write time. Models are strict on write (no unknown fields, right
types: `strict_dump`) and tolerant on read (unknown fields and grandfathered shapes become
warnings, never errors: `parse_event`), because old run directories must keep validating.

Layout: ``<set>/runs/<runId>/run.json``, ``events.jsonl`` (append-only, one complete line per
event), ``artifacts/``.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from pytest_evalloop.ledger.files import ARTIFACTS_DIR as ARTIFACTS_DIR
from pytest_evalloop.ledger.files import EVENTS_FILE as EVENTS_FILE
from pytest_evalloop.ledger.files import RUN_FILE as RUN_FILE
from pytest_evalloop.ledger.vocabulary import (
    COMPONENTS as COMPONENTS,
)
from pytest_evalloop.ledger.vocabulary import (
    ISSUE_STATUSES as ISSUE_STATUSES,
)
from pytest_evalloop.ledger.vocabulary import (
    OWNERS as OWNERS,
)
from pytest_evalloop.ledger.vocabulary import (
    Component as Component,
)
from pytest_evalloop.ledger.vocabulary import (
    IssueStatus as IssueStatus,
)
from pytest_evalloop.ledger.vocabulary import (
    Level as Level,
)
from pytest_evalloop.ledger.vocabulary import (
    Owner as Owner,
)
from pytest_evalloop.ledger.vocabulary import (
    RunMode as RunMode,
)
from pytest_evalloop.ledger.vocabulary import (
    Sufficiency as Sufficiency,
)
from pytest_evalloop.ledger.vocabulary import (
    event_problems as event_problems,
)
from pytest_evalloop.ledger.vocabulary import (
    issue_problems as issue_problems,
)
from pytest_evalloop.ledger.vocabulary import (
    raised_mode as raised_mode,
)

Verdict = Literal["match", "near_match", "no_match", "needs_human"]
Contaminated = bool | Literal["unknown"]
ReportStatus = Literal["reported", "missing", "unreadable"]
"""Whether an answer reported its tool calls (the under-report rule needs the count)."""
RunStatus = Literal["running", "complete", "aborted", "interrupted", "invalid"]

# Comparison pins: a run missing one still measures, but cannot anchor an A/B on that axis.
PINS = ("judgeModel", "judgeVersion", "rubricSha", "datasetVersion", "datasetSha")


def now_iso() -> str:
    """The current UTC time as an ISO-8601 string, second precision."""
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class _Record(BaseModel):
    # extra="allow" so reading an old or foreign line keeps its fields; the writer refuses
    # them (see `strict_dump`), which is what "strict on write" means here. defer_build: a
    # model's validator is built on its first use, so a process that never writes or validates
    # an event (collection, `evalloop flips` of large runs) does not build all of them.
    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)


class RoleCost(_Record):
    """Tokens and money one role (answerer or judge) spent over a run."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0
    cost_usd: float | None = 0.0
    """None once any call's price was unknown: an unknown cost is never reported as 0."""


class RunInfo(_Record):
    """`run.json`: the run's identity (required) and its attribution pins (optional)."""

    run_id: str = Field(alias="runId")
    target: str
    answerer_model: str = Field(alias="answererModel")
    phase: str
    started: str
    label: str | None = None
    session_id: str | None = Field(default=None, alias="sessionId")
    """The pytest session that owns the run: xdist workers of one session share one run."""
    status: RunStatus | None = None
    finished: str | None = None
    set_name: str | None = Field(default=None, alias="setName")
    set_dir: str | None = Field(default=None, alias="setDir")
    """The set's directory the run measured (absolute): where its split is read when it closes,
    whatever `--eval-runs-dir` put the run."""
    judge_model: str | None = Field(default=None, alias="judgeModel")
    """The judge model its scores say was served (the configured id until the run closes)."""
    judge_model_configured: str | None = Field(default=None, alias="judgeModelConfigured")
    """The configured judge model id, when the endpoint served another (`judgeModel`)."""
    answerer_model_configured: str | None = Field(default=None, alias="answererModelConfigured")
    """The configured answerer model id, when the endpoint served another."""
    judge_version: str | None = Field(default=None, alias="judgeVersion")
    rubric_sha: str | None = Field(default=None, alias="rubricSha")
    dataset_version: int | None = Field(default=None, alias="datasetVersion")
    dataset_sha: str | None = Field(default=None, alias="datasetSha")
    answerer: str | None = None
    """The answerer backend (`anthropic`, `claude-code`, or a user's own)."""
    answerer_version: str | None = Field(default=None, alias="answererVersion")
    """The backend's own version (`claude --version`, the SDK's version)."""
    target_version: str | None = Field(default=None, alias="targetVersion")
    """The target's own software version where it reports one (the Malloy compiler's)."""
    target_profile: str | None = Field(default=None, alias="targetProfile")
    """The tool profile the target was read through (`embedded`, `publisher`, a file's name)."""
    model_sha: str | None = Field(default=None, alias="modelSha")
    """sha256 of the model the target served: the embedded model file's bytes, or what an
    external target reported (`sourceContentSha`)."""
    served_revision: str | list[str] | None = Field(default=None, alias="servedRevision")
    """The revision(s) the target reported serving (a list when it changed mid-run)."""
    answerer_cost_usd: float | None = Field(default=None, alias="answererCostUsd")
    judge_cost_usd: float | None = Field(default=None, alias="judgeCostUsd")
    costs: dict[str, RoleCost] = Field(default_factory=dict)
    cost_figures: dict[str, dict[str, float | None]] = Field(
        default_factory=dict, alias="costFigures"
    )
    """Per role: cacheReadShare, costPerCaseUsd, uncachedCostUsd (`pricing.cost_figures`)."""
    mcp_url: str | None = Field(default=None, alias="mcpUrl")
    predictions_re_executed: bool | None = Field(default=None, alias="predictionsReExecuted")
    golden_check: str | None = Field(default=None, alias="goldenCheck")
    doubted_goldens: list[dict[str, Any]] = Field(default_factory=list, alias="doubtedGoldens")
    harness_version: str | None = Field(default=None, alias="harnessVersion")
    harness_commit: str | None = Field(default=None, alias="harnessCommit")
    """The git commit of the harness's source (`-dirty` when its files differ from it); unset
    for an installed package, which `harnessVersion` identifies."""
    judge_prompt_sha: str | None = Field(default=None, alias="judgePromptSha")
    """sha256 of the judge's per-case prompt template (`judge.case_prompt_sha`)."""
    answerer_prompt_sha: str | None = Field(default=None, alias="answererPromptSha")
    """sha256 of the answerer's system prompt (the plugin's own answerers)."""
    selection: dict[str, Any] | None = None
    """What was asked for: split, -k expression, samples, item count."""
    limiter: dict[str, Any] | None = None
    rejudge_of: str | None = Field(default=None, alias="rejudgeOf")
    answers_from: str | None = Field(default=None, alias="answersFrom")
    """The session whose answerer made this run's answers when not this run's own (a rejudge's
    source's, or its source's `answersFrom`): one measurement of the answerer, never two arms."""
    seal: dict[str, Any] | None = None
    """Written when the run closes (`ledger.seal`): `lines`, `chain` (a hash chain over the event
    lines), `info`, `artifacts`, `files`, `at`; later appends extend it, a change breaks it."""
    gate: dict[str, Any] | None = None
    spend: dict[str, Any] | None = None
    """Money (`runs.spend_record`): `judgeBatch`, `endpoint` (a host other than Anthropic's: costs
    are list prices), and under `--eval-max-cost` `ceilingUsd`, `spentUsd`, `reservedUsd`..."""
    abort_reason: str | None = Field(default=None, alias="abortReason")
    invalid_reason: str | None = Field(default=None, alias="invalidReason")
    """Why closing found the ledger broken (status `invalid`): what `evalloop validate` says."""
    totals: dict[str, Any] | None = None
    """What the run counted, from `aggregates.Tally.totals` (written when the run closes)."""
    diagnoser_model: str | None = Field(default=None, alias="diagnoserModel")
    """Written by `evalloop diagnose`, so the run names every LLM that touched it."""
    diagnose_version: str | None = Field(default=None, alias="diagnoseVersion")
    diagnose_sha: str | None = Field(default=None, alias="diagnoseSha")
    paired_tests: dict[str, Any] | None = Field(default=None, alias="pairedTests")
    """Against `--baseline`: the paired p-values beside the bar (`significance.record`)."""
    run_group: str | None = Field(default=None, alias="runGroup")
    """The id every shard of one sharded run shares (`--eval-run-group`, or the CI's run id)."""
    shard: dict[str, Any] | None = None
    """Under `--eval-shard`: `index`, `count`, the partition `rule`, and the `rpm`/`tpm` share
    this shard's limiter took. A run with a shard of a count above 1 is a biased subset."""
    shards: list[dict[str, Any]] | None = None
    """A merged run (`evalloop merge`): each shard it holds (index, runId, status, started,
    finished, attempts, limiter); `merged` says whether shards 1..N were all there."""
    merged: dict[str, Any] | None = None
    """A merged run: `count` (N), `present`, `missing`, `complete`, and the summed
    `shardSeconds` (each shard's started..finished added up)."""
    mode: RunMode | None = None
    """How far the loop walked on this run (`vocabulary.raised_mode`)."""
    model_git_sha: str | None = Field(default=None, alias="modelGitSha")
    """HEAD of the git repository holding a local target's model files, `-dirty` when they had
    uncommitted changes (fine for a band measurement, never an A/B pin)."""
    improver_model: str | None = Field(default=None, alias="improverModel")
    """Written by `evalloop improve`, so the run names every LLM that touched it."""
    improve_version: str | None = Field(default=None, alias="improveVersion")
    improve_sha: str | None = Field(default=None, alias="improveSha")


class _Event(_Record):
    at: str | None = None


class _CaseEvent(_Event):
    qid: str
    sample: int | None
    phase: str


class AttemptEvent(_CaseEvent):
    """One answer to one case (`qid`, `sample`)."""

    kind: Literal["attempt"] = "attempt"
    question_sha: str
    submitted: bool
    final_query: str | None
    answer_id: str | None = None
    """Minted when an answerer made this answer; a rejudge keeps its source's. Two runs that
    hold one answer id hold one answer: never two independent measurements."""
    final_query_source: str | None = None
    """How the final query was chosen: `declared`, `last_successful`, `last_call`, `none`."""
    final_query_seq: int | None = None
    """The `seq` of the query call re-execution replayed; null when no call carried the final
    query (a declared query never run as such, or none)."""
    served_revision: str | None = Field(default=None, alias="servedRevision")
    model_sha: str | None = Field(default=None, alias="modelSha")
    """The content sha the target reported for the model it served (`sourceContentSha`)."""
    n_get_context: int = 0
    n_execute: int = 0
    n_execute_errors: int = 0
    host_tool_uses: int | None = None
    reported_calls: int | None = None
    reported_calls_status: ReportStatus | None = None
    """Whether the answer reported its tool calls; `missing`/`unreadable` leave the
    under-report rule unchecked, never clean. None on attempts written before it existed."""
    contaminated: Contaminated = "unknown"
    contamination_reasons: list[str] = Field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    cost_usd: float | None = None
    num_turns: int | None = None
    wall_seconds: float | None = None
    answer_text: str | None = None
    transcript_path: str | None = Field(default=None, alias="transcriptPath")
    prediction_path: str | None = Field(default=None, alias="predictionPath")
    reexecution: Literal["ok", "unran", "literal", "failed", "not_run", "no_query"] | None = None
    """What became of the final query's re-execution (`answer/reexecution.py`), or None."""
    answerer: str | None = None
    model: str | None = None
    error: str | None = None
    """A harness error (endpoint down after retries, target dead); such an attempt is unscored."""
    error_cause: Literal["answer", "harness"] | None = None  # `answer`: the answer caused it


class ToolCallEvent(_CaseEvent):
    """One MCP tool call an attempt made (never its result rows or credentials)."""

    kind: Literal["tool_call"] = "tool_call"
    tool: str
    role: str | None = None
    """`context` or `query`: what the call was for, whatever the target names its tools."""
    seq: int | None = None
    trace_id: str | None = Field(default=None, alias="traceId")
    targets: str | list[str] | None = None
    ranked_summary: dict[str, Any] | None = Field(default=None, alias="rankedSummary")
    query: str | None = None
    error: str | None = None


class ScoreEvent(_CaseEvent):
    """The judge's verdict for one attempt: exactly one per attempt, or with
    `--eval-judge-samples=j` one per judge sample (`judge_sample` 0..j-1), of which
    `judgesamples.counted` decides the one that counts."""

    kind: Literal["score"] = "score"
    verdict: Verdict | None
    reason: str
    confidence: int | None = None
    why: str | None = None
    column_pairing: dict[str, Any] | None = None
    judge_version: str | None = None
    rubric_sha: str | None = None
    golden_revision: int | None = None
    contaminated: Contaminated = "unknown"
    artifact_path: str | None = Field(default=None, alias="artifactPath")
    gold_status: str | None = None
    gold_note: str | None = None
    judge_model: str | None = None
    judge_attempts: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    cost_usd: float | None = None
    judge_sample: int | None = None
    """Which of the attempt's j judge samples this is (None: the judge sampled once)."""


class RetrievalScoreEvent(_Event):
    """Entity recall: per attempt in a customer run, per term in a fixed-term replay."""

    kind: Literal["retrieval_score"] = "retrieval_score"
    qid: str | None = None
    sample: int | None = None
    phase: str | None = None
    required: int | None = None
    delivered: int | None = None
    recall: float | None = None
    strict_recall: float | None = None
    returned: int | None = None
    precision: float | None = None
    noise: int | None = None
    coverage: str | None = None
    entities: list[dict[str, Any]] = Field(default_factory=list)
    intent_id: str | None = Field(default=None, alias="intentId")
    term: str | None = None
    entity_type: str | None = Field(default=None, alias="entityType")
    in_scope: bool | None = None
    judgments: list[dict[str, Any]] | None = None
    judge_version: str | None = None
    rubric_sha: str | None = None
    trace_id: str | None = Field(default=None, alias="traceId")


ReviewVerdict = Literal["match", "near_match", "no_match"]
"""What a person may settle an attempt as (needs_human is what they settle, never a ruling)."""


class ReviewEvent(_CaseEvent):
    """A person's verdict on one attempt (`evalloop review`, `evalloop view`).

    Append-only beside the judge's `score`, which is never edited: the latest review of an
    attempt is the one that counts (`aggregates.settled_scores` says how). `golden_wrong`
    instead of a verdict means the person doubted the key: the golden was held through the
    side door (`evalloop golden hold`) and no score changed.
    """

    kind: Literal["review"] = "review"
    verdict: ReviewVerdict | None
    golden_wrong: bool = False
    reviewer: str = Field(min_length=1)
    why: str = Field(min_length=1)
    judge_verdict: Verdict | None
    """The judge's verdict the person saw (copied, so the overrule reads without the score)."""
    judge_version: str | None = None
    rubric_sha: str | None = None
    regression: str | None = None
    """The `fixtureId` appended to the set's `judge-regressions.jsonl`, when one was."""

    @model_validator(mode="after")
    def _one_ruling(self) -> ReviewEvent:
        if (self.verdict is None) != self.golden_wrong:
            raise ValueError("a review gives a verdict or says golden_wrong, exactly one")
        if not self.why.strip() or not self.reviewer.strip():
            raise ValueError("a review needs a reviewer and a why")
        return self


class IssueEvent(_Event):
    """A diagnosed problem: one per cluster of cases sharing a cause (written by diagnose)."""

    kind: Literal["issue"] = "issue"
    issue_id: str
    qids: list[str] = Field(default_factory=list)
    primary_code: str
    contributing_codes: list[str] = Field(default_factory=list)
    component: Component
    owner: Owner
    severity: Level | None = None
    confidence: Level | None = None
    sufficiency: Sufficiency
    trace_ids: list[str] = Field(default_factory=list, alias="traceIds")
    diagnosis: str
    entity: str | None = None
    """The entity, join, file or convention every case of the cluster names (one cause)."""
    root_cause: str | None = Field(default=None, alias="rootCause")
    evidence: str | None = None
    """Why these cases belong together, and what would prove it wrong (the clustering's)."""
    eligibility: str | None = None
    """Construction eligibility over the cluster's cases, `eligible / total`."""
    diagnose_version: str | None = None

    @model_validator(mode="after")
    def _vocabulary(self) -> IssueEvent:
        problems = event_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class IssueStatusEvent(_Event):
    """A status change of an issue; readers take the latest per `issue_id`."""

    kind: Literal["issue_status"] = "issue_status"
    issue_id: str
    status: IssueStatus
    by: str | None = None
    """Who recorded it: `diagnose` (its `open`), `person`, `loop`. A re-run of diagnose replaces
    only its own."""
    note: str | None = None


class DiagnosisEvent(_CaseEvent):
    """One dev attempt's diagnosis (the output contract's per-case object), or why none."""

    kind: Literal["diagnosis"] = "diagnosis"
    status: Literal["diagnosed", "undiagnosed", "dataset", "judge"]
    """Routed without an agent: `dataset` to the golden side door, `judge` to a person."""
    reason: str | None = None
    """Why undiagnosed or routed, or what an accepted reply was first refused for."""
    component: Component | None = None
    primary_code: str | None = None
    contributing_codes: list[str] = Field(default_factory=list)
    owner: Owner | None = None
    sufficiency: Sufficiency | None = None
    severity: Level | None = None
    confidence: Level | None = None
    diagnosis: str | None = None
    entity: str | None = None
    reasoning: str | None = None
    shared_with: str | None = Field(default=None, alias="sharedWith")
    probes: list[dict[str, Any]] = Field(default_factory=list)
    """The agent's own probes (why, query, result) and every tool call it made."""
    evidence: dict[str, Any] = Field(default_factory=dict)
    """The mechanical evidence it was shown (`diagnose.evidence`)."""
    trace_ids: list[str] = Field(default_factory=list, alias="traceIds")
    attempts: int = 0
    model: str | None = None
    diagnose_version: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    cost_usd: float | None = None

    @model_validator(mode="after")
    def _vocabulary(self) -> DiagnosisEvent:
        if self.status == "undiagnosed":
            return self
        problems = event_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class ClusteringEvent(_Event):
    """The clustering call of one diagnose run: what it grouped and what it kept apart."""

    kind: Literal["clustering"] = "clustering"
    issue_ids: list[str] = Field(default_factory=list)
    reasoning: str | None = None
    """What was considered for a merge and kept apart, and why."""
    status: Literal["clustered", "singletons", "split"] = "clustered"
    """Refused twice: `split` by cause (for mixed causes only), else `singletons`."""
    mode: RunMode | None = None
    """The run's mode once this diagnose wrote it (`triage`, or `improve` kept)."""
    reason: str | None = None
    attempts: int = 0
    model: str | None = None
    diagnose_version: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    cost_usd: float | None = None


class CandidateEvent(_Event):
    """A proposed edit, accepted or not (written by `evalloop improve`, one per proposal)."""

    kind: Literal["candidate"] = "candidate"
    issue_ids: list[str] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list)
    diff_summary: str | list[str] | None = Field(default=None, alias="diffSummary")
    probes: list[Any] = Field(default_factory=list)
    meaning_changed: list[str] = Field(default_factory=list, alias="meaningChanged")
    golden_suspect: list[dict[str, Any]] = Field(default_factory=list, alias="goldenSuspect")
    golden_audit: dict[str, Any] | None = Field(default=None, alias="goldenAudit")
    expert_flags: list[dict[str, Any]] = Field(default_factory=list, alias="expertFlags")
    """The expert review's `{qid, quote, why}`: each halts the acceptance check, as a suspect."""
    expert_review: dict[str, Any] | None = Field(default=None, alias="expertReview")
    candidate_id: str | None = Field(default=None, alias="candidateId")
    status: Literal["proposed", "refused", "no_edit"] | None = None
    """`proposed`: checked and waiting for the acceptance check; `refused`: a mechanical check
    refused it (the reasons in `refusals`); `no_edit`: the improver proposed none."""
    refusals: list[str] = Field(default_factory=list)
    edits: list[dict[str, Any]] = Field(default_factory=list)
    """Each `{file, old, new}`: the replacements, so the acceptance check can name the bytes."""
    base_git_sha: str | None = Field(default=None, alias="baseGitSha")
    """HEAD when the edit was proposed: what a rejection restores."""
    file_shas: dict[str, str] = Field(default_factory=dict, alias="fileShas")
    """sha256 of each touched file after the edit: the acceptance check runs only on these."""
    checks: list[dict[str, Any]] = Field(default_factory=list)
    """The load or compile of the working copy and one query per touched source."""
    edit_tier: int | None = Field(default=None, alias="editTier")
    disagreement: str | None = None
    report: str | None = None
    """The improver's report block (COMPONENT ... GOLDEN-SUSPECT), as it wrote it."""
    attempts: int = 0
    model: str | None = None
    improve_version: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    cost_usd: float | None = None


class AcceptanceCheckEvent(_Event):
    """One acceptance decision (called `gate` before 2026-09-03; read as this kind)."""

    kind: Literal["acceptance_check"] = "acceptance_check"
    decision: Literal["accepted", "rejected", "unresolved", "refused"]
    issue_ids: list[str] = Field(default_factory=list)
    class_: str | None = Field(default=None, alias="class")
    baseline_run_id: str | None = Field(default=None, alias="baselineRunId")
    final_run_ids: list[str] = Field(default_factory=list, alias="finalRunIds")
    regressions: list[str] = Field(default_factory=list)
    holdout_delta: float | int | None = Field(default=None, alias="holdoutDelta")
    reason: str | None = None
    gate: str | None = None
    better: list[str] = Field(default_factory=list)
    worse: list[str] = Field(default_factory=list)
    candidate_id: str | None = Field(default=None, alias="candidateId")
    replay: list[dict[str, Any]] = Field(default_factory=list)
    """The baseline's passing final queries replayed on the edited model: `{qid, status}`,
    status `same`, `changed` (a regression candidate) or `error`."""


class CheckpointEvent(_Event):
    """A checkpoint created or restored after an accepted change."""

    kind: Literal["checkpoint"] = "checkpoint"
    action: Literal["created", "restored"]
    label: str | None = None
    model_git_sha: str | None = Field(default=None, alias="modelGitSha")
    issue_ids: list[str] = Field(default_factory=list, alias="issueIds")
    files: list[str] = Field(default_factory=list)
    """The model files the checkpoint pins (restore checks exactly these out)."""
    candidate_id: str | None = Field(default=None, alias="candidateId")


class SkillLintEvent(_Event):
    """The release gate's findings for one skill (one per skill per run)."""

    kind: Literal["skill_lint"] = "skill_lint"
    skill: str
    skill_sha: str | None = Field(default=None, alias="skillSha")
    lines: int | None = None
    scenarios: int | None = None
    negatives: int | None = None
    issues: list[dict[str, Any]] = Field(default_factory=list)
    """Each ``{level, code, message}``."""
    passed: bool


class ActivationScoreEvent(_CaseEvent):
    """How one skill scenario run went: activation, rubric, forbidden actions, questions.

    ``qid`` is ``<skill>/<scenario>`` (plus the variant when a session runs several), ``sample``
    the repeat; the run's ``attempt`` event carries tokens, cost and the transcript path.
    """

    kind: Literal["activation_score"] = "activation_score"
    skill: str
    scenario: str
    backend: str
    mode: Literal["activation", "full"]
    question_preference: str = Field(alias="questionPreference")
    invocation: Literal["implicit", "explicit"]
    expected: bool
    activated: bool | None
    """None when the run errored: an error is never a negative."""
    status: Literal["passed", "failed", "error", "skipped"]
    evidence: list[dict[str, Any]] = Field(default_factory=list)
    """Each ``{tier, tool, detail}``: why the skill counts as activated."""
    other_activations: list[str] = Field(default_factory=list, alias="otherActivations")
    visible_skills: list[str] = Field(default_factory=list, alias="visibleSkills")
    foreign_skills: list[str] = Field(default_factory=list, alias="foreignSkills")
    asked_user: bool | None = Field(default=None, alias="askedUser")
    asked_source: Literal["judge", "heuristic"] | None = Field(default=None, alias="askedSource")
    used_structured_question: bool | None = Field(default=None, alias="usedStructuredQuestion")
    ambiguity: str | None = None
    """The scenario's ``interaction.ambiguity``, when it has one."""
    interaction: dict[str, Any] | None = None
    rubric: list[dict[str, Any]] = Field(default_factory=list)
    """Each ``{criterion, pass, reason, source}``; source ``rule`` or ``judge``."""
    rubric_score: float | None = Field(default=None, alias="rubricScore")
    violations: list[str] = Field(default_factory=list)
    file_changes: list[str] = Field(default_factory=list, alias="fileChanges")
    result_subtype: str | None = Field(default=None, alias="resultSubtype")
    error_kind: str | None = Field(default=None, alias="errorKind")
    error: str | None = None
    failures: list[str] = Field(default_factory=list)
    """Why a failed run failed, one sentence each."""
    judge_version: str | None = None
    rubric_sha: str | None = None


Event = Annotated[
    AttemptEvent
    | ToolCallEvent
    | ScoreEvent
    | ReviewEvent
    | RetrievalScoreEvent
    | IssueEvent
    | IssueStatusEvent
    | DiagnosisEvent
    | ClusteringEvent
    | CandidateEvent
    | AcceptanceCheckEvent
    | CheckpointEvent
    | SkillLintEvent
    | ActivationScoreEvent,
    Field(discriminator="kind"),
]
EVENT_KINDS = (
    "attempt",
    "tool_call",
    "score",
    "review",
    "retrieval_score",
    "issue",
    "issue_status",
    "diagnosis",
    "clustering",
    "candidate",
    "acceptance_check",
    "checkpoint",
    "skill_lint",
    "activation_score",
)
LEGACY_KINDS = {"gate": "acceptance_check"}


@functools.cache
def _event_adapter() -> TypeAdapter[Event]:
    # Built on first use, like the models it unites (building it builds them all).
    return TypeAdapter(Event)


class LedgerWriteError(ValueError):
    """A line the contract refuses: unknown fields or wrong types at write time."""


def strict_dump(record: BaseModel) -> dict[str, Any]:
    """The record as a JSON object with contract names; refuses fields the contract lacks."""
    extra = record.model_extra or {}
    if extra:
        name = type(record).__name__
        raise LedgerWriteError(f"{name}: fields not in the ledger contract: {sorted(extra)}")
    # Re-validate so a value assigned after construction cannot smuggle in a wrong type.
    type(record).model_validate(record.model_dump(by_alias=True))
    data = record.model_dump(mode="json", by_alias=True)
    # `kind` first: a human scanning events.jsonl reads the kind before anything else.
    return {"kind": data.pop("kind"), **data} if "kind" in data else data


def attempt_key(event: BaseModel) -> tuple[str, int | None]:
    """The identity of an attempt: `(qid, sample)`."""
    return (getattr(event, "qid", ""), getattr(event, "sample", None))


def parse_event(data: dict[str, Any]) -> tuple[Any, list[str]]:
    """Parse one event line tolerantly; returns the event and warnings about it."""
    warnings: list[str] = []
    kind = data.get("kind")
    if kind in LEGACY_KINDS:
        warnings.append(f"legacy kind {kind!r} read as {LEGACY_KINDS[kind]!r}")
        data = {**data, "kind": LEGACY_KINDS[kind]}
    for key in ("contaminated",):
        if data.get(key) in ("true", "false"):
            # Old runs wrote booleans as strings, and bool("false") is True: read them right.
            warnings.append(f"grandfathered string {key}={data[key]!r}")
            data = {**data, key: data[key] == "true"}
    event = _event_adapter().validate_python(data)
    if event.model_extra:
        warnings.append(f"unknown fields {sorted(event.model_extra)}")
    return event, warnings


def json_schema() -> dict[str, Any]:
    """The JSON Schema of `run.json` and of an event line, for tools in other languages."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "pytest-evalloop ledger",
        "run.json": RunInfo.model_json_schema(by_alias=True),
        "event": _event_adapter().json_schema(by_alias=True),
    }
