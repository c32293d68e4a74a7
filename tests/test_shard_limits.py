"""One API key, many machines: each shard's share of the limits, and the API's own rate-limit
headers, keep N shards under one key's limit with no coordinator."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.model_api.ratelimit import RunLimiter, headroom_wait, share
from pytest_evalloop.testing import FakeAnthropic
from pytest_evalloop.testing.messages_api import RequestLimit
from tests.conftest import SECRET
from tests.test_merge import QUESTION, pytest_cmd, run_all, script

# --- the pure parts -----------------------------------------------------------------------------


def test_a_shard_takes_its_share_of_a_limit_rounded_down() -> None:
    assert [share(900, n) for n in (1, 2, 3, 7)] == [900, 450, 300, 128]
    assert share(0, 3) == 0  # unlimited stays unlimited
    assert share(2, 3) == 1  # never below one request a minute


def _headers(**values: str) -> dict[str, str]:
    return {f"anthropic-ratelimit-{k.replace('_', '-')}": v for k, v in values.items()}


def test_headers_say_wait_once_a_budget_is_at_its_low_water_mark() -> None:
    now = 1_000.0
    # 600 rpm, nothing left: two requests' worth of refill (back above the one-request mark).
    assert headroom_wait(
        _headers(requests_limit="600", requests_remaining="0"), now
    ) == pytest.approx(0.2)
    assert headroom_wait(_headers(requests_limit="600", requests_remaining="5"), now) == 0.0
    # Never past the reset the API named.
    soon = _headers(
        requests_limit="600", requests_remaining="0", requests_reset="1970-01-01T00:16:40.05Z"
    )
    assert headroom_wait(soon, now) == pytest.approx(0.05)
    # Tokens: at or under 1 % of the limit left.
    tokens = _headers(tokens_limit="10000", tokens_remaining="50")
    assert headroom_wait(tokens, now) == pytest.approx((100 + 1 - 50) * 60 / 10000)
    assert headroom_wait(_headers(tokens_limit="10000", tokens_remaining="5000"), now) == 0.0
    assert headroom_wait({}, now) == 0.0
    assert headroom_wait(_headers(requests_limit="x", requests_remaining="0"), now) == 0.0


def test_the_fake_key_refuses_over_its_limit_and_says_what_is_left() -> None:
    clock = [0.0]
    limit = RequestLimit(120, burst_seconds=1.0, clock=lambda: clock[0])
    assert limit.capacity == 2.0
    first, second, third = limit.take(), limit.take(), limit.take()
    assert [first[0], second[0], third[0]] == [True, True, False]
    assert first[1]["anthropic-ratelimit-requests-remaining"] == "1"
    assert third[1]["retry-after"] == "1"
    clock[0] = 0.5  # one request's refill at 2 a second
    assert limit.take()[0] is True
    assert [status for _, status in limit.log] == [200, 200, 429, 200]


def test_a_reply_with_the_budget_spent_pauses_the_limiter(tmp_path: Path) -> None:
    import anthropic

    from pytest_evalloop.answer.backends import sdk_http_client

    # A key whose bucket holds one request: the first reply says none is left.
    with FakeAnthropic(rate_limit=RequestLimit(60, burst_seconds=1.0)) as fake:
        limiter = RunLimiter(tmp_path, rpm=0, tpm=0)

        async def ask() -> None:
            client = anthropic.AsyncAnthropic(
                api_key="sk-test",
                base_url=fake.base_url,
                max_retries=0,
                http_client=sdk_http_client(limiter),
            )
            try:
                await client.messages.create(
                    model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
                )
            finally:
                await client.close()

        asyncio.run(ask())
    stats = limiter.stats()
    assert stats["headerPauses"] == 1 and stats["pauses"] == 0
    # Two requests' refill at 1 a second is 2 s, but the reset the API named (full again in 1 s
    # from its reply) comes first.
    assert 0 < stats["headerPausedSeconds"] <= 1.0
    assert limiter.paused_until() > 0


# --- three shards, one key ----------------------------------------------------------------------

RPM = 900


def test_three_shards_on_one_key_hold_its_limit(tmp_path: Path) -> None:
    """Three shard processes, each on its own machine's limiter (separate runs dirs, no shared
    file), against one fake key enforcing RPM: 0 or near-0 429s, the rate held within 5 %."""
    limit = RequestLimit(RPM)
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_RUN_ID", "CI_PIPELINE_ID")}
    with FakeAnthropic(script(set()), rate_limit=limit) as fake:
        env = {**env, **fake.env(SECRET), "PYTHONPATH": os.pathsep.join(sys.path)}
        cmds = [
            pytest_cmd(
                tmp_path / f"shard{i}",
                f"shard-{i}",
                f"--eval-shard={i}/3",
                "--eval-run-group=limits",
                f"--eval-rpm={RPM}",
            )
            for i in (1, 2, 3)
        ]
        done = run_all(cmds, env, tmp_path)
    for proc in done:
        assert proc.returncode == 0, proc.stdout
    arrivals = sorted(t for t, _ in limit.log)
    refused = sum(1 for _, status in limit.log if status == 429)
    span = arrivals[-1] - arrivals[0]
    rate = (len(arrivals) - 1) / span * 60.0
    parts = [ledger_reader.read_run_info(tmp_path / f"shard{i}" / f"shard-{i}") for i in (1, 2, 3)]
    figures = {
        "requests": len(arrivals),
        "refused_429": refused,
        "seconds": round(span, 2),
        "rpm_held": round(rate, 1),
        "limit": RPM,
        "header_pauses": sum((p.limiter or {}).get("headerPauses", 0) for p in parts),
    }
    (tmp_path / "figures.json").write_text(json.dumps(figures), encoding="utf-8")
    print("three-shard limit figures:", json.dumps(figures))
    assert all((p.shard or {})["rpm"] == RPM // 3 for p in parts)
    assert all((p.limiter or {})["rpm"] == RPM // 3 for p in parts)
    assert len(arrivals) >= 4 * len(QUESTION)  # three answerer turns and a judge per case
    assert refused <= 2, figures
    assert rate <= RPM * 1.05, figures
