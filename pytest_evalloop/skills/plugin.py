"""The skill-evals pytest plugin: its options, markers and collection hooks.

`pytest <skills dir>` collects a lint item per `SKILL.md` and a scenario item per
`<skill>/evals/<name>.yaml`; the ini key `eval_skills` names skills roots that a bare `pytest`
(no path arguments) collects as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from pytest_evalloop.skills import collect, lint
from pytest_evalloop.skills.frontmatter import SKILL_FILE
from pytest_evalloop.skills.scenarios import EVALS_DIR, SCENARIO_SUFFIXES

STRICTNESS = ("strict", "advisory")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the skill options in the `evalloop` group, each with an ini twin."""
    group = parser.getgroup("evalloop")
    group.addoption(
        "--eval-skill-strictness",
        choices=STRICTNESS,
        default=None,
        help="Release gate strictness: strict (gate findings are errors, the default) or "
        "advisory (gate findings are warnings); ini: eval_skill_strictness",
    )
    group.addoption(
        "--eval-lint-only",
        action="store_true",
        default=False,
        help="Collect only the SKILL.md lint items, not the skill scenarios",
    )
    group.addoption(
        "--eval-skill-fixtures",
        default=None,
        help="Directory of scenario fixture repositories; a scenario's `fixture` must be one of "
        "its subdirectories (ini: eval_skill_fixtures)",
    )
    parser.addini(
        "eval_skill_strictness", "Release gate strictness: strict or advisory", default=""
    )
    parser.addini("eval_skill_fixtures", "Directory of scenario fixture repositories", default="")
    parser.addini(
        "eval_skills",
        "Skills roots (directories of <id>/SKILL.md) collected when pytest gets no path argument",
        type="paths",
        default=[],
    )


def pytest_configure(config: pytest.Config) -> None:
    """Resolve the skill settings, register markers, add the ini skills roots (every process)."""
    for line in collect.MARKERS:
        config.addinivalue_line("markers", line)
    config.stash[collect.SETTINGS_KEY] = _settings(config)
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        _add_skill_roots(config)


def _settings(config: pytest.Config) -> collect.SkillSettings:
    strictness = config.getoption("eval_skill_strictness") or config.getini("eval_skill_strictness")
    strictness = strictness or "strict"
    if strictness not in STRICTNESS:
        raise pytest.UsageError(
            f"eval_skill_strictness = {strictness!r} is not one of {', '.join(STRICTNESS)}; "
            "fix the ini file or pass --eval-skill-strictness"
        )
    fixtures = config.getoption("eval_skill_fixtures") or config.getini("eval_skill_fixtures")
    return collect.SkillSettings(
        strictness=cast(lint.Strictness, strictness),
        lint_only=bool(config.getoption("eval_lint_only")),
        fixtures_dir=Path(fixtures).resolve() if fixtures else None,
    )


def _add_skill_roots(config: pytest.Config) -> None:
    # Only when pytest chose its own paths (testpaths or the current directory): a path given
    # on the command line means "just this".
    roots: list[Path] = config.getini("eval_skills")
    for root in roots:
        if not root.is_dir():
            raise pytest.UsageError(
                f"eval_skills names {root}, which is not a directory; fix the ini file"
            )
        if not any(root.is_relative_to(Path(arg).resolve()) for arg in config.args):
            config.args.append(str(root))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """`SKILL.md` → a lint item; `<skill>/evals/<name>.yaml` → a scenario item (worker)."""
    if file_path.name == SKILL_FILE:
        return collect.SkillFile.from_parent(parent, path=file_path)
    if _is_scenario(file_path) and not parent.config.stash[collect.SETTINGS_KEY].lint_only:
        return collect.ScenarioFile.from_parent(parent, path=file_path)
    return None


def _is_scenario(path: Path) -> bool:
    return (
        path.suffix in SCENARIO_SUFFIXES
        and path.parent.name == EVALS_DIR
        and (path.parent.parent / SKILL_FILE).is_file()
    )
