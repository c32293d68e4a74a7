"""The eval of one attempt: answer → re-execute → contamination → judge → retrieval → events.

Async from end to end, so many attempts can be in flight in one process. Everything an attempt
writes goes to the ledger in one locked append as soon as it ends: a crash later loses nothing.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from pytest_evalloop.answer.materials import definitions_for_call, materials_for
from pytest_evalloop.answer.reexecution import ran_by_answerer, reexecute, reexecution_state
from pytest_evalloop.failures import HarnessError
from pytest_evalloop.judge.judge import JudgeOutcome, golden_gate, rows_rule
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import files as ledger_files
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.measure import aggregates
from pytest_evalloop.model_api.pricing import Usage
from pytest_evalloop.model_api.redaction import environment_secrets, redact, redact_bytes
from pytest_evalloop.roles.contract import (
    Answerer,
    AnswerRecord,
    ContextResult,
    FinalCall,
    Judge,
    QueryOutcome,
    TargetSession,
    ToolUse,
)
from pytest_evalloop.sets import cases as sets

Status = aggregates.Outcome
"""An item's outcome word: `aggregates.outcome` decides it from the attempt's score."""
PREDICTION_ROWS_IN_REPORT = 5
HARNESS_ERROR_PREFIX = "harness error (not a verdict): "


@dataclass
class AttemptContext:
    """Everything the conductor knows about one attempt before it starts."""

    run_dir: Path
    set_dir: Path
    case: sets.Case
    sample: int | None
    phase: str
    model_definitions: str = ""
    """The definitions of the set's model, for the judge."""
    definitions_shared: bool = False  # the same for every case of the set (backends decides)
    set_config: sets.SetConfig | None = None
    """Lets the conductor read another model's definitions when the answerer queried one."""
    protected_paths: list[Path] = field(default_factory=list)
    model_paths: list[Path] = field(default_factory=list)
    judge_samples: int = 1
    """`--eval-judge-samples`: how many fresh judges score the same answer."""

    @cached_property
    def artifact_dir(self) -> Path:
        """`artifacts/<qid>/` (with `__sN` for samples): one directory per attempt (fenced
        once: its files and the judge's are all built on it)."""
        name = self.case.qid if self.sample is None else f"{self.case.qid}__s{self.sample}"
        root = self.run_dir / ledger.ARTIFACTS_DIR
        if os.path.islink(root):
            # The fence below resolves both sides, so through this link to wherever it points.
            raise ValueError(f"{root} is a symbolic link; refusing to write the run's files there")
        return ledger_writer.contained_dir(root, name)

    def relative(self, path: Path) -> str:
        """A path as recorded in events: relative to the run directory."""
        return str(path.relative_to(self.run_dir))


class ItemResult(BaseModel):
    """What one attempt came to, in a form that crosses from an xdist worker to the controller."""

    qid: str
    sample: int | None
    status: Status
    verdict: str | None = None
    reason: str = ""
    why: str | None = None
    report: str = ""
    run_dir: str = ""
    final_query: str | None = None
    contaminated: bool | str = False
    recall: float | None = None
    answerer_usage: dict[str, Any] = Field(default_factory=dict)
    judge_usage: dict[str, Any] = Field(default_factory=dict)
    answerer_cost: float | None = None
    judge_cost: float | None = None
    gold_status: str | None = None
    answered: bool = True
    """False for an item the conductor did not send to the answerer (see runtime.not_answered)."""
    gold_note: str | None = None
    carried: bool = False
    """Scored already in this run and not answered again (`runtime.resumed_result`)."""
    wall_seconds: float | None = None
    """The attempt's wall time in this session (`runtime`); None when none ran here for it."""


