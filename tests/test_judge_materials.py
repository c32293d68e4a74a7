"""What the judge is shown, through whole runs: the Publisher-shaped fake, the real SDKs.

A run against the real malloy-samples layout (the set beside the package it evaluates) and a
Publisher fake serving two models; the judge's prompts are captured where the fake Messages
API receives them. Then `--eval-check-judge` on the real set's fixtures.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic, FakeRequest, JudgeVerdict, Reply, ScriptSpec
from pytest_evalloop.testing.fake_publisher import URL_LINE_PREFIX
from pytest_evalloop.testing.policies import render_verdict
from tests.conftest import MALLOY_SET
from tests.test_judge import _fence

SAMPLES = MALLOY_SET.parent.parent
ORDERS = "run: order_items -> { aggregate: order_count }"
OTHER = "run: order_items -> { aggregate: n is count() }"
BROKEN = "run: order_items -> { group_by: nope }"
BROKEN_ERROR = "'nope' is not defined in source order_items"
SHOP2 = {"environmentName": "local", "packageName": "shop2", "modelPath": "other.malloy"}
DEFAULT = {"environmentName": "local", "packageName": "ecommerce", "modelPath": "ecommerce.malloy"}
SHOP2_MODEL = "source: order_items is duckdb.table('x.parquet') extend {\n  measure: n_marker_4f1 is count()\n}\n"


class Capture:
    """A policy that plays a script and keeps every judge prompt (the user text)."""

    def __init__(self, spec: ScriptSpec | None = None, judge: Any = None) -> None:
        self.inner = (spec or ScriptSpec()).policy()
        self.judge = judge
        self.prompts: list[str] = []

    def __call__(self, request: FakeRequest) -> Any:
        if request.role == "judge":
            self.prompts.append(request.user_text)
            if self.judge is not None:
                return self.judge(request)
        return self.inner(request)

    def prompt_for(self, question: str) -> str:
        [prompt] = [p for p in self.prompts if question in p]
        return prompt


def _samples(root: Path) -> Path:
    """A copy of the whole malloy-samples tree (set beside package), plus a second package.

    Without the truth package: these runs are answered by a fake Publisher with no tables, and
    a truth package without its tables could not verify a golden (the golden check would stop
    the run); this test is about what the judge is shown."""
    ignore = shutil.ignore_patterns("*.parquet", "runs", "ecommerce-truth")
    shutil.copytree(SAMPLES, root / "samples", ignore=ignore)
    (root / "samples" / "shop2").mkdir()
    (root / "samples" / "shop2" / "other.malloy").write_text(SHOP2_MODEL, encoding="utf-8")
    return root / "samples" / "evals" / "ecommerce"


def _verify(set_dir: Path, qids: set[str]) -> dict[str, str]:
    """Mark the goldens of `qids` verified (so they are judged); their questions by qid."""
    rows = [json.loads(line) for line in (set_dir / sets.CASES_FILE).read_text().splitlines()]
    for row in rows:
        if row["qid"] in qids:
            row["golden"]["status"] = "verified"
    (set_dir / sets.CASES_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {r["qid"]: r["question"] for r in rows if r["qid"] in qids}


def _start_publisher(tmp: Path, script: dict[str, Any]) -> tuple[subprocess.Popen[str], str]:
    script_file = tmp / "publisher-script.json"
    script_file.write_text(json.dumps(script))
    model = SAMPLES / "ecommerce" / "ecommerce.malloy"
    command = [sys.executable, "-m", "pytest_evalloop.testing.fake_publisher"]
    command += ["--model", str(model), "--script", str(script_file), "--port", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(URL_LINE_PREFIX):
            return proc, line.removeprefix(URL_LINE_PREFIX).strip()
    proc.kill()
    raise AssertionError("the fake Publisher did not start")


def _execute(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"tool": "malloy_executeQuery", "input": arguments}


def test_the_judge_sees_the_answerers_call_its_rows_and_a_failure_as_a_failure(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = _samples(pytester.path)
    questions = _verify(set_dir, {"ecom_order_count", "ecom_profit"})
    # The answerer's own model and givens answer 42; the set's default model answers 1.
    script = {
        "queries": {
            ORDERS: [{"order_count": 1}],
            OTHER: [{"n": 0}],
            BROKEN: {"error": BROKEN_ERROR},
        },
        "models": {
            "shop2/other.malloy": {
                "queries": {
                    ORDERS: {
                        "byGivens": [{"givens": {"region": "EU"}, "rows": [{"order_count": 42}]}]
                    },
                    OTHER: [{"n": 5}],
                }
            }
        },
    }
    own_model = [
        _execute({**SHOP2, "query": ORDERS, "givens": {"region": "EU"}}),
        _execute({**SHOP2, "query": OTHER}),
        # Point 2: a blank line between the label and the fence; the last successful call
        # is another query, so a missed declaration would replay the wrong one.
        {"text": "42 orders.\n\n**Final query:**\n\n```malloy\n" + ORDERS + "\n```"},
    ]
    failing = [
        _execute({**DEFAULT, "query": BROKEN}),
        {"text": "I could not run it.\n\nFinal query:\n```malloy\n" + BROKEN + "\n```"},
    ]
    spec = ScriptSpec.model_validate(
        {
            "answerer": {
                "by_question": {
                    questions["ecom_order_count"]: own_model,
                    questions["ecom_profit"]: failing,
                }
            },
            "judge": {"default": {"verdict": "match"}},
        }
    )
    capture = Capture(spec)
    fake.policy = capture
    proc, url = _start_publisher(pytester.path, script)
    try:
        result = pytester.runpytest_subprocess(
            str(set_dir),
            f"--eval-target={url}",
            "--eval-tool-profile=publisher",
            "-k",
            "ecom_order_count or ecom_profit",
            "-p",
            "no:cacheprovider",
        )
    finally:
        proc.kill()
        proc.wait()
    # The judge says match to both, but a final query that did not run cannot be a match
    # (judge doctrine 3): the failing case is the run's one no_match.
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    attempts = {qid: a for (qid, _), a in read.attempts().items()}
    verdicts = {qid: score.verdict for (qid, _), score in read.scores().items()}
    assert verdicts == {"ecom_order_count": "match", "ecom_profit": "no_match"}

    # 2. The declaration after a blank line is the final query, and the attempt says so.
    own = attempts["ecom_order_count"]
    assert own.final_query == ORDERS
    assert (own.final_query_source, own.final_query_seq) == ("declared", 1)
    # 3. Re-execution repeated that call: the answerer's package, model and givens.
    prompt = capture.prompt_for(questions["ecom_order_count"])
    rows = _fence(prompt, "PREDICTION_ROWS")[1]
    assert '{"order_count": 42}' in rows and '"order_count": 1}' not in rows
    state = _fence(prompt, "RE_EXECUTION")[1]
    assert state.startswith("ok:") and '"packageName": "shop2"' in state
    assert '"region": "EU"' in state
    prediction = json.loads((run_dir / str(own.prediction_path)).read_text())
    assert prediction["call"]["arguments"] == {**SHOP2, "query": ORDERS, "givens": {"region": "EU"}}
    # 4. The definitions are those of the model the answerer queried, read beside the set.
    assert "n_marker_4f1" in _fence(prompt, "MODEL_DEFINITIONS")[1]

    # 1. A failed re-execution: the query, and the failure with its error, each in its fence.
    failed = capture.prompt_for(questions["ecom_profit"])
    assert _fence(failed, "FINAL_QUERY")[1] == BROKEN
    state = _fence(failed, "RE_EXECUTION")[1]
    assert state.startswith("FAILED") and BROKEN_ERROR in state
    assert "no final query" not in _fence(failed, "PREDICTION_ROWS")[1]
    definitions = _fence(failed, "MODEL_DEFINITIONS")[1]
    assert BROKEN_ERROR not in definitions
    # 4. A Publisher target's judge reads the set's model source, not "(not available)".
    assert definitions.startswith("Source of the model ecommerce/ecommerce.malloy")
    assert "source: users is duckdb.table('data/users.parquet')" in definitions
    assert attempts["ecom_profit"].final_query_source == "declared"


# --- --eval-check-judge on the real set --------------------------------------------------------


def _fixtures(set_dir: Path) -> list[sets.RegressionFixture]:
    return [row for _, row in sets.load_regressions(set_dir).rows]


def _bump_revision(set_dir: Path, qid: str) -> int:
    """A golden repair of `qid`: its goldenRevision moves on, its fixtures go stale."""
    path = set_dir / sets.CASES_FILE
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    [row] = [r for r in rows if r["qid"] == qid]
    row["goldenRevision"] += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return int(row["goldenRevision"])


def _settled_judge(fixtures: list[sets.RegressionFixture], flaky: str) -> Any:
    """The human's verdict for every fixture, except `flaky`, which splits 2:1 over repeats."""
    by_head = {f.prediction["answer_text"][:80]: f for f in fixtures}
    seen: dict[str, int] = {}
    other = {"match": "no_match", "no_match": "match", "near_match": "match"}

    def judge(request: FakeRequest) -> Reply:
        text = request.user_text
        [fixture] = [f for head, f in by_head.items() if head in text]
        said = fixture.verdict
        if fixture.fixture_id == flaky:
            seen[flaky] = seen.get(flaky, 0) + 1
            said = other[said] if seen[flaky] == 3 else said
        return Reply(text=render_verdict(JudgeVerdict(verdict=said, confidence=8)))

    return judge


