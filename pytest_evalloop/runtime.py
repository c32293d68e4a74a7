"""The per-process runtime: one background event loop on which every attempt's pipeline runs.

pytest calls items one at a time on the main thread; the pipelines run on this loop, so an item
can be started ahead of its turn (up to `--eval-concurrency` in flight) while pytest still
reports each in collection order with its real outcome. One runtime per process (the controller
without xdist, or each xdist worker), kept in `config.stash`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import gc
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pytest_evalloop.answer.materials import definitions_shared, model_definitions, model_paths
from pytest_evalloop.answer.pipeline import (
    HARNESS_ERROR_PREFIX,
    AttemptContext,
    ItemResult,
    Status,
    evaluate,
    record_harness_error,
)
from pytest_evalloop.answer.storedreport import stored_report
from pytest_evalloop.failures import HarnessError
from pytest_evalloop.latch import InterruptLatch
from pytest_evalloop.ledger import gcpolicy
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.ledger.resume import ScoredAttempts
from pytest_evalloop.lookahead import may_start_ahead, never_run
from pytest_evalloop.measure import aggregates
from pytest_evalloop.model_api.spend import GO, POLL_SECONDS, WAIT, Admission, Bound, SpendCeiling
from pytest_evalloop.progress import result_cost
from pytest_evalloop.roles.contract import Answerer, Judge, RestartingTarget, Target, TargetSession
from pytest_evalloop.session import claims, runs, selection
from pytest_evalloop.sets.cases import CaseChanged, question_sha

if TYPE_CHECKING:
    from pytest_evalloop.items import CaseItem
    from pytest_evalloop.options import Settings
    from pytest_evalloop.progress import ProgressModel

T = TypeVar("T")
ABORT_AFTER = 4
"""Consecutive harness errors after which the run stops spending budget nobody will trust."""


AHEAD_SLOTS = 3
"""How far past the concurrency the attempts started may run ahead of the item pytest waits
on, in multiples of it."""


@dataclass
class _Queue:
    """Items run in this order by one process (or one shard of it), and how far it started."""

    items: list[CaseItem] = field(default_factory=list)
    cursor: int = 0


@dataclass(frozen=True)
class Roles:
    """The answerer, judge and target one item runs with (from its fixtures)."""

    answerer: Answerer
    judge: Judge
    target: Target


class Runtime:
    """Runs attempt pipelines on a background loop and keeps per-process run state."""

    def __init__(
        self, settings: Settings, session_id: str, writer_claims: claims.WriterClaims | None = None
    ) -> None:
        self.settings = settings
        self.session_id = session_id
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._futures: dict[str, concurrent.futures.Future[ItemResult]] = {}
        self._sessions: dict[int, asyncio.Task[TargetSession]] = {}
        self._targets: list[Target] = []
        self.closers: list[Callable[[], Awaitable[None]]] = []
        """Coroutines run on the loop before it stops (e.g. closing the SDK clients)."""
        self._run_dirs: dict[Path, Path] = {}
        # The runs this process writes, until it stops (the session's: see `CLAIMS_KEY`).
        self.claims = writer_claims or claims.WriterClaims()
        self._scored: dict[Path, ScoredAttempts] = {}
        """Per run: the attempts scored already (by an earlier session or another process)."""
        self._lock = threading.Lock()
        self._running = 0
        """Attempts submitted whose future is not done yet (each item's look-ahead asks)."""
        self._freed = threading.Event()
        """Set when an attempt ends: the item waited on starts others in the freed slot."""
        self.ahead_slots = AHEAD_SLOTS
        """How many slots' worth of items past the concurrency may start while one is waited
        on (0: only the items within the concurrency of it, as under `-x`)."""
        self._where: dict[str, tuple[str, str]] = {}  # an attempt in flight: its run and qid
        self.never_run: dict[str, list[str]] = {}
        """After `close`: per run, the cases answered ahead that pytest never ran (`never_run`)."""
        self.may_start_ahead: Callable[[CaseItem], bool] = may_start_ahead
        """Whether an item may start before pytest reaches it (the plugin sets the whole rule,
        `lookahead.StartRule`; alone, its marks decide)."""
        self.target_ahead: Callable[[CaseItem, CaseItem], Target | None] | None = None
        """The target another file's item would get, if it can be known before pytest sets
        that item up (the plugin sets it: `settargets.target_ahead`); None stops there."""
        self._consecutive_errors = 0
        self.aborted: str | None = None
        self.progress: ProgressModel | None = None
        """Counters for the progress display (the plugin sets them)."""
        self._model_paths: dict[Path, list[Path]] = {}
        self._gc_before: tuple[int, ...] | None = None
        self._abort_check = runs.AbortCheck()
        self._places: dict[str, tuple[_Queue, int]] = {}
        """Each case item's queue and its index in it (see `plan`)."""
        self.spend: SpendCeiling | None = None
        """`--eval-max-cost`: the session's spend ceiling, shared by its processes."""
        self.reservation: Callable[[Roles], Bound] | None = None
        """The most one attempt with these roles can cost (the plugin sets it with `spend`)."""
        self._released: asyncio.Event | None = None
        self.interrupt = InterruptLatch()

    # --- the loop ------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._gc_before = gcpolicy.tune_for_attempts()
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="evalloop-loop", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
            self.interrupt.install(
                lambda: list(self._futures.values()),
                loop.call_soon_threadsafe,
                self.claims.interrupt_again,
            )
        return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule a coroutine on the runtime's loop."""
        return asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the runtime's loop and wait for its result."""
        return self.submit(coro).result()

    def close(self) -> None:
        """Cancel what is still in flight, close target sessions, stop the loop."""
        self.interrupt.restore()
        if self.interrupt.tripped:
            # The session ends on a Ctrl-C: a next one is the close's, from here on too.
            self.claims.hold_interrupts()
        self.never_run = never_run(self._futures, self._where)
        for future in self._futures.values():
            future.cancel()
        if self._loop is None:
            return
        try:
            self.submit(self._close_targets()).result(timeout=10)
        except (concurrent.futures.TimeoutError, Exception):  # noqa: BLE001 - best effort at exit
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._gc_before is not None:
            gc.set_threshold(*self._gc_before)
            self._gc_before = None

    async def _close_targets(self) -> None:
        # First: the ledger lines of attempts just cancelled are written, or never begun, before
        # the close reads the ledger to count what it seals.
        await ledger_writer.writes_done()
        closers = [target.close for target in self._targets] + self.closers
        for close in closers:
            try:
                await close()
            except Exception:  # noqa: BLE001 - a dead target must not hide the run's result
                pass

    # --- items ---------------------------------------------------------------------------

    def run_item(self, item: CaseItem, roles: Roles) -> ItemResult:
        """Start this item (and those ahead of it, up to the concurrency), wait for its result."""
        if self.interrupt.tripped:
            raise KeyboardInterrupt  # nothing new starts once Ctrl-C came
        self._schedule(item, roles)
        # Left among the in-flight futures while waited on: an interrupt cancels it too.
        future = self._futures[item.nodeid]
        try:
            self._refill_until_done(item, roles, future)
            return self.interrupt.result(future)
        finally:
            del self._futures[item.nodeid]
            self._where.pop(item.nodeid, None)

    def _refill_until_done(
        self, item: CaseItem, roles: Roles, future: concurrent.futures.Future[ItemResult]
    ) -> None:
        """Start the items ahead of this one whenever an attempt frees a slot, until this
        item's own attempt ends (or Ctrl-C came).

        Why: refilled only when pytest moved on to the next item, a slot freed by any attempt
        but the one waited on stayed empty until that one ended. Measured with every 16th case
        10x slower (256 cases, concurrency 32): 43.9 s before, 15.5 s after. Scheduling stays
        on this thread (the attempt's context is built here, off the event loop).
        """
        while not self.interrupt.tripped:
            self._freed.clear()  # before the look-ahead reads the count: no end is missed
            for ahead, its_roles in self._lookahead(item, roles):
                self._schedule(ahead, its_roles)
            if future.done():
                return
            self._freed.wait()

    def _lookahead(self, item: CaseItem, roles: Roles) -> list[tuple[CaseItem, Roles]]:
        """The next items of this item's queue not yet started, as many as there is room for,
        each with its roles (`roles`, this item's, but another file's target)."""
        if self.settings.concurrency <= 1:
            return []
        place = self._places.get(item.nodeid)
        if place is None:
            return []
        queue, index = place
        # Kept as futures start and end: counting the not-done futures here cost a lock per
        # future in flight, on every item.
        room = self.settings.concurrency - self._running
        ahead: list[tuple[CaseItem, Roles]] = []
        parent, own = item.parent, roles
        # Everything before the cursor was started already: each item is looked at once, so a
        # run of 10,000 items costs 10,000 steps here, not 10,000 squared.
        cursor = max(queue.cursor, index + 1)
        # Results wait for their item's turn: behind one slow attempt, no more than a few
        # slots' worth of them are kept (flat memory), however many the others finish.
        reach = (1 + self.ahead_slots) * self.settings.concurrency
        stop = min(len(queue.items), index + reach)
        while room > 0 and cursor < stop:
            candidate = queue.items[cursor]
            if candidate.parent is not parent:
                # Another file's items (another set) start with their own target, and only
                # when nothing else of their roles can differ (`lookahead.target_ahead`); else,
                # and under -x, once pytest reaches them. (This item's target once answered
                # the next set's cases, and its run recorded this set's pins.)
                target = None
                if self.target_ahead is not None and self.ahead_slots > 0:
                    target = self.target_ahead(item, candidate)
                if target is None:
                    break
                parent, own = candidate.parent, replace(roles, target=target)
            cursor += 1
            if candidate.nodeid not in self._futures and self.may_start_ahead(candidate):
                ahead.append((candidate, own))
                room -= 1
        queue.cursor = cursor
        return ahead

    def plan(self, order: list[CaseItem], shards: dict[str, int] | None = None) -> None:
        """The case items this process will run, in order, so pipelines can start ahead.

        One queue per shard under xdist (`shards`: each item's shard; a worker runs whole
        shards, see sharding), else one for the process.
        """
        queues: dict[int | None, _Queue] = {}
        self._places = {}
        for case_item in order:
            key = None if shards is None else shards.get(case_item.nodeid)
            queue = queues.setdefault(key, _Queue())
            self._places[case_item.nodeid] = (queue, len(queue.items))
            queue.items.append(case_item)

    def _schedule(self, item: CaseItem, roles: Roles) -> None:
        if item.nodeid in self._futures:
            return
        try:
            skipped = not_answered(item, roles.target, self.settings)
        except CaseChanged as exc:
            # The item's own harness error, never one of the item scheduling it ahead.
            skipped = _unanswered(item, "case_changed", str(exc), status="harness_error")
        if skipped is not None:
            # Decided before any run directory, session or model call: nothing is spent, and
            # it is no evidence about the harness either way (the abort rule never sees it).
            done: concurrent.futures.Future[ItemResult] = concurrent.futures.Future()
            done.set_result(skipped)
            self._futures[item.nodeid] = done
            return
        ctx = self.context_for(item, roles)
        future = self.submit(self._attempt(ctx, roles))
        self._where[item.nodeid] = (str(ctx.run_dir), ctx.case.qid)
        if self.progress is not None:
            self.progress.started()
        future.add_done_callback(lambda f: self._count(f, ctx.run_dir))
        self._track(item.nodeid, future)

    def _track(self, nodeid: str, future: concurrent.futures.Future[ItemResult]) -> None:
        """An attempt started: kept under its item until waited on, counted until it ends."""
        with self._lock:
            self._running += 1
        self._futures[nodeid] = future
        future.add_done_callback(self._ended)

    def _ended(self, _: concurrent.futures.Future[ItemResult]) -> None:
        with self._lock:
            self._running -= 1
        self._freed.set()  # after the count: the waiting item's look-ahead sees the free slot

    async def _attempt(self, ctx: AttemptContext, roles: Roles) -> ItemResult:
        reason = (
            self.aborted
            or self._abort_check(ctx.run_dir)
            or self._target_stop(roles.target, ctx.run_dir)
        )
        if reason:
            return aborted_result(ctx, reason)
        # Asked right before answering, not when scheduled: an item started ahead of its turn
        # may be one a killed worker scored without reporting it (xdist hands it on).
        stored = self._scored_in(ctx.run_dir).get(ctx.case.qid, ctx.sample)
        if stored is not None:
            report = None
            if aggregates.outcome(stored) in REPORTED_IN_FULL:
                report = await asyncio.to_thread(stored_report, ctx, stored)
            return resumed_result(ctx, stored, report)
        spend = self.spend
        if spend is None:
            return await self._answer(ctx, roles)
        # Asked last, right before money is spent: a resumed or aborted item costs nothing.
        admission = self._reserve(spend, roles)
        while admission.kind == WAIT:
            # It fits once attempts in flight release what they hold: here, or in another
            # process of the session (looked for every POLL_SECONDS).
            await self._released_or_poll()
            stopped = self.aborted or self._abort_check(ctx.run_dir)
            if stopped:
                return aborted_result(ctx, stopped)
            admission = self._reserve(spend, roles)
        if admission.kind != GO:
            reason = admission.reason or "stopped before the ceiling"
            with self._lock:
                if self.aborted is None:
                    self.aborted = reason
                    runs.mark_aborted(ctx.run_dir, reason)
            return aborted_result(ctx, self.aborted or reason)
        cost: float | None = None
        try:
            result = await self._answer(ctx, roles)
            cost = spent_by(result)
            return result
        finally:
            spend.settle(admission, cost)
            if self._released is not None:
                self._released.set()
                self._released = None

    def _reserve(self, spend: SpendCeiling, roles: Roles) -> Admission:
        bound = self.reservation(roles) if self.reservation is not None else None
        if bound is None:
            what = "no bound for these roles"
        elif bound.total is None:
            what = f"no price for {', '.join(bound.unpriced())}; add it with --eval-prices"
        else:
            what = bound.short()
        try:
            return spend.reserve(bound.total if bound is not None else None, what=what)
        except ValueError as exc:
            return Admission("stop", reason=f"stopped before the ceiling: {exc}")

    async def _released_or_poll(self) -> None:
        # Made on the loop, where every attempt waits and settles.
        if self._released is None:
            self._released = asyncio.Event()
        try:
            await asyncio.wait_for(self._released.wait(), POLL_SECONDS)
        except TimeoutError:
            pass

    async def _answer(self, ctx: AttemptContext, roles: Roles) -> ItemResult:
        started = time.monotonic()
        try:
            session = await self.session_for(roles.target)
        except HarnessError as exc:
            # Recorded as an attempt, so the ledger (and every figure counted from it) knows
            # the case was tried and the harness could not finish it.
            result = record_harness_error(ctx, roles.answerer, str(exc))
        else:
            result = await evaluate(ctx, roles.answerer, roles.judge, session)
            # The target died for good under this attempt: it is the run's last harness error.
            self._target_stop(roles.target, ctx.run_dir)
        # The item's report carries it as its duration (`otherplugins.report_duration`).
        result.wall_seconds = round(time.monotonic() - started, 3)
        return result

    def _target_stop(self, target: Target, run_dir: Path) -> str | None:
        """Abort the run when a restarting target's restarts are spent (its reason), else None."""
        reason = target.stop_reason if isinstance(target, RestartingTarget) else None
        if reason is None:
            return None
        with self._lock:
            if self.aborted is None:
                self.aborted = reason
                runs.mark_aborted(run_dir, reason)
            return self.aborted

    def _count(self, future: concurrent.futures.Future[ItemResult], run_dir: Path) -> None:
        if future.cancelled():
            if self.progress is not None:
                self.progress.abandoned()
            return
        failure = future.exception()
        if failure is not None:
            # Something below the pipeline raised (a bug, a user's role): it is still an attempt
            # the harness could not complete, and counts toward the abort rule.
            if self.progress is not None:
                self.progress.abandoned()
            self._tally_error(run_dir, f"{type(failure).__name__}: {failure}")
            return
        result = future.result()
        if self.progress is not None:
            self.progress.finished_result(result)
        if result.status == "harness_error":
            self._tally_error(run_dir, result.report.removeprefix(HARNESS_ERROR_PREFIX))
        elif result.reason != "aborted":
            with self._lock:
                self._consecutive_errors = 0

    def _tally_error(self, run_dir: Path, last: str) -> None:
        with self._lock:
            self._consecutive_errors += 1
            if self._consecutive_errors >= ABORT_AFTER and self.aborted is None:
                self.aborted = (
                    f"run aborted after {ABORT_AFTER} consecutive harness errors; last: {last}"
                )
                runs.mark_aborted(run_dir, self.aborted)

    async def session_for(self, target: Target) -> TargetSession:
        """The shared session of a target, opened once (concurrent callers wait for it)."""
        key = id(target)
        task = self._sessions.get(key)
        if task is not None and isinstance(target, RestartingTarget) and _died(task):
            task = None  # its server died: the target restarts it (or says the run stops)
        if task is None:
            task = asyncio.ensure_future(target.open())
            self._sessions[key] = task
            self._targets.append(target)
        try:
            return await asyncio.shield(task)
        except HarnessError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure to connect is the harness's
            raise HarnessError(f"could not open target {target.name!r}: {exc}") from exc

    # --- run directories and per-attempt context ------------------------------------------

    def run_dir_for(self, item: CaseItem, roles: Roles) -> Path:
        """This session's run directory for the item's set (created on first need)."""
        set_dir = item.set_dir
        with self._lock:
            if set_dir not in self._run_dirs:
                self._run_dirs[set_dir] = runs.open_run(self._run_request(item, roles), self.claims)
            return self._run_dirs[set_dir]

    def _run_request(self, item: CaseItem, roles: Roles) -> runs.RunRequest:
        settings = self.settings
        return runs.RunRequest(
            set_dir=item.set_dir,
            set_config=item.set_config,
            runs_dir=settings.runs_dir,
            label=settings.label,
            phase=settings.phase,
            session_id=self.session_id,
            target=roles.target.name,
            answerer=roles.answerer.backend,
            answerer_model=roles.answerer.model,
            resume=settings.resume,
            judge_model=roles.judge.model,
            judge_version=roles.judge.version,
            rubric_sha=roles.judge.rubric_sha,
            extra=_extra(settings, roles, item.set_dir, self.session_id),
            pins=role_pins(roles),
        )

    def _scored_in(self, run_dir: Path) -> ScoredAttempts:
        """The run's scored attempts (asked on the loop only): those are never answered again."""
        found = self._scored.get(run_dir)
        if found is None:
            found = self._scored[run_dir] = ScoredAttempts(run_dir)
        return found

    @property
    def run_dirs(self) -> list[Path]:
        """Run directories this process wrote to."""
        return list(self._run_dirs.values())

    def context_for(self, item: CaseItem, roles: Roles) -> AttemptContext:
        """What the conductor knows about the item's attempt before it starts."""
        run_dir = self.run_dir_for(item, roles)
        case = item.case
        return AttemptContext(
            run_dir=run_dir,
            set_dir=item.set_dir,
            case=case,
            sample=item.sample,
            phase=self.settings.phase,
            model_definitions=model_definitions(item.set_dir, item.set_config, case),
            definitions_shared=definitions_shared(item.set_dir, item.set_config),
            set_config=item.set_config,
            protected_paths=protected_paths(item.set_dir, case, run_dir),
            model_paths=self._model_paths_of(item),
            judge_samples=self.settings.judge_samples,
        )

    def _model_paths_of(self, item: CaseItem) -> list[Path]:
        # One set's model files are the same for all its items: resolve them once.
        found = self._model_paths.get(item.set_dir)
        if found is None:
            found = self._model_paths[item.set_dir] = model_paths(item.set_dir, item.set_config)
        return found


def not_answered(item: CaseItem, target: Target, settings: Settings) -> ItemResult | None:
    """The result of an item the conductor does not send to the answerer, or None to answer it.

    Under `--eval-rejudge-from`, a case the source run holds no answer for is reported as not
    in the source (`not_in_source`) rather than failing as a harness error. Otherwise a case
    whose golden cannot be scored is not answered (its reason is the golden gate's) unless
    `--eval-answer-unscorable`: an answer nobody can score is money spent on nothing.
    """
    from pytest_evalloop.goldens import preflight

    case = item.case
    not_covered = getattr(target, "not_covered", None)
    if settings.rejudge_from and callable(not_covered):
        why = not_covered(question_sha(case.question), item.sample)
        if why:
            return _unanswered(item, "not_in_source", why)
    if preflight.answers_unscorable(settings):
        return None
    refused = preflight.golden_refusal(case)
    if refused is None:
        return None
    status = refused.removeprefix("golden_")
    return _unanswered(
        item,
        refused,
        f"not answered: its golden is {status}, so no answer could be scored; "
        f"{preflight.GOLDEN_FIX.get(refused, preflight.GOLDEN_FIX['golden_invalid'])}, or pass "
        "--eval-answer-unscorable to answer it for a later rejudge",
    )


def _unanswered(
    item: CaseItem, reason: str, report: str, *, status: Status = "unscored"
) -> ItemResult:
    return ItemResult(
        qid=item.qid,
        sample=item.sample,
        status=status,
        reason=reason,
        report=HARNESS_ERROR_PREFIX + report if status == "harness_error" else report,
        answered=False,
    )


def role_pins(roles: Roles) -> dict[str, Any]:
    """Pins the roles carry beyond their names (both optional attributes of a user's roles):
    the answerer's `version`, the target's `pins` (profile, served model; a rejudge's target
    also the source run's answerer pins, which win)."""
    pins: dict[str, Any] = {
        "answererVersion": getattr(roles.answerer, "version", None),
        "answererPromptSha": getattr(roles.answerer, "prompt_sha", None),
        "judgePromptSha": getattr(roles.judge, "prompt_sha", None),
    }
    pins.update(getattr(roles.target, "pins", None) or {})
    return pins


def _extra(settings: Settings, roles: Roles, set_dir: Path, session_id: str) -> dict[str, Any]:
    from pytest_evalloop.goldens.preflight import recorded
    from pytest_evalloop.model_api.ratelimit import session_state_dir

    extra: dict[str, Any] = {"selection": selection.design(settings, set_dir)}
    check = recorded(session_state_dir(session_id), set_dir)
    if check is not None:
        extra["goldenCheck"] = check
    source = getattr(roles.target, "source_run_id", None)
    if source is not None:
        extra["rejudgeOf"] = source
        extra["answersFrom"] = getattr(roles.target, "answers_from", None)
    if settings.run_group:
        extra["runGroup"] = settings.run_group
    money = money_facts(settings)
    if money:
        extra["spend"] = money
    if settings.shard is not None:
        from pytest_evalloop.sets.partition import RULE

        rpm, tpm = settings.limiter_rates
        extra["shard"] = {
            "index": settings.shard.index,
            "count": settings.shard.count,
            "rule": RULE,
            "rateShare": settings.rate_share,
            "rpm": rpm,
            "tpm": tpm,
        }
    return extra


def money_facts(settings: Settings) -> dict[str, Any]:
    """run.json `spend` as a run opens: how its judge is priced (`judgeBatch`) and where the
    endpoint is when it is not Anthropic's (`endpoint`: its costs are list prices, not bills)."""
    from pytest_evalloop.model_api.endpoint import endpoint_host

    money: dict[str, Any] = {"judgeBatch": True} if settings.judge_batch else {}
    host = endpoint_host()
    if host:
        money["endpoint"] = host
    return money


def protected_paths(set_dir: Path, case: Any, run_dir: Path) -> list[Path]:
    """Paths the answerer must never touch: the evals tree, gold artifacts, the run's ledger."""
    paths = list(_protected_roots(set_dir, run_dir))
    golden = case.golden
    if golden is not None and golden.path:
        paths.append((set_dir / golden.path).resolve())
    return paths


@functools.lru_cache(maxsize=64)
def _protected_roots(set_dir: Path, run_dir: Path) -> tuple[Path, ...]:
    # The same for every item of a set in a run; resolving costs system calls per attempt.
    roots = [set_dir.resolve(), run_dir.resolve()]
    if roots[0].parent.name == "evals":
        roots.append(roots[0].parent)
    return tuple(roots)


def _died(task: asyncio.Task[TargetSession]) -> bool:
    """Whether an opened session's connection has died since."""
    if not task.done() or task.cancelled() or task.exception() is not None:
        return False
    return bool(getattr(task.result(), "broken", False))


def spent_by(result: ItemResult) -> float | None:
    """What an attempt cost, for the spend ceiling: None (counted at its whole reservation)
    when it is not known: a model without a price, or a harness error, whose calls before it
    failed are not in its result."""
    if result.status == "harness_error":
        return None
    return result_cost(result)


def aborted_result(ctx: AttemptContext, reason: str) -> ItemResult:
    """The result of an item not attempted because the run was aborted."""
    return ItemResult(
        qid=ctx.case.qid,
        sample=ctx.sample,
        status="unscored",
        reason="aborted",
        report=reason,
        run_dir=str(ctx.run_dir),
    )


REPORTED_IN_FULL = ("no_match", "contaminated")
"""Outcomes whose report is the item's failure text (pytest's failure or error section)."""


def resumed_result(ctx: AttemptContext, score: Any, report: str | None = None) -> ItemResult:
    """The result of an attempt the run had scored already (not answered again): before an
    interruption (`--eval-resume`), in this session by a worker that died unreported, or by
    this item before a rerun (pytest-rerunfailures). `report`: its failure report as first
    written (`stored_report`), shown again with a line saying it was not answered again."""
    note = f"scored already in this run: {score.verdict} ({score.reason})"
    return ItemResult(
        qid=ctx.case.qid,
        sample=ctx.sample,
        status=aggregates.outcome(score),
        verdict=score.verdict,
        reason=score.reason,
        why=score.why,
        report=f"{report}\n({note}; not answered again)" if report else note,
        run_dir=str(ctx.run_dir),
        contaminated=score.contaminated,
        gold_status=score.gold_status,
        gold_note=score.gold_note,
        carried=True,
    )