async def evaluate(
    ctx: AttemptContext, answerer: Answerer, judge: Judge, session: TargetSession
) -> ItemResult:
    """Run one attempt end to end and append its events; never raises for a harness error."""
    from pytest_evalloop.answer import hostlog

    writer = ledger_writer.LedgerWriter(ctx.run_dir)
    started = time.monotonic()
    # For an answerer without a host-side log of its own, the plugin's session logs each call.
    vouched = hostlog.vouches(answerer)
    logged = hostlog.HostLoggedSession(session)
    try:
        record = await answerer.answer(ctx.case.question, session if vouched else logged)
    except HarnessError as exc:
        # Its conversation outgrew the model's context: the answer's doing, not the harness's.
        cause: Literal["answer", "harness"] = "answer" if exc.refused == "too_long" else "harness"
        wall = time.monotonic() - started
        return _harness_error(ctx, writer, answerer, f"answerer: {exc}", wall, cause)
    # Whatever an answerer of the user's own reports, the host's log is what is checked.
    record, unverified = hostlog.checked_record(answerer, record, logged.log)
    chosen = _final_query(record)
    final = chosen.query
    try:
        prediction = await reexecute(session, chosen) if final else None
    except HarnessError as exc:
        return _harness_error(ctx, writer, answerer, f"re-execution: {exc}", record.wall_seconds)
    contamination = _contamination(ctx, record, unverified)
    files = _artifact_files(ctx, record, chosen, prediction)
    paths = {key: ctx.relative(path) for key, (path, _) in files.items()}
    attempt = _attempt_event(ctx, answerer, record, chosen, contamination, paths)
    # Decided once per attempt: the rule parses the query (DuckDB's parser), and the event,
    # the judge's materials and the rows rule all read the same decision.
    state = _state(chosen, prediction)
    attempt.reexecution = state[0]
    try:
        outcome = await _judge(ctx, judge, record, chosen, prediction, contamination, state)
    except HarnessError as exc:
        # The answer is kept (a rejudge can score it later); the missing score marks it
        # unscored, and `error` says why, as on every attempt that hit a harness error.
        return await _judge_error(ctx, writer, files, attempt, record, exc)
    outcomes = [outcome]
    try:
        # Judge samples: the same materials to fresh judges; a gated attempt (no judge call)
        # has nothing to sample.
        while outcome.attempts and len(outcomes) < ctx.judge_samples:
            outcomes.append(await judge.judge(_materials(ctx, record, chosen, prediction, state)))
    except HarnessError as exc:
        return await _judge_error(ctx, writer, files, attempt, record, exc)
    scores = []
    for i, each in enumerate(outcomes):
        name = "judge.json" if i == 0 else f"judge__j{i}.json"
        judge_path = ctx.artifact_dir / name
        files[name] = (judge_path, _encode(each.model_dump()))
        score = _score_event(ctx, judge, each, contamination, ctx.relative(judge_path))
        if len(outcomes) > 1:
            score = score.model_copy(update={"judge_sample": i})
        scores.append(score)
    retrieval = _retrieval_event(ctx, record)
    await _persist(writer, files, attempt, *_tool_events(ctx, record), *scores, retrieval)
    from pytest_evalloop.judge.judgesamples import counted

    score = counted(scores)
    outcome = outcomes[scores.index(score)] if score in scores else outcomes[0]
    return _result(ctx, record, final, prediction, score, retrieval, outcome, contamination)


async def _judge_error(
    ctx: AttemptContext,
    writer: ledger_writer.LedgerWriter,
    files: dict[str, tuple[Path, bytes]],
    attempt: ledger.AttemptEvent,
    record: AnswerRecord,
    exc: HarnessError,
) -> ItemResult:
    """An attempt whose judging failed: kept unscored, with `error` and its cause. A judge
    request refused for what it carried is the answer's fault: the prompt's other parts (the
    doctrine, the case, the model) are the set's, and judged the baseline's answer too."""
    attempt.error = f"judge: {exc}"
    attempt.error_cause = "answer" if exc.refused is not None else "harness"
    await _persist(writer, files, attempt, *_tool_events(ctx, record))
    return error_result(ctx, attempt.error, answerer_record=record)


def _state(chosen: FinalCall, prediction: QueryOutcome | None) -> tuple[Any, str | None]:
    return reexecution_state(chosen.query, prediction, ran=ran_by_answerer(chosen))


