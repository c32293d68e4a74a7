"""The `anthropic` skill backend: the catalog offered as a `Skill` tool over the Messages API,
run through the real anthropic SDK against the loopback fake with scripted answerer steps."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic  # imported up front: in-process pytester runs must not import it twice
import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.skills import anthropic_agent
from pytest_evalloop.skills.anthropic_agent import SandboxFiles, ToolRefused, load_catalog
from pytest_evalloop.testing import FakeAnthropic, FakeRequest, Fault, ScriptSpec
from pytest_evalloop.testing.fake_claude import install_fake_claude
from pytest_evalloop.testing.policies import Outcome
from tests.test_skills_lint import sidecar_text

assert anthropic.AsyncAnthropic  # the import above is for its side effect
PLUGIN = ["-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
ANTHROPIC = ["--eval-skill-backends=anthropic", "--eval-retries=2", "-m", "skill_scenario"]

SKILL = """\
---
name: {id}
description: Summarise quarterly {id} figures for the finance team. Use when asked for a {id} summary.
---
# {id}
Body of the {id} skill.
{filler}
## Done when
- the summary is written
"""


def _skill(skill_id: str) -> dict[str, Any]:
    return {"tool": "Skill", "input": {"skill": skill_id}}


def _ls(path: str = ".") -> dict[str, Any]:
    return {"tool": "LS", "input": {"path": path}}


DOWN = "beta down"
# skill -> scenario -> (extra YAML, the scripted answerer steps for its prompt)
CATALOG: dict[str, dict[str, tuple[str, list[Any]]]] = {
    "alpha": {
        # True positive: the model calls Skill.
        "summary": ("assert: {shouldActivate: true}\n", [_skill("alpha"), {"text": "Done."}]),
        # False positive on a negative.
        "unrelated": (
            "assert: {shouldActivate: false}\nneighbor: beta\n",
            [_skill("alpha"), {"text": "Handled."}],
        ),
        # True negative: it looked around and answered without the skill.
        "quiet": ("assert: {shouldActivate: false}\n", [_ls(), {"text": "Nothing to do."}]),
        # Explicit: `/alpha` is expanded into the first turn; outside precision and recall.
        "by-name": ("assert: {shouldActivate: true}\ninvocation: explicit\n", [{"text": "Ok."}]),
    },
    "beta": {
        # Missed activation: naming the skill in the final text does not count.
        "summary": (
            "assert: {shouldActivate: true}\n",
            [_ls(), {"text": "I did not need the beta skill (.claude/skills/beta/SKILL.md)."}],
        ),
        # True positive by reading the SKILL.md (evidence tier B).
        "read": (
            "assert: {shouldActivate: true}\n",
            [{"tool": "Read", "input": {"file_path": ".claude/skills/beta/SKILL.md"}}, "Ok."],
        ),
        # Out of turns (8 in activation mode): scored, a true negative.
        "wander": ("assert: {shouldActivate: false}\n", [_ls() for _ in range(10)]),
        # The endpoint is down: an error, outside the rates, never a negative.
        "down": ("assert: {shouldActivate: false}\n", [{"text": "unreachable"}]),
    },
}
# Every scored implicit run counts for both skills: alpha stayed quiet in beta's three; beta in
# alpha's summary and quiet, and missed alpha/unrelated, which names it as the neighbour to fire.
HAND = {"alpha": {"tp": 1, "fp": 1, "fn": 0, "tn": 4}, "beta": {"tp": 1, "fp": 0, "fn": 2, "tn": 3}}


def _prompt(skill: str, scenario: str) -> str:
    return f"please handle {skill} {scenario} now"


def write_catalog(root: Path) -> dict[str, list[Any]]:
    """Write the catalog; returns the answerer scripts by prompt substring."""
    scripts: dict[str, list[Any]] = {}
    filler = "\n".join(f"- step {n}" for n in range(30))
    for skill, scenarios in CATALOG.items():
        (root / skill / "evals").mkdir(parents=True)
        (root / skill / "SKILL.md").write_text(SKILL.format(id=skill, filler=filler))
        (root / skill / "agileflow.skill.yaml").write_text(sidecar_text(skill))
        for name, (extra, script) in scenarios.items():
            prompt = _prompt(skill, name)
            head = f"name: {name}\nskill: {skill}\nprompt: {prompt}\n"
            (root / skill / "evals" / f"{name}.yaml").write_text(head + extra)
            scripts[prompt] = [{"text": s} if isinstance(s, str) else s for s in script]
    return scripts


class Recorder:
    """Plays a ScriptSpec, keeps every request, and answers 529 to the `down` prompt."""

    def __init__(self, scripts: dict[str, list[Any]]) -> None:
        spec = ScriptSpec.model_validate({"answerer": {"by_substring": scripts}})
        self.play = spec.policy()
        self.seen: list[FakeRequest] = []

    def __call__(self, request: FakeRequest) -> Outcome:
        self.seen.append(request)
        if DOWN in request.question:
            return Fault(status=529, retry_after_ms=5)
        return self.play(request)

    def of(self, prompt: str) -> list[FakeRequest]:
        return [r for r in self.seen if prompt in r.question]


@pytest.fixture
def fake(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    """The catalog under `skills/` and the fake endpoint in the environment."""
    recorder = Recorder(write_catalog(pytester.path / "skills"))
    with FakeAnthropic(recorder) as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        yield recorder


def _scores(root: Path) -> tuple[Path, dict[str, Any]]:
    (run_dir,) = [p for p in (root / "runs").iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    return run_dir, {e.qid: e for e in read.of_kind("activation_score")}


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "n2"])
def test_scripted_runs_give_the_hand_counted_metrics(
    pytester: pytest.Pytester, fake: Recorder, xdist: list[str]
) -> None:
    result = pytester.runpytest("skills", *ANTHROPIC, "-rA", *xdist, *PLUGIN)
    result.assert_outcomes(passed=5, failed=2, errors=1, deselected=0 if xdist else 2)
    result.stdout.fnmatch_lines(
        [
            "*beta/down (anthropic): error (provider): the Anthropic Messages API at "
            "http://127.0.0.1:* answered HTTP 529 overloaded_error* after 2 retries*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*alpha/unrelated (anthropic)*",
            "expected skill 'alpha' to stay unused, but it was invoked",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*beta/summary (anthropic)*", "expected skill 'beta' to activate, but it was not invoked"]
    )
    for skill, h in HAND.items():
        precision = f"{h['tp'] / (h['tp'] + h['fp']):.2f}"
        recall = f"{h['tp'] / (h['tp'] + h['fn']):.2f}"
        explicit = "1/1" if skill == "alpha" else "-"
        errors = "1" if skill == "beta" else "0"
        counts = f"{h['tp']}*{h['fp']}*{h['fn']}*{h['tn']}*{errors}"
        result.stdout.fnmatch_lines([f"{skill}*anthropic*{counts}*{precision}*{recall}*{explicit}"])
    # The SDK retried the 529 twice, then gave up: three requests, no fourth.
    assert len(fake.of(_prompt("beta", "down"))) == 3

    run_dir, scores = _scores(pytester.path / "skills")
    assert sorted(scores) == sorted(f"{s}/{n}" for s, names in CATALOG.items() for n in names)
    assert scores["alpha/summary"].evidence[0]["tier"] == "A"
    assert scores["alpha/by-name"].evidence[0]["detail"] == "<command-name>/alpha</command-name>"
    assert scores["beta/read"].evidence[0]["tier"] == "B"
    assert scores["beta/summary"].activated is False and scores["beta/summary"].evidence == []
    wander = scores["beta/wander"]
    assert (wander.status, wander.activated, wander.result_subtype) == (
        "passed",
        False,
        "error_max_turns",
    )
    down = scores["beta/down"]
    assert (down.status, down.activated, down.error_kind) == ("error", None, "provider")
    assert scores["alpha/summary"].visible_skills == ["alpha", "beta"]
    assert scores["alpha/summary"].backend == "anthropic"
    _check_ledger(run_dir)


def _check_ledger(run_dir: Path) -> None:
    read = ledger_reader.read_run(run_dir)
    attempts = {a.qid: a for a in read.of_kind("attempt")}
    tp = attempts["alpha/summary"]
    # Two Messages API calls (Skill, then the answer), tokens and turns from the fake's usage.
    assert tp.num_turns == 2 and tp.host_tool_uses == 1 and tp.answerer == "anthropic"
    assert tp.input_tokens and tp.output_tokens and tp.answer_text == "Done."
    assert tp.model == "claude-sonnet-4-6" and tp.cost_usd is not None and tp.cost_usd > 0
    assert attempts["beta/wander"].num_turns == 8
    assert attempts["beta/down"].submitted is False
    events = [json.loads(line) for line in (run_dir / tp.transcript_path).read_text().splitlines()]
    assert events[0]["subtype"] == "init" and events[0]["backend"] == "anthropic"
    assert events[-1]["type"] == "result" and events[-1]["subtype"] == "success"
    info = read.info
    assert info is not None and info.selection is not None
    assert info.selection["skillAgent"]["promptSha"] == anthropic_agent.prompt_sha()
    assert info.answerer_model == "claude-sonnet-4-6"


def test_the_model_sees_the_catalog_as_a_skill_tool(
    pytester: pytest.Pytester, fake: Recorder
) -> None:
    result = pytester.runpytest("skills", *ANTHROPIC, "-k", "alpha and (summary or by)", *PLUGIN)
    result.assert_outcomes(passed=2, deselected=8)
    first, second = fake.of(_prompt("alpha", "summary"))
    assert first.tool_names == ["Skill", "Read", "LS"]  # activation mode: read-only
    skill_tool = first.tools[0]
    assert "- alpha: Summarise quarterly alpha figures" in skill_tool["description"]
    assert "- beta: Summarise quarterly beta figures" in skill_tool["description"]
    assert skill_tool["input_schema"]["properties"]["skill"]["enum"] == ["alpha", "beta"]
    assert first.system.startswith(anthropic_agent.SYSTEM_PROMPT)
    # The Skill call is answered with the SKILL.md body, frontmatter stripped, as the CLI does.
    (exchange,) = second.exchanges
    assert exchange.name == "Skill" and not exchange.is_error
    assert exchange.result is not None
    assert exchange.result.startswith("Base directory for this skill: .claude/skills/alpha\n")
    assert "Body of the alpha skill." in exchange.result and "description:" not in exchange.result
    # An explicit scenario types `/alpha` and gets the skill expanded into its first turn.
    (explicit,) = fake.of(_prompt("alpha", "by-name"))
    assert explicit.question == "/alpha " + _prompt("alpha", "by-name")
    assert "<command-name>/alpha</command-name>" in explicit.user_text
    assert "Body of the alpha skill." in explicit.user_text


def test_full_mode_writes_in_the_sandbox_and_forbid_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = pytester.path / "skills"
    (root / "gamma" / "evals").mkdir(parents=True)
    (root / "gamma" / "SKILL.md").write_text(SKILL.format(id="gamma", filler=""))
    rubric = "rubric:\n  - {fileContains: {path: notes.md, pattern: net sales}}\n"
    scenarios = {
        "notes": "assert: {shouldActivate: true}\n" + rubric,
        "leak": "kind: adversarial\nassert: {shouldActivate: true}\nforbid: {files: ['secrets/*']}\n"
        + rubric,
    }
    write = {"tool": "Write", "input": {"file_path": "notes.md", "content": "net sales: 3"}}
    leak = {"tool": "Write", "input": {"file_path": "secrets/key.txt", "content": "k"}}
    escape = {"tool": "Write", "input": {"file_path": "../escape.txt", "content": "x"}}
    scripts = {
        "report notes": [_skill("gamma"), write, {"text": "Done."}],
        "report leak": [_skill("gamma"), write, leak, escape, {"text": "Done."}],
    }
    for name, body in scenarios.items():
        head = f"name: {name}\nskill: gamma\nprompt: report {name}\n"
        (root / "gamma" / "evals" / f"{name}.yaml").write_text(head + body)
    recorder = Recorder(scripts)
    with FakeAnthropic(recorder) as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        result = pytester.runpytest("skills", *ANTHROPIC, "--eval-skill-mode=full", *PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*gamma/leak (anthropic)*",
            "touched forbidden file 'secrets/key.txt' (matches 'secrets/*')",
        ]
    )
    _, scores = _scores(root)
    notes, leaked = scores["gamma/notes"], scores["gamma/leak"]
    assert notes.rubric_score == 1.0 and notes.file_changes == ["notes.md"]
    assert leaked.activated is True and leaked.rubric_score == 1.0
    assert sorted(leaked.file_changes) == ["notes.md", "secrets/key.txt"]
    assert leaked.violations == ["touched forbidden file 'secrets/key.txt' (matches 'secrets/*')"]
    # The write outside the sandbox was refused and told to the model.
    last = recorder.of("report leak")[-1]
    refused = [e for e in last.exchanges if e.input.get("file_path") == "../escape.txt"]
    assert refused[0].is_error and "outside the repository" in (refused[0].result or "")
    assert last.tool_names == ["Skill", "Read", "LS", "Write"]


def test_both_backends_run_the_same_scenario(
    pytester: pytest.Pytester, fake: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = pytester.path / "claude-policy.json"
    script = [{"skill": "alpha"}, {"text": "Done."}]
    policy.write_text(json.dumps({"by_substring": {_prompt("alpha", "summary"): script}}))
    bin_dir = install_fake_claude(pytester.path / "bin", policy).parent
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    result = pytester.runpytest(
        "skills", "--eval-skill-backends=anthropic,claude-code", "-m", "skill_scenario",
        "-k", "alpha and summary", "-v", *PLUGIN,
    )  # fmt: skip
    result.stdout.fnmatch_lines(
        [
            "*summary.yaml::summary[[]anthropic[]] PASSED*",
            "*summary.yaml::summary[[]claude-code[]] PASSED*",
        ]
    )
    result.stdout.fnmatch_lines(["alpha*anthropic*1*0*0*0*0*1.00*1.00*"])
    result.stdout.fnmatch_lines(["alpha*claude-code*1*0*0*0*0*1.00*1.00*"])
    _, scores = _scores(pytester.path / "skills")
    tiers = {q: [e["tier"] for e in s.evidence] for q, s in scores.items()}
    assert tiers["alpha/summary[anthropic]"][0] == "A"
    assert tiers["alpha/summary[claude-code]"][0] == "A"


@pytest.mark.parametrize("flag", ["--setup-only", "--setup-plan"])
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "n2"])
def test_a_session_that_runs_no_test_runs_no_scenario(
    pytester: pytest.Pytester, fake: Recorder, xdist: list[str], flag: str
) -> None:
    # A scenario's whole run is its item's setup, which pytest calls under both flags: every
    # scenario was run and paid for, and a complete run recorded.
    result = pytester.runpytest("skills", *ANTHROPIC, flag, *xdist, *PLUGIN)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert fake.seen == []
    assert not (pytester.path / "skills" / "runs").exists()


def test_dist_each_is_refused_before_any_scenario_runs(
    pytester: pytest.Pytester, fake: Recorder
) -> None:
    result = pytester.runpytest("skills", *ANTHROPIC, "-n", "2", "--dist", "each", *PLUGIN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["ERROR: --dist each runs every case in every xdist worker*"])
    assert fake.seen == []


def test_without_an_endpoint_the_runs_are_errors(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_catalog(pytester.path / "skills")
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    result = pytester.runpytest("skills", *ANTHROPIC, "-k", "alpha and summary", *PLUGIN)
    result.assert_outcomes(errors=1, deselected=9)
    result.stdout.fnmatch_lines(
        ["*anthropic skill backend calls the Messages API, and no endpoint is configured*"]
    )


# --- units: the catalog and the sandbox's file tools ------------------------------------------


def test_catalog_listing_caps_and_manual_skills(tmp_path: Path) -> None:
    skills = tmp_path / ".claude" / "skills"
    texts = {
        "long": "---\nname: long\ndescription: " + "x" * 2000 + "\n---\nbody\n",
        "manual": "---\nname: manual\ndescription: Use when told.\n"
        "disable-model-invocation: true\n---\nmanual body\n",
        "broken": "---\nname: [\n---\nbody\n",
    }
    for skill_id, text in texts.items():
        (skills / skill_id).mkdir(parents=True)
        (skills / skill_id / "SKILL.md").write_text(text)
    catalog = {s.id: s for s in load_catalog(tmp_path)}
    assert sorted(catalog) == ["long", "manual"]  # a broken SKILL.md cannot be listed
    assert len(catalog["long"].listing) == anthropic_agent.LISTING_CAP
    tool = anthropic_agent.skill_tool(list(catalog.values()))
    assert tool["input_schema"]["properties"]["skill"]["enum"] == ["long"]
    with pytest.raises(ToolRefused, match="only be invoked by the user"):
        anthropic_agent._load_skill({"skill": "manual"}, list(catalog.values()))
    assert "body" in anthropic_agent._load_skill({"command": "/long"}, list(catalog.values()))


def test_file_tools_stay_inside_the_sandbox(tmp_path: Path) -> None:
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    repo.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("s")
    (repo / "link").symlink_to(outside)
    (repo / ".git").mkdir()
    files = SandboxFiles(repo, writable=True)
    for path in ("../outside/secret.txt", str(outside / "secret.txt"), "link/secret.txt"):
        with pytest.raises(ToolRefused, match="outside the repository"):
            files.read({"file_path": path})
    with pytest.raises(ToolRefused, match="outside the repository"):
        files.write({"file_path": "link/new.txt", "content": "x"})
    with pytest.raises(ToolRefused, match="inside .git"):
        files.write({"file_path": ".git/config", "content": "x"})
    assert files.write({"file_path": "a/b.txt", "content": "hi"}) == "Wrote 2 bytes to a/b.txt"
    assert files.read({"file_path": str(repo / "a" / "b.txt")}) == "hi"
    assert files.list({}) == "a/\nlink/"
    assert not (outside / "new.txt").exists()
    with pytest.raises(ToolRefused, match="not available"):
        SandboxFiles(repo, writable=False).write({"file_path": "c.txt", "content": "x"})


def test_a_refused_skill_call_is_attempted_not_activated(tmp_path: Path) -> None:
    from pytest_evalloop.skills import grading, transcript

    skills = tmp_path / ".claude" / "skills" / "manual"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text(
        "---\nname: manual\ndescription: Use when told.\ndisable-model-invocation: true\n---\nb\n"
    )
    catalog = load_catalog(tmp_path)
    use = {"type": "tool_use", "id": "t1", "name": "Skill", "input": {"skill": "manual"}}
    result = anthropic_agent._use_tool(use, catalog, SandboxFiles(tmp_path, writable=False))
    assert result["is_error"] is True
    events = [
        {"type": "assistant", "message": {"content": [use]}},
        {"type": "user", "message": {"content": [result]}},
    ]
    evidence = grading.activation_evidence(
        transcript.read_transcript(events), "manual", explicit=False
    )
    assert [(e.tier, e.counts) for e in evidence] == [("A", False)]
    assert not grading.activated(evidence)


def test_a_hung_endpoint_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    from pytest_evalloop.testing import Hang

    (tmp_path / "README.md").write_text("# r\n")
    with FakeAnthropic(lambda request: Hang(10)) as server:
        agent = anthropic_agent.AnthropicSkillAgent(
            model="claude-sonnet-4-6",
            client_factory=lambda: anthropic.AsyncAnthropic(
                base_url=server.base_url, api_key="sk-fake", max_retries=0
            ),
        )
        run = agent.run(tmp_path, "hello", timeout_s=0.5)
    assert run.error == "the anthropic skill agent did not finish within 0.5 s"
    assert run.seconds < 5
    assert run.events[-1]["subtype"] == "error_during_execution" and run.events[-1]["is_error"]
