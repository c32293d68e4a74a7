"""`--eval-estimate` prices the run it will be (issue 45): this design's answerer, judge samples,
rejudge (answerer free) and batch (half judge), from a complete run of the same backend, models
and design, else from the token model with its range stated; no key needed, exit 0, no banner.

`test_the_estimate_is_the_run_it_will_be` runs each design twice on the fake against one runs
directory that fills up as it goes (so each estimate has other designs' runs to wrongly pick):
the first run is the basis, the estimate made before the second must be within `TOLERANCE` of
what the second cost. The fake's prompt cache is emptied before every run, as runs more than a
cache lifetime apart find it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.testing import FakeAnthropic
from pytest_evalloop.testing.fake_claude import install_fake_claude
from tests.test_gate import QIDS, run, script

TOLERANCE = 0.10
"""How far an estimate from a comparable run may be from what the run then cost (relative)."""

DESIGNS: dict[str, tuple[str, ...]] = {
    "samples 1 / judge samples 1": (),
    "samples 3": ("--eval-samples=3",),
    "judge samples 3": ("--eval-judge-samples=3",),
    "rejudge": ("--eval-rejudge-from=src",),
    "batch rejudge": ("--eval-rejudge-from=src", "--eval-judge-batch"),
}
"""The Messages API designs, on the ten-case set. The claude-code design has its own test on
three cases: each of its attempts starts the CLI and its own MCP server (two cold processes)."""
CC_QIDS = QIDS[:3]
"""The claude-code design's set (`claude_on_path`'s policy reads the ten-case set's rows)."""
FIGURE = re.compile(
    r"evalloop estimate: shop: (\d+) attempt\(s\) x \$([0-9.]+)(?:-\$([0-9.]+))? = .*?, "
    r"from (.*?): answerer"
)


def estimate(pytester: pytest.Pytester, shop: Path, *args: str) -> tuple[int, float, float, str]:
    """Attempts, per-attempt cost low and high, and the basis the estimate printed."""
    done = run(pytester, shop, "--eval-estimate", *args)
    out = done.stdout.str()
    assert done.ret == 0, out
    assert "Exit" not in out and "!!!" not in out, out  # no pytest Exit banner
    found = FIGURE.search(out)
    assert found, out
    low = float(found.group(2))
    high = float(found.group(3) or low)
    return int(found.group(1)), low, high, found.group(4)


def cost_of(run_dir: Path) -> float:
    info = ledger_reader.read_run_info(run_dir)
    assert info.status == "complete", info
    return (info.answerer_cost_usd or 0.0) + (info.judge_cost_usd or 0.0)


@pytest.fixture
def claude_on_path(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, shop: Path) -> None:
    policy = pytester.path / "claude-policy.json"
    oracle = [
        [{"tool": "get_context", "input": {"query": "{question}"}}],
        [{"tool": "execute_query", "input": {"sql": "{modelQuery}"}}],
        {"text": "Here it is.\n\nFinal query:\n```sql\n{modelQuery}\n```"},
    ]
    policy.write_text(json.dumps({"cases_file": str(shop / "cases.jsonl"), "default": oracle}))
    bin_dir = install_fake_claude(pytester.path / "bin", policy).parent
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def shop(pytester: pytest.Pytester) -> Path:
    from tests.test_run import make_set

    return make_set(pytester.path, QIDS)


