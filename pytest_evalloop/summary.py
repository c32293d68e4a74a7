"""The end of a session: closing the runs and the terminal summary of the eval.

:class:`SessionTally` is a plugin object that exists on the controller only. It gathers each
item's result from the reports (which cross from xdist workers), closes the runs in
`pytest_sessionfinish`, and prints the summary. The text itself comes from pure functions.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_evalloop.judge import judgesamples
from pytest_evalloop.keptreports import is_eval_report, share_equal_parts, slimmed
from pytest_evalloop.measure import figures
from pytest_evalloop.measure.shardrule import SHARDS_TITLE, shard_note
from pytest_evalloop.model_api.caching import cache_lines
from pytest_evalloop.model_api.endpoint import list_price_note
from pytest_evalloop.model_api.redaction import environment_secrets, redact
from pytest_evalloop.shortsummary import REPORT_ATTR

if TYPE_CHECKING:
    # The ledger's models, the counting rule and the run's closing, at their point of use:
    # every pytest run makes a tally, and most (a project's own tests) close no run.
    from pytest_evalloop.ledger import contract as ledger
    from pytest_evalloop.measure import aggregates
    from pytest_evalloop.measure.unmeasured import Unmeasured
    from pytest_evalloop.session.selection import Closing


@dataclass
class RunSummary:
    """The figures of one run: its whole ledger's tally, and what this session added."""

    run_dir: Path
    label: str
    status: str
    tally: aggregates.Tally
    costs: dict[str, ledger.RoleCost] = field(default_factory=dict)
    not_attempted: int = 0
    """Items of this session never attempted because the run aborted (no event records them)."""
    answered_here: int | None = None
    judge_samples: dict[str, Any] | None = None
    """`judgesamples.summary` of the run (None: the judge sampled once)."""
    models: dict[str, str | None] = field(default_factory=dict)
    """Each role's model (run.json), for its cost figures and cache floor."""
    cost_figures: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """Per role: `pricing.cost_figures` (cache-read share, cost per case, uncached cost)."""
    shards: str | None = None
    """`shardrule.shard_note` of the run (None: the run is no shard and no merge of shards)."""
    spend: dict[str, Any] = field(default_factory=dict)
    """run.json `spend`: the endpoint its costs were priced for, the ceiling and its count."""
    unfinished_exit: int | None = None
    """The session's exit status because this run did not finish (None: it finished, or
    `--eval-allow-aborted`)."""
    unmeasured: Unmeasured | None = None
    """Why the run measured nothing (`measure/unmeasured.py`), or None: the summary leads with it."""
    unmeasured_exit: int | None = None
    """`EXIT_NOTHING_MEASURED` for such a run (None: it measured something, or
    `--eval-allow-unmeasured`)."""


