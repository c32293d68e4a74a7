"""Issue 41's repros through whole runs on the loopback fake: no regression escapes into a
state that does not count, and no check can be walked around.

1. a final query returning about a megabyte of rows is judged on a stated sample (the judge's
   prompt stays within the model's window, which the fake enforces as the API does); a judge
   request refused as too long is the answer's fault: worse after a pass;
2. a pass the judge cannot decide now (needs_human) stops an acceptance;
3. under samples, declining passes is no significant improvement beside the bar;
4. a declared final query the answerer never ran, or one that reads no data, is named so to the
   judge, and a query of constants cannot be a match;
5. an answerer of your own cannot decline the host log (an attribute, `execute`, the session
   behind the session), and a refused read spelled in pieces is contamination, quoted;
6. the `anthropic` answerer is given the target's MCP instructions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure.gate import EXIT_GATE_REJECTED
from pytest_evalloop.options import DEFAULT_JUDGE_MODEL
from pytest_evalloop.testing import FakeAnthropic, FakeRequest, ScriptSpec
from tests.test_gate import QIDS, questions
from tests.test_run import ORACLE, make_set

ORDERS = "SELECT count(*) AS orders FROM orders"
HUGE = "SELECT repeat('x', 1990) AS pad, order_id FROM orders LIMIT 480"
"""About 960 KB of rows: every row shown, the judge's prompt would be ~240,000 tokens."""


