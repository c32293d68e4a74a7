"""Run directories: which one a session writes to, how it starts and how it ends.

Every process of a pytest session (the controller and each xdist worker) may be the first to
need the run of a set. They agree on one directory through the session id the controller hands
to its workers: under a lock on the runs directory, the first process creates the run and every
later one finds it by that id. So there is one consistent ledger per run whatever `-n` is.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop import __version__
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.measure import aggregates, repeats
from pytest_evalloop.session.claims import WriterClaims, resuming
from pytest_evalloop.session.runchoice import (
    check_label_free,
    check_resume_design,
    check_resume_pins,
    check_resume_seal,
    resumable_run,
)
from pytest_evalloop.session.selection import Closing, selection_facts
from pytest_evalloop.sets import cases as sets

if TYPE_CHECKING:
    from pytest_evalloop.model_api.pricing import PriceTable


@dataclass(frozen=True)
class RunRequest:
    """What a process knows when it needs the run of a set."""

    set_dir: Path
    set_config: sets.SetConfig
    runs_dir: Path | None
    label: str | None
    phase: str
    session_id: str
    target: str
    answerer: str
    answerer_model: str
    resume: str | None
    judge_model: str | None
    judge_version: str | None
    rubric_sha: str | None
    extra: dict[str, Any]
    pins: dict[str, Any] | None = None
    """Pins the roles know beyond their names: the target's (`targetProfile`, `modelSha`),
    the answerer's version; a rejudge's target brings the source run's answerer pins."""


def configured_pins(request: RunRequest) -> dict[str, Any]:
    """The run.json pins a run opened for this request records (and a resume must match)."""
    return {
        "target": request.target,
        "answerer": request.answerer,
        "answererModel": request.answerer_model,
        "judgeModel": request.judge_model,
        "judgeVersion": request.judge_version,
        "rubricSha": request.rubric_sha,
        "datasetSha": sets.dataset_sha(request.set_dir),
        "harnessVersion": HARNESS_VERSION,
        "harnessCommit": harness_commit(),
        **{k: v for k, v in (request.pins or {}).items() if v is not None},
    }


HARNESS_VERSION = f"pytest-evalloop {__version__}"


@functools.cache
def harness_commit(package_dir: Path | None = None) -> str | None:
    """The git commit of the harness's source, `-dirty` when its files differ from it.

    `harnessVersion` stays the same between commits, so two runs of a source checkout name
    the commit they ran. Only a checkout whose top level holds this package counts (a package
    installed into another project's tree is not that project's commit); None otherwise, or
    without git. Asked once per process.
    """
    import subprocess

    package = package_dir or Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(package), *args],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() / package.name != package:
        return None
    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    # Tracked edits of the package only: a user's evals beside it do not change the harness.
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return f"{commit}-dirty" if changed else commit


def runs_dir_for(set_dir: Path, runs_dir: Path | None) -> Path:
    """Where a set's runs live: `--eval-runs-dir`, else `<set>/runs`."""
    return runs_dir if runs_dir is not None else set_dir / "runs"


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".evalloop.lock", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def open_run(request: RunRequest, claims: WriterClaims | None = None) -> Path:
    """The run directory of this session for this set, created with its `run.json` if new;
    held in `claims` (taken under the runs directory's lock, so no resume slips in between)."""
    parent = runs_dir_for(request.set_dir, request.runs_dir)
    with _locked(parent):
        run_dir = _find_session_run(parent, request.session_id, request.set_dir)
        if run_dir is None:
            opened = _reopen if request.resume else _start
            run_dir = opened(request, parent, claims)
        if claims is not None:
            claims.claim(run_dir)
        return run_dir


def _start(request: RunRequest, parent: Path, claims: WriterClaims | None) -> Path:
    label = request.label or ledger_writer.next_label(
        parent, request.set_config.name, request.phase
    )
    # The second fence after the option's pattern: a run directory is a child of runs/.
    run_dir = ledger_writer.contained_dir(parent, label)
    check_label_free(parent, label)
    run_dir.mkdir(parents=True, exist_ok=True)
    if claims is not None:
        claims.claim(run_dir)  # before its run.json: no resume ever finds it unclaimed
    ledger_writer.write_run_info(run_dir, _run_info(request, label))
    (run_dir / ledger.ARTIFACTS_DIR).mkdir(exist_ok=True)
    return run_dir


