"""Bring your own answerer: override the `evalloop_answerer` fixture.

Copy this file as the `conftest.py` at (or above) your set and every case is answered by
`MeasureAnswerer` instead of the built-in Messages API agent. Everything after the answer is
unchanged: the plugin still re-executes the final query itself, checks the host-side tool log for
contamination, judges, scores retrieval and writes the ledger.

An answerer is any object with (see `pytest_evalloop/roles/contract.py`, the `Answerer` protocol):

- `backend: str` and `model: str`, recorded in `run.json` (`answerer`, `answererModel`);
- `async answer(question, session) -> AnswerRecord`, where `session` is the open target session
  (`list_tools()`, `call(tool, arguments)`, `role_of(tool)`, `query_of(tool, arguments)`,
  `context_results(outcome)`).

The answerer must put every tool use it made into `AnswerRecord.tool_log`: that log is how the
final query is chosen (declared > last successful query > last query) and how contamination is
checked. Raise `pytest_evalloop.failures.HarnessError` when your own endpoint is down: the item
becomes a pytest error, never a `no_match`.

`MeasureAnswerer` is a deterministic toy, not an LLM: it asks the context tool about the
question, takes the first measure it has a recipe for, runs one query and reports the value.
It speaks the embedded target's tools (`get_context(query)`, `execute_query(sql)`) and calls
no network. With it (and a judge that calls no endpoint either, see `../own_judge/`) a run is
fully offline; the plugin still wants `ANTHROPIC_API_KEY` or `ANTHROPIC_BASE_URL` set when a set
is named on the command line, so set `ANTHROPIC_BASE_URL=http://127.0.0.1:9` (nothing listens
there) to show that no call is made.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from pytest_evalloop.roles.contract import AnswerRecord, TargetSession, ToolOutcome, ToolUse

CONTEXT_TOOL = "get_context"
QUERY_TOOL = "execute_query"

# What this toy agent "knows": the SQL behind a few measures of the example model, by entity id.
# Averages and percentages are rounded to two places, as the example set's goldens are.
RECIPES: dict[str, str] = {
    "measure:users:user_count": "count(*)",
    "measure:users:average_age": "round(avg(age), 2)",
    "measure:products:product_count": "count(*)",
    "measure:products:catalog_retail_value": "round(sum(retail_price), 2)",
    "measure:orders:order_count": "count(*)",
    "measure:orders:avg_items_per_order": "round(avg(num_of_item), 2)",
    "measure:orders:avg_days_to_ship": "round(avg(days_to_ship), 2)",
    "measure:order_items:total_sales": "round(sum(sale_price), 2)",
    "measure:order_items:units_sold": "count(*) FILTER (WHERE status <> 'Cancelled')",
}


class MeasureAnswerer:
    """Answers with the first measure the context tool ranks that it has a recipe for."""

    backend = "measure-lookup"

    def __init__(self, model: str = "measure-lookup-1") -> None:
        self.model = model

    async def answer(self, question: str, session: TargetSession) -> AnswerRecord:
        """Ask the context tool, run one query, report the value (or decline)."""
        started = time.monotonic()
        log: list[ToolUse] = []
        found = await self._call(session, log, CONTEXT_TOOL, {"query": question})
        ranked = session.context_results(found)
        log[-1].context_results = [entity.model_dump() for entity in ranked]
        measure = next((e for e in ranked if e.id in RECIPES), None)
        if measure is None or measure.id is None:
            # No query means `submitted: false`: the judge is not asked, the case is unscored
            # (for an unanswerable case the refusal itself is judged).
            text = "The model does not seem to hold a measure for this, so I cannot answer."
            return self._record(text, log, started)
        sql = f"SELECT {RECIPES[measure.id]} AS {measure.name} FROM {measure.source}"
        rows = await self._call(session, log, QUERY_TOOL, {"sql": sql})
        text = f"From {measure.id}: {rows.text}\n\nFinal query:\n```sql\n{sql}\n```"
        return self._record(text, log, started, declared_final=sql)

    async def _call(
        self, session: TargetSession, log: list[ToolUse], tool: str, arguments: dict[str, Any]
    ) -> ToolOutcome:
        outcome = await session.call(tool, arguments)
        payload = outcome.payload if isinstance(outcome.payload, dict) else {}
        log.append(
            ToolUse(
                tool=tool,
                input=arguments,
                role=session.role_of(tool),
                ok=not outcome.is_error,
                error=outcome.error,
                trace_id=payload.get("traceId"),
                query=session.query_of(tool, arguments),
                targets=arguments.get("query") if tool == CONTEXT_TOOL else None,
            )
        )
        return outcome

    def _record(
        self, text: str, log: list[ToolUse], started: float, declared_final: str | None = None
    ) -> AnswerRecord:
        return AnswerRecord(
            answer_text=text,
            tool_log=log,
            declared_final=declared_final,
            reported_calls=len(log),
            model=self.model,
            num_turns=len(log) + 1,
            wall_seconds=time.monotonic() - started,
            # Nothing was billed; None (not 0.0) would mean "price unknown".
            cost_usd=0.0,
        )


@pytest.fixture(scope="session")
def evalloop_answerer() -> MeasureAnswerer:
    """Every case of every set under this conftest is answered by `MeasureAnswerer`."""
    return MeasureAnswerer()
