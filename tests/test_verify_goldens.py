"""`--eval-verify-goldens` as a user runs it: offline, one item per case, drift named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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
