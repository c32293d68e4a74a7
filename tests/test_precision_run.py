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
    if covered:
        mean = sum(covered) / len(covered)
        assert f"retrieval precision: mean {mean:.2f} over {len(covered)} attempts" in out, out
    totals = json.loads((run_dir / "run.json").read_text())["totals"]
    assert totals["precisionAttempts"] == len(covered)
