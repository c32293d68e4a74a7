"""Recall of the embedded context tool over a set's answerable cases.

    .venv/bin/python bench/retrieval_recall.py [evals/ecommerce] [--misses [dev|holdout|all]]

For every case whose golden is not `unanswerable` and which names required entities, the case's
question goes to `get_context` (the real tool, through an in-process MCP client, limit 10) and
each `expectedEntities.required` id gets the rank it came back at, or none. Prints, for all
cases and per split (dev, holdout), recall@5 and recall@10 over the required entities, the share
of cases with every required entity found, and the share of `requiredAnyOf` groups with at least
one member found.

Tune retrieval on `dev` only: `--misses` lists the dev split's misses unless told otherwise, so
the holdout numbers stay an honest check.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import anyio

DEFAULT_SET = Path(__file__).resolve().parent.parent / "evals" / "ecommerce"
SPLITS = ("all", "dev", "holdout")
KS = (5, 10)


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
    """Each case's required ids (and any-of groups) with the rank get_context gave them."""
    from mcp import Client

    from pytest_evalloop.targets.embedded.server import build_server_from_parts

    out = []
    async with Client(build_server_from_parts(*_target(set_dir))) as client:
        for case in cases:
            result = await client.call_tool("get_context", {"query": case["question"], "limit": 10})
            payload = json.loads(_text(result))
            got = {r["id"]: r["rank"] for r in payload["results"]}
            expected = case["expectedEntities"]
            groups = expected.get("requiredAnyOf") or []
            out.append(
                {
                    "qid": case["qid"],
                    "split": case.get("split", "dev"),
                    "ranks": {e: got.get(e) for e in expected["required"]},
                    "any_of": [_best_rank(got, group) for group in groups],
                }
            )
    return out


def _text(result: Any) -> str:
    # get_context answers with one text block holding the JSON payload.
    from mcp.types import TextContent

    block = result.content[0]
    if result.is_error or not isinstance(block, TextContent):
        raise RuntimeError(f"get_context failed or sent no text: {result.content!r}")
    return block.text


def _best_rank(got: dict[str, int], group: list[str]) -> int | None:
    ranks = [got[e] for e in group if e in got]
    return min(ranks) if ranks else None


def _target(set_dir: Path) -> tuple[Any, Path]:
    # set.json names the model and data; a bare folder with model.json uses the built-in data.
    from pytest_evalloop.targets.embedded.data import ensure_data
    from pytest_evalloop.targets.embedded.model import SemanticModel
    from pytest_evalloop.targets.embedded.server import load_set_target

    if (set_dir / "set.json").is_file():
        return load_set_target(set_dir)
    return SemanticModel.load(set_dir / "model.json"), ensure_data()


def _within(rank: int | None, k: int) -> bool:
    return rank is not None and rank <= k


def recall(rows: list[dict[str, Any]], k: int) -> tuple[float, float]:
    """(entity-level recall@k, share of cases with every required entity within k)."""
    ranks = [r for row in rows for r in row["ranks"].values()]
    hit = sum(1 for r in ranks if _within(r, k))
    full = sum(1 for row in rows if all(_within(r, k) for r in row["ranks"].values()))
    return hit / max(len(ranks), 1), full / max(len(rows), 1)


def any_of_recall(rows: list[dict[str, Any]], k: int) -> float | None:
    """Share of `requiredAnyOf` groups with at least one member within k (None if no groups)."""
    groups = [r for row in rows for r in row.get("any_of", [])]
    if not groups:
        return None
    return sum(1 for r in groups if _within(r, k)) / len(groups)


def in_split(rows: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    """The rows of one split; `all` keeps every row."""
    return [r for r in rows if split == "all" or r["split"] == split]


def report(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | int | None]]:
    """Recall figures per split: entities, cases complete and any-of groups, at 5 and 10."""
    out: dict[str, dict[str, float | int | None]] = {}
    for split in SPLITS:
        part = in_split(rows, split)
        figures: dict[str, float | int | None] = {
            "cases": len(part),
            "entities": sum(len(r["ranks"]) for r in part),
        }
        for k in KS:
            entity_recall, case_recall = recall(part, k)
            figures[f"recall@{k}"] = round(entity_recall, 3)
            figures[f"complete@{k}"] = round(case_recall, 3)
            any_of = any_of_recall(part, k)
            figures[f"anyOf@{k}"] = None if any_of is None else round(any_of, 3)
        out[split] = figures
    return out


def _print_table(set_name: str, figures: dict[str, dict[str, float | int | None]]) -> None:
    print(f"{set_name}: required entities of answerable cases, question verbatim, limit 10")
    header = ["split", "cases", "ents"]
    header += [f"{m}@{k}" for k in KS for m in ("recall", "complete", "anyOf")]
    print("  ".join(f"{h:>11}" for h in header))
    for split, row in figures.items():
        cells = [split, row["cases"], row["entities"]]
        cells += [row[f"{m}@{k}"] for k in KS for m in ("recall", "complete", "anyOf")]
        print("  ".join(f"{'-' if c is None else c:>11}" for c in cells))


def main() -> None:
    """Print recall@5 and recall@10 of get_context over the set's answerable cases."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("set_dir", nargs="?", type=Path, default=DEFAULT_SET)
    parser.add_argument(
        "--misses",
        nargs="?",
        const="dev",
        choices=SPLITS,
        help="list required entities beyond rank 5 in this split (default dev)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    rows = anyio.run(ranks_for, args.set_dir, answerable_cases(args.set_dir))
    figures = report(rows)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        _print_table(args.set_dir.name, figures)
    if args.misses:
        for row in in_split(rows, args.misses):
            missed = [f"{e}@{r}" for e, r in row["ranks"].items() if not _within(r, 5)]
            if missed:
                print(f"  {row['qid']}: beyond 5: {', '.join(missed)}")


if __name__ == "__main__":
    main()
