"""`evalloop noise A B`: an A/A pair's flips split into the answerer's variance and the judge's.

An A/A pair is one configuration run twice, so every flip between the runs is noise (seed 004).
It has two sources: the answerer wrote a different answer, or the judge read a similar answer
differently. A flip is **judge noise** when it would disappear if the same answers were judged
again: some answer of the case, on either side, has a judge sample (`--eval-judge-samples`)
that gave the other side's verdict -- or the second run is a rejudge of the first
(`--eval-rejudge-from`), so both judged the very same answers. A flip every judge sample agreed
on, on both sides, is **answerer noise**: the answers differ. Without judge samples and without
a rejudge nothing tells the two apart, and the flip is **unattributed**.

The **unstable cases** are those that flipped, whose judge samples were not unanimous, or whose
samples (`--eval-samples`) disagreed, in either run. `--calibration` prints the CALIBRATION.md
block (`calibration.render_block`) with the band, both parts of it and the unstable list; a
later comparison under the same pins marks a flip on that list.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalloop.ledger.reader import RunLedger
from pytest_evalloop.measure.comparison import (
    Comparison,
    RunView,
    compare,
    natural_key,
    resolve_run,
    run_view,
)
from pytest_evalloop.measure.flips import EXIT_USAGE, run_command


@dataclass
class NoiseReport:
    """An A/A pair's flips by source, and its unstable cases."""

    baseline: str
    current: str
    scored_in_both: int
    flipped: list[str]
    judge: list[str] = field(default_factory=list)
    answerer: list[str] = field(default_factory=list)
    unattributed: list[str] = field(default_factory=list)
    unstable: list[str] = field(default_factory=list)
    same_answers: bool = False
    """The second run rejudged the first one's answers."""
    judge_sampled: bool = False


def _verdict_sets(read: RunLedger) -> dict[str, list[set[str | None]]]:
    """Per case, each attempt's set of judge-sample verdicts (the counting rule's view)."""
    from pytest_evalloop.measure.aggregates import outcome

    out: dict[str, list[set[str | None]]] = {}
    for (qid, _sample), events in read.score_groups().items():
        # An attempt out of every aggregate says nothing about the judge's variance.
        words = {outcome(e) for e in events}
        if words & {"contaminated", "gold_wrong"}:
            continue
        out.setdefault(qid, []).append({e.verdict for e in events})
    return out


def _rejudge_of(read: RunLedger, other: RunLedger) -> bool:
    info, source = read.info, other.info
    if info is None or source is None or not info.rejudge_of:
        return False
    return info.rejudge_of in (source.run_id, source.label)


def decompose(comparison: Comparison, a: RunLedger, b: RunLedger) -> NoiseReport:
    """Split an A/A comparison's flips into judge, answerer and unattributed noise."""
    from pytest_evalloop.measure import aggregates, repeats

    same = _rejudge_of(b, a) or _rejudge_of(a, b)
    sets_a, sets_b = _verdict_sets(a), _verdict_sets(b)
    sampled = any(len(g) > 1 for read in (a, b) for g in read.score_groups().values())
    flipped = sorted((f.qid for f in comparison.better + comparison.worse), key=natural_key)
    report = NoiseReport(
        baseline=run_view(a).name,
        current=run_view(b).name,
        scored_in_both=comparison.scored_in_both,
        flipped=flipped,
        same_answers=same,
        judge_sampled=sampled,
    )
    verdicts = {f.qid: (f.baseline.verdict, f.current.verdict) for f in comparison.better}
    verdicts |= {f.qid: (f.baseline.verdict, f.current.verdict) for f in comparison.worse}
    for qid in flipped:
        was, now = verdicts[qid]
        rejudged_other = any(now in s for s in sets_a.get(qid, [])) or any(
            was in s for s in sets_b.get(qid, [])
        )
        if same or rejudged_other:
            report.judge.append(qid)
        elif sampled:
            report.answerer.append(qid)
        else:
            report.unattributed.append(qid)
    unstable = set(flipped)
    for side in (sets_a, sets_b):
        unstable |= {qid for qid, attempts in side.items() if any(len(s) > 1 for s in attempts)}
    for read in (a, b):
        figures = repeats.figures(aggregates.tally(read))
        if figures is not None:
            unstable |= set(figures.unstable)
    report.unstable = sorted(unstable, key=natural_key)
    return report


