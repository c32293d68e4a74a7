"""What this session's attempts will cost: the most one can (the spend ceiling's reservation)
and what the selection is expected to (`--eval-estimate`).

Both are of *this* design: the answerer backend and model (none under `--eval-rejudge-from`,
which replays stored answers), the judge model, its samples, and the Message Batches API's half
price under `--eval-judge-batch`.

- :func:`attempt_bound` is the most one attempt can cost (`model_api.spend.RoleBound` per
  role): the answerer's turns times the largest request and reply it may make, within its
  token budget; the judge's samples times its calls (the first and its retries of an
  unparseable reply) times the largest request and reply. The spend ceiling reserves it.
- :func:`estimate_lines` prices the attempts the selection will pay for. From a complete run
  the comparability rule admits alone (`measure.comparable.alone`) with the same answerer
  backend, the same models and the same design (split, samples, judge samples, max turns and
  tokens), per role; else from the token model, whose range is stated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_evalloop.ledger.contract import RUN_FILE
from pytest_evalloop.model_api.pricing import PriceTable, Usage, price_table
from pytest_evalloop.model_api.spend import Bound, RoleBound, SpendCeiling, bound_of

if TYPE_CHECKING:
    from pytest_evalloop.ledger.contract import RunInfo
    from pytest_evalloop.options import Settings
    from pytest_evalloop.runtime import Roles, Runtime

# --- the most an attempt can cost ------------------------------------------------------------


def attempt_roles(
    settings: Settings,
    prices: PriceTable,
    *,
    backend: str | None = None,
    answerer_model: str | None = None,
    judge_model: str | None = None,
    answerer: Any = None,
) -> tuple[RoleBound, RoleBound]:
    """The answerer's and the judge's bounds for one attempt of this session.

    `backend`, the models and `answerer` default to the settings' built-in roles; a role of a
    user's own is bounded by the limits it carries (`max_turns`, `max_tokens_budget`,
    `max_output_tokens`), else by the session's, like the built-in `anthropic` answerer.
    """
    from pytest_evalloop.answer.answerer import MAX_OUTPUT_TOKENS
    from pytest_evalloop.answer.claude_code import cli_output_tokens
    from pytest_evalloop.judge.judge import MAX_OUTPUT_TOKENS as JUDGE_OUTPUT
    from pytest_evalloop.judge.judge import PARSE_RETRIES

    backend = backend or ("replay" if settings.rejudge_from else settings.answerer)
    a_model = answerer_model or settings.answerer_model
    j_model = judge_model or settings.judge_model
    turns = int(getattr(answerer, "max_turns", settings.max_turns))
    if backend == "replay":
        answer = RoleBound("answerer", a_model, 0, 0, 0, note="stored answers replayed")
    elif backend == "claude-code":
        answer = RoleBound(
            "answerer",
            a_model,
            turns,
            prices.context(a_model),
            cli_output_tokens(),
            note=f"{turns} turns of the claude CLI",
        )
    else:
        budget = int(getattr(answerer, "max_tokens_budget", settings.max_tokens))
        out = int(getattr(answerer, "max_output_tokens", MAX_OUTPUT_TOKENS))
        context = prices.context(a_model)
        # The budget is checked after each call: the last one may pass it by one request.
        answer = RoleBound(
            "answerer",
            a_model,
            turns,
            context,
            out,
            total_tokens=budget + context + out,
            note=f"{turns} turns",
            budget_note=f"--eval-max-tokens={budget:,} + one request",
        )
    calls = 1 + PARSE_RETRIES
    judge = RoleBound(
        "judge",
        j_model,
        settings.judge_samples * calls,
        prices.context(j_model),
        JUDGE_OUTPUT,
        price_factor=_batch_factor() if settings.judge_batch else 1.0,
        note=f"{settings.judge_samples} sample(s) x {calls} calls",
    )
    return answer, judge


def _batch_factor() -> float:
    from pytest_evalloop.model_api.batches import BATCH_PRICE_FACTOR

    return BATCH_PRICE_FACTOR


def attempt_bound(settings: Settings, **roles: Any) -> Bound:
    """The most one attempt of this session can cost (`attempt_roles`, priced)."""
    prices = price_table(settings.prices)
    return bound_of(attempt_roles(settings, prices, **roles), prices)


def ceiling_header(settings: Settings) -> list[str]:
    """What a session under `--eval-max-cost` says before it starts: what each attempt holds."""
    bound = attempt_bound(settings)
    total = bound.total
    if total is None:
        return []  # refused as a usage error before this is asked
    fits = int(settings.max_cost // total) if settings.max_cost and total > 0 else 0
    return [
        f"evalloop: --eval-max-cost={settings.max_cost:g}: each attempt reserves up to "
        f"${total:.4f} before it starts, its most ({bound.text()}); {fits} fit(s) in flight at "
        "once; what an attempt does not spend is released when it ends"
    ]


def ceiling_problem(settings: Settings) -> str | None:
    """Why `--eval-max-cost` cannot hold for the built-in roles (a model without a price)."""
    if settings.max_cost is None:
        return None
    missing = attempt_bound(settings).unpriced()
    if not missing:
        return None
    return (
        f"--eval-max-cost={settings.max_cost:g} cannot hold: no price for {', '.join(missing)}, "
        "so the most an attempt can cost is unknown; add the price with --eval-prices"
    )


# --- the session's ceiling and estimate ------------------------------------------------------


NotAnswered = Callable[[Any, Any, "Settings"], Any]
"""`runtime.not_answered`: an item's result when the conductor does not answer it, else None."""


