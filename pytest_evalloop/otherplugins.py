"""What the plugin hands to the other pytest plugins a suite runs, and what it keeps from them.

An eval item is unlike a test: its attempt runs on the runtime's loop, often started ahead of
its turn while pytest still reports items one at a time (`runtime`), and it is paid for once.
Plugins written for tests read its reports and time its phases as if the work happened there.
This module owns the places where they meet (docs/configuration.md, "With other plugins"):

- **pytest-timeout**: the attempt is outside its clock (:class:`TimeoutClock`): the clock stops
  while an eval item sets up its evalloop fixtures (the roles, the wait for the attempt). The
  attempt has its own deadlines (`--eval-attempt-timeout`, `--eval-judge-timeout`,
  `--eval-request-timeout`), and an item waiting for an attempt that started ahead of it would
  otherwise be stopped while the attempt goes on and is scored. A pytest-level timeout of an
  eval item is still counted and named in the summary (:class:`TimeoutTally`), with the ledger's
  verdict when the attempt was scored.
- **reports** (junit, pytest-html, pytest-json-report, `--durations`): each item's report
  carries its attempt's wall time as its duration, and `user_properties` with the verdict, the
  judge's why, cost, tokens, contamination and the run id (:class:`ItemReports`); pytest-html
  gets a verdict column (:class:`HtmlColumn`).
- **reordering plugins** (pytest-randomly): eval items keep file order (:class:`FileOrder`)
  unless `--eval-order=plugins`.
- **repeating plugins** (pytest-repeat's `--count`, pytest-flakefinder): they never repeat an
  eval item, so asking them to is warned about, pointing to `--eval-samples`
  (:func:`repeat_requests`).
- **replaced terminals** (pytest-sugar): the progress display draws into pytest's own terminal
  layout, so it stays off when another plugin replaced the terminal reporter
  (:class:`ReplacedTerminal`).

pytest-rerunfailures and xdist's crash reruns need nothing here: the runtime never answers a
scored attempt again (`ledger.resume`), a rerun of one reports it again in full
(`answer.pipeline.stored_report`), and the crash rerun hook touches only its own reports
(`sharding.CrashReruns`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.items import CaseItem
from pytest_evalloop.shortsummary import REPORT_ATTR
from pytest_evalloop.stash import CLAIMS_KEY, RUNTIME_KEY, SETTINGS_KEY, TALLY_KEY

PROPERTY_PREFIX = "evalloop_"
"""Every `user_properties` name the plugin writes starts with this, so none collides with a
user's own `record_property`."""
TIMEOUT_ATTR = "evalloop_timeout"
"""On a report an eval item failed by pytest-timeout: which attempt it was (crosses xdist)."""
_TIMING_KEY = pytest.StashKey["_Timing"]()
_ORDER_KEY = pytest.StashKey[int]()


def register(config: pytest.Config) -> None:
    """Register what applies to this session's plugins (every process, at configure)."""
    from pytest_evalloop.scale import sharding

    manager = config.pluginmanager
    manager.register(ItemReports(), "evalloop-item-reports")
    if sharding.runs_workers(config):
        manager.register(sharding.CrashReruns(), "evalloop-crash-reruns")
    if config.stash[SETTINGS_KEY].order == "file":
        manager.register(FileOrder(), "evalloop-file-order")
    if manager.hasplugin("timeout"):
        manager.register(TimeoutClock(config), "evalloop-timeout-clock")
        if not hasattr(config, "workerinput"):
            manager.register(TimeoutTally(config), "evalloop-timeout-tally")
    if manager.hasplugin("html"):
        manager.register(HtmlColumn(), "evalloop-html-column")
    if hasattr(config, "workerinput"):
        manager.register(WorkerLetsGo(), "evalloop-worker-lets-go")
    if not hasattr(config, "workerinput"):
        manager.register(ReplacedTerminal(), "evalloop-replaced-terminal")
        if repeat_requests(config.option):
            manager.register(RepeatWarning(config), "evalloop-repeat-warning")


# --- the wait for an attempt (worker) -------------------------------------------------------


