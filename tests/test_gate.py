"""Baselines, the CI gate, rejudge, check-judge, resume and --lf, through whole runs."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure.gate import EXIT_GATE_REJECTED
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic, JudgeVerdict, Reply, ScriptSpec
from pytest_evalloop.testing.policies import FakeRequest, Outcome, render_verdict
from tests import forkserver
from tests.conftest import MALLOY_SET, SECRET
from tests.sealing import closed_as_is
from tests.test_run import ORACLE, make_set

QIDS = [
    "ecom_accounts_never_ordered",
    "ecom_average_order_value",
    "ecom_avg_days_to_ship",
    "ecom_cancellation_rate",
    "ecom_order_count",
    "ecom_sales_2022",
    "ecom_customer_accounts",
    "ecom_units_sold_2022",
    "ecom_open_orders",
    "ecom_products_never_sold",
]


def questions(set_dir: Path) -> dict[str, str]:
    return {c.qid: c.question for _, c in sets.load_cases(set_dir).rows}


def script(set_dir: Path, no_match: set[str]) -> ScriptSpec:
    """Every case answered by its modelQuery; the judge says no_match for the named qids."""
    by_q = {
        q: {"verdict": "no_match", "why": f"scripted fail of {qid}"}
        for qid, q in questions(set_dir).items()
        if qid in no_match
    }
    return ScriptSpec.model_validate(
        {
            "cases_file": str(set_dir / sets.CASES_FILE),
            "answerer": {"default": ORACLE},
            "judge": {"default": {"verdict": "match"}, "by_question": by_q},
        }
    )


def run(pytester: pytest.Pytester, set_dir: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(str(set_dir), "-p", "no:cacheprovider", *args)


@pytest.fixture
def shop(pytester: pytest.Pytester) -> Path:
    return make_set(pytester.path, QIDS)


def baseline(pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path, failing: set[str]) -> None:
    fake.policy = script(shop, failing).policy()
    result = run(pytester, shop, "--eval-label=base")
    assert (shop / "runs" / "base" / "run.json").is_file(), result.stdout.str()


@pytest.fixture(scope="module")
def first_five_fail(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real baseline run (the first five cases fail), shared by the gate scenarios.

    A run is path-independent (its pins hash file contents), so each test copies it into its
    own copy of the set instead of answering the same baseline again.
    """
    root = tmp_path_factory.mktemp("baseline")
    shop = make_set(root, QIDS)
    with FakeAnthropic(script(shop, set(QIDS[:5]))) as server:
        env = {**os.environ, **server.env(SECRET), "PYTHONPATH": os.pathsep.join(sys.path)}
        done = forkserver.run_pytest(
            [
                sys.executable,
                "-m",
                "pytest",
                str(shop),
                "-p",
                "no:cacheprovider",
                "-q",
                "--eval-label=base",
            ],
            cwd=root,
            env=env,
            timeout=300,
        )
    run_dir = shop / "runs" / "base"
    assert (run_dir / "run.json").is_file(), done.stdout + done.stderr
    return run_dir


