"""Whole runs of `evals/ecommerce-malloy` on the malloy target, with the fake endpoint.

The answerer is scripted with each case's `modelQuery` as its final query; the plugin starts
the real server (the real compiler on DuckDB), re-executes every final query through it, runs
the golden check on the truth package's own server and scores every scorable case. One case's
final query is broken on purpose: it is a scored no_match whose compiler error reached the
judge, not a harness error.

Each run answers a few cases of a copy of the set (one of each kind: scalar, rows, a date
figure, unanswerable, a provisional golden, the broken query): what a run does per case is the
same for 6 cases as for 49, and every one of the set's queries compiling and running through
the real server is test_malloy_target's business. The generated tables are linked from the
cache (tools/gen_malloy_data.py, once per machine), never regenerated per test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from pytest_evalloop.testing.policies import FakeRequest
from tests.conftest import SECRET
from tests.querygate import wait_exited
from tests.test_malloy_target import SET_DIR, ensure_set_data

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="the malloy target needs node and npm on PATH (install Node.js 20+)",
)

BROKEN_QID = "ecom_order_count"
BROKEN_QUERY = "run: order_items -> { aggregate: orders_placed_total }"
COMPILER_SAYS = "query:1:34: 'orders_placed_total' is not defined"
NO_MATCH = {"verdict": "no_match", "why": "the final query does not compile"}
CONTEXT = {"environmentName": "local", "packageName": "ecommerce", "query": "{question}"}
QUERY = {"environmentName": "local", "packageName": "ecommerce", "modelPath": "ecommerce.malloy"}
RUN_QIDS = (
    "ecom_customer_count",
    BROKEN_QID,
    "ecom_revenue_by_channel",
    "ecom_yoy",
    "ecom_roas",
    "ecom_top_categories",
)
"""scalar, the broken one, rows, a date figure, unanswerable, provisional (not answered)."""
KILL_QIDS = (
    "ecom_customer_count",
    "ecom_2022_sales_formal",
    "ecom_completed_revenue",
    "ecom_lifetime_spend",
    "ecom_profit",
    "ecom_return_rate",
)
"""Six verified cases, run one at a time: the server is killed when the 2nd and the 4th ask."""


def _copy_set(dest: Path, qids: tuple[str, ...]) -> Path:
    """The set with only `qids` (in this order); its 60 MB of data is linked, not copied."""
    ensure_set_data()
    shutil.copyfile(SET_DIR / "set.json", dest / "set.json")
    rows = {
        json.loads(line)["qid"]: line
        for line in (SET_DIR / "cases.jsonl").read_text(encoding="utf-8").splitlines()
    }
    (dest / "cases.jsonl").write_text("".join(rows[q] + "\n" for q in qids), encoding="utf-8")
    for package in ("ecommerce", "ecommerce-truth"):
        (dest / package).mkdir()
        for path in (SET_DIR / package).iterdir():
            if path.suffix in (".malloy", ".json"):
                shutil.copyfile(path, dest / package / path.name)
    (dest / "ecommerce" / "data").symlink_to(SET_DIR / "ecommerce" / "data")
    (dest / "ecommerce-truth" / "data").symlink_to("../ecommerce/data")
    return dest


def _rows(set_dir: Path) -> list[dict[str, Any]]:
    lines = (set_dir / "cases.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def _oracle(set_dir: Path, broken_question: str | None = None) -> dict[str, object]:
    answer = [
        {"tool": "malloy_getContext", "input": CONTEXT},
        {"tool": "malloy_executeQuery", "input": {**QUERY, "query": "{modelQuery}"}},
        {"text": "Here it is.\n\nFinal query:\n```malloy\n{modelQuery}\n```"},
    ]
    broken = [
        {"tool": "malloy_executeQuery", "input": {**QUERY, "query": BROKEN_QUERY}},
        {"text": f"Done.\n\nFinal query:\n```malloy\n{BROKEN_QUERY}\n```"},
    ]
    by_question = {broken_question: broken} if broken_question else {}
    return {
        "cases_file": str(set_dir / "cases.jsonl"),
        "answerer": {"default": answer, "by_question": by_question},
        # no_match only where the judge's text holds the compiler's own message: a judge not
        # shown the re-execution error would say match.
        "judge": {"default": {"verdict": "match"}, "by_substring": {COMPILER_SAYS: NO_MATCH}},
    }


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
        yield server


def test_the_malloy_set_runs_end_to_end_through_the_real_compiler(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = _copy_set(pytester.mkdir("ecommerce-malloy"), RUN_QIDS)
    rows = _rows(set_dir)
    question = next(r["question"] for r in rows if r["qid"] == BROKEN_QID)
    scorable = [r["qid"] for r in rows if r["golden"]["status"] == "verified"]
    assert len(scorable) == len(RUN_QIDS) - 1  # the provisional one is not answered
    fake.policy = ScriptSpec.model_validate(_oracle(set_dir, question)).policy()
    result = pytester.runpytest_subprocess(str(set_dir), "-p", "no:cacheprovider", "-rA")
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == len(scorable) - 1, out
    assert outcomes.get("failed") == 1 and outcomes.get("errors") is None, out
    assert outcomes.get("unscored") == 1, out  # the provisional golden, not answered
    # The check ran on the truth package: nothing drifted, every golden proven two ways.
    assert "golden check: 4 ok, 0 drifted, 0 other finding(s)" in out
    [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    info = read.info
    assert info is not None and info.target == "malloy:ecommerce-malloy/ecommerce"
    assert info.target_version == "@malloydata/malloy 0.0.431"
    assert info.model_sha is not None and len(info.model_sha) == 64
    assert info.golden_check is not None and "drifted" in info.golden_check
    verdicts = {k[0]: s.verdict for k, s in read.scores().items()}
    assert set(verdicts) == set(scorable)
    assert verdicts[BROKEN_QID] == "no_match"
    assert {v for q, v in verdicts.items() if q != BROKEN_QID} == {"match"}
    attempts = {k[0]: a for k, a in read.attempts().items()}
    assert attempts["ecom_customer_count"].model_sha == info.model_sha  # the server's own pin
    assert attempts[BROKEN_QID].submitted and attempts[BROKEN_QID].final_query == BROKEN_QUERY
    assert len(fake.calls("judge")) == len(scorable)


def _answerer_servers(root: Path) -> list[int]:
    """Pids of the Malloy servers serving `root` (the answerer's: `--check` runs are not)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        served = any(a.endswith("server.mjs") for a in args) and "--check" not in args
        if served and state != "Z" and str(root) in args:
            found.append(int(proc.name))
    return found


class KillingPolicy:
    """The oracle, but the answerer's server is SIGKILLed when chosen questions first ask.

    The kill happens inside the fake's handling of that case's first answerer request, before
    its reply (a tool call) goes out: the call lands on a dead server, whatever the timing.
    """

    def __init__(self, inner: Any, root: Path, questions: set[str]) -> None:
        self.inner, self.root, self.questions = inner, root, questions
        self.killed: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, request: FakeRequest) -> Any:
        with self._lock:
            if request.role == "answerer" and request.question in self.questions:
                self.questions.discard(request.question)
                [pid] = _answerer_servers(self.root)
                os.kill(pid, signal.SIGKILL)
                wait_exited(pid)
                self.killed.append(pid)
        return self.inner(request)


