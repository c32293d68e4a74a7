"""`--eval-check-judge`: the set's human-settled verdicts as items the judge must reproduce.

Each row of `judge-regressions.jsonl` is a stored prediction a human ruled on. Its item judges
that prediction through the same judge a run uses, against the case's golden *as written* (a
fixture tests the judge, not the golden, so no golden gate applies), and passes when the judge
gives the human's verdict every time it is asked (`--eval-repeat=N` asks N times).

The judge is shown what a run's judge would be: the fixture's final query re-executed through
the set's target when one is configured (`--eval-target`, an embedded target, or a conftest's
`evalloop_target`), else a plain statement that it was not re-executed. A fixture pinned to
another `goldenRevision` than its case's was settled against a different key: it is skipped
with that reason. Verdicts that split across repeats are FLAKY, neither agreement nor a stable
disagreement.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from pytest_evalloop.failures import EvalFailure, HarnessError
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.stash import SETTINGS_KEY, runtime_of

Agreement = Literal["agree", "disagree", "flaky"]
FLAKY = "flaky"
"""The status of a fixture whose verdicts split (its report's category and status word)."""
PAIR_PROPERTY = "evalloop_judge_pair"
"""The user property a fixture's item carries: its set, the person's verdict, the judge's."""
NO_TARGET = (
    "no target is configured for this check (--eval-check-judge without --eval-target, an "
    "embedded target or a conftest's evalloop_target), so the stored final query was not "
    "re-executed"
)


class RegressionsFile(pytest.File):
    """A set's `judge-regressions.jsonl`: one item per fixture.

    `bad_row` is the face's collector for a row that cannot become an item (`items.BadRow`,
    the one `cases.jsonl` uses), handed in by the plugin so a bad row reads the same in both.
    """

    def __init__(self, *, bad_row: type[pytest.Collector], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bad_row = bad_row

    def collect(self) -> Iterator[pytest.Item | pytest.Collector]:
        set_dir = self.path.parent
        try:
            config = sets.load_set_config(set_dir)
        except sets.SetError as exc:
            raise self.CollectError(str(exc)) from exc
        loaded = sets.load_regressions(set_dir)
        for error in loaded.errors:
            yield self.bad_row.from_parent(self, name=f"line-{error.line}", error=error)
        cases = {case.qid: case for _, case in sets.load_cases(set_dir).rows}
        for lineno, fixture in loaded.rows:
            item = FixtureItem.from_parent(self, name=fixture.fixture_id, callobj=check_fixture)
            item.fixture = fixture
            item.case = cases.get(fixture.qid)
            item.set_config = config
            item.lineno = lineno
            item.add_marker(pytest.mark.evalloop)
            item.extra_keyword_matches.add(fixture.qid)
            stale = None if item.case is None else revision_mismatch(fixture, item.case)
            if fixture.people_disagree:
                stale = people_disagree(fixture)
            if stale is not None:
                # A skip mark, so the report points at the fixture's line, not at our code.
                item.add_marker(pytest.mark.skip(reason=stale))
            yield item


def people_disagree(fixture: sets.RegressionFixture) -> str:
    """Why a fixture people disagree on is not judged: it is no human label (yet)."""
    rulings = ", ".join(f"{r.get('reviewer')} {r.get('verdict')}" for r in fixture.rulings or [])
    return (
        f"people disagree on {fixture.fixture_id} ({rulings}): no human label to judge against, "
        f"out of kappa; one more review of {fixture.qid} settles it (evalloop review or view)"
    )


def check_fixture(evalloop_judge: Any, request: pytest.FixtureRequest) -> None:
    """Re-execute the stored final query, judge the prediction `--eval-repeat` times, and pass
    only when every verdict is the human's."""
    item = request.node
    fixture = item.fixture
    case = item.case
    if case is None or case.golden is None:
        raise EvalFailure(
            f"fixture {fixture.fixture_id}: case {fixture.qid!r} (or its golden) is not in "
            "cases.jsonl; a fixture needs its case to be judged",
            "harness_error",
        )
    runtime = runtime_of(request.config)
    repeat = request.config.stash[SETTINGS_KEY].repeat
    prediction = _reexecute(request, runtime, fixture)
    materials = fixture_materials(case, fixture, item.path.parent, item.set_config, prediction)
    verdicts = [runtime.call(evalloop_judge.judge(materials)).verdict for _ in range(repeat)]
    # The pair travels on the report (through xdist too) to the controller's kappa.
    item.user_properties.append(
        (
            PAIR_PROPERTY,
            {
                "set": str(item.path.parent),
                "human": fixture.verdict,
                "judge": [str(v) for v in verdicts],
            },
        )
    )
    found = agreement([str(v) for v in verdicts], fixture.verdict)
    if found == "agree":
        return
    agree = sum(1 for v in verdicts if v == fixture.verdict)
    counts = ", ".join(f"{n} {v}" for v, n in Counter(str(v) for v in verdicts).most_common())
    head = (
        f"judge is unstable on {fixture.fixture_id} (case {fixture.qid}): its verdicts split"
        if found == FLAKY
        else f"judge disagrees with the human on {fixture.fixture_id} (case {fixture.qid})"
    )
    raise EvalFailure(
        f"{head}:\n"
        f"  human settled: {fixture.verdict}"
        + (f" ({fixture.settled_by})" if fixture.settled_by else "")
        + f"\n  judge said:    {counts} — agreement {agree}/{repeat}\n"
        f"  human's why:   {fixture.why or '(none recorded)'}",
        FLAKY if found == FLAKY else "judge_disagrees",
    )


def agreement(verdicts: list[str], settled: str) -> Agreement:
    """`agree` when every verdict is the human's, `flaky` when they split, else `disagree`.

    A majority is not agreement: a judge that says match twice and no_match once has not
    reproduced the human's ruling, it has shown it cannot be trusted on this prediction.
    """
    if len(set(verdicts)) > 1:
        return "flaky"
    return "agree" if verdicts and verdicts[0] == settled else "disagree"


def revision_mismatch(fixture: sets.RegressionFixture, case: sets.Case) -> str | None:
    """Why a fixture is skipped: it was settled against another golden revision than its
    case's. None when it is unpinned (it is judged) or pinned to the case's revision."""
    pinned = fixture.golden_revision
    if pinned is None or pinned == case.golden_revision:
        return None
    current = case.golden_revision if case.golden_revision is not None else "none"
    return (
        f"stale fixture: {fixture.fixture_id} was settled against goldenRevision {pinned} and "
        f"case {case.qid} is at goldenRevision {current}; re-settle it against the current "
        "golden (and update its goldenRevision) or remove it"
    )


def fixture_call(fixture: sets.RegressionFixture) -> Any:
    """The stored final query as a call to repeat: the arguments the fixture recorded
    (`final_givens`, `packageName`, `modelPath`) over the target's defaults."""
    from pytest_evalloop.roles.contract import FinalCall

    prediction = fixture.prediction
    query = prediction.get("final_query")
    query = query.strip() if isinstance(query, str) and query.strip() else None
    arguments: dict[str, Any] = {
        key: prediction[key]
        for key in ("environmentName", "packageName", "modelPath")
        if isinstance(prediction.get(key), str)
    }
    if isinstance(prediction.get("final_givens"), dict) and prediction["final_givens"]:
        arguments["givens"] = prediction["final_givens"]
    return FinalCall(
        query=query, source="declared" if query else "none", arguments=arguments or None
    )


def _reexecute(request: pytest.FixtureRequest, runtime: Any, fixture: Any) -> Any:
    from pytest_evalloop.answer.reexecution import reexecute
    from pytest_evalloop.roles.contract import QueryOutcome

    call = fixture_call(fixture)
    if call.query is None:
        return None
    if not target_configured(request):
        return QueryOutcome(not_run=NO_TARGET)
    target = request.getfixturevalue("evalloop_target")
    try:
        session = runtime.call(runtime.session_for(target))
        return runtime.call(reexecute(session, call))
    except HarnessError as exc:
        raise EvalFailure(
            f"harness error (not a verdict): re-executing fixture {fixture.fixture_id}: {exc}",
            "harness_error",
        ) from exc


def target_configured(request: pytest.FixtureRequest) -> bool:
    """Whether the check has a target to re-execute on: `--eval-target`, the set's embedded
    target, or a conftest or plugin that supplies one."""
    from pytest_evalloop.answer.backends import user_supplies

    if request.config.stash[SETTINGS_KEY].target is not None:
        return True
    if ((request.node.set_config.target or {}).get("kind")) == "embedded":
        return True
    return user_supplies(request.config, "target")


def fixture_materials(
    case: sets.Case,
    fixture: sets.RegressionFixture,
    set_dir: Path,
    config: sets.SetConfig,
    prediction: Any,
) -> Any:
    """The judge's materials for a stored prediction (golden as written, whatever its status)."""
    from pytest_evalloop.answer.materials import (
        definitions_shared,
        materials_for,
        model_definitions,
    )

    assert case.golden is not None
    call = fixture_call(fixture)
    return materials_for(
        case,
        sets.golden_value(set_dir, case.golden),
        final_query=call.query,
        prediction=prediction,
        answer_text=fixture.prediction.get("answer_text"),
        definitions=model_definitions(set_dir, config, case, call_arguments=call.arguments),
        definitions_shared=definitions_shared(set_dir, config),
    )


def flaky_summary(terminalreporter: Any) -> None:
    """List the FLAKY fixtures with their split verdicts (pytest prints only failures')."""
    reports = terminalreporter.stats.get(FLAKY, [])
    if not reports:
        return
    terminalreporter.write_sep("=", f"{len(reports)} FLAKY judge fixture(s)")
    for report in reports:
        terminalreporter.write_line(f"FLAKY {report.nodeid}")
        terminalreporter.write_line(str(report.longrepr))


class FixtureItem(pytest.Function):
    """One human-settled verdict the judge must reproduce."""

    fixture: sets.RegressionFixture
    case: sets.Case | None
    set_config: sets.SetConfig
    lineno: int

    @property
    def set_dir(self) -> Path:
        """The directory of the set this fixture belongs to (the target is the set's)."""
        return self.path.parent

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, self.lineno - 1, f"judge fixture {self.fixture.fixture_id}"

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, EvalFailure):
            return excinfo.value.report
        return super().repr_failure(excinfo)


class AgreementCollector:
    """The controller's kappa over the session's fixtures (`judge.agreement`): collects each
    fixture's (person, judge) pair from its report, prints the figure per set at the end and
    records it in the set's `judge-agreement.jsonl`, flagging a judge regression."""

    def __init__(self, settings: Any, subset: bool = False) -> None:
        self.settings = settings
        self.subset = subset
        """A -k/-m selection: the figure is printed, never recorded (a subset's kappa is not the
        set's, and a later full check would be compared against it)."""
        self.pairs: dict[str, list[tuple[str, str]]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name != PAIR_PROPERTY or not isinstance(value, dict):
                continue
            if value["judge"]:
                # The judge's commonest verdict over the repeats (a flaky fixture counts once).
                said: str = Counter(value["judge"]).most_common(1)[0][0]
                self.pairs.setdefault(value["set"], []).append((value["human"], said))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from pytest_evalloop.judge.judge import JUDGE_VERSION, RUBRIC_SHA
        from pytest_evalloop.ledger.contract import now_iso
        from pytest_evalloop.measure import agreement

        pins = {
            "judgeModel": self.settings.judge_model,
            "judgeVersion": JUDGE_VERSION,
            "rubricSha": RUBRIC_SHA,
        }
        for set_dir, pairs in sorted(self.pairs.items()):
            live = [f for _, f in sets.load_regressions(Path(set_dir)).rows]
            found = agreement.Agreement(
                tuple(pairs),
                people=tuple(tuple(r.get("verdict", "") for r in f.rulings or []) for f in live),
                disputed=tuple(f.fixture_id for f in live if f.people_disagree),
            )
            terminalreporter.write_sep("=", f"judge agreement: {Path(set_dir).name}")
            for line in found.lines():
                terminalreporter.write_line(line)
            record = found.record(pins, now_iso())
            last = agreement.last_record(Path(set_dir))
            flagged = agreement.regression(record, last)
            if flagged:
                terminalreporter.write_line(flagged, red=True, bold=True)
            elif note := agreement.unbounded(record, last):
                terminalreporter.write_line(note, yellow=True)
            if self.subset:
                terminalreporter.write_line(
                    f"{agreement.AGREEMENT_FILE}: not recorded (a -k/-m subset of the fixtures)"
                )
                continue
            try:
                agreement.append_record(Path(set_dir), {**record, "regression": bool(flagged)})
            except OSError as exc:
                terminalreporter.write_line(f"{agreement.AGREEMENT_FILE}: not written ({exc})")
