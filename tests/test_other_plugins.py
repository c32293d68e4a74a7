"""The example set under the pytest plugins users already run, each alone and all together.

Each cell of the matrix runs a small copy of the example set (five cases: three match, one
no_match, one near_match) beside a few plain unit tests, against its own loopback fake, and
checks three things: pytest's counts are the ledger's (the eval items' part of them, in the
plugin's own terms), nothing was asked of the endpoint that the baseline did not ask (the fake's
request log: no case answered or judged twice), and the plugin's own figures are intact (its
rerun count, its report, its seed). The baseline is one run without any of them, shared by the
module (tests/conftest.py gives the module to one xdist worker).

docs/configuration.md's "With other plugins" table is what these cells show.
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_evalloop import otherplugins
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure import aggregates
from pytest_evalloop.model_api.redaction import REDACTED
from pytest_evalloop.scale import sharding
from pytest_evalloop.testing import FakeAnthropic
from tests import forkserver, test_run
from tests.conftest import CHILD_ADDOPTS, NO_SUGAR, SECRET
from tests.test_run import _example_rows, make_set, spec

QIDS = test_run.QIDS[:5]
NO_MATCH, NEAR_MATCH = QIDS[1], QIDS[2]
UNITS = 6
UNIT_TESTS = "\n".join(
    [
        "import os",
        "",
        "def _ran(name):",
        "    with open(os.environ['UNIT_ORDER_FILE'], 'a') as f:",
        "        f.write(name + '\\n')",
        "",
        *(f"def test_unit_{i}():\n    _ran('test_unit_{i}')\n" for i in range(UNITS)),
    ]
)
"""Plain tests run beside the eval items: each writes its name, so an order is visible."""
SEED = 1
"""A pytest-randomly seed that puts the five eval items out of file order (checked below)."""
PYTEST_WORDS = {"match": "passed", "no_match": "failed", "near_match": "near_match"}
"""The word pytest's summary line counts each ledger outcome under (plugin.py)."""


def judge_script(set_dir: Path) -> dict[str, Any]:
    rows = _example_rows()
    return {
        "default": {"verdict": "match", "confidence": 9},
        "by_question": {
            rows[NO_MATCH]["question"]: {
                "verdict": "no_match",
                "confidence": 9,
                "why": "summed all statuses",
            },
            rows[NEAR_MATCH]["question"]: {
                "verdict": "near_match",
                "confidence": 7,
                "why": "rounded to tens",
            },
        },
    }


@dataclass
class Cell:
    """One child run of the matrix and what it left."""

    out: str
    ret: int
    root: Path
    set_dir: Path
    requests: Counter[tuple[str | None, str | None]]

    @property
    def run_dir(self) -> Path:
        [run_dir] = [p for p in (self.set_dir / "runs").iterdir() if p.is_dir()]
        return run_dir

    def ledger(self) -> Counter[str]:
        """The ledger's outcome per attempt (one score per attempt, or a harness error)."""
        read = ledger_reader.read_run(self.run_dir)
        assert read.errors == [], read.errors
        scores = read.scores()
        return Counter(aggregates.outcome(scores.get(key)) for key in read.attempts())

    def counts(self) -> dict[str, int]:
        """pytest's summary line, its outcomes (warnings are checked where they are expected)."""
        nouns = pytest.RunResult.parse_summary_nouns(self.out.splitlines())
        nouns.pop("warnings", None)
        return nouns

    def unit_order(self) -> list[str]:
        return (self.root / "units.order").read_text().split()


def run_cell(
    root: Path,
    *args: str,
    latency: float = 0.0,
    addopts: str = CHILD_ADDOPTS,
    conftest: str | None = None,
) -> Cell:
    """The small set and the unit tests under `args`, against a fresh fake."""
    root.mkdir(parents=True)
    set_dir = make_set(root, QIDS)
    (root / "test_units.py").write_text(UNIT_TESTS)
    if conftest is not None:
        (root / "conftest.py").write_text(conftest)
    with FakeAnthropic(spec(set_dir, judge_script(set_dir), latency=latency).policy()) as fake:
        env = {"PYTEST_ADDOPTS": addopts, "UNIT_ORDER_FILE": str(root / "units.order")}
        done = child_run(fake, root, set_dir, "test_units.py", "-rA", *args, env=env)
        requests = Counter((r.role, r.question) for r in fake.requests)
    return Cell(done.stdout, done.returncode, root, set_dir, requests)


