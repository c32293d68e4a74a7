"""Pins: what a run records as served, which differences break a comparison, and the refusals
that keep one run one configuration (issue 13, points 3 to 7), through whole runs."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.cli import main as cli
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure.comparison import compare
from pytest_evalloop.measure.comparison_text import report_lines
from pytest_evalloop.measure.flips import EXIT_USAGE, flips_main
from pytest_evalloop.measure.gate import decide_gate
from pytest_evalloop.testing import FakeAnthropic
from tests.sealing import closed_as_is
from tests.test_flips import PINS, pair
from tests.test_gate import QIDS, first_five_fail, run, script

__all__ = ["first_five_fail"]  # a module-scoped fixture shared with test_gate


def _copy_baseline(shop: Path, source: Path) -> Path:
    target = shop / "runs" / "base"
    shutil.copytree(source, target)
    return target


def _edit_pin(run_dir: Path, **changes: Any) -> None:
    """Make a stored run one that closed under these pins (sealed as such)."""
    path = run_dir / ledger.RUN_FILE
    info = json.loads(path.read_text())
    info.update(changes)
    path.write_text(json.dumps(info))
    if info.get("status") not in (None, "running"):
        closed_as_is(run_dir)


# --- point 4: one function sorts the pins ----------------------------------------------------


def test_classify_tells_breaking_pins_from_the_model_under_test() -> None:
    from pytest_evalloop.measure import pins

    base = {**PINS, "modelSha": "a" * 64, "harnessVersion": "pytest-evalloop 0.1"}
    edited = {**base, "modelSha": "b" * 64, "harnessVersion": "pytest-evalloop 0.2"}
    found = pins.classify(base, edited)
    assert found.breaking == [] and found.comparable and not found.same_configuration
    assert [d.name for d in found.under_test] == ["modelSha"]
    assert [d.name for d in found.recorded] == ["harnessVersion"]
    other = pins.classify(base, {**base, "answerer": "claude-code", "targetProfile": "publisher"})
    assert [d.name for d in other.breaking] == ["answerer", "targetProfile"]
    # An unset pin differs from a set one, except where the caller says it cannot know yet.
    assert [d.name for d in pins.classify(base, {**base, "modelSha": None}).under_test] == [
        "modelSha"
    ]
    assert pins.classify(base, {**base, "modelSha": None}, only_known={"modelSha"}).under_test == []


# --- point 3: a pin mismatch is a rebase whatever the gate -------------------------------------


def test_gate_off_never_accepts_a_pair_whose_pins_differ() -> None:
    base, post = pair(5, 0)
    post.pins = {**PINS, "judgeVersion": "5"}
    c = compare(base, post)
    verdict = decide_gate("off", c, allow_pin_mismatch=False, targeted=None)
    assert verdict.decision == "refused" and verdict.exit_code == 0
    assert "--eval-allow-pin-mismatch" in verdict.reason
    lines = report_lines(
        c, verdict, None, baseline_label="a", current_label="b", band=None, verbosity=0
    )
    text = "\n".join(lines)
    assert "gate off: REFUSED" in text and "ACCEPTED" not in text
    allowed = decide_gate("bar", c, allow_pin_mismatch=True, targeted=None)
    assert allowed.decision == "accepted"
    assert allowed.reason.startswith("pins differ (judgeVersion), allowed by")


def test_a_mismatched_baseline_prints_a_refusal_without_a_gate(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path, first_five_fail: Path
) -> None:
    _edit_pin(_copy_baseline(shop, first_five_fail), judgeVersion="0")
    fake.policy = script(shop, set()).policy()
    result = run(pytester, shop, "--baseline=base")
    out = result.stdout.str()
    assert result.ret == 0, out
    assert "WARNING: pins differ" in out and "ACCEPTED" not in out
    result.stdout.fnmatch_lines(["*gate off: REFUSED*pins differ (judgeVersion)*"])
    assert "--eval-allow-pin-mismatch" in out
    # The ini twin lets the gate decide, and the verdict says it is a rebase.
    pytester.makeini("[pytest]\neval_allow_pin_mismatch = true\n")
    allowed = run(pytester, shop, "--baseline=base", "--eval-gate=bar")
    assert allowed.ret == 0, allowed.stdout.str()
    allowed.stdout.fnmatch_lines(["*gate bar: ACCEPTED*allowed by --eval-allow-pin-mismatch*"])


def test_a_non_boolean_ini_value_is_a_usage_error(pytester: pytest.Pytester, shop: Path) -> None:
    pytester.makeini("[pytest]\neval_allow_pin_mismatch = sometimes\n")
    result = run(pytester, shop, "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*eval_allow_pin_mismatch = 'sometimes' is not a boolean*"])


# --- point 4: what was served is pinned, and the model change is named as the change ----------


def test_an_edited_model_is_named_as_the_change_under_test(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path, first_five_fail: Path
) -> None:
    _copy_baseline(shop, first_five_fail)
    model_file = shop / "model.json"
    before = hashlib.sha256(model_file.read_bytes()).hexdigest()
    base_info = ledger_reader.read_run_info(shop / "runs" / "base")
    assert base_info.model_sha == before
    assert base_info.target_profile == "embedded" and base_info.answerer == "anthropic"
    assert (base_info.answerer_version or "").startswith("anthropic ")
    assert (base_info.harness_version or "").startswith("pytest-evalloop ")
    # Edit one doc of the embedded model, then rerun against the baseline.
    model = json.loads(model_file.read_text())
    text = json.dumps(model)
    doc = next(iter(_docs(model)))
    model_file.write_text(text.replace(json.dumps(doc), json.dumps(doc + " (edited)"), 1))
    after = hashlib.sha256(model_file.read_bytes()).hexdigest()
    assert after != before
    fake.policy = script(shop, set()).policy()
    result = run(pytester, shop, "--baseline=base", "--eval-gate=bar", "--eval-label=post")
    out = result.stdout.str()
    assert result.ret == 0, out
    assert "WARNING: pins differ" not in out
    result.stdout.fnmatch_lines(
        [
            "*changed (the change under test): the served model*",
            f"*modelSha: {before[:37]}... -> {after[:37]}...*",
            "*gate bar: ACCEPTED*",
        ]
    )
    assert ledger_reader.read_run_info(shop / "runs" / "post").model_sha == after


def _docs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k in ("doc", "description") and isinstance(v, str)]
        return found + [d for v in node.values() for d in _docs(v)]
    if isinstance(node, list):
        return [d for v in node for d in _docs(v)]
    return []


def test_what_publisher_reports_serving_is_pinned(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    """Issue 24 point 8 too: the same model served on another port is the same target."""
    from pytest_evalloop.testing import ScriptSpec
    from tests.conftest import MALLOY_SET
    from tests.test_backends_e2e import _oracle_spec, _publisher

    set_dir = pytester.path / "malloy" / "ecommerce"
    shutil.copytree(MALLOY_SET, set_dir)
    urls = []
    for label in ("first", "second"):
        proc, url = _publisher(
            pytester.path,
            {"queries": {}, "default": []},
            "--served-revision",
            "rev-42",
            "--source-content-sha",
            "c" * 64,
        )
        urls.append(url)
        # Compared without a gate: a -k subset carries no decision (`comparable`), but its
        # pins are compared all the same.
        gate = ["--baseline=first"] if label == "second" else []
        try:
            fake.policy = ScriptSpec.model_validate(_oracle_spec(set_dir)).policy()
            result = pytester.runpytest_subprocess(
                str(set_dir),
                f"--eval-target={url}",
                "--eval-tool-profile=publisher",
                # The real set's goldens are all provisional: answered only when asked to.
                "--eval-answer-unscorable",
                "-k",
                "ecom_yoy or ecom_2022",
                f"--eval-label={label}",
                *gate,
            )
        finally:
            proc.kill()
            proc.wait()
        run_dir = set_dir / "runs" / label
        info = ledger_reader.read_run_info(run_dir)
        out = result.stdout.str()
        assert (info.served_revision, info.model_sha) == ("rev-42", "c" * 64), out
        # The pin names the model (scheme, path, the Publisher's package), not the socket.
        assert info.target == (
            "http:/mcp (environmentName=local, modelPath=ecommerce.malloy, packageName=ecommerce)"
        ), info.target
        assert (info.mcp_url, info.target_profile) == (url, "publisher")
        read = ledger_reader.read_run(run_dir)
        assert {a.served_revision for a in read.of_kind("attempt")} == {"rev-42"}
    assert urls[0] != urls[1]
    # Before, the port was in the target pin: every such pair was a rebase, never gated.
    assert "WARNING: pins differ" not in out and "pins differ (" not in out, out
    result.stdout.fnmatch_lines(["*recorded, not a comparison pin*mcpUrl*"])


def test_a_url_target_is_pinned_without_its_host_and_port() -> None:
    from pytest_evalloop.measure import pins
    from pytest_evalloop.targets.profiles import EMBEDDED
    from pytest_evalloop.targets.target import url_pins

    a = url_pins("http://127.0.0.1:4040/mcp", EMBEDDED)
    b = url_pins("http://localhost:51234/mcp", EMBEDDED)
    assert a["target"] == b["target"] == "http:/mcp"
    assert a["mcpUrl"] != b["mcpUrl"]
    found = pins.classify({**PINS, **a}, {**PINS, **b})
    assert found.same_configuration and [d.name for d in found.recorded] == ["mcpUrl"]
    # Another path or another command line is another target.
    assert url_pins("http://127.0.0.1:4040/other", EMBEDDED)["target"] == "http:/other"
    assert url_pins("python -m server", EMBEDDED) == {"target": "python -m server"}


def test_the_claude_code_backend_reports_its_cli_version(tmp_path: Path) -> None:
    from pytest_evalloop.answer.claude_code import ClaudeCodeAnswerer
    from pytest_evalloop.testing.fake_claude import install_fake_claude
    from pytest_evalloop.testing.fake_claude_stream import VERSION

    policy = tmp_path / "policy.json"
    policy.write_text("{}")
    shim = install_fake_claude(tmp_path / "bin", policy)
    answerer = ClaudeCodeAnswerer(model="m", executable=str(shim), max_turns=2, timeout_s=5)
    assert answerer.version == f"{VERSION} (Claude Code)"
    missing = ClaudeCodeAnswerer(
        model="m", executable=str(tmp_path / "nope"), max_turns=2, timeout_s=5
    )
    assert missing.version.startswith("unknown (")


# --- point 5: a rejudge keeps the answers' provenance -----------------------------------------


def test_rejudges_of_two_answerer_models_are_not_an_a_a_pair(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path, capsys: Any
) -> None:
    fake.policy = script(shop, set()).policy()
    for label, model in (("by-a", "claude-model-a"), ("by-b", "claude-model-b")):
        done = run(pytester, shop, f"--eval-label={label}", f"--eval-answerer-model={model}")
        assert done.ret == 0, done.stdout.str()
        again = run(pytester, shop, f"--eval-rejudge-from={label}", f"--eval-label=re-{label}")
        assert again.ret == 0, again.stdout.str()
        info = ledger_reader.read_run_info(shop / "runs" / f"re-{label}")
        assert (info.answerer_model, info.answerer, info.rejudge_of) == (model, "anthropic", label)
        source = ledger_reader.read_run_info(shop / "runs" / label)
        assert info.model_sha == source.model_sha and info.answerer_version
    runs = str(shop / "runs")
    assert flips_main(["re-by-a", "re-by-b", "--runs-dir", runs]) == 0
    out = capsys.readouterr().out
    assert "WARNING: pins differ" in out
    assert "answererModel: claude-model-a -> claude-model-b" in out
    assert flips_main(["re-by-a", "re-by-b", "--runs-dir", runs, "--calibration"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "not an A/A pair: pins differ (answererModel)" in err


# --- point 6: resume refuses another configuration; validate sees mixed judges ----------------


def _interrupted(pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path) -> Path:
    """A run stopped after two of its cases (what a kill leaves, status not complete)."""
    fake.policy = script(shop, set()).policy()
    first = run(pytester, shop, "--eval-label=part", "-k", f"{QIDS[0]} or {QIDS[1]}")
    assert first.ret == 0, first.stdout.str()
    run_dir = shop / "runs" / "part"
    # As a kill of the whole set leaves it: two cases scored, the rest not yet reached.
    selection = json.loads((run_dir / ledger.RUN_FILE).read_text())["selection"]
    _edit_pin(run_dir, status="interrupted", selection={**selection, "keyword": ""})
    return run_dir


@pytest.mark.parametrize(
    ("option", "shown"),
    [
        ("--eval-samples=2", "--eval-samples: run has 1, this session 2"),
        ("--eval-judge-samples=3", "--eval-judge-samples: run has 1, this session 3"),
        ("--eval-max-turns=4", "--eval-max-turns: run has 16, this session 4"),
        ("--eval-split=dev", "--eval-split: run has 'all', this session 'dev'"),
        ("-k=" + QIDS[0], f"-k: run has '', this session '{QIDS[0]}'"),
    ],
)
def test_resume_under_another_design_is_one_usage_error_naming_the_option(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path, option: str, shown: str
) -> None:
    # Before: another --eval-samples re-answered scored cases (samples {None, 1, 2} in one
    # ledger, selection.samples still 1); another split marked the run complete with cases
    # never attempted; max turns and judge samples were taken too.
    run_dir = _interrupted(pytester, fake, shop)
    calls = len(fake.calls())
    refused = run(pytester, shop, "--eval-resume=part", option)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR, refused.stdout.str()
    err = refused.stderr.str()
    assert f"--eval-resume=part: part was started with another design ({shown})" in err, err
    assert err.count("ERROR:") == 1 and "Traceback" not in err + refused.stdout.str()
    assert len(fake.calls()) == calls  # nothing was answered or judged
    info = ledger_reader.read_run_info(run_dir)
    assert info.status == "interrupted" and len(ledger_reader.read_run(run_dir).scores()) == 2
    # The same design resumes, and finishes the run.
    assert run(pytester, shop, "--eval-resume=part").ret == 0
    assert ledger_reader.read_run_info(run_dir).status == "complete"


def test_resume_with_other_paths_on_the_command_line_is_refused(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    # Before: the files and node ids named on the command line were no part of the recorded
    # design: a run started on one case resumed over the whole set (or the reverse) and closed
    # `complete` over cases it never meant to measure.
    one = f"{shop / 'cases.jsonl'}::{QIDS[0]}"
    fake.policy = script(shop, set()).policy()
    first = run(pytester, shop / "cases.jsonl", "--eval-label=part")
    assert first.ret == 0, first.stdout.str()
    run_dir = shop / "runs" / "part"
    assert json.loads((run_dir / ledger.RUN_FILE).read_text())["selection"]["paths"] == [
        "cases.jsonl"
    ]
    _edit_pin(run_dir, status="interrupted")
    calls = len(fake.calls())
    refused = pytester.runpytest_subprocess(one, "-p", "no:cacheprovider", "--eval-resume=part")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR, refused.stdout.str()
    err = refused.stderr.str()
    assert (
        "the paths and node ids named on the command line: run has ['cases.jsonl'], "
        f"this session ['cases.jsonl::{QIDS[0]}']" in err
    ), err
    assert len(fake.calls()) == calls
    # The same file named from another working directory is the same design.
    pytester.mkdir("elsewhere")
    monkey = pytest.MonkeyPatch()
    monkey.chdir(pytester.path / "elsewhere")
    try:
        again = pytester.runpytest_subprocess(
            str(shop / "cases.jsonl"), "-p", "no:cacheprovider", "--eval-resume=part"
        )
    finally:
        monkey.undo()
    assert again.ret == 0, again.stdout.str() + again.stderr.str()


def test_selected_paths_are_relative_to_the_set() -> None:
    from pytest_evalloop.session.selection import selected_paths

    root = Path("/x/evals/shop")
    assert selected_paths(["/x/evals"], root) == ["."]
    assert selected_paths(["/x/evals/shop", "/x/evals/shop/cases.jsonl::q1"], root) == ["."]
    assert selected_paths(["/x/evals/other", "/x/evals/shop/cases.jsonl::q2"], root) == [
        "cases.jsonl::q2"
    ]


def test_resume_under_another_judge_or_set_is_one_usage_error(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    run_dir = _interrupted(pytester, fake, shop)
    calls = len(fake.calls())
    refused = run(pytester, shop, "--eval-resume=part", "--eval-judge-model=claude-other-judge")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR, refused.stdout.str()
    err = refused.stderr.str()
    assert "judgeModel: run has claude-opus-4-6, this session claude-other-judge" in err
    assert err.count("ERROR:") == 1 and "Traceback" not in err + refused.stdout.str()
    # A changed case file moves datasetSha: both differing pins are named in one error.
    cases = shop / "cases.jsonl"
    cases.write_text(cases.read_text().replace("?", "? ", 1))
    both = run(pytester, shop, "--eval-resume=part", "--eval-judge-model=claude-other-judge")
    assert both.ret == pytest.ExitCode.USAGE_ERROR
    assert "judgeModel: run has" in both.stderr.str() and "datasetSha: run has" in both.stderr.str()
    assert len(fake.calls()) == calls  # nothing was answered or judged
    assert len(ledger_reader.read_run(run_dir).of_kind("score")) == 2


def test_validate_warns_when_scores_carry_two_judges(tmp_path: Path, capsys: Any) -> None:
    from tests.test_flips import write_run

    run_dir = write_run(tmp_path, "mixed", {"q1": "match", "q2": "match"})
    lines = (run_dir / ledger.EVENTS_FILE).read_text().splitlines()
    events = [json.loads(line) for line in lines]
    judged = [e for e in events if e["kind"] == "score"]
    judged[0].update(judge_model="judge-a", judge_version="4", rubric_sha="r1")
    judged[1].update(judge_model="judge-b", judge_version="4", rubric_sha="r2")
    (run_dir / ledger.EVENTS_FILE).write_text("\n".join(json.dumps(e) for e in events) + "\n")
    closed_as_is(run_dir)  # a run that closed with its scores so
    assert cli(["validate", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "score events carry 2 values of judgeModel: judge-a (1), judge-b (1)" in out
    assert "2 values of rubricSha" in out and "values of judgeVersion" not in out


# --- point 7: misuse is one usage error before anything is answered ---------------------------


def test_resuming_a_complete_run_is_one_usage_error(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    fake.policy = script(shop, set()).policy()
    assert run(pytester, shop, "--eval-label=done").ret == 0
    calls = len(fake.calls())
    again = run(pytester, shop, "--eval-resume=done", "-n", "2")
    assert again.ret == pytest.ExitCode.USAGE_ERROR
    again.stderr.fnmatch_lines(["ERROR: --eval-resume=done: done is complete; nothing to resume*"])
    assert "Traceback" not in again.stdout.str() + again.stderr.str()
    assert len(fake.calls()) == calls


def test_a_taken_label_is_one_usage_error(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    fake.policy = script(shop, set()).policy()
    assert run(pytester, shop, "--eval-label=taken").ret == 0
    calls = len(fake.calls())
    again = run(pytester, shop, "--eval-label=taken")
    assert again.ret == pytest.ExitCode.USAGE_ERROR
    again.stderr.fnmatch_lines(["ERROR: --eval-label=taken: * already holds a run*"])
    out = again.stdout.str()
    assert "harness error" not in out and "error" not in out.lower().replace("errors", "")
    assert len(fake.calls()) == calls


@pytest.fixture
def shop(pytester: pytest.Pytester) -> Path:
    from tests.test_run import make_set

    return make_set(pytester.path, QIDS)


CONFTEST_JUDGE = """
import pytest


