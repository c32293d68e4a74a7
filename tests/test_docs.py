"""The docs stay true to the code: every option, ini key, fixture and hook is documented, every
link in the README and the configuration reference resolves, and every example marked runnable
(`<!-- runnable: ... -->`) runs offline against the example set and measures what its page
says."""

from __future__ import annotations

import ast
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_evalloop import hookspecs, options
from pytest_evalloop.goldens.preflight import EXIT_NOTHING_TO_ANSWER
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure.gate import (
    EXIT_GATE_REJECTED,
    EXIT_HARNESS_FAILURE,
    EXIT_NOTHING_MEASURED,
    EXIT_RUN_UNFINISHED,
)
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from tests import forkserver
from tests.conftest import EXAMPLE_SET, REPO, SECRET

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
    assert f"| {EXIT_NOTHING_MEASURED} | `EXIT_NOTHING_MEASURED`" in reference
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


# --- every documented example marked runnable runs, offline ----------------------------------

# `<!-- runnable: spec; args: ...; expect: ... -->` or `<!-- runnable: shell; exits: ... -->`
# right before a fenced block (docs/testing.md says what each kind runs).
RUNNABLE = re.compile(
    r"<!-- runnable: (?P<kind>spec|shell)(?P<options>[^>]*)-->\n```\w*\n(?P<body>.*?)\n```",
    re.DOTALL,
)
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FLIPPED = [
    "What is our average order value?",
    "How many orders have customers placed in total?",
    "What percentage of our orders contain more than one item?",
    "On average, how many items are in an order?",
    "How many customers have placed more than 10 orders?",
]
"""The shell examples' endpoint judges these no_match once, then match: a first run fails them
and a second, gated one is accepted (5 better, none worse)."""


@dataclass(frozen=True)
class Example:
    doc: str
    line: int
    kind: str
    body: str
    options: dict[str, str]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def runnable_examples() -> list[Example]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in RUNNABLE.finditer(text):
            options = {}
            for part in match["options"].split(";"):
                key, _, value = part.partition(":")
                if key.strip():
                    options[key.strip()] = value.strip()
            line = text.count("\n", 0, match.start()) + 1
            found.append(
                Example(str(path.relative_to(REPO)), line, match["kind"], match["body"], options)
            )
    return found


EXAMPLES = runnable_examples()


def test_the_runnable_examples_are_found() -> None:
    """Lists what the parametrized test below runs (ids are `doc:line`)."""
    kinds = [e.kind for e in EXAMPLES]
    assert kinds.count("spec") >= 2 and kinds.count("shell") >= 2, kinds
    docs = sorted({e.doc for e in EXAMPLES})
    print(f"tests/test_docs.py runs {len(EXAMPLES)} documented examples from {docs}")
    for example in EXAMPLES:
        assert example.kind == "spec" or "exits" in example.options, example.id
        assert example.kind == "shell" or "expect" in example.options, example.id
    # A marker the pattern does not read (a typo, no fence right after it) would leave its
    # example silently unrun. A marker starts its line; one quoted in running text (testing.md
    # describes the two kinds) is not one.
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        marked = len(re.findall(r"^<!--\s*runnable", text, re.MULTILINE))
        assert marked == len(RUNNABLE.findall(text)), f"{path.name}: a runnable marker not read"


def _scratch(tmp_path: Path) -> Path:
    """A project folder holding a copy of the example set (runs are written there)."""
    set_dir = tmp_path / "evals" / "ecommerce"
    set_dir.mkdir(parents=True)
    for name in ("set.json", "cases.jsonl", "model.json"):
        shutil.copy(EXAMPLE_SET / name, set_dir / name)
    return tmp_path


def _shell_spec(scratch: Path) -> ScriptSpec:
    from pytest_evalloop import scaffold
    from tests.test_run import ORACLE

    own = [
        {"tool": "execute_query", "input": {"sql": scaffold.MODEL_QUERY}},
        {"text": f"Final query:\n```sql\n{scaffold.MODEL_QUERY}\n```"},
    ]
    flip = [{"verdict": "no_match", "why": "counted lines"}, {"verdict": "match"}]
    return ScriptSpec.model_validate(
        {
            "cases_file": str(scratch / "evals" / "ecommerce" / "cases.jsonl"),
            "answerer": {"default": ORACLE, "by_question": {scaffold.QUESTION: own}},
            "judge": {"default": {"verdict": "match"}, "by_question": dict.fromkeys(FLIPPED, flip)},
        }
    )


def _command(line: str) -> list[str]:
    """A documented command line as argv: comments and leading `VAR=value` settings dropped
    (the fake endpoint's variables are set for every command)."""
    argv = shlex.split(line, comments=True)
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):
        argv.pop(0)
    return argv


def _run(argv: list[str], scratch: Path, env: dict[str, str]) -> tuple[int, str]:
    if argv[0] == "pytest":
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *argv[1:]]
        done = forkserver.run_pytest(cmd, cwd=scratch, env=env, timeout=600, merge=True)
        return done.returncode, done.stdout
    assert argv[0] == "evalloop", f"a runnable shell line runs pytest or evalloop: {argv}"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "evalloop"), *argv[1:]],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.id)
def test_a_documented_example_runs_as_the_page_says(example: Example, tmp_path: Path) -> None:
    scratch = _scratch(tmp_path)
    if example.kind == "spec":
        (scratch / "spec.json").write_text(example.body, encoding="utf-8")
        spec = ScriptSpec.load(scratch / "spec.json")  # the page's JSON, as --policy-file reads it
        with FakeAnthropic(spec) as fake:
            env = {**os.environ, **fake.env(SECRET)}
            argv = ["pytest", "evals/ecommerce", *shlex.split(example.options.get("args", ""))]
            code, out = _run(argv, scratch, env)
        last = out.strip().splitlines()[-1]
        assert example.options["expect"] in last, f"{example.id}: {out[-4000:]}"
        assert code != EXIT_NOTHING_MEASURED and "measured nothing" not in out, out[-4000:]
        # A step the target refuses can still end as the page says (the answer's own final
        # query is re-executed), so the outcome alone would not catch a tool name or argument
        # the page gets wrong: every scripted call must be one the target accepts.
        runs = scratch / "evals" / "ecommerce" / "runs"
        [run_dir] = [p for p in runs.iterdir() if (p / "run.json").is_file()]
        calls = ledger_reader.read_run(run_dir, kinds=frozenset({"tool_call"})).of_kind("tool_call")
        refused = [f"{c.tool}: {c.error}" for c in calls if c.error]
        assert calls and not refused, f"{example.id}: the target refused {refused}"
        return
    lines = [line for line in example.body.splitlines() if line.strip()]
    exits = example.options["exits"].split()
    assert len(exits) == len(lines), f"{example.id}: one exit status per line ({lines})"
    with FakeAnthropic(_shell_spec(scratch)) as fake:
        env = {**os.environ, **fake.env(SECRET)}
        for line, wanted in zip(lines, exits, strict=True):
            if wanted == "skip":  # a server, or an install: not a measurement
                continue
            code, out = _run(_command(line), scratch, env)
            assert code == int(wanted), f"{example.id}: `{line}` exited {code}:\n{out[-4000:]}"
            assert "measured nothing" not in out, out[-4000:]