def test_a_server_that_dies_is_restarted_once_then_the_run_stops(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = _copy_set(pytester.mkdir("ecommerce-malloy"), KILL_QIDS)
    rows = _rows(set_dir)
    questions = {rows[1]["question"], rows[3]["question"]}
    policy = KillingPolicy(
        ScriptSpec.model_validate(_oracle(set_dir)).policy(),
        (set_dir / "ecommerce").resolve(),
        questions,
    )
    fake.policy = policy
    result = pytester.runpytest_subprocess(
        str(set_dir), "-p", "no:cacheprovider", "-rA", "--eval-concurrency=1"
    )
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    # 1st case scored; 2nd: the server died under it; 3rd: scored on the restarted server;
    # 4th: it died again, the run's last harness error; 5th and 6th: never started.
    assert outcomes.get("passed") == 2, out
    assert outcomes.get("errors") == 2, out
    assert outcomes.get("aborted") == 2, out
    assert len(policy.killed) == 2 and len(set(policy.killed)) == 2  # a new process each time
    assert "the Malloy server died; it is restarted once for the cases that follow" in out
    assert "the Malloy server died again after its one restart, so the run stops" in out
    [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    info = read.info
    assert info is not None and info.status == "aborted"
    assert "died again after 1 restart, so the run stops" in (info.abort_reason or "")
    assert "consecutive harness errors" not in (info.abort_reason or "")
    attempts = {k[0]: a for k, a in read.attempts().items()}
    assert set(attempts) == {r["qid"] for r in rows[:4]}  # nothing after the stop was tried
    assert [bool(attempts[r["qid"]].error) for r in rows[:4]] == [False, True, False, True]
    assert {k[0] for k in read.scores()} == {rows[0]["qid"], rows[2]["qid"]}
    # Only the answerer's two scored cases and the two that died reached the endpoint.
    assert {c.question for c in fake.calls("answerer")} == {r["question"] for r in rows[:4]}


def test_a_model_that_does_not_compile_is_one_usage_error_before_anything_is_paid(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = _copy_set(pytester.mkdir("ecommerce-malloy"), RUN_QIDS)
    model = set_dir / "ecommerce" / "ecommerce.malloy"
    lines = model.read_text().splitlines()
    lines[44] = "    user_count is no_such_column.sum()"  # inside users' measure block
    model.write_text("\n".join(lines) + "\n")
    result = pytester.runpytest_subprocess(str(set_dir), "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "Traceback" not in err + result.stdout.str()
    assert f"{model}:45: " in err and "no_such_column" in err and "does not compile" in err
    assert not (set_dir / "runs").exists()
    assert fake.calls() == []
