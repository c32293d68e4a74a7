"""Whole runs through the loopback fake endpoint: outcomes, events, faults, aborts, secrets.

Everything real but the model's thinking: the anthropic SDK over HTTP to the fake, the embedded
MCP server through the mcp client, DuckDB, pytest-xdist.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from tests.conftest import EXAMPLE_SET, SECRET

QIDS = [
    "ecom_accounts_never_ordered",
    "ecom_average_order_value",
    "ecom_avg_days_to_ship",
    "ecom_cancellation_rate",
    "ecom_order_count",
    "ecom_sales_2022",
]


def _example_rows() -> dict[str, dict[str, Any]]:
    rows = {}
    for line in (EXAMPLE_SET / sets.CASES_FILE).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        rows[row["qid"]] = row
    return rows


@pytest.fixture(scope="module")
def example_rows() -> dict[str, dict[str, Any]]:
    rows = _example_rows()
    missing = [q for q in QIDS if q not in rows]
    assert not missing, f"the example set lost cases this test relies on: {missing}"
    return rows


def make_set(root: Path, qids: list[str]) -> Path:
    """A small copy of the example set holding only `qids` (same model, same data)."""
    target = root / "evals" / "shop"
    target.mkdir(parents=True)
    for name in ("set.json", "model.json"):
        shutil.copy(EXAMPLE_SET / name, target / name)
    rows = _example_rows()
    lines = [json.dumps(rows[q]) for q in qids]
    (target / sets.CASES_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


ORACLE = [
    {"tool": "get_context", "input": {"query": "{question}"}},
    {"tool": "execute_query", "input": {"sql": "{modelQuery}"}},
    {"text": "The answer follows.\n\nFinal query:\n```sql\n{modelQuery}\n```"},
]


def spec(set_dir: Path, judge: dict[str, Any] | None = None, **extra: Any) -> ScriptSpec:
    data: dict[str, Any] = {
        "cases_file": str(set_dir / sets.CASES_FILE),
        "answerer": {"default": ORACLE},
        "judge": judge or {"default": {"verdict": "match", "confidence": 9}},
        **extra,
    }
    return ScriptSpec.model_validate(data)


def run(pytester: pytest.Pytester, set_dir: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(str(set_dir), "-p", "no:cacheprovider", "-rA", *args)


def only_run(set_dir: Path) -> Path:
    [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
    return run_dir


def verdicts(run_dir: Path) -> dict[str, str | None]:
    read = ledger_reader.read_run(run_dir)
    return {key[0]: score.verdict for key, score in read.scores().items()}


def test_each_scripted_verdict_is_the_right_outcome_and_one_score(
    pytester: pytest.Pytester,
    fake: FakeAnthropic,
    example_rows: dict[str, Any],
    plugin_args: list[str],
) -> None:
    set_dir = make_set(pytester.path, QIDS)
    q = {qid: example_rows[qid]["question"] for qid in QIDS}
    judge = {
        "default": {"verdict": "match", "confidence": 9},
        "by_question": {
            q[QIDS[1]]: {"verdict": "no_match", "confidence": 9, "why": "summed all statuses"},
            q[QIDS[2]]: {
                "verdict": "near_match",
                "confidence": 7,
                "why": "tie broken the other way",
            },
            q[QIDS[3]]: {"verdict": "match", "confidence": 4, "why": "unsure"},
            q[QIDS[4]]: ["no verdict here", {"text": "still {not json"}, "nothing"],
        },
    }
    gold_read = [
        {
            "tool": "execute_query",
            "input": {"sql": "SELECT * FROM read_text('evals/shop/cases.jsonl')"},
        },
        {"text": "I looked it up.\n\nFinal query:\n```sql\nSELECT 1\n```"},
    ]
    fake.policy = spec(
        set_dir, judge, answerer={"default": ORACLE, "by_question": {q[QIDS[5]]: gold_read}}
    ).policy()
    result = run(pytester, set_dir, *plugin_args)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1, result.stdout.str()
    assert outcomes.get("failed") == 1
    assert outcomes.get("near_match") == 1
    assert outcomes.get("needs_human") == 2
    assert outcomes.get("errors") == 1
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    run_dir = only_run(set_dir)
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    scores = read.scores()
    assert len(read.of_kind("score")) == len(QIDS) == len(scores)
    by_qid = {key[0]: s for key, s in scores.items()}
    assert by_qid[QIDS[0]].verdict == "match"
    assert by_qid[QIDS[1]].verdict == "no_match"
    assert by_qid[QIDS[2]].verdict == "near_match"
    assert by_qid[QIDS[3]].verdict == "needs_human"
    assert (by_qid[QIDS[4]].verdict, by_qid[QIDS[4]].reason) == ("needs_human", "judge_unparseable")
    assert by_qid[QIDS[4]].judge_attempts == 3
    assert (by_qid[QIDS[5]].verdict, by_qid[QIDS[5]].contaminated) == (None, True)
    assert by_qid[QIDS[5]].reason == "contaminated"
    out = result.stdout.str()
    assert "summed all statuses" in out  # the no_match report carries the judge's why
    assert "contaminated" in out
    assert "pass rate: withheld" in out
    assert ledger_reader.read_run_info(run_dir).status == "complete"


def test_faults_are_survived_and_no_secret_is_written(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = make_set(pytester.path, QIDS[:3])
    faults = [
        {"role": "answerer", "status": 529, "retry_after": 0, "times": 2},
        {"role": "judge", "status": 429, "retry_after": 0, "times": 2},
        {"role": "answerer", "status": 500, "retry_after_ms": 1, "times": 1, "after": 2},
    ]
    fake.policy = spec(set_dir, faults=faults).policy()
    result = run(pytester, set_dir)
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=3)
    assert sum(1 for r in fake.requests if r.status != 200) == 5
    run_dir = only_run(set_dir)
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(encoding="utf-8", errors="replace"), path
    assert all(
        "x-api-key" not in r.headers or SECRET not in r.headers["x-api-key"] for r in fake.requests
    )


def test_four_consecutive_endpoint_failures_abort_the_run(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = make_set(pytester.path, QIDS)
    fake.policy = spec(set_dir, down={"status": 503, "times": 1}).policy()
    result = run(pytester, set_dir, "--eval-retries=0", "--eval-concurrency=1")
    outcomes = result.parseoutcomes()
    assert outcomes.get("errors") == 4, result.stdout.str()
    assert outcomes.get("aborted") == 2
    run_dir = only_run(set_dir)
    info = ledger_reader.read_run_info(run_dir)
    assert info.status == "aborted"
    assert "4 consecutive harness errors" in (info.abort_reason or "")
    assert "HTTP 503" in result.stdout.str()
    assert ledger_reader.read_run(run_dir).errors == []
    assert "pass rate: withheld (the run aborted" in result.stdout.str()


def test_plain_and_two_workers_give_the_same_verdicts(
    pytester: pytest.Pytester, fake: FakeAnthropic, example_rows: dict[str, Any]
) -> None:
    set_dir = make_set(pytester.path, QIDS[:5])
    judge = {
        "default": {"verdict": "match"},
        "by_question": {example_rows[QIDS[1]]["question"]: {"verdict": "no_match"}},
    }
    fake.policy = spec(set_dir, judge).policy()
    plain = run(pytester, set_dir, "--eval-label=plain")
    two = run(pytester, set_dir, "-n", "2", "--eval-label=two")
    assert plain.ret == two.ret == pytest.ExitCode.TESTS_FAILED
    runs_dir = set_dir / "runs"
    assert verdicts(runs_dir / "plain") == verdicts(runs_dir / "two")
    assert ledger_reader.read_run(runs_dir / "two").errors == []
    assert len(verdicts(runs_dir / "two")) == 5


def test_the_whole_example_set_runs_under_two_workers(
    pytester: pytest.Pytester, fake: FakeAnthropic, tmp_path: Path
) -> None:
    fake.policy = spec(EXAMPLE_SET).policy()
    runs_dir = tmp_path / "runs"
    result = pytester.runpytest_subprocess(
        str(EXAMPLE_SET), "-n", "2", f"--eval-runs-dir={runs_dir}"
    )
    assert result.ret == 0, result.stdout.str()
    [run_dir] = [p for p in runs_dir.iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    cases = sets.load_cases(EXAMPLE_SET).rows
    assert read.errors == [] and len(read.scores()) == len(cases)
    assert {s.verdict for s in read.scores().values()} == {"match"}
    info = read.info
    assert info is not None and info.dataset_sha == sets.dataset_sha(EXAMPLE_SET)
    # Calls are requests (issue 25 (7)): one per turn of each answer, not one per case.
    turns = sum(a.num_turns or 0 for a in read.attempts().values())
    assert info.costs["answerer"].calls == turns > len(cases) and info.costs["judge"].cost_usd


def test_a_golden_stored_as_a_path_is_what_the_judge_and_the_report_see(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    qid = "ecom_orders_by_status"
    set_dir = make_set(pytester.path, [qid])
    path = set_dir / sets.CASES_FILE
    row = json.loads(path.read_text(encoding="utf-8"))
    rows = row["golden"].pop("value")
    row["golden"]["path"] = f"gold/{qid}.json"
    (set_dir / "gold").mkdir()
    (set_dir / "gold" / f"{qid}.json").write_text(json.dumps(rows), encoding="utf-8")
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    inner = spec(set_dir, {"default": {"verdict": "no_match", "confidence": 9}}).policy()
    judged: list[str] = []

    def policy(request: Any) -> Any:
        if request.role == "judge":
            judged.append(json.dumps(request.messages))
        return inner(request)

    fake.policy = policy
    result = run(pytester, set_dir)
    result.assert_outcomes(failed=1)
    [prompt] = judged
    assert "54749" in prompt and "10825" in prompt  # the artifact's rows, not "null"
    out = result.stdout.str()
    assert f"(from gold/{qid}.json)" in out and '"orders": 54749' in out


def _rows(set_dir: Path) -> list[dict[str, Any]]:
    path = set_dir / sets.CASES_FILE
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _write_rows(set_dir: Path, rows: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (set_dir / sets.CASES_FILE).write_text(text, encoding="utf-8")


def _plant_drift(set_dir: Path, qid: str) -> None:
    rows = _rows(set_dir)
    for row in rows:
        if row["qid"] == qid:
            value = row["golden"]["value"]
            key = next(k for k in value if k not in ("round", "currency"))
            value[key] = value[key] + 1
    _write_rows(set_dir, rows)


def test_a_clean_golden_check_is_recorded_on_the_run(
    pytester: pytest.Pytester, fake: FakeAnthropic, plugin_args: list[str]
) -> None:
    set_dir = make_set(pytester.path, QIDS)
    fake.policy = spec(set_dir).policy()
    result = run(pytester, set_dir, "-k", "not ecom_sales_2022", *plugin_args)
    assert result.ret == 0, result.stdout.str()
    check = f"golden check: {len(QIDS) - 1} ok, 0 drifted, 0 other finding(s)"
    assert check in result.stdout.str()
    info = ledger_reader.read_run_info(only_run(set_dir))
    assert info.golden_check is not None
    assert info.golden_check.startswith(f"{len(QIDS) - 1} ok, 0 drifted, 0 other finding(s)")
    assert f"of {len(QIDS)} in the set" in info.golden_check


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["plain", "n2"])
def test_a_drifted_golden_stops_the_run_before_any_answer(
    pytester: pytest.Pytester, fake: FakeAnthropic, workers: list[str]
) -> None:
    set_dir = make_set(pytester.path, QIDS)
    _plant_drift(set_dir, "ecom_order_count")
    fake.policy = spec(set_dir).policy()
    result = run(pytester, set_dir, *workers)
    out = result.stdout.str()
    assert result.ret == 7, out  # EXIT_HARNESS_FAILURE: the run cannot be measured
    assert f"golden check: {len(QIDS) - 1} ok, 1 drifted, 0 other finding(s)" in out
    assert "drifted: ecom_order_count: route canonical" in out
    assert "stopping before answering" in out and "--eval-allow-golden-drift" in out
    assert fake.calls() == []
    assert not (set_dir / "runs").exists()


def test_allowing_golden_drift_runs_and_says_so_in_run_json(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = make_set(pytester.path, QIDS)
    _plant_drift(set_dir, "ecom_order_count")
    fake.policy = spec(set_dir).policy()
    pytester.makeini("[pytest]\neval_allow_golden_drift = true\n")  # the ini twin
    result = run(pytester, set_dir)
    assert result.ret == 0, result.stdout.str()
    assert "--eval-allow-golden-drift: the run goes ahead" in result.stdout.str()
    info = ledger_reader.read_run_info(only_run(set_dir))
    assert info.golden_check is not None and "1 drifted" in info.golden_check
    assert info.golden_check.endswith("started anyway (--eval-allow-golden-drift)")


def test_a_golden_the_truth_cannot_derive_is_could_not_verify_and_stops_the_run(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = make_set(pytester.path, QIDS)
    rows = _rows(set_dir)
    for row in rows:
        if row["qid"] == "ecom_order_count":  # a truth table that is not there
            row["golden"]["canonicalQuery"] = "SELECT count(*) AS orders FROM no_such_table"
    _write_rows(set_dir, rows)
    fake.policy = spec(set_dir).policy()
    result = run(pytester, set_dir)
    out = result.stdout.str()
    assert result.ret == 7, out
    counts = f"{len(QIDS) - 1} ok, 0 drifted, 1 could not be verified, 0 other finding(s)"
    assert f"golden check: {counts}" in out
    assert "could not verify: ecom_order_count: route canonical: could not verify: the " in out
    assert "no_such_table" in out and "drifted: ecom_order_count" not in out
    assert fake.calls() == [] and not (set_dir / "runs").exists()


def test_a_selection_with_nothing_to_answer_exits_9_with_the_command_that_fixes_it(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = make_set(pytester.path, QIDS)
    rows = _rows(set_dir)
    for row in rows:
        row["golden"]["status"] = "provisional"
    _write_rows(set_dir, rows)
    fake.policy = spec(set_dir).policy()
    result = run(pytester, set_dir, "-k", "ecom_order_count or ecom_sales_2022")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 9, out  # EXIT_NOTHING_TO_ANSWER
    [why] = [x for x in out.splitlines() if "evalloop: nothing to answer:" in x]
    assert "all 2 selected case(s) of ecommerce have a golden that cannot be scored" in why
    assert "(2 golden_provisional)" in why
    assert f'`evalloop golden attest {set_dir} --all-provisional --by "<name>"`' in why
    assert fake.calls() == [] and not (set_dir / "runs").exists()
    # One scorable case in the selection: it is answered, and the session is not stopped.
    rows[0]["golden"]["status"] = "verified"
    _write_rows(set_dir, rows)
    result = run(pytester, set_dir, "-k", f"{rows[0]['qid']} or ecom_sales_2022")
    assert result.ret == 0, result.stdout.str()
