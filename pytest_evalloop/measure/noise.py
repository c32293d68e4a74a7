"""`evalloop noise A B`: an A/A pair's flips split into the answerer's variance and the judge's.

An A/A pair is one configuration run twice, so every flip between the runs is noise (seed 004).
It has two sources: the answerer wrote a different answer, or the judge read the same answer
differently. Telling them apart takes two comparisons, and :func:`attribute` (the one rule)
makes both for each flipped case:

- **the answers**: an answer is its final query, its answer text and the rows re-execution
  returned (`prediction.json`). When the two sides hold the same answers (a rejudge pair in
  either direction, two rejudges of one source run, or byte-identical reruns) only the judge
  can have moved: **judge noise**.
- **the judge samples of the same answer**: every verdict any judge gave a byte-identical
  answer, on either side, across judge samples (`--eval-judge-samples`) and answerer samples.
  An answer that drew both match and no_match shows the judge flipping on it: **judge noise**.
  When the answers differ and every answer was judged at least twice without ever drawing both
  decisions, the judge was steady on each answer: **answerer noise**. Otherwise some answer
  was judged once and the answers differ, so nothing can tell the two apart: **unattributed**,
  with why.

The **unstable cases** are those that flipped, whose answers drew split judges, or whose
samples (`--eval-samples`) were inconsistent, in either run. `--calibration` prints the
CALIBRATION.md block (`calibration.render_block`) with the band, its parts and the unstable
list; a later comparison under the same pins marks a flip on that list.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_evalloop.ledger.reader import RunLedger, read_run
from pytest_evalloop.measure import aggregates, repeats
from pytest_evalloop.measure import pins as pin_rules
from pytest_evalloop.measure.aggregates import counts, outcome
from pytest_evalloop.measure.calibration import CalibrationBand, render_block, today
from pytest_evalloop.measure.comparison import (
    Comparison,
    RunView,
    compare,
    natural_key,
    resolve_run,
    run_view,
)
from pytest_evalloop.measure.flips import EXIT_USAGE, run_command

Source = Literal["judge", "answerer", "unattributed"]


@dataclass(frozen=True)
class Answer:
    """One attempt of a case as the noise split sees it: what was answered, and every verdict
    its judge samples gave."""

    fingerprint: str
    """A digest of the final query, the answer text and the re-executed rows."""
    verdicts: tuple[str | None, ...]


@dataclass(frozen=True)
class Attribution:
    """Which source a flip is charged to, and why (the words the report prints)."""

    source: Source
    why: str


def attribute(side_a: Sequence[Answer], side_b: Sequence[Answer]) -> Attribution:
    """Charge one flipped case to the judge, the answerer, or neither (the one rule).

    Symmetric in its sides. The judge is charged when the two sides hold the same answers, or
    when one answer (pooled across sides and samples by fingerprint) drew both match and
    no_match; the answerer when the answers differ and every answer was judged at least twice
    with one decision; otherwise the flip is unattributed.
    """
    if sorted(a.fingerprint for a in side_a) == sorted(b.fingerprint for b in side_b):
        return Attribution("judge", "the same answers on both sides")
    pooled: dict[str, list[str | None]] = {}
    for answer in (*side_a, *side_b):
        pooled.setdefault(answer.fingerprint, []).extend(answer.verdicts)
    if any({"match", "no_match"} <= set(verdicts) for verdicts in pooled.values()):
        return Attribution("judge", "one answer drew both match and no_match")
    once = sum(1 for verdicts in pooled.values() if len(verdicts) < 2)
    if not once:
        return Attribution(
            "answerer", "the answers differ; each was judged twice or more with one decision"
        )
    return Attribution(
        "unattributed",
        f"the answers differ and {once} of {len(pooled)} distinct answers were judged once",
    )


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
    why: dict[str, str] = field(default_factory=dict)
    """Per flipped case, why it went to its source."""


def answers(read: RunLedger) -> dict[str, list[Answer]]:
    """Per case, each scored attempt that counts as an :class:`Answer`."""

    attempts = read.attempts()
    out: dict[str, list[Answer]] = {}
    for key, events in sorted(read.score_groups().items(), key=lambda kv: _key_order(kv[0])):
        attempt = attempts.get(key)
        # An attempt out of every aggregate says nothing about either source.
        if not all(counts(outcome(e, attempt)) for e in events):
            continue
        out.setdefault(key[0], []).append(
            Answer(_fingerprint(read.run_dir, attempt), tuple(e.verdict for e in events))
        )
    return out


def _key_order(key: tuple[str, int | None]) -> tuple[str, int]:
    return key[0], key[1] or 0


def _fingerprint(run_dir: Path, attempt: Any | None) -> str:
    if attempt is None:
        return "no-attempt"
    rows: Any = None
    path = getattr(attempt, "prediction_path", None)
    if path:
        try:
            predicted = json.loads((run_dir / path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            predicted = None
        if isinstance(predicted, dict):
            rows = [predicted.get("columns"), predicted.get("rows")]
    body = json.dumps([attempt.final_query, attempt.answer_text, rows], sort_keys=True, default=str)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


def decompose(comparison: Comparison, a: RunLedger, b: RunLedger) -> NoiseReport:
    """Split an A/A comparison's flips into judge, answerer and unattributed noise."""

    answers_a, answers_b = answers(a), answers(b)
    flipped = sorted((f.qid for f in comparison.better + comparison.worse), key=natural_key)
    report = NoiseReport(
        baseline=run_view(a).name,
        current=run_view(b).name,
        scored_in_both=comparison.scored_in_both,
        flipped=flipped,
    )
    for qid in flipped:
        found = attribute(answers_a.get(qid, []), answers_b.get(qid, []))
        getattr(report, found.source).append(qid)
        report.why[qid] = found.why
    unstable = set(flipped)
    for side in (answers_a, answers_b):
        unstable |= {
            qid for qid, found in side.items() if any(len(set(x.verdicts)) > 1 for x in found)
        }
    for read in (a, b):
        figures = repeats.figures(aggregates.tally(read))
        if figures is not None:
            unstable |= set(figures.unstable)
    report.unstable = sorted(unstable, key=natural_key)
    return report


