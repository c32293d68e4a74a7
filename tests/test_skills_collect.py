"""Collecting skills: lint items per SKILL.md, scenario items per evals/<name>.yaml, options."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_skills_lint import sidecar_text

REPO = Path(__file__).resolve().parents[1]
# Inline pytester runs re-import the already imported package: its rewrite warning is noise here.
PLUGIN = [
    "-p",
    "pytest_evalloop.skills.plugin",
    "-p",
    "no:cacheprovider",
    "-W",
    "ignore::pytest.PytestAssertRewriteWarning",
]

GOOD = """\
---
name: {id}
description: Summarise quarterly {id} figures for the finance team. Use when the user asks for a quarterly summary.
---
# {id}
{filler}
## Done when
- the summary is written
"""
SCENARIOS = {
    "summary": "assert: {{shouldActivate: true}}\nrubric: [names the quarter]\n",
    "other-quarter": "assert: {{shouldActivate: true}}\ninvocation: explicit\n",
    "unrelated": "assert: {{shouldActivate: false}}\nneighbor: {neighbor}\n",
}


def make_skill(
    root: Path, skill_id: str, neighbor: str = "beta", *, text: str | None = None
) -> Path:
    """A skill that passes the gate strictly (unless `text` replaces its SKILL.md)."""
    skill = root / skill_id
    (skill / "evals").mkdir(parents=True)
    filler = "\n".join(f"- step {n}" for n in range(30))
    (skill / "SKILL.md").write_text(text or GOOD.format(id=skill_id, filler=filler))
    (skill / "agileflow.skill.yaml").write_text(sidecar_text(skill_id))
    for name, body in SCENARIOS.items():
        head = f"name: {name}\nskill: {skill_id}\nprompt: do it\n"
        (skill / "evals" / f"{name}.yaml").write_text(head + body.format(neighbor=neighbor))
    return skill


@pytest.fixture
def catalog(pytester: pytest.Pytester) -> Path:
    root = pytester.path / "skills"
    make_skill(root, "alpha", "beta")
    make_skill(root, "beta", "alpha")
    return root


def test_lint_only_collects_one_item_per_skill(pytester: pytest.Pytester, catalog: Path) -> None:
    result = pytester.runpytest("skills", "--eval-lint-only", "-v", *PLUGIN)
    result.stdout.fnmatch_lines(
        ["skills/alpha/SKILL.md::lint PASSED*", "skills/beta/SKILL.md::lint PASSED*"]
    )
    result.assert_outcomes(passed=2)


@pytest.fixture
def no_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def test_scenario_items_without_an_endpoint_are_errors_not_negatives(
    pytester: pytest.Pytester, catalog: Path, no_endpoint: None
) -> None:
    result = pytester.runpytest("skills", "-rs", *PLUGIN)
    result.assert_outcomes(passed=2, errors=6)
    result.stdout.fnmatch_lines(["*no endpoint is configured*"])


def test_scenario_markers_select(pytester: pytest.Pytester, catalog: Path) -> None:
    result = pytester.runpytest("skills", "-m", "negative", "--collect-only", "-q", *PLUGIN)
    result.stdout.fnmatch_lines(
        [
            "skills/alpha/evals/unrelated.yaml::unrelated",
            "skills/beta/evals/unrelated.yaml::unrelated",
        ]
    )
    result.stdout.no_fnmatch_line("*summary*")
    explicit = pytester.runpytest("skills", "-m", "explicit", "--collect-only", "-q", *PLUGIN)
    explicit.stdout.fnmatch_lines(["*2/8 tests collected*"])
    by_skill = pytester.runpytest(
        "skills", "-k", "alpha and neighbor", "--collect-only", "-q", *PLUGIN
    )
    by_skill.stdout.fnmatch_lines(["skills/alpha/evals/unrelated.yaml::unrelated", "*1/8*"])


def test_failure_report_lists_every_finding(pytester: pytest.Pytester, catalog: Path) -> None:
    (catalog / "alpha" / "SKILL.md").write_text(
        "---\nname: alpha\ndescription: Summarises figures.\n---\n# Alpha\nNo ending.\n"
    )
    result = pytester.runpytest("skills", "--eval-lint-only", *PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "skill 'alpha' fails the release gate (*SKILL.md):",
            '[x] description-when: description must say when to activate, in a sentence (e.g. "Use when the user asks for ...")',
            "[!] description-short: description is 19 characters; under 60 rarely gives enough "
            "to trigger on",
            '[x] completion: no completion section: add a "## Done when" heading saying when the '
            "work is done",
            "[i] size: SKILL.md is 6 lines; the ideal is 30-120",
        ]
    )
    # Shown once, in the failure report, not again as a captured section.
    result.stdout.no_fnmatch_line("*Captured skill lint*")


def test_advisory_turns_gate_errors_into_warnings(pytester: pytest.Pytester, catalog: Path) -> None:
    (catalog / "alpha" / "SKILL.md").write_text(
        GOOD.format(id="alpha", filler="\n".join(["-"] * 30)).replace("## Done when", "## After")
    )
    advisory = ["skills", "--eval-lint-only", "--eval-skill-strictness=advisory", *PLUGIN]
    result = pytester.runpytest(*advisory)
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        ["*SkillLintWarning: alpha: ?!? completion: no completion section*"]
    )
    hardened = pytester.runpytest(
        *advisory, "-W", "error::pytest_evalloop.skills.lint.SkillLintWarning"
    )
    hardened.assert_outcomes(passed=1, failed=1)
    strict = pytester.runpytest("skills", "--eval-lint-only", *PLUGIN)
    strict.assert_outcomes(passed=1, failed=1)


def test_strictness_from_the_ini_file(pytester: pytest.Pytester, catalog: Path) -> None:
    (catalog / "alpha" / "SKILL.md").write_text(
        GOOD.format(id="alpha", filler="-").replace("## Done when", "## After")
    )
    pytester.makeini("[pytest]\neval_skill_strictness = advisory\n")
    pytester.runpytest("skills", "--eval-lint-only", *PLUGIN).assert_outcomes(passed=2, warnings=1)
    pytester.makeini("[pytest]\neval_skill_strictness = lenient\n")
    bad = pytester.runpytest("skills", "--eval-lint-only", *PLUGIN)
    bad.stderr.fnmatch_lines(
        ["*eval_skill_strictness = 'lenient' is not one of strict, advisory; fix the ini file*"]
    )


def test_bad_scenario_key_is_a_collection_error(pytester: pytest.Pytester, catalog: Path) -> None:
    path = catalog / "alpha" / "evals" / "summary.yaml"
    path.write_text(path.read_text() + "shouldactivate: true\n")
    result = pytester.runpytest("skills", *PLUGIN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*skills/alpha/evals/summary.yaml: unknown key 'shouldactivate': remove it or fix its spelling*"
        ]
    )
    # The gate reports it too, so --eval-lint-only (which skips scenario items) still fails.
    lint_only = pytester.runpytest("skills", "--eval-lint-only", *PLUGIN)
    lint_only.assert_outcomes(passed=1, failed=1)
    lint_only.stdout.fnmatch_lines(
        ["?x? scenario: evals/summary.yaml: unknown key 'shouldactivate'*"]
    )


def test_yaml_outside_a_skill_is_not_collected(pytester: pytest.Pytester) -> None:
    (pytester.path / "config" / "evals").mkdir(parents=True)
    (pytester.path / "config" / "evals" / "x.yaml").write_text("a: 1\n")
    result = pytester.runpytest("config", *PLUGIN)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_ini_skills_roots_are_collected_without_path_arguments(
    pytester: pytest.Pytester, catalog: Path
) -> None:
    pytester.makeini("[pytest]\ntestpaths = tests\neval_skills = skills\n")
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    result = pytester.runpytest("--eval-lint-only", "-v", *PLUGIN)
    result.stdout.fnmatch_lines(
        ["tests/test_a.py::test_a PASSED*", "skills/alpha/SKILL.md::lint PASSED*"]
    )
    result.assert_outcomes(passed=3)
    # A path on the command line means "just this".
    only = pytester.runpytest("tests", "--eval-lint-only", *PLUGIN)
    only.assert_outcomes(passed=1)
    pytester.makeini("[pytest]\neval_skills = nowhere\n")
    missing = pytester.runpytest(*PLUGIN)
    missing.stderr.fnmatch_lines(["*eval_skills names */nowhere, which is not a directory*"])


def test_lint_items_under_xdist(
    pytester: pytest.Pytester, catalog: Path, no_endpoint: None
) -> None:
    result = pytester.runpytest("skills", "-n", "2", *PLUGIN)
    result.assert_outcomes(passed=2, errors=6)


def test_junitxml_carries_the_gate_row(pytester: pytest.Pytester, catalog: Path) -> None:
    pytester.runpytest("skills", "--eval-lint-only", "--junitxml=out.xml", *PLUGIN)
    xml = (pytester.path / "out.xml").read_text()
    assert '<property name="skill" value="alpha" />' in xml
    assert '<property name="evals" value="3" />' in xml
    assert '<property name="result" value="pass" />' in xml


def test_example_catalog_lint_passes_offline() -> None:
    # Speed is measured in bench/ and the closing note, not asserted here.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "evals/skills", "--eval-lint-only", *PLUGIN, "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