def test_check_judge_on_the_real_set_re_executes_skips_stale_and_reports_flaky(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir = _samples(pytester.path)
    fixtures = _fixtures(set_dir)
    stale = next(f for f in fixtures if f.golden_revision is not None)
    revision = _bump_revision(set_dir, stale.qid)
    flaky = "ecom_levis_customers.b9976c56"
    queried = {f.fixture_id: f for f in fixtures if (f.prediction.get("final_query") or "").strip()}
    rows = {f.prediction["final_query"]: [{"fixture_row": f.fixture_id}] for f in queried.values()}
    capture = Capture(judge=_settled_judge(fixtures, flaky))
    fake.policy = capture
    proc, url = _start_publisher(pytester.path, {"queries": rows})
    try:
        result = pytester.runpytest_subprocess(
            str(set_dir),
            "--eval-check-judge",
            f"--eval-target={url}",
            "--eval-tool-profile=publisher",
            "--eval-repeat=3",
            "-v",
            "-rs",
            "-p",
            "no:cacheprovider",
        )
    finally:
        proc.kill()
        proc.wait()
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert result.parseoutcomes() == {"passed": 10, "flaky": 1, "skipped": 1}, out
    # Each fixture's stored final query was re-executed: its own rows reach the judge.
    for fixture_id, fixture in queried.items():
        if fixture_id == stale.fixture_id:
            continue
        prompts = [p for p in capture.prompts if fixture.prediction["answer_text"][:80] in p]
        assert len(prompts) == 3, fixture_id
        assert f'"fixture_row": "{fixture_id}"' in _fence(prompts[0], "PREDICTION_ROWS")[1]
    # Fixtures with no final query say so; none is judged on invented rows.
    for fixture in fixtures:
        if fixture.fixture_id not in queried:
            head = fixture.prediction["answer_text"][:80]
            prompts = [p for p in capture.prompts if head in p]
            assert len(prompts) == 3, fixture.fixture_id
            assert "submitted no final query" in _fence(prompts[0], "RE_EXECUTION")[1]
    # The stale fixture is skipped, never judged, with the reason.
    assert not [p for p in capture.prompts if stale.prediction["answer_text"][:80] in p]
    result.stdout.fnmatch_lines(
        [
            f"SKIPPED [[]1[]] *judge-regressions.jsonl*: stale fixture: {stale.fixture_id} was settled against goldenRevision "
            f"{stale.golden_revision} and case {stale.qid} is at goldenRevision {revision}*"
        ]
    )
    # The split verdict is FLAKY, not agreement.
    result.stdout.fnmatch_lines([f"*{flaky} FLAKY*"])
    result.stdout.fnmatch_lines(
        ["*1 FLAKY judge fixture(s)*", f"FLAKY *{flaky}", "*judge said:*2 no_match, 1 match*"]
    )


def test_check_judge_without_a_target_tells_the_judge_rows_are_unavailable(
    pytester: pytest.Pytester, fake: FakeAnthropic, malloy_set: Path
) -> None:
    fixture = next(f for f in _fixtures(malloy_set) if f.prediction.get("final_query"))
    capture = Capture(judge=_settled_judge(_fixtures(malloy_set), flaky=""))
    fake.policy = capture
    result = pytester.runpytest_subprocess(
        str(malloy_set), "--eval-check-judge", "-k", fixture.fixture_id, "-p", "no:cacheprovider"
    )
    assert result.ret == 0, result.stdout.str()
    prompt = capture.prompt_for(fixture.prediction["answer_text"][:80])
    assert _fence(prompt, "RE_EXECUTION")[1].startswith("not attempted: no target is configured")
    assert "not re-executed" in _fence(prompt, "PREDICTION_ROWS")[1]
