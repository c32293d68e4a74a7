"""The golden side door seen from the acceptance check: which recorded changes explain a dataset
that moved between the baseline and the arms, and whether they are what happened.

`golden-changes.jsonl` is a file anyone can write. A record it holds may excuse a dataset change
(the pins `datasetSha`, `datasetVersion`), settle a golden suspect, and drop a case from the
comparison (a `repair` or `hold`: the baseline's verdict was against another golden). So a record
counts only when the set's own history says it happened: the baseline's dataset must be in a
commit of the set's repository, and between it and the dataset now (the arms') exactly the rows
the records name changed, each as its action says (a hold set a held status, a repair changed
what the golden holds), `set.json` moved only its `datasetVersion`, to the last record's. A
record for a row that did not change, a row that changed with no record, a changed `set.json`:
the path is refused, nothing is excused, settled or dropped.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalloop.sets import cases as sets
from pytest_evalloop.sets.pin import artifact_paths

SIDE_DOOR_PINS = frozenset({"datasetSha", "datasetVersion"})
"""The pins a golden side-door change moves (each change records its old and new dataset)."""
NOT_COMPARABLE = frozenset({"repair", "hold"})
"""Side-door actions after which a case's baseline verdict says nothing of the arms': a repair
moved the golden the baseline was judged against, a hold takes the case out of scoring. A
promote, attest or release leaves the golden's content as it was: still comparable."""
BOOKKEEPING = frozenset({"status", "history", "attestations", "verifiedBy", "verification"})
"""Keys of a golden that say how far it is trusted, not what it holds: a repair must change
something else."""
HISTORY_LIMIT = 200
"""Commits of the set's files searched for the baseline's dataset."""


@dataclass
class SideDoorRebase:
    """How the baseline's dataset leads to the arms' (see `side_door_rebase`)."""

    reached: bool
    """Every step from the baseline's datasetSha to the arms' is a recorded side-door change
    (and, once `checked`, each is what happened)."""
    actions: dict[str, list[str]] = field(default_factory=dict)
    """qid -> the side-door actions on that path, in order."""
    dropped: list[str] = field(default_factory=list)
    """Cases left out of the comparison with the baseline (their golden moved or was held)."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    """The records on the path, in order."""
    refused: list[str] = field(default_factory=list)
    """Why the records are not what happened (`checked`): nothing is excused."""


def golden_changes(set_dir: Path) -> list[dict[str, Any]]:
    """The records of `golden-changes.jsonl` (unreadable lines skipped)."""
    from pytest_evalloop.goldens.change import CHANGES_FILE

    path = set_dir / CHANGES_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def side_door_rebase(
    baseline_sha: str | None,
    arm_sha: str | None,
    changes: list[dict[str, Any]],
    targets: list[str],
) -> SideDoorRebase:
    """Whether the recorded side-door changes lead from the baseline's `datasetSha` to the
    arms' (each record's `oldDatasetSha` to its `newDatasetSha`), and which cases that leaves
    incomparable. Any other step (a cases.jsonl edited by hand) leaves `reached` False: the
    comparison stays a rebase. A case a `repair` or `hold` touched is dropped from the
    comparison, except a target, whose baseline failed by definition and which must pass in
    both arms against the golden as it is now. The shas alone: `checked` asks whether the
    records are what happened."""
    if not baseline_sha or not arm_sha:
        return SideDoorRebase(reached=False)
    sha = baseline_sha
    actions: dict[str, list[str]] = {}
    path: list[dict[str, Any]] = []
    steps = {str(c.get("oldDatasetSha")): c for c in changes if c.get("oldDatasetSha")}
    for _ in range(len(changes) + 1):
        if sha == arm_sha:
            dropped = [
                q for q, did in actions.items() if NOT_COMPARABLE & set(did) and q not in targets
            ]
            return SideDoorRebase(reached=True, actions=actions, dropped=dropped, steps=path)
        step = steps.get(sha)
        if step is None:
            break
        path.append(step)
        actions.setdefault(str(step.get("qid")), []).append(str(step.get("action")))
        sha = str(step.get("newDatasetSha"))
    return SideDoorRebase(reached=False, actions=actions, steps=path)


def checked(
    set_dir: Path,
    root: Path | None,
    baseline_sha: str | None,
    arm_sha: str | None,
    targets: list[str],
) -> SideDoorRebase:
    """`side_door_rebase` over the set's records, each checked against the set's history (see
    the module docstring); a path whose records are not what happened is refused."""
    rebase = side_door_rebase(baseline_sha, arm_sha, golden_changes(set_dir), targets)
    if not rebase.reached or not rebase.steps:
        return rebase
    assert baseline_sha is not None
    problems = _history_problems(set_dir, root, baseline_sha, arm_sha, rebase)
    if problems:
        return SideDoorRebase(reached=False, actions=rebase.actions, refused=problems)
    return rebase


def settled_suspects(
    suspects: list[dict[str, Any]],
    rebase: SideDoorRebase,
    since: str | None,
    dismissed: set[str],
) -> tuple[list[str], list[str]]:
    """(settled, pending) qids: settled by a side-door change on a checked path from the
    baseline's dataset, recorded after the candidate, or dismissed explicitly by a person."""
    touched = {
        step.get("qid")
        for step in (rebase.steps if rebase.reached else [])
        if since is None or str(step.get("at", "")) >= since
    }
    settled = [s["qid"] for s in suspects if s["qid"] in touched or s["qid"] in dismissed]
    pending = [s["qid"] for s in suspects if s["qid"] not in settled]
    return list(dict.fromkeys(settled)), list(dict.fromkeys(pending))


