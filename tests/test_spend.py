"""The spend ceiling (`--eval-max-cost`, issue 45): a reservation, not a report.

The rule (`model_api.spend`): an attempt reserves the most it can cost before it starts, starts
only when that fits, and releases what it did not spend. So the spend can never pass the
ceiling: checked here as properties of the pure rule (any sequence of steps, any usage a bound
admits), of the shared count (several processes), and of whole runs on the fake endpoint (any
ceiling, any worker count), the money counted from the fake's own request log.
"""

from __future__ import annotations

import json
import multiprocessing
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure.gate import EXIT_RUN_UNFINISHED
from pytest_evalloop.model_api.pricing import Price, PriceTable, Usage
from pytest_evalloop.model_api.spend import (
    GO,
    NANO,
    STOP,
    WAIT,
    RoleBound,
    SpendCeiling,
    SpendState,
    admit,
    release,
    role_bound,
)
from pytest_evalloop.testing import FakeAnthropic
from pytest_evalloop.testing.fake_anthropic import BATCHES_PATH
from tests.test_gate import QIDS, first_five_fail, run, script

__all__ = ["first_five_fail"]  # a module-scoped fixture shared with test_gate

# --- the rule, pure ---------------------------------------------------------------------------


def test_a_step_starts_only_when_its_most_fits_and_waits_for_holds_to_come_back() -> None:
    state = SpendState()
    state, first = admit(state, 100, 40, "1:1")
    state, second = admit(state, 100, 40, "1:2")
    assert (first.kind, second.kind) == (GO, GO)
    state, third = admit(state, 100, 40, "1:3")
    assert third.kind == WAIT  # 0 spent + 80 held + 40 > 100, but 0 + 40 fits once released
    state = release(state, "1:1", 10)  # it spent 10 of its 40: 30 come back
    state, third = admit(state, 100, 40, "1:3")
    assert third.kind == GO and state.spent == 10 and state.holding == 80
    state = release(state, "1:2", 35)
    state = release(state, "1:3", 30)
    state, fourth = admit(state, 100, 40, "1:4")
    assert fourth.kind == STOP  # 75 spent + 40 > 100: it can never fit
    assert fourth.reason is not None
    assert fourth.reason.startswith("stopped before the ceiling: $0.0000 of $0.0000")
    state, fifth = admit(state, 100, 1, "1:5")
    assert fifth.kind == STOP and fifth.reason == fourth.reason  # a stop is final


def test_an_unknown_cost_and_a_dead_holder_count_the_whole_hold() -> None:
    state, go = admit(SpendState(), 100, 30, "1:1")
    state = release(state, "1:1", None)
    assert state.spent == 30 and state.unknown == 1
    state, go = admit(state, 100, 30, "7:1")
    state, later = admit(state, 100, 30, "1:2", alive=lambda key: not key.startswith("7:"))
    # The dead process's 30 may have been spent: counted, never silently freed.
    assert later.kind == GO and state.spent == 60 and "7:1" not in state.held
    assert release(state, "7:1", 0) == state  # its late release changes nothing


def test_a_step_that_cannot_be_priced_stops_the_session() -> None:
    state, stop = admit(SpendState(), 100, None, "1:1", what="no price for my-model")
    assert stop.kind == STOP and "no price for my-model" in (stop.reason or "")
    assert state.stopped == stop.reason


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[int, float]]:
    """Steps of a session: each a hold and the share of it really spent (None: unknown)."""
    return draw(
        st.lists(
            st.tuples(st.integers(0, 2_000), st.one_of(st.none(), st.floats(0, 1))),
            max_size=40,
        )
    )


@given(ceiling=st.integers(0, 10_000), plan=steps(), order=st.randoms(use_true_random=False))
def test_any_interleaving_of_steps_never_spends_past_the_ceiling(
    ceiling: int, plan: list[tuple[int, float]], order: random.Random
) -> None:
    state = SpendState()
    running: list[tuple[str, int, float | None]] = []
    for n, (amount, share) in enumerate(plan):
        state, decided = admit(state, ceiling, amount, f"1:{n}")
        if decided.kind == GO:
            running.append((f"1:{n}", amount, share))
        if running and order.random() < 0.5:
            key, hold, part = running.pop(order.randrange(len(running)))
            state = release(state, key, None if part is None else int(hold * part))
        assert state.spent + state.holding <= ceiling
    for key, hold, part in running:
        state = release(state, key, None if part is None else int(hold * part))
    assert state.spent <= ceiling and state.holding == 0


# --- the bound, pure --------------------------------------------------------------------------

PRICE = Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)


