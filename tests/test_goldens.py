"""The example set's goldens re-derive cleanly, and a tampered golden is caught."""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import shutil
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pytest_evalloop.targets.embedded.data import DATASET_VERSION, ensure_data
from pytest_evalloop.targets.embedded.goldens import fetch_rows, verify_case
from pytest_evalloop.targets.embedded.model import SemanticModel, install_sources
from pytest_evalloop.targets.embedded.pairing import compare_golden

SET_DIR = Path(__file__).resolve().parents[1] / "evals" / "ecommerce"
MARKERS = ("PREFERRED", "ACCEPT", "DIVERGENT", "WRONG", "REQUIRED", "CREDITED")
CASES: list[dict[str, Any]] = [
    json.loads(line) for line in (SET_DIR / "cases.jsonl").read_text("utf-8").splitlines() if line
]
BY_QID = {c["qid"]: c for c in CASES}


@pytest.fixture(scope="module")
def model() -> SemanticModel:
    return SemanticModel.load(SET_DIR / "model.json")


@pytest.fixture(scope="module")
def model_runner(model: SemanticModel) -> Callable[[str], list[dict[str, Any]]]:
    """An unsandboxed stand-in for the MCP query tool: the answerer-facing relations only."""
    con = duckdb.connect(":memory:")
    install_sources(con, model, ensure_data())
    return lambda sql: fetch_rows(con, sql)


@pytest.mark.parametrize("qid", sorted(BY_QID))
def test_case_verifies_clean(qid: str, model_runner: Callable[[str], list[dict[str, Any]]]) -> None:
    assert verify_case(BY_QID[qid], SET_DIR, model_query_runner=model_runner) == []


@pytest.mark.parametrize("qid", ["ecom_sales_2022", "ecom_orders_by_status"])
def test_one_changed_value_is_one_drift(
    qid: str, tmp_path: Path, model_runner: Callable[[str], list[dict[str, Any]]]
) -> None:
    shutil.copy(SET_DIR / "set.json", tmp_path / "set.json")
    case = copy.deepcopy(BY_QID[qid])
    value = case["golden"]["value"]
    if isinstance(value, dict):
        real, value["total_sales"] = value["total_sales"], 1234.56
        planted: Any = 1234.56
    else:
        real, value[0]["orders"] = value[0]["orders"], 7
        planted = 7
    drifts = verify_case(case, tmp_path, model_query_runner=model_runner)
    assert len(drifts) == 1
    drift = drifts[0]
    assert (drift.qid, drift.route) == (qid, "canonical")
    assert drift.stored == value
    assert str(real) in json.dumps(drift.derived)
    assert repr(planted) in drift.message and qid in drift.message


def test_broken_routes_are_named(tmp_path: Path) -> None:
    case = copy.deepcopy(BY_QID["ecom_order_count"])
    case["golden"]["verification"]["secondQuery"] = "SELECT count(*) AS orders FROM order_items"
    drifts = verify_case(case, SET_DIR, model_query_runner=lambda sql: [{"orders": -1}])
    assert [d.route for d in drifts] == ["second", "model"]
    assert drifts[1].derived == {"orders": -1}
    case["golden"]["verification"]["secondQuery"] = "SELECT * FROM no_such_table"
    (drift,) = verify_case(case, SET_DIR)
    assert (drift.route, drift.problem) == ("second", "failed")
    assert drift.message.startswith("could not verify: the second query did not run:")
    assert "no_such_table" in drift.message
    del case["golden"]["verification"]["secondQuery"]
    (drift,) = verify_case(case, SET_DIR)
    assert drift.route == "second" and "no golden.verification.secondQuery" in drift.message


def test_missing_canonical_query_is_one_drift() -> None:
    case = copy.deepcopy(BY_QID["ecom_order_count"])
    case["golden"]["canonicalQuery"] = None
    (drift,) = verify_case(case, SET_DIR)
    assert drift.route == "canonical" and "no golden.canonicalQuery" in drift.message


def test_unanswerable_has_nothing_to_derive() -> None:
    assert verify_case(BY_QID["ecom_roas"], SET_DIR) == []


def test_compare_golden_scalar_tolerance_and_shapes() -> None:
    stored = {"total": 100.0, "round": 2, "currency": "usd"}
    assert compare_golden(stored, [{"total": Decimal("100.004"), "extra": 1}], "scalar") is None
    assert "stored 100.0, derived 100.01" in str(
        compare_golden(stored, [{"total": 100.01}], "scalar")
    )
    assert compare_golden({"n": 1_000_000}, [{"n": 1_000_000.5}], "scalar") is None  # relative 1e-6
    assert compare_golden({"n": 10}, [{"n": 10.001}], "scalar") is not None
    assert "exactly one row" in str(compare_golden(stored, [], "scalar"))
    # One figure against one column: the same figure under another name, so a value difference.
    assert "total (paired with the query's only column 'x'): stored 100.0, derived 1" in str(
        compare_golden(stored, [{"x": 1}], "scalar")
    )
    assert compare_golden(stored, [{"x": 100.001}], "scalar") is None
    assert "no column of the query holds the stored total 100.0" in str(
        compare_golden(stored, [{"x": 1, "y": 2}], "scalar")
    )
    assert compare_golden({"d": "2021-12-01"}, [{"d": dt.date(2021, 12, 1)}], "scalar") is None


