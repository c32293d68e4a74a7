"""`evalloop merge <shard run>... -o <run dir>`: the shards of one sharded run as one run.

Each CI job ran one shard (`--eval-shard=I/N`) into its own run directory. The merge checks that
they are the shards of one run (one run group, one partition, each index once, no case twice,
the same pins), then writes one run directory: every shard's event lines in shard order, byte
for byte (they were validated and redacted when written), every shard's artifacts under the
same layout, and a `run.json` closed by the same function that closes any run
(`runs.finish_run`), so its costs, tokens, totals and served revisions are counted from the
merged lines exactly as one machine's run would be. It is complete only when shards 1..N are
all there and complete; otherwise it refuses, or with `--partial` writes an aborted run that
names what is missing (an aborted run is a harness failure to every gate).

Nothing is written unless every check passes: the run is built in a temporary directory beside
the output and renamed into place.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import seal
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.measure import aggregates
from pytest_evalloop.measure import pins as pin_rules
from pytest_evalloop.session import runs
from pytest_evalloop.sets.partition import shard_of

EXIT_OK = 0
EXIT_INVALID = 1
"""A shard's ledger does not validate (`evalloop validate` says why)."""
EXIT_USAGE = 2
"""Bad arguments, a directory that is not a run, an output that already holds a run."""
EXIT_MISSING = 10
"""A shard of 1..N is missing or did not complete (without `--partial`)."""
EXIT_PIN_MISMATCH = 11
"""A pin differs between shards (another judge model, dataset, answerer, target, model...)."""
EXIT_CASE_TWICE = 12
"""A case is in two shards, or in a shard the partition rule does not give it to."""
EXIT_INDEX_TWICE = 13
"""Two shards claim one index."""
EXIT_OTHER_RUN = 14
"""A shard of another run group, another shard count or partition rule, or not a shard."""

AGREE = (
    *pin_rules.BREAKING,
    "modelSha",
    *pin_rules.RECORDED,
    "setName",
    "datasetVersion",
    "phase",
    "selection",
)
"""What every shard must share. Not `servedRevision`: a target mints one each time it loads,
so each job has its own; the merged run lists them all (`runs.served_pins`)."""
DROPPED = (
    "sessionId",
    "shard",
    "gate",
    "pairedTests",
    "abortReason",
    "invalidReason",
    "label",
    "seal",
)
"""A shard's own run.json fields that say nothing true of the merged run."""


class MergeRefused(ValueError):
    """The shards cannot be one run: `code` is the exit status, the message says why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ShardRun:
    """One shard's run directory as read for a merge."""

    run_dir: Path
    info: ledger.RunInfo
    qids: set[str] = field(default_factory=set)

    @property
    def index(self) -> int:
        return int((self.info.shard or {}).get("index", 0))

    @property
    def count(self) -> int:
        return int((self.info.shard or {}).get("count", 0))

    @property
    def name(self) -> str:
        return f"{self.run_dir} (shard {self.index}/{self.count})"


def read_shard(run_dir: Path) -> ShardRun:
    """Read and validate one shard, refusing what cannot be merged at all."""
    if not os.path.lexists(run_dir / ledger.RUN_FILE):
        raise MergeRefused(EXIT_USAGE, f"{run_dir}: no run.json; give a shard's run directory")
    # A run.json or a ledger file that is no regular file is refused by the reader, named.
    read = ledger_reader.read_run(run_dir)
    if read.info is None or read.errors:
        first = "; ".join(str(f) for f in read.errors[:3])
        raise MergeRefused(
            EXIT_INVALID,
            f"{run_dir}: its ledger does not validate ({first}); see `evalloop validate "
            f"{run_dir}`, re-run that shard, then merge",
        )
    strays = seal.unsealed_artifacts(run_dir)
    if strays:
        # The seal counts regular files only: a link or a pipe among a shard's artifacts is
        # nothing it measured, and copying it would bring in bytes from outside the run.
        raise MergeRefused(
            EXIT_INVALID,
            f"{run_dir}: its artifacts hold what no run writes ({', '.join(strays[:3])}: a "
            "link, a pipe or a device); remove them or re-run that shard, then merge",
        )
    check = seal.verify(run_dir)
    if not check.sealed or not check.chained:
        # A shard is merged as it closed or not at all: without a seal or a chain, an edit
        # made to it would come out of the merge freshly sealed.
        raise MergeRefused(
            EXIT_INVALID,
            f"{run_dir}: carries no seal or no chain (closed by a harness before seals, or "
            "they were removed): what it held cannot be checked; re-run that shard, then merge",
        )
    if not read.info.shard:
        raise MergeRefused(
            EXIT_OTHER_RUN,
            f"{run_dir}: not a shard (its run.json has no shard); only runs made with "
            "--eval-shard=I/N merge",
        )
    qids = {e.qid for e in read.events if e.kind in ("attempt", "score") and e.qid}
    return ShardRun(run_dir=run_dir, info=read.info, qids=qids)