def _reopen(request: RunRequest, parent: Path, claims: WriterClaims | None) -> Path:
    """`--eval-resume`: adopt an unfinished run as this session's, appending to its ledger."""
    run_dir = resumable_run(request.resume or "", request.set_dir, parent)
    with resuming(run_dir):
        check_resume_design(
            request.resume or "",
            run_dir,
            request.extra.get("selection") or {},
            {"shard": request.extra.get("shard"), "runGroup": request.extra.get("runGroup")},
        )
        check_resume_pins(request.resume or "", run_dir, configured_pins(request))
        check_resume_seal(request.resume or "", run_dir)
        if claims is not None:
            claims.claim(run_dir)  # checked and claimed in one turn (`claims.resuming`)
        # Reopened: its seal is made anew over the whole ledger when this session closes it.
        ledger_writer.unseal_run(run_dir)
        # The set as this session reaches it: its processes find the run by session and set.
        ledger_writer.update_run_info(
            run_dir,
            sessionId=request.session_id,
            status="running",
            setDir=str(request.set_dir.resolve()),
        )
    return run_dir


def session_runs(set_dirs: Iterable[Path], runs_dir: Path | None, session_id: str) -> list[Path]:
    """The run each of `set_dirs` holds for `session_id`, where one was opened: what an xdist
    controller closes when its workers were stopped before any result named their runs."""
    found: dict[Path, None] = {}
    for set_dir in set_dirs:
        parent = runs_dir_for(set_dir, runs_dir)
        run_dir = _find_session_run(parent, session_id, set_dir) if parent.is_dir() else None
        if run_dir is not None:
            found[run_dir] = None
    return list(found)


def _find_session_run(parent: Path, session_id: str, set_dir: Path) -> Path | None:
    """This session's run of `set_dir` under `parent`. The set counts, not the session alone:
    sets that share one `--eval-runs-dir` each have their own run in a session (the first
    found by session id took every set's attempts into one run). A link is no run of its
    own: under it, one run would be closed twice, once by each name."""
    own_set = str(set_dir.resolve())
    for child in sorted(parent.iterdir()):
        info_path = child / ledger.RUN_FILE
        if child.is_symlink() or not info_path.is_file():
            continue
        try:
            info = ledger_reader.read_run_info(child)
        except (OSError, ValueError):
            continue
        if info.session_id == session_id and info.set_dir == own_set:
            return child
    return None


def _run_info(request: RunRequest, label: str) -> ledger.RunInfo:
    config = request.set_config
    return ledger.RunInfo.model_validate(
        {
            "runId": label,
            "label": label,
            "sessionId": request.session_id,
            "phase": request.phase,
            "started": ledger.now_iso(),
            "status": "running",
            "setName": config.name,
            "datasetVersion": config.dataset_version,
            "mode": "measure",
            "modelGitSha": local_model_git_sha(request),
            "setDir": str(request.set_dir.resolve()),
            **configured_pins(request),
            **request.extra,
        }
    )


def local_model_git_sha(request: RunRequest) -> str | None:
    """`modelGitSha` of a local target (the embedded model, a local Malloy package): the commit
    its model files are at, `-dirty` when they or anything else a run of the set reads (an
    untracked conftest.py, `repo.dirty_read`) differ from it; None for a remote target, where a
    local commit pins nothing."""
    if not request.target.startswith(("embedded:", "malloy:")):
        return None
    from pytest_evalloop.improve import repo, workcopy

    try:
        files = workcopy.model_files(request.set_dir, request.set_config, None)
    except workcopy.ImproveRefused:
        return None
    return repo.model_git_sha(list(files.files), request.set_dir)


CLOSE_KINDS = frozenset({"attempt", "score"}) | aggregates.KINDS
CLOSE_FIELDS = (
    frozenset(
        {
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "cache_creation_tokens",
            "cost_usd",
            "servedRevision",
            "modelSha",
            "judge_sample",
            "reexecution",
            "model",
            "num_turns",
            "judge_model",
            "judge_attempts",
        }
    )
    | aggregates.FIELDS
)
"""What closing a run reads of its events: `role_costs` and the tally need no more."""


def set_dir_of(run_dir: Path) -> Path | None:
    """The set a run measured: the one its run.json names (`setDir`), else the set whose
    `runs/` it sits in; None when neither is a set."""
    try:
        named = ledger_reader.read_run_info(run_dir).set_dir
    except (OSError, ValueError):
        named = None
    for candidate in ([Path(named)] if named else []) + [run_dir.parent.parent]:
        if (candidate / "set.json").is_file():
            return candidate
    return None


def read_for_close(run_dir: Path) -> ledger_reader.RunLedger:
    """A run's attempts and scores, unvalidated and with only the fields closing needs.

    Our own lines were validated when written; reading them again as models would cost a
    10,000-case run seconds at its end, for totals that need seven numbers per line. Nothing
    only a comparison reads (final queries, times): the gate reads its own from disk, and
    this read is held while the summary counts.
    """
    read = ledger_reader.read_run(run_dir, kinds=CLOSE_KINDS, validate=False, fields=CLOSE_FIELDS)
    # The chain too: a line written around the writer makes the run invalid, as validate says.
    ledger_reader.check_seal(read)
    return read


