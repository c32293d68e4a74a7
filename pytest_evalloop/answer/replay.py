"""Judging stored answers again: `--eval-rejudge-from=<run>` (golden repair, rubric change).

The rejudge run is a new run that copies the source run's answers and re-executions and judges
them afresh. It never calls the answerer and never re-executes: the stored prediction is the one
the source run's judge saw. It plugs into the ordinary pipeline as a target and an answerer
whose "answers" are read from the source run's ledger and artifacts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_evalloop.failures import HarnessError
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.roles.contract import (
    AnswerRecord,
    FinalCall,
    FinalSource,
    QueryOutcome,
    ToolOutcome,
    ToolRole,
    ToolSpec,
    ToolUse,
)


class StoredRun:
    """The answers of a source run, by question seal, with their stored predictions."""

    def __init__(self, run_dir: Path) -> None:
        read = ledger_reader.read_run(run_dir)
        if read.info is None:
            raise HarnessError(f"{run_dir}: not a readable run (no valid run.json)")
        self.run_dir = run_dir
        self.info = read.info
        self._by_sha: dict[str, list[ledger.AttemptEvent]] = {}
        for attempt in sorted(read.attempts().values(), key=lambda a: (a.qid, a.sample or 0)):
            if attempt.error is None:
                self._by_sha.setdefault(attempt.question_sha, []).append(attempt)
        # How many answers the source holds per question, fixed before any is taken.
        self._held = {sha: len(attempts) for sha, attempts in self._by_sha.items()}
        self._predictions: dict[str, dict[str, Any]] = {}

    def covers(self, question_sha: str, sample: int | None) -> bool:
        """Whether the source run holds an answer for this question (and this sample)."""
        return self._held.get(question_sha, 0) >= (sample or 1)

    def take(self, question_sha: str) -> ledger.AttemptEvent:
        """The next stored attempt for a question (samples in order)."""
        stored = self._by_sha.get(question_sha)
        if not stored:
            raise HarnessError(
                f"no stored answer in {self.run_dir.name} for this case (question sha "
                f"{question_sha}); rejudge only the cases that run answered"
            )
        return stored.pop(0)

    def record(self, attempt: ledger.AttemptEvent) -> AnswerRecord:
        """The stored attempt as an answer record (tool log from its transcript)."""
        transcript = self._artifact(attempt.transcript_path)
        log = [ToolUse.model_validate(row) for row in transcript.get("tool_log", [])]
        prediction = self._artifact(attempt.prediction_path)
        if attempt.final_query is not None:
            self._predictions[attempt.final_query] = prediction
        return AnswerRecord(
            # The source's answer, judged again: its id, or for a source written before ids,
            # one that names where it was made.
            answer_id=attempt.answer_id
            or f"{self.info.run_id}:{attempt.qid}:{attempt.sample}:{attempt.at}",
            answer_text=attempt.answer_text,
            tool_log=log,
            declared_final=attempt.final_query,
            final_source=_stored_source(attempt.final_query_source),
            reported_calls=attempt.reported_calls,
            reported_calls_status=attempt.reported_calls_status,
            model=attempt.model,
            num_turns=attempt.num_turns or 0,
            stop="replayed",
            cost_usd=0.0,
            transcript=transcript.get("messages", []),
            served_revision=attempt.served_revision,
            served_model_sha=attempt.model_sha,
        )

    def prediction(self, query: str) -> QueryOutcome:
        """The stored re-execution of a final query (a rejudge never runs a query)."""
        stored = self._predictions.get(query)
        if stored is None or not stored.get("re_executed", True):
            return QueryOutcome(
                not_run=f"the source run {self.run_dir.name} stored no re-execution of this "
                "query, and a rejudge runs no queries"
            )
        keys = ("columns", "rows", "truncated", "error", "not_run", "meta", "call")
        return QueryOutcome.model_validate({k: stored[k] for k in keys if k in stored})

    def _artifact(self, relative: str | None) -> dict[str, Any]:
        if not relative:
            return {}
        path = self.run_dir / relative
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}


def _stored_source(value: str | None) -> FinalSource | None:
    # Runs written before the field existed carry none: the pipeline then decides afresh.
    if value in ("declared", "last_successful", "last_call", "none"):
        return value  # type: ignore[return-value]
    return None


class ReplaySession:
    """A target session that serves stored predictions instead of running queries."""

    def __init__(self, stored: StoredRun) -> None:
        self.stored = stored
        self.name = f"replay of {stored.info.target}"

    async def list_tools(self) -> list[ToolSpec]:
        return []

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        raise HarnessError("a rejudge run makes no tool calls")

    def role_of(self, tool: str) -> ToolRole | None:
        return None

    def query_of(self, tool: str, arguments: dict[str, Any]) -> str | None:
        return None

    def context_results(self, outcome: ToolOutcome) -> list[Any]:
        return []

    async def execute(self, query: str, call: FinalCall | None = None) -> QueryOutcome:
        return self.stored.prediction(query)


INHERITED_PINS = (
    "answerer",
    "answererModel",
    "answererVersion",
    "answererPromptSha",
    "targetProfile",
    "mcpUrl",
    "modelSha",
    "servedRevision",
)
"""What a rejudge run takes from its source: who answered, against what. The judge's pins are
its own (judging afresh is the point)."""


class ReplayTarget:
    """The target of a rejudge run: named after the source run's target, and carrying the
    source run's answerer and model pins, so the rejudge records who produced the answers."""

    def __init__(self, source_dir: Path) -> None:
        self.stored = StoredRun(source_dir)
        self.name = self.stored.info.target
        self.source_run_id = self.stored.info.run_id
        # Who made the answers this run judges again: the source's own session, or the one
        # its answers came from when the source was a rejudge too.
        self.answers_from = self.stored.info.answers_from or self.stored.info.session_id
        source = self.stored.info.model_dump(by_alias=True)
        self.pins = {name: source.get(name) for name in INHERITED_PINS}

    async def open(self) -> ReplaySession:
        return ReplaySession(self.stored)

    def not_covered(self, question_sha: str, sample: int | None) -> str | None:
        """Why an item cannot be rejudged from the source run, or None when it can.

        A rejudge judges what its source answered; a case the source never answered (it ran a
        subset, or that attempt errored) is not a harness failure, just not in the source.
        """
        if self.stored.covers(question_sha, sample):
            return None
        which = "this case" if sample is None else f"sample {sample} of this case"
        return (
            f"not in the source run {self.source_run_id}: it holds no answer to {which}; only "
            "what the source answered is rejudged (answer it in a new run)"
        )

    async def close(self) -> None:
        return None


class ReplayAnswerer:
    """Returns the stored answer for a question; calls no model. The run's answerer pins come
    from the source run (see `ReplayTarget.pins`), not from this object."""

    backend = "replay"
    host_side_tool_log = True
    """Its tool log is kept on the host side (answer/hostlog.py)."""

    def __init__(self, model: str) -> None:
        self.model = model

    async def answer(self, question: str, session: Any) -> AnswerRecord:
        from pytest_evalloop.sets.cases import question_sha

        if not isinstance(session, ReplaySession):
            raise HarnessError("the replay answerer needs the rejudge target (--eval-rejudge-from)")
        attempt = session.stored.take(question_sha(question))
        return session.stored.record(attempt)
