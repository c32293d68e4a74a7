"""The schema of a skill scenario, `<skill>/evals/<name>.yaml`, and the seam that runs one.

Strict on purpose: a misspelt key (`shouldactivate`, `rubrics`) would otherwise silently turn a
scenario into a different one, so any unknown key is an error that names the file and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pytest_evalloop.skills.settings import EVALS_DIR as EVALS_DIR
from pytest_evalloop.skills.settings import SCENARIO_SUFFIXES as SCENARIO_SUFFIXES
from pytest_evalloop.skills.settings import SKILL_FILE

KEBAB = r"^[a-z0-9]+(?:-[a-z0-9]+)*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Expectation(_Strict):
    """`assert:` what the scenario expects of activation."""

    should_activate: bool = Field(alias="shouldActivate")


_RULE_KEYS = ("command", "noCommand", "output", "noOutput", "fileChanged", "fileUnchanged")


class FileContains(_Strict):
    """A file (glob) whose final content must match a regex."""

    path: str
    pattern: str


class RubricRule(_Strict):
    """A deterministic rubric item: exactly one check, plus an optional criterion text."""

    criterion: str | None = None
    command: str | None = None
    no_command: str | None = Field(default=None, alias="noCommand")
    output: str | None = None
    no_output: str | None = Field(default=None, alias="noOutput")
    file_changed: str | None = Field(default=None, alias="fileChanged")
    file_unchanged: str | None = Field(default=None, alias="fileUnchanged")
    file_contains: FileContains | None = Field(default=None, alias="fileContains")

    @model_validator(mode="after")
    def _exactly_one_check(self) -> RubricRule:
        given = [
            name
            for name in (*_RULE_KEYS, "fileContains")
            if getattr(self, _field_of(name)) is not None
        ]
        if len(given) != 1:
            keys = ", ".join((*_RULE_KEYS, "fileContains"))
            raise ValueError(f"a rubric rule needs exactly one of {keys}; got {given or 'none'}")
        return self


def _field_of(alias: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in alias)


class Forbid(_Strict):
    """Actions that fail a run outright, checked even on an errored run."""

    commands: list[str] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list)
    output: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _not_empty(self) -> Forbid:
        if not (self.commands or self.files or self.output):
            raise ValueError("forbid needs at least one of commands, files, output")
        return self


class Interaction(_Strict):
    """What ambiguity the prompt holds, so question behaviour can be judged."""

    ambiguity: Literal["choice", "missing-information", "repository-answerable"]
    decision: str = Field(min_length=1)
    success: list[str] = Field(min_length=1)


class Scenario(_Strict):
    """One scenario file: a prompt, whether the skill must activate, and how to grade the run."""

    name: str = Field(pattern=KEBAB)
    skill: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    expect: Expectation = Field(alias="assert")
    description: str | None = None
    kind: Literal["standard", "adversarial"] = "standard"
    neighbor: str | None = None
    invocation: Literal["implicit", "explicit"] = "implicit"
    fixture: str | None = None
    setup: str | None = None
    bin: dict[str, str] = Field(default_factory=dict)
    rubric: list[str | RubricRule] = Field(default_factory=list)
    forbid: Forbid | None = None
    interaction: Interaction | None = None

    @property
    def positive(self) -> bool:
        """Whether the skill is expected to activate."""
        return self.expect.should_activate


class ScenarioError(ValueError):
    """A scenario file that cannot be read or does not fit the schema."""


def load_scenario(path: Path) -> Scenario:
    """Parse and validate one scenario file; errors name the file and the offending key."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: a scenario must be a YAML mapping, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_describe(path, exc)) from exc


def _describe(path: Path, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(file)"
        if err["type"] == "extra_forbidden":
            problems.append(f"unknown key {key!r}: remove it or fix its spelling")
        elif err["type"] == "missing":
            problems.append(f"missing key {key!r}")
        else:
            problems.append(f"key {key!r}: {err['msg']} (got {_short(err.get('input'))})")
    return f"{path}: " + "; ".join(problems)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def scenario_files(skill_dir: Path) -> list[Path]:
    """The scenario files of a skill, sorted by name."""
    evals = skill_dir / EVALS_DIR
    if not evals.is_dir():
        return []
    return sorted(p for p in evals.iterdir() if p.suffix in SCENARIO_SUFFIXES and p.is_file())


def neighbors(catalog_root: Path) -> dict[tuple[str, str], str]:
    """`(skill, scenario name) -> neighbor` for every negative of the catalog that names the
    skill that should fire instead (unreadable files are the lint's finding, left out here)."""
    out = {}
    for skill_md in sorted(catalog_root.glob(f"*/{SKILL_FILE}")):
        for path in scenario_files(skill_md.parent):
            try:
                scenario = load_scenario(path)
            except ScenarioError:
                continue
            if not scenario.positive and scenario.neighbor:
                out[(scenario.skill, scenario.name)] = scenario.neighbor
    return out
