"""One run of one scenario, end to end: a fresh sandbox, the agent run (the CLI, or the
``anthropic`` skill agent), then the verdict read from the transcript and the sandbox.

Outcomes follow one rule: a run the provider did not finish (crash, timeout, an error result)
is an *error*, never a negative, and stays outside precision and recall; a ``forbid`` violation
fails the run even then.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pytest_evalloop.skills.claude_run import (
    Mode,
    claude_argv,
    cli_env,
    prompt_for,
    provider_error,
    run_cli,
)
from pytest_evalloop.skills.grading import (
    Evidence,
    activated,
    activation_evidence,
    asked_heuristic,
    forbid_violations,
    grade_rule,
    interaction_failures,
    run_summary,
    written_paths,
)
from pytest_evalloop.skills.rubric_judge import (
    InteractionVerdict,
    RubricReply,
    RubricRequest,
    SkillJudge,
)
from pytest_evalloop.skills.sandbox import (
    SKILLS_DIR,
    ErrorKind,
    RunError,
    Sandbox,
    build_sandbox,
    catalog_ids,
    diff_text,
    file_changes,
    write_back_login,
)
from pytest_evalloop.skills.scenarios import RubricRule, Scenario
from pytest_evalloop.skills.transcript import Transcript, read_transcript

if TYPE_CHECKING:
    from pytest_evalloop.skills.anthropic_agent import AnthropicSkillAgent


@dataclass(frozen=True)
class RunSpec:
    """Everything one scenario run depends on."""

    scenario: Scenario
    skill_dir: Path
    catalog_root: Path
    backend: str = "claude-code"
    mode: Mode = "activation"
    preference: str = "provider-default"
    sample: int | None = None
    timeout_s: float = 300.0
    rubric_threshold: float = 0.75
    fixtures_dir: Path | None = None
    model: str | None = None


@dataclass
class Outcome:
    """The verdict of one run and everything recorded about it."""

    status: Literal["passed", "failed", "error"]
    activated: bool | None = None
    evidence: list[Evidence] = field(default_factory=list)
    other_activations: list[str] = field(default_factory=list)
    visible_skills: list[str] = field(default_factory=list)
    foreign_skills: list[str] = field(default_factory=list)
    asked_user: bool | None = None
    asked_source: Literal["judge", "heuristic"] | None = None
    used_structured_question: bool | None = None
    interaction: dict[str, Any] | None = None
    rubric: list[dict[str, Any]] = field(default_factory=list)
    rubric_score: float | None = None
    violations: list[str] = field(default_factory=list)
    file_changes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    error_kind: ErrorKind | None = None
    error: str | None = None
    judged: bool = False
    transcript: Transcript = field(default_factory=Transcript)
    events: list[dict[str, Any]] = field(default_factory=list)
    seconds: float | None = None


def execute(
    spec: RunSpec, judge: SkillJudge | None, agent: AnthropicSkillAgent | None = None
) -> Outcome:
    """Run one scenario once in a fresh sandbox and grade it; never raises RunError.

    The ``anthropic`` backend runs ``agent`` (None: no endpoint is configured, an error)."""
    if spec.backend == "anthropic" and agent is None:
        # Checked before any sandbox is built: nothing can run, and nothing should be left.
        return Outcome(
            status="error",
            error_kind="provider",
            error="the anthropic skill backend calls the Messages API, and no endpoint is "
            "configured: set ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL for another "
            "Anthropic-compatible endpoint), or run --eval-skill-backends=claude-code, or "
            "--eval-lint-only for the offline release gate",
        )
    try:
        box = build_sandbox(
            spec.scenario,
            spec.skill_dir,
            catalog_root=spec.catalog_root,
            preference=spec.preference,
            fixtures_dir=spec.fixtures_dir,
        )
    except RunError as exc:
        return Outcome(status="error", error_kind=exc.kind, error=str(exc))
    try:
        if agent is not None and spec.backend == "anthropic":
            return _run_agent(box, spec, judge, agent)
        return _run_in(box, spec, judge)
    finally:
        write_back_login(box)
        box.remove()


def _run_in(box: Sandbox, spec: RunSpec, judge: SkillJudge | None) -> Outcome:
    env = cli_env(box)
    executable = shutil.which("claude", path=env["PATH"])
    if executable is None:
        return Outcome(
            status="error",
            error_kind="provider",
            error="the claude-code backend runs the `claude` CLI, but none is on PATH; install "
            "Claude Code (npm install -g @anthropic-ai/claude-code) and log in",
        )
    argv = claude_argv(executable, prompt_for(spec.scenario), mode=spec.mode, model=spec.model)
    run = run_cli(argv, cwd=box.repo, env=env, timeout_s=spec.timeout_s)
    error = provider_error(run, spec.timeout_s, env)
    return _verdict(box, spec, judge, run.events, run.seconds, error)


def _run_agent(
    box: Sandbox, spec: RunSpec, judge: SkillJudge | None, agent: AnthropicSkillAgent
) -> Outcome:
    """The ``anthropic`` backend: the Messages API loop, its events read like the CLI's."""
    scenario = spec.scenario
    run = agent.run(
        box.repo,
        prompt_for(scenario),
        mode=spec.mode,
        explicit_skill=scenario.skill if scenario.invocation == "explicit" else None,
        timeout_s=spec.timeout_s,
    )
    return _verdict(box, spec, judge, run.events, run.seconds, run.error)


