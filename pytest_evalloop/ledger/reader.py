"""Reading a run directory back: `RunLedger`, validation findings, light reads.

`read_run` never raises on a broken run: every problem becomes a `Finding` naming where it was
found, which is what `evalloop validate` prints and what closing a run trusts. Comparisons of
large runs read only the kinds and keys they need (`LightEvent`, `PartialEvent`). Nothing is
read from a file derived from the ledger: a decision rests on the lines the seal covers.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import from_json
from typing_extensions import TypedDict

from pytest_evalloop.ledger import files
from pytest_evalloop.ledger.contract import (
    EVENT_KINDS,
    EVENTS_FILE,
    LEGACY_KINDS,
    PINS,
    RUN_FILE,
    AcceptanceCheckEvent,
    AttemptEvent,
    CandidateEvent,
    CheckpointEvent,
    ClusteringEvent,
    DiagnosisEvent,
    IssueEvent,
    IssueStatusEvent,
    RetrievalScoreEvent,
    RunInfo,
    ScoreEvent,
    ToolCallEvent,
    attempt_key,
    parse_event,
)
from pytest_evalloop.ledger.gcpolicy import gc_paused
from pytest_evalloop.ledger.vocabulary import GRANDFATHERED_VERSIONS, owner_problem

COMPARED_KINDS = frozenset({"attempt", "score", "review"})
"""A comparison reads only these event kinds (tool calls are most of a ledger)."""
COMPARED_FIELDS = frozenset(
    {
        "verdict",
        "reason",
        "why",
        "contaminated",
        "contamination_reasons",
        "gold_status",
        "gold_note",
        "final_query",
        "judge_sample",
        "reviewer",
        "golden_wrong",
        "judge_verdict",
        "at",
        "wall_seconds",
        "answer_id",
        "error_cause",
    }
)
"""... and only these keys of them (with kind, qid and sample): what `comparison.run_view` and
`aggregates.tally` look at. Reading another key of such an event raises AttributeError."""


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
    seal_check: Any = None
    """`seal.verify`'s result, where the reader checked the seal (a comparison's read)."""

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
        from pytest_evalloop.judge.judgesamples import counted

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

    def reviews(self) -> dict[tuple[str, int | None], Any]:
        """The latest person's review per attempt (a later review supersedes an earlier one)."""
        return {(e.qid, e.sample): e for e in self.of_kind("review")}

    def issues(self) -> dict[str, IssueEvent]:
        """The issue per `issue_id` (the last declaration, should a ledger carry two)."""
        return {e.issue_id: e for e in self.of_kind("issue")}

    def issue_statuses(self) -> dict[str, IssueStatusEvent]:
        """The latest status event per `issue_id`: readers take the latest, never a column."""
        return {e.issue_id: e for e in self.of_kind("issue_status")}

    def attempts(self) -> dict[tuple[str, int | None], AttemptEvent]:
        """The attempt per `(qid, sample)` (the last, so a resumed run's retry wins)."""
        return {(e.qid, e.sample): e for e in self.of_kind("attempt")}


def read_run_info(run_dir: Path) -> RunInfo:
    """Parse `run.json` (tolerant: unknown fields are kept). One that is not a regular file
    raises `files.LedgerFileError` (an OSError and a ValueError), never waits on a pipe."""
    data = json.loads(files.read_text(run_dir / RUN_FILE))
    return RunInfo.model_validate(data)


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
    refused = files.run_refusals(run_dir)
    if refused:
        # Refused whole, up front: a run one of whose files is a pipe, a directory or a link
        # is no run to read (a pipe would hang the read), and reading the rest would show a
        # run without its events, or without its seal, as if that were what it held.
        ledger.findings += [
            Finding("error", str(path), f"{path.name} is {what}") for path, what in refused
        ]
        return ledger
    _read_info_into(ledger)
    # Always from the ledger itself: a derived cache beside it is a file anyone can rewrite,
    # and a decision read from it would rest on what no seal covers.
    with gc_paused():
        _read_events_into(ledger, kinds, validate, fields)
    _check_scores(ledger)
    if validate:
        check_seal(ledger)
        _check_one_judge(ledger)
        _check_issue_statuses(ledger)
        _check_grandfathered_owners(ledger)
        _check_reviews(ledger)
    return ledger


def _read_info_into(ledger: RunLedger) -> None:
    path = ledger.run_dir / RUN_FILE
    if not path.is_file():
        ledger.findings.append(Finding("error", str(path), "missing run.json"))
        return
    try:
        data = json.loads(files.read_text(path))
    except files.LedgerFileError as exc:  # swapped since `run_refusals` looked
        ledger.findings.append(Finding("error", str(path), str(exc)))
        return
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
    from pytest_evalloop.sets.names import name_problem

    for key in ("runId", "label", "phase"):
        value = data.get(key)
        if isinstance(value, str) and name_problem(key, value):
            # A run named outside the pattern was written around the fence (or by hand).
            ledger.findings.append(Finding("error", str(path), name_problem(key, value) or ""))
    for pin in PINS:
        if data.get(pin) in (None, ""):
            ledger.findings.append(Finding("warning", str(path), f"missing pin {pin!r}"))
    if ledger.info.model_extra:
        extra = sorted(ledger.info.model_extra)
        ledger.findings.append(Finding("warning", str(path), f"unknown fields {extra}"))


