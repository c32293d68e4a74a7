"""Recall of the embedded context tool over a set's answerable cases.

    .venv/bin/python bench/retrieval_recall.py [evals/ecommerce] [--misses]

For every case whose golden is not `unanswerable` and which names required entities, the case's
question goes to `get_context` (the real tool, through an in-process MCP client, limit 10) and
each `expectedEntities.required` id gets the rank it came back at, or none. Prints recall@5 and
recall@10 over all required entities, and per case with every required entity found.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import anyio

DEFAULT_SET = Path(__file__).resolve().parent.parent / "evals" / "ecommerce"


def answerable_cases(set_dir: Path) -> list[dict[str, Any]]:
    """Rows of cases.jsonl that are answerable and name at least one required entity."""
    cases = []
    for line in (set_dir / "cases.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        golden = row.get("golden") or {}
        required = (row.get("expectedEntities") or {}).get("required") or []
        if golden.get("kind") != "unanswerable" and required and row.get("state") != "excluded":
            cases.append(row)
    return cases


async def ranks_for(set_dir: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each case's required ids with the rank get_context gave them (None when absent)."""
    from mcp import Client

    from pytest_evalloop.embedded.server import build_server_from_parts

    out = []
    async with Client(build_server_from_parts(*_target(set_dir))) as client:
        for case in cases:
            result = await client.call_tool("get_context", {"query": case["question"], "limit": 10})
            payload = json.loads(result.content[0].text)
            got = {r["id"]: r["rank"] for r in payload["results"]}
            required = case["expectedEntities"]["required"]
            out.append({"qid": case["qid"], "ranks": {e: got.get(e) for e in required}})
    return out


def _target(set_dir: Path) -> tuple[Any, Path]:
    # set.json names the model and data; a bare folder with model.json uses the built-in data.
    from pytest_evalloop.embedded.data import ensure_data
    from pytest_evalloop.embedded.model import SemanticModel
    from pytest_evalloop.embedded.server import load_set_target

    if (set_dir / "set.json").is_file():
        return load_set_target(set_dir)
    return SemanticModel.load(set_dir / "model.json"), ensure_data()


def recall(rows: list[dict[str, Any]], k: int) -> tuple[float, float]:
    """(entity-level recall@k, share of cases with every required entity within k)."""
    ranks = [r for row in rows for r in row["ranks"].values()]
    hit = sum(1 for r in ranks if r is not None and r <= k)
    full = sum(1 for row in rows if all(r is not None and r <= k for r in row["ranks"].values()))
    return hit / max(len(ranks), 1), full / max(len(rows), 1)


def main() -> None:
    """Print recall@5 and recall@10 of get_context over the set's answerable cases."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set_dir", nargs="?", type=Path, default=DEFAULT_SET)
    parser.add_argument("--misses", action="store_true", help="list entities missed at 10")
    args = parser.parse_args()
    cases = answerable_cases(args.set_dir)
    rows = anyio.run(ranks_for, args.set_dir, cases)
    n_entities = sum(len(r["ranks"]) for r in rows)
    print(f"{args.set_dir.name}: {len(rows)} answerable cases, {n_entities} required entities")
    for k in (5, 10):
        entity_recall, case_recall = recall(rows, k)
        print(f"recall@{k}: {entity_recall:.3f} of entities, {case_recall:.3f} of cases complete")
    if args.misses:
        for row in rows:
            missed = [f"{e}@{r}" for e, r in row["ranks"].items() if r is None or r > 5]
            if missed:
                print(f"  {row['qid']}: beyond 5: {', '.join(missed)}")


if __name__ == "__main__":
    main()