def start(
    config: pytest.Config,
    runtime: Runtime,
    session_id: str,
    *,
    names_a_set: bool,
    case_item: type[pytest.Item],
    not_answered: NotAnswered,
) -> None:
    """`--eval-max-cost` and `--eval-estimate` in a session (every process): the shared spend
    count and what each attempt reserves; on the controller, a ceiling no price can hold is one
    usage error, and :class:`MoneyHooks` is registered.

    The face hands in what it owns: which items are cases (`items.CaseItem`) and which of them
    the conductor does not answer (`runtime.not_answered`), so this stage never imports it."""
    from pytest_evalloop.model_api.ratelimit import session_state_dir
    from pytest_evalloop.stash import SETTINGS_KEY

    settings = config.stash[SETTINGS_KEY]
    if settings.max_cost is not None and not settings.estimate:
        runtime.spend = SpendCeiling(settings.max_cost, session_state_dir(session_id))
        runtime.reservation = Reservations(settings)
    if hasattr(config, "workerinput"):
        return
    problem = None if config.option.collectonly else ceiling_problem(settings)
    if problem and names_a_set and not settings.estimate:
        raise pytest.UsageError(problem)
    config.pluginmanager.register(MoneyHooks(settings, case_item, not_answered), "evalloop-money")


class Reservations:
    """What one attempt reserves, per pair of roles (the same for every attempt of a pair, so
    priced once): `attempt_bound` of the roles' backend, models and limits."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._known: dict[tuple[str, str, str, int], Bound] = {}

    def __call__(self, roles: Roles) -> Bound:
        answerer, judge = roles.answerer, roles.judge
        key = (answerer.backend, answerer.model, judge.model, id(answerer))
        if key not in self._known:
            self._known[key] = attempt_bound(
                self.settings,
                backend=answerer.backend,
                answerer_model=answerer.model,
                judge_model=judge.model,
                answerer=answerer,
            )
        return self._known[key]


class MoneyHooks:
    """The ceiling's header and the estimate's run-nothing loop and summary (controller)."""

    def __init__(
        self, settings: Settings, case_item: type[pytest.Item], not_answered: NotAnswered
    ) -> None:
        self.settings = settings
        self.case_item = case_item
        self.not_answered = not_answered
        self.lines: list[str] = []

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        """Under `--eval-max-cost`, what each attempt reserves before it starts (controller)."""
        if self.settings.max_cost is None or self.settings.estimate:
            return []
        return ceiling_header(self.settings)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """`--eval-estimate`: price the collected items (controller)."""
        if self.settings.estimate:
            items = [i for i in session.items if isinstance(i, self.case_item)]
            self.lines = estimate_lines(self.settings, items, self.not_answered)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        """`--eval-estimate`: run no item, so nothing is paid and the session ends 0 with the
        figure in its summary, no `Exit` banner (controller; the estimate refuses -n)."""
        if not self.settings.estimate:
            return None
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            return None  # pytest's own loop stops on the collection errors
        return True

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """The estimate, in its own section (controller)."""
        if not self.lines:
            return
        terminalreporter.write_sep("=", "evalloop: estimate")
        for line in self.lines:
            terminalreporter.write_line(line)


# --- what the selection is expected to cost ---------------------------------------------------


@dataclass(frozen=True)
class Design:
    """What is estimated: whose answers, judged how, under which design."""

    backend: str
    answerer_model: str
    judge_model: str
    selection: dict[str, Any]
    rejudge: bool
    batch: bool
    judge_samples: int


def design_of(settings: Settings, source: RunInfo | None) -> Design:
    """This session's design; a rejudge's answerer is its source run's (its answers)."""
    from pytest_evalloop.measure.comparable import DESIGN_KEYS
    from pytest_evalloop.session.selection import design

    chosen = design(settings)
    return Design(
        backend=(source.answerer or "?") if source else settings.answerer,
        answerer_model=source.answerer_model if source else settings.answerer_model,
        judge_model=settings.judge_model,
        selection={key: chosen.get(key) for key, _ in DESIGN_KEYS},
        rejudge=source is not None,
        batch=settings.judge_batch,
        judge_samples=settings.judge_samples,
    )


