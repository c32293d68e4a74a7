from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.ledger.contract import AttemptEvent, RunInfo, ScoreEvent, strict_dump
from pytest_evalloop.ledger.reader import read_run
from pytest_evalloop.ledger.writer import LedgerWriter, seal_run, write_run_info
from pytest_evalloop.measure.calibration import CalibrationBand, parse_calibration
from pytest_evalloop.measure.comparison import (
    CaseSide,
    RunNotFoundError,
    RunView,
    UnreadableRunError,
    case_side,
    compare,
    read_compared,
    resolve_run,
    run_view,
)
from pytest_evalloop.measure.comparison_text import DETAIL_LIMIT, report_lines
from pytest_evalloop.measure.flips import flips_main
from pytest_evalloop.measure.gate import (
    EXIT_GATE_REJECTED,
    EXIT_HARNESS_FAILURE,
    acceptance_bar,
    acceptance_event,
    decide_gate,
    harness_failure,
    no_regressions,
    parse_targets,
    targeted,
)
from pytest_evalloop.measure.pins import pins_of

PINS = {
    "datasetSha": "d" * 64,
    "judgeVersion": "4",
    "rubricSha": "r" * 64,
    "answererModel": "claude-sonnet-4-5",
    "judgeModel": "claude-sonnet-4-5",
    "answerer": "anthropic",
    "target": "embedded",
    "targetProfile": "embedded",
}


def side(
    qid: str, verdict: str | None, query: str | None = None, why: str | None = None
) -> CaseSide:
    return CaseSide(qid=qid, verdict=verdict, reason="judged", why=why, final_query=query)


def view(run_id: str, verdicts: Mapping[str, str | None], **pins: Any) -> RunView:
    cases = {qid: side(qid, v, query=f"run {qid} in {run_id}") for qid, v in verdicts.items()}
    return RunView(run_id=run_id, label=run_id, pins={**PINS, **pins}, cases=cases)


def pair(better: int, worse: int, stable: int = 3) -> tuple[RunView, RunView]:
    """A baseline/current pair with exactly these flips plus stable cases."""
    before: dict[str, str | None] = {}
    after: dict[str, str | None] = {}
    for i in range(better):
        before[f"b{i}"], after[f"b{i}"] = "no_match", "match"
    for i in range(worse):
        before[f"w{i}"], after[f"w{i}"] = "match", "no_match"
    for i in range(stable):
        before[f"p{i}"] = after[f"p{i}"] = "match"
        before[f"f{i}"] = after[f"f{i}"] = "no_match"
    return view("base", before), view("cur", after)


# --- the bar -------------------------------------------------------------------------------

BAR_ROWS = [
    (4, 0, "unresolved"),
    (5, 0, "accepted"),
    (6, 1, "unresolved"),
    (7, 1, "accepted"),
    (8, 2, "unresolved"),
    (9, 2, "accepted"),
    (9, 3, "unresolved"),
    (10, 3, "accepted"),
    (20, 4, "rejected"),
    (0, 0, "unresolved"),
]


@pytest.mark.parametrize(("better", "worse", "expected"), BAR_ROWS)
def test_bar_over_run_pairs(better: int, worse: int, expected: str) -> None:
    base, cur = pair(better, worse)
    c = compare(base, cur)
    assert (len(c.better), len(c.worse)) == (better, worse)
    assert (len(c.stable_pass), len(c.stable_fail)) == (3, 3)
    assert acceptance_bar(better, worse) == expected
    verdict = decide_gate("bar", c, allow_pin_mismatch=False, targeted=None)
    assert verdict.decision == expected
    assert (verdict.better, verdict.worse) == (better, worse)
    assert verdict.exit_code == (0 if expected == "accepted" else EXIT_GATE_REJECTED)
    assert verdict.regressions == sorted(f"w{i}" for i in range(worse))


def test_bar_reason_names_the_rule() -> None:
    c = compare(*pair(6, 1))
    reason = decide_gate("bar", c, allow_pin_mismatch=False, targeted=None).reason
    assert reason == "acceptance bar: 1 worse needs >= 7 better; got 6"
    c = compare(*pair(20, 4))
    reason = decide_gate("bar", c, allow_pin_mismatch=False, targeted=None).reason
    assert "more than 3 worse rejects" in reason


def test_bar_refuses_negative_counts() -> None:
    with pytest.raises(ValueError, match="better=-1"):
        acceptance_bar(-1, 0)


