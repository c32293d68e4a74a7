"""Into your own repository: the built wheel installs into a fresh virtual environment, outside
the checkout, and `evalloop demo` runs there from nothing to a report and a gate decision.

Offline: the wheel is built with the dev environment's setuptools (`--no-build-isolation`), and
the fresh environment sees the dependencies already installed here through one `.pth` folder
of links (every distribution of this environment but pytest-evalloop itself), so `pip install
--no-index` resolves the wheel's requirements against them without a registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from pytest_evalloop.ledger import reader as ledger_reader
from tests.conftest import EXAMPLE_SET, REPO, SECRET

SOURCES = ("pyproject.toml", "README.md")
OWN = ("pytest_evalloop", "__editable__", "_pytest_evalloop")


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Outside the checkout (a `python -c` there would import its package first), without
    this session's PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{argv}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def build_wheel(tmp: Path) -> Path:
    """The wheel of a clean copy of the sources (the checkout is never built in)."""
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        shutil.copy(REPO / name, src / name)
    # The package, its links to the example set kept as links, and what they point at.
    shutil.copytree(
        REPO / "pytest_evalloop",
        src / "pytest_evalloop",
        symlinks=True,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    (src / "evals").mkdir()
    shutil.copytree(EXAMPLE_SET, src / "evals" / "ecommerce", ignore=shutil.ignore_patterns("runs"))
    out = tmp / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    _run([*pip, "-w", str(out), str(src)], tmp)
    [wheel] = out.glob("pytest_evalloop-*.whl")
    return wheel


def fresh_environment(tmp: Path) -> Path:
    """A new venv whose only view of this one is a folder of links to its distributions."""
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp)
    deps = tmp / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name.startswith(OWN) or entry.suffix == ".pth" or entry.name == "__pycache__":
            continue
        (deps / entry.name).symlink_to(entry)
    python = venv / "bin" / "python"
    purelib = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp
    ).stdout.strip()
    (Path(purelib) / "evalloop-test-deps.pth").write_text(f"{deps}\n", encoding="utf-8")
    return venv


def test_the_wheel_installs_into_a_fresh_venv_and_the_demo_runs_there(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    venv = fresh_environment(tmp_path)
    python = venv / "bin" / "python"
    # pip checks every requirement of the wheel against what the environment has: no index.
    _run([str(python), "-m", "pip", "install", "--no-index", "-q", str(wheel)], tmp_path)
    found = _run([str(python), "-c", "import pytest_evalloop as p; print(p.__file__)"], tmp_path)
    where = found.stdout
    assert Path(where.strip()).is_relative_to(venv), where  # the wheel's copy, not the checkout's
    work = tmp_path / "elsewhere"
    work.mkdir()
    # A user's own endpoint variables never reach the demo's runs (they go to the fake only).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update({"ANTHROPIC_API_KEY": SECRET, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"})
    done = subprocess.run(
        [str(venv / "bin" / "evalloop"), "demo", "--dir", "demo"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-6000:]
    runs = work / "demo" / "evals" / "ecommerce" / "runs"
    baseline = ledger_reader.read_run(runs / "demo-baseline")
    changed = ledger_reader.read_run(runs / "demo-change")
    assert baseline.errors == [] and changed.errors == []
    verdicts = [s.verdict for s in baseline.scores().values()]
    assert verdicts.count("no_match") == 6 and "near_match" in verdicts
    assert changed.info is not None and (changed.info.gate or {})["decision"] == "accepted"
    assert "better (no_match -> match): 6   worse (match -> no_match): 0" in said
    assert f"report:     {runs / 'demo-change' / 'report.html'}" in said
    assert (runs / "demo-change" / "report.html").is_file() and (runs / "index.html").is_file()
    assert "gate:       accepted (bar), exit 0" in said
    # The copy changed, never the set that ships (nor the checkout's).
    shipped = json.loads((EXAMPLE_SET / "model.json").read_text(encoding="utf-8"))
    copied = json.loads((work / "demo" / "evals" / "ecommerce" / "model.json").read_text("utf-8"))
    assert shipped != copied
    for path in (work / "demo").rglob("*"):
        assert not path.is_file() or SECRET not in path.read_text(errors="replace")