class SessionTally:
    """Gathers item results on the controller, closes runs, prints the summary (controller)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.counts: dict[str, RunCounts] = {}
        """Per run dir: what the summary says of this session's items, counted as they come."""
        self.unanswered: list[dict[str, Any]] = []
        """Results of items the conductor never sent to the answerer (few: a stop, a ceiling)."""
        self.kept: dict[str, list[dict[str, Any]]] = {}
        """Per run dir: every result, kept only while a `pytest_evalloop_run_finished` hook is
        there to be handed them; otherwise nothing per case outlives its report."""
        self.logged: dict[str, list[pytest.TestReport]] = {}
        """Reports of eval items not finished logging yet, by node id: whole until then."""
        self.run_dirs: set[str] = set()
        self.cases_seen = False
        """Whether an xdist worker collected a case item (this process collects none)."""
        self.set_dirs: set[Path] = set()
        """The sets of the case items an xdist worker collected."""
        self.never_run: dict[str, set[str]] = {}
        """Per run directory: cases answered ahead that pytest never ran (each process's)."""
        self.selected: dict[Path, set[str]] | None = None
        """The cases the session selected, by set folder (resolved), once collection is over;
        a run's close tells a case not selected from one pytest did not run by it."""
        self.workers_lost = False
        """Whether an xdist worker went down with an error (killed, crashed)."""
        self.stopped_by: str | None = None
        """Why xdist stopped the session, when no Ctrl-C did (`xdist_stop`)."""
        self.summaries: list[RunSummary] = []
        self.gate_lines: list[str] = []
        self.limiter_parts: list[dict[str, Any] | None] = []
        """Each process's `RunLimiter.stats()`, summed into run.json `limiter`."""
        self.report_lines: dict[Path, list[str]] = {}
        """Per run: where its report went (or why none was written)."""

    def add_never_run(self, found: dict[str, list[str]]) -> None:
        """A process's `Runtime.never_run`, at its end."""
        for run_dir, qids in found.items():
            self.never_run.setdefault(run_dir, set()).update(qids)

    def select(self, pairs: list[tuple[Path, str]]) -> None:
        """Keep the session's selection, `(cases file, qid)` pairs, once collection is over."""
        by_file: dict[Path, set[str]] = {}
        for cases_path, qid in pairs:
            by_file.setdefault(cases_path, set()).add(qid)
        self.selected = {}
        for cases_path, qids in by_file.items():  # resolved once a set, not once a case
            self.selected.setdefault(cases_path.parent.resolve(), set()).update(qids)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Count the eval result an item's report carries (controller)."""
        result = getattr(report, REPORT_ATTR, None)
        if result or is_eval_report(report):
            self.logged.setdefault(report.nodeid, []).append(report)
        if not result:
            return
        # A rerun's report (pytest-rerunfailures, xdist's crash rerun) is not an outcome: the
        # item's last report is.
        if report.outcome == "rerun" or not (report.when == "call" or report.failed):
            return
        run_dir = result.get("run_dir") or ""
        if run_dir:
            self.run_dirs.add(run_dir)
        self.counts.setdefault(run_dir, RunCounts()).add(result)
        if result.get("answered") is False:
            self.unanswered.append(result)
        if self.config.hook.pytest_evalloop_run_finished.get_hookimpls():
            self.kept.setdefault(run_dir, []).append(result)

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """A first Ctrl-C: a second one, pressed while pytest reports it, ends the close's
        wait for the session's workers instead of breaking into the report (controller)."""
        from pytest_evalloop.stash import CLAIMS_KEY, RUNTIME_KEY

        self.stopped_by = xdist_stop(excinfo.value)

        claims = self.config.stash.get(CLAIMS_KEY, None)
        # Only a session with runs to close: in a plain one a second Ctrl-C is pytest's.
        evaluating = RUNTIME_KEY in self.config.stash or self.run_dirs or self.cases_seen
        if claims is not None and evaluating:
            claims.hold_interrupts()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        """The item's reports are all logged: leave on each only the words the terminal
        summary asks of it, since pytest keeps every report to the session's end (controller).
        Every hook of every plugin saw the whole result while its reports were logged."""
        reports = self.logged.pop(nodeid, ())
        for report in reports:
            if getattr(report, REPORT_ATTR, None):
                setattr(report, REPORT_ATTR, slimmed(getattr(report, REPORT_ATTR)))
        share_equal_parts(reports)

    def finish(
        self,
        session: pytest.Session,
        exitstatus: int,
        meanwhile: Callable[[], None] | None = None,
    ) -> None:
        """Close every run of the session: final status and totals counted from events.
        `meanwhile` runs once while the reports are written (in the chart process)."""
        from pytest_evalloop.measure import aggregates
        from pytest_evalloop.measure.unmeasured import unmeasured
        from pytest_evalloop.model_api.ratelimit import merge_stats
        from pytest_evalloop.session import runs

        for nodeid in list(self.logged):  # a crashed item's report, logged with no finish
            self.pytest_runtest_logfinish(nodeid)

        # -x / --maxfail stop a session through `shouldfail`: cases were left unanswered, so
        # the run is interrupted (and resumable), not complete.
        interrupted = (
            exitstatus == pytest.ExitCode.INTERRUPTED
            or bool(session.shouldstop)
            or bool(session.shouldfail)
        )
        from pytest_evalloop.model_api.pricing import price_table
        from pytest_evalloop.stash import CLAIMS_KEY, SETTINGS_KEY

        settings = self.config.stash[SETTINGS_KEY]
        resumed = bool(settings.resume)
        limiter = merge_stats(self.limiter_parts)
        prices = price_table(settings.prices)
        closing = _closing(
            session, settings, exitstatus, self.stopped_by, self.selected, self.never_run
        )
        spent = _ceiling_record(self.config)
        for run_dir in sorted(self.run_dirs):
            path = Path(run_dir)
            if self.workers_lost:
                # A worker killed between its chain entries and their lines left entries for
                # lines never written: dropped as the next append (or a resume) drops them,
                # under the ledger's lock, or the seal made now would not verify.
                from pytest_evalloop.ledger.seal import drop_unwritten

                drop_unwritten(path)
            read = runs.finish_run(
                path,
                interrupted=interrupted,
                extra={"limiter": limiter, **({"spend": spent} if spent else {})},
                prices=prices,
                closing=closing,
                claims=self.config.stash.get(CLAIMS_KEY, None),
                on_wait=functools.partial(_waiting_notice, self.config, path),
            )
            info = _closed_info(path)
            counts = self.counts.get(run_dir, RunCounts())
            status = info.status if info else None
            tally = aggregates.tally(
                read, status=status, invalid_reason=info.invalid_reason if info else None
            )
            empty = unmeasured(tally, path)
            unfinished = unfinished_exit(status, settings)
            # The whole run, not only this session's items: a resumed run's summary covers
            # what was scored before the interruption too.
            summary = RunSummary(
                run_dir=path,
                label=(info.label or path.name) if info else path.name,
                status=status or "?",
                tally=tally,
                costs=aggregates.role_costs(read),
                not_attempted=counts.aborted,
                answered_here=counts.answered_here if resumed else None,
                judge_samples=judgesamples.summary(list(read.score_groups().values())),
                models=runs.role_models(info),
                cost_figures=info.cost_figures if info else {},
                shards=shard_note(info) if info else None,
                spend=(info.spend or {}) if info else {},
                unfinished_exit=unfinished,
                unmeasured=empty,
                # An unfinished run's exit (8) wins: its WARNING names no other.
                unmeasured_exit=None
                if unfinished is not None
                else unmeasured_exit(empty, settings),
            )
            self.summaries.append(summary)
            self.config.hook.pytest_evalloop_run_finished(
                config=self.config, run_dir=path, results=self.kept.pop(run_dir, [])
            )
            self._compare(session, path)
            # Not held while the report reads the ledger again: two reads at once were the
            # peak of a large run's memory.
            del read
        # Whatever the items and a gate said: a run that did not finish is never green, and
        # one that measured nothing is not either (no gate decides on it).
        codes = [s.unfinished_exit for s in self.summaries if s.unfinished_exit is not None]
        codes += [code for s in self.summaries if (code := invalid_exit(s.status)) is not None]
        codes += [s.unmeasured_exit for s in self.summaries if s.unmeasured_exit is not None]
        if codes:
            session.exitstatus = codes[0]
        self._reports(meanwhile)

    def _reports(self, meanwhile: Callable[[], None] | None) -> None:
        from pytest_evalloop.report.html import session_outputs_aside
        from pytest_evalloop.stash import SETTINGS_KEY

        settings = self.config.stash[SETTINGS_KEY]
        self.report_lines = session_outputs_aside(
            [s.run_dir for s in self.summaries],
            baseline=settings.baseline,
            html=settings.report,
            summary_md=settings.summary_md,
            charts_on=settings.report_charts,
            meanwhile=meanwhile,
        )

    def _compare(self, session: pytest.Session, run_dir: Path) -> None:
        from pytest_evalloop.measure.baseline import compare_run
        from pytest_evalloop.session import runs
        from pytest_evalloop.stash import SETTINGS_KEY

        settings = self.config.stash[SETTINGS_KEY]
        if not settings.baseline:
            return
        outcome = compare_run(
            run_dir,
            settings,
            set_dir=runs.set_dir_of(run_dir),
            verbosity=self.config.get_verbosity(),
        )
        self.gate_lines.extend(outcome.lines)
        _junit_properties(self.config, outcome.properties)
        if outcome.exit_code is not None:
            # With a gate, the exit status is the gate's verdict, whatever the items did.
            session.exitstatus = outcome.exit_code

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Print the eval summary of each run (controller)."""

        verbosity = self.config.get_verbosity()
        secrets = environment_secrets()

        def write(line: str) -> None:
            terminalreporter.write_line(redact(line, secrets))

        for summary in self.summaries:
            terminalreporter.write_sep("=", f"evalloop: {summary.label}")
            for line in summary_lines(summary, verbosity):
                write(line)
            for line in self.report_lines.get(summary.run_dir, []):
                write(line)
        unanswered = unanswered_lines(self.unanswered)
        if unanswered:
            terminalreporter.write_sep("=", "evalloop: not answered")
            for line in unanswered:
                write(line)
        if self.gate_lines:
            terminalreporter.write_sep("=", "evalloop: against the baseline")
            for line in self.gate_lines:
                write(line)


def _ceiling_record(config: pytest.Config) -> dict[str, Any] | None:
    """run.json `spend` figures of this session's ceiling (None without one) (controller)."""
    from pytest_evalloop.stash import RUNTIME_KEY, SETTINGS_KEY

    runtime = config.stash.get(RUNTIME_KEY, None)
    ceiling = getattr(runtime, "spend", None)
    if ceiling is None:
        return None
    from pytest_evalloop.session.estimate import attempt_bound

    try:
        return dict(ceiling.record(attempt_bound(config.stash[SETTINGS_KEY]).total))
    except ValueError:
        return None  # the count cannot be read: the run's abort reason says so


