"""A run that measured nothing is loud: the summary leads with a WARNING naming the most common
cause, the session exits `EXIT_NOTHING_MEASURED` (unless `--eval-allow-unmeasured`), and the
`-ra` line of a no_match leads with the judge's why."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalloop.measure.gate import EXIT_NOTHING_MEASURED, EXIT_RUN_UNFINISHED
from pytest_evalloop.measure.unmeasured import CAUSE_CHARS, tool_error_gist
from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import ORACLE, make_set, spec

QIDS = ["ecom_order_count", "ecom_sales_2022", "ecom_average_order_value"]
# docs/testing.md's first example as it once was: `query` where execute_query takes `sql`.
WRONG_ARGUMENT = [
    {"tool": "execute_query", "input": {"query": "{modelQuery}"}},
    {"text": "Total sales in 2022 were 4,744,743.45."},
]
VALIDATION = (
    "Error executing tool execute_query: 1 validation error for execute_queryArguments\nsql\n"
    "  Field required [type=missing, input_value={'query': 'SELECT 1'}, input_type=dict]\n"
    "    For further information visit https://errors.pydantic.dev/2.14/v/missing"
)


def test_a_validation_error_is_named_by_its_field() -> None:
    assert tool_error_gist("execute_query", VALIDATION) == "execute_query: Field required 'sql'"
    assert tool_error_gist("q", "Error executing tool q: Binder Error: no column x\nmore") == (
        "q: Binder Error: no column x"
    )


@given(st.text(min_size=1, max_size=400))
def test_a_gist_is_one_line_and_never_cuts_a_word(error: str) -> None:
    gist = tool_error_gist("t", error)
    assert "\n" not in gist
    body = gist.removeprefix("t: ")
    assert len(body) <= CAUSE_CHARS + 2
    if body.endswith(" …"):
        kept = body.removesuffix(" …")
        words = " ".join(error.split()).split(" ")
        assert kept.split(" ") == words[: len(kept.split(" "))]


def _run(pytester: pytest.Pytester, set_dir: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(str(set_dir), "-p", "no:cacheprovider", "-q", *args)


def test_a_run_of_wrong_tool_arguments_warns_and_exits_non_zero(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = make_set(pytester.path, QIDS)
    fake.policy = spec(set_dir, answerer={"default": WRONG_ARGUMENT}).policy()
    result = _run(pytester, set_dir)
    assert result.ret == EXIT_NOTHING_MEASURED, result.stdout.str()
    out = result.stdout.lines
    head = out.index(next(line for line in out if "evalloop: ecommerce-baseline-01" in line))
    assert out[head + 1] == (
        "WARNING: this run measured nothing: 3 of 3 attempts were not submitted (no final "
        "query); 0 decided"
    )
    assert out[head + 2] == "  most common cause: execute_query: Field required 'sql' × 3"
    assert f"the session exits {EXIT_NOTHING_MEASURED}" in out[head + 3]
    # The deliberate case: the same run exits by its items (all unscored: 0).
    allowed = _run(pytester, set_dir, "--eval-allow-unmeasured", "--eval-label=again")
    assert allowed.ret == 0, allowed.stdout.str()
    assert "WARNING: this run measured nothing" in allowed.stdout.str()
    # Stopped by -x as well (the last case answered and failed): the unfinished run's 8 wins,
    # and the WARNING claims no 15.
    aov = "What is our average order value?"
    fake.policy = spec(
        set_dir,
        answerer={"default": WRONG_ARGUMENT, "by_question": {aov: ORACLE}},
        judge={
            "default": {"verdict": "match", "confidence": 9},
            "by_question": {aov: {"verdict": "no_match", "confidence": 9}},
        },
    ).policy()
    stopped = _run(pytester, set_dir, "-x", "--eval-concurrency=1", "--eval-label=stopped")
    assert stopped.ret == EXIT_RUN_UNFINISHED, stopped.stdout.str()
    text = stopped.stdout.str()
    assert "WARNING: this run measured nothing" in text
    assert f"exits {EXIT_NOTHING_MEASURED}" not in text
    assert f"so the session exits {EXIT_RUN_UNFINISHED}" in text


def test_a_run_with_nothing_decided_warns_with_the_judges_reason(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = make_set(pytester.path, QIDS[:2])
    judge = {"default": {"verdict": "near_match", "why": "rounded"}}
    fake.policy = spec(set_dir, judge).policy()
    result = _run(pytester, set_dir, "-n", "2")
    assert result.ret == EXIT_NOTHING_MEASURED, result.stdout.str()
    said = result.stdout.str()
    assert "WARNING: this run measured nothing: none of its 2 attempts was decided" in said
    assert "most common cause: near_match: " in said


def test_a_run_that_measured_something_is_not_warned(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = make_set(pytester.path, QIDS)
    qa = "What is our average order value?"
    judge = {
        "default": {"verdict": "match"},
        "by_question": {qa: {"verdict": "no_match", "why": "divided by lines, not orders"}},
    }
    fake.policy = spec(set_dir, judge, answerer={"default": ORACLE}).policy()
    result = _run(pytester, set_dir, "-ra")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    said = result.stdout.str()
    assert "measured nothing" not in said
    # -ra: the no_match's line leads with the judge's why, not only the item id.
    result.stdout.fnmatch_lines(["NO_MATCH */cases.jsonl::ecom_average_order_value - divided by*"])


def test_a_gate_never_makes_a_run_that_measured_nothing_green(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # A baseline that measured nothing anchors no decision: refused before anything is paid
    # (the `measured` rule), so no change is blamed or passed against it.
    set_dir = make_set(pytester.path, QIDS)
    fake.policy = spec(set_dir, answerer={"default": WRONG_ARGUMENT}).policy()
    first = _run(pytester, set_dir, "--eval-label=base")
    assert first.ret == EXIT_NOTHING_MEASURED, first.stdout.str()
    fake.policy = spec(set_dir).policy()  # a change that answers every case right
    calls = len(fake.calls("answerer"))
    gated = _run(pytester, set_dir, "--baseline=base", "--eval-gate=bar")
    said = gated.stdout.str() + gated.stderr.str()
    assert gated.ret == pytest.ExitCode.USAGE_ERROR, said
    assert "the baseline run base measured nothing" in said and "[measured: " in said
    assert len(fake.calls("answerer")) == calls  # nothing paid
    # A current run that measured nothing is still gated (doing less never passes), and the
    # session exits EXIT_NOTHING_MEASURED whatever its gate said.
    fake.policy = spec(set_dir).policy()
    good = _run(pytester, set_dir, "--eval-label=good")
    assert good.ret == 0, good.stdout.str()
    fake.policy = spec(set_dir, answerer={"default": WRONG_ARGUMENT}).policy()
    worse = _run(pytester, set_dir, "--baseline=good", "--eval-gate=no-regressions")
    said = worse.stdout.str()
    assert "gate no-regressions: ACCEPTED" not in said, said
    assert worse.ret == EXIT_NOTHING_MEASURED, said
    assert "WARNING: this run measured nothing" in said