@dataclass(slots=True)
class _Timing:
    """How long an item's setup waited for its attempt, and how long the attempt took (slots:
    pytest keeps every item, and with it this, to the session's end)."""

    waited: float = 0.0
    wall: float | None = None
    """The attempt's wall time in this session (None: nothing was answered here for it)."""


def wait_for(runtime: Any, item: pytest.Item, roles: Any) -> Any:
    """The item's attempt (`runtime.run_item`), the time waited for it taken off the setup's
    duration: its report carries the attempt's (worker). pytest-timeout's clock is stopped
    around it, as around every evalloop fixture (`TimeoutClock`)."""
    started = time.perf_counter()
    try:
        return runtime.run_item(item, roles)
    finally:
        timing = item.stash.setdefault(_TIMING_KEY, _Timing())
        timing.waited = time.perf_counter() - started


def hand_over(item: pytest.Item, result: Any) -> None:
    """What the item's reports carry of its result (worker): the attempt's wall time, and the
    `user_properties` junit, pytest-html and pytest-json-report show."""
    item.stash.setdefault(_TIMING_KEY, _Timing()).wall = result.wall_seconds
    # A rerun (pytest-rerunfailures) hands over again: replace, never append twice.
    kept = [p for p in item.user_properties if not str(p[0]).startswith(PROPERTY_PREFIX)]
    from pytest_evalloop.model_api.redaction import environment_secrets

    item.user_properties = kept + user_properties(result, environment_secrets())


def user_properties(result: Any, secrets: list[str]) -> list[tuple[str, Any]]:
    """An item's result as `user_properties`: JSON values (a null where there is none), its
    text through the one redaction (`secrets`), as every other text of a report is."""
    from pytest_evalloop.model_api.redaction import redact
    from pytest_evalloop.progress import result_cost

    run_dir = result.run_dir
    values = (
        result.status,
        result.verdict,
        redact(result.why, secrets) if result.why else None,
        result_cost(result),
        result_tokens(result),
        result.contaminated,
        Path(run_dir).name if run_dir else None,
        result.wall_seconds,
        result.carried,
    )
    return [_shared(pair) for pair in zip(_PROPERTY_NAMES, values, strict=True)]


_SHARED_PAIRS: dict[tuple[str, type, Any], tuple[str, Any]] = {}
_SHARED_MAX = 512


def _shared(pair: tuple[str, Any]) -> tuple[str, Any]:
    """`pair`, as the one tuple every item with the same property and value holds, for a
    value of few kinds (a status, a verdict, a flag, the run's id, no value): pytest keeps each
    item's properties to the session's end, and most of them are the same for most items. A
    tuple cannot change, so sharing one is sharing nothing that could."""
    value = pair[1]
    if not (value is None or isinstance(value, (bool, str))):
        return pair
    if isinstance(value, str) and pair[0] not in _FEW_VALUES:
        return pair  # free text (a judge's why): its own
    if len(_SHARED_PAIRS) >= _SHARED_MAX:
        # Run ids of many sessions in one process (pytester's): start over; a tuple handed out
        # stays what it is.
        _SHARED_PAIRS.clear()
    return _SHARED_PAIRS.setdefault((pair[0], type(value), value), pair)


# One string per name for every item (pytest keeps each item's properties to the session's end).
_PROPERTY_NAMES = tuple(
    PROPERTY_PREFIX + name
    for name in (
        "status",
        "verdict",
        "why",
        "cost_usd",
        "tokens",
        "contaminated",
        "run_id",
        "wall_seconds",
        "carried",
    )
)
_FEW_VALUES = frozenset(PROPERTY_PREFIX + name for name in ("status", "verdict", "run_id"))
"""The properties whose text is one of a few values in a session."""


def result_tokens(result: Any) -> int:
    """Every token one item's attempt used: input (cached or not) and output, answerer and
    judge alike (0 for an item nothing was answered for, or one carried from the ledger)."""
    fields = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens")
    usages = (result.answerer_usage, result.judge_usage)
    return sum(int(usage.get(field) or 0) for usage in usages for field in fields)


