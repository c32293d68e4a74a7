"""Retrieval precision through a whole run: per attempt on the ledger, and in the summary."""

from __future__ import annotations

import pytest

from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import _example_rows, make_set, spec


def test_retrieval_precision_per_attempt_and_in_the_summary(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    """Precision on the ledger equals a count made here from the tool_call events' returned
    ids and the case's expected entities; the summary prints its mean over covered cases."""
    import json

    from pytest_evalloop.ledger import reader as ledger_reader

    rows = _example_rows()
    # Two covered cases and one derivable: precision's mean is over the covered ones only.
    with_entities = [q for q in rows if rows[q].get("expectedEntities")]
    qids = [q for q in with_entities if rows[q].get("coverage") == "covered"][:2]
    qids += [q for q in with_entities if rows[q].get("coverage") == "derivable"][:1]
    set_dir = make_set(pytester.path, qids)
    fake.policy = spec(set_dir).policy()
    result = pytester.runpytest_subprocess(str(set_dir), "-p", "no:cacheprovider")
    out = result.stdout.str()
    [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    covered = []
    for event in read.of_kind("retrieval_score"):
        expected = rows[event.qid]["expectedEntities"]
        wanted = {
            i.casefold()
            for i in expected.get("required", [])
            + expected.get("acceptable", [])
            + [m for g in expected.get("requiredAnyOf", []) for m in g]
        }
        returned = {
            i.casefold()
            for call in read.of_kind("tool_call")
            if call.qid == event.qid and call.ranked_summary
            for i in call.ranked_summary["entityIds"]
        }
        assert event.returned == len(returned)
        assert event.noise == len(returned - wanted)
        assert event.precision == pytest.approx(len(returned & wanted) / len(returned))
        assert event.coverage == rows[event.qid].get("coverage")
        if event.coverage in (None, "covered"):
            covered.append(event.precision)
    assert covered, "the chosen cases include a covered one"
    sizes = [e.returned for e in read.of_kind("retrieval_score") if e.coverage in (None, "covered")]
    if covered:
        mean = sum(covered) / len(covered)
        n = sum(sizes) / len(sizes)
        assert (
            f"retrieval precision: mean {mean:.2f} over {len(covered)} attempts of covered "
            f"cases at N = {n:.1f} entities returned per attempt"
        ) in " ".join(out.split()), out
    totals = json.loads((run_dir / "run.json").read_text())["totals"]
    assert totals["precisionAttempts"] == len(covered)
    assert totals["precisionReturned"] == pytest.approx(sum(sizes) / len(sizes))


@pytest.mark.parametrize("limit", [2, 10, 50])
def test_precision_is_printed_with_the_n_it_was_taken_at(limit: int) -> None:
    """Issue 24 point 9: a context limit of 2, 10, 50 moved precision 0.67 -> 0.31 -> 0.10
    with no N beside it, so two runs' figures looked comparable when they were not."""
    from pytest_evalloop.answer.recall import score_retrieval
    from pytest_evalloop.measure.aggregates import Counted, Tally
    from pytest_evalloop.measure.figures import precision_line
    from pytest_evalloop.roles.contract import ContextResult

    wanted = ["orders.total_revenue"]
    returned = [
        ContextResult(
            id=f"orders.field_{i}" if i else wanted[0],
            kind="measure",
            name=f"field_{i}" if i else "total_revenue",
            source="orders",
            rank=i + 1,
        )
        for i in range(limit)
    ]
    score = score_retrieval({"required": wanted}, returned, "covered")
    assert score.returned == limit and score.precision == pytest.approx(1 / limit)
    counted = Counted(
        qid="q", sample=None, outcome="match", verdict="match", reason=None, gold_status=None,
        gold_note=None, recall=score.recall, precision=score.precision, noise=score.noise,
        returned=score.returned, coverage="covered",
    )  # fmt: skip
    [line] = precision_line(
        Tally(name="r", status="complete", abort_reason=None, attempts=(counted,))
    )
    assert f"mean {1 / limit:.2f} over 1 attempts of covered cases at N = {limit:.1f}" in line
    assert line.endswith(f"noise {limit - 1:.1f} unwanted entities per attempt")
