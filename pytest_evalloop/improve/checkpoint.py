"""Checkpoints: a git commit of the model files and the set's ledger, and a restore to one.

Seed 004 (eval-loop, checkpoint): taken only after an accepted acceptance check (or once before
the first improve batch, pinning the model as it was), so a bad direction can be rolled back.
The commit carries the label and the closed issue ids in its message; the `checkpoint` event
(`action: created`) names the commit and rides in the next one (an append-only log trails by a
commit). A restore checks the checkpoint's model files out of its commit and appends
`checkpoint` with `action: restored`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pytest_evalloop.improve import repo
from pytest_evalloop.improve import workcopy as wc
from pytest_evalloop.improve.workcopy import ImproveRefused
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import seal
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.sets import cases as sets

_LABEL = re.compile(r"-checkpoint-(\d+)$")


def checkpoints(runs_dir: Path) -> list[tuple[Path, ledger.CheckpointEvent]]:
    """Every checkpoint event of a set's runs, with its run, in the order they were written."""
    found: list[tuple[str, Path, ledger.CheckpointEvent]] = []
    if not runs_dir.is_dir():
        return []
    for run in sorted(p for p in runs_dir.iterdir() if (p / ledger.EVENTS_FILE).is_file()):
        read = ledger_reader.read_run(run, kinds=frozenset({"checkpoint"}))
        for event in read.of_kind("checkpoint"):
            found.append((event.at or "", run, event))
    found.sort(key=lambda item: item[0])
    return [(run, event) for _, run, event in found]


def next_label(runs_dir: Path, set_name: str) -> str:
    """`<set>-checkpoint-<nn>`, nn one past the highest created so far."""
    used = [
        int(m.group(1))
        for _, e in checkpoints(runs_dir)
        if e.action == "created" and e.label and (m := _LABEL.search(e.label))
    ]
    return f"{set_name}-checkpoint-{max(used, default=0) + 1:02d}"


def _ledger_files(runs: list[Path]) -> tuple[Path, ...]:
    # run.json, the events and what vouches for them (the chain, the seal); artifacts
    # (transcripts, rows) stay out of the model's history.
    names = (ledger.RUN_FILE, ledger.EVENTS_FILE, seal.CHAIN_FILE, seal.SEAL_FILE)
    return tuple(run / name for run in runs for name in names if (run / name).is_file())


def create(
    run_dir: Path,
    set_dir: Path,
    files: wc.ModelFiles,
    root: Path,
    *,
    issue_ids: list[str],
    candidate_id: str | None,
    ledgers: list[Path],
    regressions: list[str] | None = None,
) -> ledger.CheckpointEvent:
    """Commit the model files and the runs' ledgers; append `checkpoint: created`."""
    label = next_label(run_dir.parent, sets_name(set_dir))
    closes = ", ".join(issue_ids) or "none (pins the model before improve)"
    message = f"evalloop checkpoint {label}\n\nissues: {closes}\n"
    if candidate_id:
        message += f"candidate: {candidate_id}\n"
    if regressions:
        message += f"regressions accepted by a person: {', '.join(regressions)}\n"
    # The model files and the set's own pytest files (its conftest.py and the like): what a
    # run reads besides the set, pinned by the commit and returned by a restore.
    paths = [*files.files, *repo.pinned_files(root, set_dir)]
    dirty = repo.dirty_files(root, paths)
    ledgers_files = _ledger_files(ledgers)
    if dirty or any(p.exists() for p in ledgers_files):
        sha = repo.commit(root, paths, message, force=ledgers_files)
    else:
        sha = repo.head_sha(root)
    event = ledger.CheckpointEvent(
        action="created",
        label=label,
        modelGitSha=sha,
        issueIds=issue_ids,
        files=list(dict.fromkeys(wc.rel(set_dir, p) for p in paths)),
        candidateId=candidate_id,
    )
    ledger_writer.LedgerWriter(run_dir).append(event)
    return event


def sets_name(set_dir: Path) -> str:

    return sets.load_set_config(set_dir).name


def find(runs_dir: Path, label: str) -> tuple[Path, ledger.CheckpointEvent]:
    """The `created` checkpoint with this label, and the run that holds it."""
    created = [(run, e) for run, e in checkpoints(runs_dir) if e.action == "created"]
    for run, event in created:
        if event.label == label:
            return run, event
    known = ", ".join(e.label or "?" for _, e in created) or "none"
    raise ImproveRefused(f"no checkpoint {label!r} under {runs_dir}; checkpoints: {known}")


def restore(
    set_dir: Path, label: str, runs_dir: Path | None = None, *, force: bool = False
) -> dict[str, Any]:
    """Return the model files to a checkpoint's commit; append `checkpoint: restored`.

    Never loses work: while a file it would put back has uncommitted changes it refuses,
    naming them and how to keep them; with `force` it first saves those changes to a patch
    file (named in the result) that `git apply` takes back.
    """
    import datetime as dt

    runs = runs_dir or set_dir / "runs"
    run, event = find(runs, label)
    root = repo.repo_root(set_dir)
    if root is None:
        raise ImproveRefused(f"{set_dir} is in no git repository; nothing to restore from")
    sha = event.model_git_sha or ""
    if not repo.is_commit(root, sha):
        raise ImproveRefused(f"checkpoint {label} names {sha!r}, which is no commit of {root}")
    config = sets.load_set_config(set_dir)
    files = wc.model_files(set_dir, config, None)
    names = event.files or files.names
    paths = [set_dir / name for name in names]
    dirty = repo.dirty_files(root, paths)
    saved = None
    if dirty:
        listed = " ".join(dirty)
        if not force:
            raise ImproveRefused(
                f"uncommitted changes in {', '.join(dirty)}: a restore would discard them. Keep "
                f"them first (`git stash push -- {listed}`, or commit them), or pass --force to "
                "save them to a patch file before restoring"
            )
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        saved = repo.save_changes(
            root, [root / d for d in dirty], runs / f"before-restore-{label}-{stamp}.patch"
        )
    repo.checkout_files(root, sha, paths)
    restored = ledger.CheckpointEvent(action="restored", label=label, modelGitSha=sha, files=names)
    ledger_writer.LedgerWriter(run).append(restored)
    return {
        "label": label,
        "sha": sha,
        "files": names,
        "run": str(run),
        "saved": str(saved.resolve()) if saved else None,
        "root": str(root),
        "dirty": dirty,
    }