def unfinished_exit(status: str | None, settings: Any) -> int | None:
    """The exit status a run that did not finish gives its session (None: it finished, or
    `--eval-allow-aborted` asks for the items' exit status)."""
    from pytest_evalloop.measure.gate import EXIT_RUN_UNFINISHED, UNFINISHED

    # "running": left open because another process still wrote it (`runs.finish_run`).
    if status not in (*UNFINISHED, "running") or settings.allow_aborted:
        return None
    return EXIT_RUN_UNFINISHED


def invalid_exit(status: str | None) -> int | None:
    """The exit status a run whose ledger does not validate gives its session: it measured
    nothing anyone may read, whatever its items did (None: any other status)."""
    from pytest_evalloop.measure.gate import EXIT_HARNESS_FAILURE

    return EXIT_HARNESS_FAILURE if status == "invalid" else None


def unmeasured_exit(empty: Unmeasured | None, settings: Any) -> int | None:
    """The exit status a run that measured nothing gives its session (None: it measured
    something, or `--eval-allow-unmeasured` asks for the items' exit status)."""
    from pytest_evalloop.measure.gate import EXIT_NOTHING_MEASURED

    if empty is None or settings.allow_unmeasured:
        return None
    return EXIT_NOTHING_MEASURED


def xdist_stop(raised: BaseException) -> str | None:
    """Why xdist stopped the session, when it was not a Ctrl-C, or None.

    xdist's controller ends a session that `-x`/`--maxfail` (or a worker's own stop) halted by
    raising its `Interrupted`, a KeyboardInterrupt: pytest then reports the session as
    interrupted, as it does a Ctrl-C. Its message tells them apart: a Ctrl-C that reached a
    worker says "received keyboard-interrupt"; one pressed at the controller is no
    `Interrupted` at all."""
    kind = type(raised)
    if kind.__name__ != "Interrupted" or not kind.__module__.startswith("xdist"):
        return None
    said = str(raised)
    return None if "keyboard-interrupt" in said else said


