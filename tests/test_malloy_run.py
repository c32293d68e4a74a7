"""A whole run of `evals/ecommerce-malloy` on the malloy target, with the fake endpoint.

The answerer is scripted with each case's `modelQuery` as its final query; the plugin starts
the real server (the real compiler on DuckDB), re-executes every final query through it, runs
the golden check on the truth package's own server and scores every scorable case. One case's
final query is broken on purpose: it is a scored no_match whose compiler error reached the
judge, not a harness error.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from tests.conftest import SECRET
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


def _copy_set(dest: Path) -> Path:
    """The set without its 60 MB of generated data: the data folder is linked, not copied."""
    ensure_set_data()
    for name in ("set.json", "cases.jsonl"):
        shutil.copyfile(SET_DIR / name, dest / name)
    for package in ("ecommerce", "ecommerce-truth"):
        (dest / package).mkdir()
        for path in (SET_DIR / package).iterdir():
            if path.suffix in (".malloy", ".json"):
                shutil.copyfile(path, dest / package / path.name)
    (dest / "ecommerce" / "data").symlink_to(SET_DIR / "ecommerce" / "data")
    (dest / "ecommerce-truth" / "data").symlink_to("../ecommerce/data")
    return dest


def _oracle(set_dir: Path, question: str) -> dict[str, object]:
    answer = [
        {"tool": "malloy_getContext", "input": CONTEXT},
        {"tool": "malloy_executeQuery", "input": {**QUERY, "query": "{modelQuery}"}},
        {"text": "Here it is.\n\nFinal query:\n```malloy\n{modelQuery}\n```"},
    ]
    broken = [
        {"tool": "malloy_executeQuery", "input": {**QUERY, "query": BROKEN_QUERY}},
        {"text": f"Done.\n\nFinal query:\n```malloy\n{BROKEN_QUERY}\n```"},
    ]
    return {
        "cases_file": str(set_dir / "cases.jsonl"),
        "answerer": {"default": answer, "by_question": {question: broken}},
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
    set_dir = _copy_set(pytester.mkdir("ecommerce-malloy"))
    rows = [json.loads(line) for line in (set_dir / "cases.jsonl").read_text().splitlines()]
    question = next(r["question"] for r in rows if r["qid"] == BROKEN_QID)
    scorable = [r["qid"] for r in rows if r["golden"]["status"] == "verified"]
    fake.policy = ScriptSpec.model_validate(_oracle(set_dir, question)).policy()
    result = pytester.runpytest_subprocess(str(set_dir), "-p", "no:cacheprovider", "-rA")
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == len(scorable) - 1, out
    assert outcomes.get("failed") == 1 and outcomes.get("errors") is None, out
    # ran on the truth package: nothing drifted, every golden proven two ways
    assert "golden check: 39 ok, 0 drifted, 0 other finding(s)" in out
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


def test_a_model_that_does_not_compile_is_one_usage_error_before_anything_is_paid(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = _copy_set(pytester.mkdir("ecommerce-malloy"))
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