def _verdict(
    box: Sandbox,
    spec: RunSpec,
    judge: SkillJudge | None,
    events: list[dict[str, Any]],
    seconds: float,
    error: str | None,
) -> Outcome:
    """Read the transcript and the sandbox, whichever backend wrote them, and grade the run."""
    t = read_transcript(events)
    changes = file_changes(box)
    out = Outcome(status="passed", transcript=t, events=events, seconds=seconds)
    out.file_changes = changes
    out.violations = forbid_violations(spec.scenario, t, changes, written_paths(t, box.repo))
    out.visible_skills = t.visible_skills or []
    try:
        _check_run(error, t, spec)
        _score(out, box, spec, judge)
    except RunError as exc:
        out.status, out.error_kind, out.error = "error", exc.kind, str(exc)
        out.activated = None
    if out.violations:
        # A forbidden action fails the run whatever else happened, errors included.
        out.status = "failed"
        out.failures = [*out.violations, *out.failures]
    return out


def _check_run(error: str | None, t: Transcript, spec: RunSpec) -> None:
    if error:
        raise RunError("provider", error)
    visible = t.visible_skills
    if visible and spec.scenario.skill not in visible:
        raise RunError(
            "isolation",
            f"skill {spec.scenario.skill!r} is not among the skills the agent sees ({visible}); "
            "check its SKILL.md frontmatter (a skill Claude cannot load is not a negative)",
        )
    personal = Path.home() / SKILLS_DIR
    foreign = [
        s
        for s in visible or []
        if (personal / s).is_dir() and s not in catalog_ids(spec.catalog_root)
    ]
    if foreign:
        raise RunError(
            "isolation",
            f"personal skills outside the catalog are visible to the agent: {foreign}; the "
            "sandbox HOME leaked",
        )


def _score(out: Outcome, box: Sandbox, spec: RunSpec, judge: SkillJudge | None) -> None:
    scenario, t = spec.scenario, out.transcript
    explicit = scenario.invocation == "explicit"
    out.evidence = activation_evidence(t, scenario.skill, explicit=explicit)
    out.activated = activated(out.evidence)
    out.other_activations = [
        other
        for other in catalog_ids(spec.catalog_root)
        if other != scenario.skill and activated(activation_evidence(t, other, explicit=False))
    ]
    asked, structured = asked_heuristic(t)
    out.asked_user, out.asked_source, out.used_structured_question = asked, "heuristic", structured
    if out.activated != scenario.positive:
        want = "activate" if scenario.positive else "stay unused"
        got = "it was invoked" if out.activated else "it was not invoked"
        out.failures.append(f"expected skill {scenario.skill!r} to {want}, but {got}")
    verdict = _grade(out, box, spec, judge)
    if verdict is not None:
        out.interaction = verdict.model_dump(by_alias=True)
        if verdict.asked_user is not None:
            out.asked_user, out.asked_source = verdict.asked_user or structured, "judge"
    out.failures += interaction_failures(scenario, spec.preference, bool(out.asked_user), verdict)
    if out.rubric_score is not None and out.rubric_score < spec.rubric_threshold:
        missed = [r["criterion"] for r in out.rubric if not r["pass"]]
        out.failures.append(
            f"rubric {out.rubric_score:.0%} is under the threshold {spec.rubric_threshold:.0%}; "
            f"missed: {missed}"
        )
    out.status = "failed" if out.failures else "passed"


def _grade(
    out: Outcome, box: Sandbox, spec: RunSpec, judge: SkillJudge | None
) -> InteractionVerdict | None:
    """Rubric (positive scenarios in full mode) and the interaction verdict (full mode)."""
    scenario, t = spec.scenario, out.transcript
    if spec.mode != "full":
        return None
    rules = [r for r in scenario.rubric if isinstance(r, RubricRule)] if scenario.positive else []
    prose = [r for r in scenario.rubric if isinstance(r, str)] if scenario.positive else []
    for rule in rules:
        ok, why = grade_rule(rule, t, out.file_changes, box.repo)
        criterion = rule.criterion or _rule_text(rule)
        out.rubric.append({"criterion": criterion, "pass": ok, "reason": why, "source": "rule"})
    interaction = scenario.interaction.model_dump() if scenario.interaction else None
    verdict = None
    if prose or interaction:
        reply = _ask_judge(judge, scenario, t, diff_text(box, out.file_changes), prose, interaction)
        out.judged = True
        out.rubric += [
            {"criterion": i.criterion, "pass": i.passed, "reason": i.reason, "source": "judge"}
            for i in reply.items
        ]
        verdict = reply.interaction
    if out.rubric:
        out.rubric_score = sum(bool(r["pass"]) for r in out.rubric) / len(out.rubric)
    return verdict


def _rule_text(rule: RubricRule) -> str:
    return json.dumps(rule.model_dump(by_alias=True, exclude_none=True), sort_keys=True)


def _ask_judge(
    judge: SkillJudge | None,
    scenario: Scenario,
    t: Transcript,
    diff: str,
    prose: list[str],
    interaction: dict[str, Any] | None,
) -> RubricReply:
    import asyncio

    if judge is None:
        raise RunError(
            "judge",
            f"scenario {scenario.name!r} has prose rubric items or an interaction block, which "
            "only the skill judge grades, and no judge is configured: set ANTHROPIC_API_KEY (or "
            "ANTHROPIC_BASE_URL), or run --eval-skill-mode=activation",
        )
    request = RubricRequest(
        prompt=scenario.prompt,
        summary=run_summary(t, diff),
        criteria=prose,
        interaction=interaction,
    )
    try:
        return asyncio.run(judge.grade(request))
    except Exception as exc:  # any judge failure leaves the run ungraded: an error, not a fail
        raise RunError("judge", f"the skill judge failed: {type(exc).__name__}: {exc}") from exc