@dataclass(frozen=True)
class PerAttempt:
    """One attempt's expected cost, low and high (equal when measured), and where from."""

    answerer: tuple[float, float]
    judge: tuple[float, float]
    source: str

    @property
    def low(self) -> float:
        return self.answerer[0] + self.judge[0]

    @property
    def high(self) -> float:
        return self.answerer[1] + self.judge[1]


def comparable_basis(parent: Path, design: Design) -> PerAttempt | None:
    """The per-attempt cost of the newest complete run of this design that the comparability
    rule admits alone: same answerer backend and models, same design keys; for a paid answer,
    a run that answered (not a rejudge). None when there is none."""
    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.ledger.seal import verify
    from pytest_evalloop.measure import comparable

    found: list[tuple[str, int, PerAttempt]] = []
    for child in sorted(parent.iterdir()) if parent.is_dir() else []:
        try:
            info = ledger_reader.read_run_info(child)
        except (OSError, ValueError):
            continue
        if not _same_design(info, design):
            continue
        check = verify(child)
        facts = comparable.facts_from_info(info, check.broken if check.sealed else "unsealed")
        if comparable.alone(facts, ""):
            continue  # a stopped, narrowed, sharded or changed run priced another run
        per = _measured(info, design)
        if per is not None and info.finished:
            # `finished` is to the second: two runs closed within one second are told apart by
            # when their run.json was last written (the close's own write, then its seal).
            found.append((info.finished, _written_ns(child), per))
    return max(found, key=lambda entry: entry[:2])[2] if found else None


def _written_ns(run_dir: Path) -> int:
    try:
        return (run_dir / RUN_FILE).stat().st_mtime_ns
    except OSError:
        return 0


def _same_design(info: RunInfo, design: Design) -> bool:
    if (info.answerer, info.answerer_model, info.judge_model) != (
        design.backend,
        design.answerer_model,
        design.judge_model,
    ):
        return False
    if not design.rejudge and info.rejudge_of is not None:
        return False  # a rejudge paid no answerer: it cannot price an answer
    recorded = info.selection or {}
    return all(recorded.get(key) == value for key, value in design.selection.items())


def _measured(info: RunInfo, design: Design) -> PerAttempt | None:
    figures = info.cost_figures or {}
    per = {role: (figures.get(role) or {}).get("costPerCaseUsd") for role in ("answerer", "judge")}
    judge = per["judge"]
    if not isinstance(judge, int | float):
        return None
    # Priced online: a batched run paid half; this design pays half again only if batched.
    online = float(judge) / (_batch_factor() if _batched(info) else 1.0)
    judge_cost = online * (_batch_factor() if design.batch else 1.0)
    answer = 0.0
    if not design.rejudge:
        if not isinstance(per["answerer"], int | float):
            return None
        answer = float(per["answerer"])
    name = info.label or info.run_id
    return PerAttempt((answer, answer), (judge_cost, judge_cost), f"run {name}")


def _batched(info: RunInfo) -> bool:
    return bool((info.spend or {}).get("judgeBatch"))


