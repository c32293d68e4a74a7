"""Reading a skill directory: `SKILL.md` split into YAML frontmatter and body, plus its sidecar."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pytest_evalloop.skills.settings import SKILL_FILE as SKILL_FILE

SIDECAR_FILE = "agileflow.skill.yaml"
_FENCE = "---"


@dataclass
class SkillDoc:
    """One `SKILL.md` as read: where it is, its raw text, its frontmatter and its body."""

    path: Path
    text: str
    frontmatter: dict[str, Any] | None
    """None when missing or unreadable; `frontmatter_error` then says which."""
    frontmatter_error: str | None
    body: str
    body_line: int = 1
    """The file line the body starts on (1 without frontmatter)."""
    sidecar: dict[str, Any] | None = None
    sidecar_error: str | None = None

    @property
    def directory(self) -> Path:
        """The skill directory (the one holding SKILL.md)."""
        return self.path.parent

    @property
    def skill_id(self) -> str:
        """The skill's id: its directory name, which the `name` key must equal."""
        return self.path.parent.name

    @property
    def line_count(self) -> int:
        """Lines of the whole file, frontmatter included (the size policy counts these)."""
        return len(self.text.splitlines())

    @property
    def size_bytes(self) -> int:
        """Bytes of the whole file as UTF-8 (what a model is sent, whatever the line breaks)."""
        return len(self.text.encode("utf-8"))

    @property
    def body_tokens(self) -> int:
        """Estimated tokens of the body, which the agent loads at every activation: UTF-8 bytes
        / 4, the estimate the rate limiter settles against real usage (no tokenizer offline)."""
        from pytest_evalloop.model_api.ratelimit import estimate_tokens

        return estimate_tokens(self.body.encode("utf-8")) if self.body.strip() else 0

    @property
    def meta(self) -> dict[str, Any]:
        """The frontmatter, or an empty mapping when there is none."""
        return self.frontmatter or {}


def split_frontmatter(text: str) -> tuple[dict[str, Any] | None, str | None, str]:
    """Split `text` into (frontmatter, error, body); frontmatter is None when error is set."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != _FENCE:
        return None, "missing: SKILL.md must start with a '---' line", text
    end = _closing_fence(lines)
    if end is None:
        return None, "unterminated: no closing '---' line", text
    body = "\n".join(lines[end + 1 :])
    try:
        data = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as exc:
        return None, f"invalid YAML: {_yaml_problem(exc, first_line=2)}", body
    if not isinstance(data, dict):
        return None, f"invalid: must be a YAML mapping, got {type(data).__name__}", body
    return data, None, body


def _closing_fence(lines: list[str]) -> int | None:
    """The index of the line closing the frontmatter (the first opens it), or None."""
    return next((i for i, line in enumerate(lines[1:], start=1) if line.strip() == _FENCE), None)


def _body_line(text: str) -> int:
    lines = text.splitlines()
    if not lines or lines[0].strip() != _FENCE:
        return 1
    end = _closing_fence(lines)
    return 1 if end is None else end + 2


def _yaml_problem(exc: yaml.YAMLError, first_line: int) -> str:
    """The parser's complaint with a file line number (`first_line`: where the YAML starts)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{problem} (line {mark.line + first_line})" if mark is not None else str(problem)


def read_skill(path: Path) -> SkillDoc:
    """Read a `SKILL.md` (and the sidecar beside it, when present)."""
    text = path.read_text(encoding="utf-8")
    frontmatter, error, body = split_frontmatter(text)
    doc = SkillDoc(
        path=path,
        text=text,
        frontmatter=frontmatter,
        frontmatter_error=error,
        body=body,
        body_line=_body_line(text),
    )
    sidecar = path.parent / SIDECAR_FILE
    if sidecar.is_file():
        doc.sidecar, doc.sidecar_error = _read_sidecar(sidecar)
    return doc


def _read_sidecar(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        return None, f"invalid YAML: {_yaml_problem(exc, first_line=1)}"
    if not isinstance(data, dict):
        return None, f"must be a YAML mapping, got {type(data).__name__}"
    return data, None
