"""`evalloop diagnose` end to end: a real run of a small copy of the example set, then the
diagnose agent and the clustering call scripted on the loopback fake, through the real SDK.

Covers the vocabulary check, the retry-then-undiagnosed path, a reply that skips the ladder, a
probe that errors, dev-only (a holdout question never reaches a diagnose request), no diagnosis
of contaminated, harness-error or gold_wrong attempts, --max-cases, re-runs, statuses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop import cli
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger.writer import seal_run
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from tests.reportruns import example_rows, run_pytest
from tests.test_run import ORACLE, make_set

FAILING = ["ecom_department_sales_2022", "ecom_cancellation_rate", "ecom_order_count"]
JUDGE_WRONG = "ecom_top_brands_2022"
GOLD_WRONG = "ecom_accounts_never_ordered"
HOLDOUT = "ecom_top_countries"
PASSING = "ecom_customer_accounts"
QIDS = [*FAILING, JUDGE_WRONG, GOLD_WRONG, HOLDOUT, PASSING]
WRONG_SQL = {
    # every year, not 2022: the same departments, other figures
    FAILING[0]: "SELECT products.department AS department, round(sum(order_items.sale_price), "
    "2) AS total_sales FROM order_items JOIN products ON order_items.product_id = products.id "
    "GROUP BY 1 ORDER BY 1",
    # the share of lines, not of orders: 14.83 against 14.93
    FAILING[1]: "SELECT round(100.0 * count(*) FILTER (WHERE status = 'Cancelled') / count(*), "
    "2) AS cancelled_order_pct FROM order_items",
    # lines, not orders
    FAILING[2]: "SELECT count(*) AS orders FROM order_items",
    HOLDOUT: "SELECT 1 AS x",
}
OFF_TARGET = {FAILING[2]: "customer age"}
"""What the answerer asked the context tool instead of the question: its needed measure never
came back, so that case's sufficiency is `insufficient` (the others' every entity came back)."""
CONVENTION = "the default reporting convention (which year, orders or lines)"


def wrong(qid: str) -> list[dict[str, Any]]:
    sql = WRONG_SQL[qid]
    return [
        {"tool": "get_context", "input": {"query": OFF_TARGET.get(qid, "{question}")}},
        {"tool": "execute_query", "input": {"sql": sql}},
        {"text": f"The answer follows.\n\nFinal query:\n```sql\n{sql}\n```"},
    ]


def obj(
    component: str,
    code: str,
    owner: str,
    sufficiency: str = "sufficient",
    entity: str = CONVENTION,
) -> dict[str, Any]:
    return {
        "probes": [{"why": "the figure", "query": "SELECT 1", "result": "1"}],
        "reasoning": "ruled out the dataset and the ask",
        "component": component,
        "primary_code": code,
        "contributing_codes": [],
        "owner": owner,
        "sufficiency": sufficiency,
        "severity": "high",
        "confidence": "medium",
        "diagnosis": f"{code} on {component}",
        "entity": entity,
        "sharedWith": "the reporting convention",
    }


ASSUMED = obj("agent-call", "ASSUMED", "model")
NEVER_ASKED = obj(
    "agent-call", "NEVER-ASKED", "agent-skill", "insufficient", "measure:orders:order_count"
)
CLUSTERS = {
    "clusters": [
        {
            "cluster_id": "unstated-convention",
            "qids": FAILING[:2],
            "owner": "model",
            "component": "agent-call",
            "codes": ["ASSUMED"],
            "rootCause": "No doc states the default reporting convention.",
            "evidence": "both picked a convention nothing stated",
            "confidence": "high",
        },
        {
            "cluster_id": "never-asked-orders",
            "qids": FAILING[2:],
            "owner": "agent-skill",
            "component": "agent-call",
            "codes": ["NEVER-ASKED"],
            "rootCause": "Asked for customer age, not orders.",
            "evidence": "one case",
            "confidence": "low",
        },
    ],
    "reasoning": "kept never-asked-orders apart: another owner",
}


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run: three dev failures, a judge-wrong dev case (its rows are the golden's),
    a gold_wrong, a failing holdout, a pass."""
    root = tmp_path_factory.mktemp("diagnose")
    set_dir = make_set(root, QIDS)
    rows = example_rows()
    judge: dict[str, Any] = {
        "default": {"verdict": "match", "confidence": 9},
        "by_question": {
            rows[q]["question"]: {"verdict": "no_match", "confidence": 9, "why": f"off on {q}"}
            for q in [*FAILING, JUDGE_WRONG, HOLDOUT]
        },
    }
    judge["by_question"][rows[GOLD_WRONG]["question"]] = {
        "verdict": "no_match",
        "confidence": 9,
        "why": "golden wrong",
        "gold_status": "verified_wrong",
        "gold_note": "4712 against 4711",
    }
    spec = ScriptSpec.model_validate(
        {
            "cases_file": str(set_dir / "cases.jsonl"),
            "answerer": {
                "default": ORACLE,
                "by_question": {rows[q]["question"]: wrong(q) for q in WRONG_SQL},
            },
            "judge": judge,
        }
    )
    with FakeAnthropic(spec.policy()) as fake:
        done = run_pytest(fake, set_dir, "--eval-label=r1")
    run_dir = set_dir / "runs" / "r1"
    assert (run_dir / "run.json").is_file(), done.stdout + done.stderr
    return run_dir


