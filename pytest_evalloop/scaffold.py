"""`evalloop init <dir>`: a minimal eval set of your own to start from.

It writes `set.json` (the embedded target over the built-in generated store data, the example
set's), `model.json` (a one-source semantic model stub over its `orders` table) and
`cases.jsonl` with one case whose golden is made the way the example set's are: its value is
derived now by a canonical query on the truth connection (the raw tables, no model), and a
second, differently shaped derivation must agree before it is written as verified; the case's
`modelQuery` reproduces it through the model. So the new set collects, and `pytest <dir>
--eval-verify-goldens` passes offline, before anything is paid for; then the user replaces the
model and the case with their own (docs/sets.md, docs/semantic-model.md).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from pytest_evalloop.sets import cases as sets

QUESTION = "How many orders have been placed?"
CANONICAL = "SELECT count(*) AS orders FROM orders"
SECOND = "SELECT count(DISTINCT order_id) AS orders FROM orders"
MODEL_QUERY = "SELECT order_count AS orders FROM (SELECT count(*) AS order_count FROM orders)"


def init_main(argv: list[str]) -> int:
    """`evalloop init <dir>`: 0 written, 2 when the folder holds files already."""
    parser = argparse.ArgumentParser(
        prog="evalloop init",
        description="Write a minimal eval set (set.json, one case, a model stub, its data)",
    )
    parser.add_argument("set_dir", help="the new set's folder, e.g. evals/orders")
    args = parser.parse_args(argv)
    set_dir = Path(args.set_dir)
    if set_dir.exists() and (not set_dir.is_dir() or any(set_dir.iterdir())):
        print(
            f"evalloop init: {set_dir} exists and is not an empty folder; name a new folder",
            file=sys.stderr,
        )
        return 2
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", set_dir.resolve().name).strip("-") or "my-set"
    try:
        write_set(set_dir, name)
    except OSError as error:
        print(
            f"evalloop init: cannot write {set_dir}: {error}; name a folder you can write",
            file=sys.stderr,
        )
        return 2
    print(f"evalloop init: wrote {set_dir}/ (set.json, cases.jsonl: 1 case, model.json)")
    print("next:")
    # Quoted for the shell: the commands are meant to be pasted as they are.
    where = shlex.quote(str(set_dir))
    print(f"  pytest {where} --eval-verify-goldens   # offline: its golden re-derived, no key")
    print(f"  ANTHROPIC_API_KEY=... pytest {where}    # answered and judged")
    return 0


def write_set(set_dir: Path, name: str) -> None:
    """The set's three files (see the module docstring)."""
    from pytest_evalloop.targets.embedded.data import ensure_data
    from pytest_evalloop.targets.embedded.truth import truth_connection

    con = truth_connection(ensure_data())
    try:
        [(first,)] = con.execute(CANONICAL).fetchall()
        [(second,)] = con.execute(SECOND).fetchall()
    finally:
        con.close()
    if first != second:  # the generator changed under us: never write an unverified golden
        raise RuntimeError(f"the two derivations disagree ({first} != {second})")
    set_dir.mkdir(parents=True, exist_ok=True)
    _write_json(set_dir / sets.SET_FILE, set_config(name))
    _write_json(set_dir / "model.json", model(name))
    row = json.dumps(case(int(first)), ensure_ascii=False)
    (set_dir / sets.CASES_FILE).write_text(row + "\n", encoding="utf-8")


def set_config(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": "Replace me: what this set measures, and over which data.",
        "datasetVersion": 1,
        # The built-in generated store (docs/embedded-target.md); data of your own needs a
        # target of your own (--eval-target, docs/publisher.md).
        "target": {"kind": "embedded", "model": "model.json", "data": "ecommerce"},
    }


def model(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "doc": "Replace me: what the data is, its date coverage, how to query it.",
        "sources": [
            {
                "name": "orders",
                "doc": "Orders: one row per order (a checkout), with its status and dates.",
                "grain": "one row per order (order_id)",
                "from": "orders",
                "primary_key": "order_id",
                "dimensions": [
                    {"name": "order_id", "doc": "The order's identifier."},
                    {
                        "name": "status",
                        "doc": "Complete, Shipped, Processing, Cancelled or Returned.",
                    },
                    {"name": "created_at", "doc": "When the order was placed."},
                ],
                "measures": [
                    {"name": "order_count", "doc": "Orders, every status.", "sql": "count(*)"}
                ],
            }
        ],
    }


def case(orders: int) -> dict[str, Any]:
    return {
        "qid": "order_count",
        "question": QUESTION,
        "split": "dev",
        "tags": ["example"],
        "state": "selected",
        "golden": {
            "status": "verified",
            "kind": "scalar",
            "value": {"orders": orders},
            "rubric": f"PREFERRED (match): {orders:,} orders, every status.",
            "canonicalQuery": CANONICAL,
            "verification": {
                "primaryAxis": "rows of orders",
                "variesAxis": "distinct order ids",
                "secondQuery": SECOND,
            },
        },
        "goldenRevision": 1,
        "questionSha": sets.question_sha(QUESTION),
        "coverage": "covered",
        "modelQuery": MODEL_QUERY,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