class ItemReports:
    """Durations, `user_properties` and timeout marks on eval items' reports (worker)."""

    def pytest_evalloop_item_result(self, item: pytest.Item, result: Any) -> None:
        """The attempt ended: hand its figures to the item's reports (worker)."""
        hand_over(item, result)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """The attempt's time is the report's, not the wait's (worker)."""
        report = yield
        if not isinstance(item, CaseItem):
            return report
        timing = item.stash.get(_TIMING_KEY, None)
        if timing is not None:
            report.duration = report_duration(call.when, report.duration, report.failed, timing)
        if report.skipped and isinstance(report.longrepr, tuple):
            # A skip names where it was raised (the plugin's code); junit, pytest-html and a
            # terminal that counts it as a plain skip (pytest-sugar) show the case's line.
            report.longrepr = (str(item.path), item.lineno, report.longrepr[2])
        if call.excinfo is not None and is_pytest_timeout(call.excinfo.value):
            setattr(
                report,
                TIMEOUT_ATTR,
                {
                    "qid": item.qid,
                    "sample": item.sample,
                    "set_dir": str(item.set_dir),
                    "when": call.when,
                    "message": str(call.excinfo.value).strip(),
                },
            )
        return report


def report_duration(when: str, measured: float, failed: bool, timing: _Timing) -> float:
    """A phase's duration as reported: the setup's own work (its wait for the attempt taken
    off), the attempt's wall time on the call, or on the setup when it failed (no call follows:
    a harness error, contamination)."""
    attempt = timing.wall or 0.0
    if when == "setup":
        own = max(0.0, measured - timing.waited)
        return own + attempt if failed else own
    if when == "call" and timing.wall is not None:
        return attempt
    return measured


def is_pytest_timeout(error: BaseException) -> bool:
    """Whether pytest-timeout failed the item (its `signal` method; `thread` ends the process)."""
    try:
        from pytest_timeout import PYTEST_FAILURE_MESSAGE
    except ImportError:
        return False
    tail = PYTEST_FAILURE_MESSAGE.rsplit("%s", 1)[-1]
    return isinstance(error, pytest.fail.Exception) and tail in str(error)


# --- pytest-timeout -----------------------------------------------------------------------


class TimeoutClock:
    """Stops pytest-timeout's clock while an eval item sets up its evalloop fixtures (worker):
    the roles its attempt runs with (the SDK clients, the target; a conftest's own included) and
    the wait for the attempt (`evalloop_runtime`). Its other fixtures, its call and its
    teardown are the item's own work, and stay on the clock.

    pytest-timeout arms its timer around the whole item (or only the test function with
    `timeout_func_only`) through its `pytest_timeout_set_timer` hook; this plugin watches that
    hook (returning None, so pytest-timeout still arms it), cancels the timer through the same
    hooks before such a fixture and arms it again, with the item's full timeout, after it.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.armed: dict[str, Any] = {}
        """Node id → the settings pytest-timeout armed its timer with (until cancelled)."""
        self.item: pytest.Item | None = None
        """The eval item whose setup runs now."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """The item whose fixtures are set up next (worker)."""
        self.item = item if isinstance(item, CaseItem) else None

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Generator[None, Any, Any]:
        """An evalloop fixture of an eval item, off the clock (worker). Fixtures set up inside
        it (its own dependencies) find the clock already stopped."""
        item = self.item
        if item is None or not str(fixturedef.argname).startswith("evalloop_"):
            return (yield)
        with self.paused(item):
            return (yield)

    @pytest.hookimpl(optionalhook=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> None:
        """Remember the settings, to arm the timer again after the wait (worker)."""
        self.armed[item.nodeid] = settings

    @pytest.hookimpl(optionalhook=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> None:
        """The timer is off (worker)."""
        self.armed.pop(item.nodeid, None)

    @contextlib.contextmanager
    def paused(self, item: pytest.Item) -> Iterator[None]:
        """The timer off for the wait, then armed again if it was (worker)."""
        settings = self.armed.get(item.nodeid)
        if settings is None:
            yield
            return
        hook = self.config.pluginmanager.hook
        hook.pytest_timeout_cancel_timer(item=item)
        try:
            yield
        finally:
            hook.pytest_timeout_set_timer(item=item, settings=settings)


class TimeoutTally:
    """Counts and names eval items pytest-timeout stopped, with the ledger's verdict of each
    (controller): pytest counts such an item as a failure or an error, while its attempt may
    have been scored."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.stopped: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep the timeout marks (controller)."""
        mark = getattr(report, TIMEOUT_ATTR, None)
        if mark and report.outcome != "rerun":
            self.stopped.append(mark)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """The count and the items, after the runs' summaries (controller)."""
        if not self.stopped:
            return
        tally = self.config.stash.get(TALLY_KEY, None)
        run_dirs = sorted(tally.run_dirs) if tally is not None else []
        terminalreporter.write_sep("=", "evalloop: stopped by pytest-timeout")
        for line in timeout_lines(self.stopped, ledger_verdicts(self.stopped, run_dirs)):
            terminalreporter.write_line(line)


