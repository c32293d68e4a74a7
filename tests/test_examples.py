"""The conftest_examples/ files, each copied as a user's conftest.py and run for real.

Each run is a pytest subprocess over a small copy of the example set: the embedded MCP target,
DuckDB, the ledger and (where the example keeps a built-in role) the real anthropic SDK talking
to the loopback fake. Nothing is patched: what the example does is what a user gets.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from tests.conftest import MALLOY_SET, REPO
from tests.test_run import ORACLE, make_set

EXAMPLES = REPO / "conftest_examples"
# Nothing listens on the discard port: any Messages API call would fail and show as an error.
NO_ENDPOINT = "http://127.0.0.1:9"

ACCOUNTS = "ecom_customer_accounts"  # the answerer's top measure is users.user_count: 24000
SHIP_DAYS = "ecom_avg_days_to_ship"  # orders.avg_days_to_ship: 2.32
NEW_ACCOUNTS = "ecom_new_accounts_2022"  # user_count again: 24000, the golden is 5673
MULTI_ITEM = "ecom_multi_item_order_share"  # no measure with a recipe: nothing submitted
DEPARTMENTS = "ecom_department_sales_2022"  # a rows golden: the rule judge does not decide it
ROAS = "ecom_roas"  # unanswerable, and the answerer declines


def load_example(name: str) -> ModuleType:
    """Import an example conftest as a plain module (to read its constants)."""
    path = EXAMPLES / name / "conftest.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def use_example(name: str, directory: Path) -> None:
    """Install an example as the conftest.py of `directory`, as a user would copy it."""
    shutil.copy(EXAMPLES / name / "conftest.py", directory / "conftest.py")


def run(pytester: pytest.Pytester, set_dir: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(str(set_dir), "-p", "no:cacheprovider", "-rA", *args)


def only_run(set_dir: Path) -> ledger_reader.RunLedger:
    [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    assert read.errors == [], read.errors
    assert read.info is not None and read.info.status == "complete"
    return read


def by_qid(mapping: dict[tuple[str, int | None], Any]) -> dict[str, Any]:
    return {key[0]: value for key, value in mapping.items()}


def questions(set_dir: Path) -> dict[str, str]:
    return {case.qid: case.question for _, case in sets.load_cases(set_dir).rows}


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No credentials, and a base URL where nothing answers."""
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", NO_ENDPOINT)


def script(set_dir: Path, **parts: Any) -> Any:
    data = {"cases_file": str(set_dir / sets.CASES_FILE), "answerer": {"default": ORACLE}}
    data.setdefault("judge", {"default": {"verdict": "match", "confidence": 9}})
    return ScriptSpec.model_validate({**data, **parts}).policy()


# --- own answerer + own judge + hooks: a fully offline run under xdist ---------------------


def test_own_answerer_own_judge_and_hooks_run_offline_under_xdist(
    pytester: pytest.Pytester, offline: None
) -> None:
    qids = [ACCOUNTS, SHIP_DAYS, NEW_ACCOUNTS, MULTI_ITEM, DEPARTMENTS, ROAS]
    set_dir = make_set(pytester.path, qids)
    # Conftests compose, one per directory level: hooks for the whole tree, then the roles.
    use_example("hooks", pytester.path)
    use_example("own_answerer", set_dir.parent)
    use_example("own_judge", set_dir)
    out_csv, junit = pytester.path / "out" / "summary.csv", pytester.path / "junit.xml"
    out_csv.parent.mkdir()
    result = run(pytester, set_dir, "-n", "2", f"--summary-csv={out_csv}", f"--junitxml={junit}")
    out = result.stdout.str()
    assert result.parseoutcomes() == {
        "passed": 3,
        "failed": 1,
        "unscored": 1,
        "needs_human": 1,
    }, out  # no "errors": not one call reached the (absent) endpoint
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    read = only_run(set_dir)
    info = read.info
    assert info is not None
    assert (info.answerer, info.answerer_model) == ("measure-lookup", "measure-lookup-1")
    assert (info.judge_model, info.judge_version) == ("scalar-rules", "rules-1")
    assert info.rubric_sha == load_example("own_judge").ScalarRuleJudge.rubric_sha
    verdicts = {
        ACCOUNTS: "match",
        SHIP_DAYS: "match",
        NEW_ACCOUNTS: "no_match",
        MULTI_ITEM: None,
        DEPARTMENTS: "needs_human",
        ROAS: "match",
    }
    scores = by_qid(read.scores())
    assert {q: s.verdict for q, s in scores.items()} == verdicts
    assert scores[MULTI_ITEM].reason == "not_submitted"
    assert {s.judge_version for q, s in scores.items() if q != MULTI_ITEM} == {"rules-1"}
    assert scores[ACCOUNTS].column_pairing == {"customer_accounts": "user_count"}
    attempts = by_qid(read.attempts())
    assert attempts[ACCOUNTS].final_query == "SELECT count(*) AS user_count FROM users"
    assert attempts[MULTI_ITEM].submitted is False
    assert not any(a.contaminated for a in attempts.values())
    calls = [e for e in read.of_kind("tool_call") if e.qid == ACCOUNTS]
    assert [(c.tool, c.role) for c in calls] == [
        ("get_context", "context"),
        ("execute_query", "query"),
    ]
    assert calls[0].trace_id
    assert calls[0].ranked_summary["entityIds"][0] == "measure:users:user_count"
    # The hooks: one no_match line in the summary, one CSV row per attempt, and the
    # properties item_result set in the workers reached the controller's junitxml.
    run_name = read.run_dir.name
    why = "no column agrees with new_accounts=5673"
    assert "no_match cases (1)" in out
    assert f"NO_MATCH {run_name} {NEW_ACCOUNTS}: {why}" in out
    with out_csv.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["qid"] for r in rows] == sorted(qids)
    assert {r["run"] for r in rows} == {run_name}
    status = {q: "unscored" if v is None else v for q, v in verdicts.items()}
    assert {r["qid"]: r["status"] for r in rows} == status
    assert {r["qid"] for r in rows if not r["final_query"]} == {MULTI_ITEM, ROAS}
    properties = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in ET.parse(junit).getroot().iter("testcase")
    }
    assert {name: props.get("evalloop_status") for name, props in properties.items()} == status


