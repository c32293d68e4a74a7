"""`evalloop golden promote|attest|repair|hold|release`: each a recorded change to one row.

Every test works on a private copy of a set and checks what the side door promises: only the
changed row differs (byte for byte), the question and its seal stay, revisions and
`datasetVersion` move as documented, the change is logged, and the set still loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb  # noqa: F401  (loaded before pytester snapshots sys.modules: see tests/conftest.py)
import pytest

from pytest_evalloop import cli
from pytest_evalloop.goldens.change import CHANGES_FILE, GoldenRefused, GoldenUsageError
from pytest_evalloop.goldens.repair import hold, release, repair
from pytest_evalloop.goldens.verify import attest, promote
from pytest_evalloop.judge.judge import golden_gate
from pytest_evalloop.sets import cases as sets
from tests.conftest import EXAMPLE_SET

SCALAR = "ecom_average_order_value"  # scalar golden with a modelQuery
ROWS = "ecom_orders_by_status"  # rows golden with a modelQuery
MALLOY_QID = "ecom_order_count"


@pytest.fixture
def eco(tmp_path: Path) -> Path:
    """A private copy of the example set (without its runs)."""
    target = tmp_path / "eco"
    shutil.copytree(EXAMPLE_SET, target, ignore=shutil.ignore_patterns("runs"))
    return target


class Snapshot:
    """The bytes of a set's files before a change, to compare with after."""

    def __init__(self, set_dir: Path) -> None:
        self.set_dir = set_dir
        self.cases = (set_dir / sets.CASES_FILE).read_bytes().splitlines(keepends=True)
        self.set_json = (set_dir / sets.SET_FILE).read_bytes()
        self.sha = sets.dataset_sha(set_dir)
        self.version = json.loads(self.set_json).get("datasetVersion")

    def line_of(self, qid: str) -> int:
        return next(i for i, line in enumerate(self.cases) if json.loads(line)["qid"] == qid)

    def row(self, qid: str) -> dict[str, Any]:
        row: dict[str, Any] = json.loads(self.cases[self.line_of(qid)])
        return row

    def assert_untouched(self) -> None:
        assert (self.set_dir / sets.CASES_FILE).read_bytes() == b"".join(self.cases)
        assert (self.set_dir / sets.SET_FILE).read_bytes() == self.set_json
        assert not (self.set_dir / CHANGES_FILE).exists()

    def assert_one_row_changed(self, qid: str) -> dict[str, Any]:
        """Only `qid`'s line changed, with its question, seal and key order kept; the new row."""
        after = (self.set_dir / sets.CASES_FILE).read_bytes().splitlines(keepends=True)
        index = self.line_of(qid)
        assert len(after) == len(self.cases)
        assert [i for i, (a, b) in enumerate(zip(self.cases, after, strict=True)) if a != b] == [
            index
        ]
        old, new = self.row(qid), json.loads(after[index])
        assert (new["question"], new["questionSha"]) == (old["question"], old["questionSha"])
        assert list(new)[: len(old)] == list(old)  # keys keep their order
        assert after[index].endswith(b"\n")
        loaded = sets.load_cases(self.set_dir)
        assert loaded.errors == []
        assert sets.dataset_sha(self.set_dir) != self.sha
        new_set = json.loads((self.set_dir / sets.SET_FILE).read_bytes())
        assert new_set["datasetVersion"] == self.version + 1
        # set.json keeps its formatting: only the version digits moved
        before_text = self.set_json.decode()
        expected = before_text.replace(
            f'"datasetVersion": {self.version}', f'"datasetVersion": {self.version + 1}', 1
        )
        assert (self.set_dir / sets.SET_FILE).read_text(encoding="utf-8") == expected
        return dict(new)

    def last_change(self) -> dict[str, Any]:
        lines = (self.set_dir / CHANGES_FILE).read_text(encoding="utf-8").splitlines()
        record: dict[str, Any] = json.loads(lines[-1])
        assert record["oldDatasetSha"] == self.sha
        assert record["newDatasetSha"] == sets.dataset_sha(self.set_dir)
        assert record["oldDatasetVersion"] == self.version
        assert record["newDatasetVersion"] == self.version + 1
        return record