# The token model: a typical attempt from token counts, as a range. An answer takes 2 to 8
# turns (at most --eval-max-turns); each turn adds a tool result and a reply to the
# conversation it resends. The judge reads its doctrine, the model's definitions and the case.
TURNS = (2, 8)
TOOLS_TOKENS = 600
"""The target's tool schemas and the question."""
TURN_GROWTH_TOKENS = 800
OUTPUT_PER_TURN = (100, 400)
CLI_PROMPT_TOKENS = (6_000, 20_000)
"""The claude CLI's own system prompt and tool preamble, besides ours."""
JUDGE_CASE_TOKENS = (500, 3_000)
JUDGE_OUTPUT = (50, 600)


def token_model(
    design: Design, prices: PriceTable, *, max_turns: int, definitions_tokens: int
) -> PerAttempt | None:
    """A typical attempt's cost from token counts alone: low (few turns, the shared prefix read
    from the cache) to high (many turns, every input token written to the cache). None when a
    model has no price."""
    from pytest_evalloop.answer.answerer import SYSTEM_PROMPT
    from pytest_evalloop.judge.judge import render_doctrine

    a_price, j_price = prices.price(design.answerer_model), prices.price(design.judge_model)
    if j_price is None or (a_price is None and not design.rejudge):
        return None
    answer = (0.0, 0.0)
    if not design.rejudge and a_price is not None:
        prefix = len(SYSTEM_PROMPT) // 4 + TOOLS_TOKENS
        cli = design.backend == "claude-code"
        costs = []
        for end, turns in enumerate((min(max_turns, TURNS[0]), min(max_turns, TURNS[1]))):
            shared = prefix + (CLI_PROMPT_TOKENS[end] if cli else 0)
            grown = TURN_GROWTH_TOKENS * turns * (turns - 1) // 2
            if end == 0:  # low: the shared prefix written once, then read
                usage = Usage(
                    input_tokens=grown,
                    cache_creation_tokens=shared,
                    cache_read_tokens=shared * (turns - 1),
                    output_tokens=OUTPUT_PER_TURN[0] * turns,
                )
            else:  # high: everything written to the cache, every turn
                usage = Usage(
                    cache_creation_tokens=shared * turns + grown,
                    output_tokens=OUTPUT_PER_TURN[1] * turns,
                )
            costs.append(_priced(prices, design.answerer_model, usage))
        # A range, whatever the prices: a price file may make a cache write cheaper than plain
        # input, and the "every token written" scenario then the cheaper one.
        answer = (min(costs), max(costs))
    doctrine = len(render_doctrine()) // 4
    factor = _batch_factor() if design.batch else 1.0
    low = Usage(
        cache_read_tokens=doctrine,
        input_tokens=JUDGE_CASE_TOKENS[0],
        output_tokens=JUDGE_OUTPUT[0],
    )
    high = Usage(
        cache_creation_tokens=doctrine + definitions_tokens + JUDGE_CASE_TOKENS[1],
        output_tokens=JUDGE_OUTPUT[1],
    )
    judge = tuple(
        _priced(prices, design.judge_model, usage) * design.judge_samples * factor
        for usage in (low, high)
    )
    span = f"{min(max_turns, TURNS[0])}-{min(max_turns, TURNS[1])} turns"
    what = "stored answers, judged only" if design.rejudge else f"answers of {span}"
    return PerAttempt(
        answer,
        (min(judge), max(judge)),
        f"the token model ({what}; low: the shared prompt read from the cache, high: every "
        "input token written to it), no complete comparable run",
    )


def _priced(prices: PriceTable, model: str, usage: Usage) -> float:
    return prices.cost(model, usage) or 0.0


def _money(low: float, high: float, digits: int) -> str:
    if abs(high - low) < 10**-digits:
        return f"${low:.{digits}f}"
    return f"${low:.{digits}f}-${high:.{digits}f}"