def finish_run(
    run_dir: Path,
    *,
    interrupted: bool,
    extra: dict[str, Any] | None = None,
    totals: bool = True,
    prices: PriceTable | None = None,
    closing: Closing | None = None,
    claims: WriterClaims | None = None,
    on_wait: Callable[[float], None] | None = None,
) -> ledger_reader.RunLedger:
    """Close a run: totals counted from its event lines, and its final status.

    A run another process already marked `aborted` stays aborted; one whose ledger does not
    validate is never `complete`: it is `invalid`, with `invalidReason`. `totals` (an eval
    run's verdict counts, pass rate and recall, from `aggregates.tally`) is off for runs whose
    attempts are not judged cases (skill runs). Returns what it read (the ledger's `info` as
    it was before closing), so a summary need not read the events again. With `claims`,
    a run another live process still writes is left as it is, running (`claims.closing`,
    which calls `on_wait` if it has to wait).
    """
    if claims is not None and not claims.closing(run_dir, on_wait=on_wait):
        # Another process still appends (a worker, when the controller alone was stopped):
        # sealed now, the run would be invalid with that worker's next line. Left running and
        # unsealed, `--eval-resume` finishes it once that process is gone.
        return read_for_close(run_dir)
    read = read_for_close(run_dir)
    if read.info is None or read.info.seal is not None:
        return read  # unreadable, or closed (and sealed) already: nothing to rewrite
    status = read.info.status
    selection = None
    if closing is not None:
        selection = selection_facts(run_dir, read, closing, status or "running")
        # Cases of the split left unanswered for no reason a flag or the golden gate gives (a
        # stop, a second Ctrl-C whatever the exit status says): the run did not finish.
        interrupted = interrupted or any(
            reason.startswith("not run") for reason in selection.get("leftOut") or {}
        )
    if status not in ("aborted",):
        status = "interrupted" if interrupted else "complete"
    broken = invalid_reason(read)
    if broken is not None and status == "complete":
        status = "invalid"
        extra = {**(extra or {}), "invalidReason": broken}
    costs = aggregates.role_costs(read)
    tally = aggregates.tally(read, status=status, invalid_reason=broken)
    if selection is not None:
        extra = {**(extra or {}), "selection": selection}
    if extra and extra.get("spend"):
        # What the session spent, beside what the run recorded of its prices when it opened.
        extra = {**extra, "spend": {**(read.info.spend or {}), **extra["spend"]}}
    changes: dict[str, Any] = {
        "status": status,
        "finished": ledger.now_iso(),
        "costs": {role: cost.model_dump() for role, cost in costs.items()},
        "answererCostUsd": costs["answerer"].cost_usd,
        "judgeCostUsd": costs["judge"].cost_usd,
        "costFigures": role_cost_figures(read, costs, prices),
        "doubtedGoldens": tally.doubted,
        **served_pins(read),
        **re_executed(read),
        **({"totals": run_totals(read, tally)} if totals else {}),
    }
    # `extra` may set any of them (a merge: when its last shard finished), before the seal.
    ledger_writer.update_run_info(run_dir, **{**changes, **(extra or {})})
    # Whatever became of it, a closed run is sealed: a later change to it shows (validate,
    # every gate), and a resume checks it before appending.
    ledger_writer.seal_run(run_dir)
    return read


def role_models(info: ledger.RunInfo | None) -> dict[str, str | None]:
    """Each role's model as run.json records it."""
    if info is None:
        return {}
    return {"answerer": info.answerer_model, "judge": info.judge_model}


def role_cost_figures(
    read: ledger_reader.RunLedger,
    costs: dict[str, ledger.RoleCost],
    prices: PriceTable | None,
) -> dict[str, dict[str, float | None]]:
    """run.json `costFigures`: per role, `pricing.cost_figures` over the run's cases."""
    from pytest_evalloop.model_api.pricing import PriceTable, cost_figures

    table = prices if prices is not None else PriceTable()
    models = role_models(read.info)
    # Per attempt of a case (its answer and its judging): what one more attempt costs.
    cases = len(read.attempts())
    out = {}
    for role in ("answerer", "judge"):
        cost = costs.get(role)
        if cost is None or cost.calls == 0:
            continue
        out[role] = cost_figures(
            table,
            models.get(role),
            input_tokens=cost.input_tokens,
            output_tokens=cost.output_tokens,
            cache_read_tokens=cost.cache_read_tokens,
            cache_creation_tokens=cost.cache_creation_tokens,
            cost_usd=cost.cost_usd,
            cases=cases,
        )
    return out


INVALID_SHOWN = 3
"""How many of a broken ledger's errors `invalidReason` quotes."""


