"""Which run a session may open: a label that is free, a run that may be resumed.

Every check here runs twice: once in the controller before anything is collected (one usage
error, `startchecks.check_run_choice`), and again under the runs directory's lock when a
process opens the run (`runs.open_run`), since a run can change between the two.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import seal
from pytest_evalloop.measure import pins as pin_rules
from pytest_evalloop.session.claims import written_elsewhere
from pytest_evalloop.session.selection import DESIGN
from pytest_evalloop.sets.pin import find_set_dir


def check_resume_seal(ref: str, run_dir: Path) -> None:
    """Refuse to resume a run another session is writing now, or one changed after it
    stopped: appending to it would seal the change in as if the ledger had written it."""

    if written_elsewhere(run_dir):
        raise RunStateError(
            f"--eval-resume={ref}: {run_dir.name} is being written by another session now "
            "(a live process holds its directory's lock); wait for that session to end, or "
            "stop it, then resume"
        )
    if not _sealed(run_dir):
        # Killed, not closed: its last append may have chained lines it never wrote.
        seal.drop_unwritten(run_dir)
    check = seal.verify(run_dir)
    if check.broken is not None:
        raise RunStateError(
            f"--eval-resume={ref}: {run_dir.name} changed after it stopped ({check.broken}); "
            "start a new run instead"
        )
    if not check.chained or (not check.sealed and _closed(run_dir)):
        # A run that stopped is sealed, and every run written since chains existed is chained:
        # one without either was written before them, or had them removed.
        raise RunStateError(
            f"--eval-resume={ref}: {run_dir.name} carries no seal or no chain, so what it "
            "held cannot be checked before it is finished; start a new run instead"
        )


def _sealed(run_dir: Path) -> bool:
    try:
        return ledger_reader.read_run_info(run_dir).seal is not None
    except (OSError, ValueError):
        return False


def _closed(run_dir: Path) -> bool:
    try:
        return ledger_reader.read_run_info(run_dir).status not in (None, "running")
    except (OSError, ValueError):
        return False


def resumable_run(ref: str, set_dir: Path, parent: Path) -> Path:
    """The run `--eval-resume=<ref>` names, refused when it is complete or cannot be found."""
    from pytest_evalloop.measure.comparison import resolve_run

    try:
        run_dir = resolve_run(ref, set_dir=set_dir, runs_dir=parent)
        info = ledger_reader.read_run_info(run_dir)
    except (OSError, ValueError) as exc:
        raise RunStateError(f"--eval-resume={ref}: {exc}") from exc
    if info.rejudge_of:
        # Resumed, it would answer the rest afresh: one ledger, two kinds of answers.
        raise RunStateError(
            f"--eval-resume={ref}: {run_dir.name} rejudges {info.rejudge_of}, and a rejudge is "
            f"never finished by answering: rejudge {info.rejudge_of} again "
            f"(--eval-rejudge-from={info.rejudge_of}) into a new run"
        )
    if info.status == "complete":
        raise RunStateError(
            f"--eval-resume={ref}: {run_dir.name} is complete; nothing to resume "
            "(start a new run instead, or compare against it with --baseline)"
        )
    elsewhere = _set_still_elsewhere(info.set_dir, set_dir)
    if elsewhere is not None:
        # Resumed from a copy, its rest would be answered against another folder's model and
        # conftest under the first set's name. A set that moved is no longer there: adopted.
        raise RunStateError(
            f"--eval-resume={ref}: {run_dir.name} is a run of the set at {elsewhere}, which is "
            f"still there, not of {set_dir}; resume it from its own set (pytest {elsewhere} "
            f"--eval-resume={ref}), or start a new run of {set_dir}"
        )
    return run_dir


def _set_still_elsewhere(recorded: str | None, set_dir: Path) -> Path | None:
    """The set a run was recorded for, when that is another set folder that still exists."""
    if not recorded:
        return None  # a run written before runs named their set: nothing to compare
    there = Path(recorded)
    try:
        if there.resolve() == set_dir.resolve() or find_set_dir(there) is None:
            return None
    except OSError:
        return None
    return there


def one_run_for_many_sets(option: str, chosen: dict[Path, Path]) -> str | None:
    """Why `option` (`--eval-label=...` or `--eval-resume=...`) cannot serve this session's
    sets, or None. `chosen`: each set's folder and the run folder the option names for it.

    Each option names one run; sets for which it names the same folder (one
    `--eval-runs-dir`, `runs/` folders linked to one place, a run folder given by its path)
    would all claim it. The first set took it and the next was refused only once the first
    had answered (a label), or adopted the first set's run as its own (a resume).
    """
    by_run: dict[str, list[Path]] = {}
    for set_dir, run_dir in chosen.items():
        by_run.setdefault(os.path.realpath(run_dir), []).append(set_dir)
    for shared, crowded in by_run.items():
        if len(crowded) < 2:
            continue
        listed = ", ".join(str(d) for d in crowded[:5]) + (" ..." if len(crowded) > 5 else "")
        return (
            f"{option} names one run ({shared}) for {len(crowded)} sets of this session: "
            f"{listed}. Run one set per session with {option}"
            + (
                ", or leave --eval-label out so each set's run is named for it"
                if option.startswith("--eval-label")
                else ""
            )
        )
    return None


def check_resume_pins(ref: str, run_dir: Path, configured: dict[str, Any]) -> None:
    """Refuse to resume a run under another configuration, naming every pin that differs.

    A resumed run is one measurement: its scores must all come from the run.json pins. The
    served revision is not compared (a target mints one per load); the model's sha is, where
    both sides know it.
    """
    stored = pin_rules.pins_of(ledger_reader.read_run_info(run_dir).model_dump(by_alias=True))
    # Only what this session knows is compared: before collection, a role a conftest replaces
    # is not known yet (it is checked again when the run opens).
    differ = pin_rules.classify(
        {name: stored.get(name) for name in configured},
        configured,
        only_known=frozenset(pin_rules.UNDER_TEST),
    )
    diffs = [d for d in differ.breaking + differ.under_test if d.name != "servedRevision"]
    if diffs:
        listed = "; ".join(
            f"{d.name}: run has {pin_rules.show(d.baseline, 64)}, this session "
            f"{pin_rules.show(d.current, 64)}"
            for d in diffs
        )
        raise RunStateError(
            f"--eval-resume={ref}: {run_dir.name} was started under another configuration "
            f"({listed}); resume it with the options it was started with, or start a new run"
        )


def sharding(settings: Any) -> dict[str, Any]:
    """Where this session sits in a sharded run, in run.json's shapes (`shard`, `runGroup`):
    what a resume compares besides the design (`check_resume_design`)."""
    shard = settings.shard
    return {
        "shard": None if shard is None else {"index": shard.index, "count": shard.count},
        "runGroup": settings.run_group,
    }


def check_resume_design(
    ref: str, run_dir: Path, current: dict[str, Any], placed: dict[str, Any] | None = None
) -> None:
    """Refuse to resume a run under another design, naming every option that differs.

    A resumed run is one measurement: a scored case is never answered again, so another
    `--eval-samples` would mix designs in one ledger, another split or `-k` would mark a run
    complete with cases never attempted. A key the run did not record (a run written before it
    existed) is not compared. With `placed` (`sharding`), the shard and run group are compared
    too: shard 2 resumed as shard 1 would answer shard 1's cases into shard 2's ledger, and a
    merge would find them in two shards.
    """
    info = ledger_reader.read_run_info(run_dir)
    stored = info.selection or {}
    diffs = [
        f"{option}: run has {stored[key]!r}, this session {current[key]!r}"
        for key, option, _field in DESIGN
        if key in stored and key in current and stored[key] != current[key]
    ]
    if placed is not None:
        diffs += _placement_diffs(info, placed)
    if diffs:
        raise RunStateError(
            f"--eval-resume={ref}: {run_dir.name} was started with another design "
            f"({'; '.join(diffs)}); resume it with the options it was started with, or start "
            "a new run"
        )


def _placement_diffs(info: ledger.RunInfo, placed: dict[str, Any]) -> list[str]:
    """The shard and run group a resume would change. The run group of a run that is no shard
    on either side is not compared: only a merge reads it, and a whole run is never merged."""

    def shown(shard: dict[str, Any] | None) -> str:
        return "no shard" if not shard else f"{shard.get('index')}/{shard.get('count')}"

    was, now = shown(info.shard), shown(placed.get("shard"))
    diffs = [] if was == now else [f"--eval-shard: run has {was}, this session {now}"]
    group = placed.get("runGroup")
    if (info.shard or placed.get("shard")) and info.run_group != group:
        diffs.append(f"--eval-run-group: run has {info.run_group!r}, this session {group!r}")
    return diffs


RESERVED_LABELS = frozenset({"index.html"})
"""Names the runs directory keeps for itself (`runs/index.html`, the runs index)."""


def check_label_free(parent: Path, label: str) -> None:
    """Refuse a run label whose directory already holds a run, or that names a file of the
    runs directory (its index): a run needs a directory of its own."""
    run_dir = parent / label
    if label.lower() in RESERVED_LABELS or (run_dir.exists() and not run_dir.is_dir()):
        raise RunStateError(
            f"--eval-label={label}: {run_dir} is a file the runs directory keeps (its index "
            "is runs/index.html), not a run directory; pick another --eval-label"
        )
    if (run_dir / ledger.RUN_FILE).exists():
        raise RunStateError(
            f"--eval-label={label}: {run_dir} already holds a run; pick another --eval-label, "
            "resume that run with --eval-resume, or remove its directory"
        )


class RunStateError(ValueError):
    """A run that cannot be used the way it was asked for."""