def test_no_regressions_gate() -> None:
    assert no_regressions(compare(*pair(0, 0))) == "accepted"
    assert no_regressions(compare(*pair(9, 1))) == "rejected"
    v = decide_gate("no-regressions", compare(*pair(1, 0)), allow_pin_mismatch=False, targeted=None)
    assert (v.decision, v.exit_code) == ("accepted", 0)
    v = decide_gate(
        "no-regressions", compare(*pair(30, 1)), allow_pin_mismatch=False, targeted=None
    )
    assert (v.decision, v.regressions) == ("rejected", ["w0"])


def test_gate_off_reports_but_never_fails() -> None:
    v = decide_gate("off", compare(*pair(0, 3)), allow_pin_mismatch=False, targeted=None)
    assert v.decision == "unresolved" and v.exit_code == 0
    assert v.reason.startswith("gate off")


def test_unknown_gate_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown gate 'strict'"):
        decide_gate("strict", compare(*pair(0, 0)), allow_pin_mismatch=False, targeted=None)  # type: ignore[arg-type]


# --- unscored, neither, case sets, pins ----------------------------------------------------


def test_unscored_and_neither_never_flip() -> None:
    base = view(
        "a",
        {
            "q1": None,
            "q2": "match",
            "q3": "needs_human",
            "q4": "near_match",
            "q5": "no_match",
            "q6": "near_match",
        },
    )
    cur = view(
        "b",
        {
            "q1": "match",
            "q2": None,
            "q3": "match",
            "q4": "no_match",
            "q5": "needs_human",
            "q6": "near_match",
        },
    )
    c = compare(base, cur)
    assert c.better == [] and c.worse == []
    # A pass unscored now is no flip either, but a lost decision (`transitions.transition`).
    assert [(u.qid, u.word) for u in c.undecided] == [("q2", "unscored")]
    assert [n.qid for n in c.neither] == ["q1", "q3", "q4", "q5", "q6"]
    assert [n.category for n in c.neither] == [
        "unscored",
        "needs_human",
        "near_match",
        "needs_human",
        "near_match",
    ]
    assert c.stable_near_match == ["q6"]
    assert c.scored_in_both == 0
    assert acceptance_bar(len(c.better), len(c.worse)) == "unresolved"


def test_different_case_sets_are_listed_not_compared() -> None:
    base = view("a", {"q1": "no_match", "q2": "match", "q10": "match"})
    cur = view("b", {"q1": "match", "q3": "no_match", "q11": "no_match"})
    c = compare(base, cur)
    assert [f.qid for f in c.better] == ["q1"]
    assert c.only_in_baseline == ["q2", "q10"]
    assert c.only_in_current == ["q3", "q11"]
    narrowed = compare(base, cur, qids={"q2", "q3"})
    assert narrowed.better == [] and narrowed.only_in_baseline == ["q2"]


def test_qids_sort_naturally() -> None:
    verdicts = {q: "no_match" for q in ("q10", "q2", "q1")}
    c = compare(view("a", verdicts), view("b", {q: "match" for q in verdicts}))
    assert [f.qid for f in c.better] == ["q1", "q2", "q10"]


def test_pin_diffs_refuse_unless_allowed() -> None:
    base, _ = pair(5, 0)
    cur = view("cur", {q: "match" for q in base.cases}, judgeVersion="5", target=None)
    c = compare(base, cur)
    assert [(d.name, d.baseline, d.current) for d in c.pin_diffs] == [
        ("judgeVersion", "4", "5"),
        ("target", "embedded", None),
    ]
    refused = decide_gate("bar", c, allow_pin_mismatch=False, targeted=None)
    assert refused.decision == "refused" and refused.exit_code == EXIT_GATE_REJECTED
    assert "judgeVersion, target" in refused.reason and "rebase, not a delta" in refused.reason
    allowed = decide_gate("bar", c, allow_pin_mismatch=True, targeted=None)
    assert allowed.decision == "accepted"


def test_acceptance_event_is_a_valid_ledger_line() -> None:
    c = compare(*pair(7, 1))
    v = decide_gate("bar", c, allow_pin_mismatch=False, targeted=None)
    event = acceptance_event(v, c, final_run_ids=["cur"])
    line = strict_dump(event)
    assert line["kind"] == "acceptance_check" and line["decision"] == "accepted"
    assert line["baselineRunId"] == "base" and line["worse"] == ["w0"]
    assert line["regressions"] == ["w0"] and len(line["better"]) == 7


# --- samples -------------------------------------------------------------------------------


def score(qid: str, sample: int | None, verdict: str | None, **kw: Any) -> ScoreEvent:
    # Verdicts are plain strings here; the ledger model validates them at run time.
    return ScoreEvent(
        qid=qid,
        sample=sample,
        phase="baseline",
        verdict=verdict,  # type: ignore[arg-type]
        reason=kw.pop("reason", "judged"),
        **kw,
    )