def _closing(
    session: pytest.Session,
    settings: Any,
    exitstatus: int,
    stopped_by: str | None = None,
    selected: dict[Path, set[str]] | None = None,
    never_run: dict[str, set[str]] | None = None,
) -> Closing:
    """How this session ends, for each run's whole-split record (controller): how it stopped
    (`stopped_by`: why xdist stopped it, when no Ctrl-C did), what it selected, and what was
    answered ahead and never run."""
    from pytest_evalloop.goldens.preflight import answers_unscorable
    from pytest_evalloop.session.selection import Closing

    stopped = None
    failed = session.shouldfail or stopped_by
    if exitstatus == pytest.ExitCode.INTERRUPTED and not stopped_by:
        stopped = "interrupted (Ctrl-C)"
    elif failed:
        # The flag that stopped it, when one was given: xdist also stops a session whose
        # crashed worker it may not replace, with no flag behind it.
        flags = [f for f in settings.narrowing if f.startswith(("-x", "--maxfail", "--sw"))]
        stopped = f"{failed} ({', '.join(flags)})" if flags else str(failed)
    elif session.shouldstop:
        stopped = str(session.shouldstop) if session.shouldstop is not True else "stopped early"
    return Closing(
        narrowed_by=tuple(settings.narrowing),
        stopped=stopped,
        answers_unscorable=answers_unscorable(settings),
        selected=None if selected is None else {k: frozenset(v) for k, v in selected.items()},
        never_run={k: frozenset(v) for k, v in (never_run or {}).items()},
    )


