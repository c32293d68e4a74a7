"""`evalloop loop <set>`: one batch of the loop, printed step by step.

Pick the target (local only) and pin the model (a first checkpoint when none exists), reuse the
latest comparable baseline or run one, diagnose it, improve the top model-owned cluster, run the
acceptance check (accept or revert), checkpoint. It stops at the first step that needs a person:
a golden suspect or an expert flag, a refused or empty candidate, only other owners' clusters
left, a step the budget cannot fit (`improve.budget`: every paid step runs under what is left). Each step is the command of its own (`evalloop diagnose`, `improve`, `accept`), called
as a function; the loop only sequences them and says what each did and cost.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from pytest_evalloop.improve import checkpoint, repo
from pytest_evalloop.improve import workcopy as wc
from pytest_evalloop.improve.workcopy import ImproveRefused
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.sets import cases as sets

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_HARNESS = 3
EXIT_STOPPED = 6
"""The loop stopped at a step that needs a person (or the edit was not accepted)."""


class Stop(Exception):
    """A step that needs a person: the message says which and why."""


def say(line: str) -> None:
    print(line, flush=True)


def comparable_baseline(
    runs_dir: Path, root: Path, files: list[Path], dataset_sha: str, set_dir: Path | None = None
) -> Path | None:
    """The latest complete baseline run whose model files (a clean commit) are the ones here
    now, and everything else a run of the set reads with them (`repo.same_read`: the set
    folder, its conftest.py, the pytest files above it), on this dataset, and that the
    comparability rule admits as a baseline (whole split, sealed, one model:
    `acceptance.baseline_refusals`), or None."""
    from pytest_evalloop.improve.acceptance import baseline_refusals

    found = []
    if not runs_dir.is_dir():
        return None
    for run in runs_dir.iterdir():
        try:
            info = ledger_reader.read_run_info(run)
        except (OSError, ValueError):
            continue
        if (
            info.phase == "baseline"
            and info.status == "complete"
            and info.dataset_sha == dataset_sha
            and info.model_git_sha
            and not info.model_git_sha.endswith("-dirty")
            and repo.same_files(root, info.model_git_sha, files)
            and (set_dir is None or repo.same_read(root, info.model_git_sha, set_dir, files))
        ):
            refused = baseline_refusals(run)
            if refused:
                say(f"   not reusing {run.name}: {refused[0]}")
                continue
            found.append((info.started, run))
    return max(found)[1] if found else None


def role_costs(runs: list[Path]) -> dict[str, ledger.RoleCost]:
    """What each role spent over the loop's runs (each run counted by `aggregates.role_costs`)."""
    from pytest_evalloop.measure import aggregates

    total: dict[str, ledger.RoleCost] = {}
    for run in dict.fromkeys(runs):
        for role, cost in aggregates.role_costs(ledger_reader.read_run(run)).items():
            into = total.setdefault(role, ledger.RoleCost())
            into.calls += cost.calls
            into.input_tokens += cost.input_tokens
            into.output_tokens += cost.output_tokens
            into.cache_read_tokens += cost.cache_read_tokens
            into.cache_creation_tokens += cost.cache_creation_tokens
            into.cost_usd = (
                None
                if into.cost_usd is None or cost.cost_usd is None
                else round(into.cost_usd + cost.cost_usd, 6)
            )
    return total


def cost_lines(costs: dict[str, ledger.RoleCost]) -> list[str]:
    lines = ["cost per role:"]
    for role, cost in costs.items():
        usd = "unknown" if cost.cost_usd is None else f"${cost.cost_usd:.4f}"
        lines.append(
            f"  {role:<10} {cost.calls:>4} calls  {cost.input_tokens:>8} in  "
            f"{cost.output_tokens:>7} out  {usd}"
        )
    return lines