class OwnJudge:
    model = "my-own-judge"
    version = "1"
    rubric_sha = "own"

    async def judge(self, materials):
        raise AssertionError("a refused resume must judge nothing")


@pytest.fixture(scope="session")
def evalloop_judge():
    return OwnJudge()
"""


def test_a_conftest_judge_that_differs_from_the_resumed_run_stops_once(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    # A conftest's judge is known only when the first item needs it: the run stops there.
    _interrupted(pytester, fake, shop)
    calls = len(fake.calls())
    pytester.makeconftest(CONFTEST_JUDGE)
    refused = run(pytester, shop, "--eval-resume=part")
    out = refused.stdout.str() + refused.stderr.str()
    assert refused.ret == pytest.ExitCode.USAGE_ERROR, out
    assert "judgeModel: run has claude-opus-4-6, this session my-own-judge" in out
    assert out.count("started under another configuration") == 1, out  # not one per item
    assert "harness error" not in out
    assert len(fake.calls()) == calls


# --- issue 24 point 8: the prompts and the harness's commit are pinned ------------------------


def test_the_prompts_and_the_harness_commit_are_pinned(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path, first_five_fail: Path
) -> None:
    import subprocess

    from pytest_evalloop.answer.answerer import (
        ANSWERER_PROMPT_SHA,
        INSTRUCTIONS_SLOT,
        system_prompt,
    )
    from pytest_evalloop.judge import judge
    from pytest_evalloop.session.runs import harness_commit

    info = ledger_reader.read_run_info(first_five_fail)
    assert info.judge_prompt_sha == judge.case_prompt_sha()
    # The anthropic answerer's prompt, with the place of the target's MCP instructions in it.
    assert info.answerer_prompt_sha == ANSWERER_PROMPT_SHA
    pinned = system_prompt(INSTRUCTIONS_SLOT)
    assert ANSWERER_PROMPT_SHA == hashlib.sha256(pinned.encode()).hexdigest()
    import pytest_evalloop

    source = Path(pytest_evalloop.__file__).parent
    done = subprocess.run(
        ["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    assert info.harness_commit == harness_commit()
    if done.returncode == 0:  # a source checkout (an installed package has no commit)
        assert (info.harness_commit or "").startswith(done.stdout.strip())
    # A baseline judged with another per-case prompt is a rebase, named as such.
    _edit_pin(_copy_baseline(shop, first_five_fail), judgePromptSha="0" * 64)
    fake.policy = script(shop, set()).policy()
    result = run(pytester, shop, "--baseline=base", "--eval-gate=bar")
    out = result.stdout.str()
    assert "WARNING: pins differ" in out and "ACCEPTED" not in out, out
    result.stdout.fnmatch_lines(["*gate bar: REFUSED*pins differ (judgePromptSha)*"])


def test_the_case_prompt_pin_moves_with_the_template_only() -> None:
    from pytest_evalloop.judge import judge

    first = judge.case_prompt_sha()
    assert len(first) == 64 and first != judge.rubric_sha()
    m = judge.JudgeMaterials(qid="q", question="a?", golden_kind="scalar", golden_value=1)
    # The fixed token is only the pin's: a judge call gets its attempt's, never the fixed one.
    assert judge.render_case_prompt(m, token="t") == judge.render_case_prompt(m, token="t")
    assert judge.render_case_prompt(m) != judge.render_case_prompt(m, token="0" * 32)
    assert judge.attempt_token(m) in judge.render_case_prompt(m)
    base = {**PINS, "judgePromptSha": first, "answererPromptSha": "a" * 64}
    from pytest_evalloop.measure import pins

    found = pins.classify(base, {**base, "answererPromptSha": "b" * 64, "harnessCommit": "x"})
    assert [d.name for d in found.breaking] == ["answererPromptSha"]
    assert [d.name for d in found.recorded] == ["harnessCommit"]


def test_the_harness_commit_is_dirty_marked(tmp_path: Path) -> None:
    import subprocess

    from pytest_evalloop.session.runs import harness_commit

    package = tmp_path / "checkout" / "pytest_evalloop"
    package.mkdir(parents=True)
    (package / "x.py").write_text("a = 1\n")

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(package.parent), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "one")
    head = git("rev-parse", "HEAD")
    commit_of = harness_commit.__wrapped__
    assert commit_of(package) == head
    (package.parent / "notes.txt").write_text("beside the package: not the harness\n")
    git("add", "notes.txt")
    assert commit_of(package) == head
    (package / "x.py").write_text("a = 2\n")
    assert commit_of(package) == f"{head}-dirty"
    # A package inside another project's tree is not that project's commit.
    nested = package / "vendored" / "pytest_evalloop"
    nested.mkdir(parents=True)
    assert commit_of(nested) is None
    assert commit_of(tmp_path / "nowhere" / "pytest_evalloop") is None


def test_run_json_pins_the_models_the_endpoint_served(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    # Issue 25 (7). Before: run.json kept the configured judgeModel/answererModel when the
    # endpoint served another, the anthropic answerer recorded the configured id, and the gate
    # compared the configured ids: a changed snapshot behind one alias was never a mismatch.
    models = ["--eval-answerer-model=ans-alias", "--eval-judge-model=judge-alias"]
    fake.served_models = {"ans-alias": "ans-2026-01", "judge-alias": "judge-2026-01"}
    fake.policy = script(shop, set()).policy()
    first = run(pytester, shop, "--eval-label=base", *models)
    assert first.ret == 0, first.stdout.str()
    info = json.loads((shop / "runs" / "base" / ledger.RUN_FILE).read_text())
    assert (info["judgeModel"], info["judgeModelConfigured"]) == ("judge-2026-01", "judge-alias")
    assert (info["answererModel"], info["answererModelConfigured"]) == ("ans-2026-01", "ans-alias")
    attempts = ledger_reader.read_run(shop / "runs" / "base").attempts().values()
    assert {a.model for a in attempts} == {"ans-2026-01"}
    # Same alias, same snapshot: the check before the run compares the configured ids, the
    # gate the served ones; both agree.
    same = run(pytester, shop, "--baseline=base", "--eval-gate=no-regressions", *models)
    assert same.ret == 0, same.stdout.str()
    assert "pins differ" not in same.stdout.str()
    # The alias now serves another judge snapshot: the gate refuses it as a rebase.
    fake.served_models["judge-alias"] = "judge-2026-02"
    moved = run(pytester, shop, "--baseline=base", "--eval-gate=no-regressions", *models)
    out = moved.stdout.str()
    assert moved.ret != 0, out
    assert "pins differ (judgeModel)" in " ".join(out.split()), out


def test_resume_under_xdist_records_and_matches_the_same_paths(
    pytester: pytest.Pytester, fake: FakeAnthropic, shop: Path
) -> None:
    # Workers open and reopen the run: the paths they record are the controller's.
    fake.policy = script(shop, set()).policy()
    first = run(pytester, shop, "--eval-label=part", "-n", "2")
    assert first.ret == 0, first.stdout.str()
    run_dir = shop / "runs" / "part"
    assert json.loads((run_dir / ledger.RUN_FILE).read_text())["selection"]["paths"] == ["."]
    _edit_pin(run_dir, status="interrupted")
    again = run(pytester, shop, "--eval-resume=part", "-n", "2")
    assert again.ret == 0, again.stdout.str() + again.stderr.str()
    assert ledger_reader.read_run_info(run_dir).status == "complete"
