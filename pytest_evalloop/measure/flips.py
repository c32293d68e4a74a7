"""`evalloop flips A B`: two stored runs compared on the command line.

The comparison is `comparison`'s, the decision `gate`'s and the text `comparison_text`'s; this
module reads the arguments, finds the runs and the noise band, and turns the verdict into the
exit status. `run_command` is the argument-error and exit-status wrapper `evalloop noise`
shares.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from pytest_evalloop.ledger.gcpolicy import gc_paused
from pytest_evalloop.ledger.reader import RunLedger
from pytest_evalloop.measure import aggregates
from pytest_evalloop.measure import pins as pin_rules
from pytest_evalloop.measure.calibration import (
    CALIBRATION_FILE,
    Calibration,
    CalibrationBand,
    load_calibration,
    render_block,
    today,
)
from pytest_evalloop.measure.comparison import (
    Comparison,
    RunView,
    UnreadableRunError,
    compare,
    natural_key,
    read_compared,
    resolve_run,
    run_view,
)
from pytest_evalloop.measure.comparison_text import NOISE_BAND_FLAG, report_lines
from pytest_evalloop.measure.gate import (
    EXIT_GATE_REJECTED,
    EXIT_HARNESS_FAILURE,
    GATES,
    decide_gate,
    parse_targets,
    targeted,
)
from pytest_evalloop.measure.significance import BAR_SIGNIFICANT, DEFAULT_ALPHA, paired_tests
from pytest_evalloop.measure.significance import lines as paired_lines

EXIT_USAGE = 2
"""Bad arguments, a run that cannot be found or read, a pair that cannot be compared."""


def run_command(
    prog: str,
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], int],
    argv: list[str],
) -> int:
    """Parse `argv` and run: argparse's own status for `--help` and bad arguments, and for a
    ValueError one line `<prog>: <why>` on stderr and EXIT_USAGE, never a traceback."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return run(args)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalloop flips",
        description="Compare two stored runs case by case: flips, the acceptance bar, targets.",
        epilog=f"exit: 0 ok, {EXIT_USAGE} bad arguments, {EXIT_GATE_REJECTED} gate rejected/"
        f"unresolved/refused, {EXIT_HARNESS_FAILURE} harness failure (with --gate)",
    )
    parser.add_argument("baseline", help="baseline run: a run directory or a label")
    parser.add_argument("current", help="current (post-edit) run: a run directory or a label")
    parser.add_argument("--set", dest="set_dir", type=Path, help="set directory (labels in runs/)")
    parser.add_argument("--runs-dir", type=Path, help="where labelled runs live")
    parser.add_argument("--targets", help="targeted mode: q1,q2 or @file, named before the run")
    parser.add_argument("--noise-band", type=_band_arg, help="flips an A/A pair measured")
    parser.add_argument("--b2", help="a second post-edit run (targeted mode)")
    parser.add_argument("--gate", choices=GATES, help="exit non-zero unless this gate accepts")
    parser.add_argument(
        "--alpha",
        type=_alpha_arg,
        default=DEFAULT_ALPHA,
        help=f"with --gate {BAR_SIGNIFICANT}: the paired p-value must be under this "
        f"(default {DEFAULT_ALPHA})",
    )
    parser.add_argument(
        "--allow-pin-mismatch",
        action="store_true",
        help="gate even though pins differ (a rebase, not a delta)",
    )
    parser.add_argument(
        "--calibration",
        action="store_true",
        help="print a CALIBRATION.md block for the pair as an A/A",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0)
    parser.add_argument("-q", "--quiet", action="count", default=0)
    return parser


def _band_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a flip count; pass a whole number >= 0 from an A/A pair"
        )
    return value


def _alpha_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a level; pass a number in (0, 1)")
    return value


def flips_main(argv: list[str]) -> int:
    """`evalloop flips A B ...`: print the flip table; with --gate, exit with its code."""
    return run_command("evalloop flips", _parser(), _run, argv)