@pytest.fixture
def run_dir(stored_run: Path, tmp_path: Path) -> Path:
    """A private copy of the stored run's set, its run inside."""
    set_copy = tmp_path / "shop"
    shutil.copytree(stored_run.parent.parent, set_copy)
    return set_copy / "runs" / "r1"


def script(
    fake: FakeAnthropic, cases: dict[str, list[Any]], cluster: list[Any] | None = None
) -> None:
    by = {f"Case {q}.": turns for q, turns in cases.items()}
    fake.policy = ScriptSpec.model_validate(
        {"diagnoser": {"by_substring": by, "cluster": cluster or [CLUSTERS]}}
    ).policy()


def diagnose(run_dir: Path, *args: str) -> int:
    return cli.main(["diagnose", str(run_dir), "--no-probes", *args])


def valid_script() -> dict[str, list[Any]]:
    return {FAILING[0]: [ASSUMED], FAILING[1]: [ASSUMED], FAILING[2]: [NEVER_ASKED]}


JUDGE_ISSUE = "r1:judge-ecom-top-brands-2022"
MODEL_ISSUE = "r1:unstated-convention"
SKILL_ISSUE = "r1:never-asked-orders"


def test_diagnose_writes_one_issue_per_cluster_in_the_seeds_words(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    out = capsys.readouterr().out
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    issues = read.issues()
    assert list(issues) == [
        MODEL_ISSUE,
        f"r1:golden-{GOLD_WRONG}",
        JUDGE_ISSUE,
        SKILL_ISSUE,
    ]  # most cases first; model before other owners at equal size
    model = issues[MODEL_ISSUE]
    assert (model.component, model.owner, model.primary_code, model.entity) == (
        "agent-call",
        "model",
        "ASSUMED",
        CONVENTION,
    )
    assert sorted(model.qids) == sorted(FAILING[:2])
    assert (model.sufficiency, model.eligibility) == ("sufficient", "2 / 2")
    dataset = issues[f"r1:golden-{GOLD_WRONG}"]
    assert (dataset.owner, dataset.primary_code) == ("dataset", "BAD-REFERENCE")
    judge = issues[JUDGE_ISSUE]
    assert (judge.component, judge.owner, judge.primary_code) == ("judge", "judge", "JUDGE-SUSPECT")
    assert {s.status for s in read.issue_statuses().values()} == {"open"}
    # Dev only, never the gold_wrong case nor the judge's: the three dev failures, one clustering.
    requests = fake.calls("diagnoser")
    assert len(requests) == 4
    asked = " ".join((r.question or "") for r in requests)
    rows = example_rows()
    assert rows[HOLDOUT]["question"] not in asked and HOLDOUT not in asked
    assert rows[GOLD_WRONG]["question"] not in asked
    assert f"Case {JUDGE_WRONG}." not in asked
    info = json.loads((run_dir / "run.json").read_text())
    assert info["diagnoserModel"] and info["costs"]["diagnoser"]["input_tokens"] > 0
    assert "components:" in out and "agent-call               3" in out
    assert "judge                    1" in out
    assert "codes: ASSUMED; sufficiency sufficient; eligibility 2 / 2" in out
    assert "kept apart: kept never-asked-orders apart" in out
    assert "model: evalloop improve" in out and "dataset: the golden side door" in out
    assert "judge: a person's review in evalloop view" in out
    assert cli.main(["validate", str(run_dir)]) == cli.EXIT_OK


def test_an_unknown_code_is_asked_again_once(fake: FakeAnthropic, run_dir: Path) -> None:
    turns = valid_script()
    turns[FAILING[2]] = [{**NEVER_ASKED, "primary_code": "C1"}, NEVER_ASKED]
    script(fake, turns)
    assert diagnose(run_dir) == cli.EXIT_OK
    read = ledger_reader.read_run(run_dir)
    [d] = [d for d in read.of_kind("diagnosis") if d.qid == FAILING[2]]
    assert (d.status, d.primary_code, d.attempts) == ("diagnosed", "NEVER-ASKED", 2)
    assert "refused once: primary_code 'C1'" in (d.reason or "")
    seen = [r.turn for r in fake.calls("diagnoser") if f"Case {FAILING[2]}." in (r.question or "")]
    assert seen == [1, 2]  # the refusal is answered in the same fresh conversation


def test_refused_twice_is_undiagnosed_with_why(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    turns = valid_script()
    turns[FAILING[2]] = [
        obj("environment", "X", "environment"),
        obj("agent-call", "MADE-UP", "agent-skill"),
    ]
    script(fake, turns, [{**CLUSTERS, "clusters": CLUSTERS["clusters"][:1]}])
    assert diagnose(run_dir) == cli.EXIT_OK
    read = ledger_reader.read_run(run_dir)
    [d] = [d for d in read.of_kind("diagnosis") if d.qid == FAILING[2]]
    assert d.status == "undiagnosed" and "MADE-UP" in (d.reason or "")
    assert FAILING[2] not in {q for i in read.issues().values() for q in i.qids}
    assert f"undiagnosed: {FAILING[2]}" in capsys.readouterr().out
    assert read.errors == []


def test_a_reply_that_skips_the_ladder_is_refused(fake: FakeAnthropic, run_dir: Path) -> None:
    # The transcript is gone: sufficiency is unknown, so construction cannot be proven.
    for transcript in (run_dir / "artifacts").glob(f"{FAILING[0]}/transcript.json"):
        transcript.unlink()
    seal_run(run_dir)  # a run that closed without it
    construction = obj("construction", "GRAIN", "agent-skill", "sufficient")
    turns = valid_script()
    turns[FAILING[0]] = [construction, construction]
    script(fake, turns)
    assert diagnose(run_dir) == cli.EXIT_OK
    read = ledger_reader.read_run(run_dir)
    [d] = [d for d in read.of_kind("diagnosis") if d.qid == FAILING[0]]
    assert d.status == "undiagnosed"
    assert "sufficiency 'sufficient' where the evidence says 'unknown'" in (d.reason or "")
    assert d.evidence["sufficiency"] == "unknown"


def test_a_probe_that_errors_is_recorded(fake: FakeAnthropic, run_dir: Path) -> None:
    turns = valid_script()
    bad = {"probe": "execute_query", "input": {"sql": "SELECT nope FROM nowhere"}}
    turns[FAILING[0]] = [bad, ASSUMED]
    script(fake, turns)
    assert cli.main(["diagnose", str(run_dir)]) == cli.EXIT_OK
    read = ledger_reader.read_run(run_dir)
    [d] = [d for d in read.of_kind("diagnosis") if d.qid == FAILING[0]]
    assert d.status == "diagnosed"
    [probe] = [p for p in d.probes if p.get("tool") == "execute_query"]
    assert probe["input"] == bad["input"] and probe["error"]
    offered = set(fake.calls("diagnoser")[0].tools)
    assert offered == {"get_context", "execute_query"}


def test_contaminated_and_harness_error_attempts_are_never_diagnosed(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    events = run_dir / "events.jsonl"
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    for e in lines:
        if e.get("qid") == FAILING[0] and e["kind"] in ("attempt", "score"):
            e["contaminated"] = True
            if e["kind"] == "score":
                e["verdict"], e["reason"] = None, "contaminated"
    lines = [e for e in lines if not (e.get("qid") == FAILING[1] and e["kind"] == "score")]
    events.write_text("".join(json.dumps(e) + "\n" for e in lines))
    seal_run(run_dir)  # a run that closed so
    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    asked = " ".join((r.question or "") for r in fake.calls("diagnoser"))
    assert f"Case {FAILING[0]}." not in asked and f"Case {FAILING[1]}." not in asked
    out = capsys.readouterr().out
    assert "1 contaminated" in out and "1 harness error" in out


def test_max_cases_bounds_the_spend(fake: FakeAnthropic, run_dir: Path, capsys: Any) -> None:
    script(fake, valid_script())
    assert diagnose(run_dir, "--max-cases", "1") == cli.EXIT_OK
    cases = [r for r in fake.calls("diagnoser") if "Case " in (r.question or "")]
    assert len(cases) == 1
    assert "beyond --max-cases 1" in capsys.readouterr().out


def test_a_rerun_replaces_its_own_lines_and_a_persons_status_stands(
    fake: FakeAnthropic, run_dir: Path, capsys: Any
) -> None:
    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    issue_id = SKILL_ISSUE
    assert (
        cli.main(["issue", str(run_dir), issue_id, "--status", "deferred", "--note", "later"]) == 0
    )
    others = [
        x
        for x in (run_dir / "events.jsonl").read_text().splitlines()
        if json.loads(x)["kind"] in ("attempt", "tool_call", "score", "retrieval_score")
    ]
    assert diagnose(run_dir) == cli.EXIT_OK
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    assert len(read.of_kind("issue")) == 4 and len(read.of_kind("clustering")) == 1
    assert len(read.of_kind("diagnosis")) == 5
    assert read.issue_statuses()[issue_id].status == "deferred"
    after = [
        x
        for x in (run_dir / "events.jsonl").read_text().splitlines()
        if json.loads(x)["kind"] in ("attempt", "tool_call", "score", "retrieval_score")
    ]
    assert after == others
    capsys.readouterr()
    assert cli.main(["issues", str(run_dir)]) == 0
    listed = capsys.readouterr().out
    assert f"deferred  {issue_id}" in listed and f"open      {MODEL_ISSUE}" in listed
    assert cli.main(["issue", str(run_dir), "r1:nothing", "--status", "fixed"]) == 2


def test_the_doctrine_is_pinned_by_its_version() -> None:
    from importlib import resources

    from pytest_evalloop.diagnose import agent

    pins = json.loads(
        resources.files("pytest_evalloop.diagnose").joinpath("doctrine_versions.json").read_text()
    )
    # A changed doctrine without a DIAGNOSE_VERSION bump (and a new line here) fails.
    assert pins[agent.DIAGNOSE_VERSION] == agent.doctrine_sha()
    assert agent.render_doctrine().startswith(f"DIAGNOSE_VERSION: {agent.DIAGNOSE_VERSION}")


def test_the_report_shows_each_diagnosis_and_the_clusters(
    fake: FakeAnthropic, run_dir: Path
) -> None:
    from pytest_evalloop.report import html, report

    script(fake, valid_script())
    assert diagnose(run_dir) == cli.EXIT_OK
    built = report.build(run_dir)
    [case] = [c for c in built.cases if c.qid == FAILING[0]]
    assert case.diagnosis is not None
    assert (case.diagnosis["component"], case.diagnosis["primary_code"]) == (
        "agent-call",
        "ASSUMED",
    )
    assert [i["issue_id"] for i in built.issues][0] == MODEL_ISSUE
    page = html.write_report(run_dir).read_text(encoding="utf-8")
    assert 'id="clusters"' in page and MODEL_ISSUE in page
    assert "kept apart: kept never-asked-orders apart" in page
