"""`evalloop init <dir>` writes a minimal set of one's own that collects and whose golden
re-derives offline (`--eval-verify-goldens`), and never writes over a folder that holds files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_evalloop.cli import main as evalloop
from pytest_evalloop.sets import cases as sets


def test_init_writes_a_set_that_collects_and_verifies(
    pytester: pytest.Pytester,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_dir = pytester.path / "evals" / "orders"
    assert evalloop(["init", str(set_dir)]) == 0
    said = capsys.readouterr().out
    assert f"pytest {set_dir} --eval-verify-goldens" in said
    loaded = sets.load_cases(set_dir)
    assert loaded.errors == [] and [c.qid for _, c in loaded.rows] == ["order_count"]
    [(_, row)] = loaded.rows
    assert row.golden is not None and row.golden.status == "verified"
    assert json.loads((set_dir / "set.json").read_text())["name"] == "orders"
    collected = pytester.runpytest_subprocess(str(set_dir), "--collect-only", "-q")
    assert collected.ret == 0, collected.stdout.str()
    collected.stdout.fnmatch_lines(["evals/orders/cases.jsonl::order_count"])
    # No endpoint is needed: the golden is re-derived on the truth connection, both ways.
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    verified = pytester.runpytest_subprocess(str(set_dir), "--eval-verify-goldens", "-q")
    assert verified.ret == 0, verified.stdout.str()
    assert verified.parseoutcomes() == {"passed": 1}


def test_init_refuses_a_folder_with_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    assert evalloop(["init", str(target)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]
