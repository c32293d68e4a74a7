"""The gate cannot be fooled (issue 24): doing less, a run paired with itself, a typo in CI.

Each test reproduces one way a gate used to accept what it should not, through the pure
measurement functions (`aggregates`, `comparison`, `gate`) the plugin and `evalloop flips` share;
the whole-run versions go through the loopback fake endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.ledger.contract import AttemptEvent, ScoreEvent
from pytest_evalloop.measure import aggregates, transitions
from pytest_evalloop.measure.comparison import CaseSide, RunView, compare
from pytest_evalloop.measure.comparison_text import report_lines
from pytest_evalloop.measure.gate import decide_gate, targeted
from pytest_evalloop.testing import FakeAnthropic
from tests.test_flips import write_run
from tests.test_gate import QIDS
from tests.test_run import make_set, spec

PINS = {
    "datasetSha": "d" * 64,
    "judgeVersion": "4",
    "rubricSha": "r" * 64,
    "answererModel": "claude-sonnet-4-5",
    "judgeModel": "claude-sonnet-4-5",
    "answerer": "anthropic",
    "target": "embedded",
}

Side = str | None
"""A case's side as a test names it: a verdict, "not_submitted", "harness_error", ... or None."""


def case(qid: str, word: Side) -> CaseSide:
    if word in ("contaminated", "gold_wrong", "harness_error"):
        return CaseSide(qid=qid, verdict=None, reason=word, excluded=word)
    if word == "not_submitted":
        return CaseSide(qid=qid, verdict=None, reason="not_submitted")
    return CaseSide(qid=qid, verdict=word, reason="judged" if word else "golden_provisional")


def view(run_id: str, sides: Mapping[str, Side]) -> RunView:
    cases = {qid: case(qid, word) for qid, word in sides.items()}
    words = [c.word for c in cases.values()]
    counted = [w for w in words if w not in aggregates.OUT_OF_EVERY_AGGREGATE]
    return RunView(
        run_id=run_id,
        label=run_id,
        pins=dict(PINS),
        cases=cases,
        submitted=sum(1 for w in counted if w != "not_submitted"),
        answerable=len(counted),
    )


def gate(gate_name: str, base: RunView, cur: RunView) -> str:
    verdict = decide_gate(
        gate_name,  # type: ignore[arg-type]
        compare(base, cur),
        allow_pin_mismatch=False,
        targeted=None,
    )
    return verdict.decision


# --- point 1: declining is not free ---------------------------------------------------------


def _attempt(qid: str, submitted: bool) -> AttemptEvent:
    return AttemptEvent(
        qid=qid,
        sample=None,
        phase="baseline",
        question_sha="0" * 16,
        submitted=submitted,
        final_query=f"SELECT '{qid}'" if submitted else None,
    )


def _score(qid: str, verdict: str | None, reason: str = "judged") -> ScoreEvent:
    return ScoreEvent(
        qid=qid,
        sample=None,
        phase="baseline",
        verdict=verdict,  # type: ignore[arg-type]
        reason=reason,
    )


def test_a_pass_that_is_not_submitted_now_is_worse() -> None:
    assert transitions.transition("match", "not_submitted") == ("worse", None)
    # Not submitted is still no wrong answer: from a fail or an unscored side it is neither.
    assert transitions.transition("no_match", "not_submitted") == ("neither", None)
    assert transitions.transition("not_submitted", "match") == ("neither", None)
    # A pass unscored now (a golden not verified, a samples split) is a lost decision.
    assert transitions.transition("match", "unscored") == ("undecided", "unscored")
    base = view("base", {"q1": "match", "q2": "match", "q3": "no_match"})
    cur = view("cur", {"q1": "not_submitted", "q2": "match", "q3": "no_match"})
    c = compare(base, cur)
    assert [f.qid for f in c.worse] == ["q1"]
    assert gate("no-regressions", base, cur) == "rejected"


