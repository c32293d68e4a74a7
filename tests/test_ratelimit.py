"""The run's shared rate limit: bucket math, processes sharing one budget, pauses, the transport."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import looptime
import pytest

from pytest_evalloop.model_api.ratelimit import (
    Bucket,
    FileStore,
    LimiterState,
    Limits,
    RunLimiter,
    merge_stats,
    paused,
    plan,
    reserve,
    retry_after_seconds,
    settled,
    usage_tokens,
)
from tests.querygate import EVENT_CEILING_S

# --- the bucket math -------------------------------------------------------------------------


def test_reservations_at_one_instant_are_paced_at_the_rate() -> None:
    bucket = Bucket(1.0, 100.0)
    times = []
    for _ in range(5):
        bucket, at = reserve(bucket, 1.0, 100.0, rate=10.0, capacity=20.0)
        times.append(round(at - 100.0, 6))
    assert times == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert bucket.level == pytest.approx(-4.0)


def test_refill_stops_at_the_capacity_and_not_before_a_future_stamp() -> None:
    from pytest_evalloop.model_api.ratelimit import refill

    assert refill(Bucket(0.0, 0.0), 100.0, rate=10.0, capacity=20.0) == Bucket(20.0, 100.0)
    assert refill(Bucket(-3.0, 0.0), 0.2, rate=10.0, capacity=20.0).level == pytest.approx(-1.0)
    future = Bucket(1.0, 50.0)
    assert refill(future, 10.0, rate=10.0, capacity=20.0) == future


def test_a_cost_above_the_capacity_goes_when_full_and_leaves_a_debt() -> None:
    bucket, at = reserve(Bucket(2000.0, 0.0), 5000.0, 0.0, rate=1000.0, capacity=2000.0)
    assert at == 0.0
    assert bucket.level == -3000.0
    _, next_at = reserve(bucket, 100.0, 0.0, rate=1000.0, capacity=2000.0)
    assert next_at == pytest.approx(3.1)  # back to 100 tokens: 3100 refilled at 1000/s


def test_plan_takes_the_latest_of_requests_tokens_and_pause() -> None:
    limits = Limits(rpm=600, tpm=60_000)
    state = LimiterState(Bucket(1.0, 0.0), Bucket(0.0, 0.0), paused_until=0.0)
    state, grant = plan(state, limits, 0.0, tokens=500)
    assert grant.at == pytest.approx(0.5)  # 500 tokens at 1000/s; the request slot was free
    state = paused(state, 0.0, 2.0)
    _, grant = plan(state, limits, 0.1, tokens=0)
    assert grant.at == pytest.approx(2.0)
    assert grant.epoch == 1


def test_a_pause_resumes_one_request_at_a_time() -> None:
    limits = Limits(rpm=600)
    state = LimiterState.fresh(limits, 0.0)
    state = paused(state, 0.0, 1.0)
    slots = []
    for _ in range(3):
        state, grant = plan(state, limits, 0.2, tokens=0)
        slots.append(round(grant.at, 6))
    assert slots == [1.0, 1.1, 1.2]


def test_settling_gives_back_what_was_overestimated() -> None:
    limits = Limits(tpm=60_000)
    state = LimiterState(Bucket(1.0, 0.0), Bucket(-1000.0, 0.0))
    assert settled(state, limits, 0.0, correction=600).tokens.level == pytest.approx(-400.0)
    assert settled(state, limits, 0.0, correction=-500).tokens.level == pytest.approx(-1500.0)
    assert settled(state, Limits(), 0.0, correction=600) == state


def test_merge_stats_sums_counts_and_keeps_the_max() -> None:
    a = {"requests": 3, "waits": 1, "waitSeconds": 0.25, "maxWaitSeconds": 0.25, "rpm": 600}
    b = {"requests": 4, "waits": 2, "waitSeconds": 0.5, "maxWaitSeconds": 0.4, "rpm": 600}
    merged = merge_stats([a, None, b])
    assert merged == {
        "requests": 7,
        "waits": 3,
        "waitSeconds": 0.75,
        "maxWaitSeconds": 0.4,
        "rpm": 600,
    }
    assert merge_stats([None, {}]) is None


def test_retry_after_headers_and_usage() -> None:
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert retry_after_seconds({}) is None
    usage = {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 900}
    assert usage_tokens({"usage": {**usage, "cache_creation_input_tokens": 3}}) == 18
    assert usage_tokens({"type": "error"}) is None


def test_negative_limits_are_refused_with_the_option_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--eval-rpm"):
        RunLimiter(tmp_path, rpm=-1, tpm=0)


# --- one budget for several processes --------------------------------------------------------


def _acquire_many(state_dir: str, rpm: int, count: int, out: Any) -> None:
    async def main() -> list[float]:
        limiter = RunLimiter(Path(state_dir), rpm=rpm, tpm=0)
        stamps = []
        for _ in range(count):
            await limiter.acquire(0)
            stamps.append(time.time())
        return stamps

    out.put(asyncio.run(main()))


def _max_in_window(stamps: list[float], window: float) -> int:
    best, start = 0, 0
    for end, stamp in enumerate(stamps):
        while stamp - stamps[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best


def test_three_processes_share_one_600_rpm_budget(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context(
        "spawn"
    )  # no fork of a process whose other threads may hold locks
    out = ctx.Queue()
    procs = [ctx.Process(target=_acquire_many, args=(str(tmp_path), 600, 20, out)) for _ in "abc"]
    for proc in procs:
        proc.start()
    per_process = [out.get(timeout=30) for _ in procs]
    for proc in procs:
        proc.join(timeout=10)
    stamps = sorted(s for part in per_process for s in part)
    assert len(stamps) == 60
    # A cold budget lets one request go at once, then one every 0.1 s: 59 gaps of 0.1 s.
    span = stamps[-1] - stamps[0]
    assert 5.9 * 0.95 <= span <= 5.9 * 1.05, span
    # No process overshoots: any 1-s window holds at most 10 plus the bucket's small burst.
    burst = Limits(rpm=600).request_capacity
    assert _max_in_window(stamps, 1.0) <= 10 + burst
    # And pacing is smooth, not bursts and gaps: most requests are ~0.1 s after the previous.
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert sum(0.07 <= g <= 0.13 for g in gaps) >= 0.8 * len(gaps), gaps
    assert all(len(part) == 20 for part in per_process)


def _pause_now(state_dir: str, seconds: float, out: Any) -> None:
    limiter = RunLimiter(Path(state_dir), rpm=0, tpm=0)
    started = time.time()
    limiter.pause(seconds)
    out.put(started)


def test_a_pause_from_one_process_delays_the_next_acquire_of_another(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context(
        "spawn"
    )  # no fork of a process whose other threads may hold locks
    out = ctx.Queue()
    proc = ctx.Process(target=_pause_now, args=(str(tmp_path), 1.0, out))
    # This process's limiter runs on an event loop whose clock the test controls: its clock is
    # the wall clock when the loop was made (the other process's pause is stamped in wall time)
    # plus the loop's virtual time, which moves only when the loop sleeps, so the wait is exactly
    # what the pause leaves, on any machine. The loop itself starts at 0: looptime started at a
    # wall-clock-sized time (~1.8e9) can miss the timer it fast-forwards to and spin forever
    # (a few sleeps in a thousand, seen here), which is how this test once hung a CI run.
    loop = looptime.new_event_loop(start=0.0)
    epoch = time.time()

    def clock() -> float:
        return epoch + loop.time()

    limiter = RunLimiter(tmp_path, rpm=0, tpm=0, clock=clock)
    try:
        assert loop.run_until_complete(limiter.acquire(10)) == 0.0  # unpaused: no wait
        proc.start()
        paused_at = out.get(timeout=EVENT_CEILING_S)
        proc.join(timeout=EVENT_CEILING_S)
        asked_at = clock()
        waited = loop.run_until_complete(limiter.acquire(10))
        done = clock()
    finally:
        loop.close()
    until = paused_at + 1.0
    assert asked_at < until  # the pause was still running when this process asked
    assert done == pytest.approx(until, abs=0.01)  # it went when the pause ended, not before
    assert waited == pytest.approx(until - asked_at, abs=0.01)
    stats = limiter.stats()
    assert stats["requests"] == 2
    assert stats["waits"] == 1
    assert stats["pauses"] == 0  # the pause was the other process's
    assert stats["waitSeconds"] == pytest.approx(waited, abs=0.001)  # stats keep ms


def test_a_pause_requeues_reservations_made_before_it() -> None:
    loop = looptime.new_event_loop(start=1_000_000.0)
    limiter = RunLimiter(None, rpm=600, tpm=0, clock=loop.time)

    async def main() -> tuple[float, list[float]]:
        start = loop.time()
        tasks = [asyncio.ensure_future(_stamp(limiter, loop)) for _ in range(5)]
        await asyncio.sleep(0.05)  # virtual: every task has reserved its slot by now
        limiter.pause(0.5)
        return start, sorted(await asyncio.gather(*tasks))

    try:
        start, stamps = loop.run_until_complete(main())
    finally:
        loop.close()
    offsets = [round(s - start, 6) for s in stamps]
    assert offsets[0] == 0.0  # went before the pause
    # The four that had reserved slots at 0.1-0.4 s waited out the pause (until 0.55 s), then
    # went paced at 600 rpm: one every 0.1 s, not a burst.
    assert offsets[1] >= 0.55, offsets
    gaps = [round(b - a, 6) for a, b in zip(offsets[1:], offsets[2:], strict=False)]
    assert gaps == [0.1, 0.1, 0.1], offsets
    assert limiter.stats()["pauses"] == 1
    assert limiter.waiting == 0


async def _stamp(limiter: RunLimiter, loop: asyncio.AbstractEventLoop) -> float:
    await limiter.acquire(0)
    return loop.time()


def test_tokens_per_minute_and_settling(tmp_path: Path) -> None:
    limiter = RunLimiter(tmp_path, rpm=0, tpm=60_000)  # 1000 tokens/s, a 2000-token bucket

    async def main() -> list[float]:
        first = await limiter.acquire(2000)  # the full bucket: goes at once
        second = await limiter.acquire(1000)  # waits for 1000 tokens to refill: ~1 s
        limiter.settle(estimated=1000, actual=100)  # 900 given back
        third = await limiter.acquire(800)
        return [first, second, third]

    first, second, third = asyncio.run(main())
    assert first < 0.05
    assert 0.9 <= second <= 1.2
    assert third < 0.05
    stats = limiter.stats()
    assert stats["tokensEstimated"] == 3800
    assert stats["tokensSettled"] == 100
    assert stats["waits"] == 1
    assert stats["tpm"] == 60_000


def test_a_torn_state_file_starts_a_fresh_budget(tmp_path: Path) -> None:
    (tmp_path / "limiter.json").write_text('{"requests": {"lev')
    limiter = RunLimiter(tmp_path, rpm=600, tpm=0)
    assert asyncio.run(limiter.acquire(0)) < 0.05
    assert json.loads((tmp_path / "limiter.json").read_text())["epoch"] == 0


def test_peek_matches_a_locked_read_and_caches_only_an_unchanged_settled_file(
    tmp_path: Path,
) -> None:
    def fresh() -> LimiterState:
        return LimiterState.fresh(Limits(), 1000.0)

    reader, writer = FileStore(tmp_path, fresh), FileStore(tmp_path, fresh)
    assert reader.peek() == fresh()
    assert not (tmp_path / "limiter.json").exists()  # peeking creates nothing
    # Two pauses within one instant leave a file of the same size, maybe the same mtime:
    # a just-written file is never trusted from its stat, so the second one is seen too.
    for until in (2_000_000_001.0, 2_000_000_002.0):
        writer.update(lambda state, u=until: (replace(state, paused_until=u), None))
        assert reader.peek() == writer.read()
        assert reader.peek().paused_until == until
    # Once the file was last written long enough ago, an unchanged file is not re-read: the
    # very same state comes back...
    path = tmp_path / "limiter.json"
    os.utime(path, (time.time() - 60, time.time() - 60))
    cached = reader.peek()
    assert reader.peek() is cached
    # ...and any write (here one of the same size) is seen at the next peek.
    writer.update(lambda state: (replace(state, paused_until=2_000_000_003.0), None))
    assert reader.peek() == writer.read() != cached
    assert reader.peek().paused_until == 2_000_000_003.0


# --- through the real SDK --------------------------------------------------------------------

MESSAGE = {
    "id": "msg_stub",
    "type": "message",
    "role": "assistant",
    "model": "stub-model",
    "content": [{"type": "text", "text": "hello"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 40, "output_tokens": 7},
}


class _Stub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _StubHandler)
        self.arrivals: list[tuple[str, int, float]] = []
        self.refuse_first = 0.0
        self.lock = threading.Lock()


class _StubHandler(BaseHTTPRequestHandler):
    server: _Stub

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with self.server.lock:
            first = not self.server.arrivals
            refuse = first and self.server.refuse_first > 0
            status = 429 if refuse else 200
            self.server.arrivals.append((body["model"], status, time.time()))
        if refuse:
            payload = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}
            headers = {"retry-after-ms": f"{self.server.refuse_first * 1000:g}"}
        else:
            payload, headers = {**MESSAGE, "model": body["model"]}, {}
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def stub() -> Iterator[_Stub]:
    server = _Stub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _client(stub: _Stub, limiter: RunLimiter) -> Any:
    import anthropic

    from pytest_evalloop.answer.backends import sdk_http_client

    return anthropic.AsyncAnthropic(
        api_key="sk-test",
        base_url=f"http://127.0.0.1:{stub.server_address[1]}",
        max_retries=2,
        http_client=sdk_http_client(limiter),
    )


async def _ask(client: Any, model: str) -> str:
    reply = await client.messages.create(
        model=model, max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    )
    return str(reply.content[0].text)


def test_a_429_retry_after_pauses_a_second_client(tmp_path: Path, stub: _Stub) -> None:
    stub.refuse_first = 0.8
    # Two limiters on one state dir: what two xdist workers have.
    first, second = RunLimiter(tmp_path, rpm=0, tpm=10**9), RunLimiter(tmp_path, rpm=0, tpm=10**9)

    async def main() -> list[str]:
        clients = _client(stub, first), _client(stub, second)
        a = asyncio.ensure_future(_ask(clients[0], "client-a"))
        # Client b starts once the 429 is back and its pause is in the shared state: an
        # event, not a guess at how long the refusal takes.
        end = time.monotonic() + EVENT_CEILING_S
        while second.paused_until() <= 0:
            assert time.monotonic() < end, "the 429's pause never reached the shared state"
            await asyncio.sleep(0.01)
        b = asyncio.ensure_future(_ask(clients[1], "client-b"))
        try:
            return list(await asyncio.gather(a, b))
        finally:
            await asyncio.gather(*(c.close() for c in clients))

    assert asyncio.run(main()) == ["hello", "hello"]
    (_, refused, refused_at), *rest = stub.arrivals
    assert refused == 429
    b_at = next(t for model, _, t in rest if model == "client-b")
    # Without the shared pause, client b would have arrived ~0.1 s after the 429.
    assert b_at >= refused_at + 0.8 - 0.05
    assert [status for _, status, _ in rest] == [200, 200]
    assert first.stats()["pauses"] == 1
    assert first.stats()["requests"] == 2  # the SDK's retry went through the limiter too
    assert second.stats()["waits"] == 1
    assert second.stats()["tokensSettled"] == 47


def test_the_client_factory_sends_calls_through_its_limiter(
    stub: _Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_evalloop.answer.backends import ClientFactory

    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{stub.server_address[1]}")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    limiter = RunLimiter(None, rpm=600, tpm=10**9)
    factory = ClientFactory(retries=0, limiter=limiter)

    async def main() -> list[str]:
        client = factory()
        try:
            return list(await asyncio.gather(*(_ask(client, f"m{i}") for i in range(3))))
        finally:
            await factory.release()

    started = time.time()
    assert asyncio.run(main()) == ["hello"] * 3
    assert time.time() - started >= 0.2 - 0.02  # 3 requests at 10/s: the third at 0.2 s
    stats = limiter.stats()
    assert stats["requests"] == 3
    assert stats["tokensSettled"] == 3 * 47