def estimate_lines(settings: Settings, items: list[Any], not_answered: NotAnswered) -> list[str]:
    """`--eval-estimate`: per set, the attempts this session would pay for, times the cost of
    one attempt of this design; then, under `--eval-max-cost`, what each attempt reserves."""
    from pytest_evalloop.session.runs import runs_dir_for

    prices = price_table(settings.prices)
    by_set: dict[Path, list[Any]] = {}
    for item in items:
        by_set.setdefault(item.set_dir, []).append(item)
    lines = []
    total_high = 0.0
    for set_dir, chosen in sorted(by_set.items()):
        parent = runs_dir_for(set_dir, settings.runs_dir)
        source = _rejudge_source(settings, set_dir, parent)
        design = design_of(settings, source[0] if source else None)
        paid, free = _paid(
            settings,
            chosen,
            source[1] if source else None,
            not_answered,
            _scored(settings, set_dir, parent),
        )
        per = comparable_basis(parent, design) or token_model(
            design,
            prices,
            max_turns=settings.max_turns,
            definitions_tokens=_definitions_tokens(set_dir, chosen),
        )
        name = set_dir.name
        if per is None:
            lines.append(
                f"evalloop estimate: {name}: {paid} attempt(s); cost unknown (a model has no "
                "price: add it with --eval-prices); nothing was paid"
            )
            continue
        total_high += paid * per.high
        roles = (
            f"answerer {_money(*per.answerer, 4)} + judge {_money(*per.judge, 4)} "
            f"({design.judge_samples} sample(s){', batched' if design.batch else ''})"
        )
        lines.append(
            f"evalloop estimate: {name}: {paid} attempt(s) x {_money(per.low, per.high, 4)} = "
            f"{_money(paid * per.low, paid * per.high, 2)}, from {per.source}: {roles} per "
            "attempt; nothing was paid"
        )
        if free:
            lines.append(
                f"evalloop estimate: {name}: {free} more item(s) cost nothing (scored already in "
                "the resumed run, or not answered or judged: a golden that cannot be scored, an "
                "answer the rejudged run does not hold)"
            )
    lines += _ceiling_lines(settings, total_high)
    return lines


def _ceiling_lines(settings: Settings, expected: float) -> list[str]:
    bound = attempt_bound(settings)
    total = bound.total
    if total is None:
        return []
    return [
        f"evalloop estimate: under --eval-max-cost, each attempt reserves up to ${total:.4f} "
        f"before it starts, its most ({bound.text()}); a ceiling of at least "
        f"${expected + total:.2f} lets every attempt start"
    ]


def _rejudge_source(settings: Settings, set_dir: Path, parent: Path) -> tuple[RunInfo, Any] | None:
    """A rejudge's source run (its run.json and its replay target), or None."""
    if not settings.rejudge_from:
        return None
    from pytest_evalloop.answer.replay import ReplayTarget
    from pytest_evalloop.measure.comparison import resolve_run

    try:
        source_dir = resolve_run(settings.rejudge_from, set_dir=set_dir, runs_dir=parent)
        target = ReplayTarget(source_dir)
    except (OSError, ValueError):
        return None  # refused before this, by the flag check
    return target.stored.info, target


def _scored(settings: Settings, set_dir: Path, parent: Path) -> Any:
    """Under `--eval-resume`, the run's scored attempts (never answered again), else None."""
    if not settings.resume:
        return None
    from pytest_evalloop.ledger.resume import ScoredAttempts
    from pytest_evalloop.measure.comparison import resolve_run

    try:
        return ScoredAttempts(resolve_run(settings.resume, set_dir=set_dir, runs_dir=parent))
    except (OSError, ValueError):
        return None  # refused before this, by the resume check


def _paid(
    settings: Settings,
    items: list[Any],
    target: Any,
    not_answered: NotAnswered,
    scored: Any = None,
) -> tuple[int, int]:
    """How many items this session pays for, and how many cost nothing: the conductor never
    answers them (`runtime.not_answered`), the judge is never called (a gated golden), or a
    resumed run scored them already."""
    from pytest_evalloop.goldens.preflight import golden_refusal

    paid = free = 0
    for item in items:
        if scored is not None and scored.get(item.case.qid, item.sample) is not None:
            free += 1
            continue
        skipped = not_answered(item, target, settings)
        gated = golden_refusal(item.case) is not None
        # A gated golden answered anyway pays its answer only; a rejudge of one pays nothing.
        if skipped is not None or (gated and settings.rejudge_from):
            free += 1
        else:
            paid += 1
    return paid, free


def _definitions_tokens(set_dir: Path, items: list[Any]) -> int:
    from pytest_evalloop.answer.materials import model_definitions

    try:
        first = items[0]
        return len(model_definitions(set_dir, first.set_config, first.case)) // 4
    except (IndexError, OSError, ValueError):
        return 0