def _rewrite_row(set_dir: Path, qid: str, change: Any) -> None:
    """Test setup: edit one row of the copy (a provisional or a broken golden to work on)."""
    path = set_dir / sets.CASES_FILE
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        row = json.loads(line)
        if row["qid"] == qid:
            change(row)
            lines[i] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _golden(set_dir: Path, qid: str) -> dict[str, Any]:
    for _, case in sets.load_cases(set_dir).rows:
        if case.qid == qid:
            golden: dict[str, Any] = case.raw()["golden"]
            return golden
    raise AssertionError(f"{qid} not loaded")


# ----------------------------------------------------------------------------- hold / release


@pytest.mark.parametrize("status", ["ambiguous", "invalid"])
def test_hold_takes_the_golden_out_of_scoring(eco: Path, status: Any) -> None:
    before = Snapshot(eco)
    assert golden_gate(before.row(SCALAR)["golden"]) is None
    change = hold(eco, SCALAR, reason="two replays disagree: 130.68 vs 130.73", status=status)
    row = before.assert_one_row_changed(SCALAR)
    assert row["goldenRevision"] == before.row(SCALAR)["goldenRevision"] + 1
    assert row["golden"]["status"] == status
    assert row["golden"]["value"] == before.row(SCALAR)["golden"]["value"]  # old key kept
    assert golden_gate(row["golden"]) == f"golden_{status}"
    record = before.last_change()
    assert record["action"] == "hold" and record["qid"] == SCALAR
    assert record["why"] == "two replays disagree: 130.68 vs 130.73"
    assert (record["oldStatus"], record["newStatus"]) == ("verified", status)
    assert (record["oldGoldenRevision"], record["newGoldenRevision"]) == (1, 2)
    assert change.record.new_dataset_version == 2


def test_release_restores_the_status_before_the_hold(eco: Path) -> None:
    hold(eco, SCALAR, reason="window unspecified")
    before = Snapshot(eco)
    release(eco, SCALAR, reason="later cases confirmed the all-status convention")
    row = before.assert_one_row_changed(SCALAR)
    assert row["golden"]["status"] == "verified"
    assert "reason" not in row["golden"] and "heldFrom" not in row["golden"]
    assert row["goldenRevision"] == 3
    assert golden_gate(row["golden"]) is None
    assert before.last_change()["action"] == "release"
    assert len((eco / CHANGES_FILE).read_text().splitlines()) == 2


