"""Two large runs for timing `evalloop flips`, grown from a real run the bench just made.

Each case of the big runs is a copy of one real case's events (attempt, tool calls, score,
retrieval score) under a new qid, so the files have the real shapes and sizes. The two runs
disagree on a few verdicts, so the comparison has flips in both directions to print.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_evalloop.ledger.contract import EVENTS_FILE
from pytest_evalloop.ledger.reader import read_run_info
from pytest_evalloop.ledger.writer import write_run_info


def case_events(run_dir: Path) -> list[list[dict[str, Any]]]:
    """The run's events grouped per case (qid), in first-seen order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for line in (run_dir / EVENTS_FILE).read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        qid = event.get("qid")
        if qid:
            groups.setdefault(qid, []).append(event)
    if not groups:
        raise RuntimeError(f"{run_dir / EVENTS_FILE} holds no case events to grow a run from")
    return list(groups.values())


def grow_run(source: Path, target: Path, n: int, no_match_every: int) -> Path:
    """Write a run of `n` cases at `target`, each copied from a case of `source`.

    Case i is scored no_match when i is a multiple of `no_match_every`, match otherwise.
    """
    groups = case_events(source)
    target.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        qid = f"bench_case_{i:05d}"
        verdict = "no_match" if i % no_match_every == 0 else "match"
        for event in groups[i % len(groups)]:
            copy = dict(event, qid=qid)
            if copy.get("kind") == "score":
                copy["verdict"] = verdict
            lines.append(json.dumps(copy))
    (target / EVENTS_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    info = read_run_info(source).model_copy(update={"run_id": target.name, "label": target.name})
    write_run_info(target, info)
    return target
