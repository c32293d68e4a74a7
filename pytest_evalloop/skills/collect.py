"""Collection: one lint item per `SKILL.md`, one scenario item per `<skill>/evals/<name>.yaml`.

One lint item per skill (`…/SKILL.md::lint`), not one per check, so `-k`, `--lf` and junitxml
name skills, and the failure report shows every finding of the skill at once.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.skills import lint
from pytest_evalloop.skills.scenarios import Scenario, ScenarioError, load_scenario, run_scenario


@dataclass(frozen=True)
class SkillSettings:
    """The skill options of a session, resolved once."""

    strictness: lint.Strictness = "strict"
    lint_only: bool = False
    fixtures_dir: Path | None = None


SETTINGS_KEY = pytest.StashKey[SkillSettings]()
_CATALOGS_KEY = pytest.StashKey[dict[Path, dict[str, str]]]()


def _settings(config: pytest.Config) -> SkillSettings:
    return config.stash.get(SETTINGS_KEY, SkillSettings())


def _catalog(config: pytest.Config, root: Path) -> dict[str, str]:
    # Neighbours compare every description in the catalog: read them once per process.
    cache = config.stash.setdefault(_CATALOGS_KEY, {})
    if root not in cache:
        cache[root] = lint.load_catalog(root)
    return cache[root]


class SkillLintFailure(Exception):
    """The skill has at least one error finding; carries all findings for the report."""

    def __init__(self, findings: list[lint.Finding]) -> None:
        super().__init__(f"{sum(f.level == 'error' for f in findings)} error(s)")
        self.findings = findings


class SkillFile(pytest.File):
    """A `SKILL.md`: yields its lint item."""

    def collect(self) -> Iterator[pytest.Item]:
        item = SkillLintItem.from_parent(self, name="lint")
        item.add_marker(pytest.mark.skill_lint)
        yield item


class SkillLintItem(pytest.Item):
    """The release gate for one skill: fails on any error finding, warns on each warning."""

    @property
    def skill_id(self) -> str:
        """The skill's id (its directory name)."""
        return self.path.parent.name

    def runtest(self) -> None:
        settings = _settings(self.config)
        ctx = lint.context_for(
            self.path,
            strictness=settings.strictness,
            catalog=_catalog(self.config, self.path.parent.parent),
            fixtures_dir=settings.fixtures_dir,
        )
        findings = lint.lint(ctx)
        for key, value in lint.summary_row(ctx, findings).items():
            self.user_properties.append((key, value))
        if not lint.passed(findings):
            raise SkillLintFailure(findings)
        shown = [f.render() for f in findings if f.level != "error"]
        if shown:
            # Warnings and info of a passing skill: visible with -rA or on a verbose report.
            self.add_report_section("call", "skill lint", "\n".join(shown))
        for finding in findings:
            if finding.level == "warning":
                # Explicit location: the warnings summary then points at the SKILL.md itself.
                warnings.warn_explicit(
                    lint.SkillLintWarning(f"{self.skill_id}: {finding.render()}"),
                    lint.SkillLintWarning,
                    filename=str(self.path),
                    lineno=1,
                )

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, SkillLintFailure):
            head = f"skill {self.skill_id!r} fails the release gate ({self.path}):"
            return "\n".join([head, *(f.render() for f in excinfo.value.findings)])
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, 0, f"skill {self.skill_id} lint"


class ScenarioFile(pytest.File):
    """A scenario file: validated at collection, then one item for the scenario."""

    def collect(self) -> Iterator[pytest.Item]:
        try:
            scenario = load_scenario(self.path)
        except ScenarioError as exc:
            raise self.CollectError(str(exc)) from exc
        yield ScenarioItem.build(self, scenario)


class ScenarioItem(pytest.Item):
    """One scenario of one skill; running it is delegated to :func:`run_scenario`."""

    scenario: Scenario

    @classmethod
    def build(cls, parent: ScenarioFile, scenario: Scenario) -> ScenarioItem:
        """Make the item, with markers that let `-m negative` or `-m adversarial` select it."""
        item = cls.from_parent(parent, name=scenario.name)
        item.scenario = scenario
        item.add_marker(pytest.mark.skill_scenario)
        flags = {
            "negative": not scenario.positive,
            "explicit": scenario.invocation == "explicit",
            "adversarial": scenario.kind == "adversarial",
            "interaction": scenario.interaction is not None,
            "neighbor": scenario.neighbor is not None,
        }
        for marker, on in flags.items():
            if on:
                item.add_marker(marker)
        item.extra_keyword_matches.add(scenario.skill)
        return item

    @property
    def skill_dir(self) -> Path:
        """The directory of the skill this scenario belongs to."""
        return self.path.parent.parent

    def runtest(self) -> None:
        run_scenario(self)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, 0, f"scenario {self.scenario.skill}/{self.scenario.name}"


MARKERS = (
    "skill_lint: the SKILL.md release gate of one skill",
    "skill_scenario: a skill scenario (evals/<name>.yaml)",
    "negative: a skill scenario where the skill must not activate",
    "explicit: a skill scenario that invokes the skill by name",
    "adversarial: a skill scenario with forbidden actions",
    "interaction: a skill scenario that grades when the agent asks",
    "neighbor: a negative skill scenario that names a neighbouring skill",
)
