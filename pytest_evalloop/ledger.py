"""The ledger contract: `run.json` and every event kind of `events.jsonl`, as pydantic models.

This module is the contract. Every line written to a run directory is built here, so a field
rename that reaches only one writer fails at write time. Models are strict on write (no unknown
fields, right types) and tolerant on read (unknown fields and grandfathered shapes become
warnings, never errors), because old run directories must keep validating.

Layout: ``<set>/runs/<runId>/run.json``, ``events.jsonl`` (append-only, one complete line per
event), ``artifacts/``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import from_json, to_json
from typing_extensions import TypedDict

from pytest_evalloop.gcpolicy import gc_paused
from pytest_evalloop.redaction import redact

RUN_FILE = "run.json"
EVENTS_FILE = "events.jsonl"
ARTIFACTS_DIR = "artifacts"
READ_CACHE_FILE = "events.cache.json"
"""Derived from `events.jsonl` for fast comparisons (see `read_run`); safe to delete."""
READ_CACHE_FORMAT = 1

COMPARED_KINDS = frozenset({"attempt", "score"})
"""A comparison reads only these event kinds (tool calls are most of a ledger)."""
COMPARED_FIELDS = frozenset(
    {
        "verdict",
        "reason",
        "why",
        "contaminated",
        "gold_status",
        "gold_note",
        "final_query",
        "judge_sample",
    }
)
"""... and only these keys of them (with kind, qid and sample): what `flips.run_view` and
`aggregates.tally` look at. Reading another key of such an event raises AttributeError."""

Verdict = Literal["match", "near_match", "no_match", "needs_human"]
Contaminated = bool | Literal["unknown"]
ReportStatus = Literal["reported", "missing", "unreadable"]
"""Whether an answer reported its tool calls (the under-report rule needs the count)."""
RunStatus = Literal["running", "complete", "aborted", "interrupted", "invalid"]

# Comparison pins: a run missing one still measures, but cannot anchor an A/B on that axis.
PINS = ("judgeModel", "judgeVersion", "rubricSha", "datasetVersion", "datasetSha")


def contained_dir(root: Path, name: str) -> Path:
    """`root / name`, refused (ValueError) unless it is a direct child of `root` on disk too.

    Collection already refuses qids outside `sets.QID_PATTERN`; this is the second fence, at the
    one place artifact paths are built, so a name that slipped through (`..`, `/`, NUL, an
    absolute path, a symlink planted under `root`) can never make a write land outside the run.
    """
    if not name or "\0" in name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"{name!r} cannot name a directory under {root}")
    path = root / name
    if path.resolve().parent != root.resolve():
        raise ValueError(f"{root / name} resolves outside {root}; refusing to write there")
    return path


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
    judge_model: str | None = Field(default=None, alias="judgeModel")
    judge_version: str | None = Field(default=None, alias="judgeVersion")
    rubric_sha: str | None = Field(default=None, alias="rubricSha")
    dataset_version: int | None = Field(default=None, alias="datasetVersion")
    dataset_sha: str | None = Field(default=None, alias="datasetSha")
    answerer: str | None = None
    """The answerer backend (`anthropic`, `claude-code`, or a user's own)."""
    answerer_version: str | None = Field(default=None, alias="answererVersion")
    """The backend's own version (`claude --version`, the SDK's version)."""
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
    mcp_url: str | None = Field(default=None, alias="mcpUrl")
    predictions_re_executed: bool | None = Field(default=None, alias="predictionsReExecuted")
    golden_check: str | None = Field(default=None, alias="goldenCheck")
    doubted_goldens: list[dict[str, Any]] = Field(default_factory=list, alias="doubtedGoldens")
    harness_version: str | None = Field(default=None, alias="harnessVersion")
    selection: dict[str, Any] | None = None
    """What was asked for: split, -k expression, samples, item count."""
    limiter: dict[str, Any] | None = None
    rejudge_of: str | None = Field(default=None, alias="rejudgeOf")
    gate: dict[str, Any] | None = None
    abort_reason: str | None = Field(default=None, alias="abortReason")
    invalid_reason: str | None = Field(default=None, alias="invalidReason")
    """Why closing found the ledger broken (status `invalid`): what `evalloop validate` says."""
    totals: dict[str, Any] | None = None
    """What the run counted, from `aggregates.Tally.totals` (written when the run closes)."""
    paired_tests: dict[str, Any] | None = Field(default=None, alias="pairedTests")
    """Against `--baseline`: the paired p-values beside the bar (`significance.record`)."""


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
    answerer: str | None = None
    model: str | None = None
    error: str | None = None
    """A harness error (endpoint down after retries, target dead); such an attempt is unscored."""


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


class IssueEvent(_Event):
    """A diagnosed problem (written by a diagnose stage)."""

    kind: Literal["issue"] = "issue"
    issue_id: str
    qids: list[str] = Field(default_factory=list)
    primary_code: str | None = None
    contributing_codes: list[str] = Field(default_factory=list)
    component: str | None = None
    owner: str | None = None
    severity: str | None = None
    confidence: str | None = None
    sufficiency: str | None = None
    trace_ids: list[str] = Field(default_factory=list, alias="traceIds")
    diagnosis: str | None = None


class IssueStatusEvent(_Event):
    """A status change of an issue; readers take the latest per `issue_id`."""

    kind: Literal["issue_status"] = "issue_status"
    issue_id: str
    status: Literal["open", "batched", "fixed", "rejected", "deferred"]


class CandidateEvent(_Event):
    """A proposed edit, accepted or not."""

    kind: Literal["candidate"] = "candidate"
    issue_ids: list[str] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list)
    diff_summary: str | list[str] | None = Field(default=None, alias="diffSummary")
    probes: list[Any] = Field(default_factory=list)
    meaning_changed: list[str] = Field(default_factory=list, alias="meaningChanged")
    golden_suspect: list[dict[str, Any]] = Field(default_factory=list, alias="goldenSuspect")
    golden_audit: dict[str, Any] | None = Field(default=None, alias="goldenAudit")


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


