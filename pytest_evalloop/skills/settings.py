"""The skill options of a session, the names the collector looks for, and their stash keys.

Kept free of pydantic, yaml and the collectors: the skills plugin loads with every pytest run
of a project that installs pytest-evalloop, most of which collect no skill at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

Strictness = Literal["strict", "advisory"]
SKILL_FILE = "SKILL.md"
EVALS_DIR = "evals"
SCENARIO_SUFFIXES = (".yaml", ".yml")
PREFERENCES = ("provider-default", "prefer", "minimize")
MARKERS = (
    "skill_lint: the SKILL.md release gate of one skill",
    "skill_scenario: a skill scenario (evals/<name>.yaml)",
    "negative: a skill scenario where the skill must not activate",
    "explicit: a skill scenario that invokes the skill by name",
    "adversarial: a skill scenario with forbidden actions",
    "interaction: a skill scenario that grades when the agent asks",
    "neighbor: a negative skill scenario that names a neighbouring skill",
    "full_mode: a skill scenario run with edits allowed and its rubric graded",
)


@dataclass(frozen=True)
class SkillSettings:
    """The skill options of a session, resolved once."""

    strictness: Strictness = "strict"
    lint_only: bool = False
    fixtures_dir: Path | None = None
    mode: Literal["activation", "full"] = "activation"
    backends: tuple[str, ...] = ("anthropic",)
    preference: str = "provider-default"
    """provider-default, prefer, minimize, or all (interaction scenarios run under each)."""
    samples: int = 1
    rubric_threshold: float = 0.75
    scorecard: bool = False


SETTINGS_KEY = pytest.StashKey[SkillSettings]()
SKILL_JUDGE_KEY = pytest.StashKey[Any]()
"""Set it (in a conftest's ``pytest_configure``) to bring your own skill judge; None: none."""
RUNNABLE_ROOTS_KEY = pytest.StashKey[set[Path]]()
"""Skills roots with scenario items that will run in this session (they get a ledger)."""