def test_an_answerer_that_declines_everything_is_rejected() -> None:
    # The run: the 4 refusal cases pass, the 40 others are not submitted.
    base_sides: dict[str, Side] = {f"q{i}": "match" for i in range(44)}
    cur_sides: dict[str, Side] = {f"q{i}": "match" if i < 4 else "not_submitted" for i in range(44)}
    base, cur = view("base", base_sides), view("declines", cur_sides)
    assert gate("no-regressions", base, cur) == "rejected"
    assert gate("bar", base, cur) == "rejected"
    lines = report_lines(
        compare(base, cur),
        None,
        None,
        baseline_label="base",
        current_label="declines",
        band=None,
        verbosity=0,
    )
    # Named above the flip table, and each such case shown as what it is.
    # (after the line that says what was compared)
    assert lines[1] == "compared 44 cases"
    assert lines[2].startswith("WARNING: submitted share fell: base 44/44 (100.0%) -> declines")
    assert "4/44 (9.1%)" in " ".join(lines[2:4])
    assert "  q4: match -> not submitted" in lines


def test_fixing_six_and_dropping_eight_is_not_accepted() -> None:
    fixed = {f"f{i}": ("no_match", "match") for i in range(6)}
    dropped = {f"d{i}": ("match", "not_submitted") for i in range(8)}
    stable = {f"s{i}": ("match", "match") for i in range(30)}
    sides = {**fixed, **dropped, **stable}
    base = view("base", {q: b for q, (b, _) in sides.items()})
    cur = view("less", {q: a for q, (_, a) in sides.items()})
    assert gate("bar", base, cur) == "rejected"  # 8 worse: more than 3 rejects


def test_a_target_that_is_not_submitted_in_an_arm_broke() -> None:
    base = view("base", {"t": "match", "u": "no_match"})
    post = view("post", {"t": "not_submitted", "u": "no_match"})
    post2 = view("post2", {"t": "match", "u": "no_match"})
    report = targeted(base, post, post2, ["t"], None)
    assert report.with_outcome("broke") == ["t"]
    assert report.decision()[0] == "rejected"


def test_the_submitted_share_is_counted_beside_the_pass_rate() -> None:
    attempts = {
        ("a", None): _attempt("a", True),
        ("b", None): _attempt("b", False),
        ("c", None): _attempt("c", False),
        ("r", None): _attempt("r", False),  # a refusal case: judged without a query
    }
    scores = {
        ("a", None): _score("a", "match"),
        ("b", None): _score("b", None, "not_submitted"),
        ("c", None): _score("c", None, "not_submitted"),
        ("r", None): _score("r", "match"),
    }
    t = aggregates.tally_events(attempts, scores, {}, name="run", status="complete")
    assert t.pass_rate == 1.0
    assert (t.submitted, t.answerable) == (2, 4)
    assert t.submitted_text == "submitted: 2/4 (50.0%)"
    assert t.totals()["submitted"] == 2 and t.totals()["answerable"] == 4


# --- point 5: every flag resolved before the first request ----------------------------------

BAD_FLAGS = {
    "baseline": (["--baseline=nonexistent"], "--baseline=nonexistent: no run 'nonexistent'"),
    "baseline2": (
        ["--baseline=base", "--baseline2=nosuch", "--eval-targets=ecom_order_count"],
        "--baseline2=nosuch: no run 'nosuch'",
    ),
    "baseline2-untargeted": (
        ["--baseline=base", "--baseline2=base2"],
        "--baseline2 is a second post arm for targeted mode",
    ),
    "targets": (["--baseline=base", "--eval-targets=@missing"], "--eval-targets=@missing: "),
    "tool-profile": (["--eval-tool-profile=nosuch"], "--eval-tool-profile=nosuch: "),
    "rejudge-from": (["--eval-rejudge-from=nosuch"], "--eval-rejudge-from=nosuch: no run"),
    "gate-without-baseline": (["--eval-gate=bar"], "--eval-gate=bar needs --baseline"),
    # Issue 25 (8): found before money is spent, not after every case is answered (exit 6/7).
    "gate-without-baseline-significant": (
        ["--eval-gate=bar+significant"],
        "--eval-gate=bar+significant needs --baseline",
    ),
    "baseline-breaking-pins": (
        ["--baseline=base", "--eval-gate=bar"],
        "--baseline=base: its breaking pins differ from this session's (datasetSha",
    ),
    # point 6: one run as two arms
    "repeated-arm": (
        ["--baseline=base", "--baseline2=base", "--eval-targets=ecom_order_count"],
        "--baseline and --baseline2 both name 'base': one run cannot be two arms",
    ),
    "repeated-arm-resolved": (
        ["--baseline=base", "--baseline2=evals/shop/runs/base", "--eval-targets=ecom_order_count"],
        "--baseline and --baseline2 both resolve to",
    ),
}