@dataclass
class MergePlan:
    """What the merged run will be: its shards in index order and what is missing."""

    shards: list[ShardRun]
    count: int
    group: str
    missing: list[int]
    incomplete: list[ShardRun]

    @property
    def complete(self) -> bool:
        return not self.missing and not self.incomplete

    def shortfall(self) -> str:
        """What keeps the merge from being complete, in words."""
        parts = []
        if self.missing:
            parts.append("missing shard(s) " + ", ".join(f"{i}/{self.count}" for i in self.missing))
        for one in self.incomplete:
            parts.append(f"shard {one.index}/{self.count} is {one.info.status} ({one.run_dir})")
        return "; ".join(parts)


def plan(shards: Sequence[ShardRun], *, partial: bool) -> MergePlan:
    """Check that the shards are one run; refuse (MergeRefused) naming what is wrong."""
    if not shards:
        raise MergeRefused(EXIT_USAGE, "no shard given; pass the shards' run directories")
    first = shards[0]
    group = first.info.run_group or ""
    rule = (first.info.shard or {}).get("rule")
    for one in shards[1:]:
        if (one.info.run_group or "") != group:
            raise MergeRefused(
                EXIT_OTHER_RUN,
                f"{one.name} is of run group {one.info.run_group!r}, {first.name} of {group!r}: "
                "shards of different runs never merge; merge the shards of one run group",
            )
        if one.count != first.count or (one.info.shard or {}).get("rule") != rule:
            raise MergeRefused(
                EXIT_OTHER_RUN,
                f"{one.name} and {first.name} cut the set differently (shard counts "
                f"{one.count} and {first.count}); merge shards of one --eval-shard=I/N split",
            )
    by_index: dict[int, ShardRun] = {}
    for one in shards:
        if one.index in by_index:
            raise MergeRefused(
                EXIT_INDEX_TWICE,
                f"{by_index[one.index].run_dir} and {one.run_dir} both claim shard "
                f"{one.index}/{one.count}; give each index once (keep the run you mean)",
            )
        by_index[one.index] = one
    _check_pins(shards)
    _check_cases(shards)
    ordered = [by_index[i] for i in sorted(by_index)]
    found = plan_of(ordered, first.count, group)
    if not found.complete and not partial:
        raise MergeRefused(
            EXIT_MISSING,
            f"not merged: {found.shortfall()}; run or re-run those shards and merge all "
            f"{first.count}, or pass --partial to write an aborted run that says so",
        )
    return found


def plan_of(ordered: list[ShardRun], count: int, group: str) -> MergePlan:
    present = {one.index for one in ordered}
    return MergePlan(
        shards=ordered,
        count=count,
        group=group,
        missing=[i for i in range(1, count + 1) if i not in present],
        incomplete=[one for one in ordered if one.info.status != "complete"],
    )


COVERAGE_KEYS = frozenset({"cases", "attempted", "leftOut", "whole", "wholeProblem", "narrowedBy"})
"""`selection` keys that say what one shard covered of its own part: not a pin to agree on."""


def _check_pins(shards: Sequence[ShardRun]) -> None:
    for name in AGREE:
        values: dict[str, list[ShardRun]] = {}
        for one in shards:
            value = one.info.model_dump(by_alias=True).get(name)
            if name == "selection" and isinstance(value, dict):
                value = {k: v for k, v in value.items() if k not in COVERAGE_KEYS}
            values.setdefault(json.dumps(value, sort_keys=True), []).append(one)
        if len(values) > 1:
            said = "; ".join(
                f"{pin_rules.show(json.loads(v), 64)} in shard(s) "
                + ", ".join(f"{o.index}/{o.count} ({o.run_dir})" for o in holders)
                for v, holders in values.items()
            )
            raise MergeRefused(
                EXIT_PIN_MISMATCH,
                f"pin {name} differs between shards: {said}; every shard of a run must run "
                "under one configuration: re-run the odd shard(s) under the others' options",
            )


def _check_cases(shards: Sequence[ShardRun]) -> None:
    seen: dict[str, ShardRun] = {}
    for one in shards:
        for qid in sorted(one.qids):
            if qid in seen:
                raise MergeRefused(
                    EXIT_CASE_TWICE,
                    f"case {qid} is in two shards: {seen[qid].name} and {one.name}; a case "
                    "belongs to one shard (re-run the shards from one --eval-shard split)",
                )
            seen[qid] = one
            if shard_of(qid, one.count) != one.index:
                raise MergeRefused(
                    EXIT_CASE_TWICE,
                    f"case {qid} is in {one.name}, but the partition rule gives it to shard "
                    f"{shard_of(qid, one.count)}/{one.count}; that shard was not cut by "
                    "--eval-shard (re-run it)",
                )