def test_release_of_a_golden_that_is_not_held_is_refused(
    eco: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = Snapshot(eco)
    code = cli.main(["golden", "release", str(eco), SCALAR, "--reason", "x"])
    assert code == 1
    assert "not held" in capsys.readouterr().err
    before.assert_untouched()


def test_holding_twice_is_refused(eco: Path) -> None:
    hold(eco, SCALAR, reason="first")
    before = Snapshot(eco)
    with pytest.raises(GoldenRefused, match="already ambiguous"):
        hold(eco, SCALAR, reason="second")
    assert (eco / sets.CASES_FILE).read_bytes() == b"".join(before.cases)


# ----------------------------------------------------------------------------- repair


def test_repair_restores_a_bad_golden_and_keeps_the_old_one(eco: Path) -> None:
    right = Snapshot(eco).row(SCALAR)["golden"]["value"]
    _rewrite_row(eco, SCALAR, lambda r: r["golden"].update(value={"avg_order_value": 81.63}))
    before = Snapshot(eco)
    repair(eco, SCALAR, value=right, reason="81.63 is the line average, not per order")
    row = before.assert_one_row_changed(SCALAR)
    golden = row["golden"]
    assert golden["value"] == right
    assert golden["status"] == "verified"
    assert row["goldenRevision"] == 2
    [old] = golden["history"]
    assert old["value"] == {"avg_order_value": 81.63}
    assert old["goldenRevision"] == 1
    assert old["reason"] == "81.63 is the line average, not per order"
    assert old["replaced"].startswith("20")
    record = before.last_change()
    assert record["changed"]["golden.value"] == {"from": {"avg_order_value": 81.63}, "to": right}
    assert record["forced"] is False


def test_repair_with_a_wrong_value_is_refused(
    eco: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = Snapshot(eco)
    value = '{"avg_order_value": 99.5, "round": 2}'
    code = cli.main(["golden", "repair", str(eco), SCALAR, "--value", value, "--reason", "oops"])
    assert code == 1
    err = capsys.readouterr().err
    assert "does not re-derive" in err and "stored 99.5, derived 130.68" in err
    assert f"cases.jsonl:{before.line_of(SCALAR) + 1}" in err
    before.assert_untouched()


def test_forced_repair_records_the_drift(eco: Path) -> None:
    before = Snapshot(eco)
    change = repair(
        eco, SCALAR, value={"avg_order_value": 99.5, "round": 2}, reason="policy", force=True
    )
    row = before.assert_one_row_changed(SCALAR)
    assert row["golden"]["value"] == {"avg_order_value": 99.5, "round": 2}
    record = before.last_change()
    assert record["forced"] is True
    assert any("derived 130.68" in d for d in record["drift"])
    assert "repair forced by" in row["golden"]["verifiedBy"]
    assert change.record.forced


def test_a_forced_repair_is_not_verified_until_it_re_derives(
    eco: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    right = Snapshot(eco).row(SCALAR)["golden"]["value"]
    args = ["golden", "repair", str(eco), SCALAR, "--value", '{"avg_order_value": 99.5}']
    assert cli.main([*args, "--reason", "policy says so", "--force"]) == 0
    out = capsys.readouterr().out
    assert "golden.status: verified -> provisional" in out
    assert "FORCED over" in out and "evalloop golden promote" in out
    golden = _golden(eco, SCALAR)
    assert golden["status"] == "provisional"
    assert "not verified until it re-derives" in golden["verifiedBy"]
    assert golden_gate(golden) == "golden_provisional"  # a forced key is never scored
    with pytest.raises(GoldenRefused, match="does not re-derive"):
        promote(eco, SCALAR)
    repair(eco, SCALAR, value=right, reason="the replay was right after all")
    assert _golden(eco, SCALAR)["status"] == "verified"


def test_repair_from_a_rows_file_points_the_golden_at_the_artifact(eco: Path) -> None:
    right = Snapshot(eco).row(ROWS)["golden"]["value"]
    _rewrite_row(eco, ROWS, lambda r: r["golden"]["value"][0].update(orders=1))
    (eco / "gold").mkdir()
    artifact = eco / "gold" / f"{ROWS}.json"
    artifact.write_text(json.dumps(list(reversed(right))), encoding="utf-8")
    before = Snapshot(eco)
    repair(eco, ROWS, rows_file=artifact, reason="replayed the stored final query")
    row = before.assert_one_row_changed(ROWS)
    assert row["golden"]["path"] == f"gold/{ROWS}.json"
    assert "value" not in row["golden"]
    assert row["golden"]["history"][0]["value"][0]["orders"] == 1


def test_repair_rows_file_outside_the_set_is_a_usage_error(
    eco: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "rows.json"
    outside.write_text("[]", encoding="utf-8")
    before = Snapshot(eco)
    args = ["golden", "repair", str(eco), ROWS, "--rows-file", str(outside), "--reason", "r"]
    assert cli.main(args) == 2
    assert "outside the set" in capsys.readouterr().err
    before.assert_untouched()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--value", "{not json", "--reason", "r"], "is not JSON"),
        (["--value", "[1, 2]", "--reason", "r"], "scalar golden value must be an object"),
        (["--reason", "r"], "needs the new key"),
        (["--value", "{}"], "--reason"),
    ],
)
def test_bad_repair_input_is_a_usage_error(
    eco: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    before = Snapshot(eco)
    assert cli.main(["golden", "repair", str(eco), SCALAR, *args]) == 2
    assert says in capsys.readouterr().err
    before.assert_untouched()


# ----------------------------------------------------------------------------- promote


def _make_provisional(set_dir: Path, qid: str, **verification: Any) -> None:
    def change(row: dict[str, Any]) -> None:
        row["golden"]["status"] = "provisional"
        row["golden"]["verification"].update(verification)

    _rewrite_row(set_dir, qid, change)


def test_promote_verifies_a_provisional_golden_derived_two_ways(
    eco: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _make_provisional(eco, SCALAR)
    before = Snapshot(eco)
    assert golden_gate(before.row(SCALAR)["golden"]) == "golden_provisional"
    assert cli.main(["golden", "promote", str(eco), SCALAR, "--by", "ci"]) == 0
    row = before.assert_one_row_changed(SCALAR)
    assert row["golden"]["status"] == "verified"
    assert "modelQuery reproduced it" in row["golden"]["verifiedBy"]
    assert row["goldenRevision"] == before.row(SCALAR)["goldenRevision"]  # the key did not move
    assert golden_gate(row["golden"]) is None
    record = before.last_change()
    assert (record["action"], record["by"]) == ("promote", "ci")
    out = capsys.readouterr().out
    assert "--eval-rejudge-from=" in out and "datasetVersion: 1 -> 2" in out


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        (lambda r: r["golden"]["verification"].update(variesAxis="NOT EXISTS"), "same axis"),
        (lambda r: r["golden"]["verification"].pop("primaryAxis"), "lacks primaryAxis"),
        (lambda r: r["golden"].update(value={"avg_order_value": 81.63}), "does not re-derive"),
        (lambda r: r["golden"]["verification"].pop("secondQuery"), "no golden.verification"),
        (lambda r: r.update(modelQuery="SELECT 1 AS avg_order_value"), "route model"),
    ],
    ids=["same-axis", "no-axis", "drift", "no-second", "model-drift"],
)
def test_promote_refuses_what_is_not_derived_two_ways(eco: Path, setup: Any, says: str) -> None:
    _rewrite_row(eco, SCALAR, setup)
    _make_provisional(eco, SCALAR)
    if says == "same axis":
        primary = Snapshot(eco).row(SCALAR)["golden"]["verification"]["primaryAxis"]
        _make_provisional(eco, SCALAR, variesAxis=primary.upper())
    before = Snapshot(eco)
    with pytest.raises(GoldenRefused, match=says):
        promote(eco, SCALAR)
    before.assert_untouched()


@pytest.mark.parametrize(
    "retype",
    [
        lambda sql: sql,
        lambda sql: "  " + sql.upper().replace(" ", "\n   ") + " ;",
        lambda sql: sql.replace("SELECT", "select /* again */"),
    ],
    ids=["byte-identical", "case-and-spacing", "comment"],
)
def test_promote_refuses_a_second_query_that_is_the_canonical_again(
    eco: Path, capsys: pytest.CaptureFixture[str], retype: Any
) -> None:
    canonical = Snapshot(eco).row(SCALAR)["golden"]["canonicalQuery"]
    _make_provisional(eco, SCALAR, secondQuery=retype(canonical))
    before = Snapshot(eco)
    assert cli.main(["golden", "promote", str(eco), SCALAR]) == 1
    err = capsys.readouterr().err
    assert "not derived two ways; not promoted" in err
    assert "secondQuery is the canonicalQuery again" in err
    assert "another route to the same figure" in err
    before.assert_untouched()


@pytest.mark.parametrize(
    "wrap",
    [
        lambda sql: f"SELECT * FROM ({sql.rstrip('; ')}) AS again",
        lambda sql: f"WITH c AS ({sql.rstrip('; ')}) SELECT avg_order_value FROM c",
    ],
    ids=["select-star-from", "cte"],
)
def test_promote_refuses_a_second_query_that_wraps_the_canonical(
    eco: Path, capsys: pytest.CaptureFixture[str], wrap: Any
) -> None:
    # Issue 25 (9). Before: `SELECT * FROM (<canonicalQuery>)` was accepted as a second
    # derivation and the golden promoted to verified.
    canonical = Snapshot(eco).row(SCALAR)["golden"]["canonicalQuery"]
    _make_provisional(eco, SCALAR, secondQuery=wrap(canonical))
    before = Snapshot(eco)
    assert cli.main(["golden", "promote", str(eco), SCALAR]) == 1
    assert "secondQuery contains the canonicalQuery" in capsys.readouterr().err
    before.assert_untouched()


def test_attest_refuses_a_golden_the_truth_data_contradicts(
    eco: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 25 (9). Before: attest turned a golden the truth contradicts (stored 1, derived
    # 72482) into `verified` without a word.
    _rewrite_row(eco, SCALAR, lambda r: r["golden"].update(value={"avg_order_value": 81.63}))
    _make_provisional(eco, SCALAR)
    before = Snapshot(eco)
    code = cli.main(["golden", "attest", str(eco), SCALAR, "--by", "Ana Lopez"])
    assert code == 1
    err = capsys.readouterr().err
    assert "contradicted by the truth data; not attested" in err
    assert "stored 81.63, derived 130.68" in err and "evalloop golden repair" in err
    before.assert_untouched()
    # The value the truth derives is attested.
    _rewrite_row(eco, SCALAR, lambda r: r["golden"].update(value={"avg_order_value": 130.68}))
    assert cli.main(["golden", "attest", str(eco), SCALAR, "--by", "Ana Lopez"]) == 0
    assert _golden(eco, SCALAR)["status"] == "verified"


def test_repair_cannot_verify_a_golden_whose_derivations_are_one(eco: Path) -> None:
    canonical = Snapshot(eco).row(SCALAR)["golden"]["canonicalQuery"]
    before = Snapshot(eco)
    with pytest.raises(GoldenRefused, match="canonicalQuery again"):
        repair(eco, SCALAR, second_query=canonical.lower(), reason="simpler second query")
    before.assert_untouched()


def test_promote_of_a_verified_golden_is_refused(eco: Path) -> None:
    with pytest.raises(GoldenRefused, match="not provisional"):
        promote(eco, SCALAR)


# ----------------------------------------------------------------------------- the real set


def test_promote_on_the_malloy_set_refuses_without_a_truth_connection(
    malloy_set: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = Snapshot(malloy_set)
    assert cli.main(["golden", "promote", str(malloy_set), MALLOY_QID]) == 1
    err = capsys.readouterr().err
    assert "no truth connection" in err and "evalloop golden attest" in err
    before.assert_untouched()


def test_attest_on_the_malloy_set(malloy_set: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = Snapshot(malloy_set)
    assert before.row(MALLOY_QID)["golden"]["status"] == "provisional"
    args = ["golden", "attest", str(malloy_set), MALLOY_QID, "--by", "Ana Lopez"]
    assert cli.main([*args, "--note", "re-ran the count on the truth parquet"]) == 0
    row = before.assert_one_row_changed(MALLOY_QID)
    golden = row["golden"]
    assert golden["status"] == "verified"
    assert golden["verifiedBy"].startswith("attested by Ana Lopez")
    [entry] = golden["attestations"]
    assert entry["by"] == "Ana Lopez"
    assert entry["note"] == "re-ran the count on the truth parquet"
    assert entry["goldenRevision"] == before.row(MALLOY_QID)["goldenRevision"]
    assert row["goldenRevision"] == before.row(MALLOY_QID)["goldenRevision"]
    record = before.last_change()
    assert (record["oldDatasetVersion"], record["newDatasetVersion"]) == (14, 15)
    assert golden_gate(golden) is None
    assert "attested by Ana Lopez" in json.dumps(_golden(malloy_set, MALLOY_QID))
    out = capsys.readouterr().out
    assert "datasetVersion: 14 -> 15" in out
    # The set names a truth package this copy does not hold: said, not silently skipped.
    assert "not re-derived (no truth connection here: " in out
    assert "the golden stands on Ana Lopez's word alone" in out


def test_attest_needs_a_name(malloy_set: Path) -> None:
    before = Snapshot(malloy_set)
    with pytest.raises(GoldenUsageError, match="--by"):
        attest(malloy_set, MALLOY_QID, by="  ")
    assert cli.main(["golden", "attest", str(malloy_set), MALLOY_QID]) == 2
    before.assert_untouched()


def test_repair_on_the_malloy_set_leaves_it_provisional(malloy_set: Path) -> None:
    before = Snapshot(malloy_set)
    old = before.row(MALLOY_QID)
    value = dict(old["golden"]["value"])
    first = next(k for k in value if k not in ("round", "currency"))
    value[first] = value[first] + 1
    repair(malloy_set, MALLOY_QID, value=value, reason="off by one", by="Ana")
    row = before.assert_one_row_changed(MALLOY_QID)
    assert row["golden"]["status"] == "provisional"
    assert row["goldenRevision"] == old["goldenRevision"] + 1


# ----------------------------------------------------------------------------- the rewrite


def test_unknown_qid_names_the_file_and_the_qid(
    eco: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["golden", "hold", str(eco), "ecom_nope", "--reason", "r"]) == 2
    err = capsys.readouterr().err
    assert "ecom_nope" in err and str(eco / "cases.jsonl") in err


def test_a_broken_seal_is_reported_not_rewritten(eco: Path) -> None:
    _rewrite_row(eco, SCALAR, lambda r: r.update(question=r["question"] + " Really?"))
    before = Snapshot(eco)
    with pytest.raises(GoldenUsageError, match="question edited after sealing"):
        hold(eco, SCALAR, reason="r")
    before.assert_untouched()


def test_compact_rows_keep_their_style(eco: Path) -> None:
    path = eco / sets.CASES_FILE
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    path.write_text(
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows), encoding="utf-8"
    )
    before = Snapshot(eco)
    hold(eco, SCALAR, reason="r")
    before.assert_one_row_changed(SCALAR)
    changed = path.read_bytes().splitlines()[before.line_of(SCALAR)]
    assert b'"status":"ambiguous"' in changed and b", " not in changed.split(b'"rubric"')[0]


def test_a_set_without_a_version_gets_one(eco: Path) -> None:
    meta = eco / sets.SET_FILE
    data = json.loads(meta.read_text(encoding="utf-8"))
    del data["datasetVersion"]
    meta.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    change = hold(eco, SCALAR, reason="r")
    assert json.loads(meta.read_text(encoding="utf-8"))["datasetVersion"] == 2
    assert meta.read_text(encoding="utf-8").startswith('{\n  "datasetVersion": 2,\n  "name"')
    assert change.record.old_dataset_version is None


def test_the_next_step_names_the_runs_that_scored_the_case(
    eco: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = eco / "runs" / "ecommerce-baseline-01"
    run.mkdir(parents=True)
    events = [
        {"kind": "attempt", "qid": SCALAR},
        {"kind": "score", "qid": SCALAR, "verdict": "match"},
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    other = eco / "runs" / "ecommerce-baseline-02"
    other.mkdir()
    (other / "events.jsonl").write_text(json.dumps({"kind": "score", "qid": ROWS}) + "\n")
    assert cli.main(["golden", "hold", str(eco), SCALAR, "--reason", "r"]) == 0
    capsys.readouterr()
    assert cli.main(["golden", "release", str(eco), SCALAR, "--reason", "r"]) == 0
    out = capsys.readouterr().out
    assert f"pytest {eco} --eval-rejudge-from={run}" in out
    assert "ecommerce-baseline-02" not in out


# ----------------------------------------------------------------------------- a path golden


def test_a_rows_file_golden_verifies_and_promotes(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    set_dir = pytester.path / "evals" / "ecommerce"
    shutil.copytree(EXAMPLE_SET, set_dir, ignore=shutil.ignore_patterns("runs"))
    right = Snapshot(set_dir).row(ROWS)["golden"]["value"]
    _rewrite_row(set_dir, ROWS, lambda r: r["golden"]["value"][0].update(orders=1))
    (set_dir / "gold").mkdir()
    (set_dir / "gold" / f"{ROWS}.json").write_text(json.dumps(right), encoding="utf-8")
    monkeypatch.chdir(set_dir)  # the command as the issue ran it, from the set directory
    args = ["golden", "repair", str(set_dir), ROWS, "--rows-file", f"gold/{ROWS}.json"]
    assert cli.main([*args, "--reason", "replayed the stored final query"]) == 0, (
        capsys.readouterr().err
    )
    golden = _golden(set_dir, ROWS)
    assert golden["path"] == f"gold/{ROWS}.json" and "value" not in golden
    assert golden["status"] == "verified"
    result = pytester.runpytest_subprocess(
        str(set_dir), "--eval-verify-goldens", "-k", ROWS, "-p", "no:cacheprovider"
    )
    assert "got None" not in result.stdout.str()
    result.assert_outcomes(passed=1)
    assert sets.golden_value(set_dir, golden) == right
    # promote reads the artifact as well: a provisional path golden is lifted once it derives
    _rewrite_row(set_dir, ROWS, lambda r: r["golden"].update(status="provisional"))
    assert cli.main(["golden", "promote", str(set_dir), ROWS, "--by", "ci"]) == 0, (
        capsys.readouterr().err
    )
    assert _golden(set_dir, ROWS)["status"] == "verified"


def test_a_path_golden_that_drifts_is_caught_by_its_artifact(eco: Path) -> None:
    right = Snapshot(eco).row(ROWS)["golden"]["value"]
    wrong = [dict(row, orders=row["orders"] + 1) for row in right]
    (eco / "gold").mkdir()
    (eco / "gold" / "wrong.json").write_text(json.dumps(wrong), encoding="utf-8")
    before = Snapshot(eco)
    with pytest.raises(GoldenRefused, match="does not re-derive"):
        repair(eco, ROWS, rows_file=eco / "gold" / "wrong.json", reason="r")
    before.assert_untouched()
    # named relative to the set, from another directory: the same artifact
    with pytest.raises(GoldenRefused, match="'orders': 10826} is not among the derived rows"):
        repair(eco, ROWS, rows_file=Path("gold/wrong.json"), reason="r")


# ----------------------------------------------------------------------------- attest in bulk


def _provisional_rows(set_dir: Path, changes: dict[str, Any]) -> None:
    """Rows of `changes` made provisional (the test's setup, not a side-door change)."""
    path = set_dir / sets.CASES_FILE
    lines = path.read_text(encoding="utf-8").splitlines()
    for index, line in enumerate(lines):
        row = json.loads(line)
        if row["qid"] in changes:
            row["golden"]["status"] = "provisional"
            changes[row["qid"]](row["golden"])
            lines[index] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_attest_all_provisional_attests_what_the_truth_reproduces_one_change_each(
    eco: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def wrong(golden: dict[str, Any]) -> None:
        golden["value"] = {k: v + 1 for k, v in golden["value"].items()}

    _provisional_rows(
        eco,
        {
            SCALAR: lambda g: None,
            "ecom_order_count": lambda g: None,
            "ecom_cancellation_rate": wrong,
            "ecom_roas": lambda g: None,  # unanswerable: a person attests it alone
        },
    )
    version = json.loads((eco / sets.SET_FILE).read_text())["datasetVersion"]
    args = ["golden", "attest", str(eco), "--all-provisional", "--by", "Ana Lopez"]
    assert cli.main([*args, "--reason", "re-derived on the truth tables"]) == 1  # some refused
    out = capsys.readouterr().out
    assert f"attest --all-provisional {eco}: 2 attested, 2 refused" in out
    assert "refused ecom_cancellation_rate (cases.jsonl:" in out
    assert "contradicted by the truth data: " in out and ", derived " in out
    assert "refused ecom_roas (cases.jsonl:" in out and "the golden is unanswerable" in out
    records = [json.loads(x) for x in (eco / CHANGES_FILE).read_text().splitlines()]
    assert sorted((r["qid"], r["action"], r["by"]) for r in records) == sorted(
        [(SCALAR, "attest", "Ana Lopez"), ("ecom_order_count", "attest", "Ana Lopez")]
    )
    assert [r["newDatasetVersion"] for r in records] == [version + 1, version + 2]
    assert all(r["why"] == "re-derived on the truth tables" for r in records)
    statuses = {q: _golden(eco, q)["status"] for q in (SCALAR, "ecom_order_count")}
    assert statuses == {SCALAR: "verified", "ecom_order_count": "verified"}
    assert _golden(eco, "ecom_cancellation_rate")["status"] == "provisional"
    assert _golden(eco, "ecom_roas")["status"] == "provisional"
    # Nothing provisional is left that the truth reproduces: a second pass attests nothing.
    assert cli.main(args) == 1
    assert "0 attested, 2 refused" in capsys.readouterr().out


def test_attest_takes_one_qid_or_all_provisional(
    eco: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = Snapshot(eco)
    both = ["golden", "attest", str(eco), SCALAR, "--all-provisional", "--by", "Ana"]
    assert cli.main(both) == 2
    assert cli.main(["golden", "attest", str(eco), "--by", "Ana"]) == 2
    assert "not both, not neither" in capsys.readouterr().err
    before.assert_untouched()


def test_attest_all_provisional_without_a_truth_connection_attests_nothing(
    malloy_set: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = Snapshot(malloy_set)
    args = ["golden", "attest", str(malloy_set), "--all-provisional", "--by", "Ana"]
    assert cli.main(args) == 1
    out = capsys.readouterr().out
    assert "0 attested, 49 refused" in out
    assert "truthPackage 'ecommerce-truth' is no folder beside the set or above it" in out
    before.assert_untouched()
