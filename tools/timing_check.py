"""Run the tests whose outcome once depended on the machine's speed, many times, idle and loaded.

    python tools/timing_check.py [--count 20] [--busy 2] [pytest args...]

Each test listed in TIMING_TESTS forces the order of the events it needs (a query held at a
gate, an event loop whose clock the test moves, a wait for a file or a recorded pause), so it
must pass every time whether the cores are idle or taken. The script runs them `--count` times
(pytest-repeat) with the cores idle, then again with `--busy` processes spinning on them, and
prints the pass counts of each phase; the tests that run a whole eval and kill or interrupt it
(SLOW_TIMING_TESTS) run `--slow-count` times. Exit status 0 only when every run of every test passed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMING_TESTS = [
    "tests/test_sandbox.py::test_queries_in_flight_when_the_process_dies_are_run_again",
    "tests/test_sandbox.py::test_a_query_that_ignores_the_interrupt_is_stopped_by_replacing_the_process",
    "tests/test_embedded_speed.py::test_closing_the_target_ends_a_request_in_flight_as_a_harness_error",
    "tests/test_embedded_speed.py::test_a_cancelled_caller_stays_cancelled",
    "tests/test_ratelimit.py::test_a_pause_from_one_process_delays_the_next_acquire_of_another",
    "tests/test_ratelimit.py::test_a_pause_requeues_reservations_made_before_it",
    "tests/test_ratelimit.py::test_a_429_retry_after_pauses_a_second_client",
    "tests/test_fake_anthropic.py::test_overloaded_burst_survived_by_sdk_retries_with_retry_after_ms",
    "tests/test_fake_anthropic.py::test_hang_longer_than_client_timeout_times_out",
    "tests/test_secrets.py::test_the_environment_is_read_whole_while_another_thread_changes_it",
    "tests/test_fake_anthropic.py::test_concurrent_async_calls_are_served_in_parallel",
    "tests/test_claude_code.py::test_timeout_kills_the_cli_within_the_limit",
    "tests/test_claude_code.py::test_a_refused_credential_fails_the_attempt_at_the_first_retry",
    "tests/test_skills_run.py::test_a_hung_cli_is_killed_at_the_deadline",
    "tests/test_progress.py::test_a_plain_line_every_interval_when_verbose",
    "tests/test_progress.py::test_workers_publish_and_the_controller_sums",
    "tests/test_progress.py::test_the_publisher_rewrites_the_file_when_counters_change",
    "tests/test_concurrency.py::test_an_interrupt_a_finalizer_swallowed_still_stops_the_wait",
    "tests/test_concurrency.py::test_an_interrupt_inside_a_lock_a_done_callback_takes_cannot_deadlock",
    "tests/test_collect.py::test_settling_the_heap_frees_garbage_cycles_first_then_freezes_the_living",
    "tests/test_sandbox.py::test_a_process_left_heavy_by_a_query_is_retired",
    "tests/test_sandbox.py::test_the_query_process_ends_with_its_sandbox_and_with_its_parent",
]
# Whole runs killed or interrupted at a forced point: slower, so fewer repeats (--slow-count).
SLOW_TIMING_TESTS = [
    "tests/test_concurrency.py::test_an_interrupted_concurrent_run_leaves_a_valid_ledger",
    "tests/test_gate.py::test_a_killed_run_resumes_to_one_score_per_case",
    "tests/test_faults.py::test_a_killed_worker_never_gets_a_case_answered_or_scored_twice",
]


def _spin() -> None:
    while True:
        pass


def _phase(name: str, tests: list[str], count: int, extra: list[str]) -> int:
    """Run `tests` `count` times each; print the counts; return how many runs failed."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *tests,
        f"--count={count}",
        "-q",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        *extra,
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    tail = done.stdout.strip().splitlines()[-1:] or [done.stderr.strip()[-300:]]
    passed = sum(int(n) for n in re.findall(r"(\d+) passed", tail[0]))
    failed = sum(int(n) for n in re.findall(r"(\d+) (?:failed|error)", tail[0]))
    print(f"{name}: {passed} passed, {failed} failed ({count} x {len(tests)} tests): {tail[0]}")
    if failed:
        print(done.stdout[-4000:])
    sys.stdout.flush()
    return failed


def _phases(label: str, count: int, slow_count: int, extra: list[str]) -> int:
    failed = _phase(label, TIMING_TESTS, count, extra)
    if slow_count:
        failed += _phase(f"{label}, whole runs", SLOW_TIMING_TESTS, slow_count, extra)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20, help="runs of each test per phase")
    parser.add_argument(
        "--slow-count", type=int, default=3, help="runs of each whole-run test per phase"
    )
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes when loaded")
    args, extra = parser.parse_known_args(argv)
    idle_failed = _phases("idle", args.count, args.slow_count, extra)
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for proc in spinners:
        proc.start()
    try:
        busy_failed = _phases(f"with {args.busy} busy loops", args.count, args.slow_count, extra)
    finally:
        for proc in spinners:
            proc.terminate()
            proc.join()
    return 1 if idle_failed or busy_failed else 0


if __name__ == "__main__":
    sys.exit(main())