def child_run(
    fake: FakeAnthropic, root: Path, set_dir: Path, *args: str, env: dict[str, str] | None = None
) -> Any:
    """`pytest <set_dir> <args>` forked in `root`, pointed at `fake` (stderr in stdout)."""
    cmd = [sys.executable, "-m", "pytest", str(set_dir), "-p", "no:cacheprovider"]
    cmd += ["--eval-report=off", *args]
    env = {
        **os.environ,
        "ANTHROPIC_BASE_URL": fake.base_url,
        "ANTHROPIC_API_KEY": SECRET,
        **(env or {}),
    }
    return forkserver.run_pytest(cmd, cwd=root, env=env, timeout=300, merge=True)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Cell:
    """The set with none of the plugins: the requests every cell must match."""
    cell = run_cell(tmp_path_factory.mktemp("baseline") / "run")
    assert cell.ledger() == {"match": 3, "no_match": 1, "near_match": 1}, cell.out
    assert cell.counts() == {"passed": 3 + UNITS, "failed": 1, "near_match": 1}, cell.out
    # Each case answered once (three turns) and judged once.
    assert sorted(Counter(role for role, _q in cell.requests.elements()).items()) == [
        ("answerer", 15),
        ("judge", 5),
    ]
    return cell


@pytest.fixture
def cell_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def eval_counts(ledger: Counter[str], units: int) -> dict[str, int]:
    """pytest's summary line expected of a session: the ledger's outcomes in pytest's words,
    plus the passing unit tests."""
    counts: Counter[str] = Counter()
    for outcome, n in ledger.items():
        counts[PYTEST_WORDS[outcome]] += n
    counts["passed"] += units
    return dict(counts)


def row(plugin: str, cell: Cell, counts: dict[str, int], baseline: Cell) -> str:
    """The matrix's line for the notes (printed; `-rP` shows it)."""
    pytest_part = ", ".join(f"{n} {w}" for w, n in sorted(counts.items()))
    ledger_part = ", ".join(f"{n} {w}" for w, n in sorted(cell.ledger().items()))
    same = "same as baseline" if cell.requests == baseline.requests else "DIFFERENT"
    total = sum(cell.requests.values())
    return f"| {plugin} | yes | {pytest_part} · ledger {ledger_part} | {total} ({same}) |"


def assert_cell(plugin: str, cell: Cell, baseline: Cell, counts: dict[str, int]) -> None:
    """The three checks every cell makes, then its line of the table."""
    assert cell.ledger() == baseline.ledger(), cell.out
    assert cell.requests == baseline.requests, "a case was answered or judged again"
    print(row(plugin, cell, counts, baseline))


def test_xdist(baseline: Cell, cell_dir: Path) -> None:
    cell = run_cell(cell_dir, "-n", "2")
    assert cell.counts() == eval_counts(cell.ledger(), UNITS), cell.out
    assert "created: 2/2 workers" in cell.out
    assert_cell("pytest-xdist (-n 2)", cell, baseline, cell.counts())


def test_rerunfailures(baseline: Cell, cell_dir: Path) -> None:
    cell = run_cell(cell_dir, "--reruns", "1")
    counts = cell.counts()
    # Its own figure: the no_match case failed, was run again, and is counted as a rerun.
    assert counts == {**eval_counts(cell.ledger(), UNITS), "rerun": 1}, cell.out
    # The rerun was not answered again, and its failure shows the whole first report.
    failure = cell.out.split("= FAILURES =", 1)[1].split("= PASSES =", 1)[0]
    assert "question:   What is our average order value?" in failure
    assert "judge's why: summed all statuses" in failure
    assert "scored already in this run: no_match" in failure
    assert_cell("pytest-rerunfailures (--reruns 1)", cell, baseline, counts)


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "n2"])
def test_timeout(baseline: Cell, cell_dir: Path, xdist: list[str]) -> None:
    # Every reply takes 1.5 s, so an attempt (three answerer turns and a judge) takes at least
    # 6 s: the first item's wait for its own attempt (each worker's, under xdist) is longer
    # than the timeout on any machine. Only the item's own work runs on pytest-timeout's clock.
    cell = run_cell(cell_dir, "--timeout=5", *xdist, latency=1.5)
    counts = cell.counts()
    assert counts == eval_counts(cell.ledger(), UNITS), cell.out
    assert "timeout: 5.0s" in cell.out  # its own header
    assert "stopped by pytest-timeout" not in cell.out
    name = "pytest-timeout (--timeout=5, 1.5 s a reply" + (", -n 2)" if xdist else ")")
    assert_cell(name, cell, baseline, counts)


