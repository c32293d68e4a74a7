"""The benchmark's workload: a synthetic copy of the example set and the fake endpoint's script.

A synthetic set of N cases cycles over the example set's answerable rows (those with a
`modelQuery`), each with a unique qid and question (" (#17)" appended) and its seal recomputed,
so every case is a real one: the scripted answerer runs the case's own modelQuery on the
embedded target and the conductor re-executes it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pytest_evalloop.sets.cases import CASES_FILE, SET_FILE, question_sha

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_SET = REPO / "evals" / "ecommerce"
SET_NAME = "bench"

# Five answerer turns (two context calls, two queries, the final text) and one judge call.
ANSWERER_SCRIPT: list[dict[str, Any]] = [
    {"tool": "get_context", "input": {"query": "{question}"}},
    {"tool": "get_context", "input": {"query": "measures and dimensions for: {question}"}},
    {"tool": "execute_query", "input": {"sql": "{modelQuery}"}},
    {"tool": "execute_query", "input": {"sql": "{modelQuery}"}},
    {"text": "The answer follows.\n\nFinal query:\n```sql\n{modelQuery}\n```"},
]
ANSWERER_CALLS = len(ANSWERER_SCRIPT)
JUDGE_CALLS = 1
CALLS_PER_CASE = ANSWERER_CALLS + JUDGE_CALLS
TOOL_CALLS_PER_CASE = sum(1 for step in ANSWERER_SCRIPT if "tool" in step)


def example_rows() -> list[dict[str, Any]]:
    """The example set's selected rows that carry a modelQuery (the answerable ones)."""
    rows = []
    for line in (EXAMPLE_SET / CASES_FILE).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("modelQuery") and row.get("state", "selected") == "selected":
            rows.append(row)
    if not rows:
        raise RuntimeError(f"{EXAMPLE_SET / CASES_FILE} has no row with a modelQuery to cycle over")
    return rows


def synthetic_rows(n: int) -> list[dict[str, Any]]:
    """N rows cycling over the example rows, each with a unique qid, question and seal."""
    base = example_rows()
    out = []
    for i in range(n):
        row = json.loads(json.dumps(base[i % len(base)]))
        row["qid"] = f"{row['qid']}_{i:05d}"
        row["question"] = f"{row['question']} (#{i})"
        row["questionSha"] = question_sha(row["question"])
        out.append(row)
    return out


def make_set(root: Path, n: int, name: str = SET_NAME) -> Path:
    """Write a synthetic set of `n` cases under `root/evals/<name>` and return its directory."""
    set_dir = root / "evals" / name
    set_dir.mkdir(parents=True, exist_ok=True)
    for file in (SET_FILE, "model.json"):
        shutil.copy(EXAMPLE_SET / file, set_dir / file)
    lines = [json.dumps(row) for row in synthetic_rows(n)]
    (set_dir / CASES_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return set_dir


SLOW_FACTOR = 10
"""How much slower the slow cases of an uneven workload answer (`script_spec`'s `slow_every`)."""


def script_spec(cases_file: Path, latency: float, slow_every: int = 0) -> dict[str, Any]:
    """The fake endpoint's ScriptSpec (as JSON data): every case answered by its modelQuery.

    With `slow_every` K, every K-th case's answerer calls take SLOW_FACTOR times `latency`
    (an uneven workload: a real endpoint's answers vary; the judge's calls stay as they are).
    """
    answerer: dict[str, Any] = {"default": ANSWERER_SCRIPT}
    if slow_every:
        count = sum(1 for line in cases_file.read_text("utf-8").splitlines() if line.strip())
        answerer["latency_by_substring"] = {
            f"(#{i})": latency * SLOW_FACTOR for i in range(0, count, slow_every)
        }
    return {
        "cases_file": str(cases_file),
        "answerer": answerer,
        "judge": {"default": {"verdict": "match", "confidence": 9, "why": "same value"}},
        "latency": latency,
    }
