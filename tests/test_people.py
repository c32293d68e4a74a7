"""People's verdicts count once: one human label per attempt, "people disagree" out of kappa,
superseded fixtures voided by appended lines (docs/review.md, "How people's reviews count")."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_evalloop import cli
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure import aggregates, people
from pytest_evalloop.review.review import GOLDEN_WRONG, ReviewError, record_review
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic
from tests.reviewruns import DOUBTED, FAILED, MATCHED, review_run
from tests.test_agreement import _judge
from tests.test_gate import _malloy_copy, run


def _r(who: str, verdict: str | None, golden_wrong: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        qid="q", sample=None, reviewer=who, verdict=verdict, golden_wrong=golden_wrong
    )


@pytest.mark.parametrize(
    ("reviews", "verdict", "disagree"),
    [
        ([_r("A", "no_match")], "no_match", False),
        # A person's later review replaces their own.
        ([_r("A", "no_match"), _r("A", "match")], "match", False),
        # Two people, two verdicts: people disagree until one more review settles it.
        ([_r("A", "no_match"), _r("B", "match")], "match", True),
        ([_r("A", "no_match"), _r("B", "match"), _r("C", "match")], "match", False),
        ([_r("A", "no_match"), _r("B", "match"), _r("A", "match")], "match", False),
        # Saying it twice is still one person.
        ([_r("A", "no_match"), _r("B", "match"), _r("B", "match")], "match", True),
        ([_r("A", "no_match"), _r("C", "near_match"), _r("D", "match")], "match", True),
        # A dissent against two reopens it; "golden is wrong" is no verdict.
        ([_r("A", "no_match"), _r("B", "no_match"), _r("C", "match")], "match", True),
        ([_r("A", "no_match"), _r("B", None, golden_wrong=True)], "no_match", False),
    ],
)
def test_one_human_label(reviews: list[SimpleNamespace], verdict: str, disagree: bool) -> None:
    label = people.label_of(reviews)
    assert label is not None
    assert (label.verdict, label.disagree) == (verdict, disagree)


def test_no_verdict_review_is_no_label() -> None:
    assert people.label_of([_r("A", None, golden_wrong=True)]) is None
    assert people.label_of([]) is None


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real three-case run (its set around it), copied per test."""
    run_dir = review_run(tmp_path_factory.mktemp("people"))
    # Without report.html a review rewrites no report (a chart render per review).
    (run_dir / "report.html").unlink()
    return run_dir.parent.parent


def _copy(pristine: Path, root: Path) -> Path:
    target = root / "evals" / pristine.name
    if target.parent.exists():
        shutil.rmtree(target.parent)
    shutil.copytree(pristine, target, symlinks=True)
    return target / "runs" / "r1"


def _review(run_dir: Path, qid: str, verdict: str, by: str) -> int:
    return cli.main(["review", str(run_dir), qid, "--verdict", verdict, "--why", "w", "--by", by])


def _lines(set_dir: Path) -> list[dict]:
    path = set_dir / sets.REGRESSIONS_FILE
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_repro_1_a_superseded_fixture_is_voided_by_an_appended_line(
    pristine: Path, tmp_path: Path
) -> None:
    run_dir = _copy(pristine, tmp_path)
    set_dir = run_dir.parent.parent
    assert _review(run_dir, MATCHED, "no_match", "A") == 0
    first = _lines(set_dir)
    assert _review(run_dir, MATCHED, "match", "B") == 0
    # Append-only: the first fixture's line is still there, byte for byte; a void names it.
    after = _lines(set_dir)
    assert after[: len(first)] == first
    [void] = [x for x in after if "void" in x]
    assert void["void"] == first[0]["fixtureId"]
    loaded = sets.load_regressions(set_dir)
    assert not loaded.errors
    assert [f.fixture_id for _, f in loaded.voided] == [first[0]["fixtureId"]]
    [live] = [f for _, f in loaded.rows]
    # A said no_match, B match: people disagree, so the live fixture is out of kappa.
    assert live.people_disagree and live.verdict == "match"
    assert _review(run_dir, MATCHED, "match", "C") == 0
    [settled] = [f for _, f in sets.load_regressions(set_dir).rows]
    assert not settled.people_disagree and settled.verdict == "match"
    assert {r["reviewer"] for r in settled.rulings or []} == {"A", "B", "C"}


def test_repro_2_people_who_disagree_are_out_of_kappa_and_counted_apart(
    pristine: Path, tmp_path: Path
) -> None:
    run_dir = _copy(pristine, tmp_path)
    assert _review(run_dir, MATCHED, "no_match", "A") == 0
    assert _review(run_dir, MATCHED, "near_match", "C") == 0
    assert _review(run_dir, FAILED, "no_match", "A") == 0
    totals = json.loads((run_dir / "run.json").read_text())["totals"]
    # MATCHED: people disagree -> needs_human, neither pass nor fail; FAILED settled no_match.
    assert totals["peopleDisagree"] == 1 and totals["humanSettled"] == 1
    assert totals["outcomes"] == {"no_match": 1, "needs_human": 2}
    live = [f for _, f in sets.load_regressions(run_dir.parent.parent).rows]
    assert {(f.qid, f.people_disagree) for f in live} == {(FAILED, False), (MATCHED, True)}
    tally = aggregates.tally(ledger_reader.read_run(run_dir))
    assert "people disagree: 1" in tally.human_text