def attempt(qid: str, sample: int | None, final_query: str | None, **kw: Any) -> AttemptEvent:
    return AttemptEvent(
        qid=qid,
        sample=sample,
        phase="baseline",
        question_sha="0" * 16,
        submitted=kw.pop("submitted", True),
        final_query=final_query,
        **kw,
    )


def test_samples_pass_by_a_majority_of_all_samples() -> None:
    scores = [
        score("q", 0, "match", why="w0"),
        score("q", 1, "no_match", why="w1"),
        score("q", 2, "match", why="w2"),
        score("q", 3, "match", why="w3"),
        score("q", 4, "needs_human"),
    ]
    got = case_side("q", scores, {0: "Q0", 1: "Q1", 2: "Q2"})
    assert (got.verdict, got.why, got.final_query, got.samples) == ("match", "w0", "Q0", 5)
    # Two matches of four, the undecided sample could have turned it: no pass.
    undecided = case_side("q", scores[:3] + scores[4:], {0: "Q0", 1: "Q1", 2: "Q2"})
    assert undecided.verdict is None
    assert undecided.reason == "samples_undecided: 2 match, 1 no_match, 1 undecided of 4"
    # A sample attempted and never scored (the judge failed) counts, undecided.
    lost = case_side("q", [scores[0]], {0: "Q0", 1: "Q1"})
    assert lost.verdict is None and lost.reason is not None
    assert lost.reason.startswith("samples_undecided: 1 match")


def test_samples_tie_is_unscored() -> None:
    got = case_side("q", [score("q", 1, "no_match"), score("q", 0, "match")], {})
    assert got.verdict is None
    assert got.reason == "samples_split: 1 match, 1 no_match of 2"


def test_samples_without_decided_verdict() -> None:
    near = [score("q", 0, "near_match"), score("q", 1, "near_match"), score("q", 2, "needs_human")]
    assert case_side("q", near, {}).verdict == "near_match"
    tie = [score("q", 0, "near_match"), score("q", 1, "needs_human")]
    assert case_side("q", tie, {}).verdict == "needs_human"


def test_contaminated_or_verified_wrong_is_unscored() -> None:
    dirty = case_side("q", [score("q", None, "match", contaminated=True)], {None: "Q"})
    assert (dirty.verdict, dirty.reason, dirty.contaminated) == (
        None,
        "contaminated (judge said match)",
        True,
    )
    wrong = case_side("q", [score("q", None, "no_match", gold_status="verified_wrong")], {})
    assert (wrong.verdict, wrong.reason) == (
        None,
        "gold_status verified_wrong (judge said no_match)",
    )


def test_attempt_without_score_is_not_scored() -> None:
    got = case_side("q", [], {None: "SELECT 1"})
    assert (got.verdict, got.reason, got.final_query) == (None, "not_scored", "SELECT 1")


# --- targeted mode -------------------------------------------------------------------------


def tviews(
    base: Mapping[str, str | None],
    post: Mapping[str, str | None],
    post2: Mapping[str, str | None] | None,
) -> tuple[RunView, RunView, RunView | None]:
    return view("a", base), view("b", post), (view("c", post2) if post2 is not None else None)


def test_every_target_outcome() -> None:
    base = {
        "fix": "no_match",
        "still": "no_match",
        "broke": "match",
        "ok": "match",
        "uns": None,
        "mix": "no_match",
    }
    post = {
        "fix": "match",
        "still": "no_match",
        "broke": "match",
        "ok": "match",
        "uns": "match",
        "mix": "match",
    }
    post2 = {**post, "broke": "no_match", "mix": "no_match"}
    report = targeted(*tviews(base, post, post2), [*base, "ghost", "fix"], noise_band=2)
    outcomes = {t.qid: t.outcome for t in report.targets}
    assert outcomes == {
        "fix": "fixed",
        "still": "still_failing",
        "broke": "broke",
        "ok": "already_passing",
        "uns": "unscored",
        "mix": "mixed",
    }
    assert report.unknown_targets == ["ghost"]
    assert report.regressions == ["broke"]
    assert report.targets[2].post == ["match", "no_match"]
    assert report.decision()[0] == "rejected"