async def _persist(
    writer: ledger_writer.LedgerWriter, files: dict[str, tuple[Path, bytes]], *events: Any
) -> None:
    # Artifacts first: an event never names a file that is not there yet. They are written
    # here on the loop (into the page cache, no fsync: quick calls, and a thread's calls would
    # each wait for the interpreter lock); the ledger's append hands its fsyncs to a thread.
    _write_artifacts(list(files.values()))
    await writer.append_async(*events)


def _write_artifacts(files: list[tuple[Path, bytes]]) -> None:
    # A transcript holds whatever the endpoint and the tools said, credentials echoed in an
    # error included: every file passes the one redaction.
    secrets = environment_secrets()
    made: set[Path] = set()
    for path, data in files:
        if path.parent not in made:
            path.parent.mkdir(parents=True, exist_ok=True)
            made.add(path.parent)
        # As a ledger file is: never through a link, into a pipe (whose open would stop the
        # loop until a reader came) or a file another name shares (a hard link to a file
        # outside the run); emptied only once it is known to be the run's own.
        fd = ledger_files.open_regular(path, os.O_WRONLY | os.O_CREAT)
        try:
            os.ftruncate(fd, 0)
            ledger_files.write_whole(fd, redact_bytes(data, secrets))
        finally:
            os.close(fd)


def _final_query(record: AnswerRecord) -> FinalCall:
    from pytest_evalloop.answer.answerer import final_call

    return final_call(record.declared_final, record.tool_log, record.final_source)


def _contamination(ctx: AttemptContext, record: AnswerRecord, unverified: list[str]) -> Any:
    from pytest_evalloop.answer.hostlog import check_attempt

    return check_attempt(record, ctx.protected_paths, ctx.model_paths, unverified)


def _artifact_files(
    ctx: AttemptContext,
    record: AnswerRecord,
    chosen: FinalCall,
    prediction: QueryOutcome | None,
) -> dict[str, tuple[Path, bytes]]:
    """The attempt's artifact files (prediction, answer, transcript), encoded, by name."""
    directory = ctx.artifact_dir
    predicted = {
        "final_query": chosen.query,
        "final_query_source": chosen.source,
        "final_query_seq": chosen.seq,
        "re_executed": prediction is not None and prediction.not_run is None,
        **(prediction.model_dump() if prediction else {}),
    }
    transcript = {
        "stop": record.stop,
        "messages": record.transcript,
        "tool_log": [u.model_dump() for u in record.tool_log],
    }
    return {
        "prediction": (directory / "prediction.json", _encode(predicted)),
        # A lone surrogate in the answer (see `json_bytes`) is written as its \u escape.
        "answer": (directory / "answer.md", ledger_files.json_bytes(record.answer_text or "")),
        "transcript": (directory / "transcript.json", _encode(transcript)),
    }


def _encode(data: Any) -> bytes:
    # Compact on purpose: `indent` makes the json module fall back to its pure-Python encoder,
    # several times slower on a long transcript; `jq .` pretty-prints for a reader.
    return ledger_files.json_bytes(json.dumps(data, default=str, ensure_ascii=False))


def _attempt_event(
    ctx: AttemptContext,
    answerer: Answerer,
    record: AnswerRecord,
    chosen: FinalCall,
    contamination: Any,
    paths: dict[str, str],
) -> ledger.AttemptEvent:
    log = record.tool_log
    queries = [u for u in log if u.role == "query"]
    return ledger.AttemptEvent(
        qid=ctx.case.qid,
        sample=ctx.sample,
        phase=ctx.phase,
        question_sha=sets.question_sha(ctx.case.question),
        submitted=chosen.query is not None,
        answer_id=record.answer_id,
        final_query=chosen.query,
        final_query_source=chosen.source,
        final_query_seq=chosen.seq,
        servedRevision=record.served_revision,
        modelSha=record.served_model_sha,
        n_get_context=sum(1 for u in log if u.role == "context"),
        n_execute=len(queries),
        n_execute_errors=sum(1 for u in queries if not u.ok),
        host_tool_uses=len(log),
        reported_calls=record.reported_calls,
        reported_calls_status=_report_status(record),
        contaminated=contamination.contaminated,
        contamination_reasons=contamination.reasons,
        input_tokens=record.usage.input_tokens,
        output_tokens=record.usage.output_tokens,
        cache_read_tokens=record.usage.cache_read_tokens,
        cache_creation_tokens=record.usage.cache_creation_tokens,
        cost_usd=record.cost_usd,
        num_turns=record.num_turns,
        wall_seconds=round(record.wall_seconds, 3),
        answer_text=record.answer_text,
        transcriptPath=paths["transcript"],
        predictionPath=paths["prediction"],
        answerer=answerer.backend,
        model=record.model or answerer.model,
    )