def test_rule_judge_pairs_by_name_then_value_within_the_rounding() -> None:
    pair = load_example("own_judge").pair_columns
    assert pair({"pct": 14.93}, {"pct": 14.934}, 2) == {"pct": "pct"}
    assert pair({"pct": 14.93}, {"pct": 14.94}, 2) == {"pct": None}
    assert pair({"n": 5}, {"count": 5.0, "other": 1}, None) == {"n": "count"}
    assert pair({"a": 1, "b": 1}, {"x": 1}, None) == {"a": "x", "b": None}  # one column, once
    assert pair({"month": "2021-12"}, {"m": " 2021-12 "}, None) == {"month": "m"}


# --- an example beside the built-in role it does not replace ---------------------------------


def test_own_judge_with_the_default_answerer(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = make_set(pytester.path, [ACCOUNTS, SHIP_DAYS, NEW_ACCOUNTS])
    use_example("own_judge", pytester.path)
    wrong = [
        {"tool": "execute_query", "input": {"sql": "SELECT count(*) AS new_accounts FROM users"}},
        {"text": "All accounts: 24,000."},
    ]
    fake.policy = script(
        set_dir,
        answerer={"default": ORACLE, "by_question": {questions(set_dir)[NEW_ACCOUNTS]: wrong}},
    )
    result = run(pytester, set_dir)
    assert result.parseoutcomes() == {"passed": 2, "failed": 1}, result.stdout.str()
    assert fake.calls("judge") == []
    assert fake.calls("answerer")
    scores = by_qid(only_run(set_dir).scores())
    assert scores[NEW_ACCOUNTS].verdict == "no_match"
    assert scores[NEW_ACCOUNTS].why == "no column agrees with new_accounts=5673"
    assert scores[SHIP_DAYS].column_pairing == {"avg_days_to_ship": "avg_days_to_ship"}


# --- publisher target --------------------------------------------------------------------


def start_fake_publisher(tmp: Path, queries: dict[str, Any]) -> tuple[subprocess.Popen[str], str]:
    script_file = tmp / "publisher-script.json"
    script_file.write_text(json.dumps({"queries": queries, "default": []}), encoding="utf-8")
    model = MALLOY_SET.parent.parent / "ecommerce" / "ecommerce.malloy"
    command = [sys.executable, "-m", "pytest_evalloop.testing.fake_publisher"]
    command += ["--model", str(model), "--script", str(script_file), "--port", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("EVALLOOP_FAKE_PUBLISHER_URL="):
            return proc, line.split("=", 1)[1].strip()
    proc.kill()
    raise AssertionError("the fake Publisher did not print its URL")


def test_publisher_target_hook_reads_the_url_from_the_environment(
    pytester: pytest.Pytester, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_dir = pytester.path / "evals" / "ecommerce"
    set_dir.mkdir(parents=True)
    shutil.copy(MALLOY_SET / sets.SET_FILE, set_dir / sets.SET_FILE)
    rows = [json.loads(line) for line in (MALLOY_SET / sets.CASES_FILE).read_text().splitlines()]
    picked = [dict(r, golden={**r["golden"], "status": "verified"}) for r in rows[:3]]
    lines = "".join(json.dumps(r) + "\n" for r in picked)
    (set_dir / sets.CASES_FILE).write_text(lines, encoding="utf-8")
    use_example("publisher_target", pytester.path)
    answered = {r["modelQuery"]: [{"value": 1}] for r in picked}
    proc, url = start_fake_publisher(pytester.path, answered)
    try:
        monkeypatch.setenv("PUBLISHER_MCP_URL", url)
        fake.policy = script(
            set_dir,
            answerer={
                "default": [
                    {
                        "tool": "malloy_executeQuery",
                        "input": {
                            "environmentName": "local",
                            "packageName": "ecommerce",
                            "modelPath": "ecommerce.malloy",
                            "query": "{modelQuery}",
                        },
                    },
                    {"text": "Done.\n\nFinal query:\n```malloy\n{modelQuery}\n```"},
                ]
            },
        )
        # No --eval-target: the set has no embedded target, so only the hook can supply one.
        result = run(pytester, set_dir)
    finally:
        proc.kill()
        proc.wait(10)
    assert result.parseoutcomes() == {"passed": 3}, result.stdout.str()
    read = only_run(set_dir)
    assert read.info is not None and read.info.mcp_url == url
    # The pin names the served model, not the port the Publisher listened on.
    assert read.info.target.startswith("http:/mcp (environmentName=local, ")
    finals = {a.final_query for a in read.attempts().values()}
    assert finals == set(answered)
