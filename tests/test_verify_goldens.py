"""`--eval-verify-goldens` as a user runs it: offline, one item per case, drift named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import EXAMPLE_SET


def _copy(root: Path) -> Path:
    target = root / "evals" / "ecommerce"
    shutil.copytree(EXAMPLE_SET, target, ignore=shutil.ignore_patterns("runs"))
    return target


def test_every_golden_re_derives_offline(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    set_dir = _copy(pytester.path)
    cases = len((set_dir / "cases.jsonl").read_text().splitlines())
    result = pytester.runpytest_subprocess(str(set_dir), "--eval-verify-goldens", "-q")
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=cases)


def test_one_changed_golden_fails_exactly_its_item_with_both_values(
    pytester: pytest.Pytester,
) -> None:
    set_dir = _copy(pytester.path)
    lines = (set_dir / "cases.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    [(column, stored)] = list(row["golden"]["value"].items())
    row["golden"]["value"][column] = stored + 1
    lines[0] = json.dumps(row)
    (set_dir / "cases.jsonl").write_text("\n".join(lines) + "\n")
    result = pytester.runpytest_subprocess(str(set_dir), "--eval-verify-goldens", "-q")
    result.assert_outcomes(passed=len(lines) - 1, failed=1)
    out = result.stdout.str()
    assert f"golden drifted for {row['qid']}" in out
    assert str(stored + 1) in out and str(stored) in out
    assert "route canonical" in out


@pytest.mark.parametrize("defect", ["same-axes", "same-query"])
def test_a_golden_whose_two_derivations_are_one_does_not_pass(
    pytester: pytest.Pytester, defect: str
) -> None:
    set_dir = _copy(pytester.path)
    lines = (set_dir / "cases.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    verification = row["golden"]["verification"]
    if defect == "same-axes":
        verification["variesAxis"] = "  " + verification["primaryAxis"].upper()
        says = "names the same axis twice"
    else:
        verification["secondQuery"] = row["golden"]["canonicalQuery"].upper()
        says = "secondQuery is the canonicalQuery again"
    lines[1] = json.dumps(row)
    (set_dir / "cases.jsonl").write_text("\n".join(lines) + "\n")
    result = pytester.runpytest_subprocess(
        str(set_dir), "--eval-verify-goldens", "-q", "-k", row["qid"]
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert f"golden not proven two ways for {row['qid']}" in out
    assert says in out.replace("\n", " ")


def _rewrite(set_dir: Path, qid: str, change: Any) -> dict[str, Any]:
    lines = (set_dir / "cases.jsonl").read_text().splitlines()
    for index, line in enumerate(lines):
        row = json.loads(line)
        if row["qid"] == qid:
            change(row)
            lines[index] = json.dumps(row)
            (set_dir / "cases.jsonl").write_text("\n".join(lines) + "\n")
            return dict(row)
    raise AssertionError(qid)


def test_truth_tables_that_are_missing_are_could_not_verify_never_drifted(
    pytester: pytest.Pytester,
) -> None:
    set_dir = _copy(pytester.path)
    meta = json.loads((set_dir / "set.json").read_text())
    meta["target"]["data"] = "no-tables"  # a folder holding none of the truth tables
    (set_dir / "no-tables").mkdir()
    (set_dir / "set.json").write_text(json.dumps(meta))
    result = pytester.runpytest_subprocess(
        str(set_dir), "--eval-verify-goldens", "-q", "-k", "ecom_order_count"
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "could not verify the golden of ecom_order_count" in out
    assert "route canonical: could not verify: the canonical query did not run" in out
    assert "lacks" in out and "golden drifted" not in out


def test_a_provisional_golden_is_skipped_with_what_it_lacks_unless_its_own_query_contradicts_it(
    pytester: pytest.Pytester,
) -> None:
    set_dir = _copy(pytester.path)

    def provisional(row: dict[str, Any]) -> None:
        row["golden"]["status"] = "provisional"
        del row["golden"]["verification"]

    _rewrite(set_dir, "ecom_order_count", provisional)

    def wrong(row: dict[str, Any]) -> None:
        provisional(row)
        row["golden"]["value"] = {k: v + 1 for k, v in row["golden"]["value"].items()}

    _rewrite(set_dir, "ecom_average_order_value", wrong)
    result = pytester.runpytest_subprocess(
        str(set_dir),
        "--eval-verify-goldens",
        "-rs",
        "-k",
        "ecom_order_count or ecom_average_order_value",
    )
    result.assert_outcomes(skipped=1, failed=1)
    out = result.stdout.str()
    assert (
        "provisional golden of ecom_order_count, not scored: its canonical query reproduces " in out
    )
    assert "to be verified it lacks a second derivation" in out
    assert "golden drifted for ecom_average_order_value" in out
