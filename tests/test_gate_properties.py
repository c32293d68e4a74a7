"""Metamorphic properties of the measurement layer (issue 24), with Hypothesis.

Generated pairs of runs and transformations that must never make a gate more accepting:
turning a current pass into not submitted or a harness error, contaminating a current attempt,
pairing a run with itself, duplicating a post arm, changing a breaking pin. And invariants that
every view keeps: each case lands in exactly one class of the flip table, the light read a
comparison uses counts what the validated read counts, and the submitted share is one figure.
Bounded: a few hundred examples, no deadline (a ledger is written per example in the last).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_evalloop.ledger.reader import read_run
from pytest_evalloop.measure import aggregates, transitions
from pytest_evalloop.measure.comparison import compare, read_compared, run_view
from pytest_evalloop.measure.gate import decide_gate, targeted
from tests.test_flips import write_run
from tests.test_gate_fooling import PINS, view

WORDS = [
    "match",
    "no_match",
    "near_match",
    "needs_human",
    "not_submitted",
    "contaminated",
    "gold_wrong",
    "harness_error",
    None,
]
RANK = {"accepted": 2, "unresolved": 1, "rejected": 0, "refused": 0}
GATES = ["bar", "no-regressions"]
BOUNDED = settings(max_examples=200, deadline=None)

qids = st.lists(st.sampled_from([f"q{i}" for i in range(24)]), min_size=1, max_size=24, unique=True)


@st.composite
def pairs(draw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A baseline and a current run, as a word per case."""
    cases = draw(qids)
    base = {q: draw(st.sampled_from(WORDS)) for q in cases}
    cur = {q: draw(st.sampled_from(WORDS)) for q in cases}
    return base, cur


def rank(gate: str, base: dict[str, Any], cur: dict[str, Any], **pins: Any) -> int:
    b, c = view("base", base), view("cur", cur)
    c.pins.update(pins)
    verdict = decide_gate(gate, compare(b, c), allow_pin_mismatch=False, targeted=None)  # type: ignore[arg-type]
    return RANK[verdict.decision]


@BOUNDED
@given(pairs(), st.sampled_from(GATES), st.data())
def test_doing_less_or_cheating_never_makes_a_gate_more_accepting(
    pair: tuple[dict[str, Any], dict[str, Any]], gate: str, data: Any
) -> None:
    base, cur = pair
    q = data.draw(st.sampled_from(sorted(cur)))
    for was in WORDS:  # every side the case could have had now, not only the drawn one
        now = {**cur, q: was}
        before = rank(gate, base, now)
        for into in ("not_submitted", "harness_error", "contaminated"):
            if into != "contaminated" and was != "match":
                continue  # the transformations: a pass that is given up
            changed = {**now, q: into}
            assert rank(gate, base, changed) <= before, (q, base[q], was, into)


@BOUNDED
@given(pairs(), st.sampled_from(GATES))
def test_declining_every_case_is_never_accepted_after_a_pass(
    pair: tuple[dict[str, Any], dict[str, Any]], gate: str
) -> None:
    base, _ = pair
    declined = {q: "not_submitted" for q in base}
    if "match" in base.values():
        assert rank(gate, base, declined) < RANK["accepted"]


@BOUNDED
@given(pairs())
def test_a_run_paired_with_itself_is_never_accepted_by_the_bar(
    pair: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    base, _ = pair
    assert rank("bar", base, base) < RANK["accepted"]


@BOUNDED
@given(pairs(), st.sampled_from(["datasetSha", "judgeVersion", "rubricSha", "answererModel"]))
def test_a_changed_breaking_pin_is_always_refused(
    pair: tuple[dict[str, Any], dict[str, Any]], pin: str
) -> None:
    base, cur = pair
    for gate in GATES:
        assert rank(gate, base, cur, **{pin: "changed"}) == 0


@BOUNDED
@given(pairs(), st.data())
def test_a_duplicated_post_arm_is_one_arm(
    pair: tuple[dict[str, Any], dict[str, Any]], data: Any
) -> None:
    base, cur = pair
    aimed = data.draw(st.lists(st.sampled_from(sorted(base)), min_size=1, unique=True))
    b, c = view("base", base), view("cur", cur)
    one = targeted(b, c, None, aimed, 0).decision()[0]
    twice = targeted(b, c, view("cur", cur), aimed, 0).decision()[0]
    assert RANK[twice] <= RANK[one]
    assert targeted(b, c, view("cur", cur), aimed, 0).arms == 1


@BOUNDED
@given(pairs())
def test_every_case_lands_in_exactly_one_class(
    pair: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    base, cur = pair
    c = compare(view("base", base), view("cur", cur))
    classes = [
        [f.qid for f in c.better],
        [f.qid for f in c.worse],
        c.stable_pass,
        c.stable_fail,
        [n.qid for n in c.neither],
        [u.qid for u in c.undecided],
        [d.qid for d in c.dropped],
    ]
    placed = [q for group in classes for q in group]
    assert sorted(placed) == sorted(base)
    for f in c.worse:
        assert base[f.qid] == "match"
    for f in c.better:
        assert (base[f.qid], cur[f.qid]) == ("no_match", "match")
    for u in c.undecided:
        assert base[u.qid] == "match" and u.word in transitions.LOST_AFTER_A_PASS


LEDGER_WORDS = ["match", "no_match", "near_match", "needs_human", None]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.dictionaries(
        st.sampled_from([f"q{i}" for i in range(12)]),
        st.tuples(st.sampled_from(LEDGER_WORDS), st.booleans()),
        min_size=1,
    )
)
def test_the_light_read_counts_what_the_validated_read_counts(
    tmp_path_factory: pytest.TempPathFactory, rows: dict[str, tuple[str | None, bool]]
) -> None:
    runs = tmp_path_factory.mktemp("runs")
    verdicts = {q: v for q, (v, _) in rows.items()}
    dirty = {q for q, (_, c) in rows.items() if c}
    run_dir = write_run(runs, "r", verdicts, contaminated=dirty)
    full, light = aggregates.tally(read_run(run_dir)), aggregates.tally(read_compared(run_dir))
    assert full.outcomes == light.outcomes
    assert full.totals() == light.totals()
    v = run_view(read_compared(run_dir))
    assert (v.submitted, v.answerable, v.outcomes) == (
        full.submitted,
        full.answerable,
        full.outcomes,
    )
    assert v.withheld == full.withheld
    assert set(PINS) <= set(v.pins)
    assert full.answerable == len(rows) - len(dirty)


def test_the_properties_module_is_bounded() -> None:
    # A guard for the suite's time: the generated tests above keep their example budgets.
    assert BOUNDED.max_examples <= 200 and BOUNDED.deadline is None
    assert Path(__file__).name == "test_gate_properties.py"
