"""The pytest11 entry point of pytest-evalloop: options, hooks and fixtures.

Hooks here stay short and delegate: collection to `items`, the eval of an item to `runtime` and
`pipeline`, the closing of runs to `runs`, the terminal text to `summary`. Each hook's docstring
says which process runs it: the controller (the only process without xdist, or xdist's main
process) or a worker (an xdist worker, or the controller without xdist).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_evalloop import options, otherplugins
from pytest_evalloop.failures import EvalFailure, drop_unlocated_frames, interrupts_kept
from pytest_evalloop.items import (
    HEAP_KEY,
    BadRow,
    CaseItem,
    CasesFile,
    CollectedHeap,
    NotASet,
    arg_path,
    decided_by,
    drop_repeats,
    is_run_dir,
    keep_shard,
    named_sets,
    names_a_set,
)
from pytest_evalloop.ledger.gcpolicy import gc_paused
from pytest_evalloop.session.claims import WriterClaims
from pytest_evalloop.shortsummary import REPORT_ATTR, ShortSummary
from pytest_evalloop.startchecks import (
    DIST_EACH,
    check_flags,
    check_run_choice,
    dist_each,
    endpoint_problem,
    target_problem_of,
    xdist_workers,
)
from pytest_evalloop.stash import (
    CLAIMS_KEY,
    LIMITER_KEY,
    PROGRESS_KEY,
    RUNTIME_FACTORY_KEY,
    RUNTIME_KEY,
    SESSION_ID_KEY,
    SETTINGS_KEY,
    TALLY_KEY,
    runtime_of,
)

# Skill evals (SKILL.md lint items, scenarios) are a plugin module of their own.
pytest_plugins = ["pytest_evalloop.skills.plugin"]

if TYPE_CHECKING:
    # Both import pydantic models; every pytest run loads this module, most never need them.
    from pytest_evalloop.answer.pipeline import ItemResult
    from pytest_evalloop.sets import cases as sets

RESULT_KEY = pytest.StashKey["ItemResult"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the `evalloop` option group (every process)."""
    options.add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Declare the `pytest_evalloop_*` hooks users may implement (every process)."""
    from pytest_evalloop import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Resolve settings, make the runtime (now, or on first need), register the controller's
    tally (every process)."""
    from pytest_evalloop.summary import SessionTally

    config.addinivalue_line("markers", "evalloop: an evaluation case collected by pytest-evalloop")
    settings = options.build_settings(config)
    config.stash[SETTINGS_KEY] = settings
    if _is_worker(config):
        session_id = config.workerinput.get("evalloop_session") or uuid.uuid4().hex  # type: ignore[attr-defined]
    else:
        session_id = uuid.uuid4().hex
        # Both at once: a user missing a target and an endpoint learns it in one go.
        problems = [p for p in (endpoint_problem(config), target_problem_of(config)) if p]
        if problems:
            raise pytest.UsageError("\n".join(problems))
        check_run_choice(config)
        check_flags(config)
        if dist_each(config) and not options.answers_no_case(config.option) and names_a_set(config):
            raise pytest.UsageError(DIST_EACH)
        if settings.estimate and getattr(config.option, "numprocesses", None):
            # Under xdist the controller never sees the items: the estimate would be skipped
            # and the run would go ahead and pay.
            raise pytest.UsageError("--eval-estimate runs in one process; drop -n")
        tally = SessionTally(config)
        config.stash[TALLY_KEY] = tally
        config.pluginmanager.register(tally, "evalloop-tally")
        config.pluginmanager.register(ShortSummary(), "evalloop-short-summary")
        if settings.check_judge:
            from pytest_evalloop.review.checkjudge import AgreementCollector

            subset = bool(config.option.keyword or config.option.markexpr)
            collector = AgreementCollector(settings, subset=subset)
            config.pluginmanager.register(collector, "evalloop-agreement")
    config.stash[SESSION_ID_KEY] = session_id
    from pytest_evalloop.display import start_display

    start_display(config, session_id)
    claims = config.stash[CLAIMS_KEY] = WriterClaims()
    config.add_cleanup(claims.release)  # Ctrl-C back to Python's, whatever ended the session
    config.stash[RUNTIME_FACTORY_KEY] = lambda: _make_runtime(config)
    if _evaluates(config):
        runtime = runtime_of(config)
        if settings.max_cost is not None or settings.estimate:
            from pytest_evalloop.runtime import not_answered
            from pytest_evalloop.session.estimate import start

            start(
                config,
                runtime,
                session_id,
                names_a_set=names_a_set(config),
                case_item=CaseItem,
                not_answered=not_answered,
            )
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(), "evalloop-xdist")
    otherplugins.register(config)
    from pytest_evalloop.freedmemory import FreedMemory

    config.pluginmanager.register(FreedMemory(), "evalloop-freed-memory")