# Our writer puts `kind` first; such a line's kind is read without parsing the line.
_KIND_PREFIX = re.compile(rb'^\{"kind": "([a-z_]+)"')
_MODELS: dict[str, type[BaseModel]] = {
    "attempt": AttemptEvent,
    "tool_call": ToolCallEvent,
    "score": ScoreEvent,
    "retrieval_score": RetrievalScoreEvent,
    "issue": IssueEvent,
    "issue_status": IssueStatusEvent,
    "diagnosis": DiagnosisEvent,
    "clustering": ClusteringEvent,
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
    # Our lines of a known kind not asked for (most of a ledger: tool calls) are dropped in one
    # pass, unparsed; a torn last line is always kept, so that it is still reported.
    skip = () if kinds is None else _prefixes(k for k in _MODELS if k not in kinds)
    # Without validation, our lines of the kinds asked for are read straight as LightEvents.
    light = () if validate else _prefixes(k for k in _MODELS if kinds is None or k in kinds)
    read_light = _light_reader(fields)
    append = ledger.events.append
    # Line by line, never the whole file at once: a 4,000-case ledger is 20 MB, and its bytes
    # and their split lines were 40 MB more at the peak of a run's close.
    try:
        handle = files.open_binary(path)
    except files.LedgerFileError as exc:  # swapped since `run_refusals` looked
        ledger.findings.append(Finding("error", str(path), str(exc)))
        return
    with handle:
        for index, raw in enumerate(handle, start=1):
            # Only the last line can lack its newline: a torn tail, left by a kill mid-write.
            whole = raw.endswith(b"\n")
            line = raw[:-1] if whole else raw
            if not line:
                continue
            # A skipped line must still look whole (ours end with "}"): one torn by a kill and
            # sealed by the next append is read below, so even a light read reports it.
            if whole and line.startswith(skip) and line.endswith(b"}"):
                continue
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
            _read_tolerantly(ledger, f"{path}:{index}", line, not whole, not whole, kinds)


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
            got = err.get("input")
            # The value itself, when it is a word: "Input should be ..." alone hides what was there.
            shown = (
                f" (got {got!r})" if isinstance(got, str | int | float) and loc != "(event)" else ""
            )
            ledger.findings.append(Finding("error", where, f"{kind}: {what}: {loc!r}{shown}"))
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


CLOSED = frozenset({"complete", "interrupted", "aborted", "invalid"})
"""Statuses a run is sealed in when it closes."""


def check_seal(ledger: RunLedger) -> None:
    """Every line is as it was written (the chain) and a closed run as it was sealed
    (`ledger.seal`): a change is an error; a closed run without a seal, a warning."""
    from pytest_evalloop.ledger import seal

    check = seal.verify(ledger.run_dir)
    where = str(ledger.run_dir)
    if not check.sealed and check.broken is None:
        ledger.findings += [Finding("warning", where, message) for message in check.warnings]
        if ledger.info is not None and ledger.info.status in CLOSED:
            ledger.findings.append(
                Finding(
                    "warning",
                    where,
                    "not sealed: closed by a harness before seals, or its seal was removed; "
                    "what it held when it closed cannot be checked, and no gate decides on it",
                )
            )
        return
    ledger.findings += [Finding("error", where, message) for message in check.errors]
    ledger.findings += [Finding("warning", where, message) for message in check.warnings]


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


def _check_issue_statuses(ledger: RunLedger) -> None:
    # A status names an issue some `issue` line declares; otherwise it is a status of nothing.
    declared = {e.issue_id for e in ledger.of_kind("issue")}
    for event in ledger.of_kind("issue_status"):
        if event.issue_id not in declared:
            ledger.findings.append(
                Finding(
                    "error",
                    str(ledger.run_dir / EVENTS_FILE),
                    f"issue_status {event.status!r} for issue {event.issue_id!r}, which no "
                    "issue event declares",
                )
            )


def _check_grandfathered_owners(ledger: RunLedger) -> None:
    # Diagnose v1 wrote owners the code table does not give; its lines keep validating.

    for event in [*ledger.of_kind("issue"), *ledger.of_kind("diagnosis")]:
        if event.diagnose_version not in GRANDFATHERED_VERSIONS:
            continue
        problem = owner_problem(event.component or "", event.owner or "", event.primary_code or "")
        if problem:
            what = f"issue {event.issue_id!r}" if event.kind == "issue" else f"{event.qid!r}"
            ledger.findings.append(
                Finding(
                    "warning",
                    str(ledger.run_dir / EVENTS_FILE),
                    f"{event.kind} of {what}, written by diagnose v{event.diagnose_version}: "
                    f"{problem}; improve refuses it (re-run evalloop diagnose)",
                )
            )


def _check_reviews(ledger: RunLedger) -> None:
    # A review settles a verdict the judge gave: one of no scored attempt settles nothing.
    scored = ledger.scores()
    for event in ledger.of_kind("review"):
        score = scored.get((event.qid, event.sample))
        problem = None
        if score is None:
            problem = "which no score event scored"
        elif score.contaminated is True:
            problem = "whose attempt is contaminated (a review of it is refused)"
        if problem:
            ledger.findings.append(
                Finding(
                    "error",
                    str(ledger.run_dir / EVENTS_FILE),
                    f"review by {event.reviewer!r} of qid {event.qid!r} sample "
                    f"{event.sample!r}, {problem}",
                )
            )