SCENARIOS = {
    # baseline: first five fail; post: everything passes -> 5 better, 0 worse
    "accepted": (set(QIDS[:5]), set(), 0, "gate bar: ACCEPTED"),
    # post breaks four that passed -> 4 worse: more than 3 rejects
    "rejected": (set(QIDS[:5]), set(QIDS[:9]), EXIT_GATE_REJECTED, "gate bar: REJECTED"),
    # post fixes one -> 1 better, 0 worse: below the bar
    "unresolved": (set(QIDS[:5]), set(QIDS[1:5]), EXIT_GATE_REJECTED, "gate bar: UNRESOLVED"),
}


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["plain", "n2"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_gate_decides_and_sets_the_exit_status(
    pytester: pytest.Pytester,
    fake: FakeAnthropic,
    shop: Path,
    first_five_fail: Path,
    workers: list[str],
    scenario: str,
) -> None:
    import shutil

    _, after, code, line = SCENARIOS[scenario]
    shutil.copytree(first_five_fail, shop / "runs" / "base")
    fake.policy = script(shop, after).policy()
    xml = pytester.path / "junit.xml"
    result = run(
        pytester,
        shop,
        "--baseline=base",
        "--eval-gate=bar",
        "--eval-label=post",
        f"--junitxml={xml}",
        *workers,
    )
    out = result.stdout.str()
    assert result.ret == code, out
    assert line in out
    assert "flips: base (baseline) -> post (current)" in out
    post = shop / "runs" / "post"
    read = ledger_reader.read_run(post)
    assert read.errors == []
    [check] = read.of_kind("acceptance_check")
    assert check.decision == scenario and check.baseline_run_id == "base"
    assert ledger_reader.read_run_info(post).gate["decision"] == scenario  # type: ignore[index]
    props = {p.get("name"): p.get("value") for p in ET.parse(xml).iter("property")}
    assert props["evalloop_decision"] == scenario


def test_a_changed_judge_version_refuses_the_gate(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path, first_five_fail: Path
) -> None:
    import shutil

    shutil.copytree(first_five_fail, shop / "runs" / "base")
    info = json.loads((shop / "runs" / "base" / "run.json").read_text())
    info["judgeVersion"] = "0"
    (shop / "runs" / "base" / "run.json").write_text(json.dumps(info))
    closed_as_is(shop / "runs" / "base")  # a baseline that closed under judge version 0
    fake.policy = script(shop, set()).policy()
    # Known before the run (issue 24): a usage error, nothing answered or paid for.
    refused = run(pytester, shop, "--baseline=base", "--eval-gate=bar")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR, refused.stdout.str()
    refused.stderr.fnmatch_lines(["*--baseline=base: its breaking pins differ*judgeVersion*"])
    assert fake.calls() == []
    # Ungated, the same pair is a rebase the flip table warns about (after the run).
    warned = run(pytester, shop, "--baseline=base")
    assert warned.ret == 0, warned.stdout.str()
    warned.stdout.fnmatch_lines(["*pins differ*", "*judgeVersion*"])
    allowed = run(pytester, shop, "--baseline=base", "--eval-gate=bar", "--eval-allow-pin-mismatch")
    assert allowed.ret == 0, allowed.stdout.str()


def test_k_narrows_a_gated_run_and_says_so(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    baseline(pytester, fake, shop, set())
    fake.policy = script(shop, set()).policy()
    calls = len(fake.calls())
    narrowed = ("-k", "ecom_order_count or ecom_sales_2022")
    gated = run(pytester, shop, "--baseline=base", "--eval-gate=no-regressions", *narrowed)
    # A gate decides on whole runs: refused before the first request, naming the flag.
    assert gated.ret == pytest.ExitCode.USAGE_ERROR
    gated.stderr.fnmatch_lines(["*decides on whole runs*-k 'ecom_order_count or ecom_sales_2022'*"])
    assert len(fake.calls()) == calls
    # Without a gate the subset is compared for a look, and says what it left out.
    looked = run(pytester, shop, "--baseline=base", *narrowed)
    assert looked.ret == 0, looked.stdout.str()
    looked.stdout.fnmatch_lines(
        [
            "compared 2 of 10 cases; left out: 8 not selected (-k 'ecom_order_count or*",
            "gate off: REFUSED -- gate off (exit status not gated); these runs cannot carry a*",
        ]
    )


def test_rejudge_makes_no_answerer_calls(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    baseline(pytester, fake, shop, {QIDS[0]})
    answered = len(fake.calls("answerer"))
    fake.policy = script(shop, set()).policy()  # the repaired golden now matches
    result = run(pytester, shop, "--eval-rejudge-from=base")
    assert result.ret == 0, result.stdout.str()
    assert len(fake.calls("answerer")) == answered
    rejudge = shop / "runs" / "ecommerce-rejudge-01"
    info = ledger_reader.read_run_info(rejudge)
    assert info.rejudge_of == "base" and info.phase == "rejudge"
    read = ledger_reader.read_run(rejudge)
    assert read.errors == [] and len(read.scores()) == len(QIDS)
    base = ledger_reader.read_run(shop / "runs" / "base")
    assert {k: a.final_query for k, a in read.attempts().items()} == {
        k: a.final_query for k, a in base.attempts().items()
    }
    # The rejudge keeps how each final query was chosen (not "declared" for every stored one).
    assert {k: a.final_query_source for k, a in read.attempts().items()} == {
        k: a.final_query_source for k, a in base.attempts().items()
    }
    assert {a.final_query_source for a in base.attempts().values()} == {"declared"}


def test_the_printed_rejudge_of_a_partial_run_judges_what_it_has(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_evalloop import cli

    fake.policy = script(shop, set()).policy()
    covered = QIDS[:2]
    first = run(pytester, shop, "--eval-label=base", "-k", " or ".join(covered))
    first.assert_outcomes(passed=2)
    # The side door names the run that scored the case, and the command to rejudge it.
    assert cli.main(["golden", "hold", str(shop), covered[0], "--reason", "doubted"]) == 0
    assert cli.main(["golden", "release", str(shop), covered[0], "--reason", "it stands"]) == 0
    printed = capsys.readouterr().out
    [command] = [line.split() for line in printed.splitlines() if "--eval-rejudge-from=" in line]
    assert command[:2] == ["pytest", str(shop)]
    answered = len(fake.calls("answerer"))
    result = run(pytester, Path(command[1]), *command[2:], "-rs")
    out = result.stdout.str()
    assert result.ret == 0, out
    assert len(fake.calls("answerer")) == answered
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 2 and outcomes.get("unscored") == len(QIDS) - 2, out
    assert "errors" not in outcomes and "aborted" not in out.lower()
    assert "not in the source run base" in out
    assert f"{len(QIDS) - 2} item(s) not answered" in out and "not_in_source" in out
    [rejudge] = [p for p in (shop / "runs").iterdir() if p.name != "base" and p.is_dir()]
    info = ledger_reader.read_run_info(rejudge)
    assert info.status == "complete" and info.rejudge_of == "base"
    assert sorted(k[0] for k in ledger_reader.read_run(rejudge).scores()) == sorted(covered)


def _malloy_copy(root: Path) -> Path:
    import shutil

    target = root / "malloy" / "ecommerce"
    shutil.copytree(MALLOY_SET, target)
    return target


def test_check_judge_fails_exactly_the_fixtures_it_disagrees_on(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = _malloy_copy(pytester.path)
    fixtures = [row for _, row in sets.load_regressions(set_dir).rows]
    flipped = {fixtures[0].fixture_id, fixtures[5].fixture_id}
    settled = {f.prediction["answer_text"][:80]: (f.fixture_id, f.verdict) for f in fixtures}
    other = {"match": "no_match", "no_match": "match", "near_match": "match"}

    def judge(request: Any) -> Reply:
        for head, (fixture_id, verdict) in settled.items():
            if head in request.user_text:
                said = other[verdict] if fixture_id in flipped else verdict
                return Reply(text=render_verdict(JudgeVerdict(verdict=said, confidence=8)))
        return Reply(text="no fixture matched")

    fake.policy = judge
    result = run(pytester, set_dir, "--eval-check-judge", "-n", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=10, failed=2)
    failed = {
        line.split("::")[-1].split()[0] for line in result.stdout.lines if line.startswith("FAILED")
    }
    assert failed == flipped
    result.stdout.fnmatch_lines(["*judge disagrees with the human on*", "*agreement 0/1*"])


class Held:
    """The script, with the first turn of some questions held back until the test releases
    them (or the fake stops): the test decides what a run has done when it kills or
    interrupts it, and a hold ends on the test's event, never on a timer."""

    def __init__(self, inner: Any, held: set[str], release: threading.Event) -> None:
        self.inner, self.held, self.release = inner, held, release

    def __call__(self, request: FakeRequest) -> Outcome:
        outcome = self.inner(request)
        held = request.role == "answerer" and request.turn == 1 and request.question in self.held
        if held and isinstance(outcome, Reply):
            return dataclasses.replace(outcome, held_until=self.release)
        return outcome


def pytest_command(set_dir: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """`python -m pytest <set> -q <args>` and its environment (this process's import path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-m", "pytest", str(set_dir), "-p", "no:cacheprovider", "-q", *args]
    return argv, env


def spawn_pytest(cwd: Path, set_dir: Path, *args: str, **popen: Any) -> subprocess.Popen[str]:
    """A pytest run of a set in a child process we can signal (the fake endpoint stays ours)."""
    argv, env = pytest_command(set_dir, *args)
    return subprocess.Popen(argv, cwd=cwd, env=env, text=True, **popen)


def test_a_killed_run_resumes_to_one_score_per_case(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    # Cases run one at a time; the fourth and later are held until after the kill, so the
    # kill comes with exactly three scored, on any machine.
    spec = script(shop, set())
    release = threading.Event()
    asked = questions(shop)
    fake.policy = Held(spec.policy(), {asked[q] for q in QIDS[3:]}, release)
    proc = spawn_pytest(
        pytester.path,
        shop,
        "--eval-concurrency=1",
        "--eval-label=killed",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    events = shop / "runs" / "killed" / ledger.EVENTS_FILE
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if events.is_file() and events.read_text().count('"kind": "score"') >= 3:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    release.set()
    partial = ledger_reader.read_run(shop / "runs" / "killed")
    scored = set(partial.scores())
    assert scored == {(q, None) for q in QIDS[:3]}, scored
    assert partial.info is not None and partial.info.status == "running"
    assert not [f for f in partial.errors if "torn" not in f.message]
    first_turns = len([r for r in fake.calls("answerer") if r.turn == 1])
    fake.policy = spec.policy()
    result = run(pytester, shop, "--eval-resume=killed")
    assert result.ret == 0, result.stdout.str()
    read = ledger_reader.read_run(shop / "runs" / "killed")
    assert read.errors == []
    assert len(read.of_kind("score")) == len(QIDS)
    assert read.info is not None and read.info.status == "complete"
    resumed_turns = len([r for r in fake.calls("answerer") if r.turn == 1]) - first_turns
    assert resumed_turns == len(QIDS) - len(scored)


def test_last_failed_reruns_the_no_match_cases(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    fake.policy = script(shop, {QIDS[2], QIDS[7]}).policy()
    first = pytester.runpytest_subprocess(str(shop))
    first.assert_outcomes(passed=8, failed=2)
    again = pytester.runpytest_subprocess(str(shop), "--lf")
    again.assert_outcomes(failed=2)