def test_a_refused_review_writes_no_fixture_and_no_void(pristine: Path, tmp_path: Path) -> None:
    run_dir = _copy(pristine, tmp_path)
    assert _review(run_dir, MATCHED, "no_match", "A") == 0
    before = (run_dir.parent.parent / sets.REGRESSIONS_FILE).read_bytes()
    with pytest.raises(ReviewError, match="needs a why"):
        record_review(run_dir, MATCHED, "match", why=" ", reviewer="B")
    assert (run_dir.parent.parent / sets.REGRESSIONS_FILE).read_bytes() == before


def test_a_void_naming_no_fixture_is_an_error_naming_its_line(tmp_path: Path) -> None:
    (tmp_path / sets.REGRESSIONS_FILE).write_text('{"void": "nope", "why": "x"}\n')
    loaded = sets.load_regressions(tmp_path)
    [error] = loaded.errors
    assert error.line == 1 and "'nope'" in error.message


REVIEWS = st.lists(
    st.tuples(
        st.sampled_from([MATCHED, DOUBTED, FAILED]),
        # "golden is wrong" holds the golden and is no verdict: it changes no label.
        st.sampled_from(["match", "no_match", "near_match", GOLDEN_WRONG]),
        st.sampled_from(["Ann", "Bo", "Cy"]),
    ),
    min_size=1,
    max_size=7,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(REVIEWS)
def test_every_sequence_of_reviews_counts_each_settled_attempt_once(
    pristine: Path, tmp_path: Path, reviews: list[tuple[str, str, str]]
) -> None:
    run_dir = _copy(pristine, tmp_path)
    set_dir = run_dir.parent.parent
    held: set[str] = set()
    for qid, verdict, who in reviews:
        if verdict == GOLDEN_WRONG and qid in held:
            # A golden already held is not held twice: refused, and nothing is written.
            before = (run_dir / ledger.EVENTS_FILE).read_bytes()
            with pytest.raises(ReviewError, match="already ambiguous"):
                record_review(run_dir, qid, verdict, why="w", reviewer=who)
            assert (run_dir / ledger.EVENTS_FILE).read_bytes() == before
            continue
        held |= {qid} if verdict == GOLDEN_WRONG else set()
        record_review(run_dir, qid, verdict, why="w", reviewer=who)
    # The model: each person's latest verdict, the latest standing when it leads strictly.
    rulings: dict[str, dict[str, str]] = {}
    verdicts = [(qid, verdict, who) for qid, verdict, who in reviews if verdict != GOLDEN_WRONG]
    for qid, verdict, who in verdicts:
        rulings.setdefault(qid, {}).pop(who, None)
        rulings[qid][who] = verdict
    expected: dict[str, tuple[str, bool]] = {}
    for qid, by in rulings.items():
        last = list(by.values())[-1]
        held = Counter(by.values())
        disagree = any(n >= held[last] for v, n in held.items() if v != last)
        expected[qid] = (last, disagree)
    loaded = sets.load_regressions(set_dir)
    assert not loaded.errors, loaded.errors
    live = [f for _, f in loaded.rows]
    # One live fixture per reviewed attempt; kappa's are exactly the settled ones.
    assert Counter(f.qid for f in live) == Counter(list(expected))
    in_kappa = {f.qid: f.verdict for f in live if not f.people_disagree}
    assert in_kappa == {q: v for q, (v, d) in expected.items() if not d}
    # Every verdict review filed a fixture; all but the live ones are voided, none twice.
    assert len(loaded.voided) + len(live) == len(verdicts)
    assert len({f.fixture_id for _, f in loaded.voided}) == len(loaded.voided)
    # The run's totals are a recount from the ledger, and the count follows the labels.
    read = ledger_reader.read_run(run_dir)
    assert not read.errors, read.errors
    recount = aggregates.tally(read)
    assert json.loads((run_dir / "run.json").read_text())["totals"] == recount.totals()
    assert recount.people_disagree == sum(1 for _, d in expected.values() if d)
    assert recount.human_settled == sum(1 for _, d in expected.values() if not d)
    outcome = {a.qid: a.outcome for a in recount.attempts}
    for qid, (verdict, disagree) in expected.items():
        assert outcome[qid] == ("needs_human" if disagree else verdict)


def test_check_judge_skips_what_people_disagree_on_and_never_runs_a_voided_fixture(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = _malloy_copy(pytester.path)
    rows = [json.loads(x) for x in (set_dir / sets.REGRESSIONS_FILE).read_text().splitlines()]
    disputed = {
        **rows[1],
        "fixtureId": "disputed-1",
        "rulings": [
            {"reviewer": "A", "verdict": "no_match"},
            {"reviewer": "C", "verdict": "near_match"},
        ],
        "peopleDisagree": True,
    }
    extra = [{"void": rows[0]["fixtureId"], "why": "superseded"}, disputed]
    with (set_dir / sets.REGRESSIONS_FILE).open("a") as handle:
        handle.write("".join(json.dumps(x) + "\n" for x in extra))
    fake.policy = _judge(set_dir, set())
    result = run(pytester, set_dir, "--eval-check-judge", "-rs")
    result.stdout.fnmatch_lines(
        ["*people disagree on disputed-1 (A no_match, C near_match)*out of kappa*"]
    )
    result.stdout.fnmatch_lines(
        [
            f"raw agreement: 100% over {len(rows) - 1} fixtures*",
            "people vs people: 0 of 1 attempts two or more people ruled on agree*",
            "people disagree: 1 fixture(s) out of kappa*",
        ]
    )
    assert rows[0]["fixtureId"] not in result.stdout.str().split("judge agreement")[0]
