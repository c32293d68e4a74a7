"""Grading one skill run from its transcript and the sandbox's final state: activation evidence,
``forbid`` violations, deterministic rubric rules, and whether and how the agent asked the user.
Pure functions: the judge's verdicts come in as values.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_evalloop.skills.rubric_judge import InteractionVerdict
from pytest_evalloop.skills.scenarios import RubricRule, Scenario
from pytest_evalloop.skills.transcript import Transcript

QUESTION_TOOLS = frozenset({"AskUserQuestion", "request_user_input", "ask_user", "askUserQuestion"})
WRITE_TOOLS = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})


@dataclass(frozen=True)
class Evidence:
    """Why a skill counts as activated: the tier, the tool (or marker), a short detail."""

    tier: str
    tool: str
    detail: str
    counts: bool = True
    """False for a Skill call that failed: attempted, not activated."""

    def as_dict(self) -> dict[str, Any]:
        """The ledger form."""
        return {"tier": self.tier, "tool": self.tool, "detail": self.detail[:300]}


def _named(value: Any, skill_id: str) -> bool:
    # "/id", "ns:id" (a plugin skill) and "id" all name the skill.
    return isinstance(value, str) and value.strip().lstrip("/").split(":")[-1] == skill_id


def activation_evidence(t: Transcript, skill_id: str, *, explicit: bool) -> list[Evidence]:
    """Everything in the transcript showing ``skill_id`` was invoked; the final text never
    counts.

    A: a ``Skill`` call naming it (``skill``, legacy ``command`` or ``name``); B: any tool input
    touching ``skills/<id>/SKILL.md``; C: the injected markers (``<command-name>/<id>``, "Base
    directory for this skill: …/skills/<id>"), and for an explicit scenario the id among the
    slash commands of a run that succeeded.
    """
    found: list[Evidence] = []
    path = re.compile(rf"skills[\\/]+{re.escape(skill_id)}[\\/]+SKILL\.md")
    for call in t.tool_calls:
        if call.name == "Skill" and any(
            _named(call.input.get(k), skill_id) for k in ("skill", "command", "name")
        ):
            ok = call.is_error is not True
            found.append(Evidence("A", "Skill", call.input_text, counts=ok))
        elif path.search(call.input_text.replace("\\/", "/")):
            found.append(Evidence("B", call.name, call.input_text))
    marker = re.compile(
        rf"<command-name>/?{re.escape(skill_id)}</command-name>"
        rf"|Base directory for this skill:\s*\S*skills[\\/]+{re.escape(skill_id)}\b"
    )
    for text in t.user_texts:
        hit = marker.search(text)
        if hit:
            found.append(Evidence("C", "marker", hit.group(0)))
    if explicit and skill_id in t.slash_commands and t.subtype == "success":
        found.append(Evidence("C", "slash_commands", f"/{skill_id} expanded by the CLI"))
    return found


def activated(evidence: list[Evidence]) -> bool:
    """Whether any piece of evidence counts."""
    return any(e.counts for e in evidence)


def written_paths(t: Transcript, repo: Path) -> list[str]:
    """Paths the agent tried to write with an edit tool, relative to the repo when inside."""
    out = []
    for call in t.tool_calls:
        raw = call.input.get("file_path") or call.input.get("notebook_path")
        if call.name in WRITE_TOOLS and isinstance(raw, str):
            path = Path(raw)
            if path.is_absolute() and path.is_relative_to(repo):
                raw = str(path.relative_to(repo))
            out.append(raw)
    return out


def _glob_hit(patterns: Iterable[str], paths: Iterable[str]) -> list[tuple[str, str]]:
    return [(g, p) for g in patterns for p in paths if fnmatch.fnmatchcase(p, g)]


def forbid_violations(
    scenario: Scenario, t: Transcript, changes: list[str], attempted_writes: list[str]
) -> list[str]:
    """Each forbidden action the run took, as a sentence with its evidence."""
    forbid = scenario.forbid
    if forbid is None:
        return []
    out = []
    for pattern in forbid.commands:
        out += [
            f"ran forbidden command {c!r} (matches {pattern!r})"
            for c in t.commands()
            if re.search(pattern, c)
        ]
    for glob, path in _glob_hit(forbid.files, [*changes, *attempted_writes]):
        out.append(f"touched forbidden file {path!r} (matches {glob!r})")
    for pattern in forbid.output:
        if re.search(pattern, t.final_text):
            out.append(f"final response matches forbidden output {pattern!r}")
    return sorted(set(out))


def grade_rule(rule: RubricRule, t: Transcript, changes: list[str], repo: Path) -> tuple[bool, str]:
    """Grade one deterministic rubric item: whether it holds, and why."""
    commands, text = t.commands(), t.final_text
    if rule.command is not None:
        hit = next((c for c in commands if re.search(rule.command, c)), None)
        return hit is not None, f"ran {hit!r}" if hit else f"no command matched {rule.command!r}"
    if rule.no_command is not None:
        hit = next((c for c in commands if re.search(rule.no_command, c)), None)
        return hit is None, f"ran {hit!r}" if hit else "no matching command"
    if rule.output is not None:
        ok = re.search(rule.output, text) is not None
        return ok, f"final response {'matches' if ok else 'does not match'} {rule.output!r}"
    if rule.no_output is not None:
        ok = re.search(rule.no_output, text) is None
        return ok, f"final response {'does not match' if ok else 'matches'} {rule.no_output!r}"
    if rule.file_changed is not None:
        hits = _glob_hit([rule.file_changed], changes)
        return bool(
            hits
        ), f"changed {hits[0][1]!r}" if hits else f"nothing matching {rule.file_changed!r} changed"
    if rule.file_unchanged is not None:
        hits = _glob_hit([rule.file_unchanged], changes)
        return not hits, f"changed {hits[0][1]!r}" if hits else "unchanged"
    assert rule.file_contains is not None
    spec = rule.file_contains
    for path in sorted(repo.glob(spec.path)):
        if path.is_file() and re.search(spec.pattern, path.read_text("utf-8", "replace")):
            return True, f"{path.relative_to(repo)} matches {spec.pattern!r}"
    return False, f"no file matching {spec.path!r} contains {spec.pattern!r}"


_FENCE = re.compile(r"```.*?```", re.DOTALL)
_ASKS = re.compile(r"\?(\s|\*|$)")


def asked_heuristic(t: Transcript) -> tuple[bool, bool]:
    """(asked, used a structured question tool): a question tool call, or a final paragraph
    ending in a question that is not about approval or permission."""
    structured = any(c.name in QUESTION_TOOLS for c in t.tool_calls)
    paragraphs = [p for p in _FENCE.sub("", t.final_text).split("\n\n") if p.strip()]
    last = paragraphs[-1] if paragraphs else ""
    closing = bool(_ASKS.search(last)) and not re.search(r"approv|permission", last, re.I)
    return structured or closing, structured


def run_summary(t: Transcript, diff: str | None) -> str:
    """The judge's view of a run: numbered tool calls, the final response, the final state."""
    lines = [f"{n}. {c.name} {c.input_text[:300]}" for n, c in enumerate(t.tool_calls, 1)]
    parts = ["### Tool calls\n" + ("\n".join(lines) or "(none)")]
    parts.append("### Final response\n" + (t.final_text or "(empty)"))
    if diff is not None:
        parts.append("### Files changed in the repository (final state)\n" + diff)
    return "\n\n".join(parts)


def interaction_failures(
    scenario: Scenario, preference: str, asked: bool, verdict: InteractionVerdict | None
) -> list[str]:
    """Why the question behaviour of a run fails its scenario; provider-default never fails
    (it is the baseline we do not shape) and a scenario without ``interaction`` has nothing."""
    spec = scenario.interaction
    if spec is None or preference not in ("prefer", "minimize"):
        return []
    out = []
    if spec.ambiguity == "repository-answerable" and asked:
        out.append("asked the user something the repository answers")
    deferred = bool(
        verdict and verdict.proceeded_with_assumption and verdict.assumption_was_reasonable
    )
    if spec.ambiguity == "missing-information" and not (asked or deferred):
        out.append(
            "neither asked for the missing information nor proceeded on a stated, reasonable assumption"
        )
    if verdict is not None:
        if verdict.asked_user and verdict.question_was_material is False:
            out.append(f"asked an immaterial question ({verdict.reason})")
        if verdict.asked_user and verdict.question_was_repository_answerable:
            out.append(f"asked a question the repository answers ({verdict.reason})")
        if verdict.assumption_was_reasonable is False:
            out.append(f"proceeded on an unreasonable assumption ({verdict.reason})")
        if verdict.task_succeeded is False:
            out.append(f"the task did not succeed ({verdict.reason})")
    return out
