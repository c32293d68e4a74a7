"""The failure report of an attempt scored already, rebuilt from what its run stored.

An item runs again without being answered again: a rerun by pytest-rerunfailures, xdist's
rerun of a case whose worker died, a resumed run (`--eval-resume`). Its verdict is read back
from the ledger (`ledger.resume`); this module gives it back the report the attempt first had
(question, golden, final query, prediction, answer, the judge's why), from the attempt's
artifacts and its score event, through the pipeline's own `failure_report`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from pytest_evalloop.answer.pipeline import AttemptContext, failure_report
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.roles.contract import AnswerRecord, QueryOutcome

_OUTCOME_KEYS = ("columns", "rows", "truncated", "error", "not_run", "meta", "call")
"""The re-execution's fields in `prediction.json` (beside the final query's own)."""


def stored_report(ctx: AttemptContext, score: Any) -> str | None:
    """The attempt's failure report as first written, from `artifacts/<qid>/` and its score
    event (a `LightEvent` or a model); None when those cannot be read back."""
    directory = ctx.artifact_dir
    try:
        predicted = json.loads((directory / "prediction.json").read_text(encoding="utf-8"))
        answer = (directory / "answer.md").read_text(encoding="utf-8")
        event = ledger.ScoreEvent.model_validate(_fields(score))
    except (OSError, ValueError, ValidationError):
        return None
    if not isinstance(predicted, dict):
        return None
    # Only a re-executed final query left its outcome's fields (`pipeline._artifact_files`).
    fields = {k: predicted[k] for k in _OUTCOME_KEYS if k in predicted}
    prediction = QueryOutcome.model_validate(fields) if fields else None
    reasons = _contamination_reasons(ctx) if event.contaminated is True else []
    final = predicted.get("final_query")
    return failure_report(ctx, AnswerRecord(answer_text=answer), final, prediction, event, reasons)


def _fields(score: Any) -> dict[str, Any]:
    # A LightEvent answers None for any attribute it lacks: tell it from a model by type.
    if isinstance(score, BaseModel):
        return score.model_dump(by_alias=True)
    return dict(vars(score))


def _contamination_reasons(ctx: AttemptContext) -> list[str]:
    """The reasons on the attempt's last `attempt` event (a contaminated attempt is rare, so its
    line is looked for in the ledger, not indexed)."""
    reasons: list[str] = []
    needle = f'"qid": {json.dumps(ctx.case.qid)}'.encode()
    try:
        with open(ctx.run_dir / ledger.EVENTS_FILE, "rb") as handle:
            for line in handle:
                if not line.startswith(b'{"kind": "attempt"') or needle not in line:
                    continue
                try:
                    data = from_json(line)
                except ValueError:
                    continue
                if data.get("qid") == ctx.case.qid and data.get("sample") == ctx.sample:
                    reasons = [str(r) for r in data.get("contamination_reasons") or []]
    except OSError:
        return []
    return reasons