def _make_runtime(config: pytest.Config) -> Any:
    from pytest_evalloop.runtime import Runtime

    runtime = Runtime(
        config.stash[SETTINGS_KEY], config.stash[SESSION_ID_KEY], config.stash[CLAIMS_KEY]
    )
    runtime.progress = config.stash[PROGRESS_KEY]
    from pytest_evalloop.lookahead import StartRule, target_ahead

    own = {
        "evalloop_answerer": evalloop_answerer,
        "evalloop_judge": evalloop_judge,
        "evalloop_target": evalloop_target,
    }
    runtime.target_ahead = functools.partial(target_ahead, config, own)
    runtime.may_start_ahead = StartRule(config)
    # Stopping at a failure (-x, --maxfail, --sw): nothing starts beyond the slots, so the
    # attempts answered past the failure stay as few as the concurrency.
    option = config.option
    if (
        option.maxfail
        or getattr(option, "stepwise", False)
        or getattr(option, "stepwise_skip", False)
    ):
        runtime.ahead_slots = 0
    return runtime


def _evaluates(config: pytest.Config) -> bool:
    """Whether the command line asks for an eval session, so the runtime is made at configure
    (every process). Otherwise it is made when collection finds a case (`runtime_of`); under
    xdist the controller, which collects nothing, closes its workers' runs without one."""
    settings = config.stash[SETTINGS_KEY]
    return bool(
        settings.max_cost is not None
        or settings.estimate
        or settings.verify_goldens
        or settings.check_judge
        or settings.rejudge_from
        or names_a_set(config)
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Before any item runs: unscorable goldens and the golden check of the selection
    (controller without xdist; under xdist the controller learns the selection from the
    workers' node ids instead, see `XdistHooks`); and the items' order for the look-ahead
    (worker)."""
    _plan(session.config, session.items)
    if _is_worker(session.config):
        return
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        return  # the session stops on its collection errors; nothing will be answered
    items = [i for i in session.items if isinstance(i, CaseItem)]
    cases: dict[Path, list[sets.Case]] = {}
    for item in items:
        cases.setdefault(item.set_dir, []).append(item.case)
    settings = session.config.stash[SETTINGS_KEY]
    if settings.estimate:
        return  # nothing will be answered: `estimate.MoneyHooks` prices the items instead
    _endpoint_check(session.config, items)
    _preflight(session.config, [(i.path, i.case.qid) for i in items], cases)


def _endpoint_check(config: pytest.Config, items: list[CaseItem]) -> None:
    """Cases found under a folder the command line gave: what configure asks of a set it names
    (`pytest evals/` without a key: one usage error, not one per item). Asked once collection
    has loaded every conftest beside the sets, since one may bring its own roles: so not under
    xdist, whose controller loads none of them (each item then says it; a worker's usage error
    would be xdist's internal error)."""
    settings = config.stash[SETTINGS_KEY]
    if not items or config.option.collectonly or settings.verify_goldens or settings.estimate:
        return
    if names_a_set(config):
        return  # asked at configure
    problem = endpoint_problem(config, cases_found=True)
    if problem:
        # Found, not named: the session may be a project's tests that happen to hold sets.
        raise pytest.UsageError(
            f"{problem}; collection found eval cases under {', '.join(config.args)}: "
            "-m 'not evalloop' runs the other tests without them"
        )


def _preflight(
    config: pytest.Config,
    pairs: list[tuple[Path, str]],
    cases: dict[Path, list[sets.Case]] | None = None,
) -> None:
    settings = config.stash[SETTINGS_KEY]
    config.stash[TALLY_KEY].select(pairs)
    if not pairs or options.answers_no_case(config.option):
        return
    if settings.verify_goldens or settings.check_judge:
        return
    with interrupts_kept():  # it imports the target's models: a Ctrl-C may land in one
        _check_goldens(config, settings, pairs, cases)


def _check_goldens(
    config: pytest.Config,
    settings: Any,
    pairs: list[tuple[Path, str]],
    cases: dict[Path, list[sets.Case]] | None,
) -> None:
    from pytest_evalloop.goldens import preflight
    from pytest_evalloop.model_api.ratelimit import session_state_dir

    by_set = preflight.selected_by_set(pairs)
    found = [
        preflight.preflight(set_dir, qids, settings, (cases or {}).get(set_dir))
        for set_dir, qids in by_set.items()
    ]
    preflight.publish(session_state_dir(config.stash[SESSION_ID_KEY]), found, settings)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for one in found:
        for line in preflight.session_start_lines(one, settings):
            if reporter is not None:
                reporter.write_line(line)
    stop = preflight.stop(found, settings)
    if stop is not None:
        pytest.exit(stop[0], returncode=stop[1])
    if settings.report and settings.report_charts:
        # Items will be answered and the run will close with its report: start the chart
        # process now (a Python start and the report's imports, about 0.2 s of CPU, in its own
        # process) so it overlaps the answers' waits on the model, not the run's end.
        from pytest_evalloop.report import charts

        charts.warm_up()


class XdistHooks:
    """Hooks that exist only when pytest-xdist is installed (so `-p no:xdist` still works)."""

    preflight_done = False

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """The first worker's selection settles the preflight, before any item is scheduled
        (controller)."""
        if self.preflight_done:
            return
        self.preflight_done = True
        from pytest_evalloop.goldens.preflight import from_node_ids

        initial = [arg_path(node.config, arg).absolute() for arg in node.config.args]
        pairs = from_node_ids(node.config.rootpath, list(ids), initial)
        tally = node.config.stash[TALLY_KEY]
        tally.cases_seen |= bool(pairs)
        tally.set_dirs |= {cases_path.parent for cases_path, _ in pairs}
        if pairs and dist_each(node.config) and not options.answers_no_case(node.config.option):
            # Cases found under a folder walked (a named set was refused at configure): stopped
            # before the scheduler hands any item out.
            raise pytest.UsageError(DIST_EACH)
        _preflight(node.config, pairs)

    def pytest_configure_node(self, node: Any) -> None:
        """Hand the session id to a new worker, so all workers share one run (controller)."""
        node.workerinput["evalloop_session"] = node.config.stash[SESSION_ID_KEY]
        node.workerinput["evalloop_sharded"] = node.config.getvalue("dist") == "load"

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """Deal case items into one shard per worker under `--dist load` (controller)."""
        if config.getvalue("dist") != "load":
            return None
        from pytest_evalloop.scale.sharding import make_scheduler

        return make_scheduler(config, log)

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """Collect the run directories a finished worker wrote to (controller)."""
        tally = node.config.stash.get(TALLY_KEY, None)
        output = getattr(node, "workeroutput", {}) or {}
        if tally is not None and error is not None:
            tally.workers_lost = True  # it may have opened a run no report named
        if tally is not None:
            tally.run_dirs.update(output.get("evalloop_run_dirs", []))
            tally.add_never_run(output.get("evalloop_never_run", {}))
            tally.limiter_parts.append(output.get("evalloop_limiter"))


@pytest.hookimpl(tryfirst=True)
def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """Controller or worker: a Ctrl-C's traceback, printable (see drop_unlocated_frames)."""
    drop_unlocated_frames(excinfo.value)


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """A run's directory is never walked for tests: a set's history is thousands of artifact
    folders, and walking them made every start slower than the last (worker)."""
    return True if is_run_dir(collection_path) else None


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """A set's `cases.jsonl` becomes a collector of case items (worker).

    Under `--eval-check-judge` the set's `judge-regressions.jsonl` is collected instead.
    """
    if file_path.suffix != ".jsonl":
        return None  # the common case, decided without a stat or the set models' import
    from pytest_evalloop.sets.pin import CASES_FILE, REGRESSIONS_FILE, SET_FILE

    check_judge = parent.config.stash[SETTINGS_KEY].check_judge
    if file_path.name != (REGRESSIONS_FILE if check_judge else CASES_FILE):
        return None
    # A cases.jsonl (passed or found under a given path) means its directory is meant to be a
    # set; one without set.json is a collection error saying so, not "no tests collected".
    if not (file_path.parent / SET_FILE).is_file():
        return NotASet.from_parent(parent, path=file_path)
    if check_judge:
        from pytest_evalloop.review.checkjudge import RegressionsFile

        return RegressionsFile.from_parent(parent, path=file_path, bad_row=BadRow)
    return CasesFile.from_parent(parent, path=file_path)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Arm the collected-heap release before other plugins configure (every process)."""
    CollectedHeap.arm(early_config)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Generator[None, object, object]:
    """Collect with the cyclic GC paused, then freeze what a set's items built (worker)."""
    heap = session.config.stash.get(HEAP_KEY, None)
    with gc_paused():
        result = yield
        # Frozen before the collector resumes, or its first pass would walk every new item.
        if heap is not None and any(isinstance(item, CaseItem) for item in session.items):
            heap.freeze()
    return result


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep only this job's shard under `--eval-shard`, each case once (worker)."""
    keep_shard(config, items)
    drop_repeats(config, items)


def _plan(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order case items will run in, so pipelines can start ahead: the session's items
    once collection is over, after every plugin's selection (`--lf` deselects after this
    plugin's own `pytest_collection_modifyitems`: its deselected cases were answered ahead)."""
    from pytest_evalloop.scale.sharding import shards

    cases = [i for i in items if isinstance(i, CaseItem)]
    runtime = config.stash.get(RUNTIME_KEY, None)
    if runtime is None:
        if not cases:
            return  # no case here: no runtime either (a plain test session)
        runtime = runtime_of(config)
    if not _is_worker(config):
        runtime.plan(cases)
        return
    workerinput = config.workerinput  # type: ignore[attr-defined]
    if not workerinput.get("evalloop_sharded"):
        return  # another --dist mode: this worker cannot know its next items
    runtime.plan(cases, shards([i.nodeid for i in items], int(workerinput["workercount"])))


# --- fixtures ----------------------------------------------------------------------------


@pytest.fixture
def evalloop_case(request: pytest.FixtureRequest) -> sets.Case:
    """The case row of the running item."""
    node = request.node
    if not isinstance(node, CaseItem):
        raise pytest.UsageError("evalloop_case is only available to evalloop case items")
    from pytest_evalloop.sets.cases import CaseChanged

    try:
        return node.case
    except CaseChanged as exc:
        raise EvalFailure(f"harness error (not a verdict): {exc}", "harness_error") from None


@pytest.fixture(scope="session")
def evalloop_client_factory(pytestconfig: pytest.Config) -> Any:
    """Makes the `AsyncAnthropic` clients the default answerer and judge use."""
    from pytest_evalloop.answer.backends import ClientFactory

    settings = pytestconfig.stash[SETTINGS_KEY]
    factory = ClientFactory(
        settings.retries,
        timeout_s=settings.request_timeout,
        limiter=pytestconfig.stash[LIMITER_KEY],
    )
    # Its clients live on the runtime's loop: close them there when the runtime stops.
    runtime_of(pytestconfig).closers.append(factory.release)
    return factory


@pytest.fixture(scope="session")
def evalloop_answerer(pytestconfig: pytest.Config, evalloop_client_factory: Any) -> Any:
    """The answerer of every case; override it in a conftest to bring your own."""
    from pytest_evalloop.answer.backends import default_answerer

    settings = pytestconfig.stash[SETTINGS_KEY]
    if settings.rejudge_from:
        from pytest_evalloop.answer.replay import ReplayAnswerer

        return ReplayAnswerer(model="replay")
    made = pytestconfig.hook.pytest_evalloop_make_answerer(
        config=pytestconfig, backend=settings.answerer
    )
    if made is not None:
        return made
    missing = options.endpoint_missing()
    if settings.answerer == "anthropic" and missing:
        raise pytest.UsageError(missing)
    return default_answerer(settings, evalloop_client_factory)


@pytest.fixture(scope="session")
def evalloop_judge(pytestconfig: pytest.Config, evalloop_client_factory: Any) -> Any:
    """The judge of every case; override it in a conftest to bring your own."""
    from pytest_evalloop.answer.backends import default_judge

    made = pytestconfig.hook.pytest_evalloop_make_judge(config=pytestconfig)
    if made is not None:
        return made
    missing = options.endpoint_missing()
    if missing:
        raise pytest.UsageError(missing)
    return default_judge(pytestconfig.stash[SETTINGS_KEY], evalloop_client_factory)


@pytest.fixture
def evalloop_target(request: pytest.FixtureRequest) -> Any:
    """The target the case is answered against (one per set, shared by its items)."""
    from pytest_evalloop.settargets import target_for

    node = request.node
    return target_for(request.config, node.set_dir, node.set_config)


@pytest.fixture
def evalloop_runtime(
    request: pytest.FixtureRequest,
    evalloop_answerer: Any,
    evalloop_judge: Any,
    evalloop_target: Any,
) -> ItemResult:
    """Run the item's attempt during setup, so a harness error is a pytest error, not a fail.
    Under `--setup-only` (which sets fixtures up and runs no test) nothing is answered."""
    from pytest_evalloop.runtime import Roles

    if options.answers_no_case(request.config.option):
        return None  # type: ignore[return-value]  # no test body runs to read it
    runtime = runtime_of(request.config)
    roles = Roles(answerer=evalloop_answerer, judge=evalloop_judge, target=evalloop_target)
    from pytest_evalloop.session.runchoice import RunStateError

    try:
        result = otherplugins.wait_for(runtime, request.node, roles)
    except RunStateError as exc:
        # The run asked for cannot be used as asked (a conftest's role differs from a resumed
        # run's pins, a label taken meanwhile): one stop, before anything is answered, rather
        # than the same error on every item. An xdist worker cannot stop its session this way
        # (xdist reports it as a crash), so there it stays an error per item.
        if not _is_worker(request.config):
            pytest.exit(f"evalloop: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        raise EvalFailure(f"harness error (not a verdict): {exc}", "harness_error") from exc
    except (ValueError, OSError) as exc:
        # A run directory that cannot be opened for another reason.
        raise EvalFailure(f"harness error (not a verdict): {exc}", "harness_error") from exc
    request.node.stash[RESULT_KEY] = result
    request.config.hook.pytest_evalloop_item_result(item=request.node, result=result)
    if result.status in ("harness_error", "contaminated"):
        raise EvalFailure(result.report, result.status)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, object, object]:
    """Items hold no parsed row while they wait: each reads its own back when it runs; the
    first item's target starts opening now, not when that item needs it (controller without
    xdist, worker)."""
    for item in session.items:
        if isinstance(item, CaseItem):
            item.let_case_go()
    if session.items and not (
        session.testsfailed and not session.config.option.continue_on_collection_errors
    ):
        from pytest_evalloop.settargets import open_early

        open_early(session, evalloop_target)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """...and let it go again once run (controller without xdist, worker)."""
    try:
        return (yield)
    finally:
        if isinstance(item, CaseItem):
            item.let_case_go()


# --- reporting ---------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Carry the item's result on its report, so it reaches the controller (worker)."""
    report = yield
    result = item.stash.get(RESULT_KEY, None)
    ours = call.excinfo is not None and isinstance(call.excinfo.value, EvalFailure)
    # Only on the report its verdict decided: any other failure (pytest-timeout's) is an
    # error, and a skip a plugin's call hook raised is that plugin's.
    if result is not None and (ours or (call.when == "call" and decided_by(result, report, call))):
        setattr(report, REPORT_ATTR, result.model_dump(mode="json"))
        # The report carries it from here on: the item (kept by pytest to the session's end)
        # would otherwise hold a second copy of every case's result.
        del item.stash[RESULT_KEY]
    if ours:
        # Its few lines, never a traceback: a harness error a fixture raised before any result
        # (a run directory that cannot be opened, a row changed since collection) included.
        report.longrepr = call.excinfo.value.report  # type: ignore[union-attr]
        # A plain attribute crosses from an xdist worker with the report.
        setattr(report, STATUS_ATTR, call.excinfo.value.status)  # type: ignore[union-attr]
    if isinstance(item, CaseItem):
        _redact_report(report)
    return report


def _redact_report(report: pytest.TestReport) -> None:
    """Pass what the terminal and junit show of a case item through the one redaction."""
    from pytest_evalloop.model_api.redaction import environment_secrets, redact

    if report.longrepr is None and not any(body for _, body in report.sections):
        return  # a passed phase with no output (most of them): no text, so nothing to read
    secrets = environment_secrets()
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        report.longrepr = (longrepr[0], longrepr[1], redact(str(longrepr[2]), secrets))
    elif longrepr is not None and not report.passed:
        # A traceback's repr is flattened to its text: the terminal prints it the same way.
        text = str(longrepr)
        cleaned = redact(text, secrets)
        if cleaned != text:
            report.longrepr = cleaned
    report.sections = [(title, redact(body, secrets)) for title, body in report.sections]


_STATUS_WORDS = {
    "match": ("passed", ".", "MATCH"),
    "no_match": ("failed", "F", "NO_MATCH"),
    "near_match": ("near_match", "~", "NEAR_MATCH"),
    "needs_human": ("needs_human", "?", "NEEDS_HUMAN"),
    "unscored": ("unscored", "u", "UNSCORED"),
    "gold_wrong": ("gold_wrong", "w", "GOLD_WRONG"),
    "contaminated": ("error", "C", "CONTAMINATED"),
    "harness_error": ("error", "E", "HARNESS_ERROR"),
}


STATUS_ATTR = "evalloop_status"
_FIXTURE_WORDS = {"flaky": ("flaky", "f", "FLAKY")}


@pytest.hookimpl(tryfirst=True)  # before a plugin that words every report (pytest-sugar)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> Any:
    """Status words for `-v` and the summary line: MATCH, NO_MATCH, NEAR_MATCH, FLAKY, …
    (controller)."""
    fixture_word = _FIXTURE_WORDS.get(getattr(report, STATUS_ATTR, ""))
    if fixture_word is not None and report.when == "call" and report.outcome != "rerun":
        return fixture_word
    result = getattr(report, REPORT_ATTR, None)
    if not result or report.outcome == "rerun":  # a rerun is its plugin's to word
        return None
    status = result["status"]
    if result.get("reason") == "aborted":
        return "aborted", "a", "ABORTED"
    return _STATUS_WORDS.get(status)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say why each FLAKY judge fixture is flaky (pytest prints the reasons of failures only),
    and which golden columns --eval-verify-goldens paired by value (controller)."""
    if terminalreporter.config.getoption("eval_verify_goldens", False):
        from pytest_evalloop.goldens.items import paired_summary

        paired_summary(terminalreporter)
    if terminalreporter.stats.get("flaky"):  # decided without importing the set models
        from pytest_evalloop.review.checkjudge import flaky_summary

        flaky_summary(terminalreporter)


def _adopt_unreported_runs(config: pytest.Config) -> None:
    """Under xdist, a Ctrl-C (or workers lost) before any result reached the controller: the
    runs its workers opened are found by this session's id, so they are closed, not left
    `running` (controller)."""
    if not xdist_workers(config):
        return  # one process: its runtime knows every run it opened
    from pytest_evalloop.session import runs

    tally = config.stash[TALLY_KEY]
    known = {Path(run_dir).resolve() for run_dir in tally.run_dirs}
    sets_seen = tally.set_dirs | set(named_sets(config))
    settings = config.stash[SETTINGS_KEY]
    for run_dir in runs.session_runs(sets_seen, settings.runs_dir, config.stash[SESSION_ID_KEY]):
        if run_dir.resolve() not in known:
            tally.run_dirs.add(str(run_dir))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the runtime, settle the heap; workers report their run dirs, the controller closes
    runs (both)."""
    config = session.config
    runtime = config.stash.get(RUNTIME_KEY, None)
    worker = _is_worker(config)
    tally = None if worker else config.stash[TALLY_KEY]
    if tally is not None and (exitstatus == pytest.ExitCode.INTERRUPTED or tally.workers_lost):
        _adopt_unreported_runs(config)
    if runtime is None and (worker or not config.stash[TALLY_KEY].run_dirs):
        return  # no case here, and no worker wrote a run: a plain test session
    claims = config.stash[CLAIMS_KEY]
    if runtime is not None:
        runtime.close()
    heap = config.stash.get(HEAP_KEY, None)
    settle = heap.settle if heap is not None else (lambda: None)  # once, however often asked
    if worker and runtime is not None:  # (a worker without one returned above)
        claims.release()  # this worker appends no more; the controller closes its runs
        settle()
        config.workeroutput["evalloop_run_dirs"] = [str(p) for p in runtime.run_dirs]  # type: ignore[attr-defined]
        config.workeroutput["evalloop_never_run"] = runtime.never_run  # type: ignore[attr-defined]
        config.workeroutput["evalloop_limiter"] = config.stash[LIMITER_KEY].stats()  # type: ignore[attr-defined]
        return
    tally = config.stash[TALLY_KEY]
    tally.limiter_parts.append(config.stash[LIMITER_KEY].stats())
    if runtime is not None:
        tally.run_dirs.update(str(p) for p in runtime.run_dirs)
        tally.add_never_run(runtime.never_run)
    try:
        # The heap settles while the chart process writes the reports: off the session's end.
        tally.finish(session, exitstatus, meanwhile=settle)
    finally:
        claims.release()  # closed and sealed: another session may resume it now
        settle()  # once, whatever stopped the close before the reports (a hook that raised)