def _report_status(record: AnswerRecord) -> ledger.ReportStatus:
    # An answerer that never says (one of your own) has not reported: rule 3 went unchecked.
    if record.reported_calls_status is not None:
        return record.reported_calls_status
    return "missing" if record.reported_calls is None else "reported"


def _tool_events(ctx: AttemptContext, record: AnswerRecord) -> list[ledger.ToolCallEvent]:
    return [_tool_event(ctx, seq, use) for seq, use in enumerate(record.tool_log, start=1)]


def _tool_event(ctx: AttemptContext, seq: int, use: ToolUse) -> ledger.ToolCallEvent:
    summary = None
    if use.role == "context":
        ids = [r.get("id") for r in use.context_results]
        ranks = [r.get("rank") for r in use.context_results]
        summary = {"entityIds": ids, "ranks": ranks, "resultCount": len(ids)}
    return ledger.ToolCallEvent(
        qid=ctx.case.qid,
        sample=ctx.sample,
        phase=ctx.phase,
        tool=use.tool,
        role=use.role,
        seq=seq,
        traceId=use.trace_id,
        targets=use.targets,
        rankedSummary=summary,
        query=use.query,
        error=use.error,
    )


async def _judge(
    ctx: AttemptContext,
    judge: Judge,
    record: AnswerRecord,
    chosen: FinalCall,
    prediction: QueryOutcome | None,
    contamination: Any,
    state: tuple[Any, str | None],
) -> Any:

    golden = ctx.case.golden
    refusal_case = golden is not None and golden.kind == "unanswerable"
    if contamination.contaminated is True:
        return _null_outcome(JudgeOutcome, judge, "contaminated")
    if contamination.contaminated == "unknown":
        from pytest_evalloop.answer.hostlog import UNVERIFIED

        return _null_outcome(JudgeOutcome, judge, UNVERIFIED)
    gate = golden_gate(golden.model_dump(by_alias=True) if golden else None)
    if gate is not None:
        return _null_outcome(JudgeOutcome, judge, gate)
    if chosen.query is None and not refusal_case:
        return _null_outcome(JudgeOutcome, judge, "not_submitted")
    outcome = await judge.judge(_materials(ctx, record, chosen, prediction, state))
    return rows_rule(outcome, state, refusal_case)


def _null_outcome(model: Any, judge: Judge, reason: str) -> Any:
    return model(
        verdict=None,
        reason=reason,
        confidence=None,
        why="",
        column_pairing=None,
        gold_status=None,
        gold_note=None,
        judge_version=judge.version,
        rubric_sha=judge.rubric_sha,
        attempts=0,
        raw_replies=[],
        input_tokens=0,
        output_tokens=0,
        cache_read_tokens=0,
        cache_creation_tokens=0,
        model=judge.model,
    )


def _materials(
    ctx: AttemptContext,
    record: AnswerRecord,
    chosen: FinalCall,
    prediction: QueryOutcome | None,
    state: tuple[Any, str | None],
) -> Any:
    golden = ctx.case.golden
    assert golden is not None
    try:
        value = sets.golden_value(ctx.set_dir, golden)
    except sets.GoldenArtifactError as exc:
        raise HarnessError(str(exc)) from exc
    return materials_for(
        ctx.case,
        value,
        final_query=chosen.query,
        prediction=prediction,
        answer_text=record.answer_text,
        definitions=definitions_for_call(
            ctx.set_dir, ctx.set_config, ctx.case, chosen.arguments, ctx.model_definitions
        ),
        definitions_shared=ctx.definitions_shared,
        ran=ran_by_answerer(chosen),
        decided=state,
    )