# --- the history --------------------------------------------------------------------------


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=60, check=False)


def _dataset_at(root: Path, rel: str, commit: str, into: Path) -> Path | None:
    """The set's dataset files (set.json, cases.jsonl, its gold artifacts) as `commit` holds
    them, written under `into`; None when the commit lacks them."""
    folder = into / commit
    folder.mkdir(parents=True)
    for name in (sets.SET_FILE, sets.CASES_FILE):
        done = _git(root, "show", f"{commit}:{rel}/{name}".lstrip("/"))
        if done.returncode != 0:
            return None
        (folder / name).write_bytes(done.stdout)
    for artifact in artifact_paths((folder / sets.CASES_FILE).read_bytes()):
        done = _git(root, "show", f"{commit}:{rel}/{artifact}".lstrip("/"))
        if done.returncode == 0 and ".." not in Path(artifact).parts:
            (folder / artifact).parent.mkdir(parents=True, exist_ok=True)
            (folder / artifact).write_bytes(done.stdout)
    return folder


def _find_dataset(root: Path, set_dir: Path, sha: str, into: Path) -> Path | None:
    """A copy of the dataset whose `datasetSha` is `sha`, from the set's commits."""
    rel = set_dir.resolve().relative_to(root.resolve()).as_posix()
    rel = "" if rel == "." else rel
    log = _git(
        root,
        "log",
        f"-{HISTORY_LIMIT}",
        "--format=%H",
        "--",
        f"{rel}/{sets.SET_FILE}".lstrip("/"),
        f"{rel}/{sets.CASES_FILE}".lstrip("/"),
    )
    for commit in log.stdout.decode().split():
        folder = _dataset_at(root, rel, commit, into)
        if folder is not None and sets.dataset_sha(folder) == sha:
            return folder
    return None


def _rows(folder: Path) -> dict[str, tuple[int, dict[str, Any]]]:
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    lines = (folder / sets.CASES_FILE).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("qid"), str):
            out[row["qid"]] = (number, row)
    return out


def _golden(folder: Path, row: dict[str, Any] | None) -> dict[str, Any]:
    golden = dict((row or {}).get("golden") or {})
    path = golden.get("path")
    if isinstance(path, str) and path:
        try:
            golden["artifact"] = (
                sets.golden_file(folder, path).read_bytes().decode("utf-8", "replace")
            )
        except (OSError, ValueError):
            golden["artifact"] = None
    return golden


def _history_problems(
    set_dir: Path,
    root: Path | None,
    baseline_sha: str,
    arm_sha: str | None,
    rebase: SideDoorRebase,
) -> list[str]:
    if root is None:
        return ["the set is in no git repository: its side-door records cannot be checked"]
    if sets.dataset_sha(set_dir) != arm_sha:
        return ["the set's dataset is not the one the arms answered: it changed since they ran"]
    with tempfile.TemporaryDirectory(prefix="evalloop-sidedoor-") as scratch:
        old = _find_dataset(root, set_dir, baseline_sha, Path(scratch))
        if old is None:
            return [
                f"the baseline's dataset ({baseline_sha[:12]}) is in no commit of {root}: its "
                "side-door records cannot be checked against it; commit the set before a "
                "baseline, or run a new baseline"
            ]
        return _row_problems(old, set_dir, rebase)


def _row_problems(old: Path, new: Path, rebase: SideDoorRebase) -> list[str]:
    problems = []
    before, after = _rows(old), _rows(new)

    def row(rows: dict[str, tuple[int, dict[str, Any]]], qid: str) -> dict[str, Any] | None:
        return rows[qid][1] if qid in rows else None

    changed = {
        q
        for q in set(before) | set(after)
        if row(before, q) != row(after, q)
        or _golden(old, row(before, q)) != _golden(new, row(after, q))
    }
    named = set(rebase.actions)
    for qid in sorted(changed - named):
        problems.append(f"case {qid} changed with no side-door record: a hand edit of cases.jsonl")
    for qid in sorted(named - changed):
        problems.append(
            f"the record of {qid} ({'+'.join(rebase.actions[qid])}) is not what happened: its "
            "row is the same in the baseline's dataset and now"
        )
    held = {"ambiguous", "invalid"}
    for qid in sorted(named & changed):
        old_golden, new_golden = _golden(old, row(before, qid)), _golden(new, row(after, qid))
        did = set(rebase.actions[qid])
        if "hold" in did and new_golden.get("status") not in held and "release" not in did:
            problems.append(f"the record holds {qid}, but its golden is not held now")
        content = {k: v for k, v in old_golden.items() if k not in BOOKKEEPING}
        if "repair" in did and content == {
            k: v for k, v in new_golden.items() if k not in BOOKKEEPING
        }:
            problems.append(f"the record repairs {qid}, but what its golden holds did not change")
    for step in rebase.steps:
        line, named_qid = step.get("line"), str(step.get("qid"))
        if named_qid in after and isinstance(line, int) and after[named_qid][0] != line:
            problems.append(f"the record of {named_qid} names line {line}, where another case is")
    old_set = json.loads((old / sets.SET_FILE).read_text(encoding="utf-8"))
    new_set = json.loads((new / sets.SET_FILE).read_text(encoding="utf-8"))
    old_set.pop("datasetVersion", None)
    version = new_set.pop("datasetVersion", 1)
    if old_set != new_set:
        problems.append("set.json changed beyond its datasetVersion since the baseline")
    last = rebase.steps[-1].get("newDatasetVersion")
    if version != last:
        problems.append(f"set.json datasetVersion is {version}, the last record says {last}")
    return problems