@given(
    calls=st.lists(
        st.tuples(
            st.integers(0, 1_000), st.integers(0, 1_000), st.integers(0, 1_000), st.integers(0, 500)
        ),
        min_size=1,
        max_size=6,
    ),
    budget=st.one_of(st.none(), st.integers(0, 10_000)),
    factor=st.sampled_from([1.0, 0.5]),
)
def test_no_usage_a_bound_admits_costs_more_than_the_bound(
    calls: list[tuple[int, int, int, int]], budget: int | None, factor: float
) -> None:
    prices = PriceTable({"m": PRICE})
    bound = RoleBound("answerer", "m", 6, 3_000, 500, total_tokens=budget, price_factor=factor)
    usage = Usage()
    used = 0
    for plain, read, written, out in calls:
        if plain + read + written > bound.input_tokens:
            continue  # the API refuses a longer prompt: never billed
        if budget is not None and used + plain + read + written + out > budget:
            break
        usage.add(
            Usage(
                input_tokens=plain,
                cache_read_tokens=read,
                cache_creation_tokens=written,
                output_tokens=out,
                calls=1,
            )
        )
        used += plain + read + written + out
    cost = (prices.cost("m", usage) or 0.0) * factor
    most = role_bound(bound, prices)
    assert most is not None and cost <= most + 1e-12


def test_the_bound_spends_a_budget_on_the_dearest_tokens_first() -> None:
    prices = PriceTable({"m": PRICE})
    # 2 calls x (1,000 in + 100 out), within 500 tokens: 200 out at $15, 300 in at $3.75.
    bound = RoleBound("judge", "m", 2, 1_000, 100, total_tokens=500)
    assert role_bound(bound, prices) == pytest.approx((200 * 15 + 300 * 3.75) / 1e6)
    assert role_bound(RoleBound("judge", "unknown", 1, 1, 1), prices) is None
    assert role_bound(RoleBound("answerer", "unknown", 0, 0, 0), prices) == 0.0


# --- the shared count: several processes ------------------------------------------------------