def html_rows(path: Path) -> dict[str, list[dict[str, Any]]]:
    """pytest-html's rows per test id, from the JSON blob its report embeds."""
    found = re.search(r'data-jsonblob="([^"]*)"', path.read_text(encoding="utf-8"))
    assert found, "pytest-html wrote no data blob"
    tests: dict[str, list[dict[str, Any]]] = json.loads(html.unescape(found.group(1)))["tests"]
    return tests


def test_html(baseline: Cell, cell_dir: Path) -> None:
    cell = run_cell(cell_dir, "--html=report.html", "--self-contained-html")
    counts = cell.counts()
    assert counts == eval_counts(cell.ledger(), UNITS), cell.out
    report = (cell.root / "report.html").read_text(encoding="utf-8")
    assert ">Verdict</th>" in report
    rows = html_rows(cell.root / "report.html")
    last = {test: entries[-1] for test, entries in rows.items()}
    # Its own figures: a result per test (a near_match is one of its skips) ...
    results = Counter(entry["result"] for entry in last.values())
    assert results == {"Passed": 3 + UNITS, "Failed": 1, "Skipped": 1}
    # ... and our column: the ledger's verdict beside each eval item, empty beside a unit test.
    verdicts = {test.rsplit("::", 1)[-1]: entry["verdict"] for test, entry in last.items()}
    scores = {key[0]: s.verdict for key, s in ledger_reader.read_run(cell.run_dir).scores().items()}
    assert {q: verdicts[q] for q in QIDS} == scores
    assert {verdicts[f"test_unit_{i}"] for i in range(UNITS)} == {""}
    assert_cell("pytest-html (--html)", cell, baseline, counts)


def test_cov(baseline: Cell, cell_dir: Path) -> None:
    cell = run_cell(cell_dir, "--cov=pytest_evalloop.items", "--cov-report=term")
    counts = cell.counts()
    assert counts == eval_counts(cell.ledger(), UNITS), cell.out
    assert re.search(r"^TOTAL\s+\d+\s+\d+\s+\d+%$", cell.out, re.M), cell.out  # its own table
    assert_cell("pytest-cov (--cov)", cell, baseline, counts)


def test_json_report(baseline: Cell, cell_dir: Path) -> None:
    cell = run_cell(cell_dir, "--json-report", "--json-report-file=report.json")
    counts = cell.counts()
    assert counts == eval_counts(cell.ledger(), UNITS), cell.out
    report = json.loads((cell.root / "report.json").read_text(encoding="utf-8"))
    summary = {k: v for k, v in report["summary"].items() if k not in ("total", "collected")}
    assert summary == counts  # its summary counts our outcome words too
    read = ledger_reader.read_run(cell.run_dir)
    runs_verdicts = {key[0]: s.verdict for key, s in read.scores().items()}
    for test in report["tests"]:
        if "cases.jsonl::" not in test["nodeid"]:
            assert "user_properties" not in test
            continue
        qid = test["nodeid"].rsplit("::", 1)[-1]
        props = {k: v for p in test["user_properties"] for k, v in p.items()}
        assert props["evalloop_verdict"] == runs_verdicts[qid]
        assert props["evalloop_run_id"] == cell.run_dir.name
        assert props["evalloop_contaminated"] is False
        assert props["evalloop_cost_usd"] > 0 and props["evalloop_tokens"] > 0
        # The report's duration of the call is the attempt's wall time, not the wait for it.
        assert test["call"]["duration"] == props["evalloop_wall_seconds"]
    assert_cell("pytest-json-report (--json-report)", cell, baseline, counts)


SUGAR_LINE = re.compile(r"^\s+(\d+) (passed|failed|error|skipped|rerun|xfailed|xpassed)$", re.M)


DISPLAY_PROBE = """
def pytest_runtestloop(session):
    display = session.config.pluginmanager.get_plugin("evalloop-progress")
    with open("display.registered", "w") as f:
        f.write(str(display is not None))
"""


def test_sugar(baseline: Cell, cell_dir: Path) -> None:
    with_sugar = CHILD_ADDOPTS.replace(NO_SUGAR, "")
    cell = run_cell(cell_dir, "--force-sugar", conftest=DISPLAY_PROBE, addopts=with_sugar)
    results = cell.out.split("Results (", 1)[1]
    counts = {word: int(n) for n, word in SUGAR_LINE.findall(results)}
    # Its own figures count by pytest's outcomes: a near_match is one of its skips.
    assert counts == {"passed": 3 + UNITS, "failed": 1, "skipped": 1}, cell.out
    # Its reporter replaced pytest's and draws its own bar: evalloop's display stays off.
    assert (cell.root / "display.registered").read_text() == "False"
    assert_cell("pytest-sugar (--force-sugar)", cell, baseline, counts)


