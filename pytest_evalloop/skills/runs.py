"""The skills run directory of a session (``<root>/runs/<label>``, ``run.json`` pinning the
catalog, backends, mode and judge) and the ledger events each scenario run appends to it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_evalloop import __version__
from pytest_evalloop.skills.attempt import Outcome, RunSpec
from pytest_evalloop.skills.claude_run import Mode, prompt_for
from pytest_evalloop.skills.rubric_judge import SKILL_JUDGE_VERSION, rubric_sha
from pytest_evalloop.skills.sandbox import catalog_ids, catalog_sha

RUNS_DIR = "runs"


@dataclass(frozen=True)
class RunPins:
    """What a skills run records in its ``run.json``."""

    session_id: str
    phase: str
    label: str | None
    backends: tuple[str, ...]
    mode: Mode
    preference: str
    samples: int
    answerer_model: str | None
    judge_model: str | None
    runs_dir: Path | None = None
    """``--eval-runs-dir``: where runs go instead of ``<root>/runs`` (as for case sets)."""


def open_skills_run(catalog_root: Path, pins: RunPins) -> Path:
    """The run directory of this session for a skills root (``<root>/runs/<label>``, or
    ``--eval-runs-dir/<label>``), created with its ``run.json`` by the first process that needs
    it; xdist workers find it by the session id."""
    import fcntl

    from pytest_evalloop.ledger import contract as ledger
    from pytest_evalloop.ledger import writer as ledger_writer

    parent = pins.runs_dir if pins.runs_dir is not None else catalog_root / RUNS_DIR
    parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(parent / ".evalloop.lock", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        own = (pins.session_id, str(catalog_root.resolve()))
        for child in sorted(parent.iterdir()):
            # This session's run of this catalog: sets and catalogs sharing one --eval-runs-dir
            # each keep their own run; a link is none (one run would close under two names).
            if not child.is_symlink() and _session_of(child) == own:
                return child
        label = pins.label or ledger_writer.next_label(parent, catalog_root.name, pins.phase)
        run_dir = parent / label
        if (run_dir / ledger.RUN_FILE).exists():
            raise FileExistsError(f"{run_dir} already holds a run; pick another --eval-label")
        info = ledger.RunInfo.model_validate(
            {
                "runId": label,
                "label": label,
                "sessionId": pins.session_id,
                "target": f"skills:{catalog_root.name}",
                "answerer": ",".join(pins.backends),
                "answererModel": pins.answerer_model or "cli-default",
                "phase": pins.phase,
                "started": ledger.now_iso(),
                "status": "running",
                "setName": catalog_root.name,
                # The catalog the run measured, named by the run itself: readers never guess it
                # from where --eval-runs-dir put the run.
                "setDir": str(catalog_root.resolve()),
                "datasetSha": catalog_sha(catalog_root),
                "judgeModel": pins.judge_model,
                "judgeVersion": SKILL_JUDGE_VERSION,
                "rubricSha": rubric_sha(),
                "harnessVersion": f"pytest-evalloop {__version__}",
                "selection": {
                    "kind": "skills",
                    "mode": pins.mode,
                    "questionPreference": pins.preference,
                    "backends": list(pins.backends),
                    "samples": pins.samples,
                    "catalogSha": catalog_sha(catalog_root),
                    "skills": catalog_ids(catalog_root),
                    **_agent_pins(pins.backends),
                },
            }
        )
        ledger_writer.write_run_info(run_dir, info)
        (run_dir / ledger.ARTIFACTS_DIR).mkdir(exist_ok=True)
        return run_dir
    finally:
        os.close(fd)


def _agent_pins(backends: tuple[str, ...]) -> dict[str, Any]:
    """The anthropic skill agent's version and prompt sha: its wording moves trigger rates."""
    if "anthropic" not in backends:
        return {}
    from pytest_evalloop.skills.anthropic_agent import SKILL_AGENT_VERSION, prompt_sha

    return {"skillAgent": {"version": SKILL_AGENT_VERSION, "promptSha": prompt_sha()}}