@dataclass
class RunCounts:
    """What the summary says of one run's items in this session, folded in as each reports."""

    aborted: int = 0
    """Items never attempted because the run aborted (no event records them)."""
    answered_here: int = 0
    """Attempts this session answered (a resumed run's others were carried)."""

    def add(self, result: dict[str, Any]) -> None:
        if result.get("reason") == "aborted":
            self.aborted += 1
        elif not result.get("carried"):
            self.answered_here += 1


def _junit_properties(config: pytest.Config, properties: dict[str, str]) -> None:
    # junitxml keeps its writer in the stash under this key; record_testsuite_property uses it
    # the same way. Absent unless --junitxml was given.
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    for name, value in properties.items():
        xml.add_global_property(name, value)


def summary_lines(summary: RunSummary, verbosity: int = 0) -> list[str]:
    """The terminal text of one run, counted from its whole ledger (`aggregates.tally`)."""
    tally = summary.tally
    lines = summary.unmeasured.lines(summary.unmeasured_exit) if summary.unmeasured else []
    lines.append(_counts_line(tally))
    lines.append(_pass_rate_line(tally))
    # The submitted share right under the pass rate: a rate over fewer answers is no better.
    lines.append(tally.submitted_text)
    if tally.human_settled:
        lines.append(tally.human_text)
    lines.extend(figures.sample_lines(tally, summary.judge_samples, verbosity))
    if tally.harness_failure:
        # Printed with or without a gate: no model score may be published from this run.
        lines.append(f"HARNESS FAILURE: {tally.harness_failure}")
    if tally.contaminated:
        lines.append(
            f"contaminated attempts: {tally.contaminated} (out of every aggregate): "
            f"{tally.seen_text}"
        )
    gold_wrong = tally.outcomes.get("gold_wrong", 0)
    if gold_wrong:
        lines.append(
            f"gold_wrong attempts: {gold_wrong} (the judge showed the golden wrong; out of every "
            "aggregate until it is repaired through the golden side door)"
        )
    gated = tally.unscored_reasons
    if gated:
        lines.append("not scored: " + ", ".join(f"{n} {why}" for why, n in gated.items()))
        lines.extend(_gate_advice(gated))
    if summary.not_attempted:
        lines.append(f"not attempted: {summary.not_attempted} (the run aborted before their turn)")
    if tally.recall is not None:
        lines.append(
            f"retrieval recall: mean {tally.recall:.2f} over {len(tally.recalls)} attempts"
        )
    lines.extend(figures.precision_line(tally))
    endpoint = summary.spend.get("endpoint")
    lines.extend(_cost_lines(summary.costs, endpoint))
    lines.extend(cache_lines(summary.costs, summary.models, summary.cost_figures, endpoint))
    lines.extend(ceiling_lines(summary.spend))
    for doubted in tally.doubted:
        note = f": {doubted['gold_note']}" if doubted["gold_note"] else ""
        lines.append(
            f"golden doubted by the judge: {doubted['qid']} ({doubted['gold_status']}){note}"
        )
    if summary.answered_here is not None and summary.answered_here < len(tally.attempts):
        lines.append(
            f"this session answered {summary.answered_here} of the run's "
            f"{len(tally.attempts)} attempts; the figures above cover the whole run"
        )
    if summary.shards:
        lines.append(f"{SHARDS_TITLE}: {summary.shards}")
    lines.append(f"run: {summary.label} ({summary.status}) at {summary.run_dir}")
    if summary.unfinished_exit is not None:
        lines.append(
            f"NOT FINISHED: the run is {summary.status}, so the session exits "
            f"{summary.unfinished_exit} whatever its items did; finish it with "
            f"--eval-resume={summary.label} (--eval-allow-aborted exits by the items instead)"
        )
    return lines


def ceiling_lines(spend: dict[str, Any]) -> list[str]:
    """What a session under `--eval-max-cost` spent against its ceiling (run.json `spend`)."""
    ceiling = spend.get("ceilingUsd")
    if not isinstance(ceiling, int | float):
        return []
    from pytest_evalloop.model_api.spend import stopped_text

    spent = float(spend.get("spentUsd") or 0.0)
    reserved = spend.get("reservedUsd")
    each = f"; each reserved up to ${reserved:.4f}" if isinstance(reserved, int | float) else ""
    unknown = spend.get("unknownCost") or 0
    held = f", {unknown} counted at their reservation (cost unknown)" if unknown else ""
    head = (
        stopped_text(spent, ceiling)
        if spend.get("stopped")
        else f"spend: ${spent:.4f} of the ${ceiling:.4f} ceiling"
    )
    return [f"{head} ({spend.get('attempts', 0)} attempt(s) started{held}{each})"]


