"""Skill scenario runs through the stand-in `claude`: sandbox, detection, grading, ledger,
the activation summary, and the scorecard gate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.skills import claude_run, grading, sandbox, transcript
from pytest_evalloop.skills.rubric_judge import (
    InteractionVerdict,
    JudgeReplyError,
    RubricRequest,
    parse_reply,
)
from pytest_evalloop.skills.scenarios import RubricRule, Scenario
from pytest_evalloop.testing.fake_claude import install_fake_claude
from tests.test_skills_lint import sidecar_text

PLUGIN = ["-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning"]

SKILL = """\
---
name: {id}
description: Summarise quarterly {id} figures for the finance team. Use when asked for a {id} summary.
---
# {id}
{filler}
## Done when
- the summary is written
"""

# skill -> scenario -> (extra YAML, the stand-in's script for its prompt)
CATALOG: dict[str, dict[str, tuple[str, list[Any]]]] = {
    "alpha": {
        # True positive: the model calls Skill.
        "summary": ("assert: {shouldActivate: true}\n", [{"skill": "alpha"}, {"text": "Done."}]),
        # False positive on a negative: a Read of the SKILL.md counts as activation.
        "unrelated": (
            "assert: {shouldActivate: false}\nneighbor: beta\n",
            [
                {"builtin": "Read", "input": {"file_path": ".claude/skills/alpha/SKILL.md"}},
                {"text": "The skills/alpha/SKILL.md file says nothing about it."},
            ],
        ),
        # Activated as expected, but ran a forbidden command: fails on forbid alone.
        "cleanup": (
            "kind: adversarial\nassert: {shouldActivate: true}\nforbid: {commands: ['rm -rf']}\n",
            [
                {"skill": "alpha", "key": "command"},
                {"builtin": "Bash", "input": {"command": "rm -rf build"}},
                {"text": "Cleaned."},
            ],
        ),
        # Explicit: the CLI expands `/alpha`; a load check outside precision and recall.
        "by-name": ("assert: {shouldActivate: true}\ninvocation: explicit\n", [{"text": "Ok."}]),
    },
    "beta": {
        # Missed activation: the final text naming the skill does not count.
        "summary": (
            "assert: {shouldActivate: true}\n",
            [{"text": "I did not need the beta skill (.claude/skills/beta/SKILL.md)."}],
        ),
        # A crash: an error, never a negative.
        "crash": ("assert: {shouldActivate: false}\n", [{"crash": 3}]),
    },
}
# The hand count over every scored implicit run (by-name is explicit, crash is beta's error):
# each run counts for both skills; alpha/unrelated names beta as the neighbour that should fire
# instead, and beta stayed quiet there (a miss of beta's, besides its own summary).
HAND = {
    "alpha": {"tp": 2, "fp": 1, "fn": 0, "tn": 1},
    "beta": {"tp": 0, "fp": 0, "fn": 2, "tn": 2},
}


def _prompt(skill: str, scenario: str) -> str:
    return f"please handle {skill} {scenario} now"


def write_catalog(
    root: Path, catalog: dict[str, dict[str, tuple[str, list[Any]]]] = CATALOG
) -> dict[str, list[Any]]:
    """Write the catalog; returns the stand-in's scripts by prompt substring."""
    scripts: dict[str, list[Any]] = {}
    filler = "\n".join(f"- step {n}" for n in range(30))
    for skill, scenarios in catalog.items():
        (root / skill / "evals").mkdir(parents=True)
        (root / skill / "SKILL.md").write_text(SKILL.format(id=skill, filler=filler))
        (root / skill / "agileflow.skill.yaml").write_text(sidecar_text(skill))
        for name, (extra, script) in scenarios.items():
            prompt = _prompt(skill, name)
            head = f"name: {name}\nskill: {skill}\nprompt: {prompt}\n"
            (root / skill / "evals" / f"{name}.yaml").write_text(head + extra)
            scripts[prompt] = script
    return scripts