def invalid_reason(read: ledger_reader.RunLedger) -> str | None:
    """Why a read ledger does not validate (its first errors), or None when it does.

    The light read closing does finds what `evalloop validate` finds: torn or foreign lines
    are validated on every read, and two scores for one attempt are counted on every read.
    """
    errors = read.errors
    if not errors:
        return None
    shown = "; ".join(f"{f.where.rsplit('/', 1)[-1]}: {f.message}" for f in errors[:INVALID_SHOWN])
    more = f" (+{len(errors) - INVALID_SHOWN} more)" if len(errors) > INVALID_SHOWN else ""
    return (
        f"{len(errors)} ledger error{'s' if len(errors) != 1 else ''}: {shown}{more}; "
        "see `evalloop validate`"
    )


def re_executed(read: ledger_reader.RunLedger) -> dict[str, Any]:
    """`predictionsReExecuted`, truthfully: whether every submitted attempt's final query was
    re-executed by the conductor (rows or the target's error), so the judge saw what the query
    did, not the answerer's report. Left as it is when no attempt says (older runs)."""
    states = [getattr(a, "reexecution", None) for a in read.attempts().values()]
    known = [s for s in states if s is not None and s != "no_query"]
    if not known:
        return {}
    return {"predictionsReExecuted": all(s in ("ok", "failed") for s in known)}


def served_pins(read: ledger_reader.RunLedger) -> dict[str, Any]:
    """What the target reported serving, from the attempt lines: `servedRevision` (a list
    when it changed mid-run), and `modelSha` when run.json could not pin it up front."""
    out: dict[str, Any] = {}
    attempts = read.of_kind("attempt")
    revisions = sorted({a.servedRevision for a in attempts if a.servedRevision})
    if revisions:
        out["servedRevision"] = revisions[0] if len(revisions) == 1 else revisions
    reported = sorted({a.modelSha for a in attempts if a.modelSha})
    if reported and read.info is not None and read.info.model_sha is None:
        # Several content shas in one run: the model changed under it, and no one sha is true.
        out["modelSha"] = reported[0] if len(reported) == 1 else "mixed: " + ", ".join(reported)
    if read.info is not None:
        out |= _served_role_model(
            "answererModel",
            read.info.answerer_model,
            # An attempt that made no request served nothing (its model is the configured id).
            [a.model for a in attempts if a.num_turns],
        )
        scores = read.of_kind("score")
        out |= _served_role_model(
            "judgeModel",
            read.info.judge_model,
            [s.judge_model for s in scores if s.judge_attempts],
        )
    return out


def _served_role_model(key: str, configured: str | None, served: list[Any]) -> dict[str, Any]:
    """The model a role's calls say was served, pinned in place of the configured id when it
    differs (the configured one kept as `<key>Configured`); several served: "mixed: a, b".

    The gate compares what answered and judged, not what was asked for; the check before a
    run (`flagcheck`) can only know the configured id and compares that."""
    names = sorted({m for m in served if isinstance(m, str) and m})
    if not names or names == [configured]:
        return {}
    pinned = names[0] if len(names) == 1 else "mixed: " + ", ".join(names)
    return {key: pinned, f"{key}Configured": configured}


def run_totals(read: ledger_reader.RunLedger, tally: aggregates.Tally) -> dict[str, Any]:
    """`run.json` totals: the tally's figures, with repeats and judge samples when there are."""
    from pytest_evalloop.judge import judgesamples

    judged = judgesamples.summary(list(read.score_groups().values()))
    return {
        **tally.totals(),
        **repeats.totals(repeats.figures(tally)),
        **({"judgeSamples": judged} if judged else {}),
    }


def mark_aborted(run_dir: Path, reason: str) -> None:
    """Record that the run stopped early (four consecutive harness errors)."""
    ledger_writer.update_run_info(run_dir, status="aborted", abortReason=reason)


class AbortCheck:
    """Whether some process of a run aborted it: asked before every attempt.

    `run.json` is parsed again only when its stat changed (it is replaced by rename on every
    write, so a write always gives it a new inode).
    """

    def __init__(self) -> None:
        self._known: dict[Path, tuple[tuple[int, int, int], str | None]] = {}

    def __call__(self, run_dir: Path) -> str | None:
        """The abort reason when the run was aborted, else None."""
        try:
            stat = (run_dir / ledger.RUN_FILE).stat()
        except OSError:
            return None
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        known = self._known.get(run_dir)
        if known is not None and known[0] == stamp:
            return known[1]
        try:
            info = ledger_reader.read_run_info(run_dir)
        except (OSError, ValueError):
            return None
        reason = (info.abort_reason or "aborted") if info.status == "aborted" else None
        self._known[run_dir] = (stamp, reason)
        return reason
