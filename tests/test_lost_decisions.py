"""No regression escapes into a state that does not count (issue 41, points 1, 2 and 7).

A case decided `match` in the baseline can leave the decided verdicts by many doors now: not
submitted, no host log, contaminated, an answer the harness could not judge (its size, its
form), needs_human, near_match, an unparseable judge, the golden doubted, a harness error.
`transitions.transition` names each one and decides what it costs: worse when the answerer left
the case unanswered, else a lost decision every gate reads as worse before it accepts. These
tests go through the pure measurement functions every view shares, with runs built in memory
(attempt and score events, several samples included), and end with the metamorphic property:
making a passing case worse by any door never raises any gate's decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalloop.ledger.contract import AttemptEvent, ScoreEvent
from pytest_evalloop.measure import aggregates, significance, transitions
from pytest_evalloop.measure.comparison import RunView, case_side, compare
from pytest_evalloop.measure.comparison_text import report_lines
from pytest_evalloop.measure.gate import TargetedReport, decide_gate, targeted
from tests.test_gate_fooling import PINS

DOORS = (
    "not_submitted",
    "contamination_unknown",
    "contaminated",
    "answer_error",
    "harness_error",
    "needs_human",
    "near_match",
    "judge_unparseable",
    "gold_wrong",
    "unscored",
)
"""Every way a case that passed can be undecided now (the issue's point 1), as sample words."""
WORSE = {"not_submitted", "contamination_unknown", "contaminated", "answer_error"}
WORDS = ("match", "no_match", *DOORS)
RANK = {"accepted": 2, "unresolved": 1, "rejected": 0, "refused": 0}


# --- runs in memory ---------------------------------------------------------------------------


def events(qid: str, sample: int | None, word: str) -> tuple[AttemptEvent, ScoreEvent | None]:
    """The attempt and score events of one sample whose outcome is `word`."""
    attempt = AttemptEvent(
        qid=qid,
        sample=sample,
        phase="baseline",
        question_sha="0" * 16,
        submitted=word != "not_submitted",
        final_query=None if word == "not_submitted" else f"SELECT '{qid}'",
        contaminated=word == "contaminated",
    )
    if word in ("harness_error", "answer_error"):
        cause = "answer" if word == "answer_error" else "harness"
        attempt = attempt.model_copy(update={"error": "judge: refused", "error_cause": cause})
        return attempt, None
    verdict, reason, extra = {
        "match": ("match", "judged", {}),
        "no_match": ("no_match", "judged", {}),
        "near_match": ("near_match", "judged", {}),
        "needs_human": ("needs_human", "low_confidence: judge said match at 4/10", {}),
        "judge_unparseable": ("needs_human", "judge_unparseable", {}),
        "gold_wrong": ("match", "judged", {"gold_status": "verified_wrong", "gold_note": "n"}),
        "unscored": (None, "golden_provisional", {}),
        "not_submitted": (None, "not_submitted", {}),
        "contamination_unknown": (None, "contamination_unknown", {"contaminated": "unknown"}),
        "contaminated": (None, "contaminated", {"contaminated": True}),
    }[word]
    score = ScoreEvent(
        qid=qid,
        sample=sample,
        phase="baseline",
        verdict=verdict,  # type: ignore[arg-type]
        reason=reason,
        why=f"{word} on {qid}",
        **extra,
    )
    return attempt, score


Run = Mapping[str, Sequence[str]]
"""A run as each case's sample words (one word: one sample, sample None)."""


def build(name: str, run: Run) -> tuple[RunView, aggregates.Tally]:
    """The run's view (as `comparison.run_view` builds it) and its tally, from its events."""
    attempts: dict[aggregates.Key, Any] = {}
    scores: dict[aggregates.Key, Any] = {}
    sides = {}
    for qid, words in run.items():
        case_scores, answer_error = [], False
        for i, word in enumerate(words):
            sample = None if len(words) == 1 else i + 1
            attempt, score = events(qid, sample, word)
            attempts[(qid, sample)] = attempt
            answer_error = answer_error or word == "answer_error"
            if score is not None:
                scores[(qid, sample)] = score
                case_scores.append(score)
        sides[qid] = case_side(qid, case_scores, {}, answer_error=answer_error)
    tally = aggregates.tally_events(attempts, scores, {}, name=name, status="complete")
    view = RunView(
        run_id=name,
        label=name,
        pins=dict(PINS),
        status="complete",
        cases=sides,
        withheld=tally.withheld,
        outcomes=tally.outcomes,
        submitted=tally.submitted,
        answerable=tally.answerable,
    )
    return view, tally


def decision(
    gate: str,
    base: Run,
    cur: Run,
    *,
    targets: list[str] | None = None,
    post2: Run | None = None,
    band: int | None = None,
) -> str:
    (b, bt), (c, ct) = build("base", base), build("cur", cur)
    comparison = compare(b, c)
    report = None
    if targets is not None:
        second = build("cur2", post2)[0] if post2 is not None else None
        report = targeted(b, c, second, targets, band)
    paired = significance.tests_of(comparison, bt, ct)
    verdict = decide_gate(
        gate,  # type: ignore[arg-type]
        comparison,
        allow_pin_mismatch=False,
        targeted=report,
        paired=paired,
    )
    return verdict.decision


def one(words: Mapping[str, str]) -> dict[str, list[str]]:
    return {q: [w] for q, w in words.items()}


def text_of(base: Run, cur: Run) -> list[str]:
    """The flip table's lines, as the terminal and `evalloop flips` print them."""
    (b, _), (c, _) = build("base", base), build("cur", cur)
    return report_lines(
        compare(b, c),
        None,
        None,
        baseline_label="base",
        current_label="cur",
        band=None,
        verbosity=0,
    )


# --- the transition rule ------------------------------------------------------------------------


@pytest.mark.parametrize("door", DOORS)
def test_every_door_out_of_a_pass_is_named_and_counted(door: str) -> None:
    b, _ = build("base", one({"q": "match"}))
    c, _ = build("cur", one({"q": door}))
    comparison = compare(b, c)
    if door in WORSE:
        assert [f.qid for f in comparison.worse] == ["q"]
        assert comparison.worse_by() == {f"match -> {door}": 1}
    else:
        assert [(u.qid, u.word) for u in comparison.undecided] == [("q", door)]
        assert comparison.undecided_by() == {f"match -> {door}": 1}
    # Never dropped, never neither: a decision the baseline had is never silently lost.
    assert comparison.dropped == [] and comparison.neither == []


@pytest.mark.parametrize("door", DOORS)
def test_a_fail_that_leaves_the_decided_verdicts_is_no_regression(door: str) -> None:
    kind, _ = transitions.transition("no_match", door)  # type: ignore[arg-type]
    assert kind in ("neither", "dropped")


def test_one_pass_undecided_stops_a_bare_acceptance() -> None:
    # Five fixed (the bar's 0 worse -> 5 better), one pass the judge could not decide now.
    base = one({**{f"f{i}": "no_match" for i in range(5)}, "p": "match"})
    cur = one({**{f"f{i}": "match" for i in range(5)}, "p": "needs_human"})
    assert decision("bar", base, {**cur, "p": ["match"]}) == "accepted"
    assert decision("bar", base, cur) == "unresolved"
    assert decision("no-regressions", base, cur) == "unresolved"
    # With nine fixed, one lost decision read as worse still clears the bar (1 worse -> 7).
    base9 = one({**{f"f{i}": "no_match" for i in range(9)}, "p": "match"})
    cur9 = one({**{f"f{i}": "match" for i in range(9)}, "p": "gold_wrong"})
    assert decision("bar", base9, cur9) == "accepted"


def test_the_gate_reason_names_the_lost_decisions_by_their_real_transition() -> None:
    base = one({**{f"f{i}": "no_match" for i in range(5)}, "a": "match", "b": "match"})
    cur = one({**{f"f{i}": "match" for i in range(5)}, "a": "judge_unparseable", "b": "near_match"})
    (b, _), (c, _) = build("base", base), build("cur", cur)
    verdict = decide_gate("bar", compare(b, c), allow_pin_mismatch=False, targeted=None)
    reason = " ".join(verdict.reason.split())
    assert verdict.decision == "unresolved"
    assert "2 that passed in the baseline are undecided now" in reason
    assert "match -> judge_unparseable: a" in reason and "match -> near_match: b" in reason
    assert "2 worse needs >= 9 better; got 5" in reason


def test_flip_headers_name_the_transitions_that_happened() -> None:
    # The run: 40 passes not submitted now were headed `worse (match -> no_match): 40`.
    base = one({f"q{i}": "match" for i in range(44)})
    cur = one({f"q{i}": "match" if i < 4 else "not_submitted" for i in range(44)})
    cur["q0"], base["q1"] = ["no_match"], ["match"]
    lines = text_of(base, cur)
    counts = next(line for line in lines if line.startswith("better (no_match -> match)"))
    assert counts.endswith("worse: 41 (match -> no_match 1, match -> not_submitted 40)")
    # A side the judge showed wrong is named so, with its own reason, never the baseline's why.
    text = text_of(one({"g": "match"}), one({"g": "gold_wrong"}))
    shown = next(line for line in text if line.strip().startswith("g: "))
    assert shown.strip().startswith("g: match -> gold_wrong (gold_status verified_wrong")
    assert "match on g" not in shown  # the baseline's why
    assert any("undecided now after a pass (match -> gold_wrong): 1" in line for line in text)


def test_a_targeted_acceptance_reads_untargeted_lost_decisions_as_worse() -> None:
    base = one({"t1": "no_match", "t2": "no_match", "u": "match"})
    fixed = one({"t1": "match", "t2": "match", "u": "match"})
    lost = {**fixed, "u": ["needs_human"]}
    assert decision("bar", base, fixed, targets=["t1", "t2"], post2=fixed, band=0) == "accepted"
    # Undecided in one arm: read as worse it is one untargeted flip, above a band of 0.
    assert decision("bar", base, lost, targets=["t1", "t2"], post2=fixed, band=0) == "unresolved"
    assert decision("bar", base, lost, targets=["t1", "t2"], post2=fixed, band=1) == "accepted"
    # Undecided in both arms: read as worse it regressed in both, which is never accepted.
    assert decision("bar", base, lost, targets=["t1", "t2"], post2=lost, band=5) == "unresolved"


def test_a_report_with_no_undecided_arms_keeps_its_decision() -> None:
    report = TargetedReport(arms=2, untargeted_better=[[], []], untargeted_worse=[[], []])
    assert report.decision() == report._decision()


# --- point 2: the paired tests count what the bar counts --------------------------------------


def test_declining_eight_passes_is_no_significant_improvement() -> None:
    # The repro under --eval-samples=2: a few better, eight passes not submitted now.
    base = {
        **{f"b{i}": ["no_match", "no_match"] for i in range(4)},
        **{f"d{i}": ["match", "match"] for i in range(8)},
        **{f"s{i}": ["match", "match"] for i in range(12)},
    }
    cur = {
        **{f"b{i}": ["match", "match"] for i in range(4)},
        **{f"d{i}": ["not_submitted", "not_submitted"] for i in range(8)},
        **{f"s{i}": ["match", "match"] for i in range(12)},
    }
    (b, bt), (c, ct) = build("base", base), build("cur", cur)
    comparison = compare(b, c)
    tests = significance.tests_of(comparison, bt, ct)
    assert (tests.better, tests.worse) == (4, 8)
    # Each declined pass is a 0 now (difference -1): the mean change is negative, 4 - 8 over 24.
    assert tests.sign_flip_cases == 24
    assert tests.mean_difference == pytest.approx((4 - 8) / 24)
    assert not tests.improves
    assert decision("bar+significant", base, cur) == "rejected"


def test_an_unanswered_sample_among_passes_lowers_the_fraction_not_the_majority() -> None:
    base = {"q": ["match", "match"], "r": ["no_match", "no_match"]}
    cur = {"q": ["match", "answer_error"], "r": ["no_match", "no_match"]}
    (b, bt), (c, ct) = build("base", base), build("cur", cur)
    comparison = compare(b, c)
    assert comparison.stable_pass == ["q"]  # the case's majority of decided samples
    tests = significance.tests_of(comparison, bt, ct)
    assert tests.mean_difference == pytest.approx(-0.25)  # q: 2/2 -> 1/2; r: 0 -> 0


def test_a_significant_decline_never_passes_bar_significant() -> None:
    # The bar accepts on majority flips (five 1/3 -> 2/3), while every stable pass lost a
    # sample: the two-sided p is small, the change is no improvement.
    base = {
        **{f"f{i}": ["match", "no_match", "no_match"] for i in range(5)},
        **{f"s{i}": ["match", "match", "match"] for i in range(10)},
    }
    cur = {
        **{f"f{i}": ["match", "match", "no_match"] for i in range(5)},
        **{f"s{i}": ["match", "match", "not_submitted"] for i in range(10)},
    }
    (b, bt), (c, ct) = build("base", base), build("cur", cur)
    tests = significance.tests_of(compare(b, c), bt, ct)
    assert tests.mean_difference is not None and tests.mean_difference < 0
    assert decision("bar", base, cur) == "accepted"
    assert decision("bar+significant", base, cur) == "unresolved"


@pytest.mark.parametrize("door", sorted(set(DOORS) - WORSE))
def test_bar_significant_reads_a_lost_decision_as_a_loss(door: str) -> None:
    # Seven fixed and one pass undecided now: the bar accepts (read as worse: 1 worse needs 7),
    # and McNemar is taken over 7 better against 1 (p = 0.0703), as it is for a real fail.
    base = one({**{f"f{i}": "no_match" for i in range(7)}, "p": "match"})
    fixed = {f"f{i}": ["match"] for i in range(7)}
    for now in (door, "no_match"):
        cur = {**fixed, "p": [now]}
        (b, bt), (c, ct) = build("base", base), build("cur", cur)
        tests = significance.tests_of(compare(b, c), bt, ct)
        assert tests.mcnemar_p == pytest.approx(0.0703125)
        assert decision("bar", base, cur) == "accepted"
        assert decision("bar+significant", base, cur) == "unresolved"
    sampled = {q: w * 2 for q, w in base.items()}
    for now in (door, "no_match"):
        cur2 = {**{q: w * 2 for q, w in fixed.items()}, "p": [now, now]}
        (b, bt), (c, ct) = build("base", sampled), build("cur", cur2)
        tests = significance.tests_of(compare(b, c), bt, ct)
        # p: 2/2 -> 0/2, a loss in the sign-flip test whatever door it left by.
        assert tests.mean_difference == pytest.approx((7 - 1) / 8)
        assert tests.sign_flip_p == pytest.approx(18 / 256)  # |sum| >= 6 of 2^8


def test_paired_tests_record_sign_flip_fields_only_with_samples() -> None:
    (b, bt), (c, ct) = build("base", one({"q": "no_match"})), build("cur", one({"q": "match"}))
    recorded = significance.record(significance.tests_of(compare(b, c), bt, ct))
    assert set(recorded) == {"better", "worse", "undecided", "mcnemarP"}
    (b, bt), (c, ct) = build("b", {"q": ["no_match"] * 2}), build("c", {"q": ["match"] * 2})
    sampled = significance.record(significance.tests_of(compare(b, c), bt, ct))
    assert {"signFlipP", "signFlipCases", "meanDifference"} <= set(sampled)


# --- the metamorphic property -------------------------------------------------------------------

SAMPLE_WORDS = st.sampled_from(WORDS)


@st.composite
def pairs(draw: Any) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[str]]]:
    """A baseline, a current run and a second post arm over up to 16 cases (the sign-flip test
    is exact up to 16 non-zero changes), one or two samples per case."""
    k = draw(st.sampled_from([1, 2]))
    qids = draw(st.lists(st.sampled_from([f"q{i}" for i in range(16)]), min_size=1, unique=True))
    # Mostly decided words, so acceptances (the interesting side of the property) occur.
    word = st.one_of(st.sampled_from(["match", "no_match"]), SAMPLE_WORDS)

    def run() -> dict[str, list[str]]:
        return {q: [draw(word) for _ in range(k)] for q in qids}

    return run(), run(), run()


