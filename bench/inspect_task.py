"""The benchmark's workload as an inspect-ai task, so its figures stand beside ours.

    inspect eval bench/inspect_task.py -T cases_file=<set>/cases.jsonl \\
        --model anthropic/<model> --max-connections 64 --max-samples 64

Same samples (the synthetic set's questions), the same model calls per sample as our harness
makes against the fake endpoint: the fake scripts two `get_context` and two `execute_query`
tool calls and a final text (five answerer calls), then `model_graded_qa` grades (one call).
The tools return a fixed text at once: inspect's figures include no target work, ours include
the embedded MCP server and DuckDB, so the comparison flatters inspect, never us.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import model_graded_qa
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import Tool, tool


@tool
def get_context() -> Tool:
    """The context tool, as the answerer sees it (a fixed reply)."""

    async def execute(query: str) -> str:
        """Search the semantic model for entities relevant to a question.

        Args:
            query: What to look for.
        """
        return f"entities for {query!r}: measure:orders:total_sales, dimension:orders:status"

    return execute


@tool
def execute_query() -> Tool:
    """The query tool, as the answerer sees it (a fixed reply)."""

    async def execute(sql: str) -> str:
        """Run a read-only SQL query over the model's relations and return the rows.

        Args:
            sql: The query to run.
        """
        return json.dumps({"rows": [{"value": 1}], "query": sql})

    return execute


def _samples(cases_file: Path) -> list[Sample]:
    samples = []
    for line in cases_file.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row: dict[str, Any] = json.loads(line)
        golden = row.get("golden") or {}
        target = json.dumps(golden.get("value")) if "value" in golden else "unanswerable"
        samples.append(Sample(id=row["qid"], input=row["question"], target=target))
    return samples


@task
def evalloop_bench(cases_file: str) -> Task:
    """One sample per case of `cases_file`: a tool-using solver and a model-graded scorer."""
    return Task(
        dataset=_samples(Path(cases_file)),
        solver=[use_tools([get_context(), execute_query()]), generate()],
        scorer=model_graded_qa(),
    )