class CheckpointEvent(_Event):
    """A checkpoint created or restored after an accepted change."""

    kind: Literal["checkpoint"] = "checkpoint"
    action: Literal["created", "restored"]
    label: str | None = None
    model_git_sha: str | None = Field(default=None, alias="modelGitSha")
    issue_ids: list[str] = Field(default_factory=list, alias="issueIds")


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
    | RetrievalScoreEvent
    | IssueEvent
    | IssueStatusEvent
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
    "retrieval_score",
    "issue",
    "issue_status",
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


# --- writing ---------------------------------------------------------------------------


class LedgerWriter:
    """Appends events to one run's `events.jsonl`: one complete line per event, never rewritten.

    Safe across processes (xdist workers append to the same file): each line goes out in a
    single `write` under an exclusive `flock`, then is fsynced, so a kill at any moment leaves
    every earlier line whole.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / EVENTS_FILE
        run_dir.mkdir(parents=True, exist_ok=True)

    def append(self, *events: BaseModel) -> None:
        """Validate and append events in one locked write."""
        if not events:
            return
        stamp = now_iso()
        lines = []
        for event in events:
            if getattr(event, "at", "set") is None:
                event.at = stamp  # type: ignore[attr-defined]
            lines.append(json.dumps(strict_dump(event), ensure_ascii=False, sort_keys=False))
        # Every line passes the one redaction: error text may carry an echoed credential.
        payload = (redact("\n".join(lines)) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._seal_torn_tail(fd)
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _seal_torn_tail(self, fd: int) -> None:
        # A run killed mid-write (by something stronger than us) may have left a partial last
        # line; ending it keeps our new line intact, and validate still reports the torn one.
        size = os.fstat(fd).st_size
        if size == 0:
            return
        with open(self.path, "rb") as handle:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":
                os.write(fd, b"\n")


def write_run_info(run_dir: Path, info: RunInfo) -> None:
    """Write `run.json` atomically (temp file, fsync, rename): readers never see half of it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    data = strict_dump(info)
    data = {k: v for k, v in data.items() if v is not None}
    tmp = run_dir / f".{RUN_FILE}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        # `abortReason` and `invalidReason` quote error text: it passes the one redaction.
        handle.write(redact(json.dumps(data, indent=2, ensure_ascii=False)) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, run_dir / RUN_FILE)


def update_run_info(run_dir: Path, **changes: Any) -> RunInfo:
    """Read `run.json`, apply changes (contract names or field names), write it back atomically."""
    with _run_lock(run_dir):
        info = read_run_info(run_dir)
        data = info.model_dump(by_alias=True)
        data.update(changes)
        updated = RunInfo.model_validate(data)
        write_run_info(run_dir, updated)
        return updated


