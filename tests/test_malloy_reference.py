"""The malloy-samples reference set scored end to end, in the commands a user types.

A copy of `../shared/reference/malloy-samples` (the set in `evals/ecommerce`, its package in
`ecommerce/`, the truth package in `ecommerce-truth/`, only `products.parquet` of the data) goes
through docs/malloy.md's path: the first run's compile check names the missing tables and the
command that makes them; `evalloop malloy-data` makes them; a run with nothing scorable exits 9
naming the bulk attestation; `evalloop golden attest` refuses a golden the truth package
contradicts, alone and in bulk (`--all-provisional`), and attests what it reproduces; the set's
truth package is honoured under `--eval-target=malloy:<dir>` (the golden check ran on it); and a
run against the loopback fake, answering every case with its `modelQuery`, re-executes every
final query through the real compiler with no harness error.

The reference goldens are the original data's figures and these tables are synthetic (the
original three tables were never copied), so the truth contradicts all but the two goldens
computed from products.parquet alone, the one real table: the bulk attestation refuses the rest,
naming both values, as it must. The run answers every case anyway (`--eval-answer-unscorable`),
so each of the 45 modelQueries goes through the server and back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop import cli
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from tests.conftest import SHARED

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="the malloy target needs node and npm on PATH (install Node.js 20+)",
)

SAMPLES = SHARED / "reference" / "malloy-samples"
REPRODUCED = {"ecom_catalog_retail_value", "ecom_products_we_sell"}
"""The goldens the synthetic tables reproduce: both are computed from products.parquet alone."""
QUERY = {"environmentName": "local", "packageName": "ecommerce", "modelPath": "ecommerce.malloy"}


def _copy(root: Path) -> Path:
    """A writable copy of the reference tree (the shared one is read-only)."""
    target = root / "malloy-samples"
    shutil.copytree(SAMPLES, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    return target


def _oracle(cases: list[dict[str, Any]], set_dir: Path) -> dict[str, Any]:
    """Each case answered with its modelQuery; the four without one declined."""
    answer = [
        {"tool": "malloy_getContext", "input": {**QUERY, "query": "{question}"}},
        {"tool": "malloy_executeQuery", "input": {**QUERY, "query": "{modelQuery}"}},
        {"text": "Here it is.\n\nFinal query:\n```malloy\n{modelQuery}\n```"},
    ]
    decline = [{"text": "The model carries no such data, so this cannot be answered."}]
    return {
        "cases_file": str(set_dir / "cases.jsonl"),
        "answerer": {
            "default": answer,
            "by_question": {c["question"]: decline for c in cases if not c.get("modelQuery")},
        },
        "judge": {"default": {"verdict": "match", "confidence": 9}},
    }


def test_the_reference_set_is_scored_end_to_end_through_the_real_compiler(
    pytester: pytest.Pytester, fake: FakeAnthropic, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _copy(pytester.path)
    set_dir, package, truth = (
        root / "evals" / "ecommerce",
        root / "ecommerce",
        root / "ecommerce-truth",
    )
    target = f"--eval-target=malloy:{package}"
    cases = [json.loads(x) for x in (set_dir / "cases.jsonl").read_text().splitlines()]
    fake.policy = ScriptSpec.model_validate(_oracle(cases, set_dir)).policy()

    # 1. compile: the tables are missing, named with the command that makes them.
    result = pytester.runpytest_subprocess(str(set_dir), target)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "Traceback" not in err
    assert f"table file data/order_items.parquet does not exist (looked for {package}/data/" in err
    assert f"`evalloop malloy-data {package / 'data'} {truth / 'data'}` generates them" in err

    # 2. data: the generated tables, linked into both packages' data folders.
    assert cli.main(["malloy-data", str(set_dir)]) == 0
    for folder in (package / "data", truth / "data"):
        names = {"products", "users", "order_items", "inventory_items"}
        assert {p.stem for p in folder.glob("*.parquet")} == names

    # 3. a run with nothing scorable stops, saying why and what fixes it.
    result = pytester.runpytest_subprocess(str(set_dir), target)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 9, out
    [why] = [x for x in out.splitlines() if "evalloop: nothing to answer:" in x]
    assert "(49 golden_provisional)" in why
    assert f'`evalloop golden attest {set_dir} --all-provisional --by "<name>" {target}`' in why

    # 4. attest re-derives on the truth package and refuses what it contradicts.
    before = (set_dir / "cases.jsonl").read_bytes()
    attest = ["golden", "attest", str(set_dir)]
    assert cli.main([*attest, "ecom_order_count", "--by", "Ana Lopez", target]) == 1
    assert "order_count: stored 264071, derived 257900" in capsys.readouterr().err
    assert (set_dir / "cases.jsonl").read_bytes() == before

    # 5. bulk attest: one recorded change per golden the truth reproduces; the rest listed.
    assert cli.main([*attest, "--all-provisional", "--by", "Ana Lopez", target]) == 1
    out = capsys.readouterr().out
    assert "2 attested, 47 refused" in out
    assert out.count("contradicted by the truth data: ") == 43
    assert out.count("the golden is unanswerable: no value to re-derive") == 4
    assert "refused ecom_customer_count (cases.jsonl:13): contradicted by the truth data: " in out
    records = [json.loads(x) for x in (set_dir / "golden-changes.jsonl").read_text().splitlines()]
    assert {r["qid"] for r in records} == REPRODUCED and len(records) == 2
    assert json.loads((set_dir / "set.json").read_text())["datasetVersion"] == 14 + 2

    # 6. --eval-verify-goldens under --eval-target reads the set's truth package.
    result = pytester.runpytest_subprocess(
        str(set_dir), target, "--eval-verify-goldens", "-k", "ecom_customer_count"
    )
    result.assert_outcomes(failed=1)
    assert "golden drifted for ecom_customer_count" in result.stdout.str()
    assert "buyers: stored 133345, derived 101740" in result.stdout.str()

    # 7. run: every case answered with its modelQuery, re-executed by the real compiler.
    result = pytester.runpytest_subprocess(str(set_dir), target, "--eval-answer-unscorable")
    out = result.stdout.str()
    assert result.ret == 0, out
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 2 and outcomes.get("unscored") == 47, out
    assert outcomes.get("errors") is None and outcomes.get("failed") is None, out
    assert "golden check: 0 ok, 0 drifted, 2 other finding(s)" in out  # on the truth package
    [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    info = read.info
    assert info is not None and info.status == "complete" and info.target == f"malloy:{package}"
    assert info.target_version == "@malloydata/malloy 0.0.431" and info.model_sha
    attempts = {qid: a for (qid, _), a in read.attempts().items()}
    assert len(attempts) == 49
    for case in cases:
        attempt = attempts[case["qid"]]
        assert attempt.error is None, (case["qid"], attempt.error)
        if case.get("modelQuery"):
            assert attempt.submitted and attempt.final_query == case["modelQuery"]
            assert attempt.reexecution == "ok", case["qid"]
            assert attempt.n_execute_errors == 0 and attempt.model_sha == info.model_sha
        else:
            assert (attempt.submitted, attempt.reexecution) == (False, "no_query")
    verdicts = {qid: s.verdict for (qid, _), s in read.scores().items()}
    assert {q for q, v in verdicts.items() if v is not None} == REPRODUCED
    assert {verdicts[q] for q in REPRODUCED} == {"match"}
    assert (run_dir / "report.html").is_file()  # 8. report
