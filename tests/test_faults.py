"""Faults a careful user can cause: a killed xdist worker, a broken or hung endpoint.

Each test runs a real session (the anthropic SDK over HTTP to the loopback fake, the embedded
MCP server, pytest-xdist) and checks what reaches the ledger and the terminal.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop import cli
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.measure.gate import EXIT_HARNESS_FAILURE, EXIT_RUN_UNFINISHED
from pytest_evalloop.testing import FakeAnthropic
from pytest_evalloop.testing.policies import FakeRequest, Outcome
from tests.forkserver import PytestRun
from tests.querygate import EVENT_CEILING_S, wait_exited
from tests.test_gate import Held, pytest_command, questions, script
from tests.test_run import QIDS as RUN_QIDS
from tests.test_run import _example_rows, make_set, run, spec

# Twenty cases: ten per shard under -n 2 (a shard is every second case in collection order).
KILL_QIDS = list(_example_rows())[:20]


WORKER_LOG = """
import os

def pytest_runtest_logstart(nodeid, location):
    with open(os.path.join(os.path.dirname(__file__), "workers.log"), "a") as log:
        log.write(f"{os.getpid()} {nodeid.rsplit('::', 1)[1]}\\n")
"""
"""A conftest that logs which process starts which item: the first item a worker starts is
the head of its shard, so the test knows which process to kill."""


def _shard_heads(log: Path, controller: int) -> dict[str, int]:
    """The pid of the worker that started each item first (the controller logs them too)."""
    heads: dict[str, int] = {}
    for line in log.read_text().splitlines() if log.is_file() else []:
        pid, qid = line.split()
        if int(pid) != controller:
            heads.setdefault(qid, int(pid))
    return heads


def _start(cwd: Path, set_dir: Path, *args: str) -> PytestRun:
    """A pytest run of a set (under xdist) whose workers the test kills by the pids they log.

    Forked from the fork server when it runs (tests/forkserver.py): the controller and its
    workers then start warm (a cold start of the three was ~13 s of CPU), and the workers are
    the server's children, not the controller's, so they are found by the log, not by parent.
    """
    argv, env = pytest_command(set_dir, *args)
    return PytestRun(argv, cwd=cwd, env=env, merge=True)


@pytest.mark.parametrize("kill_after", [1, 5, 9], ids=["early", "ahead", "late"])
def test_a_killed_worker_never_gets_a_case_answered_or_scored_twice(
    pytester: pytest.Pytester,
    fake: FakeAnthropic,
    capsys: pytest.CaptureFixture[str],
    kill_after: int,
) -> None:
    """SIGKILL the worker whose shard has `kill_after` scores (of 10): xdist hands its
    unreported items to another worker, which must not answer the scored ones again.

    "early" and "ahead" hold each shard's first item until the kill, which comes while the
    head holds back the reports of 1 and 5 scored items; "late" holds each shard's seventh
    item, so the kill comes once the head was reported and the seventh holds back the three
    after it. The held items go on only after the kill."""
    shop = make_set(pytester.path, KILL_QIDS)
    (shop / "conftest.py").write_text(WORKER_LOG)
    asked = questions(shop)
    shard_of = {qid: index % 2 for index, qid in enumerate(KILL_QIDS)}
    held = {asked[q] for q in (KILL_QIDS[12:14] if kill_after > 5 else KILL_QIDS[:2])}
    release = threading.Event()
    fake.policy = Held(script(shop, set()).policy(), held, release)
    proc = _start(pytester.path, shop, "-n", "2", "--eval-concurrency=8", "--eval-label=kill")
    run_dir = shop / "runs" / "kill"
    victim: int | None = None
    deadline = time.monotonic() + 240
    while victim is None and time.monotonic() < deadline:
        time.sleep(0.02)
        started = _shard_heads(shop / "workers.log", proc.pid)
        if not (KILL_QIDS[0] in started and KILL_QIDS[1] in started):
            continue
        scored = Counter(shard_of[key[0]] for key in _scores(run_dir))
        shard, count = max(scored.items(), key=lambda item: item[1], default=(0, 0))
        if count >= kill_after:
            victim = started[KILL_QIDS[shard]]
    assert victim is not None, "no shard reached its kill moment"
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    wait_exited(victim)
    release.set()
    scored_at_kill = {key[0] for key in _scores(run_dir)}
    out, _ = proc.communicate(timeout=240)
    assert "crashed" in out or "node down" in out, out
    # One outcome per case: the crash was a rerun (R), not a failure beside the rerun's pass,
    # and the exit status is the run's (every case matched).
    assert out.strip().splitlines()[-1].startswith(f"{len(KILL_QIDS)} passed"), out
    assert "failed" not in out.strip().splitlines()[-1] and proc.returncode == 0, out

    read = ledger_reader.read_run(run_dir)
    assert read.errors == [], [str(f) for f in read.errors]
    per_attempt = Counter(ledger.attempt_key(s) for s in read.of_kind("score"))
    assert set(per_attempt) == {(q, None) for q in KILL_QIDS}, out
    assert set(per_attempt.values()) == {1}, per_attempt
    capsys.readouterr()
    assert cli.main(["validate", str(run_dir)]) == cli.EXIT_OK
    validated = capsys.readouterr().out
    assert ": valid:" in validated
    assert ledger_reader.read_run_info(run_dir).status == "complete"

    by_question = {q: qid for qid, q in asked.items()}
    calls = fake.calls("answerer")
    starts = Counter(by_question[r.question] for r in calls if r.turn == 1)
    requests = Counter(by_question[r.question] for r in calls)
    # A case scored before the kill is never answered again ...
    assert all(starts[qid] == 1 for qid in scored_at_kill), (starts, scored_at_kill)
    # ... and a case is answered twice only when the kill cut its first answer short.
    restarted = {qid for qid, n in starts.items() if n > 1}
    assert all(n <= 2 for n in starts.values()), starts
    # The second answer began after the kill (the survivor got the case only then). The first
    # is the victim's, sent before it died, but read by the fake when it got to it: with the
    # slots refilled as attempts end, one was often still on its way at the kill.
    last_start = {by_question[r.question]: r.received_at for r in calls if r.turn == 1}
    assert all(last_start[qid] > killed_at for qid in restarted)
    print(
        f"kill after {kill_after} scores of its shard: {len(scored_at_kill)} scored at the "
        f"kill; scores per attempt {dict(Counter(per_attempt.values()))}; "
        f"{validated.strip().splitlines()[-1]}; answer starts per case "
        f"{dict(sorted(Counter(starts.values()).items()))}, restarted {sorted(restarted)}; "
        f"answerer requests per case {dict(sorted(Counter(requests.values()).items()))}"
    )


def test_a_crashed_case_no_worker_runs_again_fails_once_and_interrupts_the_run(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    """One worker, no restarts: the case it dies on is queued again but nobody is left to run
    it, so it keeps its failure (once) and the run closes interrupted, resumable."""
    qids = KILL_QIDS[:3]
    shop = make_set(pytester.path, qids)
    (shop / "conftest.py").write_text(WORKER_LOG)
    asked = questions(shop)
    release, reached = threading.Event(), threading.Event()
    held = Held(script(shop, set()).policy(), {asked[qids[1]]}, release)

    def policy(request: FakeRequest) -> Outcome:
        outcome = held(request)
        if request.role == "answerer" and request.question == asked[qids[1]]:
            reached.set()  # the worker is inside the second case, held at its first request
        return outcome

    fake.policy = policy
    proc = _start(
        pytester.path,
        shop,
        "-n",
        "1",
        "--max-worker-restart=0",
        "--eval-concurrency=1",
        "--eval-label=crash",
    )
    run_dir = shop / "runs" / "crash"
    try:
        assert reached.wait(EVENT_CEILING_S), "the worker never reached the held case"
        # The worker logged its first case before asking anything: it is the only worker.
        started = _shard_heads(shop / "workers.log", proc.pid)
        victim = started[qids[0]]
        os.kill(victim, signal.SIGKILL)
        out, _ = proc.communicate(timeout=240)
    finally:
        release.set()
    last = out.strip().splitlines()[-1]
    assert proc.returncode == EXIT_RUN_UNFINISHED, out  # interrupted: never green
    assert last.startswith("1 failed, 1 passed"), out
    assert "crashed and no worker ran it again" in out, out
    assert ledger_reader.read_run_info(run_dir).status == "interrupted"
    assert {key[0] for key in _scores(run_dir)} == {qids[0]}


def _scores(run_dir: Path) -> list[tuple[str, int | None]]:
    """The attempt of every score line written so far (read while the run is going)."""
    events = run_dir / ledger.EVENTS_FILE
    if not events.is_file():
        return []
    read = ledger_reader.read_run(run_dir, kinds=frozenset({"score"}), validate=False)
    return [ledger.attempt_key(e) for e in read.of_kind("score")]


class TearsTheLedger:
    """The script; on the first judge call, another writer leaves a torn line in the ledger."""

    def __init__(self, inner: Any, events: Path) -> None:
        self.inner, self.events, self.done = inner, events, False

    def __call__(self, request: FakeRequest) -> Outcome:
        if request.role == "judge" and not self.done:
            self.done = True
            with open(self.events, "ab") as handle:
                handle.write(b'{"kind": "tool_call", "qid": "ecom_x", "sam')
        outcome: Outcome = self.inner(request)
        return outcome


def test_a_run_whose_ledger_does_not_validate_is_never_complete(
    pytester: pytest.Pytester, fake: FakeAnthropic, capsys: pytest.CaptureFixture[str]
) -> None:
    shop = make_set(pytester.path, KILL_QIDS[:3])
    run_dir = shop / "runs" / "torn"
    fake.policy = TearsTheLedger(script(shop, set()).policy(), run_dir / ledger.EVENTS_FILE)
    result = pytester.runpytest_subprocess(
        str(shop), "-p", "no:cacheprovider", "--eval-label=torn", "--eval-concurrency=1"
    )
    assert fake.policy.done
    info = ledger_reader.read_run_info(run_dir)
    assert info.status == "invalid", result.stdout.str()
    # Never green either: its items passed, and the session exited 0.
    assert result.ret == EXIT_HARNESS_FAILURE, result.stdout.str()
    # The torn line is bad JSON, and it is no line the writer chained there.
    assert "2 ledger errors: events.jsonl:" in (info.invalid_reason or "")
    assert "invalid JSON" in (info.invalid_reason or "")
    assert "written around the ledger's writer" in (info.invalid_reason or "")
    result.stdout.fnmatch_lines(["*pass rate: withheld (the run's ledger does not validate*"])
    assert cli.main(["validate", str(run_dir)]) == cli.EXIT_INVALID
    assert "INVALID: 2 errors" in capsys.readouterr().out


@pytest.mark.parametrize(
    "line",
    [b'{"kind": "tool_call", "qid": "q1", "sam', b'{"kind": "mystery", "qid": "q1"}'],
    ids=["torn-skipped-kind", "unknown-kind"],
)
def test_the_light_read_closing_does_finds_what_validate_finds(tmp_path: Path, line: bytes) -> None:
    from pytest_evalloop.session import runs

    run_dir = tmp_path / "run"
    info = {"runId": "r", "target": "t", "answererModel": "m", "phase": "p", "started": "s"}
    ledger_writer.write_run_info(run_dir, ledger.RunInfo.model_validate(info))
    event = ledger.AttemptEvent(
        qid="q1", sample=None, phase="p", question_sha="x", submitted=False, final_query=None
    )
    ledger_writer.LedgerWriter(run_dir).append(event)
    with open(run_dir / ledger.EVENTS_FILE, "ab") as handle:
        handle.write(line + b"\n")
    ledger_writer.LedgerWriter(run_dir).append(event)
    assert ledger_reader.read_run(run_dir).errors
    closing = runs.read_for_close(run_dir)
    assert [f.message for f in closing.errors] == [
        f.message for f in ledger_reader.read_run(run_dir).errors
    ]
    assert runs.invalid_reason(closing)


def _attempt_errors(run_dir: Path) -> dict[str, str | None]:
    return {key[0]: e.error for key, e in ledger_reader.read_run(run_dir).attempts().items()}


@pytest.mark.parametrize("kind", ["html", "malformed"])
def test_a_reply_that_is_not_json_is_a_harness_error_counted_by_the_abort_rule(
    pytester: pytest.Pytester, fake: FakeAnthropic, kind: str
) -> None:
    """Every second reply is a 200 that is no message: an HTML page, or broken JSON."""
    shop = make_set(pytester.path, RUN_QIDS)
    broken = [{"role": "any", "kind": kind, "every": 2, "after": 1, "times": 1000}]
    fake.policy = spec(shop, faults=broken).policy()
    result = run(pytester, shop, "--eval-concurrency=1", "--eval-label=broken")
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("errors") == 4, out
    assert outcomes.get("aborted") == len(RUN_QIDS) - 4
    assert "Traceback" not in out and "AttributeError" not in out
    assert "JSONDecodeError: Unterminated" in out if kind == "malformed" else "<html>" in out
    run_dir = shop / "runs" / "broken"
    errors = _attempt_errors(run_dir)
    assert len(errors) == 4 and all("gave an unusable reply" in (e or "") for e in errors.values())
    info = ledger_reader.read_run_info(run_dir)
    assert info.status == "aborted" and "unusable reply" in (info.abort_reason or "")
    assert ledger_reader.read_run(run_dir).errors == []


@pytest.mark.parametrize(
    ("role", "limits", "said"),
    [
        ("answerer", ["--eval-request-timeout=0.5"], "answerer: the Anthropic Messages API at"),
        ("judge", ["--eval-request-timeout=0.5"], "judge: the Anthropic Messages API at"),
        ("judge", ["--eval-judge-timeout=1.5"], "judge: the judge at"),
    ],
    ids=["answerer-request", "judge-request", "judge-limit"],
)
def test_a_hung_endpoint_is_a_harness_error_within_the_time_limits(
    pytester: pytest.Pytester, fake: FakeAnthropic, role: str, limits: list[str], said: str
) -> None:
    shop = make_set(pytester.path, RUN_QIDS[:2])
    # A hang that lasts until the fake stops: only the run's own limits can end these items.
    hang = [{"role": role, "kind": "hang", "seconds": None, "times": 1000}]
    fake.policy = spec(shop, faults=hang).policy()
    result = run(pytester, shop, "--eval-retries=1", "--eval-label=hung", *limits)
    out = result.stdout.str()
    assert result.parseoutcomes().get("errors") == 2, out
    errors = _attempt_errors(shop / "runs" / "hung")
    assert set(errors) == set(RUN_QIDS[:2])
    assert all((e or "").startswith(said) for e in errors.values()), errors
    if "--eval-judge-timeout=1.5" in limits:
        assert all(
            "did not finish within --eval-judge-timeout=1.5 s" in (e or "") for e in errors.values()
        )
    else:
        assert all("timed out after 1 retries" in (e or "") for e in errors.values())
        assert all("--eval-request-timeout=0.5 s" in (e or "") for e in errors.values())
    assert ledger_reader.read_run(shop / "runs" / "hung").scores() == {}


def test_a_judge_harness_error_leaves_its_attempt_with_an_error(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop = make_set(pytester.path, RUN_QIDS[:3])
    fake.policy = spec(shop, faults=[{"role": "judge", "status": 503, "times": 1}]).policy()
    result = run(pytester, shop, "--eval-retries=0", "--eval-concurrency=1", "--eval-label=j")
    assert result.parseoutcomes().get("errors") == 1, result.stdout.str()
    read = ledger_reader.read_run(shop / "runs" / "j")
    attempts, scores = read.attempts(), read.scores()
    failed = [key for key, a in attempts.items() if a.error]
    assert failed == [(RUN_QIDS[0], None)] and failed[0] not in scores
    error = attempts[failed[0]].error or ""
    assert error.startswith("judge: the Anthropic Messages API at") and "HTTP 503" in error
    # The answer stays, for a rejudge to score later.
    assert attempts[failed[0]].answer_text and attempts[failed[0]].transcript_path
    assert len(scores) == 2