def run(pytester: pytest.Pytester, shop: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(str(shop), "-p", "no:cacheprovider", "-rA", *args)


def script(shop: Path, answers: dict[str, Any], judge: dict[str, Any] | None = None) -> Any:
    """Every case answered by its modelQuery unless `answers` (by qid) says otherwise."""
    q = questions(shop)
    return ScriptSpec.model_validate(
        {
            "cases_file": str(shop / "cases.jsonl"),
            "answerer": {"default": ORACLE, "by_question": {q[k]: v for k, v in answers.items()}},
            "judge": judge or {"default": {"verdict": "match"}},
        }
    ).policy()


def recording(policy: Any, seen: list[FakeRequest]) -> Callable[[FakeRequest], Any]:
    def record(request: FakeRequest) -> Any:
        seen.append(request)
        return policy(request)

    return record


def attempts(run_dir: Path) -> dict[str, Any]:
    return {key[0]: a for key, a in ledger_reader.read_run(run_dir).attempts().items()}


def scores(run_dir: Path) -> dict[str, Any]:
    return {key[0]: s for key, s in ledger_reader.read_run(run_dir).scores().items()}


def _user_text(request: FakeRequest) -> str:
    content = request.messages[0]["content"]
    return "".join(b.get("text", "") for b in content) if isinstance(content, list) else content


# --- 1. a huge result -------------------------------------------------------------------------


def test_a_huge_result_is_judged_on_a_stated_sample_and_a_refused_judge_is_worse(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop = make_set(pytester.path, ["ecom_order_count", "ecom_customer_accounts"])
    fake.policy = script(shop, {})
    run(pytester, shop, "--eval-label=base")
    huge = [
        {"tool": "execute_query", "input": {"sql": HUGE}},
        {"text": f"72482 orders.\n\nFinal query:\n```sql\n{HUGE}\n```"},
    ]
    seen: list[FakeRequest] = []
    fake.policy = recording(script(shop, {"ecom_order_count": huge}), seen)
    result = run(pytester, shop, "--eval-label=post")
    [judged] = [r for r in seen if r.role == "judge" and "72482 orders" in _user_text(r)]
    prompt = _user_text(judged)
    # Judged on a stated sample: the first rows, then how many were left out and why.
    assert "more rows not shown (of 480): these are the first" in prompt, result.stdout.str()
    assert "the prompt holds at most 500 rows and 100,000 characters of them" in prompt
    assert len(prompt) < 200_000 * 4
    assert scores(shop / "runs" / "post")["ecom_order_count"].verdict == "match"

    # The same answer under a judge whose window it outgrows: the fake answers the API's 400,
    # the harness error is the answer's (`error_cause: answer`), and after a pass it is worse.
    fake.context_windows[DEFAULT_JUDGE_MODEL] = 20_000
    gated = run(pytester, shop, "--eval-label=small", "--baseline=base", "--eval-gate=bar")
    out = " ".join(gated.stdout.str().split())
    failed = attempts(shop / "runs" / "small")["ecom_order_count"]
    assert failed.error_cause == "answer" and "prompt is too long" in (failed.error or "")
    assert "tokens > 20000 maximum" in (failed.error or "")
    assert "worse (match -> answer_error): 1" in out, out
    assert gated.ret == EXIT_GATE_REJECTED


# --- 2. undecided now after a pass ---------------------------------------------------------------


def baseline(
    pytester: pytest.Pytester, fake: FakeAnthropic, failing: int, *args: str
) -> tuple[Path, list[str], dict[str, str]]:
    """A set of six cases and its baseline run `base`, the first `failing` cases failing."""
    six = QIDS[:6]
    shop = make_set(pytester.path, six)
    q = questions(shop)
    fails = {q[k]: {"verdict": "no_match", "why": f"fail {k}"} for k in six[:failing]}
    fake.policy = script(shop, {}, {"default": {"verdict": "match"}, "by_question": fails})
    run(pytester, shop, "--eval-label=base", *args)
    return shop, six, q


def test_a_pass_the_judge_cannot_decide_now_stops_the_acceptance(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop, six, q = baseline(pytester, fake, 5)
    # Five fixed; the sixth, a pass, gets a judge too unsure to decide (confidence 4).
    unsure = {q[six[5]]: {"verdict": "match", "confidence": 4}}
    fake.policy = script(shop, {}, {"default": {"verdict": "match"}, "by_question": unsure})
    result = run(pytester, shop, "--eval-label=post", "--baseline=base", "--eval-gate=bar")
    out = " ".join(result.stdout.str().split())
    assert result.ret == EXIT_GATE_REJECTED, out
    assert "undecided now after a pass (match -> needs_human): 1" in out
    assert "gate bar: UNRESOLVED -- acceptance bar: 0 worse needs >= 5 better; got 5; but 1" in out
    assert f"(match -> needs_human: {six[5]})" in out
    recorded = json.loads((shop / "runs" / "post" / "run.json").read_text())["pairedTests"]
    assert (recorded["better"], recorded["worse"], recorded["undecided"]) == (5, 0, 1)
    page = (shop / "runs" / "post" / "report.html").read_text()
    assert '<td>undecided after a pass</td><td class="num">1</td>' in page
    assert f'title="match -> needs_human">{six[5]}</code>' in page


# --- 3. the paired test beside the bar -----------------------------------------------------------


def test_declining_passes_under_samples_is_no_improvement_beside_the_bar(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop, six, _ = baseline(pytester, fake, 2, "--eval-samples=2")
    declined = [{"text": "I would rather not say."}]
    fake.policy = script(shop, dict.fromkeys(six[2:], declined))
    result = run(
        pytester,
        shop,
        "--eval-label=post",
        "--eval-samples=2",
        "--baseline=base",
        "--eval-gate=bar",
    )
    out = " ".join(result.stdout.str().split())
    assert "gate bar: REJECTED" in out and "4 worse" in out, out
    # Two fixed (+1 each), four declined passes (-1 each): the mean change is -2/6.
    assert "mean change -0.333; a current sample that is not a match is no pass" in out
    assert "mean change +" not in out


# --- 4. a final query the answerer never ran, or that reads no data -----------------------------


def test_a_declared_literal_is_named_to_the_judge_and_cannot_match(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop = make_set(pytester.path, ["ecom_order_count", "ecom_customer_accounts"])
    literal = [
        {"tool": "execute_query", "input": {"sql": ORDERS}},
        {"text": "72482 orders.\n\nFinal query:\n```sql\nSELECT 72482 AS orders\n```"},
    ]
    tidy = "SELECT count(*) AS customer_accounts FROM users WHERE true"
    unran = [
        {
            "tool": "execute_query",
            "input": {"sql": "SELECT count(*) AS customer_accounts FROM users"},
        },
        {"text": f"24000 accounts.\n\nFinal query:\n```sql\n{tidy}\n```"},
    ]
    seen: list[FakeRequest] = []
    fake.policy = recording(
        script(shop, {"ecom_order_count": literal, "ecom_customer_accounts": unran}), seen
    )
    run(pytester, shop, "--eval-label=r")
    by_answer = {
        qid: next(_user_text(r) for r in seen if r.role == "judge" and text in _user_text(r))
        for qid, text in (("ecom_order_count", "72482 orders"), ("ecom_customer_accounts", "24000"))
    }
    assert (
        "NO DATA READ: the harness re-ran the final query; its 1 row hold only values"
        in (by_answer["ecom_order_count"])
    )
    assert "the answerer never ran it either" in by_answer["ecom_order_count"]
    assert "ok: the harness re-ran" not in by_answer["ecom_order_count"]
    assert (
        "NOT RUN BY THE ANSWERER: the harness re-ran the final query; 1 row."
        in (by_answer["ecom_customer_accounts"])
    )
    run_dir = shop / "runs" / "r"
    states = {qid: a.reexecution for qid, a in attempts(run_dir).items()}
    assert states == {"ecom_order_count": "literal", "ecom_customer_accounts": "unran"}
    judged = scores(run_dir)
    # The judge said match to both; a query of constants cannot be one (held in code).
    assert judged["ecom_order_count"].verdict == "no_match"
    assert "reads no data is no evidence" in (judged["ecom_order_count"].why or "")
    assert judged["ecom_order_count"].reason == "held no_match: the final query reads no data"
    assert judged["ecom_customer_accounts"].verdict == "match"


# --- 5. the host log cannot be declined ---------------------------------------------------------

DECLINERS = """
import pytest
from pytest_evalloop.roles.contract import AnswerRecord

READ = "SELECT * FROM read_text('evals/shop/cases.jsonl')"


class ClaimsAHostLog:
    backend = "claims"
    model = "claims-1"
    host_side_tool_log = True  # a claim, which no longer counts

    async def answer(self, question, session):
        if "orders" in question:
            await session.call("execute_query", {"sql": READ})
        elif "accounts" in question:
            await session.execute(READ)
        else:
            assert not hasattr(session, "_session") and not hasattr(session, "_client")
            await session.call("execute_query", {"sql": SPELLED})
        return AnswerRecord(answer_text="42", tool_log=[], declared_final="SELECT 42 AS n")


SPELLED = "SELECT * FROM read_text('ev' || 'als/sh' || concat('op/cas', 'es.jsonl'))"


@pytest.fixture
def evalloop_answerer():
    return ClaimsAHostLog()
"""


def test_an_answerer_of_your_own_cannot_decline_the_host_log(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop = make_set(
        pytester.path, ["ecom_order_count", "ecom_customer_accounts", "ecom_sales_2022"]
    )
    fake.policy = script(shop, {})
    pytester.makeconftest(DECLINERS)
    result = run(pytester, shop, "--eval-label=r")
    found = attempts(shop / "runs" / "r")
    for qid in ("ecom_order_count", "ecom_customer_accounts", "ecom_sales_2022"):
        attempt = found[qid]
        assert attempt.contaminated is True, (
            qid,
            attempt.contamination_reasons,
            result.stdout.str(),
        )
        assert attempt.host_tool_uses == 1
    spelled = found["ecom_sales_2022"].contamination_reasons
    # The sandbox refused it; the reason quotes the path the query spelled, folded.
    assert spelled[0].startswith(
        "a sandbox-refused read of 'evals/shop/cases.jsonl' (execute_query"
    )
    assert "passed" not in result.parseoutcomes()


# --- 6. the anthropic answerer is given the target's instructions -------------------------------


def test_the_anthropic_answerer_is_given_the_targets_mcp_instructions(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    from pytest_evalloop.answer.answerer import INSTRUCTIONS_HEADING, SYSTEM_PROMPT

    shop = make_set(pytester.path, ["ecom_order_count"])
    seen: list[FakeRequest] = []
    fake.policy = recording(script(shop, {}), seen)
    run(pytester, shop, "--eval-label=r")
    [first, *_] = [r for r in seen if r.role == "answerer"]
    assert first.system.startswith(SYSTEM_PROMPT)
    said = first.system[len(SYSTEM_PROMPT) :]
    assert said.startswith(f"\n{INSTRUCTIONS_HEADING}\n\nThis server answers questions about")
    assert "Start with get_context" in said


# --- 7. the smaller items ------------------------------------------------------------------------


def test_a_label_naming_the_runs_index_is_one_usage_error(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop = make_set(pytester.path, QIDS[:2])
    fake.policy = script(shop, {})
    result = run(pytester, shop, "--eval-label=index.html")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["*--eval-label=index.html:*the runs directory keeps*"])
    assert fake.calls() == []
    assert not (shop / "runs" / "index.html").exists()


def test_the_hint_for_a_held_golden_names_what_releases_it(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    shop = make_set(pytester.path, QIDS[:2])
    cases = shop / "cases.jsonl"
    held, other = (json.loads(line) for line in cases.read_text().splitlines())
    held["golden"]["status"] = "ambiguous"  # held: promote and attest refuse it
    cases.write_text(json.dumps(held) + "\n" + json.dumps(other) + "\n")
    fake.policy = script(shop, {})
    result = run(pytester, shop, "--eval-label=r")
    out = " ".join(result.stdout.str().split())
    assert "not answered: its golden is ambiguous" in out, out
    assert "repair the golden (`evalloop golden repair`), or release its hold" in out
    assert "promote" not in out and "attest" not in out


def test_the_docs_list_only_golden_statuses_collection_accepts() -> None:
    import re
    import typing

    from pytest_evalloop.sets.cases import GoldenStatus

    accepted = set(typing.get_args(GoldenStatus))
    docs = Path(__file__).parents[1] / "docs"
    judge_md, ledger_md = (docs / "judge.md").read_text(), (docs / "ledger.md").read_text()
    table = judge_md.split("## The golden gate", 1)[1].split("\n\n")[2]
    listed = re.findall(r"`status: (\w+)`", table)
    assert listed and set(listed) <= accepted, listed
    assert "standing `status` is `verified_wrong`" not in ledger_md
    scorable = judge_md.split("Scorable: ", 1)[1].split(",")[0]
    assert scorable.strip("`") in accepted


def test_exit_seven_names_what_it_means_and_a_missing_baseline_is_a_usage_error(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    reference = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text()
    row = next(line for line in reference.splitlines() if line.startswith("| 7 |"))
    assert "baseline cannot be found" not in row and "cannot carry a decision" in row
    shop = make_set(pytester.path, QIDS[:1])
    fake.policy = script(shop, {})
    result = run(pytester, shop, "--baseline=nosuch", "--eval-gate=bar")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