@pytest.mark.parametrize("name", list(BAD_FLAGS))
def test_a_bad_flag_is_one_usage_error_before_any_request(
    pytester: pytest.Pytester, fake: FakeAnthropic, name: str
) -> None:
    args, message = BAD_FLAGS[name]
    shop = make_set(pytester.path, QIDS[:2])
    fake.policy = spec(shop).policy()
    for run in ("base", "base2"):
        write_run(shop / "runs", run, {QIDS[0]: "match"}, label=run)
    result = pytester.runpytest_subprocess(str(shop), "-p", "no:cacheprovider", *args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert message in result.stderr.str(), out
    assert "Traceback" not in out
    assert fake.calls() == []  # nothing paid for
    assert sorted(p.name for p in (shop / "runs").iterdir()) == ["base", "base2"]


# --- point 7: labels and phases are plain names ----------------------------------------------


@pytest.mark.parametrize(
    "flag", ["--eval-label=../../outside", "--eval-phase=../x", "--eval-label=a/b"]
)
def test_a_label_or_phase_that_leaves_the_runs_directory_is_refused(
    pytester: pytest.Pytester, fake: FakeAnthropic, flag: str
) -> None:
    shop = make_set(pytester.path, QIDS[:1])
    fake.policy = spec(shop).policy()
    result = pytester.runpytest_subprocess(str(shop), "-p", "no:cacheprovider", flag)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    name = flag.split("=", 1)[0]
    result.stderr.fnmatch_lines([f"*{name}=*is not a valid name*runs/*"])
    assert fake.calls() == []
    assert not (shop / "runs").exists() and not (pytester.path / "outside").exists()


def test_validate_refuses_a_run_named_outside_the_pattern(tmp_path: Path) -> None:
    from pytest_evalloop.ledger.reader import read_run
    from pytest_evalloop.ledger.writer import contained_dir

    run_dir = write_run(tmp_path / "runs", "r1", {"q": "match"}, label="../../outside")
    errors = [f.message for f in read_run(run_dir).errors]
    assert any("label='../../outside' is not a valid name" in e for e in errors), errors
    with pytest.raises(ValueError, match="cannot name a directory"):
        contained_dir(tmp_path / "runs", "../x")


# --- point 2: the seed's contamination thresholds, reasons worded by what was seen -----------


def _contaminated_tally(clean: int, dirty: int) -> aggregates.Tally:
    attempts = {(f"q{i}", None): _attempt(f"q{i}", True) for i in range(clean)}
    scores = {(f"q{i}", None): _score(f"q{i}", "match") for i in range(clean)}
    for i in range(dirty):
        key = (f"x{i}", None)
        attempts[key] = _attempt(f"x{i}", True).model_copy(
            update={
                "contaminated": True,
                "contamination_reasons": ["claimed 3 MCP calls; the host logged 2"],
            }
        )
        scores[key] = _score(f"x{i}", None, "contaminated").model_copy(
            update={"contaminated": True}
        )
    return aggregates.tally_events(attempts, scores, {}, name="run", status="complete")


def test_one_inflated_report_in_44_attempts_publishes_the_rate_with_the_count() -> None:
    from pytest_evalloop.summary import RunSummary, summary_lines

    t = _contaminated_tally(43, 1)
    assert t.withheld is None and t.harness_failure is None and t.pass_rate == 1.0
    lines = summary_lines(RunSummary(run_dir=Path("r"), label="r", status="complete", tally=t))
    assert lines[1].startswith("pass rate: 100.0% (43/43 decided;")
    assert "out of every aggregate: 1 contaminated" in lines[1]
    assert (
        "contaminated attempts: 1 (out of every aggregate): x0: claimed 3 MCP calls; the host "
        "logged 2"
    ) in lines
    assert not any("answer key" in line for line in lines)


def test_above_the_limit_is_a_harness_failure_printed_without_a_gate() -> None:
    from pytest_evalloop.summary import RunSummary, summary_lines

    for clean, dirty in ((39, 5), (8, 1)):  # 5 of 44 > 10%; any on a run under 10
        t = _contaminated_tally(clean, dirty)
        assert t.pass_rate is None and t.harness_failure is not None
        lines = summary_lines(RunSummary(run_dir=Path("r"), label="r", status="complete", tally=t))
        assert any(line.startswith("HARNESS FAILURE: run run: ") for line in lines), lines
        assert "claimed 3 MCP calls; the host logged 2" in t.harness_failure


# --- point 6: a repeated arm is refused, both arms are recorded ------------------------------


def test_flips_refuses_one_run_as_two_arms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_evalloop.measure.flips import flips_main
    from pytest_evalloop.measure.gate import EXIT_HARNESS_FAILURE

    runs = tmp_path / "runs"
    write_run(runs, "base", {"t": "no_match", "u": "match"})
    write_run(runs, "post", {"t": "match", "u": "match"})
    common = ["--runs-dir", str(runs), "--targets", "t", "--gate", "bar"]
    # The comparability rule refuses each: nothing independent was measured (exit 7).
    assert flips_main(["base", "post", "--b2", "post", *common]) == EXIT_HARNESS_FAILURE
    said = " ".join(capsys.readouterr().out.split())
    assert "the current run post and the second post arm run post are one session" in said
    assert flips_main(["base", "post", "--b2", "base", *common]) == EXIT_HARNESS_FAILURE
    said = " ".join(capsys.readouterr().out.split())
    assert "the baseline run base and the second post arm run base are one session" in said
    assert flips_main(["post", "post", "--runs-dir", str(runs), "--gate", "bar"]) == 7
    assert "are one session" in " ".join(capsys.readouterr().out.split())


def test_both_post_arms_and_the_targets_are_recorded(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    from pytest_evalloop.ledger import reader as ledger_reader

    shop = make_set(pytester.path, QIDS[:3])
    fake.policy = spec(shop).policy()

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess(str(shop), "-p", "no:cacheprovider", *args)

    for label in ("base", "post1"):
        assert run(f"--eval-label={label}").ret == 0
    target = QIDS[0]
    done = run(
        "--eval-label=post2",
        "--baseline=base",
        "--baseline2=post1",
        f"--eval-targets={target}",
        "--eval-gate=bar",
    )
    assert "targeted mode: 1 target(s), 2 post arm(s)" in done.stdout.str(), done.stdout.str()
    post2 = shop / "runs" / "post2"
    [check] = ledger_reader.read_run(post2).of_kind("acceptance_check")
    assert check.final_run_ids == ["post2", "post1"]
    gate = ledger_reader.read_run_info(post2).gate or {}
    assert gate["baseline2"] == "post1" and gate["targets"] == [target]
    assert gate["finalRunIds"] == ["post2", "post1"]


# --- point 4: a final query that does not run cannot be a match ------------------------------


def test_a_failed_re_execution_is_never_a_match() -> None:
    from pytest_evalloop.judge.judge import JudgeOutcome, rows_rule

    said = JudgeOutcome(verdict="match", reason="judged", confidence=9, why="prose is right")
    failed = ("failed", "Catalog Error: Table with name orderz does not exist!")
    held = rows_rule(said, failed, refusal_case=False)
    assert held.verdict == "no_match" and "orderz does not exist" in held.why
    assert rows_rule(said, ("ok", None), refusal_case=False).verdict == "match"
    # A refusal case is judged on its refusal (a failing probe is consistent with the gap).
    assert rows_rule(said, failed, refusal_case=True).verdict == "match"


def test_predictions_re_executed_says_what_the_run_did() -> None:
    from types import SimpleNamespace

    from pytest_evalloop.session.runs import re_executed

    def read(*states: str | None) -> Any:
        attempts = {(f"q{i}", None): SimpleNamespace(reexecution=s) for i, s in enumerate(states)}
        return SimpleNamespace(attempts=lambda: attempts)

    assert re_executed(read("ok", "failed", "no_query")) == {"predictionsReExecuted": True}
    assert re_executed(read("ok", "not_run")) == {"predictionsReExecuted": False}
    assert re_executed(read(None, None)) == {}  # older attempts: nothing claimed


def test_a_declared_query_that_errors_is_recorded_no_match(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.testing import ScriptSpec

    shop = make_set(pytester.path, QIDS[:1])
    broken = "SELECT count(*) AS n FROM orderz"
    fake.policy = ScriptSpec.model_validate(
        {
            "cases_file": str(shop / "cases.jsonl"),
            "answerer": {
                "default": [
                    {"tool": "execute_query", "input": {"sql": broken}},
                    {"text": f"There are 4712.\n\nFinal query:\n```sql\n{broken}\n```"},
                ]
            },
            "judge": {"default": {"verdict": "match", "why": "the prose states the golden"}},
        }
    ).policy()
    result = pytester.runpytest_subprocess(str(shop), "-p", "no:cacheprovider", "--eval-label=r")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    read = ledger_reader.read_run(shop / "runs" / "r")
    [score] = read.scores().values()
    [attempt] = read.attempts().values()
    assert score.verdict == "no_match" and "cannot be a match" in (score.why or "")
    assert attempt.reexecution == "failed"
    assert ledger_reader.read_run_info(shop / "runs" / "r").predictions_re_executed is True


# --- point 3: an answerer of your own is checked against the host's log ----------------------

PEEKER = """
import pytest
from pytest_evalloop.roles.contract import AnswerRecord


class Peeker:
    backend = "peeker"
    model = "peeker-1"

    async def answer(self, question, session):
        if "never placed" in question:
            # Reads the answer key through the plugin's own session, then reports nothing.
            await session.call(
                "execute_query", {"sql": "SELECT * FROM read_text('evals/shop/cases.jsonl')"}
            )
        # Either way: an empty tool log and a declared final query.
        return AnswerRecord(
            answer_text="4712", tool_log=[], declared_final="SELECT 4712 AS n"
        )


@pytest.fixture
def evalloop_answerer():
    return Peeker()
"""


def test_an_answerer_of_your_own_is_checked_against_the_host_log(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    from pytest_evalloop.ledger import reader as ledger_reader

    shop = make_set(pytester.path, QIDS[:2])  # never_ordered reads the key; the other calls nothing
    fake.policy = spec(shop).policy()
    pytester.makeconftest(PEEKER)
    result = pytester.runpytest_subprocess(str(shop), "-p", "no:cacheprovider", "--eval-label=r")
    out = result.stdout.str()
    read = ledger_reader.read_run(shop / "runs" / "r")
    attempts = {key[0]: a for key, a in read.attempts().items()}
    scores = {key[0]: s for key, s in read.scores().items()}
    peeked = attempts["ecom_accounts_never_ordered"]
    assert peeked.contaminated is True and peeked.host_tool_uses == 1, out
    assert any("execute_query" in r and "evals/shop" in r for r in peeked.contamination_reasons)
    assert scores["ecom_accounts_never_ordered"].verdict is None
    # No call through the session: no host log covers the answer, never a clean pass.
    blind = attempts[QIDS[1]]
    assert blind.contaminated == "unknown"
    assert "no call went through the plugin's target session" in blind.contamination_reasons[0]
    assert scores[QIDS[1]].verdict is None
    assert scores[QIDS[1]].reason == "contamination_unknown"
    assert "passed" not in result.parseoutcomes()