def loop_main(argv: list[str]) -> int:
    """`evalloop loop <set>`."""
    parser = argparse.ArgumentParser(prog="evalloop loop", description=__doc__)
    parser.add_argument("set_dir")
    parser.add_argument("--improver-model", default="claude-opus-4-6")
    parser.add_argument("--diagnoser-model", default="claude-opus-4-6")
    parser.add_argument(
        "--reviewer-model", help="The expert review's model (default: the improver's)"
    )
    parser.add_argument("--no-review", action="store_true", help="Skip the expert review call")
    parser.add_argument(
        "--budget-usd",
        type=float,
        help="The most the whole loop may spend: every paid step runs under what is left",
    )
    parser.add_argument("--noise-band", type=int, help="Untargeted flips an A/A pair showed")
    parser.add_argument("--no-probes", action="store_true")
    args, arm_args = parser.parse_known_args(argv)
    set_dir = Path(args.set_dir)
    if not (set_dir / sets.SET_FILE).is_file():
        print(f"evalloop loop: {set_dir} has no set.json; give a set directory", file=sys.stderr)
        return EXIT_USAGE
    if args.budget_usd is not None and not args.budget_usd > 0:
        print(
            f"evalloop loop: --budget-usd must be above 0, got {args.budget_usd}", file=sys.stderr
        )
        return EXIT_USAGE
    if any(a.startswith("--eval-max-cost") for a in arm_args):
        print(
            "evalloop loop: give the loop's budget as --budget-usd; the loop hands each run "
            "what is left of it as --eval-max-cost",
            file=sys.stderr,
        )
        return EXIT_USAGE
    from pytest_evalloop.failures import HarnessError
    from pytest_evalloop.improve.budget import BudgetStop, LoopBudget
    from pytest_evalloop.improve.cli import quiet_sdk_logs

    quiet_sdk_logs()
    runs: list[Path] = []
    budget = LoopBudget(args.budget_usd)
    try:
        code = _walk(set_dir, args, arm_args, runs, budget)
    except (Stop, BudgetStop) as exc:
        say(f"STOP (needs a person): {exc}")
        code = EXIT_STOPPED
    except ImproveRefused as exc:
        say(f"STOP: {exc}")
        code = EXIT_USAGE
    except HarnessError as exc:
        say(f"STOP: harness error: {exc}")
        code = EXIT_HARNESS
    if runs:
        for line in cost_lines(role_costs(runs)):
            say(line)
    say(budget.last_line())
    return code


def _walk(
    set_dir: Path,
    args: argparse.Namespace,
    arm_args: list[str],
    runs: list[Path],
    budget: Any,
) -> int:
    from pytest_evalloop.improve import acceptance
    from pytest_evalloop.improve.cli import acceptance_lines, candidate_lines, improve_with_client

    config = sets.load_set_config(set_dir)
    files = wc.model_files(set_dir, config, None)
    root = repo.repo_root(set_dir)
    if root is None:
        raise ImproveRefused(f"{set_dir} is in no git repository; `git init` it first")
    dirty = repo.dirty_read(root, set_dir, files.files)
    if dirty:
        raise ImproveRefused(
            f"uncommitted changes in {', '.join(dirty)}: pytest reads these, and a dirty tree "
            "pins nothing; commit or stash them first"
        )
    head = repo.head_sha(root)
    say(f"1. target: {files.kind} (local), model files {', '.join(files.names)} at {head[:12]}")
    runs_dir = set_dir / "runs"
    dataset_sha = sets.dataset_sha(set_dir)
    baseline = comparable_baseline(runs_dir, root, list(files.files), dataset_sha, set_dir)
    if baseline is None:
        say("2. baseline: none on these model files and dataset; running one (both splits)")
        baseline = budget.run_step(
            "the baseline",
            lambda extra: _run_baseline(set_dir, runs_dir, config.name, [*arm_args, *extra], root),
        )
        runs.append(baseline)
        unfinished(baseline, "the baseline")
    else:
        say(f"2. baseline: reusing {baseline.name} (same model files, same dataset)")
        runs.append(baseline)
    say(f"   {_tally_line(baseline)}")
    errored = harness_errors(baseline)
    if errored:
        raise Stop(
            f"the baseline {baseline.name} has {len(errored)} harness error(s) "
            f"({', '.join(errored)}): a measurement with errors anchors no acceptance check; "
            "fix the target or the endpoint, then run a new baseline"
        )
    if not checkpoint.checkpoints(runs_dir):
        first = checkpoint.create(
            baseline, set_dir, files, root, issue_ids=[], candidate_id=None, ledgers=[baseline]
        )
        say(
            f"   checkpoint {first.label}: pins the model before improve ({(first.model_git_sha or '')[:12]})"
        )
    read = ledger_reader.read_run(baseline)
    if not read.issues():
        say("3. diagnose: the baseline's failed dev cases")
        _diagnose(baseline, set_dir, args, budget)
        read = ledger_reader.read_run(baseline)
    else:
        say("3. diagnose: reusing the baseline's issues")
    statuses = read.issue_statuses()
    issues = list(read.issues().values())
    for issue in issues:
        status = statuses.get(issue.issue_id)
        say(
            f"   {status.status if status else '?':<8} {issue.issue_id} [{issue.owner} / "
            f"{issue.component} / {issue.primary_code}] {len(issue.qids)} case(s)"
        )
    todo = [
        i
        for i in issues
        if i.owner == "model"
        and (statuses.get(i.issue_id) is None or statuses[i.issue_id].status == "open")
    ]
    if not todo:
        others = sorted({i.owner for i in issues if i.owner != "model"})
        raise Stop(
            "no open model-owned cluster"
            + (f"; left for other owners: {', '.join(others)}" if others else "")
        )
    issue = todo[0]
    say(f"4. improve: {issue.issue_id} ({len(issue.qids)} case(s): {', '.join(issue.qids)})")
    result = asyncio.run(
        improve_with_client(
            baseline,
            set_dir,
            issue.issue_id,
            args.improver_model,
            not args.no_probes,
            reviewer=None if args.no_review else (args.reviewer_model or args.improver_model),
            wrap=budget.client,
        )
    )
    for line in candidate_lines(result.candidate):
        say(f"   {line}")
    if result.candidate.status != "proposed":
        raise Stop(f"candidate {result.candidate.candidate_id} is {result.candidate.status}")
    say(f"5. acceptance check: two blind arms with {result.candidate.candidate_id} served")
    accepted = acceptance.accept_candidate(
        baseline,
        set_dir,
        result.candidate.candidate_id or "",
        noise_band=args.noise_band,
        arm_args=arm_args,
        budget=budget,
        on_arm=runs.append,
    )
    for line in acceptance_lines(accepted):
        say(f"   {line}")
    if accepted.halted:
        raise Stop(
            "the acceptance check halted before any run: "
            + (accepted.event.reason or "a golden suspect or an expert flag")
        )
    if accepted.checkpoint is not None:
        say(f"6. checkpoint: {accepted.checkpoint.label} ({accepted.checkpoint.model_git_sha})")
        return EXIT_OK
    say(f"6. checkpoint: none; the edit was {accepted.event.decision} and reverted")
    return EXIT_STOPPED