def report_lines(r: NoiseReport, verbosity: int = 0) -> list[str]:
    """The decomposition in words."""
    pct = f" ({100 * len(r.flipped) / r.scored_in_both:.0f}%)" if r.scored_in_both else ""
    lines = [
        f"noise: {r.baseline} -> {r.current} (an A/A pair: every flip is noise)",
        f"flipped: {len(r.flipped)} of {r.scored_in_both} scored in both{pct}",
        f"  judge noise: {len(r.judge)} (the same answers on both sides, or one answer drew "
        f"both match and no_match){_listed(r.judge)}",
        f"  answerer noise: {len(r.answerer)} (the answers differ; each was judged twice or "
        f"more with one decision){_listed(r.answerer)}",
    ]
    if r.unattributed:
        lines.append(
            f"  unattributed: {len(r.unattributed)} (the answers differ and some were judged "
            "once: re-run the pair with --eval-judge-samples=3, or rejudge one run with "
            f"--eval-rejudge-from){_listed(r.unattributed)}"
        )
    if verbosity > 0:
        lines += [f"    {qid}: {r.why[qid]}" for qid in r.flipped]
    lines.append(f"unstable cases ({len(r.unstable)}){_listed(r.unstable)}")
    return lines


def _listed(qids: list[str], limit: int = 20) -> str:
    if not qids:
        return ""
    more = f", … (+{len(qids) - limit})" if len(qids) > limit else ""
    return ": " + ", ".join(qids[:limit]) + more


def band(r: NoiseReport, a: RunView, b: RunView) -> Any:
    """The CALIBRATION.md band of the pair, with both parts and the unstable cases."""

    return CalibrationBand(
        band=len(r.flipped),
        measured=today(),
        runs=[a.run_id, b.run_id],
        pins=dict(b.pins),
        scoredInBoth=r.scored_in_both,
        flipped=r.flipped,
        judgeBand=len(r.judge),
        answererBand=len(r.answerer),
        unattributedBand=len(r.unattributed),
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
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="say why each flip went where it did"
    )
    return parser


def noise_main(argv: list[str]) -> int:
    """`evalloop noise A B [--calibration]`."""
    return run_command("evalloop noise", _parser(), _run, argv)


def _run(args: argparse.Namespace) -> int:

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
    print("\n".join(report_lines(report, args.verbose)))
    if args.calibration:
        print()
        print(render_block(band(report, view_a, view_b)), end="")
    return 0
