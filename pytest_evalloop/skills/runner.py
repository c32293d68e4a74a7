"""Running a skill scenario item under pytest: the session's judge and agent, one attempt
(``attempt.execute``), its record in the skills run (``runs``), and the lines under a failed run.

The pieces live in modules named for what they own: ``sandbox`` (the scratch repository and
HOME), ``claude_run`` (the headless CLI run), ``transcript`` (stream-json), ``grading``
(activation, forbid, rules, questions), ``attempt`` (one run end to end) and ``runs`` (the run
directory and its ledger). See docs/skills.md.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop.skills.attempt import Outcome, RunSpec, execute
from pytest_evalloop.skills.rubric_judge import AnthropicSkillJudge, SkillJudge
from pytest_evalloop.skills.runs import RunPins, open_skills_run, record
from pytest_evalloop.skills.settings import SETTINGS_KEY as SKILLS_KEY
from pytest_evalloop.skills.settings import SKILL_JUDGE_KEY

if TYPE_CHECKING:
    from pytest_evalloop.skills.anthropic_agent import AnthropicSkillAgent


def _pins(config: Any, settings: Any) -> RunPins:
    from pytest_evalloop.stash import SESSION_ID_KEY, SETTINGS_KEY

    core = config.stash[SETTINGS_KEY]
    judge = config.stash.get(SKILL_JUDGE_KEY, None)
    return RunPins(
        session_id=config.stash[SESSION_ID_KEY],
        phase=core.phase,
        label=core.label,
        backends=settings.backends,
        mode=settings.mode,
        preference=settings.preference,
        samples=settings.samples,
        answerer_model=core.answerer_model if "anthropic" in settings.backends else None,
        judge_model=getattr(judge, "model", None) if judge else core.judge_model,
        runs_dir=core.runs_dir,
    )


def skill_judge(config: Any) -> SkillJudge | None:
    """The session's skill judge: the one a conftest put in the stash, else the Anthropic
    judge when an endpoint is configured, else None (prose items then make a run an error)."""
    key = SKILL_JUDGE_KEY
    if key not in config.stash:
        from pytest_evalloop.answer.backends import ClientFactory
        from pytest_evalloop.options import endpoint_missing
        from pytest_evalloop.stash import SETTINGS_KEY

        core = config.stash[SETTINGS_KEY]
        config.stash[key] = (
            None
            if endpoint_missing()
            else AnthropicSkillJudge(
                model=core.judge_model, client_factory=ClientFactory(core.retries)
            )
        )
    judge: SkillJudge | None = config.stash[key]
    return judge


def run_item(item: Any) -> Outcome:
    """Run a scenario item once through its backend (``claude-code``: the CLI; ``anthropic``:
    the catalog offered as a ``Skill`` tool over the Messages API), record it in the skills
    run's ledger, and tell the controller where its run lives."""
    from pytest_evalloop.stash import SETTINGS_KEY as CORE_KEY

    config = item.config
    settings = config.stash[SKILLS_KEY]
    core = config.stash[CORE_KEY]
    spec = RunSpec(
        scenario=item.scenario,
        skill_dir=item.skill_dir,
        catalog_root=item.skill_dir.parent,
        backend=item.variant.backend,
        mode=settings.mode,
        preference=item.variant.preference,
        sample=item.variant.sample,
        timeout_s=core.attempt_timeout,
        rubric_threshold=settings.rubric_threshold,
        fixtures_dir=settings.fixtures_dir,
        model=core.answerer_model if item.variant.backend == "anthropic" else _model(config),
    )
    judge = skill_judge(config) if settings.mode == "full" else None
    agent = skill_agent(config) if spec.backend == "anthropic" else None
    out = execute(spec, judge, agent)
    run_dir = open_skills_run(spec.catalog_root, _pins(config, settings))
    record(run_dir, spec, out, qid=item.qid)
    item.user_properties.append(("evalloop_skill_run", str(run_dir)))
    for key in ("status", "activated"):
        item.user_properties.append((key, str(getattr(out, key))))
    return out


def skill_agent(config: Any) -> AnthropicSkillAgent | None:
    """The ``anthropic`` backend's agent, or None when no endpoint is configured (its runs are
    then provider errors saying what to set). A fresh client per run: each run has its own
    event loop, and the session's rate limit is shared through the limiter."""
    from pytest_evalloop.answer.backends import ClientFactory
    from pytest_evalloop.model_api.pricing import price_table
    from pytest_evalloop.options import endpoint_missing
    from pytest_evalloop.skills.anthropic_agent import AnthropicSkillAgent
    from pytest_evalloop.stash import LIMITER_KEY, SETTINGS_KEY

    if endpoint_missing():
        return None
    core = config.stash[SETTINGS_KEY]
    limiter = config.stash.get(LIMITER_KEY, None)
    return AnthropicSkillAgent(
        model=core.answerer_model,
        client_factory=lambda: ClientFactory(core.retries, limiter=limiter)(),
        prices=price_table(core.prices),
    )


def _model(config: Any) -> str | None:
    # Only an explicit --eval-answerer-model pins the model; else the CLI's own default runs.
    value = config.getoption("eval_answerer_model", None)
    from pytest_evalloop.options import DEFAULT_ANSWERER_MODEL

    return None if value in (None, DEFAULT_ANSWERER_MODEL) else str(value)


def record_lint(item: Any, ctx: Any, findings: list[Any]) -> Path:
    """Append the ``skill_lint`` event of a skill to the session's skills run."""
    from pytest_evalloop.ledger import contract as ledger
    from pytest_evalloop.ledger import writer as ledger_writer
    from pytest_evalloop.skills import lint

    config = item.config
    root = item.path.parent.parent
    run_dir = open_skills_run(root, _pins(config, config.stash[SKILLS_KEY]))
    row = lint.summary_row(ctx, findings)
    skill_file = item.path.read_bytes()
    event = ledger.SkillLintEvent.model_validate(
        {
            "skill": row["skill"],
            "skillSha": hashlib.sha256(skill_file).hexdigest()[:16],
            "lines": row["lines"],
            "scenarios": row["evals"],
            "negatives": row["negative"],
            "issues": [{"level": f.level, "code": f.code, "message": f.message} for f in findings],
            "passed": lint.passed(findings),
        }
    )
    ledger_writer.LedgerWriter(run_dir).append(event)
    return run_dir


def describe(out: Outcome | None) -> list[str]:
    """The lines under a failed or errored scenario: evidence, rubric misses, other skills."""
    if out is None:
        return []
    lines = [f"activated: {out.activated}"]
    lines += [f"  evidence {e.tier} {e.tool}: {e.detail[:160]}" for e in out.evidence]
    if out.other_activations:
        lines.append(f"also activated: {', '.join(out.other_activations)}")
    lines += [
        f"  [x] rubric: {r['criterion']} ({r['reason']})" for r in out.rubric if not r["pass"]
    ]
    lines += [f"  forbidden: {v}" for v in out.violations]
    if out.asked_user is not None:
        lines.append(f"asked the user: {out.asked_user} ({out.asked_source})")
    if out.transcript.final_text:
        lines.append(f"final response: {out.transcript.final_text[:300]!r}")
    return lines
