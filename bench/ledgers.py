"""Two large runs for timing `evalloop flips`, grown from a real run the bench just made.

Each case of the big runs is a copy of one real case's events (attempt, tool calls, score,
retrieval score) under a new qid, so the files have the real shapes and sizes. The two runs
disagree on a few verdicts, so the comparison has flips in both directions to print.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from pytest_evalloop.ledger.contract import EVENTS_FILE
from pytest_evalloop.ledger.reader import read_run_info
from pytest_evalloop.ledger.seal import CHAIN_FILE, file_entries
from pytest_evalloop.ledger.writer import seal_run, write_run_info


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
    The run is chained and sealed as `evalloop merge` leaves a run it wrote whole (a gate and
    a comparison refuse an unsealed run), so the timing is of the reads a real run gets.
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
    payload = ("\n".join(lines) + "\n").encode("utf-8")
    (target / EVENTS_FILE).write_bytes(payload)
    (target / CHAIN_FILE).write_bytes(file_entries(payload))
    info = read_run_info(source)
    # Its own session and case count: two grown runs are two arms, each a whole run of `n`.
    selection = {**(info.selection or {}), "attempted": n}
    update = {
        "run_id": target.name,
        "label": target.name,
        "session_id": uuid.uuid4().hex[:12],
        "selection": selection,
        "seal": None,
    }
    write_run_info(target, info.model_copy(update=update))
    seal_run(target)
    return target