def _worker(state_dir: str, ceiling: float, seed: int, out: Any) -> None:
    rng = random.Random(seed)
    ceiling_count = SpendCeiling(ceiling, Path(state_dir))
    started = 0
    for _ in range(60):
        amount = rng.uniform(0.001, ceiling / 3)
        admission = ceiling_count.reserve(amount)
        if admission.kind == STOP:
            break
        if admission.kind == GO:
            started += 1
            ceiling_count.settle(admission, rng.choice([None, amount * rng.random()]))
    out.put(started)


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_sharing_one_count_never_pass_the_ceiling(tmp_path: Path, processes: int) -> None:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    workers = [
        ctx.Process(target=_worker, args=(str(tmp_path), 1.0, seed, queue))
        for seed in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    started = sum(queue.get(timeout=10) for _ in workers)
    state = SpendCeiling(1.0, tmp_path).state()
    assert started == state.steps > 0
    assert state.spent <= NANO and state.holding == 0
    assert json.loads((tmp_path / "spend.json").read_text())["ceiling"] == NANO


# --- whole runs on the fake -------------------------------------------------------------------

LONG = "word " * 3_000  # ~3,750 tokens of the fake's count: each turn nearly fills max_tokens
TINY = {"input": 1.0, "output": 5.0, "cache_read": 0.1, "cache_write": 1.25}
WINDOWS = {"tiny": 16_000, "tiny-judge": 12_000}
GREEDY_OPTIONS = (
    "--eval-answerer-model=tiny",
    "--eval-judge-model=tiny-judge",
    "--eval-max-turns=3",
    "--eval-max-tokens=40000",
)


@pytest.fixture
def shop(pytester: pytest.Pytester) -> Path:
    from tests.test_run import make_set

    return make_set(pytester.path, QIDS)


def greedy(fake: FakeAnthropic, shop: Path, pytester: pytest.Pytester) -> Path:
    """Answers and judgings that spend as much of their bound as the fake lets them: long
    replies up to max_tokens every turn, a judge that never writes a verdict (three calls),
    models with small context windows the fake holds. Returns the price file."""
    spec = script(shop, set()).model_dump()
    spec["answerer"]["default"] = [
        [{"text": LONG}, {"tool": "get_context", "input": {"query": "{question}"}}],
        [{"text": LONG}, {"tool": "execute_query", "input": {"sql": "{modelQuery}"}}],
        {"text": LONG + "\n\nFinal query:\n```sql\n{modelQuery}\n```"},
    ]
    spec["judge"] = {"default": {"text": "no verdict " * 2_000}}
    from pytest_evalloop.testing import ScriptSpec

    fake.policy = ScriptSpec.model_validate(spec).policy()
    fake.context_windows = dict(WINDOWS)
    prices = pytester.path / "prices.json"
    prices.write_text(json.dumps({model: {**TINY, "context": n} for model, n in WINDOWS.items()}))
    return prices


def billed(fake: FakeAnthropic, prices: PriceTable) -> float:
    """What the fake endpoint served, at the price table: the money, counted by the seller."""
    total = 0.0
    for request in fake.requests:
        if request.status != 200 or request.input_tokens is None or request.model is None:
            continue
        usage = Usage(
            input_tokens=request.input_tokens,
            output_tokens=request.output_tokens or 0,
            cache_read_tokens=request.cache_read_input_tokens or 0,
            cache_creation_tokens=request.cache_creation_input_tokens or 0,
        )
        factor = 0.5 if request.path.startswith(BATCHES_PATH) else 1.0
        total += (prices.cost(request.model, usage) or 0.0) * factor
    return total


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(share=st.floats(0.3, 4.0), workers=st.sampled_from([0, 1, 2, 3]))
def test_any_ceiling_under_any_worker_count_is_never_passed(
    pytester: pytest.Pytester, fake: FakeAnthropic, share: float, workers: int
) -> None:
    from tests.test_run import make_set

    root = pytester.mkdir(f"h{len(list(pytester.path.iterdir()))}")
    shop = make_set(root, QIDS)
    prices_file = greedy(fake, shop, pytester)
    fake.reset()
    prices = PriceTable.from_file(prices_file)
    probe = run(pytester, shop, *GREEDY_OPTIONS, f"--eval-prices={prices_file}", "--eval-estimate")
    reserved = _reserved(probe.stdout.str())
    # The estimate prints the reservation to 4 decimals: from share 1 up, the ceiling clears the
    # printed figure's rounding, so "the first attempt fits" holds whatever the 5th decimal was.
    ceiling = round((reserved + (0.0001 if share >= 1 else 0.0)) * share, 6)
    xdist = ["-n", str(workers)] if workers else []
    done = run(
        pytester,
        shop,
        *GREEDY_OPTIONS,
        f"--eval-prices={prices_file}",
        f"--eval-max-cost={ceiling}",
        "--eval-concurrency=4",
        *xdist,
    )
    out = done.stdout.str()
    spent = billed(fake, prices)
    assert spent <= ceiling, out
    [run_dir] = [p for p in (shop / "runs").iterdir() if (p / ledger.RUN_FILE).is_file()]
    info = ledger_reader.read_run_info(run_dir)
    counted = (info.spend or {}).get("spentUsd")
    # The harness's own count is never below what the seller billed, and never past the ceiling.
    assert counted is not None and spent - 1e-9 <= counted <= ceiling, (spent, counted, out)
    if share < 1:
        assert fake.calls() == [] and info.status == "aborted", out  # not one attempt fits
    else:
        assert counted > 0 and fake.calls("judge"), out  # the first attempt fits: it ran
    if info.status == "aborted":
        assert done.ret == EXIT_RUN_UNFINISHED, out
        assert "stopped before the ceiling: $" in out


def _reserved(estimate: str) -> float:
    import re

    found = re.search(r"each attempt reserves up to \$([0-9.]+)", estimate)
    assert found, estimate
    return float(found.group(1))


def test_the_ceiling_stops_new_attempts_and_the_resumed_run_finishes(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    prices_file = greedy(fake, shop, pytester)
    common = (*GREEDY_OPTIONS, f"--eval-prices={prices_file}")
    reserved = _reserved(run(pytester, shop, *common, "--eval-estimate").stdout.str())
    # Room for the first attempt's reservation and two more attempts' spend, not for ten.
    ceiling = round(reserved * 1.9, 6)
    stopped = run(pytester, shop, *common, "--eval-label=capped", f"--eval-max-cost={ceiling}")
    out = stopped.stdout.str()
    run_dir = shop / "runs" / "capped"
    info = ledger_reader.read_run_info(run_dir)
    assert stopped.ret == EXIT_RUN_UNFINISHED, out
    assert info.status == "aborted", out
    assert (info.abort_reason or "").startswith("stopped before the ceiling: $"), info
    scored = {qid for qid, _ in ledger_reader.read_run(run_dir).scores()}
    assert 1 <= len(scored) < len(QIDS), scored
    spend = info.spend or {}
    assert spend["stopped"] is True and spend["ceilingUsd"] == ceiling
    assert spend["spentUsd"] <= ceiling
    assert f"stopped before the ceiling: ${spend['spentUsd']:.4f} of ${ceiling:.4f}" in out
    assert "NOT FINISHED: the run is aborted, so the session exits 8" in out
    # The runs index shows it aborted, and why it is no baseline.
    index = (shop / "runs" / "index.html").read_text(encoding="utf-8")
    assert "aborted" in index and "not comparable: finished" in index
    # Resumed without a ceiling: the scored cases are not answered again, the rest are.
    calls = len(fake.calls("answerer"))
    # The greedy judge's replies spend all they may and decide nothing (needs_human): that the
    # run measured nothing (exit 15) is not what this test is about.
    done = run(pytester, shop, *common, "--eval-resume=capped", "--eval-allow-unmeasured")
    assert done.ret == 0, done.stdout.str()
    assert ledger_reader.read_run_info(run_dir).status == "complete"
    assert {qid for qid, _ in ledger_reader.read_run(run_dir).scores()} == set(QIDS)
    answered = {r.question for r in fake.calls("answerer")[calls:]}
    assert len(answered) == len(QIDS) - len(scored)


def test_an_aborted_run_exits_8_unless_allowed_and_the_header_says_what_is_reserved(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    fake.policy = script(shop, set()).policy()
    # The defaults reserve ~$6.91 an attempt (16 turns of sonnet, 3 opus judge calls).
    stopped = run(pytester, shop, "--eval-max-cost=0.10", "--eval-label=a")
    out = stopped.stdout.str()
    assert stopped.ret == EXIT_RUN_UNFINISHED, out
    assert fake.calls() == []  # not one attempt fits: nothing was paid
    assert "stopped before the ceiling: $0.0000 of $0.1000" in out
    assert "--eval-max-cost=0.1: each attempt reserves up to $6.9062 before it starts" in out
    allowed = run(pytester, shop, "--eval-max-cost=0.10", "--eval-label=b", "--eval-allow-aborted")
    assert allowed.ret == 0, allowed.stdout.str()  # the old behaviour, asked for
    assert ledger_reader.read_run_info(shop / "runs" / "b").status == "aborted"


def test_a_ceiling_no_price_can_hold_is_one_usage_error(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    refused = run(pytester, shop, "--eval-max-cost=5", "--eval-judge-model=claude-opus-4-7")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(
        ["ERROR: --eval-max-cost=5 cannot hold: no price for claude-opus-4-7*--eval-prices"]
    )
    assert fake.calls() == []


@pytest.mark.parametrize("value", ["0", "inf", "nan", "-1"])
def test_a_ceiling_that_is_not_a_positive_amount_is_one_usage_error(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path, value: str
) -> None:
    refused = run(pytester, shop, f"--eval-max-cost={value}")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: --eval-max-cost=* must be a positive amount of USD*"])
    assert fake.calls() == []


def test_a_gated_run_that_stops_before_the_ceiling_exits_8_not_the_gates_code(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path, first_five_fail: Path
) -> None:
    import shutil

    shutil.copytree(first_five_fail, shop / "runs" / "base")
    fake.policy = script(shop, set()).policy()
    gated = run(pytester, shop, "--baseline=base", "--eval-gate=bar", "--eval-max-cost=0.1")
    out = gated.stdout.str()
    assert gated.ret == EXIT_RUN_UNFINISHED, out
    assert "gate bar: REFUSED" in out and "stopped before the ceiling: $0.0000 of $0.1000" in out


@pytest.mark.parametrize(
    ("base_url", "host"),
    [
        (None, None),
        ("https://api.anthropic.com", None),
        ("https://api.anthropic.com/", None),
        ("http://127.0.0.1:8080/v1", "127.0.0.1:8080"),
        ("https://user:s3cret@gateway.example.com", "gateway.example.com"),
        ("not a url", None),
    ],
)
def test_the_endpoint_a_cost_line_names_is_its_host_never_a_credential(
    base_url: str | None, host: str | None
) -> None:
    from pytest_evalloop.model_api.endpoint import endpoint_host, list_price_note

    environ = {} if base_url is None else {"ANTHROPIC_BASE_URL": base_url}
    assert endpoint_host(environ) == host
    note = list_price_note(endpoint_host(environ))
    assert "s3cret" not in note and "user" not in note
    assert note == ("" if host is None else f" (priced at list; endpoint: {host})")


def test_cost_lines_say_the_prices_are_list_prices_off_anthropic(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    fake.policy = script(shop, set()).policy()
    done = run(pytester, shop, "-k", QIDS[0], "--eval-label=one")
    out = done.stdout.str()
    host = fake.base_url.removeprefix("http://")
    note = f"(priced at list; endpoint: {host})"
    cost_lines = [line for line in out.splitlines() if "cost" in line and "$" in line]
    assert cost_lines and all(note in line for line in cost_lines), out
    info = ledger_reader.read_run_info(shop / "runs" / "one")
    assert (info.spend or {}).get("endpoint") == host
    summary = (shop / "runs" / "one" / "report.html").read_text(encoding="utf-8")
    assert note in summary


def test_the_rule_as_an_api_in_the_docs_runs() -> None:
    import re

    from tests.conftest import REPO

    page = (REPO / "docs" / "spend.md").read_text(encoding="utf-8")
    [code] = re.findall(r"```python\n(.*?)```", page, re.S)
    exec(compile(code, "docs/spend.md", "exec"), {})  # noqa: S102 - our own documented example