def unanswered_lines(results: list[dict[str, Any]]) -> list[str]:
    """Items the conductor never sent to the answerer, by reason (they are in no run's ledger)."""
    skipped = [r for r in results if r.get("answered") is False]
    if not skipped:
        return []
    reasons = Counter(str(r["reason"]) for r in skipped)
    lines = [
        f"{len(skipped)} item(s) not answered (nothing spent on them): "
        + ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
    ]
    for why in sorted(reasons):
        qids = sorted({str(r["qid"]) for r in skipped if r["reason"] == why})
        shown = ", ".join(qids[:10]) + (f", … (+{len(qids) - 10})" if len(qids) > 10 else "")
        lines.append(f"  {why}: {shown}")
    return lines


def _counts_line(tally: aggregates.Tally) -> str:
    parts = [f"{n} {word}" for word, n in tally.outcomes.items()]
    return "verdicts: " + (", ".join(parts) if parts else "none")


def _pass_rate_line(tally: aggregates.Tally) -> str:
    from pytest_evalloop.measure.aggregates import OUT_OF_EVERY_AGGREGATE

    if tally.withheld is not None:
        return f"pass rate: withheld ({tally.withheld})"
    if tally.pass_rate is None:
        return "pass rate: n/a (no decided verdict: match or no_match)"
    apart = [f"{n} {word}" for word, n in tally.outcomes.items() if word in OUT_OF_EVERY_AGGREGATE]
    out = f"; out of every aggregate: {', '.join(apart)}" if apart else ""
    return (
        f"pass rate: {tally.pass_rate:.1%} ({tally.passed}/{tally.decided} decided; "
        f"near_match, needs_human and unscored excluded{out}){figures.interval_text(tally)}"
    )


def _gate_advice(gated: dict[str, int]) -> list[str]:
    from pytest_evalloop.goldens.preflight import GOLDEN_FIX

    found = [reason for reason in GOLDEN_FIX if reason in gated]
    if not found:
        return []
    # Each refusal's own way through the golden side door: a held key is not promoted.
    fixes = "; ".join(f"{reason.removeprefix('golden_')}: {GOLDEN_FIX[reason]}" for reason in found)
    return [
        f"  goldens that are not scorable are never scored ({fixes}); then rejudge this run "
        "with --eval-rejudge-from"
    ]


def _cost_lines(costs: dict[str, ledger.RoleCost], endpoint: str | None = None) -> list[str]:

    lines = []
    for role in ("answerer", "judge"):
        cost = costs.get(role)
        if cost is None or cost.calls == 0:
            continue
        money = (
            "unknown (a model's price is not in the table)"
            if cost.cost_usd is None
            else f"${cost.cost_usd:.4f}"
        )
        lines.append(
            f"{role}: {cost.input_tokens} in / {cost.output_tokens} out tokens, "
            f"cache {cost.cache_read_tokens} read / {cost.cache_creation_tokens} written, cost "
            f"{money}{list_price_note(endpoint)}"
        )
    return lines


def _waiting_notice(config: pytest.Config, run_dir: Path, wait: float) -> None:
    """Say why the session has not ended: its run is still held by another of its processes
    (a worker, when the controller alone was stopped). Controller or plain session."""
    line = redact(
        f"evalloop: waiting up to {wait:g} s for this session's other processes to let "
        f"{run_dir} go; press Ctrl-C again to leave it open for --eval-resume",
        environment_secrets(),
    )
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    try:
        if reporter is not None:
            reporter.write_line(line)
        else:
            sys.stderr.write(line + "\n")
    except (OSError, ValueError):
        pass  # a closed terminal: the close goes on, the run is what matters


def _closed_info(run_dir: Path) -> ledger.RunInfo | None:
    """`run.json` as closing left it (None when it cannot be read: the summary says "?")."""
    from pytest_evalloop.ledger.reader import read_run_info

    try:
        return read_run_info(run_dir)
    except (OSError, ValueError):
        return None