def test_targets_fixed_in_both_arms_within_band_accept() -> None:
    base = {"t1": "no_match", "t2": "no_match", "u1": "match", "u2": "no_match", "u3": "match"}
    post = {"t1": "match", "t2": "match", "u1": "no_match", "u2": "no_match", "u3": "match"}
    post2 = {"t1": "match", "t2": "match", "u1": "match", "u2": "match", "u3": "match"}
    report = targeted(*tviews(base, post, post2), ["t1", "t2"], noise_band=1)
    assert report.untargeted_worse == [["u1"], []]
    assert report.untargeted_better == [[], ["u2"]]
    assert report.regressed_in_both == [] and report.band_status == "within"
    c = compare(view("a", base), view("b", post))
    v = decide_gate("bar", c, allow_pin_mismatch=False, targeted=report)
    assert v.decision == "accepted" and v.regressions == []
    assert "every target fixed in both post arms" in v.reason


def test_untargeted_worse_in_both_arms_blocks_however_small() -> None:
    base = {"t": "no_match", "u": "match", **{f"s{i}": "match" for i in range(10)}}
    post = {**base, "t": "match", "u": "no_match"}
    report = targeted(*tviews(base, post, dict(post)), ["t"], noise_band=5)
    assert report.band_status == "within"
    assert report.regressed_in_both == ["u"] and report.regressions == ["u"]
    c = compare(view("a", base), view("b", post))
    for gate in ("bar", "no-regressions"):
        v = decide_gate(gate, c, allow_pin_mismatch=False, targeted=report)
        assert v.decision == "rejected" and v.regressions == ["u"]
        assert "untargeted worse in both post arms: u" in v.reason


def test_untargeted_better_in_both_is_an_unclaimed_win() -> None:
    base = {"t": "no_match", "u": "no_match", "v": "no_match"}
    post = {"t": "match", "u": "match", "v": "match"}
    post2 = {"t": "match", "u": "match", "v": "no_match"}
    report = targeted(*tviews(base, post, post2), ["t"], noise_band=0)
    assert report.unclaimed_wins == ["u"]
    assert report.band_status == "above_improving"
    assert report.decision()[0] == "accepted"


def test_band_above_with_worse_is_unresolved_and_unknown_band() -> None:
    base = {"t": "no_match", "u1": "match", "u2": "match"}
    post = {"t": "match", "u1": "no_match", "u2": "match"}
    post2 = {"t": "match", "u1": "match", "u2": "no_match"}
    over = targeted(*tviews(base, post, post2), ["t"], noise_band=0)
    assert over.band_status == "above" and over.regressed_in_both == []
    assert over.decision() == (
        "unresolved",
        "targeted mode: untargeted flips above the noise band; investigate",
    )
    unknown = targeted(*tviews(base, post, post2), ["t"], noise_band=None)
    assert unknown.band_status == "unknown"
    assert "no noise band is known" in unknown.decision()[1]


def test_one_post_arm_cannot_accept() -> None:
    base = {"t": "no_match", "u": "match"}
    post = {"t": "match", "u": "match"}
    report = targeted(*tviews(base, post, None), ["t"], noise_band=0)
    assert report.arms == 1 and report.regressed_in_both == []
    assert report.decision()[0] == "unresolved"
    assert "second post arm" in report.decision()[1]


def test_targets_still_failing_are_unresolved() -> None:
    report = targeted(*tviews({"t": "no_match"}, {"t": "no_match"}, {"t": "no_match"}), ["t"], 0)
    assert report.decision() == ("unresolved", "targeted mode: targets not fixed in every arm: t")
    empty = targeted(*tviews({"t": "no_match"}, {"t": "match"}, None), ["nope"], 0)
    assert empty.targets == [] and empty.decision()[0] == "unresolved"


def test_parse_targets(tmp_path: Path) -> None:
    assert parse_targets("q1,q2, q3 q1") == ["q1", "q2", "q3"]
    path = tmp_path / "targets.txt"
    path.write_text("# stable failures of the A/A\nq7\n\nq9  # the revenue one\nq7\n")
    assert parse_targets(f"@{path}") == ["q7", "q9"]
    with pytest.raises(ValueError, match=r"targets file .*missing\.txt"):
        parse_targets(f"@{tmp_path / 'missing.txt'}")
    with pytest.raises(ValueError, match="name no qid"):
        parse_targets(" , ")


# --- the report ----------------------------------------------------------------------------