def _score_event(
    ctx: AttemptContext, judge: Judge, outcome: Any, contamination: Any, judge_path: str
) -> ledger.ScoreEvent:
    gold_status = outcome.gold_status
    if gold_status is None and ctx.case.golden is not None:
        gold_status = ctx.case.golden.status
    cost = _judge_cost(judge, outcome)
    return ledger.ScoreEvent(
        qid=ctx.case.qid,
        sample=ctx.sample,
        phase=ctx.phase,
        verdict=outcome.verdict,
        reason=outcome.reason,
        confidence=outcome.confidence,
        why=outcome.why or None,
        column_pairing=outcome.column_pairing,
        judge_version=outcome.judge_version,
        rubric_sha=outcome.rubric_sha,
        golden_revision=ctx.case.golden_revision,
        contaminated=contamination.contaminated,
        artifactPath=judge_path,
        gold_status=gold_status,
        gold_note=outcome.gold_note,
        judge_model=outcome.model or judge.model,
        judge_attempts=outcome.attempts,
        input_tokens=outcome.input_tokens if outcome.attempts else None,
        output_tokens=outcome.output_tokens if outcome.attempts else None,
        cache_read_tokens=outcome.cache_read_tokens if outcome.attempts else None,
        cache_creation_tokens=outcome.cache_creation_tokens if outcome.attempts else None,
        cost_usd=cost,
    )


def _judge_cost(judge: Judge, outcome: Any) -> float | None:
    if not outcome.attempts:
        return None
    cost = getattr(outcome, "cost_usd", None)
    if cost is not None:
        return float(cost)
    prices = getattr(judge, "prices", None)
    if prices is None:
        return None

    usage = Usage(
        input_tokens=outcome.input_tokens,
        output_tokens=outcome.output_tokens,
        cache_read_tokens=outcome.cache_read_tokens,
        cache_creation_tokens=outcome.cache_creation_tokens,
    )
    result: float | None = prices.cost(outcome.model or judge.model, usage)
    return result


def _retrieval_event(ctx: AttemptContext, record: AnswerRecord) -> ledger.RetrievalScoreEvent:
    from pytest_evalloop.answer.recall import score_retrieval

    returned = [
        ContextResult.model_validate(r)
        for use in record.tool_log
        if use.role == "context"
        for r in use.context_results
    ]
    expected = ctx.case.expected_entities
    score = score_retrieval(
        expected.model_dump(by_alias=True) if expected else None, returned, ctx.case.coverage
    )
    return ledger.RetrievalScoreEvent(
        qid=ctx.case.qid,
        sample=ctx.sample,
        phase=ctx.phase,
        required=score.required,
        delivered=score.delivered,
        recall=score.recall,
        strict_recall=score.strict_recall,
        returned=score.returned,
        precision=score.precision,
        noise=score.noise,
        coverage=ctx.case.coverage,
        entities=[e.model_dump() for e in score.entities],
    )


def _result(
    ctx: AttemptContext,
    record: AnswerRecord,
    final: str | None,
    prediction: QueryOutcome | None,
    score: ledger.ScoreEvent,
    retrieval: ledger.RetrievalScoreEvent,
    outcome: Any,
    contamination: Any,
) -> ItemResult:
    status = aggregates.outcome(score)
    return ItemResult(
        qid=ctx.case.qid,
        sample=ctx.sample,
        status=status,
        verdict=score.verdict,
        reason=score.reason,
        why=score.why,
        # A match is shown by its status word alone: its lines would be built, carried to the
        # controller and kept on its report to the session's end for nobody to read.
        report=""
        if status == "match"
        else failure_report(ctx, record, final, prediction, score, contamination.reasons),
        run_dir=str(ctx.run_dir),
        final_query=final,
        contaminated=score.contaminated,
        recall=retrieval.recall,
        answerer_usage=record.usage.model_dump(),
        judge_usage={
            "input_tokens": outcome.input_tokens,
            "output_tokens": outcome.output_tokens,
            "cache_read_tokens": outcome.cache_read_tokens,
            "cache_creation_tokens": outcome.cache_creation_tokens,
            "calls": outcome.attempts,
        },
        answerer_cost=record.cost_usd,
        judge_cost=score.cost_usd,
        gold_status=score.gold_status,
        gold_note=score.gold_note,
    )