@contextlib.contextmanager
def _run_lock(run_dir: Path) -> Iterator[None]:
    fd = os.open(run_dir / ".lock", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# --- labels ----------------------------------------------------------------------------

_LABEL = re.compile(r"^(?P<stem>.+)-(?P<nn>\d+)$")


def next_label(runs_dir: Path, set_name: str, phase: str) -> str:
    """`<set>-<phase>-<nn>` with nn the smallest unused number among sibling runs.

    Both directory names and the `label` inside each sibling's `run.json` count as used,
    since `--eval-label` and renamed directories can make the two differ.
    """
    stem = f"{set_name}-{phase}"
    used: set[int] = set()
    if runs_dir.is_dir():
        for child in runs_dir.iterdir():
            names = [child.name]
            label = _label_of(child)
            if label:
                names.append(label)
            for name in names:
                match = _LABEL.match(name)
                if match and match["stem"] == stem:
                    used.add(int(match["nn"]))
    nn = 1
    while nn in used:
        nn += 1
    return f"{stem}-{nn:02d}"


def _label_of(run_dir: Path) -> str | None:
    try:
        data = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    label = data.get("label") if isinstance(data, dict) else None
    return label if isinstance(label, str) else None


# --- reading and validation ------------------------------------------------------------


@dataclass
class Finding:
    """One validation finding, with where it was found."""

    level: Literal["error", "warning"]
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.where}: {self.message}"


@dataclass
class RunLedger:
    """A run directory as read: its info, its events in order, and what was wrong with them."""

    run_dir: Path
    info: RunInfo | None
    events: list[Any] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        """Findings that break the run's identity."""
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        """Findings that only weaken comparisons."""
        return [f for f in self.findings if f.level == "warning"]

    def of_kind(self, kind: str) -> list[Any]:
        """Events of one kind, in file order."""
        return [e for e in self.events if e.kind == kind]

    def scores(self) -> dict[tuple[str, int | None], ScoreEvent]:
        """The score that counts per attempt: its one score, or of its judge samples the one
        `judgesamples.counted` decides (the first, should a broken ledger carry two)."""
        from pytest_evalloop.judgesamples import counted

        out: dict[tuple[str, int | None], ScoreEvent] = {}
        for key, events in self.score_groups().items():
            sampled = len(events) > 1 and events[0].judge_sample is not None
            out[key] = counted(events) if sampled else events[0]
        return out

    def score_groups(self) -> dict[tuple[str, int | None], list[ScoreEvent]]:
        """Every score event per attempt, in file order (judge samples: one per sample)."""
        out: dict[tuple[str, int | None], list[ScoreEvent]] = {}
        # (qid, sample) inline rather than attempt_key: both are fields of every score and
        # attempt (models declare them, a LightEvent answers None), and this runs per event.
        for event in self.of_kind("score"):
            out.setdefault((event.qid, event.sample), []).append(event)
        return out

    def attempts(self) -> dict[tuple[str, int | None], AttemptEvent]:
        """The attempt per `(qid, sample)` (the last, so a resumed run's retry wins)."""
        return {(e.qid, e.sample): e for e in self.of_kind("attempt")}


def read_run_info(run_dir: Path) -> RunInfo:
    """Parse `run.json` (tolerant: unknown fields are kept)."""
    data = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    return RunInfo.model_validate(data)


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


def read_run(
    run_dir: Path,
    *,
    kinds: frozenset[str] | None = None,
    validate: bool = True,
    fields: frozenset[str] | None = None,
) -> RunLedger:
    """Read a run directory, recording every problem as a finding instead of raising.

    `kinds` keeps only those event kinds (a comparison needs attempts and scores, not the
    tool calls that make up most of a ledger); lines of other kinds are not validated.
    `validate=False` (comparisons of large runs) reads well-formed lines of ours as
    :class:`LightEvent` without building models; `evalloop validate` always validates.
    `fields` (only with `validate=False`) reads just those keys of each such line, plus
    `kind`, `qid`, `sample` and `judge_sample` (which score counts, and the score check, need
    it), as :class:`PartialEvent`s.
    """
    if fields is not None:
        fields = fields | {"kind", "qid", "sample", "judge_sample"}
    ledger = RunLedger(run_dir=run_dir, info=None)
    _read_info_into(ledger)
    # The read cache serves only light reads of chosen kinds and fields (see below).
    cached = None if validate or kinds is None or fields is None else (kinds, fields)
    with gc_paused():
        if cached is None or not _read_cache_into(ledger, *cached):
            stamp = _events_stamp(run_dir)
            findings_before = len(ledger.findings)
            _read_events_into(ledger, kinds, validate, fields)
            clean = len(ledger.findings) == findings_before
            if cached is not None and clean and stamp and stamp == _events_stamp(run_dir):
                _write_cache(ledger, stamp, *cached)
    _check_scores(ledger)
    if validate:
        _check_one_judge(ledger)
    return ledger