def write_merged(found: MergePlan, out: Path) -> Path:
    """Write the merged run directory (built beside `out`, renamed into place)."""
    if (out / ledger.RUN_FILE).exists():
        raise MergeRefused(
            EXIT_USAGE, f"{out} already holds a run; give -o a new directory or remove it"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.parent / f".{out.name}.merging-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    try:
        _build(found, temp, out.name)
        if out.exists():
            out.rmdir()  # an empty directory made for us (a CI download step): ours now
        temp.rename(out)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return out


def _build(found: MergePlan, run_dir: Path, name: str) -> None:
    (run_dir / ledger.ARTIFACTS_DIR).mkdir(parents=True)
    with open(run_dir / ledger.EVENTS_FILE, "wb") as events:
        for one in found.shards:
            data = (one.run_dir / ledger.EVENTS_FILE).read_bytes()
            if data and not data.endswith(b"\n"):
                data += b"\n"
            events.write(data)
            artifacts = one.run_dir / ledger.ARTIFACTS_DIR
            if artifacts.is_dir():
                # Disjoint by construction: artifacts live under artifacts/<qid>/, and no case
                # is in two shards (checked before anything is written).
                shutil.copytree(artifacts, run_dir / ledger.ARTIFACTS_DIR, dirs_exist_ok=True)
        events.flush()
        os.fsync(events.fileno())
    # The merged ledger's own chain: each shard's was checked before a byte was copied.
    data = (run_dir / ledger.EVENTS_FILE).read_bytes()
    (run_dir / seal.CHAIN_FILE).write_bytes(seal.file_entries(data))
    ledger_writer.write_run_info(run_dir, _merged_info(found, name))
    closing = _closing(found)
    # Finished when the last shard finished, not when the merge ran.
    finished = [one.info.finished for one in found.shards if one.info.finished]
    if finished:
        closing["finished"] = max(finished)
    runs.finish_run(run_dir, interrupted=False, extra=closing)


def _merged_info(found: MergePlan, name: str) -> ledger.RunInfo:
    data = found.shards[0].info.model_dump(by_alias=True)
    for key in DROPPED:
        data.pop(key, None)
    starts = [one.info.started for one in found.shards]
    checks = sorted({one.info.golden_check for one in found.shards if one.info.golden_check})
    data.update(
        runId=name,
        label=name,
        # The merged run is one measurement of its own; its answers are its shards' (and a
        # second merge of the same shards shares them: `comparable` finds that).
        sessionId=f"merge-{uuid.uuid4().hex}",
        selection=merged_selection(found),
        started=min(starts),
        # `finish_run` keeps an aborted run aborted: a partial merge is one.
        status="running" if found.complete else "aborted",
        runGroup=found.group or None,
        goldenCheck="; ".join(checks) or None,
    )
    if not found.complete:
        data["abortReason"] = f"partial merge: {found.shortfall()}"
    return ledger.RunInfo.model_validate(data)


def merged_selection(found: MergePlan) -> dict[str, Any]:
    """The merged run's `selection`: the shards' common design, their whole-split records
    added up; whole only when every shard 1..N is there, complete and whole."""
    design = {
        k: v for k, v in (found.shards[0].info.selection or {}).items() if k not in COVERAGE_KEYS
    }
    cases = attempted = 0
    left: dict[str, dict[str, Any]] = {}
    narrowed: list[str] = []
    whole = found.complete
    for one in found.shards:
        selection = one.info.selection or {}
        whole = whole and selection.get("whole") is True
        cases += int(selection.get("cases") or 0)
        attempted += int(selection.get("attempted") or 0)
        narrowed += [n for n in selection.get("narrowedBy") or [] if n not in narrowed]
        for reason, entry in (selection.get("leftOut") or {}).items():
            into = left.setdefault(
                reason, {"count": 0, "qids": [], "allowed": entry.get("allowed")}
            )
            into["count"] += int(entry.get("count") or 0)
            into["qids"] = (into["qids"] + list(entry.get("qids") or []))[:10]
    if found.missing:
        left[f"not run: missing shard(s) {', '.join(map(str, found.missing))}"] = {
            "count": None,
            "qids": [],
            "allowed": False,
        }
    return {
        **design,
        "cases": cases if not found.missing else None,
        "attempted": attempted,
        "leftOut": left,
        "whole": whole,
        "narrowedBy": narrowed,
    }


def _closing(found: MergePlan) -> dict[str, Any]:
    """What closing the merged run records beyond its counts: the shards, and their limiter
    waits and durations added up."""
    from pytest_evalloop.model_api.ratelimit import merge_stats

    limiters = [one.info.limiter for one in found.shards]
    limiter = merge_stats(limiters)
    if limiter is not None:
        # Each shard's limit was its share of the key's: together they are the run's.
        for key in ("rpm", "tpm"):
            limiter[key] = sum(int((part or {}).get(key) or 0) for part in limiters)
    seconds = [_seconds(one.info) for one in found.shards]
    return {
        "limiter": limiter,
        "shards": [
            {
                "index": one.index,
                "runId": one.info.run_id,
                "status": one.info.status,
                "started": one.info.started,
                "finished": one.info.finished,
                "cases": len(one.qids),
                "seconds": _seconds(one.info),
                "costUsd": _cost(one.info),
                "limiter": one.info.limiter,
            }
            for one in found.shards
        ],
        "merged": {
            "count": found.count,
            "present": [one.index for one in found.shards],
            "missing": found.missing,
            "complete": found.complete,
            "shardSeconds": round(sum(s for s in seconds if s is not None), 3),
        },
    }


def _seconds(info: ledger.RunInfo) -> float | None:
    if not info.finished:
        return None
    try:
        start, end = datetime.fromisoformat(info.started), datetime.fromisoformat(info.finished)
    except ValueError:
        return None
    return (end - start).total_seconds()


def _cost(info: ledger.RunInfo) -> float | None:
    costs = [c.cost_usd for c in info.costs.values()]
    return None if any(c is None for c in costs) else round(sum(c or 0.0 for c in costs), 6)


# --- the command -----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalloop merge",
        description="Merge the shards of one sharded run (--eval-shard=I/N) into one run.",
        epilog=f"exit: 0 merged, {EXIT_INVALID} a shard does not validate, {EXIT_USAGE} bad "
        f"arguments, {EXIT_MISSING} a shard missing or incomplete, {EXIT_PIN_MISMATCH} a pin "
        f"differs, {EXIT_CASE_TWICE} a case in two shards, {EXIT_INDEX_TWICE} two shards claim "
        f"one index, {EXIT_OTHER_RUN} a shard of another run",
    )
    parser.add_argument("shards", nargs="+", type=Path, help="the shards' run directories")
    parser.add_argument("-o", "--output", required=True, type=Path, help="the merged run's dir")
    parser.add_argument(
        "--partial",
        action="store_true",
        help="write an aborted run when shards are missing or incomplete (it says which)",
    )
    return parser


