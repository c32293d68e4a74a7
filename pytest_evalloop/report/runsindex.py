"""The rows of the runs index (`runs/index.html`), kept from one close to the next.

Every session that closes a run rewrites its runs directory's index, and each row needs its
run's ledger read, its seal checked (the chain over every line, a digest of every artifact
file) and its verdicts counted. Done afresh, that is the whole history of the directory read
again at every close: the cost of a close grew with the number of runs beside it, and its
memory with the largest of them. A run whose files did not change since the last index gives
the same row, so each row is kept in `runs/.index-rows.json`, under a key that a change to
the run's files changes (`files_stamp`: the device, inode, size, modification and
status-change time of run.json, the ledger, the chain, the sidecar and every file and folder
under artifacts/), and made again from the ledger when the key moved.

What the key sees is what the kernel records of a change. An edit whose author put the
modification time back still moves the status-change time (ctime), which user space cannot set.
Two writes cannot hide behind each other's times either: a run whose files changed in the last
moments is not kept (`FilesStamp.settled_before`). What the key cannot see is a write the
kernel does not time: bytes changed through a shared memory map whose page was already dirty,
or an unmounted filesystem's inode edited by root. Neither is an accident, and the seal, the
same tamper-evidence, is no signature against them either (see `ledger.seal`).

The kept rows serve this page alone, as index.html itself does (which anyone can edit as
easily): the gate, flips, validate and the report read and check the ledger itself, every time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import seal as ledger_seal
from pytest_evalloop.measure import aggregates, comparable, stats
from pytest_evalloop.measure import pins as pin_rules
from pytest_evalloop.measure.comparison import seal_problem
from pytest_evalloop.measure.shardrule import shard_note

CACHE_FILE = ".index-rows.json"
"""Beside index.html: each run's row and the key of the files it was made from."""
CACHE_FORMAT = 1
REPORT_FILE = "report.html"

_INDEX_FIELDS = aggregates.FIELDS | {"at", "wall_seconds", "final_query", "answer_id"}
# Set per session from what is on disk, never kept: whether the report exists, and what the
# history marks (they depend on the other runs).
_UNKEPT = ("href", "changed", "compare_with")


def index_rows(runs_dir: Path, *, clock: Callable[[], int] = time.time_ns) -> list[dict[str, Any]]:
    """One row per run under `runs_dir`, newest first: pins and headline figures (`clock`:
    the time in ns, which decides whether a run's files have settled; the tests' to set)."""
    kept = _read_cache(runs_dir)
    fresh: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for child in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        if not (child / ledger.RUN_FILE).is_file():
            continue
        read_at = clock()
        stamp = files_stamp(child)
        entry = kept.get(child.name)
        hit = isinstance(entry, dict) and entry.get("key") == stamp.key
        row = _thawed(entry["row"]) if hit and isinstance(entry, dict) else None
        if row is None:
            row = made_row(child)
            if row is None:
                continue
        if hit or stamp.settled_before(read_at):
            # A run changed in the last moments is not kept: a rewrite within the same tick
            # of its files' clock would leave the key as it was (`FilesStamp.settled_before`).
            fresh[child.name] = {"key": stamp.key, "row": _frozen(row)}
        row["href"] = (
            quote(child.name) + "/" + REPORT_FILE if (child / REPORT_FILE).is_file() else None
        )
        row["changed"], row["compare_with"] = [], None
        rows.append(row)
    if fresh != kept:
        _write_cache(runs_dir, fresh)
    rows.sort(key=lambda r: r["started"] or "")
    _mark_history(rows)
    rows.reverse()
    return rows


_KEYED_FILES = (ledger.RUN_FILE, ledger.EVENTS_FILE, ledger_seal.CHAIN_FILE, ledger_seal.SEAL_FILE)
_FINE_CLOCK_NS = 100_000_000
_COARSE_CLOCK_NS = 2_000_000_000


@dataclass(frozen=True)
class FilesStamp:
    """What `files_stamp` read of a run's files."""

    key: str
    """A digest of every file's identity, size and times: a change to a file changes it."""
    newest_ns: int
    """The latest status-change time (ctime) among them, in ns."""
    whole_seconds: bool
    """Every ctime read was a whole second: a filesystem that keeps coarse times."""

    def settled_before(self, moment_ns: int) -> bool:
        """Whether every file last changed well before `moment_ns`, so that a later change
        shows in its times, not only in its bytes.

        A file's times come from a coarse clock (a jiffy, milliseconds; a whole second or two
        on some filesystems): a same-size rewrite within the same tick as the write before it
        leaves every time as it was. Read well after the last change, a later rewrite gets a
        later tick and the key moves (git's "racily clean" rule, for the same reason). Only
        ctime is read: a modification time set in the future says nothing of when.
        """
        margin = _COARSE_CLOCK_NS if self.whole_seconds else _FINE_CLOCK_NS
        return self.newest_ns < moment_ns - margin


def files_stamp(run_dir: Path) -> FilesStamp:
    """The stamp of a run's files (see the module's docstring). Strings and directory
    entries, not path objects: every close stamps every run beside it, each file of each."""
    base = os.fspath(run_dir)
    paths = [os.path.join(base, name) for name in _KEYED_FILES]
    folders = [os.path.join(base, ledger.ARTIFACTS_DIR)]
    while folders:
        folder = folders.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        # The folders too: a file removed changes its folder's times.
        paths.append(folder)
        for found in entries:
            (folders if found.is_dir(follow_symlinks=False) else paths).append(found.path)
    newest, whole = 0, True
    parts: list[bytes] = []
    for path in paths:
        # A name need not be UTF-8 (a folder copied from elsewhere): its bytes, as the OS has them.
        parts.append(os.fsencode(path[len(base) :]) + b"\0")
        try:
            st = os.stat(path)
        except OSError:
            parts.append(b"absent\n")
            continue
        newest = max(newest, st.st_ctime_ns)
        whole = whole and st.st_ctime_ns % 1_000_000_000 == 0
        parts.append(
            f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}\n".encode()
        )
    return FilesStamp(hashlib.sha256(b"".join(parts)).hexdigest(), newest, whole)