def report_fixture() -> tuple[list[str], Any]:
    base = RunView(
        run_id="ecom-baseline-01",
        label="ecom-baseline-01",
        pins=PINS,
        cases={
            "q1": side("q1", "no_match", "run: orders -> { aggregate: n is count() }"),
            "q2": side("q2", "match", "run: a\n  -> b"),
            "q3": side("q3", "near_match"),
            "q4": side("q4", "match"),
            "q5": side("q5", "match"),
            "q9": side("q9", "no_match"),
        },
    )
    why = "The total matches the golden within tolerance; " * 5
    cur = RunView(
        run_id="ecom-loop-02",
        label=None,
        pins={**PINS, "judgeVersion": "5"},
        cases={
            "q1": side("q1", "match", "run: orders -> { aggregate: n is count() }", why=why),
            "q2": side("q2", "no_match", "run: a\n  -> c", why="Wrong denominator."),
            "q3": side("q3", "near_match"),
            "q4": side("q4", None),
            "q5": side("q5", "match"),
            "q6": side("q6", "match"),
        },
    )
    c = compare(base, cur)
    band = CalibrationBand(
        band=2, measured="2026-11-01", runs=["x", "y"], pins=PINS, source="/s/CALIBRATION.md:12"
    )
    post2 = cur.model_copy(update={"run_id": "ecom-loop-03"})
    t = targeted(base, cur, post2, ["q1", "q77"], noise_band=2)
    gate = decide_gate("bar", c, allow_pin_mismatch=False, targeted=None)
    lines = report_lines(
        c, gate, t, baseline_label=base.name, current_label=cur.name, band=band, verbosity=1
    )
    return lines, c


def test_report_lines_snapshot(snapshot: Any) -> None:
    lines, _ = report_fixture()
    assert "\n".join(lines) == snapshot


def test_report_lines_content() -> None:
    lines, _ = report_fixture()
    text = "\n".join(lines)
    warning = lines.index(
        "WARNING: pins differ between the runs -- this comparison is a rebase, not a delta:"
    )
    counts = next(i for i, line in enumerate(lines) if line.startswith("better (no_match"))
    assert warning < counts
    assert "  judgeVersion: 4 -> 5" in lines
    assert "better (no_match -> match): 1   worse (match -> no_match): 1" in lines
    assert (
        "flipped: 2 of 3 scored in both (67%); A/A noise band 2 "
        "(CALIBRATION.md:12, measured 2026-11-01)"
    ) in lines
    # q1 ran the same query in both arms; q2 did not.
    q1 = lines.index("  q1: no_match -> match")
    assert lines[q1 + 1].startswith("    why (current): The total matches")
    assert "same query in both arms" in text
    assert "      run: orders -> { aggregate: n is count() }" in lines
    q2 = lines.index("  q2: match -> no_match")
    assert lines[q2 + 1 : q2 + 7] == [
        "    why (current): Wrong denominator.",
        "    baseline query:",
        "      run: a",
        "        -> b",
        "    current query:",
        "      run: a",
    ]
    assert "coverage findings (near_match in both runs) (1): q3" in lines
    assert "only in ecom-baseline-01 (not compared) (1): q9" in lines
    assert "only in ecom-loop-02 (not compared) (1): q6" in lines
    assert "  q4: match -> unscored (judged)" in lines
    assert "  FIXED: q1" in lines and "  unknown targets (dropped): q77" in lines
    assert lines[-2].startswith("gate bar: REFUSED -- pins differ (judgeVersion)")
    assert (
        lines[-1]
        == "  under the current pins, or pass --eval-allow-pin-mismatch to compare them anyway"
    )
    assert not re.search(r"\x1b\[", text)
    long = [line for line in lines if len(line) >= 100 and not line.startswith("      ")]
    assert long == []


def test_report_verbosity_levels() -> None:
    base, cur = pair(1, 1)
    c = compare(base, cur)
    quiet = report_lines(
        c, None, None, baseline_label="a", current_label="b", band=None, verbosity=-1
    )
    assert "better (1): b0" in quiet and not any("query" in line for line in quiet)
    loud = report_lines(
        c, None, None, baseline_label="a", current_label="b", band=None, verbosity=2
    )
    assert "stable pass (3): p0, p1, p2" in loud and "stable fail (3): f0, f1, f2" in loud
    assert not any(line.startswith("gate") for line in loud)


# --- run views, resolution, the command ----------------------------------------------------


