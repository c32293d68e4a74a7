"""The limiter's window: at most rpm requests in any 60-second window, across every process.

Each "process" is a `RunLimiter` of its own on one shared state directory (the file and the
`flock` every xdist worker uses), all on one looptime event loop: virtual time moves only when
every task sleeps, so each request's moment is exact and nothing races the clock.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import looptime
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pytest_evalloop.model_api.ratelimit import WINDOW_S, RunLimiter, windowed

Arrival = tuple[int, float]  # (which process, when it asks)
Pause = tuple[int, float, float]  # (which process, when, for how long)


def most_in_a_window(stamps: list[float], window: float = WINDOW_S) -> int:
    """The largest number of stamps in any closed interval [t, t + window]."""
    stamps = sorted(stamps)
    best, start = 0, 0
    for end, stamp in enumerate(stamps):
        while stamp - stamps[start] > window:
            start += 1
        best = max(best, end - start + 1)
    return best


def test_most_in_a_window_counts_both_ends() -> None:
    assert most_in_a_window([0.0, 60.0]) == 2
    assert most_in_a_window([0.0, 60.000001]) == 1
    assert most_in_a_window([0.0, 30.0, 60.5]) == 2
    assert most_in_a_window([5.0, 1.0, 30.0, 61.5, 62.0]) == 4  # [5, 65]


def replay(rpm: int, processes: int, arrivals: list[Arrival], pauses: list[Pause]) -> list[float]:
    """Every request's moment of going, when `arrivals` ask `processes` limiters sharing one
    state file at `rpm`, with `pauses` (a 429's retry-after) landing as given."""
    loop = looptime.new_event_loop(start=0.0)
    with tempfile.TemporaryDirectory() as state_dir:
        limiters = [
            RunLimiter(Path(state_dir), rpm=rpm, tpm=0, clock=loop.time) for _ in range(processes)
        ]

        async def request(index: int, at: float) -> float:
            await asyncio.sleep(at)
            await limiters[index % processes].acquire(0)
            return loop.time()

        async def pause(index: int, at: float, seconds: float) -> None:
            await asyncio.sleep(at)
            limiters[index % processes].pause(seconds)

        async def main() -> list[float]:
            jobs = [asyncio.ensure_future(pause(*p)) for p in pauses]
            stamps = await asyncio.gather(*(request(i, at) for i, at in arrivals))
            await asyncio.gather(*jobs)
            return list(stamps)

        try:
            return loop.run_until_complete(main())
        finally:
            loop.close()


arrivals = st.lists(
    st.tuples(st.integers(0, 2), st.floats(0, 240, allow_nan=False).map(lambda t: round(t, 3))),
    min_size=1,
    max_size=40,
)
pauses = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.floats(0, 240, allow_nan=False).map(lambda t: round(t, 3)),
        st.floats(0, 30, allow_nan=False).map(lambda t: round(t, 3)),
    ),
    max_size=3,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rpm=st.integers(1, 12), processes=st.integers(1, 3), arrivals=arrivals, pauses=pauses)
# The repro, scaled down: three processes, every request at once; the bucket's free
# first request plus one a second let rpm + 1 into the minute [0, 60].
@example(rpm=12, processes=3, arrivals=[(i, 0.0) for i in range(30)], pauses=[])
# A quiet spell fills the bucket's burst, then a rush: the burst must not add to the minute.
@example(rpm=4, processes=2, arrivals=[(0, 0.0), *[(i, 30.0) for i in range(8)]], pauses=[])
def test_no_60_second_window_holds_more_than_rpm_requests(
    rpm: int, processes: int, arrivals: list[Arrival], pauses: list[Pause]
) -> None:
    stamps = replay(rpm, processes, arrivals, pauses)
    assert len(stamps) == len(arrivals)  # every request went
    assert most_in_a_window(stamps) <= rpm, sorted(stamps)
    # None went before it asked.
    assert all(s >= at for s, (_, at) in zip(stamps, arrivals, strict=True))


def test_a_steady_stream_still_gets_the_whole_rate() -> None:
    # 60 rpm, 3 processes, 130 requests asked at once: the window costs a 50 ms margin a minute,
    # not a request, so the 61st goes just after 60 s and the 121st just after 120 s.
    stamps = sorted(replay(60, 3, [(i, 0.0) for i in range(130)], []))
    assert most_in_a_window(stamps) == 60
    assert stamps[59] == 59.0 and 60.0 < stamps[60] < 60.1, stamps[58:62]
    assert 120.0 < stamps[120] < 120.2


def test_windowed_drops_a_requeued_slot_and_keeps_at_most_rpm_times() -> None:
    window, at = windowed((0.0, 1.0, 2.0), rpm=3, now=2.0, at=2.0)
    assert at == WINDOW_S + 0.05 and window == (1.0, 2.0, at)
    # A reservation a pause overtook never went: it frees its place in the window.
    window, at = windowed((0.0, 1.0, 2.0), rpm=3, now=2.0, at=2.5, requeued=2.0)
    assert at == 2.5 and window == (0.0, 1.0, 2.5)
    # Times too old to bind any later slot are dropped.
    window, at = windowed((0.0, 1.0), rpm=3, now=100.0, at=100.0)
    assert window == (100.0,)