def eval_order(out: str) -> list[str]:
    """The eval items in the order `-v` reported them."""
    return re.findall(r"^\S*cases\.jsonl::(\w+) [A-Z_]+.*\[\s*\d+%\]$", out, re.M)


def test_randomly(baseline: Cell, cell_dir: Path, tmp_path: Path) -> None:
    shuffling = CHILD_ADDOPTS.replace("-p no:randomly", "")
    cell = run_cell(cell_dir, "-v", f"--randomly-seed={SEED}", addopts=shuffling)
    counts = cell.counts()
    assert counts == eval_counts(cell.ledger(), UNITS), cell.out
    assert f"Using --randomly-seed={SEED}" in cell.out  # its own header
    assert eval_order(cell.out) == QIDS  # eval items in file order
    assert cell.unit_order() != sorted(cell.unit_order())  # the unit tests it shuffled
    # The seed does reorder the eval items when the user lets it (--eval-order=plugins).
    collected = forkserver.run_pytest(
        [sys.executable, "-m", "pytest", str(cell.set_dir), "--co", "-q", "-p", "no:cacheprovider"]
        + [f"--randomly-seed={SEED}", "--eval-order=plugins"],
        cwd=cell.root,
        env={**os.environ, "PYTEST_ADDOPTS": shuffling},
        timeout=300,
    )
    shuffled = re.findall(r"cases\.jsonl::(\w+)$", collected.stdout, re.M)
    assert sorted(shuffled) == sorted(QIDS) and shuffled != QIDS, collected.stdout
    assert_cell(f"pytest-randomly (--randomly-seed={SEED})", cell, baseline, counts)


def test_repeat(baseline: Cell, cell_dir: Path) -> None:
    cell = run_cell(cell_dir, "--count", "2")
    counts = cell.counts()
    # Its own figure: each unit test ran twice. The eval items ran once, and it says so.
    assert counts == eval_counts(cell.ledger(), 2 * UNITS), cell.out
    assert "pytest-repeat (--count=2) does not repeat evalloop's eval items" in cell.out
    assert "--eval-samples=2" in cell.out
    assert_cell("pytest-repeat (--count 2)", cell, baseline, counts)


def test_all_together(baseline: Cell, cell_dir: Path) -> None:
    every_plugin = CHILD_ADDOPTS.replace("-p no:randomly", "").replace(NO_SUGAR, "")
    cell = run_cell(
        cell_dir,
        "-n",
        "2",
        "--reruns",
        "1",
        "--timeout=60",
        "--html=report.html",
        "--self-contained-html",
        "--cov=pytest_evalloop.items",
        "--cov-report=term",
        "--json-report",
        "--json-report-file=report.json",
        "--force-sugar",
        f"--randomly-seed={SEED}",
        "--count",
        "2",
        addopts=every_plugin,
    )
    results = cell.out.split("Results (", 1)[1]
    counts = {word: int(n) for n, word in SUGAR_LINE.findall(results)}
    assert counts == {"passed": 3 + 2 * UNITS, "failed": 1, "skipped": 1, "rerun": 1}, cell.out
    report = json.loads((cell.root / "report.json").read_text(encoding="utf-8"))
    summary = {k: v for k, v in report["summary"].items() if k not in ("total", "collected")}
    assert summary == eval_counts(cell.ledger(), 2 * UNITS)  # a test per line: its last outcome
    assert ">Verdict</th>" in (cell.root / "report.html").read_text(encoding="utf-8")
    assert re.search(r"^TOTAL\s+\d+\s+\d+\s+\d+%$", cell.out, re.M)
    assert f"Using --randomly-seed={SEED}" in cell.out
    assert "does not repeat evalloop's eval items" in cell.out
    assert_cell("all of them together (-n 2)", cell, baseline, counts)


# --- pytest-rerunfailures' own count, on plain tests ----------------------------------------

FLAKY = """
import os

def test_steady():
    pass

def test_flaky():
    marker = os.path.join(os.environ["FLAKY_DIR"], "ran")
    runs = int(open(marker).read()) if os.path.exists(marker) else 0
    open(marker, "w").write(str(runs + 1))
    assert runs == 1  # fails on its first run and on its third, passes on its second
"""