def _run(args: argparse.Namespace) -> int:
    if args.b2 and not args.targets:
        raise ValueError(
            "--b2 is a second post arm for targeted mode; name the targets with "
            "--targets q1,q2 (chosen before the run)"
        )
    targets = parse_targets(args.targets) if args.targets else None
    find = {"set_dir": args.set_dir, "runs_dir": args.runs_dir}
    base_dir, cur_dir = resolve_run(args.baseline, **find), resolve_run(args.current, **find)
    b2_dir = resolve_run(args.b2, **find) if args.b2 else None
    try:
        base_led = read_compared(base_dir)
        cur_led = read_compared(cur_dir)
        post2 = run_view(read_compared(b2_dir)) if b2_dir else None
        with gc_paused():  # a view per case per run, and no cycle among them (see gc_paused)
            # One tally per run serves its view, the paired tests and the harness check.
            tallies = (aggregates.tally(base_led), aggregates.tally(cur_led))
            base, cur = run_view(base_led, tallies[0]), run_view(cur_led, tallies[1])
            # The comparability rule (`comparable`) is asked here, as by every gate.
            comparison = compare(base, cur, second=post2)
    except UnreadableRunError as exc:
        # A run found but not readable (its run.json, or a ledger file that is a pipe, a
        # directory, a link: `ledger.files`): 2 like any run that cannot be read, and under a
        # gate 7, as `evalloop gate` and the in-run gate say of a run that cannot be measured.
        if not args.gate or args.gate == "off":
            raise
        print(f"evalloop flips: {exc}", file=sys.stderr)
        return EXIT_HARNESS_FAILURE
    if args.calibration:
        return _print_calibration(comparison, base, cur)
    band = _find_band(args, base, cur, base_led)
    noise = band.band if band else None
    report = None
    if targets is not None:
        report = targeted(base, cur, post2, targets, noise)
    paired = paired_tests(comparison, base_led, cur_led, tallies)
    verdict = None
    if args.gate:
        verdict = decide_gate(
            args.gate,
            comparison,
            allow_pin_mismatch=args.allow_pin_mismatch,
            targeted=report,
            override_flag="--allow-pin-mismatch",
            paired=paired,
            alpha=args.alpha,
        )
    lines = report_lines(
        comparison,
        verdict,
        report,
        baseline_label=base.name,
        current_label=cur.name,
        band=band,
        verbosity=args.verbose - args.quiet,
    )
    lines += paired_lines(paired, args.alpha)
    print("\n".join(lines))
    failures = [t.harness_failure for t in tallies if t.harness_failure]
    for failure in failures:
        print(f"HARNESS FAILURE: {failure}", file=sys.stderr)
    if args.gate and args.gate != "off" and failures:
        return EXIT_HARNESS_FAILURE
    return verdict.exit_code if verdict else 0


def _find_band(
    args: argparse.Namespace, base: RunView, cur: RunView, base_led: RunLedger
) -> CalibrationBand | None:
    if args.noise_band is not None:
        # A band given by hand belongs to this pair by the user's word; say so in the report.
        return CalibrationBand(
            band=args.noise_band,
            measured=today(),
            runs=[base.run_id, cur.run_id],
            pins=dict(cur.pins),
            source=NOISE_BAND_FLAG,
        )
    set_dir = args.set_dir
    if set_dir is None and base_led.run_dir.parent.name == "runs":
        set_dir = base_led.run_dir.parent.parent
    if set_dir is None:
        return None
    calibration: Calibration = load_calibration(set_dir / CALIBRATION_FILE)
    for problem in calibration.problems:
        print(f"warning: {problem}", file=sys.stderr)
    band = calibration.band_for(cur.pins)
    return band if band is not None and band.matches(base.pins) else None


def _print_calibration(c: Comparison, base: RunView, cur: RunView) -> int:
    # An A/A pair is one configuration twice: no breaking pin and not the model may differ.
    differ = c.pin_diffs + c.model_change
    if differ:
        names = ", ".join(d.name for d in differ)
        raise ValueError(
            f"not an A/A pair: pins differ ({names}): {pin_rules.describe(differ)}; run both "
            "arms under one configuration to measure a band"
        )
    if c.refused:
        # An A/A band from runs that are not whole, finished, independent measurements of one
        # design would be quoted for every later comparison: the same rule as a gate.
        raise ValueError("not an A/A pair the band can rest on: " + "; ".join(c.refused))
    band = CalibrationBand(
        band=c.flips,
        measured=today(),
        runs=[base.run_id, cur.run_id],
        pins=dict(cur.pins),
        scoredInBoth=c.scored_in_both,
        flipped=sorted([f.qid for f in c.better + c.worse], key=natural_key),
    )
    print(render_block(band), end="")
    lines = report_lines(
        c, None, None, baseline_label=base.name, current_label=cur.name, band=None, verbosity=-1
    )
    print("\n".join(lines), file=sys.stderr)
    return 0