@settings(max_examples=300, deadline=None)
@given(pairs(), st.data())
def test_making_a_passing_case_worse_never_raises_any_gate(
    runs: tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[str]]], data: Any
) -> None:
    base, cur, post2 = runs
    # Make one case pass in the current run, so there is always a passing case to worsen.
    q = data.draw(st.sampled_from(sorted(cur)), label="case")
    cur = {**cur, q: ["match"] * len(cur[q])}
    door = data.draw(st.sampled_from(DOORS), label="door")
    every = data.draw(st.booleans(), label="every sample")
    words = list(cur[q])
    if every:
        words = [door] * len(words)
    else:
        words[data.draw(st.integers(0, len(words) - 1), label="sample")] = door
    worse = {**cur, q: words}
    targets = data.draw(st.lists(st.sampled_from(sorted(base)), unique=True), label="targets")
    band = data.draw(st.one_of(st.none(), st.integers(0, 3)), label="band")
    for gate in ("bar", "no-regressions", "bar+significant", "off"):
        before = RANK[decision(gate, base, cur)]
        after = RANK[decision(gate, base, worse)]
        assert after <= before, (gate, q, door)
        if targets:
            for second in (None, post2):
                kw: dict[str, Any] = {"targets": targets, "post2": second, "band": band}
                before = RANK[decision(gate, base, cur, **kw)]
                after = RANK[decision(gate, base, worse, **kw)]
                assert after <= before, ("targeted", gate, q, door, second is not None)


