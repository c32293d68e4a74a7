"""`agileflow.skill.yaml`, the sidecar beside a SKILL.md: its strict schema.

The release gate's `sidecar` check (`pytest_evalloop.skills.lint.check_sidecar`) validates a
skill's sidecar against :class:`Sidecar`; an unknown key anywhere is an error.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _SidecarModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Package(_SidecarModel):
    name: str
    version: str


class _Activation(_SidecarModel):
    mode: Literal["auto", "manual"]


class _Requirements(_SidecarModel):
    commands: list[str] = Field(default_factory=list)
    network: Literal["none", "optional", "required"] = "none"


class _Capabilities(_SidecarModel):
    modifies_files: Literal["no", "possible", "yes"] = Field(default="no", alias="modifiesFiles")
    long_running: bool = Field(default=False, alias="longRunning")
    user_interaction: Literal["none", "optional", "required"] = Field(
        default="none", alias="userInteraction"
    )


class _Compatibility(_SidecarModel):
    agent_skills: str | None = Field(default=None, alias="agentSkills")


class Sidecar(_SidecarModel):
    """`agileflow.skill.yaml`, strict: the package, activation mode, requirements, capabilities."""

    schema_: Literal[1] = Field(alias="schema")
    package: _Package
    activation: _Activation | None = None
    requirements: _Requirements | None = None
    capabilities: _Capabilities | None = None
    compatibility: _Compatibility | None = None