def write_run(
    runs: Path,
    name: str,
    verdicts: Mapping[str, str | None],
    *,
    label: str | None = None,
    status: str = "complete",
    contaminated: set[str] = frozenset(),  # type: ignore[assignment]
    sealed: bool = True,
    **pins: Any,
) -> Path:
    run_dir = runs / name
    merged = {**PINS, **pins}
    info = RunInfo.model_validate(
        {
            "runId": name,
            "label": label,
            "sessionId": f"session-of-{runs.name}-{name}",
            "phase": "baseline",
            "started": "2026-11-30T00:00:00Z",
            "status": status,
            "selection": whole_selection(len(verdicts)),
            **merged,
        }
    )
    write_run_info(run_dir, info)
    events: list[Any] = []
    for qid, verdict in verdicts.items():
        dirty = qid in contaminated
        events.append(
            AttemptEvent(
                qid=qid,
                sample=None,
                phase="baseline",
                question_sha="0" * 16,
                submitted=True,
                answer_id=uuid.uuid4().hex,
                final_query=f"run: {qid} -> {{ {name} }}",
                contaminated=dirty,
            )
        )
        events.append(
            ScoreEvent(
                qid=qid,
                sample=None,
                phase="baseline",
                verdict=None if dirty else verdict,  # type: ignore[arg-type]
                reason="contaminated" if dirty else "judged",
                why=f"judge on {qid}",
                contaminated=dirty,
            )
        )
    LedgerWriter(run_dir).append(*events)
    if sealed and status != "running":
        seal_run(run_dir)  # closed, as a run that ends is
    return run_dir


def whole_selection(cases: int, **design: Any) -> dict[str, Any]:
    """run.json `selection` of a run that attempted every case of its split (one sample)."""
    return {
        "split": "all",
        "samples": 1,
        "judgeSamples": 1,
        "maxTurns": 16,
        "maxTokens": 400000,
        "cases": cases,
        "attempted": cases,
        "leftOut": {},
        "whole": True,
        "narrowedBy": [],
        **design,
    }


def test_run_view_from_a_ledger(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, "r1", {"q1": "match", "q2": None}, label="ecom-baseline-01")
    LedgerWriter(run_dir).append(attempt("q3", None, None, submitted=False))
    v = run_view(read_run(run_dir))
    assert (v.run_id, v.label, v.name, v.status) == (
        "r1",
        "ecom-baseline-01",
        "ecom-baseline-01",
        "complete",
    )
    assert v.pins == pins_of(PINS)
    assert v.cases["q1"].final_query == "run: q1 -> { r1 }" and v.cases["q1"].why == "judge on q1"
    assert (v.cases["q3"].verdict, v.cases["q3"].reason) == (None, "not_scored")