def failure_report(
    ctx: AttemptContext,
    record: AnswerRecord,
    final: str | None,
    prediction: QueryOutcome | None,
    score: ledger.ScoreEvent,
    reasons: list[str],
) -> str:
    """A few lines a human reads instead of a traceback: question, golden, prediction, why."""
    golden = ctx.case.golden
    gold = "none" if golden is None else _golden_shown(ctx.set_dir, golden)
    lines = [
        f"question:   {ctx.case.question}",
        f"golden:     {gold} ({golden.kind if golden else 'missing'})",
        f"final query: {_short(final) if final else '(none submitted)'}",
        f"prediction: {_prediction_head(prediction)}",
        f"answer:     {_short(record.answer_text or '(no answer text)', 300)}",
        f"verdict:    {score.verdict} ({score.reason})"
        + (f", confidence {score.confidence}" if score.confidence is not None else ""),
    ]
    if score.why:
        lines.append(f"judge's why: {_short(score.why, 600)}")
    if score.contaminated is True:
        lines.append("contaminated: " + "; ".join(reasons))
    return "\n".join(lines)


def _golden_shown(set_dir: Path, golden: sets.Golden) -> str:
    try:
        value = sets.golden_value(set_dir, golden)
    except sets.GoldenArtifactError as exc:
        return f"(unreadable: {_short(str(exc))})"
    shown = _short(value)
    return f"{shown} (from {golden.path})" if golden.value is None and golden.path else shown


def _prediction_head(prediction: QueryOutcome | None) -> str:
    if prediction is None:
        return "(not re-executed)"
    if prediction.not_run:
        return f"not re-executed: {_short(prediction.not_run)}"
    if prediction.error:
        return f"re-execution failed: {_short(prediction.error)}"
    head = prediction.rows[:PREDICTION_ROWS_IN_REPORT]
    more = len(prediction.rows) - len(head)
    suffix = f" … (+{more} rows)" if more > 0 else ""
    return _short(json.dumps(head, default=str), 400) + suffix


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _harness_error(
    ctx: AttemptContext,
    writer: ledger_writer.LedgerWriter,
    answerer: Answerer,
    message: str,
    wall: float,
    cause: Literal["answer", "harness"] = "harness",
) -> ItemResult:
    attempt = ledger.AttemptEvent(
        qid=ctx.case.qid,
        sample=ctx.sample,
        phase=ctx.phase,
        question_sha=sets.question_sha(ctx.case.question),
        submitted=False,
        final_query=None,
        wall_seconds=round(wall, 3),
        answerer=answerer.backend,
        model=answerer.model,
        error=message,
        error_cause=cause,
    )
    writer.append(attempt)
    return error_result(ctx, message)


def record_harness_error(ctx: AttemptContext, answerer: Answerer, message: str) -> ItemResult:
    """Record an attempt the harness could not start (target dead) and return its result."""
    return _harness_error(ctx, ledger_writer.LedgerWriter(ctx.run_dir), answerer, message, 0.0)


def error_result(
    ctx: AttemptContext, message: str, answerer_record: AnswerRecord | None = None
) -> ItemResult:
    """The result of an attempt the harness could not complete (a pytest error, not a verdict)."""
    usage = answerer_record.usage.model_dump() if answerer_record else {}
    return ItemResult(
        qid=ctx.case.qid,
        sample=ctx.sample,
        status="harness_error",
        reason="harness_error",
        report=redact(HARNESS_ERROR_PREFIX + message),
        run_dir=str(ctx.run_dir),
        answerer_usage=usage,
        answerer_cost=answerer_record.cost_usd if answerer_record else None,
    )