def _session_of(run_dir: Path) -> tuple[Any, Any] | None:
    """The session and the set (`setDir`) a run's run.json names, or None."""
    try:
        data = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return (data.get("sessionId"), data.get("setDir")) if isinstance(data, dict) else None


def record(run_dir: Path, spec: RunSpec, out: Outcome, *, qid: str) -> None:
    """Append the run's ``attempt`` and ``activation_score`` events; keep its transcript."""
    from pytest_evalloop.ledger import contract as ledger
    from pytest_evalloop.ledger import writer as ledger_writer
    from pytest_evalloop.model_api.redaction import environment_secrets, redact
    from pytest_evalloop.sets.cases import question_sha

    scenario, t = spec.scenario, out.transcript
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", qid) + (f"-s{spec.sample}" if spec.sample else "")
    transcript_path = None
    if out.events:
        rel = Path(ledger.ARTIFACTS_DIR) / stem / "transcript.jsonl"
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(e) + "\n" for e in out.events)
        (run_dir / rel).write_text(redact(lines, environment_secrets()), "utf-8")
        transcript_path = str(rel)
    usage = (t.result or {}).get("usage") or {}
    cost = (t.result or {}).get("total_cost_usd")
    phase = _phase(run_dir)
    attempt = ledger.AttemptEvent(
        qid=qid,
        sample=spec.sample,
        phase=phase,
        question_sha=question_sha(prompt_for(scenario)),
        submitted=out.status != "error",
        final_query=None,
        host_tool_uses=len(t.tool_calls),
        input_tokens=_int(usage.get("input_tokens")),
        output_tokens=_int(usage.get("output_tokens")),
        cache_read_tokens=_int(usage.get("cache_read_input_tokens")),
        cache_creation_tokens=_int(usage.get("cache_creation_input_tokens")),
        cost_usd=float(cost) if isinstance(cost, int | float) else None,
        num_turns=_int((t.result or {}).get("num_turns")),
        wall_seconds=out.seconds,
        answer_text=t.final_text or None,
        transcriptPath=transcript_path,
        answerer=spec.backend,
        model=t.model or spec.model,
        error=out.error if out.status == "error" or out.error_kind else None,
    )
    score = ledger.ActivationScoreEvent.model_validate(
        {
            "qid": qid,
            "sample": spec.sample,
            "phase": phase,
            "skill": scenario.skill,
            "scenario": scenario.name,
            "backend": spec.backend,
            "mode": spec.mode,
            "questionPreference": spec.preference,
            "invocation": scenario.invocation,
            "expected": scenario.positive,
            "activated": out.activated,
            "status": out.status,
            "evidence": [e.as_dict() for e in out.evidence],
            "otherActivations": out.other_activations,
            "visibleSkills": out.visible_skills,
            "foreignSkills": out.foreign_skills,
            "askedUser": out.asked_user,
            "askedSource": out.asked_source,
            "usedStructuredQuestion": out.used_structured_question,
            "ambiguity": scenario.interaction.ambiguity if scenario.interaction else None,
            "interaction": out.interaction,
            "rubric": out.rubric,
            "rubricScore": out.rubric_score,
            "violations": out.violations,
            "fileChanges": out.file_changes[:200],
            "resultSubtype": t.subtype,
            "errorKind": out.error_kind,
            "error": out.error,
            "failures": out.failures,
            "judge_version": SKILL_JUDGE_VERSION if out.judged else None,
            "rubric_sha": rubric_sha() if out.judged else None,
        }
    )
    ledger_writer.LedgerWriter(run_dir).append(attempt, score)


def _phase(run_dir: Path) -> str:
    try:
        return str(json.loads((run_dir / "run.json").read_text("utf-8")).get("phase") or "skills")
    except (OSError, ValueError):
        return "skills"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
