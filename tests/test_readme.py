"""The README's two commands work as written (the main job against the fake endpoint)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from tests.conftest import EXAMPLE_SET, REPO, SECRET
from tests.test_run import ORACLE


def readme_commands() -> list[str]:
    """The indented commands at the top of README.md, before the first rule."""
    head = (REPO / "README.md").read_text(encoding="utf-8").split("\n---", 1)[0]
    return [line.strip() for line in head.splitlines() if line.startswith("    ")]


def test_the_readme_opens_with_the_demo_then_the_two_commands() -> None:
    demo_cmd, eval_cmd, test_cmd = readme_commands()[:3]
    assert re.fullmatch(r"make demo(\s+#.*)?", demo_cmd) and "evalloop demo" in demo_cmd
    assert re.fullmatch(r"ANTHROPIC_API_KEY=\.\.\. make eval(\s+#.*)?", eval_cmd)
    assert test_cmd == "make test"
    assert "make test" in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_make_eval_and_make_demo_install_runtime_dependencies_only() -> None:
    """What `make eval` and `make demo` would run on a fresh clone (`-n -B`: print every recipe,
    run none): the package without its dev extras."""
    if shutil.which("make") is None:
        pytest.fail("make is not installed; the README's commands need it")
    for target in ("eval", "demo"):
        plan = subprocess.run(
            ["make", "-n", "-B", target], cwd=REPO, capture_output=True, text=True, timeout=60
        ).stdout
        installs = [line for line in plan.splitlines() if "pip install" in line]
        assert any(line.rstrip().endswith("-e .") for line in installs), plan
        assert not any("[dev]" in line for line in installs), plan


def _make_eval(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None:
        pytest.fail("make is not installed; the README's commands need it")
    return subprocess.run(
        ["make", "eval"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


def test_the_main_job_runs_verbatim_against_the_fake_endpoint() -> None:
    spec = ScriptSpec.model_validate(
        {
            "cases_file": str(EXAMPLE_SET / sets.CASES_FILE),
            "answerer": {"default": ORACLE},
            "judge": {"default": {"verdict": "match"}},
        }
    )
    runs_dir = EXAMPLE_SET / "runs"
    before = set(runs_dir.iterdir()) if runs_dir.is_dir() else set()
    with FakeAnthropic(spec) as fake:
        # README: `ANTHROPIC_API_KEY=... make eval`, with ANTHROPIC_BASE_URL for another endpoint.
        env = {**os.environ, "ANTHROPIC_API_KEY": SECRET, "ANTHROPIC_BASE_URL": fake.base_url}
        done = _make_eval(env)
    new = [p for p in set(runs_dir.iterdir()) - before if p.is_dir()]
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        [run_dir] = new
        read = ledger_reader.read_run(run_dir)
        assert read.errors == []
        cases = sets.load_cases(EXAMPLE_SET).rows
        assert len(read.of_kind("score")) == len(cases) == len(read.scores())
        assert "evalloop: " in done.stdout and f"{len(cases)} passed" in done.stdout
        for path in run_dir.rglob("*"):
            assert not path.is_file() or SECRET not in path.read_text(errors="replace")
    finally:
        for path in new:
            shutil.rmtree(path)


def test_the_main_job_without_an_endpoint_says_what_to_set() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    done = _make_eval(env)
    assert done.returncode != 0
    assert "set ANTHROPIC_API_KEY" in done.stderr
    assert "--eval-verify-goldens" in done.stderr
    assert "`evalloop demo`" in done.stderr  # the way to see a run without a key
