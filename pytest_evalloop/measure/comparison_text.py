"""A comparison as terminal text: the flip table, the targets, the gate's line.

`report_lines` is what the terminal summary (`baseline`) and `evalloop flips` print; the
figures in it come from `comparison` and `gate`, nothing here counts.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

from pytest_evalloop.measure import caveats
from pytest_evalloop.measure import pins as pin_rules
from pytest_evalloop.measure.calibration import CALIBRATION_FILE, CalibrationBand
from pytest_evalloop.measure.comparison import (
    DROP_ORDER,
    CaseSide,
    Comparison,
    Dropped,
    Flip,
    Neither,
    Undecided,
    few,
)
from pytest_evalloop.measure.gate import GateVerdict, TargetedReport, TargetStatus

_OUTCOME_WORDS: dict[TargetStatus, str] = {
    "fixed": "FIXED",
    "still_failing": "still failing",
    "broke": "BROKE",
    "already_passing": "already passing",
    "mixed": "fixed in one arm only",
    "unscored": "unscored",
}
WIDTH = 96
NOISE_BAND_FLAG = "--noise-band"
DETAIL_LIMIT = 25


def report_lines(
    c: Comparison,
    gate: GateVerdict | None,
    targeted: TargetedReport | None,
    *,
    baseline_label: str,
    current_label: str,
    band: CalibrationBand | None,
    verbosity: int,
) -> list[str]:
    """The flip table as plain lines, the terminal summary and `evalloop flips` share it."""
    lines = [f"flips: {baseline_label} (baseline) -> {current_label} (current)"]
    if c.coverage:
        lines += _wrapped(c.coverage, "")
    if c.refused and gate is None:
        # No gate asked, but nobody should read a decision into these flips either.
        lines.append("WARNING: these runs cannot carry a decision:")
        lines += [w for why in c.refused for w in _wrapped(f"- {why}", "  ")]
    lines += _pin_warning(c)
    if c.submitted_fell:
        lines += _wrapped(f"WARNING: {c.submitted_fell}", "")
    lines += c.settled_by_people
    lines += _counts(c, band)
    lines += [w for note in caveats.samples_note(c) for w in _wrapped(note, "")]
    lines += _neither_section(c.undecided, "undecided now after a pass")
    if verbosity >= 0:
        # A rebase can flip hundreds of cases; the default view details the first few.
        limit = None if verbosity >= 1 else DETAIL_LIMIT
        unstable = frozenset(band.unstable or []) if band is not None else frozenset()
        lines += _flip_section("better", c.better, limit, unstable)
        lines += _flip_section("worse", c.worse, limit, unstable)
    else:
        lines += _qid_list("better", [f.qid for f in c.better])
        lines += _qid_list("worse", [f.qid for f in c.worse])
    if verbosity >= 1:
        lines += _neither_section(c.neither)
        lines += _neither_section(c.dropped, "dropped")
    if verbosity >= 2:
        lines += _qid_list("stable pass", c.stable_pass)
        lines += _qid_list("stable fail", c.stable_fail)
    if c.stable_near_match:
        lines += _qid_list("coverage findings (near_match in both runs)", c.stable_near_match)
    lines += _case_set_lines(c, baseline_label, current_label)
    if targeted is not None:
        lines += _targeted_lines(targeted)
    if gate is not None:
        lines += _wrapped(f"gate {gate.gate}: {gate.decision.upper()} -- {gate.reason}", "")
    return lines


def _pin_warning(c: Comparison) -> list[str]:
    lines = []
    if c.pin_diffs:
        lines.append(
            "WARNING: pins differ between the runs -- this comparison is a rebase, not a delta:"
        )
        lines += [f"  {d.name}: {_pin(d.baseline)} -> {_pin(d.current)}" for d in c.pin_diffs]
    if c.model_change:
        lines.append("changed (the change under test): the served model")
        lines += [f"  {d.name}: {_pin(d.baseline)} -> {_pin(d.current)}" for d in c.model_change]
    if c.recorded_diffs:
        lines += _wrapped(
            "note: tool versions differ (recorded, not a comparison pin): "
            + pin_rules.describe(c.recorded_diffs),
            "",
        )
    return lines


def _pin(value: Any) -> str:
    return pin_rules.show(value)


def _counts(c: Comparison, band: CalibrationBand | None) -> list[str]:
    scored = c.scored_in_both
    pct = f" ({100 * c.flips / scored:.0f}%)" if scored else ""
    flipped = f"flipped: {c.flips} of {scored} scored in both{pct}"
    if band is not None:
        flipped += f"; A/A noise band {band.band} ({_band_origin(band)})"
    tally = Counter(n.category for n in c.neither)
    parts = [f"{k} {tally[k]}" for k in ("near_match", "needs_human", "unscored") if tally[k]]
    neither = f"neither pass nor fail: {len(c.neither)}"
    lines = [f"better (no_match -> match): {len(c.better)}   " + _headed("worse", c.worse_by())]
    if c.undecided:
        lines += _wrapped(
            _headed("undecided now after a pass", c.undecided_by())
            + " (lost decisions: read as worse before any gate accepts)",
            "",
        )
    return [
        *lines,
        f"stable pass: {len(c.stable_pass)}   stable fail: {len(c.stable_fail)}   "
        + neither
        + (f" ({', '.join(parts)})" if parts else ""),
        flipped,
        *_dropped_lines(c),
    ]


def _headed(title: str, counts: dict[str, int]) -> str:
    """A count headed by the transitions it holds, each named as it happened: `worse (match ->
    no_match): 3` when one transition holds them all, else `worse: 43 (match -> no_match 3,
    match -> not_submitted 40)`."""
    if not counts:
        return f"{title} (match -> no_match): 0" if title == "worse" else f"{title}: 0"
    if len(counts) == 1:
        [(name, n)] = counts.items()
        return f"{title} ({name}): {n}"
    parts = ", ".join(f"{name} {n}" for name, n in counts.items())
    return f"{title}: {sum(counts.values())} ({parts})"


def _dropped_lines(c: Comparison) -> list[str]:
    if not c.dropped:
        return []
    parts = [
        f"{len(qids)} {reason} ({few(qids, 5)})"
        for reason in DROP_ORDER
        if (qids := c.dropped_for(reason))
    ]
    text = f"dropped (out of every aggregate on either side): {len(c.dropped)}: " + "; ".join(parts)
    return _wrapped(text, "")


def _band_origin(band: CalibrationBand) -> str:
    if band.source == NOISE_BAND_FLAG:
        return f"given by {NOISE_BAND_FLAG}"
    where = Path(band.source).name if band.source else CALIBRATION_FILE
    return f"{where}, measured {band.measured}"


def _verdict(case: CaseSide) -> str:
    """A side as the flip lines name it: its real word (`gold_wrong`, `answer_error`, ...)."""
    word = case.word
    return "not submitted" if word == "not_submitted" else word


def _undecided_reason(case: CaseSide) -> str | None:
    # A decided side's reason is the judge's why, shown apart: only say why a side is not one.
    return None if case.word in ("match", "no_match") else case.reason


def _flip_section(
    title: str, flips: list[Flip], limit: int | None, unstable: frozenset[str] = frozenset()
) -> list[str]:
    if not flips:
        return []
    lines = [f"{title}:"]
    shown = flips if limit is None else flips[:limit]
    for flip in shown:
        # A case the A/A pair found unstable (`evalloop noise`) flips by itself too.
        mark = " [unstable in the A/A pair]" if flip.qid in unstable else ""
        if caveats.is_partial_flip(flip.baseline, flip.current):
            mark += " [majority flip: not every sample changed]"
        before = _verdict(flip.baseline) + caveats.side_fraction(flip.baseline)
        after = _verdict(flip.current) + caveats.side_fraction(flip.current)
        lines.append(f"  {flip.qid}: {before} -> {after}{mark}")
        why = flip.current.why or _undecided_reason(flip.current)
        if why:
            lines += _wrapped("why (current): " + why, "    ")
        lines += _query_lines(flip.baseline.final_query, flip.current.final_query)
    rest = [f.qid for f in flips[len(shown) :]]
    if rest:
        lines += _wrapped(f"... and {len(rest)} more (-v shows them): " + few(rest, 50), "  ")
    return lines


def _query_lines(before: str | None, after: str | None) -> list[str]:
    if before is None and after is None:
        return ["    neither run recorded a final query"]
    if before == after:
        return [
            "    same query in both arms (the flip is downstream of the query):",
            *_indented(before),
        ]
    return ["    baseline query:", *_indented(before), "    current query:", *_indented(after)]


def _indented(query: str | None) -> list[str]:
    if query is None:
        return ["      (none recorded)"]
    return ["      " + line for line in query.strip("\n").splitlines()] or ["      (empty)"]


def _wrapped(text: str, indent: str) -> list[str]:
    flat = " ".join(text.split())
    return textwrap.wrap(flat, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def _qid_list(title: str, qids: list[str], limit: int | None = None) -> list[str]:
    if not qids:
        return []
    shown = qids if limit is None or len(qids) <= limit else qids[:limit] + ["..."]
    return _wrapped(f"{title} ({len(qids)}): " + ", ".join(shown), "")


def _neither_section(
    cases: list[Neither] | list[Dropped] | list[Undecided], title: str = "neither pass nor fail"
) -> list[str]:
    if not cases:
        return []
    lines = [f"{title}:"]
    for case in cases:
        sides = (case.baseline, case.current)
        reasons = [r for r in map(_undecided_reason, sides) if r]
        why = f" ({'; '.join(dict.fromkeys(reasons))})" if reasons else ""
        text = f"{case.qid}: {_verdict(case.baseline)} -> {_verdict(case.current)}{why}"
        lines += _wrapped(text, "  ")
    return lines


def _case_set_lines(c: Comparison, baseline_label: str, current_label: str) -> list[str]:
    lines = []
    if c.only_in_baseline:
        lines += _qid_list(f"only in {baseline_label} (not compared)", c.only_in_baseline, 10)
    if c.only_in_current:
        lines += _qid_list(f"only in {current_label} (not compared)", c.only_in_current, 10)
    return lines


def _targeted_lines(t: TargetedReport) -> list[str]:
    lines = [f"targeted mode: {len(t.targets)} target(s), {t.arms} post arm(s)"]
    for outcome, word in _OUTCOME_WORDS.items():
        qids = t.with_outcome(outcome)
        if qids:
            lines += _wrapped(f"{word}: " + ", ".join(qids), "  ")
    if t.unknown_targets:
        lines += _wrapped("unknown targets (dropped): " + ", ".join(t.unknown_targets), "  ")
    per_arm = ", ".join(
        f"{len(b) + len(w)} in arm {i} ({len(b)} better, {len(w)} worse)"
        for i, (b, w) in enumerate(
            zip(t.untargeted_better, t.untargeted_worse, strict=True), start=1
        )
    )
    lines.append(f"untargeted flips: {per_arm}")
    lines.append("  " + _band_sentence(t))
    if t.arms < 2:
        lines.append("  one post arm: a reproducible regression cannot be told from noise")
    if t.regressed_in_both:
        lines += _wrapped(
            "REGRESSED IN BOTH post arms -- not noise; DO NOT ACCEPT on the band "
            "alone: " + ", ".join(t.regressed_in_both),
            "  ",
        )
    if t.unclaimed_wins:
        lines += _wrapped(
            "unclaimed win (better in both post arms): " + ", ".join(t.unclaimed_wins), "  "
        )
    return lines


def _band_sentence(t: TargetedReport) -> str:
    status = t.band_status
    if status == "unknown":
        return "no noise band: measure an A/A pair and pass it (--noise-band or CALIBRATION.md)"
    if status == "within":
        return f"within the measured noise band ({t.noise_band})"
    if status == "above_improving":
        return f"above the band ({t.noise_band}), but every untargeted flip is an improvement"
    return f"ABOVE the measured noise band ({t.noise_band}); investigate those before accepting"