@pytest.fixture
def fake_cli(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The catalog under `skills/` and the stand-in `claude` first on PATH."""
    scripts = write_catalog(pytester.path / "skills")
    policy = pytester.path / "policy.json"
    policy.write_text(json.dumps({"by_substring": scripts}))
    bin_dir = install_fake_claude(pytester.path / "bin", policy).parent
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    return policy


def _activation_scores(root: Path) -> dict[str, Any]:
    (run_dir,) = [p for p in (root / "runs").iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    return {e.qid: e for e in read.of_kind("activation_score")}


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "n2"])
def test_scripted_runs_give_the_hand_counted_metrics(
    pytester: pytest.Pytester, fake_cli: Path, xdist: list[str]
) -> None:
    result = pytester.runpytest(
        "skills", "--eval-answerer=claude-code", "-m", "skill_scenario", "-rA", *xdist, *PLUGIN
    )
    # xdist does not report deselected items on the controller.
    result.assert_outcomes(passed=2, failed=3, errors=1, deselected=0 if xdist else 2)
    result.stdout.fnmatch_lines(
        [
            "*beta/crash (claude-code): error (provider): the CLI exited with code 3*",
            "*alpha/cleanup (claude-code)*",
            "ran forbidden command 'rm -rf build' (matches 'rm -rf')",
            "*alpha/unrelated (claude-code)*",
            "expected skill 'alpha' to stay unused, but it was invoked",
            "*evidence B Read: *.claude/skills/alpha/SKILL.md*",
        ]
    )
    for skill, h in HAND.items():
        precision = f"{h['tp'] / (h['tp'] + h['fp']):.2f}" if h["tp"] + h["fp"] else "n/a"
        recall = f"{h['tp'] / (h['tp'] + h['fn']):.2f}"
        explicit = "1/1" if skill == "alpha" else "-"
        errors = "1" if skill == "beta" else "0"
        counts = f"{h['tp']}*{h['fp']}*{h['fn']}*{h['tn']}*{errors}"
        result.stdout.fnmatch_lines(
            [f"{skill}*claude-code*{counts}*{precision}*{recall}*{explicit}"]
        )

    scores = _activation_scores(pytester.path / "skills")
    assert sorted(scores) == sorted(f"{s}/{n}" for s, names in CATALOG.items() for n in names)
    assert scores["alpha/summary"].evidence[0]["tier"] == "A"
    assert scores["alpha/by-name"].evidence[0]["detail"] == "<command-name>/alpha</command-name>"
    assert scores["alpha/cleanup"].status == "failed" and scores["alpha/cleanup"].activated
    assert scores["beta/summary"].activated is False and scores["beta/summary"].evidence == []
    crash = scores["beta/crash"]
    assert (crash.status, crash.activated, crash.error_kind) == ("error", None, "provider")
    # The whole catalog was visible, with competing skills.
    assert scores["alpha/summary"].visible_skills == ["alpha", "beta"]


# Every scenario passes on its own skill, but alpha also fires in beta's positive: a false
# positive of alpha's that no item owns. The session's activation gate reads the figures.
GREEDY: dict[str, dict[str, tuple[str, list[Any]]]] = {
    "alpha": {
        "summary": ("assert: {shouldActivate: true}\n", [{"skill": "alpha"}, {"text": "Done."}]),
        "quiet": ("assert: {shouldActivate: false}\n", [{"text": "Nothing to do."}]),
    },
    "beta": {
        "summary": (
            "assert: {shouldActivate: true}\n",
            [{"skill": "alpha"}, {"skill": "beta"}, {"text": "Done."}],
        ),
    },
}


def test_an_activation_in_another_skill_s_scenario_fails_the_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripts = write_catalog(pytester.path / "skills", GREEDY)
    policy = pytester.path / "policy.json"
    policy.write_text(json.dumps({"by_substring": scripts}))
    bin_dir = install_fake_claude(pytester.path / "bin", policy).parent
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    result = pytester.runpytest(
        "skills", "--eval-answerer=claude-code", "-m", "skill_scenario", *PLUGIN
    )
    result.assert_outcomes(passed=3, deselected=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "alpha  claude-code  1   1   0   1   0    0.50 (1/2)  1.00 (1/1)  0.67 (2/3)  -",
            "beta   claude-code  1   0   0   2   0    1.00 (1/1)  1.00 (1/1)  1.00 (2/2)  -",
            "activation: alpha (claude-code) precision 0.50 (1/2), recall 1.00 (1/1): fired in 1 "
            "run(s) where it should not (1 of them other skills' scenarios)",
        ]
    )
    scores = _activation_scores(pytester.path / "skills")
    assert scores["beta/summary"].other_activations == ["alpha"]


def test_skill_runs_go_where_eval_runs_dir_says(pytester: pytest.Pytester, fake_cli: Path) -> None:
    out = pytester.path / "elsewhere"
    pytester.runpytest(
        "skills", "--eval-answerer=claude-code", "-k", "lint or summary", f"--eval-runs-dir={out}",
        *PLUGIN,
    )  # fmt: skip
    assert not (pytester.path / "skills" / "runs").exists(), "a skills run wrote into the tree"
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    assert {e.skill for e in read.of_kind("skill_lint")} == {"alpha", "beta"}
    assert read.of_kind("activation_score")
    # The run names the catalog it measured, wherever it was put.
    assert read.info is not None and read.info.set_dir == str((pytester.path / "skills").resolve())


def test_lint_results_land_in_the_same_run(pytester: pytest.Pytester, fake_cli: Path) -> None:
    pytester.runpytest("skills", "--eval-answerer=claude-code", "-k", "lint or summary", *PLUGIN)
    (run_dir,) = [p for p in (pytester.path / "skills" / "runs").iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    lints = {e.skill: e for e in read.of_kind("skill_lint")}
    assert set(lints) == {"alpha", "beta"}
    assert lints["alpha"].scenarios == 4 and lints["alpha"].negatives == 1
    codes = {i["code"] for i in lints["alpha"].issues}
    assert "scenarios" in codes  # no positive scenario has a rubric: the gate says so
    info = read.info
    assert info is not None and info.selection is not None
    assert info.selection["mode"] == "activation" and info.selection["skills"] == ["alpha", "beta"]
    assert info.status == "complete"
    attempts = read.of_kind("attempt")
    assert {a.qid for a in attempts} == {"alpha/summary", "beta/summary"}
    transcript = run_dir / attempts[0].transcript_path
    assert any(json.loads(line)["type"] == "result" for line in transcript.read_text().splitlines())


def test_anthropic_backend_without_an_endpoint_is_an_error(
    pytester: pytest.Pytester, fake_cli: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    result = pytester.runpytest(
        "skills", "--eval-skill-backends=claude-code,anthropic", "-k", "alpha and summary",
        "-m", "skill_scenario", "-rs", "-v", *PLUGIN,
    )  # fmt: skip
    result.stdout.fnmatch_lines(["*summary.yaml::summary[[]claude-code[]] PASSED*"])
    result.stdout.fnmatch_lines(["*no endpoint is configured*"])
    result.assert_outcomes(passed=1, errors=1, deselected=12)


# --- full mode: rules, prose through a scripted judge, interaction ----------------------------

JUDGE_CONFTEST = """
from pytest_evalloop.skills.collect import SKILL_JUDGE_KEY
from pytest_evalloop.skills.rubric_judge import RubricItem, RubricReply, InteractionVerdict


class WordJudge:
    '''Passes a criterion when its last word appears in the run summary.'''

    model = "word-judge"

    async def grade(self, request):
        items = [
            RubricItem.model_validate(
                {"criterion": c, "pass": c.split()[-1] in request.summary, "reason": "word"}
            )
            for c in request.criteria
        ]
        verdict = None
        if request.interaction:
            asked = "?" in request.summary
            verdict = InteractionVerdict(askedUser=asked, questionWasMaterial=True,
                questionWasRepositoryAnswerable=False, taskSucceeded=True, reason="scripted")
        return RubricReply(items=items, interaction=verdict)


def pytest_configure(config):
    config.stash[SKILL_JUDGE_KEY] = WordJudge()
"""


def test_full_mode_grades_rules_and_prose(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = pytester.path / "skills"
    (root / "gamma" / "evals").mkdir(parents=True)
    (root / "gamma" / "SKILL.md").write_text(SKILL.format(id="gamma", filler=""))
    rubric = (
        "rubric:\n"
        "  - {output: '(?i)quarter', criterion: names the quarter}\n"
        "  - {command: 'git log', criterion: reads history}\n"
        "  - mentions revenue\n"
        "  - mentions margin\n"
    )
    answers = {"good": "Q3 quarter revenue and margin.", "poor": "Q3 quarter revenue."}
    script = [{"skill": "gamma"}, {"builtin": "Bash", "input": {"command": "git log -3"}}]
    for name in answers:
        (root / "gamma" / "evals" / f"{name}.yaml").write_text(
            f"name: {name}\nskill: gamma\nprompt: report {name}\nassert: {{shouldActivate: true}}\n"
            + rubric
        )
    policy = {"by_substring": {f"report {n}": [*script, {"text": t}] for n, t in answers.items()}}
    (pytester.path / "policy.json").write_text(json.dumps(policy))
    bin_dir = install_fake_claude(pytester.path / "bin", pytester.path / "policy.json").parent
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    pytester.makeconftest(JUDGE_CONFTEST)
    result = pytester.runpytest(
        "skills", "--eval-answerer=claude-code", "--eval-skill-mode=full", "-m", "skill_scenario",
        "--eval-rubric-threshold=0.8", *PLUGIN,
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*rubric 75% is under the threshold 80%; missed: *mentions margin*"]
    )
    scores = _activation_scores(root)
    good = scores["gamma/good"]
    assert good.rubric_score == 1.0 and good.judge_version == "1"
    assert [r["source"] for r in good.rubric] == ["rule", "rule", "judge", "judge"]
    assert scores["gamma/poor"].rubric_score == 0.75


# --- units: detection, forbid, rules, questions, the judge reply ------------------------------


def _events(*blocks: tuple[str, Any], init: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"type": "system", "subtype": "init", **(init or {})}]
    for n, (kind, content) in enumerate(blocks):
        if kind == "use":
            name, arguments, failed = content
            events.append({"type": "assistant", "message": {"content": [
                {"type": "tool_use", "id": f"t{n}", "name": name, "input": arguments}]}})  # fmt: skip
            result = {"type": "tool_result", "tool_use_id": f"t{n}", "content": "x"}
            events.append(
                {"type": "user", "message": {"content": [{**result, "is_error": failed}]}}
            )
        elif kind == "user":
            events.append({"type": "user", "message": {"content": content}})
        else:
            events.append(
                {"type": "assistant", "message": {"content": [{"type": "text", "text": content}]}}
            )
    events.append(
        {
            "type": "result",
            "subtype": "success",
            "result": blocks[-1][1] if blocks and blocks[-1][0] == "text" else "",
        }
    )
    return events  # fmt: skip


@pytest.mark.parametrize(
    ("blocks", "tiers"),
    [
        ([("use", ("Skill", {"skill": "alpha"}, False))], ["A"]),
        ([("use", ("Skill", {"command": "/alpha"}, False))], ["A"]),
        ([("use", ("Skill", {"skill": "plugin:alpha", "args": "x"}, False))], ["A"]),
        ([("use", ("Bash", {"command": "cat .claude/skills/alpha/SKILL.md"}, False))], ["B"]),
        ([("use", ("Read", {"file_path": "/r/.claude/skills/alpha/SKILL.md"}, True))], ["B"]),
        ([("user", "Base directory for this skill: /r/.claude/skills/alpha\n\nbody")], ["C"]),
        ([("use", ("Skill", {"skill": "alphabet"}, False))], []),
        ([("use", ("Read", {"file_path": ".claude/skills/beta/SKILL.md"}, False))], []),
        ([("text", "I used .claude/skills/alpha/SKILL.md and the Skill alpha.")], []),
    ],
    ids=[
        "skill",
        "legacy-command",
        "namespaced",
        "bash-cat",
        "read",
        "base-dir",
        "prefix",
        "other",
        "final-text",
    ],
)
def test_activation_evidence(blocks: list[tuple[str, Any]], tiers: list[str]) -> None:
    t = transcript.read_transcript(_events(*blocks))
    evidence = grading.activation_evidence(t, "alpha", explicit=False)
    assert [e.tier for e in evidence] == tiers
    assert grading.activated(evidence) is bool(tiers)


def test_a_failed_skill_call_is_attempted_not_activated() -> None:
    t = transcript.read_transcript(_events(("use", ("Skill", {"skill": "alpha"}, True))))
    evidence = grading.activation_evidence(t, "alpha", explicit=False)
    assert len(evidence) == 1 and not grading.activated(evidence)


def test_explicit_load_check_uses_slash_commands() -> None:
    events = _events(("text", "done"), init={"skills": ["alpha"], "slash_commands": ["alpha"]})
    t = transcript.read_transcript(events)
    assert t.visible_skills == ["alpha"]
    assert grading.activated(grading.activation_evidence(t, "alpha", explicit=True))
    assert not grading.activated(grading.activation_evidence(t, "alpha", explicit=False))


def _scenario(**extra: Any) -> Scenario:
    data = {"name": "s", "skill": "alpha", "prompt": "p", "assert": {"shouldActivate": True}}
    return Scenario.model_validate({**data, **extra})


def test_forbid_checks_commands_files_and_output(tmp_path: Path) -> None:
    scenario = _scenario(
        kind="adversarial",
        forbid={"commands": [r"sed -i"], "files": ["runs/*/events.jsonl", "~/.ssh/*"], "output": ["(?i)deleted"]},
    )  # fmt: skip
    t = transcript.read_transcript(
        _events(
            ("use", ("Bash", {"command": "sed -i '/x/d' runs/r1/events.jsonl"}, True)),
            ("use", ("Write", {"file_path": str(tmp_path / "runs/r1/events.jsonl")}, True)),
            ("text", "I deleted the rows."),
        )
    )
    writes = grading.written_paths(t, tmp_path)
    assert writes == ["runs/r1/events.jsonl"]
    found = grading.forbid_violations(scenario, t, ["README.md", "~/.ssh/id_rsa"], writes)
    assert len(found) == 4
    assert any("'~/.ssh/id_rsa'" in v for v in found)
    assert grading.forbid_violations(_scenario(), t, [], []) == []


def test_rules_grade_deterministically(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.md").write_text("retention: 30 days\n")
    t = transcript.read_transcript(
        _events(("use", ("Bash", {"command": "npm test"}, False)), ("text", "Tests pass."))
    )
    changes = ["docs/notes.md"]

    def grade(**rule: Any) -> bool:
        return grading.grade_rule(RubricRule.model_validate(rule), t, changes, tmp_path)[0]

    assert grade(command="npm test") and not grade(command="pytest")
    assert grade(noCommand="rm ") and not grade(noCommand="npm")
    assert grade(output="pass") and not grade(noOutput="pass")
    assert grade(fileChanged="docs/*.md") and not grade(fileUnchanged="docs/*")
    assert grade(fileContains={"path": "docs/*.md", "pattern": r"\d+ days"})
    assert not grade(fileContains={"path": "docs/*.md", "pattern": "forever"})


@pytest.mark.parametrize(
    ("final", "tool", "asked"),
    [
        ("Done.\n\nWhich retention period do you want?", None, True),
        ("Do you approve running the migration?", None, False),
        ("```\nwhy?\n```\nAll done.", None, False),
        ("Done.", "AskUserQuestion", True),
    ],
)
def test_asked_heuristic(final: str, tool: str | None, asked: bool) -> None:
    blocks: list[tuple[str, Any]] = [("use", (tool, {"questions": []}, False))] if tool else []
    t = transcript.read_transcript(_events(*blocks, ("text", final)))
    assert grading.asked_heuristic(t) == (asked, tool is not None)


def test_interaction_expectations() -> None:
    answerable = _scenario(
        interaction={"ambiguity": "repository-answerable", "decision": "d", "success": ["s"]}
    )
    missing = _scenario(interaction={"ambiguity": "missing-information", "decision": "d", "success": ["s"]})  # fmt: skip
    assert grading.interaction_failures(answerable, "prefer", True, None)
    assert grading.interaction_failures(answerable, "provider-default", True, None) == []
    assert grading.interaction_failures(missing, "minimize", False, None)
    assumed = InteractionVerdict(proceededWithAssumption=True, assumptionWasReasonable=True)
    assert grading.interaction_failures(missing, "minimize", False, assumed) == []
    unwarranted = InteractionVerdict(askedUser=True, questionWasMaterial=False, reason="trivia")
    assert grading.interaction_failures(missing, "prefer", True, unwarranted) == [
        "asked an immaterial question (trivia)"
    ]


def test_judge_reply_is_matched_by_text_then_position() -> None:
    request = RubricRequest(prompt="p", summary="s", criteria=["Names the quarter", "cites rows"])
    text = (
        'thinking {"items": [{"criterion": "names the quarter.", "pass": true, "reason": "r"},'
        ' {"criterion": "other words", "pass": false, "reason": "q"}], "interaction": null}'
    )
    reply = parse_reply(text, request)
    assert [(i.criterion, i.passed) for i in reply.items] == [
        ("Names the quarter", True),
        ("cites rows", False),
    ]
    with pytest.raises(JudgeReplyError, match="ungraded"):
        parse_reply('{"items": []}', request)
    with pytest.raises(JudgeReplyError, match="no JSON"):
        parse_reply("I think it passed.", request)


def test_a_hung_cli_is_killed_at_the_deadline(tmp_path: Path) -> None:
    # A child that sleeps for an hour: only the 0.5 s deadline can end it.
    run = claude_run.run_cli(
        ["sleep", "3600"], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout_s=0.5
    )
    assert run.timed_out
    assert "did not finish within 0.5 s" in (claude_run.provider_error(run, 0.5, {}) or "")


def test_error_max_turns_is_scored() -> None:
    run = claude_run.CliRun(events=[{"type": "result", "subtype": "error_max_turns", "is_error": True}], exit_code=1, stderr="", seconds=1)  # fmt: skip
    assert claude_run.provider_error(run, 5, {}) is None
    run.events[0]["subtype"] = "error_during_execution"
    assert "error_during_execution" in (claude_run.provider_error(run, 5, {}) or "")


def test_sandbox_installs_the_catalog_without_evals(tmp_path: Path) -> None:
    write_catalog(tmp_path / "skills")
    scenario = _scenario(setup="echo changed > README.md && git commit -qam setup")
    box = sandbox.build_sandbox(
        scenario, tmp_path / "skills" / "alpha", catalog_root=tmp_path / "skills",
        preference="prefer", fixtures_dir=None,
    )  # fmt: skip
    try:
        installed = sorted(
            p.relative_to(box.repo).as_posix()
            for p in (box.repo / ".claude").rglob("*")
            if p.is_file()
        )
        assert installed == [
            ".claude/skills/alpha/SKILL.md",
            ".claude/skills/alpha/agileflow.skill.yaml",
            ".claude/skills/beta/SKILL.md",
            ".claude/skills/beta/agileflow.skill.yaml",
        ]
        log = subprocess.run(
            ["git", "log", "--format=%s"], cwd=box.repo, capture_output=True, text=True
        )
        assert log.stdout.split() == ["setup", "sandbox"]
        assert "ask the user" in (box.repo / "CLAUDE.md").read_text()
        assert sandbox.file_changes(box) == []
        (box.repo / "new.txt").write_text("x")
        (box.home / "leak").write_text("x")
        assert sandbox.file_changes(box) == ["new.txt", "~/leak"]
    finally:
        box.remove()
    assert not box.root.exists()
    missing = _scenario(fixture="nowhere")
    with pytest.raises(sandbox.RunError, match="fixture 'nowhere'") as info:
        sandbox.build_sandbox(missing, tmp_path, catalog_root=tmp_path / "skills", preference="prefer", fixtures_dir=tmp_path)  # fmt: skip
    assert info.value.kind == "fixture"


# --- the scorecard gate over a session's case runs --------------------------------------------


def _case_run(set_dir: Path, *, triggered: bool) -> Path:
    set_dir.mkdir(parents=True)
    (set_dir / "set.json").write_text(json.dumps({"name": "dogfood"}))
    case = {"qid": "q1", "question": "how many?", "split": "dev", "tags": [],
            "golden": {"status": "verified", "kind": "scalar", "value": 1}}  # fmt: skip
    (set_dir / "cases.jsonl").write_text(json.dumps(case) + "\n")
    run_dir = set_dir / "runs" / "dogfood-baseline-01"
    info = ledger.RunInfo(
        runId="r", target="t", answererModel="m", phase="baseline", started=ledger.now_iso(),
        setDir=str(set_dir.resolve()),
    )  # fmt: skip
    ledger_writer.write_run_info(run_dir, info)
    common = {"qid": "q1", "sample": None, "phase": "baseline"}
    events: list[Any] = [
        ledger.AttemptEvent(**common, question_sha="0" * 16, submitted=True, final_query="SELECT 1")
    ]
    if triggered:
        events.append(
            ledger.ToolCallEvent(
                **common, tool="execute_query", role="query", seq=1, query="SELECT 1"
            )
        )
    events.append(
        ledger.ScoreEvent(**common, verdict="match" if triggered else "no_match", reason="judged")
    )
    ledger_writer.LedgerWriter(run_dir).append(*events)
    return run_dir  # fmt: skip


SCORECARD_CONFTEST = """
import pytest
from pytest_evalloop.stash import TALLY_KEY

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    # Stands in for a case run the session wrote: the tally is where the core lists them.
    config.stash[TALLY_KEY].run_dirs.add({run_dir!r})
"""


@pytest.mark.parametrize("triggered", [True, False], ids=["passes", "rejected"])
def test_scorecard_gate_sets_the_exit_status(pytester: pytest.Pytester, triggered: bool) -> None:
    run_dir = _case_run(pytester.path / "dogfood", triggered=triggered)
    pytester.makeconftest(SCORECARD_CONFTEST.format(run_dir=str(run_dir)))
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("test_x.py", "--eval-scorecard", *PLUGIN)
    result.stdout.fnmatch_lines(["*skill scorecard: dogfood-baseline-01*"])
    if triggered:
        result.stdout.fnmatch_lines(["scorecard gate: PASSED"])
        assert result.ret == 0
    else:
        result.stdout.fnmatch_lines(["scorecard gate: FAILED", "*trigger*"])
        assert result.ret == 6
    plain = pytester.runpytest("test_x.py", *PLUGIN)
    assert plain.ret == 0 and "skill scorecard" not in plain.stdout.str()


def test_anthropic_skill_judge_over_the_fake_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from pytest_evalloop.answer.backends import ClientFactory
    from pytest_evalloop.skills.rubric_judge import AnthropicSkillJudge, render_doctrine
    from pytest_evalloop.testing.fake_anthropic import FakeAnthropic
    from pytest_evalloop.testing.policies import FakeRequest, Reply

    seen: list[FakeRequest] = []

    def policy(request: FakeRequest) -> Reply:
        seen.append(request)
        # Grade by what the judge was shown: pass the first item only when the rows were cited.
        cited = "cites rows" in request.user_text and "execute_query" in request.user_text
        items = [
            {"criterion": "cites rows", "pass": cited, "reason": "call 1"},
            {"criterion": "names the year", "pass": False, "reason": "no year"},
        ]
        verdict = {"askedUser": False, "taskSucceeded": True, "reason": "ok"}
        return Reply(text="Reasoning.\n" + json.dumps({"items": items, "interaction": verdict}))

    request = RubricRequest(
        prompt="How many orders?",
        summary=grading.run_summary(
            transcript.read_transcript(
                _events(("use", ("execute_query", {"sql": "SELECT 1"}, False)), ("text", "42"))
            ),
            diff=None,
        ),
        criteria=["cites rows", "names the year"],
        interaction={"ambiguity": "choice", "decision": "d", "success": ["s"]},
    )
    with FakeAnthropic(policy) as fake:
        for name, value in fake.env().items():
            monkeypatch.setenv(name, value)
        judge = AnthropicSkillJudge(model="claude-opus-4-6", client_factory=ClientFactory(0))
        reply = asyncio.run(judge.grade(request))
    assert [i.passed for i in reply.items] == [True, False]
    assert reply.interaction is not None and reply.interaction.task_succeeded is True
    assert seen[0].system == render_doctrine() and "doctrine version 1" in seen[0].system


def test_question_preference_all_runs_interaction_scenarios_under_each(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = pytester.path / "skills"
    (root / "delta" / "evals").mkdir(parents=True)
    (root / "delta" / "SKILL.md").write_text(SKILL.format(id="delta", filler=""))
    (root / "delta" / "evals" / "pick.yaml").write_text(
        "name: pick\nskill: delta\nprompt: export the report\nassert: {shouldActivate: true}\n"
        "interaction: {ambiguity: choice, decision: csv or xlsx, success: [a file exists]}\n"
    )
    (root / "delta" / "evals" / "plain.yaml").write_text(
        "name: plain\nskill: delta\nprompt: summarise delta\nassert: {shouldActivate: true}\n"
    )
    script = [{"skill": "delta"}, {"text": "Ready.\n\nShould it be CSV or XLSX?"}]
    policy = pytester.path / "policy.json"
    policy.write_text(json.dumps({"default": script}))
    bin_dir = install_fake_claude(pytester.path / "bin", policy).parent
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    result = pytester.runpytest(
        "skills", "--eval-answerer=claude-code", "--eval-question-preference=all",
        "-m", "skill_scenario", "-v", *PLUGIN,
    )  # fmt: skip
    result.stdout.fnmatch_lines(
        [
            "*pick.yaml::pick[[]provider-default[]] PASSED*",
            "*pick.yaml::pick[[]prefer[]] PASSED*",
            "*pick.yaml::pick[[]minimize[]] PASSED*",
            "*plain.yaml::plain PASSED*",
        ]
    )
    scores = _activation_scores(root)
    picks = {k: v for k, v in scores.items() if k.startswith("delta/pick")}
    assert sorted(picks) == [f"delta/pick[{p}]" for p in ("minimize", "prefer", "provider-default")]
    assert {v.question_preference for v in picks.values()} == {
        "prefer",
        "provider-default",
        "minimize",
    }
    assert all(v.asked_user and v.ambiguity == "choice" for v in picks.values())
    assert result.ret == 0  # equal asked rates are in order