def test_the_estimate_is_the_run_it_will_be(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    fake.policy = script(shop, set()).policy()
    empty = pytester.mkdir("no-runs")
    table = [
        "| design | attempts | token model | estimate | actual | off |",
        "|---|---|---|---|---|---|",
    ]
    seconds: dict[str, str] = {}
    for name, options in DESIGNS.items():
        source = [f"--eval-rejudge-from={shop / 'runs' / 'src'}"] if "rejudge" in name else []
        rest = [o for o in options if not o.startswith("--eval-rejudge-from")]
        # With no run of this design to go by: the token model's range.
        _, low, high, basis = estimate(pytester, shop, f"--eval-runs-dir={empty}", *source, *rest)
        assert basis.startswith("the token model"), basis
        label = "src" if name.startswith("samples 1") else f"first-{len(table)}"
        fake.cache.clear()
        first = run(pytester, shop, f"--eval-label={label}", *options)
        assert first.ret == 0, first.stdout.str()
        attempts, per, same, basis = estimate(pytester, shop, *options)
        assert per == same and basis == f"run {label}", (name, basis)
        if name == "batch rejudge":
            # The online rejudge's judge cost halved: the same figure as this batched run's.
            online = estimate(pytester, shop, *options[:1])[1]
            assert abs(online / 2 - per) <= 0.0001, (online, per)
        fake.cache.clear()
        seconds[name] = f"second-{len(table)}"
        second = run(pytester, shop, f"--eval-label={seconds[name]}", *options)
        assert second.ret == 0, second.stdout.str()
        actual = cost_of(shop / "runs" / seconds[name])
        expected = attempts * per
        off = (expected - actual) / actual
        table.append(
            f"| {name} | {attempts} | ${attempts * low:.4f}-${attempts * high:.4f} | "
            f"${expected:.4f} | ${actual:.4f} | {off:+.1%} |"
        )
        assert abs(off) <= TOLERANCE, table[-1]
        assert attempts * low <= actual <= attempts * high, table[-1]
    print("\n".join(table))
    # With every design's runs in the directory, each design is still priced from its own
    # (an online rejudge from the newer batched one too: its judge cost, doubled).
    seconds["rejudge"] = seconds["batch rejudge"]
    for name, options in DESIGNS.items():
        assert estimate(pytester, shop, *options)[3] == f"run {seconds[name]}", name


def test_a_claude_code_run_is_estimated_from_a_claude_code_run(
    pytester: pytest.Pytester, fake: FakeAnthropic, claude_on_path: None
) -> None:
    from tests.test_run import make_set

    shop = make_set(pytester.path / "small", CC_QIDS)
    fake.policy = script(shop, set()).policy()
    design = "--eval-answerer=claude-code"
    assert estimate(pytester, shop, design)[3].startswith("the token model")
    # A Messages API run of the same set beside it is another design: never its basis.
    assert run(pytester, shop, "--eval-label=api").ret == 0
    assert estimate(pytester, shop, design)[3].startswith("the token model")
    fake.cache.clear()
    first = run(pytester, shop, "--eval-label=cc-first", design)
    assert first.ret == 0, first.stdout.str()
    attempts, per, same, basis = estimate(pytester, shop, design)
    assert per == same and basis == "run cc-first" and attempts == len(CC_QIDS), basis
    assert estimate(pytester, shop)[3] == "run api"
    fake.cache.clear()
    second = run(pytester, shop, "--eval-label=cc-second", design)
    assert second.ret == 0, second.stdout.str()
    actual = cost_of(shop / "runs" / "cc-second")
    # The fake CLI reports a fixed stand-in usage per turn: only the Messages API's usage is
    # the token model's to bracket, so only the figure from the run is held to what it cost.
    assert abs(attempts * per - actual) / actual <= TOLERANCE, (attempts * per, actual)


def test_the_estimate_needs_no_endpoint_and_pays_nothing(
    pytester: pytest.Pytester, shop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    done = run(pytester, shop, "--eval-estimate", "--eval-answerer=claude-code")
    out = done.stdout.str()
    assert done.ret == 0, out + done.stderr.str()
    assert f"evalloop estimate: shop: {len(QIDS)} attempt(s) x $" in out
    assert "nothing was paid" in out and "no tests ran" in out
    assert not (shop / "runs").exists()


def test_the_estimate_skips_runs_it_cannot_go_by(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    fake.policy = script(shop, set()).policy()
    # A narrowed run and an aborted one price other runs than this one.
    assert run(pytester, shop, "--eval-label=narrow", "-k", QIDS[0]).ret == 0
    aborted = run(pytester, shop, "--eval-label=stopped", "--eval-max-cost=0.01")
    assert aborted.ret != 0
    _, _, _, basis = estimate(pytester, shop)
    assert basis.startswith("the token model"), basis
    # Another backend or model is another run too.
    assert run(pytester, shop, "--eval-label=whole").ret == 0
    assert estimate(pytester, shop)[3] == "run whole"
    assert estimate(pytester, shop, "--eval-judge-model=claude-sonnet-4-6")[3].startswith(
        "the token model"
    )
    assert estimate(pytester, shop, "--eval-max-turns=4")[3].startswith("the token model")


def test_the_estimate_under_xdist_is_one_usage_error_not_a_paid_run(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    refused = run(pytester, shop, "--eval-estimate", "-n", "2")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: --eval-estimate runs in one process; drop -n"])
    assert fake.calls() == []


def test_a_resume_is_priced_for_what_it_will_answer(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    fake.policy = script(shop, set()).policy()
    assert run(pytester, shop, "--eval-label=whole").ret == 0
    stopped = run(pytester, shop, "--eval-label=part", "--eval-max-cost=7.0")
    assert stopped.ret != 0
    scored = len(ledger_reader.read_run(shop / "runs" / "part").scores())
    assert 1 <= scored < len(QIDS)
    attempts, per, _, basis = estimate(pytester, shop, "--eval-resume=part")
    assert (attempts, basis) == (len(QIDS) - scored, "run whole")
    done = run(pytester, shop, "--eval-estimate", "--eval-resume=part")
    assert f"{scored} more item(s) cost nothing (scored already in the resumed run" in (
        done.stdout.str()
    )


_PRICE = st.floats(min_value=0, max_value=1_000_000)


@settings(max_examples=200, deadline=None)
@given(
    prices=st.tuples(_PRICE, _PRICE, _PRICE, _PRICE),
    backend=st.sampled_from(["anthropic", "claude-code"]),
    max_turns=st.integers(1, 40),
)
def test_the_token_models_range_runs_low_to_high_whatever_the_prices(
    prices: tuple[float, float, float, float], backend: str, max_turns: int
) -> None:
    """A price file may make a cache write cheaper than plain input: the estimate read
    "$800.0086-$0.1039". Low is never above high, for any prices a price file may give."""
    from pytest_evalloop.model_api.pricing import Price, PriceTable
    from pytest_evalloop.session.estimate import Design, token_model

    price = Price(input=prices[0], output=prices[1], cache_read=prices[2], cache_write=prices[3])
    table = PriceTable({"m": price})
    design = Design(
        backend=backend,
        answerer_model="m",
        judge_model="m",
        selection={},
        rejudge=False,
        batch=False,
        judge_samples=1,
    )
    per = token_model(design, table, max_turns=max_turns, definitions_tokens=500)
    assert per is not None
    assert per.answerer[0] <= per.answerer[1] and per.judge[0] <= per.judge[1]
    assert per.low <= per.high