def test_run_view_of_a_broken_run_names_it(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    with pytest.raises(UnreadableRunError, match=r"missing run.json.*evalloop validate"):
        run_view(read_run(tmp_path / "r"))


def test_resolve_run(tmp_path: Path) -> None:
    runs = tmp_path / "set" / "runs"
    a = write_run(runs, "ecom-baseline-01", {"q": "match"})
    b = write_run(runs, "renamed", {"q": "match"}, label="ecom-loop-01")
    assert resolve_run(str(a), set_dir=None, runs_dir=None) == a
    assert resolve_run("ecom-baseline-01", set_dir=tmp_path / "set", runs_dir=None) == a
    assert resolve_run("ecom-loop-01", set_dir=None, runs_dir=runs) == b
    with pytest.raises(RunNotFoundError) as err:
        resolve_run("ecom-loop-09", set_dir=tmp_path / "set", runs_dir=None)
    assert "ecom-baseline-01, ecom-loop-01, renamed" in str(err.value)
    with pytest.raises(RunNotFoundError, match="pass a run directory, or --set/--runs-dir"):
        resolve_run("nowhere", set_dir=None, runs_dir=None)
    write_run(runs, "other", {"q": "match"}, label="ecom-loop-01")
    with pytest.raises(RunNotFoundError, match="names 2 runs"):
        resolve_run("ecom-loop-01", set_dir=None, runs_dir=runs)


def test_flips_main_prints_the_table_and_gates(tmp_path: Path, capsys: Any) -> None:
    runs = tmp_path / "set" / "runs"
    base = {f"q{i}": "no_match" for i in range(6)} | {"q9": "match"}
    write_run(runs, "base", base, label="ecom-baseline-01")
    write_run(runs, "cur", {q: "match" for q in base}, label="ecom-loop-01")
    argv = ["ecom-baseline-01", "ecom-loop-01", "--set", str(tmp_path / "set")]
    assert flips_main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("flips: ecom-baseline-01 (baseline) -> ecom-loop-01 (current)\n")
    assert "better (no_match -> match): 6   worse (match -> no_match): 0" in out
    assert "same query in both arms" not in out and "    baseline query:" in out
    assert flips_main([*argv, "--gate", "bar"]) == 0
    assert "gate bar: ACCEPTED -- acceptance bar: 0 worse needs >= 5 better; got 6" in (
        capsys.readouterr().out
    )
    assert (
        flips_main(
            ["ecom-loop-01", "ecom-baseline-01", "--set", str(tmp_path / "set"), "--gate", "bar"]
        )
        == EXIT_GATE_REJECTED
    )
    assert "gate bar: REJECTED" in capsys.readouterr().out


def test_flips_main_targeted_with_b2_and_calibration_band(tmp_path: Path, capsys: Any) -> None:
    set_dir = tmp_path / "set"
    runs = set_dir / "runs"
    write_run(runs, "a", {"t": "no_match", "u": "match", "v": "match"})
    write_run(runs, "b", {"t": "match", "u": "no_match", "v": "match"})
    write_run(runs, "c", {"t": "match", "u": "no_match", "v": "match"})
    write_run(runs, "aa1", {"t": "no_match", "u": "match", "v": "match"})
    write_run(runs, "aa2", {"t": "no_match", "u": "match", "v": "no_match"})
    assert flips_main(["aa1", "aa2", "--set", str(set_dir), "--calibration"]) == 0
    block = capsys.readouterr().out
    (set_dir / "CALIBRATION.md").write_text("# Calibration\n\n" + block)
    [aa] = parse_calibration(block).bands
    assert (aa.band, aa.runs, aa.flipped, aa.pins) == (1, ["aa1", "aa2"], ["v"], PINS)
    code = flips_main(
        ["a", "b", "--set", str(set_dir), "--targets", "t", "--b2", "c", "--gate", "bar"]
    )
    out = capsys.readouterr().out
    assert code == EXIT_GATE_REJECTED
    assert "A/A noise band 1 (CALIBRATION.md:" in out
    assert "within the measured noise band (1)" in out
    assert "REGRESSED IN BOTH post arms" in out and "gate bar: REJECTED" in out


def test_flips_main_calibration_refuses_a_pair_with_differing_pins(
    tmp_path: Path, capsys: Any
) -> None:
    write_run(tmp_path, "a", {"q": "match"})
    write_run(tmp_path, "b", {"q": "match"}, judgeModel="other")
    assert flips_main([str(tmp_path / "a"), str(tmp_path / "b"), "--calibration"]) == 2
    assert "not an A/A pair: pins differ (judgeModel)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--noise-band", "-1"], "'-1' is not a flip count"),
        (["--gate", "strict"], "invalid choice: 'strict'"),
        (["--b2", "a"], "name the targets with --targets"),
        (["--targets", "@/nonexistent/t.txt"], "targets file /nonexistent/t.txt"),
    ],
)
def test_flips_main_bad_arguments_exit_2(
    tmp_path: Path, capsys: Any, extra: list[str], message: str
) -> None:
    write_run(tmp_path, "a", {"q": "match"})
    write_run(tmp_path, "b", {"q": "match"})
    assert flips_main([str(tmp_path / "a"), str(tmp_path / "b"), *extra]) == 2
    assert message in capsys.readouterr().err


