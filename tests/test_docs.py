"""The docs stay true to the code: every option, ini key, fixture and hook is documented, and
every link in the README and the configuration reference resolves."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_evalloop import hookspecs, options
from pytest_evalloop.goldens.preflight import EXIT_NOTHING_TO_ANSWER
from pytest_evalloop.measure.gate import (
    EXIT_GATE_REJECTED,
    EXIT_HARNESS_FAILURE,
    EXIT_RUN_UNFINISHED,
)
from tests.conftest import REPO

CONFIGURATION = REPO / "docs" / "configuration.md"
PLUGIN_MODULES = [
    REPO / "pytest_evalloop" / "plugin.py",
    REPO / "pytest_evalloop" / "skills" / "plugin.py",
]
# A Markdown link target: [text](target), the target up to `)`, a space or a `#` anchor.
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


@pytest.fixture(scope="module")
def reference() -> str:
    return CONFIGURATION.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def help_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`pytest --help` in a fresh process: every option and ini key any of our plugins adds."""
    cwd = tmp_path_factory.mktemp("help")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def table_row(reference: str, name: str) -> str:
    """The reference's table row whose first cell is `name` (in backticks)."""
    rows = [line for line in reference.splitlines() if line.startswith(f"| `{name}` |")]
    assert rows, f"docs/configuration.md has no table row for `{name}`; add one"
    return rows[0]


@pytest.mark.parametrize("opt", options.OPTIONS, ids=lambda o: o.flag)
def test_every_option_is_documented_with_its_ini_twin(reference: str, opt: options.Opt) -> None:
    row = table_row(reference, opt.flag)
    if opt.flag_only:
        assert "command line only" in row, f"{opt.flag} is flag-only; its row must say so"
    else:
        assert f"`{opt.ini}`" in row, f"the row of {opt.flag} must name its ini key {opt.ini}"
    if opt.default not in (None, False):
        assert str(opt.default) in row.replace(",", ""), f"{opt.flag}: default {opt.default}"


def test_every_flag_and_ini_key_in_pytest_help_is_documented(
    reference: str, help_text: str
) -> None:
    group = help_text.split("LLM evaluation loop (pytest-evalloop):", 1)[1].split("\n\n", 1)[0]
    flags = set(re.findall(r"^  (--[a-z0-9-]+)", group, re.MULTILINE))
    assert {"--eval-split", "--baseline", "--eval-skill-strictness"} <= flags  # parsed at all
    ini_keys = set(re.findall(r"^  (eval_[a-z0-9_]+) \(", help_text, re.MULTILINE))
    assert {"eval_split", "eval_skills"} <= ini_keys
    undocumented = sorted(f for f in flags if f"| `{f}` |" not in reference)
    assert undocumented == [], f"options missing from docs/configuration.md: {undocumented}"
    unnamed = sorted(k for k in ini_keys if f"`{k}`" not in reference)
    assert unnamed == [], f"ini keys missing from docs/configuration.md: {unnamed}"


def test_every_hook_is_documented(reference: str) -> None:
    hooks = [
        n
        for n, f in inspect.getmembers(hookspecs, inspect.isfunction)
        if n.startswith("pytest_evalloop_")
    ]
    assert len(hooks) >= 5
    for name in hooks:
        row = table_row(reference, name)
        firstresult = getattr(getattr(hookspecs, name), "pytest_spec", {}).get("firstresult", False)
        assert row.split("|")[4].strip() == ("yes" if firstresult else "no"), name
        spec = inspect.signature(getattr(hookspecs, name))
        for argument in spec.parameters:
            assert f"`{argument}`" in row, f"the row of {name} must name its argument {argument}"


def fixture_names(path: Path) -> list[str]:
    """Functions decorated with `pytest.fixture` (bare or called) in a module's source."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if isinstance(target, ast.Attribute) and target.attr == "fixture":
                names.append(node.name)
    return names


def test_every_fixture_is_documented(reference: str) -> None:
    names = [name for path in PLUGIN_MODULES for name in fixture_names(path)]
    assert "evalloop_answerer" in names and "evalloop_runtime" in names
    for name in names:
        table_row(reference, name)


def test_exit_statuses_match_the_constants(reference: str) -> None:
    assert f"| {EXIT_GATE_REJECTED} | `EXIT_GATE_REJECTED`" in reference
    assert f"| {EXIT_HARNESS_FAILURE} | `EXIT_HARNESS_FAILURE`" in reference
    assert f"| {EXIT_NOTHING_TO_ANSWER} | `EXIT_NOTHING_TO_ANSWER`" in reference
    assert f"| {EXIT_RUN_UNFINISHED} | `EXIT_RUN_UNFINISHED`" in reference
    for code in pytest.ExitCode:
        assert f"\n| {int(code)} |" in reference, f"pytest exit status {int(code)} ({code.name})"


@pytest.mark.parametrize(
    "variable",
    ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "EVALLOOP_CACHE_DIR"],
)
def test_environment_variables_are_documented(reference: str, variable: str) -> None:
    assert f"`{variable}`" in reference


def test_the_offline_rule_names_the_variables_the_endpoint_check_reads(
    reference: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert options.endpoint_missing() is not None
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    assert options.endpoint_missing() is None  # the documented offline setting passes the check
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:9" in reference


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(path.read_text(encoding="utf-8")) if "://" not in t]


@pytest.mark.parametrize("doc", ["README.md", "docs/configuration.md"])
def test_every_local_link_resolves(doc: str) -> None:
    path = REPO / doc
    found = links(path)
    assert found, f"{doc} links nothing"
    missing = [t for t in found if not (path.parent / t).exists()]
    assert missing == [], f"{doc} links to files that do not exist: {missing}"


def test_readme_links_every_doc_it_names() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    named = re.findall(r"\(docs/([\w.-]+\.md)\)", readme)
    assert "configuration.md" in named
    assert [n for n in named if not (REPO / "docs" / n).is_file()] == []


def test_each_example_is_a_folder_with_a_conftest_and_a_docstring() -> None:
    examples = sorted(
        p
        for p in (REPO / "conftest_examples").iterdir()
        if p.is_dir() and not p.name.startswith(("_", "."))
    )
    assert {p.name for p in examples} >= {"own_answerer", "own_judge", "hooks", "publisher_target"}
    for folder in examples:
        module = ast.parse((folder / "conftest.py").read_text(encoding="utf-8"))
        doc = ast.get_docstring(module)
        assert doc and len(doc.splitlines()) >= 5, (
            f"{folder.name}/conftest.py needs its README docstring"
        )
