"""Half-price rejudges through the Message Batches API (`--eval-judge-batch`, issue 31 point
5): the same verdicts as an online rejudge against the same scripted judge, half the judge's
cost, and a request that expires or errors is a harness error for its attempt, not a verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.testing import FakeAnthropic, FakeRequest
from pytest_evalloop.testing.fake_anthropic import BATCHES_PATH
from tests.test_gate import QIDS, questions, run, script

CASES = QIDS[:4]


@pytest.fixture
def shop(pytester: pytest.Pytester) -> Path:
    from tests.test_run import make_set

    return make_set(pytester.path, CASES)


def _verdicts(run_dir: Path) -> dict[str, tuple[str | None, str | None]]:
    scores = ledger_reader.read_run(run_dir).scores()
    return {qid: (s.verdict, s.reason) for (qid, _), s in scores.items()}


def test_a_batched_rejudge_gives_the_online_verdicts_at_half_the_judge_cost(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    failing = {CASES[1], CASES[3]}
    fake.policy = script(shop, failing).policy()
    assert run(pytester, shop, "--eval-label=base").ret in (0, 1)
    online = run(pytester, shop, "--eval-rejudge-from=base", "--eval-label=online")
    assert online.ret in (0, 1), online.stdout.str()
    judged_online = len(fake.calls("judge"))
    batched = run(
        pytester, shop, "--eval-rejudge-from=base", "--eval-label=batched", "--eval-judge-batch"
    )
    assert batched.ret in (0, 1), batched.stdout.str()
    # No online judge call: every one went through a batch.
    assert len(fake.calls("judge")) == judged_online
    in_batches = [r for r in fake.requests if r.path == BATCHES_PATH]
    assert len(in_batches) == len(CASES) and {r.role for r in in_batches} == {"judge"}
    runs = shop / "runs"
    assert _verdicts(runs / "batched") == _verdicts(runs / "online")
    assert {q for q, (v, _) in _verdicts(runs / "batched").items() if v == "no_match"} == failing
    cost = {
        label: json.loads((runs / label / "run.json").read_text())["judgeCostUsd"]
        for label in ("online", "batched")
    }
    # The fake's cache is warm for both (the doctrine was read by the base run's judge).
    assert cost["batched"] == pytest.approx(cost["online"] / 2, rel=0.05), cost


def test_an_expired_or_errored_batch_request_is_a_harness_error_not_a_verdict(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    fake.policy = script(shop, set()).policy()
    assert run(pytester, shop, "--eval-label=base").ret == 0
    asked = questions(shop)
    forced = {asked[CASES[0]]: "expired", asked[CASES[2]]: "errored"}

    def outcome(request: FakeRequest) -> str | None:
        return next((v for q, v in forced.items() if q in request.user_text), None)

    fake.batch_result = outcome
    done = run(
        pytester, shop, "--eval-rejudge-from=base", "--eval-label=batched", "--eval-judge-batch"
    )
    out = done.stdout.str()
    scores = _verdicts(shop / "runs" / "batched")
    assert {scores[q][0] for q in (CASES[1], CASES[3])} == {"match"}, out
    # Recorded as the harness's failure, never as a judged verdict.
    assert {scores.get(q, (None, None))[0] for q in (CASES[0], CASES[2])} <= {None, "harness_error"}
    assert "verdicts: 2 match, 2 harness_error" in out, out
    assert "request expired" in out and "request errored" in out, out
    assert "Traceback" not in out


def test_a_batched_judge_outside_a_rejudge_is_one_usage_error(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    refused = run(pytester, shop, "--eval-judge-batch")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: --eval-judge-batch needs --eval-rejudge-from*"])
    assert fake.requests == []
