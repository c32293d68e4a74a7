"""The spend ceiling (`--eval-max-cost`, issue 31 point 4): one function admits attempts, and a
run it stops ends aborted and finishes under `--eval-resume`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.model_api.spend import GO, WAIT, SpendCeiling, admission
from pytest_evalloop.testing import FakeAnthropic
from tests.test_gate import QIDS, run, script


def test_the_first_attempt_runs_alone_until_its_cost_is_the_estimate() -> None:
    ceiling = SpendCeiling(1.0)
    assert ceiling.admit() == GO
    assert ceiling.admit() == WAIT  # no estimate yet: the first wave cannot overshoot unseen
    ceiling.settle(0.3)
    assert ceiling.admit() == GO  # 0.3 spent + (0 + 1) x 0.3 < 1
    assert ceiling.admit() == GO  # 0.3 + (1 + 1) x 0.3 = 0.9 < 1
    stop = ceiling.admit()  # 0.3 + 3 x 0.3 >= 1: spent plus the in-flight estimate reach it
    assert stop.startswith("spend ceiling --eval-max-cost=1 reached: $0.3000 spent, 2 attempt")
    assert "--eval-resume" in stop


def test_a_prior_estimate_admits_a_first_wave_that_fits() -> None:
    ceiling = SpendCeiling(1.0, prior=0.3)
    assert [ceiling.admit() for _ in range(3)] == [GO, GO, GO]  # 3 x 0.3 < 1
    assert ceiling.admit().startswith("spend ceiling")  # 4 x 0.3 >= 1


@given(
    ceiling=st.floats(0.01, 100),
    spent=st.floats(0, 200),
    in_flight=st.integers(0, 64),
    per=st.floats(0.0001, 10),
    settled=st.integers(1, 100),
)
def test_admission_never_lets_the_estimate_cross_the_ceiling(
    ceiling: float, spent: float, in_flight: int, per: float, settled: int
) -> None:
    decision = admission(ceiling, spent, in_flight, per, settled)
    if decision == GO:
        assert spent + (in_flight + 1) * per < ceiling
    else:
        assert decision.startswith("spend ceiling") and spent + (in_flight + 1) * per >= ceiling


@pytest.fixture
def shop(pytester: pytest.Pytester) -> Path:
    from tests.test_run import make_set

    return make_set(pytester.path, QIDS)


def test_the_ceiling_stops_new_attempts_and_the_resumed_run_finishes(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    fake.policy = script(shop, set()).policy()
    # One case's cost, measured against the same fake: the ceiling is set to 2.5 of them.
    probe = run(pytester, shop, "--eval-label=probe", "-k", QIDS[0])
    assert probe.ret == 0, probe.stdout.str()
    one = json.loads((shop / "runs" / "probe" / ledger.RUN_FILE).read_text())
    per_case = one["answererCostUsd"] + one["judgeCostUsd"]
    assert per_case > 0
    fake.reset()
    ceiling = 2.5 * per_case
    stopped = run(pytester, shop, "--eval-label=capped", f"--eval-max-cost={ceiling}")
    out = stopped.stdout.str()
    run_dir = shop / "runs" / "capped"
    info = ledger_reader.read_run_info(run_dir)
    assert info.status == "aborted", out
    assert (info.abort_reason or "").startswith("spend ceiling --eval-max-cost="), info
    scored = {qid for qid, _ in ledger_reader.read_run(run_dir).scores()}
    # Cases cost about the same: two fit under 2.5 of one, ten do not.
    assert 1 <= len(scored) < len(QIDS), scored
    spent = json.loads((run_dir / ledger.RUN_FILE).read_text())
    assert spent["answererCostUsd"] + spent["judgeCostUsd"] < ceiling + 2 * per_case
    assert "biased subset" in out, out
    # Resumed without a ceiling: the scored cases are not answered again, the rest are.
    calls = len(fake.calls("answerer"))
    done = run(pytester, shop, "--eval-resume=capped")
    assert done.ret == 0, done.stdout.str()
    assert ledger_reader.read_run_info(run_dir).status == "complete"
    assert {qid for qid, _ in ledger_reader.read_run(run_dir).scores()} == set(QIDS)
    answered = {r.question for r in fake.calls("answerer")[calls:]}
    assert len(answered) == len(QIDS) - len(scored)


def test_a_ceiling_that_is_not_positive_is_one_usage_error(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    refused = run(pytester, shop, "--eval-max-cost=0")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: --eval-max-cost=0.0 must be a positive amount of USD*"])
    assert fake.calls() == []


def test_estimate_prints_the_expected_cost_and_pays_nothing(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    fake.policy = script(shop, set()).policy()
    rough = run(pytester, shop, "--eval-estimate")
    assert rough.ret == 0, rough.stdout.str()
    assert fake.calls() == []  # nothing was paid
    rough.stdout.fnmatch_lines(
        [f"evalloop estimate: {len(QIDS)} attempt(s) x $* = $* (shop: rough, from token counts*"]
    )
    assert not (shop / "runs").exists() or not any((shop / "runs").iterdir())
    # After a whole run, the estimate is that run's cost per attempt times the selection.
    assert run(pytester, shop, "--eval-label=first").ret == 0
    info = json.loads((shop / "runs" / "first" / ledger.RUN_FILE).read_text())
    per = sum(info["costFigures"][r]["costPerCaseUsd"] for r in ("answerer", "judge"))
    calls = len(fake.calls())
    known = run(pytester, shop, "--eval-estimate")
    assert len(fake.calls()) == calls
    known.stdout.fnmatch_lines(
        [
            f"evalloop estimate: {len(QIDS)} attempt(s) x ${per:.4f} = ${len(QIDS) * per:.2f} "
            "(shop: per attempt of run first); nothing was paid"
        ]
    )


def test_estimate_under_xdist_is_one_usage_error_not_a_paid_run(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    refused = run(pytester, shop, "--eval-estimate", "-n", "2")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: --eval-estimate runs in one process; drop -n"])
    assert fake.calls() == []