def report_lines(r: NoiseReport) -> list[str]:
    """The decomposition in words."""
    pct = f" ({100 * len(r.flipped) / r.scored_in_both:.0f}%)" if r.scored_in_both else ""
    lines = [
        f"noise: {r.baseline} -> {r.current} (an A/A pair: every flip is noise)",
        f"flipped: {len(r.flipped)} of {r.scored_in_both} scored in both{pct}",
        f"  judge noise: {len(r.judge)} (the same answers judged again could give the other "
        f"verdict){_listed(r.judge)}",
        f"  answerer noise: {len(r.answerer)} (every judge sample agreed on each side; the "
        f"answers differ){_listed(r.answerer)}",
    ]
    if r.unattributed:
        lines.append(
            f"  unattributed: {len(r.unattributed)} (no judge samples and no rejudge: re-run "
            "the pair with --eval-judge-samples=3, or rejudge one run with "
            f"--eval-rejudge-from){_listed(r.unattributed)}"
        )
    if r.same_answers:
        lines.append(
            "  (the second run rejudged the first one's answers: every flip is the judge's)"
        )
    lines.append(f"unstable cases ({len(r.unstable)}){_listed(r.unstable)}")
    return lines


def _listed(qids: list[str], limit: int = 20) -> str:
    if not qids:
        return ""
    more = f", … (+{len(qids) - limit})" if len(qids) > limit else ""
    return ": " + ", ".join(qids[:limit]) + more


def band(r: NoiseReport, a: RunView, b: RunView) -> Any:
    """The CALIBRATION.md band of the pair, with both parts and the unstable cases."""
    from pytest_evalloop.measure.calibration import CalibrationBand, today

    attributed = r.same_answers or r.judge_sampled
    return CalibrationBand(
        band=len(r.flipped),
        measured=today(),
        runs=[a.run_id, b.run_id],
        pins=dict(b.pins),
        scoredInBoth=r.scored_in_both,
        flipped=r.flipped,
        judgeBand=len(r.judge) if attributed else None,
        answererBand=len(r.answerer) if attributed else None,
        unstable=r.unstable,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalloop noise",
        description="Split an A/A pair's flips into the answerer's noise and the judge's.",
        epilog=f"exit: 0 ok, {EXIT_USAGE} bad arguments or not an A/A pair",
    )
    parser.add_argument("baseline", help="first run of the pair: a run directory or a label")
    parser.add_argument("current", help="second run (or a rejudge of the first)")
    parser.add_argument("--set", dest="set_dir", type=Path, help="set directory (labels in runs/)")
    parser.add_argument("--runs-dir", type=Path, help="where labelled runs live")
    parser.add_argument(
        "--calibration",
        action="store_true",
        help="also print the CALIBRATION.md block (both bands, the unstable cases, the pins)",
    )
    return parser


def noise_main(argv: list[str]) -> int:
    """`evalloop noise A B [--calibration]`."""
    return run_command("evalloop noise", _parser(), _run, argv)


def _run(args: argparse.Namespace) -> int:
    from pytest_evalloop.ledger.reader import read_run
    from pytest_evalloop.measure import pins as pin_rules
    from pytest_evalloop.measure.calibration import render_block

    find = {"set_dir": args.set_dir, "runs_dir": args.runs_dir}
    # A full read: judge samples (`judge_sample`) and rejudge provenance are needed here.
    a = read_run(resolve_run(args.baseline, **find), validate=False)
    b = read_run(resolve_run(args.current, **find), validate=False)
    view_a, view_b = run_view(a), run_view(b)
    if view_a.run_id == view_b.run_id:
        raise ValueError(f"both runs are {view_a.run_id!r}; an A/A needs two runs")
    comparison = compare(view_a, view_b)
    differ = comparison.pin_diffs + comparison.model_change
    if differ:
        raise ValueError(
            f"not an A/A pair: pins differ: {pin_rules.describe(differ)}; run both arms under "
            "one configuration"
        )
    report = decompose(comparison, a, b)
    print("\n".join(report_lines(report)))
    if args.calibration:
        print()
        print(render_block(band(report, view_a, view_b)), end="")
    return 0