def test_compare_golden_rows_ignore_order_not_content() -> None:
    stored = [{"k": "a", "v": 1.5}, {"k": "b", "v": 2}]
    assert (
        compare_golden(stored, [{"k": "b", "v": 2, "z": 0}, {"k": "a", "v": 1.5}], "rows") is None
    )
    assert "expected 2 rows, got 1" in str(compare_golden(stored, [{"k": "a", "v": 1.5}], "rows"))
    assert compare_golden(stored, [{"k": "a", "v": 1.5}, {"k": "b", "v": 3}], "rows") is not None
    assert compare_golden(None, [], "unanswerable") is None
    assert "cannot be compared" in str(compare_golden(1, [], "vibes"))


def test_question_sha_seals_every_question() -> None:
    for case in CASES:
        digest = hashlib.sha256(case["question"].encode("utf-8")).hexdigest()[:16]
        assert case["questionSha"] == digest, case["qid"]


def test_split_size_and_shape() -> None:
    assert len(CASES) >= 40
    holdout = sum(c["split"] == "holdout" for c in CASES) / len(CASES)
    assert 0.25 <= holdout <= 0.35
    assert {c["split"] for c in CASES} == {"dev", "holdout"}
    assert all(c["state"] == "selected" for c in CASES)
    assert {c["golden"]["kind"] for c in CASES} == {"scalar", "rows", "unanswerable"}
    meta = json.loads((SET_DIR / "set.json").read_text("utf-8"))
    assert meta["target"] == {"kind": "embedded", "model": "model.json", "data": "ecommerce"}
    assert meta["embeddedDataVersion"] == DATASET_VERSION


def test_unanswerable_cases_have_answerable_look_alikes() -> None:
    refusals = [c for c in CASES if c["golden"]["kind"] == "unanswerable"]
    assert len(refusals) >= 4
    for case in refusals:
        assert "unanswerable" in case["tags"] and case["coverage"] == "absent"
        assert case["golden"]["value"] is None and case["golden"]["rubric"]
        twin = BY_QID[case["pairedWith"]]
        assert "answerable-sounds-unanswerable" in twin["tags"]
        assert twin["pairedWith"] == case["qid"]
        assert twin["golden"]["kind"] in {"scalar", "rows"}


def test_answerable_goldens_are_complete(model: SemanticModel) -> None:
    known = {e.id for e in model.entities()}
    for case in CASES:
        golden = case["golden"]
        assert golden["status"] == "verified"
        rubric = golden["rubric"]
        assert any(m in rubric for m in MARKERS), case["qid"]
        if golden["kind"] == "unanswerable":
            continue
        assert "PREFERRED" in rubric and golden["canonicalQuery"] and case["modelQuery"]
        verification = golden["verification"]
        assert verification["primaryAxis"] and verification["variesAxis"]
        assert verification["secondQuery"] != golden["canonicalQuery"]
        assert all(isinstance(a["accept"], bool) for a in golden["alternates"])
        entities = case["expectedEntities"]
        named = entities["required"] + [i for g in entities["requiredAnyOf"] for i in g]
        assert named, case["qid"]
        assert set(named) | set(entities["acceptable"]) <= known, case["qid"]


def test_traps_are_tagged() -> None:
    tags = [t for c in CASES for t in c["tags"]]
    for needed in ("fanout", "order-vs-line", "cost-source", "truncated-window"):
        assert needed in tags


def test_a_path_golden_is_read_from_its_artifact(tmp_path: Path) -> None:
    shutil.copy(SET_DIR / "set.json", tmp_path / "set.json")
    case = copy.deepcopy(BY_QID["ecom_orders_by_status"])
    rows = case["golden"].pop("value")
    case["golden"]["path"] = "gold/rows.json"
    (tmp_path / "gold").mkdir()
    (tmp_path / "gold" / "rows.json").write_text(json.dumps(rows), encoding="utf-8")
    assert verify_case(case, tmp_path) == []
    (tmp_path / "gold" / "rows.json").write_text("[{oops", encoding="utf-8")
    (drift,) = verify_case(case, tmp_path)
    assert "rows.json:1" in drift.message and "is not JSON" in drift.message