def test_flips_main_unknown_label_lists_runs(tmp_path: Path, capsys: Any) -> None:
    write_run(tmp_path / "runs", "ecom-baseline-01", {"q": "match"})
    assert flips_main(["ecom-baseline-09", "x", "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "no run 'ecom-baseline-09'" in err and "ecom-baseline-01" in err


def test_flips_main_harness_failure_exit(tmp_path: Path, capsys: Any) -> None:
    write_run(tmp_path, "a", {f"q{i}": "no_match" for i in range(12)})
    dirty = write_run(tmp_path, "b", {f"q{i}": "match" for i in range(12)}, contaminated={"q0"})
    assert harness_failure(read_run(dirty)) is None  # 1 of 12 is under 10%
    write_run(tmp_path, "c", {f"q{i}": "match" for i in range(12)}, contaminated={"q0", "q1"})
    argv = [str(tmp_path / "a"), str(tmp_path / "c")]
    assert flips_main([*argv, "--gate", "bar"]) == EXIT_HARNESS_FAILURE
    assert "2 of 12 attempts contaminated" in capsys.readouterr().err
    assert flips_main(argv) == 0
    aborted = write_run(tmp_path, "d", {"q": "match"}, status="aborted")
    assert harness_failure(read_run(aborted)) == "run d aborted"
    small = write_run(tmp_path, "e", {"q1": "match", "q2": "match"}, contaminated={"q1"})
    assert "1 of 2 attempts contaminated" in (harness_failure(read_run(small)) or "")


def test_flips_main_over_ten_thousand_cases(tmp_path: Path, capsys: Any) -> None:
    n = 10_000
    base = {f"q{i}": ("match" if i % 3 else "no_match") for i in range(n)}
    cur = {q: ("no_match" if q in ("q1", "q2") else v) for q, v in base.items()}
    cur |= {f"q{i}": "match" for i in range(0, 30, 3)}
    write_run(tmp_path, "a", base)
    write_run(tmp_path, "b", cur)
    started = time.perf_counter()
    code = flips_main([str(tmp_path / "a"), str(tmp_path / "b"), "--gate", "bar"])
    elapsed = time.perf_counter() - started
    out = capsys.readouterr().out
    assert code == 0, out
    assert "better (no_match -> match): 10   worse (match -> no_match): 2" in out
    assert "gate bar: ACCEPTED -- acceptance bar: 2 worse needs >= 9 better; got 10" in out
    # Speed is measured, not asserted (bench/); the figure is printed for -s.
    print(f"flips_main over 2 x {n} cases: {elapsed:.2f}s")


def test_calibration_block_is_json_in_a_fence(tmp_path: Path, capsys: Any) -> None:
    write_run(tmp_path, "a", {"q": "match"})
    write_run(tmp_path, "b", {"q": "no_match"})
    assert flips_main([str(tmp_path / "a"), str(tmp_path / "b"), "--calibration"]) == 0
    out = capsys.readouterr().out
    body = out.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(body)["band"] == 1


def test_default_view_details_the_first_flips_only() -> None:
    c = compare(*pair(30, 0))
    lines = report_lines(
        c, None, None, baseline_label="a", current_label="b", band=None, verbosity=0
    )
    detailed = [line for line in lines if re.fullmatch(r"  b\d+: no_match -> match", line)]
    assert len(detailed) == DETAIL_LIMIT
    assert any(line.startswith("  ... and 5 more (-v shows them): ") for line in lines)
    every = report_lines(
        c, None, None, baseline_label="a", current_label="b", band=None, verbosity=1
    )
    assert sum(bool(re.fullmatch(r"  b\d+: no_match -> match", line)) for line in every) == 30


def test_the_compared_read_gives_the_validated_reads_view(tmp_path: Path) -> None:
    verdicts = {"q1": "match", "q2": "no_match", "q3": None, "q4": "near_match"}
    run_dir = write_run(tmp_path, "r", verdicts, contaminated={"q2"})
    LedgerWriter(run_dir).append(
        AttemptEvent(
            qid="q5", sample=1, phase="p", question_sha="0" * 16, submitted=True, final_query="A"
        ),
        score("q5", 1, "match"),
        AttemptEvent(
            qid="q5", sample=2, phase="p", question_sha="0" * 16, submitted=True, final_query="B"
        ),
        score("q5", 2, "no_match", gold_status="verified_wrong"),
    )
    light = read_compared(run_dir)
    assert run_view(light) == run_view(read_run(run_dir))
    assert harness_failure(light) == harness_failure(read_run(run_dir))
    assert harness_failure(light) == (
        "run r: 1 of 6 attempts contaminated (limit: any on a run under 10 attempts): q2: "
        "contaminated; fix the answerer's isolation and re-run"
    )


def test_the_flips_command_imports_no_sdk(tmp_path: Path) -> None:
    write_run(tmp_path, "a", {"q1": "match", "q2": "no_match"})
    write_run(tmp_path, "b", {"q1": "no_match", "q2": "match"})
    code = (
        "import sys; from pytest_evalloop.cli import main; "
        f"code = main(['flips', {str(tmp_path / 'a')!r}, {str(tmp_path / 'b')!r}]); "
        "print('HEAVY', sorted({'anthropic', 'mcp', 'duckdb', 'pytest'} & set(sys.modules)), code)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "better (no_match -> match): 1   worse (match -> no_match): 1" in out
    assert "HEAVY [] 0" in out


def test_a_view_takes_an_attempts_last_query_and_first_score_whatever_the_read(
    tmp_path: Path,
) -> None:
    run_dir = write_run(tmp_path, "r", {"q1": "match"})
    # A resumed run answered q2 again; a broken ledger then scored it twice.
    LedgerWriter(run_dir).append(attempt("q2", None, "OLD", contaminated=True))
    LedgerWriter(run_dir).append(attempt("q2", None, "NEW"), score("q2", None, "no_match"))
    LedgerWriter(run_dir).append(score("q2", None, "match", contaminated=True))

    fresh = read_compared(run_dir)
    cached = read_compared(run_dir)
    validated = read_run(run_dir)
    side = run_view(fresh).cases["q2"]
    assert (side.verdict, side.final_query) == ("no_match", "NEW")
    assert run_view(cached) == run_view(fresh) == run_view(validated)
    # The last attempt and the first score are clean: nothing counts as contaminated.
    assert harness_failure(cached) is harness_failure(validated) is None