# --- the read cache ----------------------------------------------------------------------
#
# Comparing two 10,000-case runs spends most of its time parsing ~50 MB of event lines for a
# few fields of each attempt and score. A light read (`validate=False`, `kinds` and `fields`
# given) of a clean ledger therefore leaves those fields in `events.cache.json` beside it,
# stamped with the ledger's inode, size and mtime; a later light read asking for no more
# kinds or fields, of the ledger as stamped, loads that instead. An append (a resumed run,
# another worker) changes the stamp, so a stale cache is never used; a ledger with findings
# (torn tail, unusual lines) is never cached, so its findings are reported on every read.
# `evalloop validate` and every validated read ignore the cache.


def _events_stamp(run_dir: Path) -> tuple[int, int, int] | None:
    try:
        stat = (run_dir / EVENTS_FILE).stat()
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _read_cache_into(ledger: RunLedger, kinds: frozenset[str], fields: frozenset[str]) -> bool:
    """Load the cached light read when it is current and holds what was asked; else False."""
    stamp = _events_stamp(ledger.run_dir)
    try:
        cached = from_json((ledger.run_dir / READ_CACHE_FILE).read_bytes())
    except (OSError, ValueError):
        return False
    if not (
        isinstance(cached, dict)
        and cached.get("format") == READ_CACHE_FORMAT
        and stamp is not None
        and cached.get("stamp") == list(stamp)
        and kinds <= set(cached.get("kinds") or ())
        and fields <= set(cached.get("fields") or ())
        and isinstance(cached.get("events"), list)
    ):
        return False
    partial = _partial_class(frozenset(cached["fields"]))
    events = ledger.events
    make = object.__new__
    for data in cached["events"]:
        if isinstance(data, dict) and data.get("kind") in kinds:
            # The parsed dict becomes the event's __dict__ as it is: no copy per event.
            event = make(partial)
            event.__dict__ = data
            events.append(event)
    return True


def _write_cache(
    ledger: RunLedger,
    stamp: tuple[int, int, int],
    kinds: frozenset[str],
    fields: frozenset[str],
) -> None:
    # Only a read where every event came through the light path is cached: an event parsed
    # by the tolerant path (a model) is one this cache could not give back the same way.
    if not all(isinstance(e, PartialEvent) for e in ledger.events):
        return
    data = {
        "format": READ_CACHE_FORMAT,
        "stamp": list(stamp),
        "kinds": sorted(kinds),
        "fields": sorted(fields),
        "events": [e.__dict__ for e in ledger.events],
    }
    path = ledger.run_dir / READ_CACHE_FILE
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_bytes(to_json(data))
        temp.replace(path)  # readers see the old cache or the new one, never half of one
    except OSError:
        # A run dir we may not write (a CI artifact, a read-only mount): reads stay correct.
        with contextlib.suppress(OSError):
            temp.unlink()


def _read_info_into(ledger: RunLedger) -> None:
    path = ledger.run_dir / RUN_FILE
    if not path.is_file():
        ledger.findings.append(Finding("error", str(path), "missing run.json"))
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        ledger.findings.append(Finding("error", str(path), f"invalid JSON: {exc}"))
        return
    try:
        ledger.info = RunInfo.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            what = "missing required field" if err["type"] == "missing" else err["msg"]
            ledger.findings.append(Finding("error", str(path), f"{what}: {loc!r}"))
        return
    for pin in PINS:
        if data.get(pin) in (None, ""):
            ledger.findings.append(Finding("warning", str(path), f"missing pin {pin!r}"))
    if ledger.info.model_extra:
        extra = sorted(ledger.info.model_extra)
        ledger.findings.append(Finding("warning", str(path), f"unknown fields {extra}"))


# Our writer puts `kind` first; such a line's kind is read without parsing the line.
_KIND_PREFIX = re.compile(rb'^\{"kind": "([a-z_]+)"')
_MODELS: dict[str, type[_Event]] = {
    "attempt": AttemptEvent,
    "tool_call": ToolCallEvent,
    "score": ScoreEvent,
    "retrieval_score": RetrievalScoreEvent,
    "issue": IssueEvent,
    "issue_status": IssueStatusEvent,
    "candidate": CandidateEvent,
    "acceptance_check": AcceptanceCheckEvent,
    "checkpoint": CheckpointEvent,
}


