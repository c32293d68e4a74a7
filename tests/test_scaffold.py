"""`evalloop init <dir>` writes a minimal set of one's own that collects and whose golden
re-derives offline (`--eval-verify-goldens`), and never writes over a folder that holds files."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
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
    assert "is not an empty folder" in capsys.readouterr().err
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]


def test_init_and_demo_refuse_a_file_and_quote_what_they_print(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "a file"
    a_file.write_text("mine")
    for command in (["init", str(a_file)], ["demo", "--dir", str(a_file)]):
        assert evalloop(command) == 2, command
        assert "is not an empty folder" in capsys.readouterr().err
    assert a_file.read_text() == "mine"
    # A folder name with a space: the printed next command pastes into a shell as it is. In a
    # child process: duckdb, which init imports, cannot be imported twice in one process, and a
    # pytester test before this one in the same worker unloads it.
    set_dir = tmp_path / "my orders"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "evalloop"), "init", str(set_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [line] = [ln for ln in done.stdout.splitlines() if "--eval-verify-goldens" in ln]
    assert shlex.split(line.split("#")[0]) == ["pytest", str(set_dir), "--eval-verify-goldens"]


def test_a_folder_that_cannot_be_written_is_a_clear_error_and_a_homeless_cache_is_no_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under a file nothing can be made: init and demo say so (exit 2), never a traceback. A
    home whose cache folder cannot be made (HOME=/ in a CI container) is no reason to stop:
    the example data is a cache, kept in the temporary folder instead."""
    a_file = tmp_path / "afile"
    a_file.write_text("mine")
    assert evalloop(["demo", "--dir", str(a_file / "sub")]) == 2
    assert "cannot write" in capsys.readouterr().err
    env = {k: v for k, v in os.environ.items() if k != "EVALLOOP_CACHE_DIR"}
    env["HOME"] = str(a_file / "home")  # under a file: ~/.cache cannot be made
    command = [str(Path(sys.executable).parent / "evalloop"), "init"]
    done = subprocess.run(
        [*command, str(a_file / "sub")], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot write" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run(
        [*command, str(tmp_path / "orders")], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "orders" / "set.json").is_file()
    assert a_file.read_text() == "mine"
