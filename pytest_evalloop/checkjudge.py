"""`--eval-check-judge`: the set's human-settled verdicts as items the judge must reproduce.

Each row of `judge-regressions.jsonl` is a stored prediction a human ruled on. Its item judges
that prediction through the same judge a run uses, against the case's golden *as written* (a
fixture tests the judge, not the golden, so no golden gate applies), and passes when the judge's
verdict equals the human's. With `--eval-repeat=N` it asks N times and passes on a majority.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_evalloop import sets
from pytest_evalloop.items import EvalFailure
from pytest_evalloop.stash import RUNTIME_KEY, SETTINGS_KEY


class RegressionsFile(pytest.File):
    """A set's `judge-regressions.jsonl`: one item per fixture."""

    def collect(self) -> Iterator[pytest.Item | pytest.Collector]:
        from pytest_evalloop.items import BadRow

        set_dir = self.path.parent
        loaded = sets.load_regressions(set_dir)
        for error in loaded.errors:
            yield BadRow.from_parent(self, name=f"line-{error.line}", error=error)
        cases = {case.qid: case for _, case in sets.load_cases(set_dir).rows}
        for lineno, fixture in loaded.rows:
            item = FixtureItem.from_parent(self, name=fixture.fixture_id, callobj=check_fixture)
            item.fixture = fixture
            item.case = cases.get(fixture.qid)
            item.lineno = lineno
            item.add_marker(pytest.mark.evalloop)
            item.extra_keyword_matches.add(fixture.qid)
            yield item


def check_fixture(evalloop_judge: Any, request: pytest.FixtureRequest) -> None:
    """Judge the stored prediction `--eval-repeat` times; pass when the human's verdict wins."""
    item = request.node
    fixture = item.fixture
    if item.case is None or item.case.golden is None:
        raise EvalFailure(
            f"fixture {fixture.fixture_id}: case {fixture.qid!r} (or its golden) is not in "
            "cases.jsonl; a fixture needs its case to be judged",
            "harness_error",
        )
    runtime = request.config.stash[RUNTIME_KEY]
    repeat = request.config.stash[SETTINGS_KEY].repeat
    materials = fixture_materials(item.case, fixture, item.path.parent)
    verdicts = [runtime.call(evalloop_judge.judge(materials)).verdict for _ in range(repeat)]
    agree = sum(1 for v in verdicts if v == fixture.verdict)
    if agree * 2 > repeat:
        return
    counts = ", ".join(f"{n} {v}" for v, n in Counter(str(v) for v in verdicts).most_common())
    raise EvalFailure(
        f"judge disagrees with the human on {fixture.fixture_id} (case {fixture.qid}):\n"
        f"  human settled: {fixture.verdict}"
        + (f" ({fixture.settled_by})" if fixture.settled_by else "")
        + f"\n  judge said:    {counts} — agreement {agree}/{repeat}\n"
        f"  human's why:   {fixture.why or '(none recorded)'}",
        "judge_disagrees",
    )


def fixture_materials(case: sets.Case, fixture: sets.RegressionFixture, set_dir: Any) -> Any:
    """The judge's materials for a stored prediction (golden as written, whatever its status)."""
    from pytest_evalloop.backends import model_definitions
    from pytest_evalloop.pipeline import materials_for

    assert case.golden is not None
    prediction = fixture.prediction
    rows = prediction.get("rows")
    return materials_for(
        case,
        sets.golden_value(set_dir, case.golden),
        rows=rows if isinstance(rows, list) else None,
        columns=prediction.get("columns"),
        truncated=bool(prediction.get("truncated")),
        final_query=prediction.get("final_query"),
        answer_text=prediction.get("answer_text"),
        definitions=model_definitions(set_dir, sets.load_set_config(set_dir), case),
    )


class FixtureItem(pytest.Function):
    """One human-settled verdict the judge must reproduce."""

    fixture: sets.RegressionFixture
    case: sets.Case | None
    lineno: int

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, self.lineno - 1, f"judge fixture {self.fixture.fixture_id}"

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, EvalFailure):
            return excinfo.value.report
        return super().repr_failure(excinfo)