def ledger_verdicts(
    stopped: list[dict[str, Any]], run_dirs: list[str]
) -> dict[tuple[str, str, int | None], str | None]:
    """For each stopped item that the session's ledgers scored: (set dir, qid, sample) → its
    verdict (None for a null verdict)."""
    from pytest_evalloop.ledger.resume import ScoredAttempts
    from pytest_evalloop.session.runs import set_dir_of

    found: dict[tuple[str, str, int | None], str | None] = {}
    for run_dir in run_dirs:
        set_dir = set_dir_of(Path(run_dir))
        if set_dir is None:
            continue
        scored = ScoredAttempts(Path(run_dir))
        for mark in stopped:
            if Path(mark["set_dir"]).resolve() != set_dir.resolve():
                continue
            score = scored.get(mark["qid"], mark["sample"])
            if score is not None:
                found[(mark["set_dir"], mark["qid"], mark["sample"])] = score.verdict
    return found


def timeout_lines(
    stopped: list[dict[str, Any]], verdicts: Mapping[tuple[str, str, int | None], str | None]
) -> list[str]:
    """The summary's lines about eval items pytest-timeout stopped."""
    scored = [m for m in stopped if (m["set_dir"], m["qid"], m["sample"]) in verdicts]
    lines = [
        f"{len(stopped)} eval item(s) stopped by pytest-timeout, {len(scored)} of them scored "
        "in the ledger: pytest counts each as a failure or error, the verdicts above are the "
        "ledger's"
    ]
    for mark in stopped:
        key = (mark["set_dir"], mark["qid"], mark["sample"])
        name = mark["qid"] + (f"[s{mark['sample']}]" if mark["sample"] else "")
        state = f"scored {verdicts[key]}" if key in verdicts else "not scored"
        lines.append(f"  {name}: {mark['when']} ({mark['message']}); {state}")
    lines.append(
        "  the attempt's own limits are --eval-attempt-timeout, --eval-judge-timeout and "
        "--eval-request-timeout; pytest-timeout's clock runs only over the item's own work "
        "(fixtures, teardown)"
    )
    return lines


# --- pytest-html --------------------------------------------------------------------------


class HtmlColumn:
    """A Verdict column in pytest-html's results table (controller)."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        """After the Result column (controller)."""
        cells.insert(1, '<th class="sortable" data-column-type="verdict">Verdict</th>')

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        """The eval outcome of the row's item; empty for other tests (controller)."""
        import html

        if not cells:
            return  # another plugin dropped the row
        cells.insert(1, f'<td class="col-verdict">{html.escape(verdict_word(report))}</td>')


def verdict_word(report: Any) -> str:
    """The eval outcome a report carries (`no_match`, `near_match`, …), or "" for a test."""
    result = getattr(report, REPORT_ATTR, None) or {}
    status = str(result.get("status") or "")
    if result.get("reason") == "aborted":
        return "aborted"
    return status


# --- reordering, repeating and replaced terminals -----------------------------------------