@settings(max_examples=300, deadline=None)
@given(pairs(), st.data())
def test_no_door_out_of_a_pass_is_accepted_where_a_fail_would_not_be(
    runs: tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[str]]], data: Any
) -> None:
    """Accepted stays reachable only by real improvements: leaving a passing case by any door
    is never better, for acceptance, than failing it outright (a real regression).

    The whole case leaves (every sample): a case is the majority of its decided samples, so one
    sample lost among passing ones leaves the case a pass for the bar (the sign-flip test
    counts that sample a fail: the property above and docs/measurement.md)."""
    base, cur, post2 = runs
    q = data.draw(st.sampled_from(sorted(cur)), label="case")
    door = data.draw(st.sampled_from(DOORS), label="door")
    n = len(cur[q])
    at = list(range(n))

    def replaced(word: str) -> dict[str, list[str]]:
        words = ["match"] * n
        for i in at:
            words[i] = word
        return {**cur, q: words}

    targets = data.draw(st.lists(st.sampled_from(sorted(base)), unique=True), label="targets")
    band = data.draw(st.one_of(st.none(), st.integers(0, 3)), label="band")
    plans: list[dict[str, Any]] = [{}]
    if targets:
        plans += [{"targets": targets, "post2": s, "band": band} for s in (None, post2)]
    for gate in ("bar", "no-regressions", "bar+significant"):
        for kw in plans:
            if decision(gate, base, replaced(door), **kw) == "accepted":
                assert decision(gate, base, replaced("no_match"), **kw) == "accepted", (
                    gate,
                    q,
                    door,
                    kw,
                )