def merge_main(argv: list[str], run_summary: Callable[..., list[str]]) -> int:
    """`evalloop merge`: refuse with the refusal's exit status, or write and summarise.

    `run_summary` is the terminal summary's lines for a stored run (`summary.RunSummary`'s
    fields in, `summary.summary_lines` out), handed in by `cli`: the summary is the pytest
    face's, which this stage sits below."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        found = plan([read_shard(p) for p in args.shards], partial=args.partial)
        out = write_merged(found, args.output)
    except MergeRefused as exc:
        print(f"evalloop merge: {exc}", file=sys.stderr)
        return exc.code
    except OSError as exc:
        print(f"evalloop merge: {exc}; nothing was merged", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(merged_lines(out, run_summary)))
    return EXIT_OK


def merged_lines(run_dir: Path, run_summary: Callable[..., list[str]]) -> list[str]:
    """The merged run's summary: the shards, then the run's figures as `evalloop report`
    prints them."""
    from pytest_evalloop.judge import judgesamples
    from pytest_evalloop.measure.shardrule import shard_note

    read = ledger_reader.read_run(run_dir)
    info = read.info
    assert info is not None  # just written
    merged = info.merged or {}
    lines = [
        f"merged {len(info.shards or [])} of {merged.get('count')} shards of run group "
        f"{info.run_group} into {run_dir}: {info.status}"
        + (f" ({info.abort_reason})" if info.abort_reason else "")
    ]
    for one in info.shards or []:
        lines.append(
            f"  shard {one['index']}/{merged.get('count')}: {one['runId']} ({one['status']}), "
            f"{one['cases']} cases, {one['seconds']} s"
        )
    lines.append(
        f"shard time added up: {merged.get('shardSeconds')} s; validate: "
        f"{'valid' if not read.errors else 'INVALID'}"
    )
    return lines + run_summary(
        run_dir=run_dir,
        label=info.label or run_dir.name,
        status=info.status or "?",
        tally=aggregates.tally(read),
        costs=aggregates.role_costs(read),
        judge_samples=judgesamples.summary(list(read.score_groups().values())),
        shards=shard_note(info),
    )
