"""`evalloop gate <baseline> <run> --eval-gate=bar`: the in-run gate, over a stored run.

CI runs the shards in parallel, merges them (`evalloop merge`) and gates once, at the end, on
the whole run. This command is that last step: it takes the in-run gate's options by the same
names and hands them to the same function the plugin calls when a run closes
(`measure.baseline.compare_run`), so the bar, targeted mode, the pin refusals, the record it
leaves on the run (`acceptance_check`, run.json `gate`) and the exit status (0, 6 gate rejected
/ unresolved / refused, 7 harness failure) are the in-run gate's. It then writes the run's
report and, with `--eval-summary-md`, the Markdown summary (`$GITHUB_STEP_SUMMARY`), as a run's
close does. A pair the comparability rule refuses (`measure.comparable`: a shard, an unfinished,
narrowed, changed or copied run, a rejudge pair, another design) is refused here as there.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_evalloop.ledger import files
from pytest_evalloop.measure.comparison import resolve_run
from pytest_evalloop.measure.gate import EXIT_GATE_REJECTED, EXIT_HARNESS_FAILURE, GATES

if TYPE_CHECKING:
    from pytest_evalloop.options import Settings

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalloop gate",
        description="Gate a stored run (a merged sharded run) against a baseline, as the "
        "in-run gate does.",
        epilog=f"exit: 0 accepted (or --eval-gate=off), {EXIT_USAGE} bad arguments (or, "
        "with --eval-gate=off, a run that cannot be read), "
        f"{EXIT_GATE_REJECTED} rejected/unresolved/refused (a shard alone is refused), "
        f"{EXIT_HARNESS_FAILURE} harness failure (a run that cannot be read or measured)",
    )
    parser.add_argument("baseline", help="the baseline run: a run directory or a label")
    parser.add_argument("run", type=Path, help="the run to gate: a (merged) run directory")
    parser.add_argument("--eval-gate", choices=GATES, default="bar", help="the gate (bar)")
    parser.add_argument("--eval-targets", help="targeted mode: q1,q2 or @file")
    parser.add_argument("--baseline2", help="a second post arm (targeted mode)")
    parser.add_argument("--eval-noise-band", type=int, help="flips an A/A pair showed")
    parser.add_argument("--eval-alpha", type=float, default=0.05)
    parser.add_argument("--eval-allow-pin-mismatch", action="store_true")
    parser.add_argument("--eval-summary-md", type=Path, help="write the Markdown summary here")
    parser.add_argument("--eval-report", choices=("on", "off"), default="on")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    parser.add_argument("-q", "--quiet", action="count", default=0)
    return parser


GateSettings = Callable[..., "Settings"]
"""`options.gate_settings`: every option at its default but the gate's (the face owns options)."""


def gate_main(argv: list[str], gate_settings: GateSettings) -> int:
    """Run `evalloop gate`; the exit status is the gate's. `cli` hands in `gate_settings`."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return _gate(args, gate_settings)
    except ValueError as exc:
        print(f"evalloop gate: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _gate(args: argparse.Namespace, gate_settings: GateSettings) -> int:
    from pytest_evalloop.measure.baseline import compare_run
    from pytest_evalloop.report.html import session_outputs
    from pytest_evalloop.session.runs import set_dir_of

    run_dir = args.run
    # Any run.json at all makes it a run; one that is no regular file is refused just below.
    if not os.path.lexists(run_dir / "run.json"):
        raise ValueError(f"{run_dir}: no run.json; give the run directory to gate")
    if args.baseline2 and not args.eval_targets:
        raise ValueError("--baseline2 is a second post arm for targeted mode; pass --eval-targets")
    set_dir = set_dir_of(run_dir)
    base_dir = resolve_run(args.baseline, set_dir=set_dir, runs_dir=run_dir.parent)
    # Refused up front (`ledger.files`): a run with a file that is a pipe, a directory or a
    # link cannot be measured, and nothing is written to it or beside it (no record, no report).
    refused = [line for run in (base_dir, run_dir) for line in files.refusal_lines(run)]
    if refused:
        for line in refused:
            print(f"evalloop gate: {line}", file=sys.stderr)
        return EXIT_HARNESS_FAILURE if args.eval_gate != "off" else EXIT_USAGE
    # The in-run gate's own function: the comparability rule, the pins, the bar, the record.
    outcome = compare_run(
        run_dir,
        _settings(args, str(base_dir), gate_settings),
        set_dir=set_dir,
        verbosity=args.verbose - args.quiet,
    )
    print("\n".join(outcome.lines))
    if outcome.verdict is None and outcome.exit_code is None:
        # Nothing was compared (a baseline that cannot be read) and no gate says 7: a command
        # asked to compare two runs that could not never exits 0 on it.
        return EXIT_USAGE
    written = session_outputs(
        [run_dir],
        baseline=str(base_dir),
        html=args.eval_report == "on",
        summary_md=args.eval_summary_md,
    )
    for line in written.get(run_dir, []):
        print(line)
    return outcome.exit_code or 0


def _settings(args: argparse.Namespace, baseline: str, gate_settings: GateSettings) -> Settings:
    """The settings `compare_run` reads, as the plugin would build them from the same flags."""
    return gate_settings(
        baseline=baseline,
        baseline2=args.baseline2,
        gate=args.eval_gate,
        alpha=args.eval_alpha,
        allow_pin_mismatch=args.eval_allow_pin_mismatch,
        targets=args.eval_targets,
        noise_band=args.eval_noise_band,
    )