class FileOrder:
    """Eval items run in file order whatever a reordering plugin did (every process).

    pytest-randomly shuffles inside its `pytest_collection_modifyitems` wrapper, before every
    plain implementation; this one puts the eval items back into the slots they took, in the
    order they were collected. Other items stay where the plugin put them, and reorderings
    that come later (`--ff`, `--nf`) still apply.
    """

    def __init__(self) -> None:
        self.count = 0

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        """Number each eval item as it is collected (every process)."""
        if isinstance(item, CaseItem):
            item.stash[_ORDER_KEY] = self.count
            self.count += 1

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Back into collection order (every process)."""
        items[:] = in_file_order(items, lambda item: item.stash.get(_ORDER_KEY, None))


def in_file_order(items: list[Any], order_of: Any) -> list[Any]:
    """`items` with those that have an order (`order_of(item)` not None) sorted by it, each
    into a slot one of them held; the others keep their places."""
    slots = [i for i, item in enumerate(items) if order_of(item) is not None]
    ordered = sorted((items[i] for i in slots), key=order_of)
    out = list(items)
    for slot, item in zip(slots, ordered, strict=True):
        out[slot] = item
    return out


REPEATERS: tuple[tuple[str, str, str], ...] = (
    ("count", "pytest-repeat", "--count={n}"),
    ("flake_runs", "pytest-flakefinder", "--flake-finder --flake-runs={n}"),
)
"""Plugins that run each test N times: the option's dest, the plugin, the flag as typed."""


def repeat_requests(option: Any) -> list[str]:
    """A warning per repeating plugin asked to repeat, pointing to `--eval-samples`."""
    out = []
    for dest, plugin, flag in REPEATERS:
        n = getattr(option, dest, None)
        if dest == "flake_runs" and not getattr(option, "flake_finder_enable", False):
            continue
        if isinstance(n, int) and n > 1:
            out.append(
                f"{plugin} ({flag.format(n=n)}) does not repeat evalloop's eval items: each is "
                f"one attempt, answered and paid for once. To measure each case {n} times, use "
                f"--eval-samples={n} (items [s1]..[s{n}]; pass@k, pass^k and a clustered "
                "interval in the summary)"
            )
    return out


class RepeatWarning:
    """Warns once, when eval items were collected, that a repeating plugin skips them
    (controller)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.warned = False

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Without xdist: the controller collects (controller)."""
        if any(isinstance(item, CaseItem) for item in items):
            self._warn()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """Under xdist: a worker's node ids say whether eval items were collected (controller)."""
        from pytest_evalloop.progress import count_eval_ids

        if count_eval_ids(ids):
            self._warn()

    def _warn(self) -> None:
        if self.warned:
            return
        self.warned = True
        for message in repeat_requests(self.config.option):
            self.config.issue_config_time_warning(pytest.PytestConfigWarning(message), 2)


class WorkerLetsGo:
    """An xdist worker lets its runs go even when another plugin's session-finish hook raised
    before ours ran (worker). The controller closes the runs before xdist ends its workers,
    and waits for them to let go: a worker still holding its claim left every run of the
    session unsealed and `running`, exit 8, after a 10 s wait."""

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Any:
        """Outermost: whatever the hooks inside did (worker)."""
        try:
            return (yield)
        finally:
            runtime = session.config.stash.get(RUNTIME_KEY, None)
            claims = session.config.stash.get(CLAIMS_KEY, None)
            if runtime is not None and claims is not None and claims.holding():
                runtime.close()  # nothing appends after this
                claims.release()


class ReplacedTerminal:
    """Keeps the progress display off when another plugin replaced pytest's terminal reporter
    (controller): pytest-sugar redraws its own progress bar with cursor moves, and two displays
    redrawing one terminal overwrite each other. The summary is unchanged."""

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Every plugin has configured by now (controller)."""
        manager = session.config.pluginmanager
        reporter = manager.get_plugin("terminalreporter")
        display = manager.get_plugin("evalloop-progress")
        if display is not None and replaced_terminal(reporter):
            manager.unregister(display)


def replaced_terminal(reporter: Any) -> bool:
    """Whether the terminal reporter is another plugin's class rather than pytest's own."""
    from _pytest.terminal import TerminalReporter

    return reporter is not None and type(reporter) is not TerminalReporter