def made_row(run_dir: Path) -> dict[str, Any] | None:
    """A run's row read from its ledger (None: no readable run.json or ledger)."""
    try:
        # The counting rule's own kinds and fields, and what the comparability rule reads of
        # the attempts: a light read.
        read = ledger_reader.read_run(
            run_dir, kinds=aggregates.KINDS, validate=False, fields=_INDEX_FIELDS
        )
    except (OSError, ValueError):
        return None
    if read.info is None:
        return None
    info = read.info
    facts = comparable.facts_of(read, seal_problem(read))
    changed = facts.seal not in (None, "unsealed")
    # A run changed after it closed is counted as invalid: its rate is withheld.
    tally = aggregates.tally(
        read,
        status="invalid" if changed else None,
        invalid_reason=f"changed after it closed: {facts.seal}" if changed else None,
    )
    refused = comparable.alone(facts, "")
    if tally.withheld:
        refused.append(comparable.Refusal(rule="finished", why=f"withheld: {tally.withheld}"))
    rate = tally.pass_rate
    return {
        "name": info.label or info.run_id,
        "dir": run_dir.name,
        "status": info.status or "open",
        "shards": shard_note(info),
        "started": info.started,
        "phase": info.phase,
        "answerer": f"{info.answerer or '?'} / {info.answerer_model}",
        "judge": f"{info.judge_model or '?'} ({info.judge_version or '?'})",
        "dataset": f"{info.set_name or '?'} {(info.dataset_sha or '')[:12]}",
        "model": str(info.model_dump(by_alias=True).get("modelSha") or "")[:12],
        "outcomes": ", ".join(f"{n} {w}" for w, n in tally.outcomes.items()) or "none",
        "pass_rate": (
            f"withheld: {tally.withheld}"
            if tally.withheld
            else ("n/a" if rate is None else f"{rate:.1%} ({tally.passed}/{tally.decided})")
        ),
        "recall": None if tally.recall is None else f"{tally.recall:.2f}",
        "cases": _cases_text(info.selection or {}, tally),
        "decided": tally.decided,
        "rate": rate,
        "interval": stats.wilson(tally.passed, tally.decided) if rate is not None else None,
        "pins": pin_rules.pins_of(info.model_dump(by_alias=True)),
        "facts": facts,
        # Why the run is no history point and no baseline (`comparable.alone`).
        "not_comparable": list(dict.fromkeys(r.rule for r in refused)),
        "not_comparable_why": "; ".join(r.why for r in refused),
    }


def _frozen(row: dict[str, Any]) -> dict[str, Any]:
    """A row as JSON keeps it (the facts as their JSON form)."""
    kept = {k: v for k, v in row.items() if k not in _UNKEPT}
    kept["facts"] = row["facts"].model_dump(mode="json")
    return json.loads(json.dumps(kept))


def _thawed(kept: Any) -> dict[str, Any] | None:
    """A kept row as `made_row` gives it; None when it is not one (an older or hand-edited
    cache: the row is made again)."""
    try:
        row = dict(kept)
        row["facts"] = comparable.RunFacts.model_validate(row["facts"])
        if row["interval"] is not None:
            low, high = row["interval"]
            row["interval"] = (float(low), float(high))
        row["dir"], row["pins"], row["not_comparable"]  # noqa: B018 -- present, or remake
    except (TypeError, ValueError, KeyError):
        return None
    return row


def _read_cache(runs_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((runs_dir / CACHE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        return {}
    runs = data.get("runs")
    return runs if isinstance(runs, dict) else {}


def _write_cache(runs_dir: Path, runs: dict[str, Any]) -> None:
    # Atomic: two sessions closing at once each write a whole file; the loser's rows are made
    # again next time, never read half-written.
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{CACHE_FILE}.", dir=runs_dir)
    except OSError:
        return  # a read-only runs directory: the index is still right, only slower next time
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"format": CACHE_FORMAT, "runs": runs}, handle, separators=(",", ":"))
        os.replace(tmp, runs_dir / CACHE_FILE)
    except OSError:
        # Something else holds the name (a folder): no cache, and no temp file left behind.
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _cases_text(selection: dict[str, Any], tally: aggregates.Tally) -> str:
    # "1 of 16": the cases attempted of the split's, as run.json recorded when it closed.
    attempted, cases = selection.get("attempted"), selection.get("cases")
    if isinstance(attempted, int) and isinstance(cases, int):
        return f"{attempted} of {cases}"
    return f"{len({a.qid for a in tally.attempts})} (split not recorded)"


def _mark_history(rows: list[dict[str, Any]]) -> None:
    # Oldest first: each run's breaking pins against the run before it, and the latest earlier
    # run it may be compared with: no breaking pin differs and the comparability rule admits
    # the pair (both whole, finished, sealed, independent, one design).
    for i, row in enumerate(rows):
        if i:
            diffs = pin_rules.classify(rows[i - 1]["pins"], row["pins"]).breaking
            row["changed"] = [d.name for d in diffs]
        if row["not_comparable"]:
            continue
        for earlier in reversed(rows[:i]):
            if pin_rules.classify(earlier["pins"], row["pins"]).breaking:
                continue
            if not comparable.refusals(earlier["facts"], row["facts"]):
                row["compare_with"] = earlier["dir"]
                break