def unfinished(run: Path, what: str) -> None:
    """Stop when a run the loop paid for did not finish (its ceiling, four harness errors, a
    dead target): it measured a subset, and the loop decides on whole runs only."""
    info = ledger_reader.read_run_info(run)
    if info.status == "complete":
        return
    from pytest_evalloop.improve.budget import BudgetStop

    spend = info.spend or {}
    if spend.get("stopped"):
        raise BudgetStop(
            f"{what} {run.name} stopped before its share of the budget "
            f"(${float(spend.get('spentUsd') or 0):.4f} of ${float(spend.get('ceilingUsd') or 0):.4f}"
            "): raise --budget-usd, or lower what one attempt reserves (--eval-max-turns, "
            "--eval-max-tokens; docs/spend.md)"
        )
    raise Stop(f"{what} {run.name} ended {info.status}: it measured a subset; run it again")


def harness_errors(run: Path) -> list[str]:
    """The qids of a run's attempts that ended in a harness error (counted as every view
    counts them, `aggregates.tally`)."""
    from pytest_evalloop.measure import aggregates

    tally = aggregates.tally(ledger_reader.read_run(run))
    return list(dict.fromkeys(a.qid for a in tally.attempts if a.outcome == "harness_error"))


def _tally_line(run: Path) -> str:
    from pytest_evalloop.measure import aggregates

    tally = aggregates.tally(ledger_reader.read_run(run))
    counts = ", ".join(f"{n} {word}" for word, n in sorted(tally.outcomes.items()))
    return f"{run.name}: {counts}"


def _run_baseline(set_dir: Path, runs_dir: Path, name: str, extra: list[str], root: Path) -> Path:
    from pytest_evalloop.improve.acceptance import run_arm

    label = ledger_writer.next_label(runs_dir, name, "baseline")
    argv = [str(set_dir), "-p", "no:cacheprovider", "-q", f"--eval-label={label}", *extra]
    done = run_arm(argv, root)
    if not (runs_dir / label / ledger.RUN_FILE).is_file():
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise ImproveRefused(f"the baseline run wrote nothing (exit {done.returncode}):\n{tail}")
    return runs_dir / label


def _diagnose(run_dir: Path, set_dir: Path, args: argparse.Namespace, budget: Any) -> Any:
    from pytest_evalloop.diagnose import cli as diagnose_cli
    from pytest_evalloop.report.html import rewrite_report

    argv = [str(run_dir), "--set", str(set_dir), "--model", args.diagnoser_model]
    if args.no_probes:
        argv.append("--no-probes")
    code = diagnose_cli.diagnose_main(argv, views=rewrite_report, wrap=budget.client)
    if code != 0:
        raise Stop(f"evalloop diagnose exited {code}")