@pytest.mark.parametrize(
    "xdist", [["-p", "no:xdist"], [], ["-n", "2"]], ids=["no-xdist", "xdist-installed", "n2"]
)
def test_the_rerun_count_survives_with_and_without_xdist(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, xdist: list[str]
) -> None:
    """Issue 48's first repro: the crash-rerun hook wiped every `N rerun` count wherever xdist
    was installed, unit tests included."""
    pytester.makepyfile(test_flaky=FLAKY)
    monkeypatch.setenv("FLAKY_DIR", str(pytester.path))
    result = pytester.runpytest_subprocess("--reruns", "2", "-p", "no:cacheprovider", *xdist)
    assert result.parseoutcomes() == {"passed": 2, "rerun": 1}, result.stdout.str()


PROBE = """
def pytest_sessionstart(session):
    plugin = session.config.pluginmanager.get_plugin("evalloop-crash-reruns")
    if not hasattr(session.config, "workerinput"):
        print("CRASH RERUNS", plugin is not None)
"""


@pytest.mark.parametrize(("args", "registered"), [([], False), (["-n", "2"], True)])
def test_the_crash_rerun_hook_is_registered_only_under_workers(
    pytester: pytest.Pytester, args: list[str], registered: bool
) -> None:
    pytester.makeconftest(PROBE)
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", *args)
    assert f"CRASH RERUNS {registered}" in result.stdout.str()


def test_the_crash_rerun_hook_words_only_its_own_reports() -> None:
    hook = sharding.CrashReruns()
    theirs = SimpleNamespace(outcome="rerun")  # pytest-rerunfailures'
    assert hook.pytest_report_teststatus(theirs) is None  # type: ignore[arg-type]
    ours = SimpleNamespace(outcome="failed", nodeid="x")
    sched = SimpleNamespace(workqueue={"unit": {"x": False}}, assigned_work={})
    hook.pytest_handlecrashitem("x", ours, sched)  # type: ignore[arg-type]
    assert ours.outcome == "rerun"
    assert hook.pytest_report_teststatus(ours) == ("", "R", "RERUN")  # type: ignore[arg-type]


def test_runs_workers_is_xdist_with_workers() -> None:
    def config(**option: Any) -> Any:
        return SimpleNamespace(option=SimpleNamespace(**option))

    assert sharding.runs_workers(config(dist="load", tx=["popen"] * 2))
    assert not sharding.runs_workers(config(dist="no", tx=[]))
    assert not sharding.runs_workers(config())  # xdist not installed
    worker = config(dist="load", tx=["popen"])
    worker.workerinput = {}
    assert not sharding.runs_workers(worker)


# --- pytest-timeout stopping an eval item -------------------------------------------------

HANG = """
import threading

import pytest

@pytest.fixture(autouse=True)
def hang_in_teardown(request):
    yield
    if request.node.name == {qid!r}:
        threading.Event().wait()  # only pytest-timeout ends this
"""


def test_a_pytest_level_timeout_of_a_scored_case_is_counted_and_named(cell_dir: Path) -> None:
    cell_dir.mkdir(parents=True)
    set_dir = make_set(cell_dir, QIDS)
    (set_dir / "conftest.py").write_text(HANG.format(qid=QIDS[4]))
    with FakeAnthropic(spec(set_dir, judge_script(set_dir)).policy()) as fake:
        out = child_run(fake, cell_dir, set_dir, "-q", "--timeout=3").stdout
    # pytest counts the case's teardown as an error; the summary names it with its verdict.
    # (The conftest's function-scoped fixture keeps the set one at a time: one warning says so.)
    assert pytest.RunResult.parse_summary_nouns(out.splitlines()) == {
        "passed": 3,
        "failed": 1,
        "near_match": 1,
        "errors": 1,
        "warnings": 1,
    }, out
    section = out.split("evalloop: stopped by pytest-timeout", 1)[1]
    assert "1 eval item(s) stopped by pytest-timeout, 1 of them scored in the ledger" in section
    assert f"{QIDS[4]}: teardown (Timeout (>3.0s) from pytest-timeout.); scored match" in section


# --- the pure parts ---------------------------------------------------------------------


def test_report_duration_moves_the_wait_to_the_attempt() -> None:
    timing = otherplugins._Timing(waited=7.0, wall=5.0)
    assert otherplugins.report_duration("setup", 7.5, False, timing) == 0.5
    assert otherplugins.report_duration("call", 0.001, False, timing) == 5.0
    assert otherplugins.report_duration("setup", 7.5, True, timing) == 5.5  # no call follows
    assert otherplugins.report_duration("teardown", 0.2, False, timing) == 0.2
    carried = otherplugins._Timing(waited=0.1, wall=None)
    assert otherplugins.report_duration("call", 0.001, False, carried) == 0.001