class LightEvent:
    """An event line read without validation: its keys as attributes (None when absent)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.__dict__.update(data)

    def __getattr__(self, name: str) -> Any:
        # Only reached for keys the line does not have.
        return None


class PartialEvent(LightEvent):
    """A LightEvent read for some keys only (`read_run(fields=...)`): asking for another key
    is an error, never a silent None."""

    fields: frozenset[str] = frozenset()

    def __getattr__(self, name: str) -> Any:
        if name in self.fields:
            return None
        raise AttributeError(
            f"event key {name!r} was not read: this ledger was read with fields="
            f"{sorted(self.fields)}; add it to the fields passed to read_run"
        )


LineReader = Callable[[bytes], LightEvent | None]


@functools.cache
def _partial_class(fields: frozenset[str]) -> type[PartialEvent]:
    """The PartialEvent class answering for exactly these keys (one per field set)."""
    return type("PartialEvent", (PartialEvent,), {"fields": fields})


@functools.cache
def _light_reader(fields: frozenset[str] | None) -> LineReader:
    """Parse one line of ours as a LightEvent (None when it is not valid JSON)."""
    if fields is None:

        def read_all(line: bytes) -> LightEvent | None:
            try:
                return LightEvent(from_json(line))
            except ValueError:
                return None

        return read_all
    # A TypedDict of just these keys: pydantic-core walks the line but builds only their values
    # (an attempt line is mostly answer text and paths a comparison never reads), ~2.5x faster.
    # Cached per field set: callers pass module constants, so this holds one or two readers.
    shape: Any = TypedDict(  # type: ignore[misc]
        "EventFields", dict.fromkeys(sorted(fields), Any), total=False
    )
    adapter: TypeAdapter[Any] = TypeAdapter(shape)
    partial = _partial_class(fields)

    def read_some(line: bytes) -> LightEvent | None:
        try:
            return partial(adapter.validate_json(line))
        except ValueError:
            return None

    return read_some


def _fast_parse(line: bytes, kinds: frozenset[str] | None) -> tuple[bool, Any]:
    """(handled, event): validate a well-formed line of ours straight from its bytes.

    Anything unusual (another writer's key order, legacy shapes, errors, unknown fields) is
    left to the tolerant path, which reports it.
    """
    match = _KIND_PREFIX.match(line)
    if match is None:
        return False, None
    kind = match.group(1).decode()
    if kinds is not None and kind not in kinds and kind in _MODELS:
        return True, None
    model = _MODELS.get(kind)
    if model is None:
        return False, None
    try:
        event = model.model_validate_json(line)
    except ValidationError:
        return False, None
    return (True, event) if not event.model_extra else (False, None)


def _prefixes(kinds: Iterable[str]) -> tuple[bytes, ...]:
    """How our writer's lines of these kinds begin (the closing quote included, so that
    `score` never stands for `score_x`)."""
    return tuple(b'{"kind": "' + kind.encode() + b'"' for kind in kinds)


def _read_events_into(
    ledger: RunLedger,
    kinds: frozenset[str] | None = None,
    validate: bool = True,
    fields: frozenset[str] | None = None,
) -> None:
    path = ledger.run_dir / EVENTS_FILE
    if not path.is_file():
        ledger.findings.append(Finding("warning", str(path), "no events.jsonl (no event yet)"))
        return
    lines = path.read_bytes().split(b"\n")
    torn_tail = bool(lines and lines[-1])
    last = len(lines)
    # Our lines of a known kind not asked for (most of a ledger: tool calls) are dropped in one
    # pass, unparsed; the last line is always kept, so that a torn tail is still reported.
    skip = () if kinds is None else _prefixes(k for k in _MODELS if k not in kinds)
    # Without validation, our lines of the kinds asked for are read straight as LightEvents.
    light = () if validate else _prefixes(k for k in _MODELS if kinds is None or k in kinds)
    read_light = _light_reader(fields)
    # A skipped line must still look whole (ours end with "}"): one torn by a kill and sealed
    # by the next append is read below, so even a light read reports it.
    kept = [
        (i, line)
        for i, line in enumerate(lines, start=1)
        if line and (i == last or not (line.startswith(skip) and line.endswith(b"}")))
    ]
    append = ledger.events.append
    for index, line in kept:
        whole = index != last or not torn_tail
        if light and whole and line.startswith(light):
            event = read_light(line)
            if event is not None:
                append(event)
                continue
            # Not JSON after all: the tolerant path below names the error.
        elif not line.strip():
            continue
        elif whole and line.endswith(b"}"):
            handled, event = _fast_parse(line, kinds)
            if handled:
                if event is not None:
                    append(event)
                continue
        _read_tolerantly(ledger, f"{path}:{index}", line, index == last, torn_tail, kinds)


def _read_tolerantly(
    ledger: RunLedger,
    where: str,
    line: bytes,
    is_last: bool,
    torn_tail: bool,
    kinds: frozenset[str] | None,
) -> None:
    try:
        data = json.loads(line)
    except ValueError:
        what = "torn last line (no newline; the run was killed mid-write)"
        ledger.findings.append(Finding("error", where, what if is_last else "invalid JSON"))
        return
    if is_last and torn_tail:
        msg = "last line has no newline (the run was killed mid-write)"
        ledger.findings.append(Finding("error", where, msg))
    if kinds is not None and isinstance(data, dict) and data.get("kind") not in kinds:
        if LEGACY_KINDS.get(data.get("kind", "")) not in kinds:
            # Not asked for, yet still checked (lines not of our writer are rare): a light
            # read finds every error `evalloop validate` finds, so closing can trust it.
            _parse_into(RunLedger(ledger.run_dir, None, findings=ledger.findings), where, data)
            return
    _parse_into(ledger, where, data)


def _parse_into(ledger: RunLedger, where: str, data: Any) -> None:
    if not isinstance(data, dict):
        ledger.findings.append(Finding("error", where, "an event must be a JSON object"))
        return
    kind = data.get("kind")
    if kind not in EVENT_KINDS and kind not in LEGACY_KINDS:
        ledger.findings.append(Finding("error", where, f"unknown event kind {kind!r}"))
        return
    try:
        event, warnings = parse_event(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"][1:]) or "(event)"
            what = "missing required field" if err["type"] == "missing" else err["msg"]
            ledger.findings.append(Finding("error", where, f"{kind}: {what}: {loc!r}"))
        return
    ledger.findings.extend(Finding("warning", where, f"{kind}: {w}") for w in warnings)
    ledger.events.append(event)


def _check_scores(ledger: RunLedger) -> None:
    # One score per attempt, or one per judge sample, each judge sample once.
    seen: set[tuple[str, int | None, int | None]] = set()
    plain: set[tuple[str, int | None]] = set()
    sampled: set[tuple[str, int | None]] = set()
    for event in ledger.of_kind("score"):
        key = attempt_key(event)
        judge_sample = event.judge_sample
        (plain if judge_sample is None else sampled).add(key)
        if (*key, judge_sample) in seen or (key in plain and key in sampled):
            what = "judge sample" if judge_sample is not None else "attempt"
            msg = f"two score events for one {what} (qid {key[0]!r}, sample {key[1]!r}"
            msg += f", judge_sample {judge_sample})" if judge_sample is not None else ")"
            ledger.findings.append(Finding("error", str(ledger.run_dir / EVENTS_FILE), msg))
        seen.add((*key, judge_sample))


JUDGE_PINS = (
    ("judge_model", "judgeModel"),
    ("judge_version", "judgeVersion"),
    ("rubric_sha", "rubricSha"),
)


def _check_one_judge(ledger: RunLedger) -> None:
    # A run is one measurement: scores from two judges (a resume under another judge) are two
    # measurements averaged into one, whatever run.json says.
    scores = ledger.of_kind("score")
    for field_name, pin in JUDGE_PINS:
        seen = Counter(getattr(s, field_name, None) for s in scores)
        seen.pop(None, None)
        if len(seen) > 1:
            counts = ", ".join(f"{value} ({n})" for value, n in sorted(seen.items()))
            where = str(ledger.run_dir / EVENTS_FILE)
            ledger.findings.append(
                Finding(
                    "warning",
                    where,
                    f"score events carry {len(seen)} values of {pin}: {counts}; the run mixes "
                    "judges, so its aggregates are not one measurement (rejudge it whole)",
                )
            )


def json_schema() -> dict[str, Any]:
    """The JSON Schema of `run.json` and of an event line, for tools in other languages."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "pytest-evalloop ledger",
        "run.json": RunInfo.model_json_schema(by_alias=True),
        "event": _event_adapter().json_schema(by_alias=True),
    }
