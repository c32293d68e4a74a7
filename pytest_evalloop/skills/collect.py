"""Collection: one lint item per `SKILL.md`, one scenario item per `<skill>/evals/<name>.yaml`.

One lint item per skill (`…/SKILL.md::lint`), not one per check, so `-k`, `--lf` and junitxml
name skills, and the failure report shows every finding of the skill at once.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_evalloop.options import answers_no_case
from pytest_evalloop.skills import lint
from pytest_evalloop.skills.scenarios import Scenario, ScenarioError, load_scenario
from pytest_evalloop.skills.settings import MARKERS as MARKERS
from pytest_evalloop.skills.settings import PREFERENCES as PREFERENCES
from pytest_evalloop.skills.settings import RUNNABLE_ROOTS_KEY as RUNNABLE_ROOTS_KEY
from pytest_evalloop.skills.settings import SETTINGS_KEY as SETTINGS_KEY
from pytest_evalloop.skills.settings import SKILL_JUDGE_KEY as SKILL_JUDGE_KEY
from pytest_evalloop.skills.settings import SkillSettings as SkillSettings

if TYPE_CHECKING:
    from pytest_evalloop.skills.attempt import Outcome


@dataclass(frozen=True)
class Variant:
    """One parametrization of a scenario: backend, question preference, repeat."""

    backend: str
    preference: str
    sample: int | None

    def parts(self, settings: SkillSettings, interaction: bool) -> list[str]:
        """The item-name suffix parts, only for the axes that vary in this session."""
        out = []
        if len(settings.backends) > 1:
            out.append(self.backend)
        if settings.preference == "all" and interaction:
            out.append(self.preference)
        if self.sample is not None:
            out.append(f"s{self.sample}")
        return out


def variants(settings: SkillSettings, scenario: Scenario) -> list[Variant]:
    """Backend × preference × repeat; only interaction scenarios vary the preference."""
    if settings.preference != "all":
        prefs: tuple[str, ...] = (settings.preference,)
    elif scenario.interaction is not None:
        prefs = PREFERENCES
    else:
        prefs = ("provider-default",)
    samples: list[int | None] = (
        list(range(1, settings.samples + 1)) if settings.samples > 1 else [None]
    )
    return [Variant(b, p, s) for b in settings.backends for p in prefs for s in samples]


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
        root = self.path.parent.parent
        if root in self.config.stash.get(RUNNABLE_ROOTS_KEY, set()):
            from pytest_evalloop.skills.runner import record_lint

            self.user_properties.append(
                ("evalloop_skill_run", str(record_lint(self, ctx, findings)))
            )
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
    """A scenario file: validated at collection, then one item per variant."""

    def collect(self) -> Iterator[pytest.Item]:
        try:
            scenario = load_scenario(self.path)
        except ScenarioError as exc:
            raise self.CollectError(str(exc)) from exc
        settings = _settings(self.config)
        for variant in variants(settings, scenario):
            yield ScenarioItem.build(self, scenario, variant)


class ScenarioFailure(Exception):
    """A run with a verdict that fails the scenario."""


class ScenarioItem(pytest.Item):
    """One run of one scenario: set up (sandbox, agent run, grading) in ``setup``, so that a
    provider crash is an error, then judged in ``runtest``."""

    scenario: Scenario
    variant: Variant
    outcome: Outcome | None = None

    @classmethod
    def build(
        cls, parent: ScenarioFile, scenario: Scenario, variant: Variant | None = None
    ) -> ScenarioItem:
        """Make the item, with markers that let `-m negative` or `-m adversarial` select it."""
        variant = variant or Variant("claude-code", "provider-default", None)
        parts = variant.parts(_settings(parent.config), scenario.interaction is not None)
        name = scenario.name + (f"[{'-'.join(parts)}]" if parts else "")
        item = cls.from_parent(parent, name=name)
        item.scenario = scenario
        item.variant = variant
        item.add_marker(pytest.mark.skill_scenario)
        flags = {
            "negative": not scenario.positive,
            "explicit": scenario.invocation == "explicit",
            "adversarial": scenario.kind == "adversarial",
            "interaction": scenario.interaction is not None,
            "neighbor": scenario.neighbor is not None,
            "full_mode": _settings(parent.config).mode == "full",
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

    @property
    def qid(self) -> str:
        """The ledger id: ``<skill>/<scenario>``, plus the backend and preference axes."""
        parts = self.variant.parts(_settings(self.config), self.scenario.interaction is not None)
        parts = [p for p in parts if p != f"s{self.variant.sample}"]
        return f"{self.scenario.skill}/{self.scenario.name}" + (
            f"[{'-'.join(parts)}]" if parts else ""
        )

    def setup(self) -> None:
        if answers_no_case(self.config.option):
            # --setup-only / --setup-plan set items up and run none: a scenario's whole run is
            # its setup, so it is left undone (nothing asked of a model, no run opened).
            return
        # Imported here: the runner's sandbox and CLI code is only needed by items that run.
        from pytest_evalloop.skills.runner import run_item

        self.outcome = run_item(self)
        if self.outcome.status == "error":
            from pytest_evalloop.skills.runner import describe

            # A setup-phase failure is a pytest error: the run produced no verdict.
            head = f"{self._head()}: error ({self.outcome.error_kind}): {self.outcome.error}"
            pytest.fail("\n".join([head, *describe(self.outcome)]), pytrace=False)

    def _head(self) -> str:
        return f"scenario {self.scenario.skill}/{self.scenario.name} ({self.variant.backend})"

    def runtest(self) -> None:
        if self.outcome is not None and self.outcome.status == "failed":
            raise ScenarioFailure("; ".join(self.outcome.failures))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ScenarioFailure):
            from pytest_evalloop.skills.runner import describe

            return "\n".join([self._head(), str(excinfo.value), *describe(self.outcome)])
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, 0, f"scenario {self.scenario.skill}/{self.scenario.name}"