def test_in_file_order_refills_the_eval_slots_only() -> None:
    order = {"q1": 0, "q2": 1, "q3": 2}
    shuffled = ["u1", "q3", "u2", "q1", "q2", "u3"]
    assert otherplugins.in_file_order(shuffled, order.get) == ["u1", "q1", "u2", "q2", "q3", "u3"]


def test_repeat_requests_name_the_plugin_and_the_samples_option() -> None:
    assert otherplugins.repeat_requests(SimpleNamespace(count=1)) == []
    [message] = otherplugins.repeat_requests(SimpleNamespace(count=3))
    assert "pytest-repeat (--count=3)" in message and "--eval-samples=3" in message
    flakes = SimpleNamespace(flake_finder_enable=True, flake_runs=5)
    [message] = otherplugins.repeat_requests(flakes)
    assert "pytest-flakefinder" in message and "--eval-samples=5" in message
    flakes.flake_finder_enable = False
    assert otherplugins.repeat_requests(flakes) == []


def test_user_properties_are_json_values_and_tokens_sum_both_roles() -> None:
    from pytest_evalloop.answer.pipeline import ItemResult

    result = ItemResult(
        qid="q",
        sample=None,
        status="no_match",
        verdict="no_match",
        why=f"off by one; the answer quoted {SECRET}",
        run_dir="/runs/shop-baseline-01",
        answerer_usage={"input_tokens": 10, "output_tokens": 2, "cache_read_tokens": 5},
        judge_usage={"input_tokens": 7, "output_tokens": 1, "cache_creation_tokens": 3},
        answerer_cost=0.25,
        judge_cost=0.5,
        wall_seconds=4.5,
    )
    props = dict(otherplugins.user_properties(result, [SECRET]))
    assert props == {
        "evalloop_status": "no_match",
        "evalloop_verdict": "no_match",
        "evalloop_why": f"off by one; the answer quoted {REDACTED}",
        "evalloop_cost_usd": 0.75,
        "evalloop_tokens": 28,
        "evalloop_contaminated": False,
        "evalloop_run_id": "shop-baseline-01",
        "evalloop_wall_seconds": 4.5,
        "evalloop_carried": False,
    }
    json.dumps(props)


def test_the_verdict_column_word() -> None:
    assert otherplugins.verdict_word(SimpleNamespace()) == ""
    near = SimpleNamespace(evalloop={"status": "near_match", "reason": ""})
    assert otherplugins.verdict_word(near) == "near_match"
    aborted = SimpleNamespace(evalloop={"status": "unscored", "reason": "aborted"})
    assert otherplugins.verdict_word(aborted) == "aborted"


def test_a_replaced_terminal_is_told_from_pytests_own() -> None:
    from _pytest.terminal import TerminalReporter

    class Sugary(TerminalReporter):
        pass

    plain = TerminalReporter.__new__(TerminalReporter)
    assert not otherplugins.replaced_terminal(plain)
    assert otherplugins.replaced_terminal(Sugary.__new__(Sugary))
    assert not otherplugins.replaced_terminal(None)


def test_a_rerun_of_a_contaminated_case_shows_its_reasons_again(cell_dir: Path) -> None:
    cell_dir.mkdir(parents=True)
    set_dir = make_set(cell_dir, QIDS[:1])
    gold_read = [
        {
            "tool": "execute_query",
            "input": {"sql": "SELECT * FROM read_text('evals/shop/cases.jsonl')"},
        },
        {"text": "I looked it up.\n\nFinal query:\n```sql\nSELECT 1\n```"},
    ]
    with FakeAnthropic(spec(set_dir, answerer={"default": gold_read}).policy()) as fake:
        out = child_run(fake, cell_dir, set_dir, "-q", "--reruns=1").stdout
        answered = len(fake.calls("answerer"))
    assert pytest.RunResult.parse_summary_nouns(out.splitlines()) == {"errors": 1, "rerun": 1}, out
    assert answered == 2  # two turns, once: the rerun answered nothing
    error = out.split("= ERRORS =", 1)[1]
    assert "question:" in error and "contaminated: " in error, out
    assert "evals/shop/cases.jsonl" in error.split("contaminated: ", 1)[1]  # the reason
    assert "scored already in this run" in error
