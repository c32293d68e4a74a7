"""This session's run against a baseline: the flip report, the gate, and the exit status.

Runs on the controller, after the run was closed. The arithmetic and the text are the pure
functions of :mod:`pytest_evalloop.measure.comparison`, :mod:`pytest_evalloop.measure.gate` and
:mod:`pytest_evalloop.measure.comparison_text`; this module only gathers their inputs from the
settings and the stored runs, and records the decision (run.json, an `acceptance_check` event,
junitxml properties).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.measure import significance
from pytest_evalloop.measure.calibration import CALIBRATION_FILE, load_calibration
from pytest_evalloop.measure.comparison import (
    Comparison,
    RunView,
    compare,
    read_compared,
    resolve_run,
    run_view,
)
from pytest_evalloop.measure.comparison_text import report_lines
from pytest_evalloop.measure.gate import (
    EXIT_HARNESS_FAILURE,
    GateVerdict,
    acceptance_event,
    decide_gate,
    harness_failure,
    parse_targets,
    targeted,
)

if TYPE_CHECKING:
    from pytest_evalloop.options import Settings


@dataclass
class GateOutcome:
    """What the comparison printed and decided."""

    lines: list[str] = field(default_factory=list)
    verdict: GateVerdict | None = None
    exit_code: int | None = None
    """None: leave pytest's exit status alone (no gate)."""
    properties: dict[str, str] = field(default_factory=dict)


def compare_run(
    run_dir: Path, settings: Settings, *, set_dir: Path | None, verbosity: int
) -> GateOutcome:
    """Compare a closed run with `--baseline` (and `--baseline2`), applying `--eval-gate`."""
    gated = settings.gate != "off"
    current_read = read_compared(run_dir)
    which = "baseline"
    try:
        base_dir = resolve_run(settings.baseline or "", set_dir=set_dir, runs_dir=run_dir.parent)
        base_read = read_compared(base_dir)
        baseline = run_view(base_read)
        which = "this run"  # the message names the run that could not be read
        current = run_view(current_read)
        which = "baseline2"
        post2 = _second_arm(settings, set_dir, run_dir)
    except ValueError as exc:
        out = GateOutcome(lines=[f"{which}: {exc}"])
        out.exit_code = EXIT_HARNESS_FAILURE if gated else None
        return out
    # Every case of either run: what one of them left out is named (`coverage`), never
    # quietly matched away.
    comparison = compare(baseline, current, second=post2)
    report = None
    if settings.targets:
        targets = parse_targets(settings.targets)
        report = targeted(baseline, current, post2, targets, settings.noise_band)

    paired = significance.paired_tests(comparison, base_read, current_read)
    verdict = decide_gate(
        settings.gate if gated else "off",  # type: ignore[arg-type]
        comparison,
        allow_pin_mismatch=settings.allow_pin_mismatch,
        targeted=report,
        paired=paired,
        alpha=settings.alpha,
    )
    band = _band(set_dir, baseline, current)
    lines = report_lines(
        comparison,
        verdict,
        report,
        baseline_label=baseline.name,
        current_label=current.name,
        band=band,
        verbosity=verbosity,
    )
    # Beside the bar's decision (the last line): what the bar does not say.
    lines += significance.lines(paired, settings.alpha)
    # Either run being unmeasurable is a harness failure (as `evalloop flips --gate` says).
    found = [f for f in map(harness_failure, (base_read, current_read)) if f]
    failure = "; ".join(found) or None
    out = GateOutcome(lines=lines, verdict=verdict)
    # The p-values beside the bar, for every reader of run.json (the report, CI).
    ledger_writer.update_run_info(
        run_dir, pairedTests={"baseline": baseline.run_id, **significance.record(paired)}
    )
    if gated:
        out.exit_code = verdict.exit_code
        if failure:
            out.lines.append(f"harness failure: {failure}")
            out.exit_code = EXIT_HARNESS_FAILURE
        _record(run_dir, verdict, comparison, failure, settings, post2)
    out.properties = {
        "evalloop_gate": verdict.gate,
        "evalloop_decision": verdict.decision if not failure or not gated else "harness_failure",
        "evalloop_better": str(verdict.better),
        "evalloop_worse": str(verdict.worse),
        "evalloop_baseline": baseline.name,
        "evalloop_reason": verdict.reason,
    }
    return out


def _second_arm(settings: Settings, set_dir: Path | None, run_dir: Path) -> RunView | None:
    if not settings.baseline2:
        return None
    path = resolve_run(settings.baseline2, set_dir=set_dir, runs_dir=run_dir.parent)
    if path.resolve() == run_dir.resolve():
        # Checked before the run too (flagcheck); a run resolved to itself here is no arm.
        raise ValueError(
            f"--baseline2={settings.baseline2} is this run: one run cannot be two arms of a "
            "comparison"
        )
    return run_view(read_compared(path))


def _band(set_dir: Path | None, baseline: RunView, current: RunView) -> Any:
    if set_dir is None or not (set_dir / CALIBRATION_FILE).is_file():
        return None
    band = load_calibration(set_dir / CALIBRATION_FILE).band_for(current.pins)
    return band if band is not None and band.matches(baseline.pins) else None


def _record(
    run_dir: Path,
    verdict: GateVerdict,
    comparison: Comparison,
    failure: str | None,
    settings: Settings,
    post2: RunView | None,
) -> None:
    # Both post arms are the acceptance's final runs (seed 004: two independent runs).
    final = [comparison.current_run_id] + ([post2.run_id] if post2 is not None else [])
    event = acceptance_event(verdict, comparison, final_run_ids=final)
    if failure:
        event.reason = f"harness failure: {failure}; {event.reason}"
    ledger_writer.LedgerWriter(run_dir).append(event)
    gate = {
        "gate": verdict.gate,
        "decision": verdict.decision,
        "reason": verdict.reason,
        "baseline": comparison.baseline_run_id,
        "better": verdict.better,
        "worse": verdict.worse,
        "harnessFailure": failure,
        "finalRunIds": final,
        "baseline2": post2.run_id if post2 is not None else None,
        "targets": parse_targets(settings.targets) if settings.targets else None,
    }
    ledger_writer.update_run_info(run_dir, gate=gate)
