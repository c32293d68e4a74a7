"""Whole runs with the other answerer and target: Claude Code (fake CLI) and Malloy Publisher (fake).

The claude-code runs go through the stand-in `claude` executable, which really calls the
embedded MCP server; the publisher runs talk streamable HTTP to the Publisher-shaped fake.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from pytest_evalloop.testing.fake_claude import install_fake_claude
from tests.conftest import MALLOY_SET, SECRET
from tests.test_run import make_set

QIDS = ["ecom_accounts_never_ordered", "ecom_order_count", "ecom_sales_2022"]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    with FakeAnthropic(
        ScriptSpec.model_validate({"judge": {"default": {"verdict": "match"}}})
    ) as s:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", s.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
        yield s


def test_claude_code_answers_the_set_and_a_gold_read_is_caught(
    pytester: pytest.Pytester, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_dir = make_set(pytester.path, QIDS)
    question = {c.qid: c.question for _, c in sets.load_cases(set_dir).rows}
    oracle = [
        [{"tool": "get_context", "input": {"query": "{question}"}}],
        [{"tool": "execute_query", "input": {"sql": "{modelQuery}"}}],
        {"text": "Here it is.\n\nFinal query:\n```sql\n{modelQuery}\n```"},
    ]
    peek = [
        {"builtin": "Read", "input": {"file_path": str(set_dir / "cases.jsonl")}},
        {"text": "Done.\n\nFinal query:\n```sql\nSELECT 1\n```"},
    ]
    policy = pytester.path / "claude-policy.json"
    policy.write_text(
        json.dumps(
            {
                "cases_file": str(set_dir / "cases.jsonl"),
                "default": oracle,
                "by_question": {question[QIDS[2]]: peek},
                # The endpoint answers the alias with a dated id: run.json pins what answered.
                "served_models": {"ans-alias": "ans-2026-01"},
            }
        )
    )
    bin_dir = install_fake_claude(pytester.path / "bin", policy).parent
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    result = pytester.runpytest_subprocess(
        str(set_dir), "--eval-answerer=claude-code", "--eval-answerer-model=ans-alias", "-rA"
    )
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 2, out
    assert outcomes.get("errors") == 1, out
    [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    assert read.info is not None and read.info.answerer == "claude-code"
    attempts = {k[0]: a for k, a in read.attempts().items()}
    peeked = attempts[QIDS[2]]
    assert peeked.contaminated is True
    assert any(
        r.startswith("Read touched protected path") and "evals" in r
        for r in peeked.contamination_reasons
    )
    assert attempts[QIDS[0]].contaminated is False and attempts[QIDS[0]].submitted
    assert {k[0]: s.verdict for k, s in read.scores().items()}[QIDS[2]] is None
    assert len(fake.calls("answerer")) == 0  # the CLI answered, not the Messages API
    pinned = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    assert (pinned["answererModel"], pinned["answererModelConfigured"]) == (
        "ans-2026-01",
        "ans-alias",
    )


def _publisher(
    tmp: Path, script: dict[str, object], *options: str
) -> tuple[subprocess.Popen[str], str]:
    script_file = tmp / "publisher-script.json"
    script_file.write_text(json.dumps(script))
    model = MALLOY_SET.parent.parent / "ecommerce" / "ecommerce.malloy"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest_evalloop.testing.fake_publisher",
            "--model",
            str(model),
            "--script",
            str(script_file),
            "--port",
            "0",
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("EVALLOOP_FAKE_PUBLISHER_URL="):
            return proc, line.split("=", 1)[1].strip()
    proc.kill()
    raise AssertionError("the fake Publisher did not start")


@pytest.fixture
def malloy_rows() -> list[dict[str, object]]:
    return [json.loads(line) for line in (MALLOY_SET / "cases.jsonl").read_text().splitlines()]


def _oracle_spec(set_dir: Path) -> dict[str, object]:
    return {
        "cases_file": str(set_dir / "cases.jsonl"),
        "answerer": {
            "default": [
                {
                    "tool": "malloy_getContext",
                    "input": {
                        "environmentName": "local",
                        "packageName": "ecommerce",
                        "query": "{question}",
                    },
                },
                {
                    "tool": "malloy_executeQuery",
                    "input": {
                        "environmentName": "local",
                        "packageName": "ecommerce",
                        "modelPath": "ecommerce.malloy",
                        "query": "{modelQuery}",
                    },
                },
                {"text": "Answer.\n\nFinal query:\n```malloy\n{modelQuery}\n```"},
            ]
        },
        "judge": {"default": {"verdict": "match"}},
    }


def test_the_real_malloy_set_under_the_publisher_profile(
    pytester: pytest.Pytester, fake: FakeAnthropic, malloy_rows: list[dict[str, object]]
) -> None:
    set_dir = pytester.path / "malloy" / "ecommerce"
    shutil.copytree(MALLOY_SET, set_dir)
    queries = {str(r["modelQuery"]): [{"value": 1}] for r in malloy_rows if r.get("modelQuery")}
    proc, url = _publisher(pytester.path, {"queries": queries, "default": []})
    try:
        fake.policy = ScriptSpec.model_validate(_oracle_spec(set_dir)).policy()
        result = pytester.runpytest_subprocess(
            str(set_dir),
            f"--eval-target={url}",
            "--eval-tool-profile=publisher",
            "-n",
            "2",
            "--eval-answer-unscorable",  # answered anyway, for a later rejudge
        )
        out = result.stdout.str()
        assert result.parseoutcomes().get("unscored") == 49, out
        assert "--eval-answer-unscorable: they are answered anyway" in out
        assert "not scored: 49 golden_provisional" in out
        assert "goldens that are not scorable are never scored (provisional: verify" in out
        [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
        read = ledger_reader.read_run(run_dir)
        assert read.errors == []
        scores = list(read.of_kind("score"))
        assert len(scores) == 49 and {s.reason for s in scores} == {"golden_provisional"}
        assert read.info is not None and read.info.mcp_url == url
        assert read.info.target.startswith("http:/mcp (environmentName=")  # not the port
        assert len(fake.calls("judge")) == 0
        # The same set with verified goldens: one score per case, with the scripted verdicts.
        rows = [dict(r, golden={**r["golden"], "status": "verified"}) for r in malloy_rows]  # type: ignore[dict-item]
        (set_dir / "cases.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        shutil.rmtree(set_dir / "runs")
        verified = pytester.runpytest_subprocess(
            str(set_dir), f"--eval-target={url}", "--eval-tool-profile=publisher"
        )
        assert verified.ret == 0, verified.stdout.str()
        verified.assert_outcomes(passed=49)
        [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
        read = ledger_reader.read_run(run_dir)
        assert read.errors == [] and {s.verdict for s in read.of_kind("score")} == {"match"}
        assert len(read.of_kind("score")) == 49
    finally:
        proc.kill()
        proc.wait()


def test_the_real_set_without_a_target_is_one_usage_error(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = pytester.path / "malloy" / "ecommerce"
    shutil.copytree(MALLOY_SET, set_dir)
    result = pytester.runpytest_subprocess(str(set_dir), "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err, out = result.stderr.str(), result.stdout.str()
    assert "Traceback" not in err + out and "ValueError" not in err + out
    [line] = [x for x in err.splitlines() if x.startswith("ERROR:")]
    assert "declares no embedded target" in line and "--eval-target=<MCP URL or command>" in line
    assert "--eval-tool-profile=publisher" in line and "package 'ecommerce'" in line
    assert "--eval-target=malloy:<package dir>" in line and '"kind": "malloy"' in line
    assert not (set_dir / "runs").exists()
    assert fake.calls() == []


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["plain", "n2"])
def test_the_real_set_says_at_the_start_that_nothing_can_be_scored_and_spends_nothing(
    pytester: pytest.Pytester, fake: FakeAnthropic, workers: list[str]
) -> None:
    set_dir = pytester.path / "malloy" / "ecommerce"
    shutil.copytree(MALLOY_SET, set_dir)
    proc, url = _publisher(pytester.path, {"queries": {}, "default": []})
    try:
        fake.policy = ScriptSpec.model_validate(_oracle_spec(set_dir)).policy()
        result = pytester.runpytest_subprocess(
            str(set_dir), f"--eval-target={url}", "--eval-tool-profile=publisher", *workers
        )
    finally:
        proc.kill()
        proc.wait()
    out = result.stdout.str() + result.stderr.str()
    # Nothing could be answered: a non-zero exit, not a green run (EXIT_NOTHING_TO_ANSWER).
    assert result.ret == 9, out
    lines = out.splitlines()
    start = next(i for i, x in enumerate(lines) if "49 of 49 selected case(s) have a golden" in x)
    assert "(49 golden_provisional)" in lines[start]
    assert "they are not answered, so nothing is spent on them" in lines[start + 1]
    assert "--eval-answer-unscorable" in lines[start + 1]
    assert "golden check: not run: no truth connection" in out
    [why] = [x for x in lines if "evalloop: nothing to answer:" in x]
    assert "all 49 selected case(s) of ecommerce have a golden that cannot be scored" in why
    assert f"evalloop golden attest {set_dir} <qid>" in why
    assert fake.calls() == []  # no answerer, no judge
    assert not (set_dir / "runs").exists()


def test_a_dead_publisher_is_a_harness_error_naming_the_url(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = pytester.path / "malloy" / "ecommerce"
    shutil.copytree(MALLOY_SET, set_dir)
    url = "http://127.0.0.1:9/mcp"
    result = pytester.runpytest_subprocess(
        str(set_dir),
        f"--eval-target={url}",
        "--eval-tool-profile=publisher",
        "--eval-answer-unscorable",  # the goldens are provisional: answer them anyway
        "-k",
        "ecom_yoy or ecom_2022",
    )
    out = result.stdout.str()
    assert "HARNESS_ERROR" in out or "harness error" in out
    assert url in out
    assert result.parseoutcomes().get("errors", 0) >= 1