# --- several samples: a sample that lost its decision never leaves the count --------------

SCORED_WORDS = st.sampled_from(["match", "no_match", "near_match", "needs_human", None, "unscored"])


def _case(words: list[str | None], attempted: int) -> tuple[Any, ...]:
    """A case of `attempted` samples whose first len(words) were scored with these verdicts
    (None: unscored, e.g. not submitted); the rest were attempted and never scored."""
    scores = [
        ScoreEvent(
            qid="q",
            sample=i,
            phase="p",
            verdict=None if w in (None, "unscored") else w,  # type: ignore[arg-type]
            reason="not_submitted" if w is None else "judged",
            contaminated=False,
        )
        for i, w in enumerate(words)
    ]
    side = case_side("q", scores, dict.fromkeys(range(attempted)))
    return side.verdict, transitions.side_word(side.verdict, side.reason, side.excluded)


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(SCORED_WORDS, min_size=2, max_size=5),
    unscored=st.integers(min_value=0, max_value=2),
    data=st.data(),
)
def test_a_sample_made_worse_never_makes_a_case_pass(
    words: list[str | None], unscored: int, data: st.DataObject
) -> None:
    """Under --eval-samples, a case passes only when more than half of all its samples
    (attempted ones never scored included) are matches; so taking any match sample away (to a
    fail, an undecided verdict, a declined answer, or no score at all) never turns a case into
    a pass, and a case that passed and lost a sample's decision is never a stable pass."""
    attempted = len(words) + unscored
    verdict, word = _case(words, attempted)
    matches = words.count("match")
    assert (verdict == "match") == (matches * 2 > attempted)
    if "match" not in words:
        return
    at = data.draw(st.sampled_from([i for i, w in enumerate(words) if w == "match"]))
    worse = data.draw(SCORED_WORDS.filter(lambda w: w != "match"))
    worsened = [*words[:at], worse, *words[at + 1 :]]
    after_verdict, after_word = _case(worsened, attempted)
    if after_verdict == "match":
        assert verdict == "match"
    if word == "match":
        kind, _ = transitions.transition(word, after_word)
        assert kind != "better"
        if after_word != "match":
            assert kind in ("worse", "undecided"), (words, worsened, after_word)


def test_targeted_no_regressions_does_not_accept_a_pass_lost_to_a_harness_error() -> None:
    """Hypothesis found it: targets fixed, an untargeted passing case lost to a harness error.
    Failing that case outright is rejected by no-regressions (band or none); losing its
    decision was accepted. A lost decision is unresolved, targeted or not."""
    base = one({"q0": "no_match", "q1": "no_match", "q2": "match"})
    post2 = one({"q0": "match", "q1": "match", "q2": "match"})
    kw: dict[str, Any] = {"targets": ["q0", "q1"], "post2": post2, "band": 1}
    failed = one({"q0": "match", "q1": "match", "q2": "no_match"})
    lost = one({"q0": "match", "q1": "match", "q2": "harness_error"})
    assert decision("no-regressions", base, failed, **kw) == "rejected"
    assert decision("no-regressions", base, lost, **kw) == "unresolved"
