"""`evalloop improve`, `accept`, `restore` and `loop` end to end on the embedded target.

A temporary git repository holds a small copy of the example set whose `orders.status` doc was
deliberately weakened. The fake's answerer answers the status questions right only when the
context it was served carries the doc's rule (and the account count only when its doc says
accounts that never ordered count), so whether an edit helps is decided by what the blind arms
were served, not by a script that knows the edit. The improver and the diagnoser are scripted
through the fake endpoint; the arms are real `pytest` runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalloop import cli
from pytest_evalloop.improve import acceptance, expert
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure.comparison import CaseSide, RunView
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from pytest_evalloop.testing.policies import FakeRequest
from tests.reportruns import run_pytest
from tests.sealing import closed_as_is
from tests.test_run import ORACLE, make_set

TARGET = "ecom_cancellation_rate"
PASSING = "ecom_customer_accounts"
HOLDOUT_STATUS = "ecom_returned_orders"
HOLDOUT_OTHER = "ecom_new_accounts_2022"
QIDS = [TARGET, PASSING, HOLDOUT_STATUS, HOLDOUT_OTHER]
RULE = "Rates by outcome (cancelled, returned) are counts per status over all orders."
STATUS_DOC = (
    "Order lifecycle status: Complete, Returned, Shipped, Processing or Cancelled. Every line of "
    "an order carries the same status. Open (unfulfilled) orders are Processing or Shipped; "
    f"Complete, Returned and Cancelled orders are closed. {RULE}"
)
WEAK = '"doc": "Order lifecycle status."'
ACCOUNTS = "including accounts that never ordered"
WRONG = [
    {"tool": "get_context", "input": {"query": "{question}"}},
    {"tool": "execute_query", "input": {"sql": "SELECT 0 AS x"}},
    {"text": "Answered via the wrong route.\n\nFinal query:\n```sql\nSELECT 0 AS x\n```"},
]
PROBE = "SELECT status, count(*) AS n FROM orders GROUP BY 1 ORDER BY 2 DESC"
ISSUE = "base:guidance-not-retrieved-ecom-cancellation-rate"
DIAGNOSIS = {
    "probes": [{"why": "statuses", "query": PROBE, "result": "5 statuses"}],
    "reasoning": "orders.status came back; its doc says nothing of rates",
    "component": "get_context/model",
    "primary_code": "GUIDANCE-NOT-RETRIEVED",
    "contributing_codes": [],
    "owner": "model",
    # Every needed entity came back and the transcript kept them: the evidence says sufficient.
    "sufficiency": "sufficient",
    "severity": "high",
    "confidence": "medium",
    "diagnosis": "The status doc does not say how a rate by outcome is counted.",
    "entity": "dimension:orders:status",
    "sharedWith": "",
}


def restoring_edit() -> dict[str, Any]:
    return {"file": "model.json", "old": WEAK, "new": json.dumps({"doc": STATUS_DOC})[1:-1]}


def reply(probes: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "files": ["model.json"],
        "probes": [
            {"why": "the statuses exist", "query": q, "result": "5 rows"}
            for q in (probes if probes is not None else [PROBE])
        ],
        "edit": "say how a rate by outcome is counted on orders.status",
        "editTier": 1,
        "disagreement": "NONE",
        "meaningChanged": [],
        "goldenSuspect": [],
        **extra,
    }


def improver(*turns: Any) -> list[Any]:
    return [{"probe": "execute_query", "input": {"sql": PROBE}}, *turns]


class Shop:
    """The fake's policy: the answerer depends on what it was served; the rest is scripted."""

    def __init__(self, set_dir: Path, improver_turns: list[Any] | None = None) -> None:
        rows = {
            json.loads(x)["qid"]: json.loads(x)
            for x in (set_dir / "cases.jsonl").read_text().splitlines()
        }
        self.needs = {
            rows[TARGET]["question"]: RULE,
            rows[HOLDOUT_STATUS]["question"]: RULE,
            rows[PASSING]["question"]: ACCOUNTS,
        }
        base: dict[str, Any] = {
            "cases_file": str(set_dir / "cases.jsonl"),
            "judge": {
                "default": {"verdict": "match", "confidence": 9, "why": "the figure matches"},
                "by_substring": {
                    "via the wrong route": {
                        "verdict": "no_match",
                        "confidence": 9,
                        "why": "wrong figure",
                    }
                },
            },
            "diagnoser": {"by_substring": {f"Case {TARGET}.": [DIAGNOSIS]}},
            "improver": {"default": improver_turns or []},
        }
        self.right = ScriptSpec.model_validate({**base, "answerer": {"default": ORACLE}}).policy()
        self.wrong = ScriptSpec.model_validate({**base, "answerer": {"default": WRONG}}).policy()
        self.answerer_bodies: list[str] = []

    def __call__(self, request: FakeRequest) -> Any:
        if request.role == "answerer":
            self.answerer_bodies.append(json.dumps(request.body))
            need = self.needs.get(request.question)
            seen = " ".join(x.result or "" for x in request.exchanges)
            if need and request.exchanges and need not in seen:
                return self.wrong(request)
        return self.right(request)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture(scope="module")
def stored_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git repository holding the weakened set and one baseline run of it (`base`)."""
    root = tmp_path_factory.mktemp("improve")
    set_dir = make_set(root, QIDS)
    model = set_dir / "model.json"
    text = model.read_text()
    assert text.count(json.dumps(STATUS_DOC)) == 1
    model.write_text(text.replace(json.dumps({"doc": STATUS_DOC})[1:-1], WEAK))
    git(root, "init", "-q")
    git(root, "add", "evals")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the weakened model")
    with FakeAnthropic() as fake:
        fake.policy = Shop(set_dir)
        done = run_pytest(fake, set_dir, "--eval-label=base")
    run_dir = set_dir / "runs" / "base"
    assert (run_dir / "run.json").is_file(), done.stdout + done.stderr
    return root


@pytest.fixture
def repo(stored_repo: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(stored_repo, copy, symlinks=True)
    return copy


def shop(repo: Path) -> Path:
    return repo / "evals" / "shop"


def verdicts(run_dir: Path) -> dict[str, str | None]:
    return {k[0]: s.verdict for k, s in ledger_reader.read_run(run_dir).scores().items()}


def diagnosed(fake: FakeAnthropic, repo: Path, turns: list[Any]) -> Path:
    fake.policy = Shop(shop(repo), turns)
    run_dir = shop(repo) / "runs" / "base"
    assert cli.main(["diagnose", str(run_dir), "--no-probes"]) == 0
    return run_dir


def test_the_baseline_fails_the_weakened_cases(stored_repo: Path) -> None:
    run_dir = shop(stored_repo) / "runs" / "base"
    got = verdicts(run_dir)
    assert got == {
        TARGET: "no_match",
        PASSING: "match",
        HOLDOUT_STATUS: "no_match",
        HOLDOUT_OTHER: "match",
    }
    info = json.loads((run_dir / "run.json").read_text())
    assert info["mode"] == "measure"
    assert info["modelGitSha"] == git(stored_repo, "rev-parse", "HEAD").strip()


def test_loop_diagnoses_improves_accepts_and_checkpoints(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    policy = Shop(shop(repo), improver({"edit": restoring_edit()}, reply()))
    fake.policy = policy
    code = cli.main(["loop", str(shop(repo))])
    out = capsys.readouterr().out
    assert code == 0, out
    for step in (
        "1. target: embedded",
        "2. baseline: reusing base",
        "3. diagnose",
        "4. improve",
        "5. acceptance check",
        "6. checkpoint: ecommerce-checkpoint-02",
    ):
        assert step in out, out
    assert "checkpoint ecommerce-checkpoint-01: pins the model before improve" in out
    assert "cost per role:" in out and "improver" in out and "diagnoser" in out
    run_dir = shop(repo) / "runs" / "base"
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    [candidate] = read.of_kind("candidate")
    assert candidate.status == "proposed" and candidate.files == ["model.json"]
    assert candidate.meaning_changed == [] and candidate.golden_suspect == []
    assert any(p.get("query") == PROBE for p in candidate.probes)
    [check] = read.of_kind("acceptance_check")
    assert check.decision == "accepted" and check.class_ == "docs"
    assert len(check.final_run_ids) == 2 and check.regressions == []
    assert check.holdout_delta == 1  # the status holdout case was fixed too, never seen by improve
    assert {r["qid"]: r["status"] for r in check.replay} == {PASSING: "same", HOLDOUT_OTHER: "same"}
    assert read.issue_statuses()[ISSUE].status == "fixed"
    created = [c for c in read.of_kind("checkpoint") if c.action == "created"]
    assert [c.label for c in created] == ["ecommerce-checkpoint-01", "ecommerce-checkpoint-02"]
    head = git(repo, "rev-parse", "HEAD").strip()
    assert created[1].model_git_sha == head and created[1].issue_ids == [ISSUE]
    assert "ecommerce-checkpoint-02" in git(repo, "log", "-1", "--format=%B") and ISSUE in git(
        repo, "log", "-1", "--format=%B"
    )
    assert RULE in (shop(repo) / "model.json").read_text()
    assert git(repo, "status", "--porcelain", "--", "evals/shop/model.json") == ""
    for arm in check.final_run_ids:
        arm_dir = shop(repo) / "runs" / arm
        assert verdicts(arm_dir)[TARGET] == "match"
        info = json.loads((arm_dir / "run.json").read_text())
        assert info["phase"] == "blind_gate" and info["mode"] == "improve"
        assert cli.main(["validate", str(arm_dir)]) == 0
    # The blind arms stayed blind: no issue, candidate, diagnosis, rubric or truth query
    # reached an answerer (the figure itself comes back from the data, which is the point).
    rubric = json.loads(
        next(x for x in (shop(repo) / "cases.jsonl").read_text().splitlines() if TARGET in x)
    )["golden"]["rubric"]
    assert policy.answerer_bodies
    for body in policy.answerer_bodies:
        for leak in (ISSUE, "cand-01", DIAGNOSIS["diagnosis"], rubric[-40:], "PREFERRED (match)"):
            assert leak not in body
    # Restore returns the model to the first checkpoint: the weakened doc.
    assert cli.main(["restore", "ecommerce-checkpoint-01", "--set", str(shop(repo))]) == 0
    restored = (shop(repo) / "model.json").read_text()
    assert WEAK in restored and RULE not in restored
    last = ledger_reader.read_run(run_dir).of_kind("checkpoint")[-1]
    assert (last.action, last.label, last.model_git_sha) == (
        "restored",
        "ecommerce-checkpoint-01",
        created[0].model_git_sha,
    )
    assert cli.main(["validate", str(run_dir)]) == 0


def test_a_harmful_edit_is_rejected_and_reverted(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    harmful = {"file": "model.json", "old": f", {ACCOUNTS}.", "new": "."}
    run_dir = diagnosed(
        fake, repo, improver({"edit": restoring_edit()}, {"edit": harmful}, reply())
    )
    before = (shop(repo) / "model.json").read_text()
    assert cli.main(["improve", str(run_dir), "--issue", ISSUE]) == 0
    assert ACCOUNTS not in (shop(repo) / "model.json").read_text()
    code = cli.main(["accept", str(run_dir), "--candidate", "base:cand-01"])
    out = capsys.readouterr().out
    assert code == 6, out
    read = ledger_reader.read_run(run_dir)
    [check] = read.of_kind("acceptance_check")
    assert check.decision == "rejected" and PASSING in check.regressions
    assert "working copy restored" in out
    assert (shop(repo) / "model.json").read_text() == before
    assert read.issue_statuses()[ISSUE].status == "rejected"
    assert not [c for c in read.of_kind("checkpoint")]


def test_a_golden_suspect_halts_the_acceptance_check(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    meaning = {"file": "model.json", "old": WEAK, "new": WEAK + ', "expr": "lower(status)"'}
    run_dir = diagnosed(
        fake, repo, improver({"edit": meaning}, reply(meaningChanged=["dimension:orders:status"]))
    )
    assert cli.main(["improve", str(run_dir), "--issue", ISSUE]) == 0
    [candidate] = ledger_reader.read_run(run_dir).of_kind("candidate")
    assert candidate.meaning_changed == ["dimension:orders:status"]
    suspects = {s["qid"] for s in candidate.golden_suspect}
    assert {TARGET, HOLDOUT_STATUS} <= suspects  # re-derived on the edit: the figures moved
    assert candidate.golden_audit["ran"] and candidate.golden_audit["clean"] is False
    runs_before = sorted(p.name for p in (shop(repo) / "runs").iterdir())
    code = cli.main(["accept", str(run_dir), "--candidate", "base:cand-01"])
    out = capsys.readouterr().out
    assert code == 6 and "halted before any run" in out
    assert sorted(p.name for p in (shop(repo) / "runs").iterdir()) == runs_before  # no arm ran
    [check] = ledger_reader.read_run(run_dir).of_kind("acceptance_check")
    assert check.decision == "unresolved" and check.final_run_ids == []
    assert "lower(status)" in (shop(repo) / "model.json").read_text()  # waits for the side door


def test_a_qid_in_a_doc_is_refused(fake: FakeAnthropic, repo: Path, capsys: Any) -> None:
    leak = {
        "file": "model.json",
        "old": WEAK,
        "new": f'"doc": "Order lifecycle status ({TARGET})."',
    }
    run_dir = diagnosed(fake, repo, improver({"edit": leak}, reply()))
    before = (shop(repo) / "model.json").read_text()
    assert cli.main(["improve", str(run_dir), "--issue", ISSUE]) == 6
    [candidate] = ledger_reader.read_run(run_dir).of_kind("candidate")
    assert candidate.status == "refused"
    assert any(f"case id {TARGET!r}" in r for r in candidate.refusals), candidate.refusals
    assert (shop(repo) / "model.json").read_text() == before
    assert cli.main(["accept", str(run_dir), "--candidate", "base:cand-01"]) == 2


def test_an_edit_without_probe_receipts_is_refused(fake: FakeAnthropic, repo: Path) -> None:
    run_dir = diagnosed(fake, repo, [{"edit": restoring_edit()}, reply(probes=[])])
    assert cli.main(["improve", str(run_dir), "--issue", ISSUE]) == 6
    [candidate] = ledger_reader.read_run(run_dir).of_kind("candidate")
    assert candidate.status == "refused" and any(
        "no probe receipts" in r for r in candidate.refusals
    )
    unseen = improver({"edit": restoring_edit()}, reply(probes=["SELECT 42"]))
    run_dir = diagnosed(fake, repo, unseen)
    assert cli.main(["improve", str(run_dir), "--issue", ISSUE]) == 6
    last = ledger_reader.read_run(run_dir).of_kind("candidate")[-1]
    assert any("probe never run" in r for r in last.refusals)


def test_improve_refuses_other_owners_a_dirty_tree_and_a_remote_target(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    run_dir = diagnosed(fake, repo, [])
    model = shop(repo) / "model.json"
    model.write_text(model.read_text() + "\n")
    assert cli.main(["improve", str(run_dir), "--issue", ISSUE]) == 2
    assert "a dirty tree pins nothing" in capsys.readouterr().err
    git(repo, "checkout", "--", "evals/shop/model.json")
    events = run_dir / "events.jsonl"
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    for line in lines:
        if line["kind"] == "issue":
            line["owner"], line["component"], line["primary_code"] = (
                "agent-skill",
                "agent-call",
                "ASSUMED",
            )
    events.write_text("".join(json.dumps(x) + "\n" for x in lines))
    closed_as_is(run_dir)  # a ledger that closed so (a hand edit is refused as unsealed)
    assert cli.main(["improve", str(run_dir), "--issue", ISSUE]) == 2
    assert "answerer's skill or prompt owners" in capsys.readouterr().err
    info = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(
        json.dumps({**info, "target": "https://publisher.example/mcp"})
    )
    for line in lines:
        if line["kind"] == "issue":
            line["owner"], line["component"], line["primary_code"] = (
                "model",
                "get_context/model",
                "COVERAGE",
            )
    events.write_text("".join(json.dumps(x) + "\n" for x in lines))
    closed_as_is(run_dir)
    assert cli.main(["improve", str(run_dir), "--issue", ISSUE]) == 2
    assert "improve edits only a local target" in capsys.readouterr().err
    assert fake.calls("improver") == []  # every refusal came before anything was paid


# --- the pure rules ----------------------------------------------------------------------


def test_the_expert_test_refuses_qids_questions_and_figures_but_not_old_figures() -> None:
    question = "What were our total sales in the calendar year 2022 across every store?"
    cases = [
        expert.Case("q_sales_2022", question, "dev", {"total": 1234567.89}),
        expert.Case("q_count", "How many?", "dev", {"n": 42}),
    ]

    def problems(added: str, before: str = "") -> list[str]:
        return [p.text for p in expert.expert_problems(before, before + "\n" + added, cases)]

    assert problems("see q_sales_2022")
    assert problems("total sales in the calendar year 2022 across")
    assert problems("about 1,234,568 in sales")
    assert problems("exactly 1234567.89")
    assert problems("2022 is a partial year", "2022") == []
    assert problems("top 42 stores") == []  # a small integer is no figure


def _view(passed: dict[str, bool | None]) -> RunView:
    word = {True: "match", False: "no_match", None: "needs_human"}
    return RunView(
        run_id="r", cases={q: CaseSide(qid=q, verdict=word[p]) for q, p in passed.items()}
    )


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.sampled_from([True, False, None]), min_size=1),
    st.lists(
        st.dictionaries(st.sampled_from("abcdef"), st.sampled_from([True, False, None])),
        min_size=1,
        max_size=3,
    ),
)
def test_the_holdout_delta_counts_confident_verdicts_and_takes_the_worst_arm(
    base: dict[str, bool | None], arms: list[dict[str, bool | None]]
) -> None:
    holdout = set(base)
    delta = acceptance.holdout_delta(_view(base), [_view(a) for a in arms], holdout)
    per_arm = []
    for arm in arms:
        both = [q for q in holdout if q in arm and base[q] is not None and arm[q] is not None]
        if both:
            per_arm.append(sum(bool(arm[q]) for q in both) - sum(bool(base[q]) for q in both))
    assert delta == (min(per_arm) if per_arm else None)
    if delta is not None:
        assert -len(holdout) <= delta <= len(holdout)


def test_the_improve_doctrine_is_pinned_per_version() -> None:
    from importlib import resources

    from pytest_evalloop.improve import agent

    pins = json.loads(
        resources.files("pytest_evalloop.improve").joinpath("doctrine_versions.json").read_text()
    )
    assert pins[agent.IMPROVE_VERSION] == agent.doctrine_sha(), (
        "improve/doctrine.md changed without a bump of IMPROVE_VERSION: bump it and pin the sha"
    )
    assert f"IMPROVE_VERSION: {agent.IMPROVE_VERSION}" in agent.render_doctrine()


# --- the gaps: side door, triage mode, harness errors, replay tolerance, stdio errlog ----


def test_accept_proceeds_once_the_golden_side_door_settled_the_suspect(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    # The restoring doc plus a meaning change: both status goldens are suspects.
    both = {**restoring_edit(), "new": restoring_edit()["new"] + ', "expr": "lower(status)"'}
    run_dir = diagnosed(
        fake, repo, improver({"edit": both}, reply(meaningChanged=["dimension:orders:status"]))
    )
    assert cli.main(["improve", str(run_dir), "--issue", ISSUE]) == 0
    [candidate] = ledger_reader.read_run(run_dir).of_kind("candidate")
    assert {s["qid"] for s in candidate.golden_suspect} == {TARGET, HOLDOUT_STATUS}
    # The holdout suspect goes through the side door (held: the dataset moves), the target's
    # is dismissed by a person; the check then runs both arms on the moved dataset.
    assert cli.main(["golden", "hold", str(shop(repo)), HOLDOUT_STATUS, "--reason", "moved"]) == 0
    git(
        repo,
        "add",
        "evals/shop/cases.jsonl",
        "evals/shop/set.json",
        "evals/shop/golden-changes.jsonl",
    )
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "hold")
    capsys.readouterr()
    argv = ["accept", str(run_dir), "--candidate", "base:cand-01"]
    code = cli.main([*argv, "--dismiss-suspect", TARGET, "the rate is re-derived by a person"])
    out = capsys.readouterr().out
    assert code == 0, out
    [check] = ledger_reader.read_run(run_dir).of_kind("acceptance_check")
    assert check.decision == "accepted" and len(check.final_run_ids) == 2, check.reason
    assert f"{HOLDOUT_STATUS} hold" in (check.reason or "")
    assert f"left out of the comparison: {HOLDOUT_STATUS}" in (check.reason or "")
    base_sha = json.loads((run_dir / "run.json").read_text())["datasetSha"]
    for arm in check.final_run_ids:
        assert json.loads((shop(repo) / "runs" / arm / "run.json").read_text())["datasetSha"] != (
            base_sha
        )


def test_side_door_rebase_follows_the_recorded_changes_only() -> None:
    from pytest_evalloop.improve import sidedoor

    changes = [
        {"qid": "a", "action": "attest", "oldDatasetSha": "s0", "newDatasetSha": "s1"},
        {"qid": "b", "action": "repair", "oldDatasetSha": "s1", "newDatasetSha": "s2"},
        {"qid": "t", "action": "repair", "oldDatasetSha": "s2", "newDatasetSha": "s3"},
    ]
    got = sidedoor.side_door_rebase("s0", "s3", changes, targets=["t"])
    assert got.reached and got.dropped == ["b"]  # attest comparable, the target kept
    assert got.actions == {"a": ["attest"], "b": ["repair"], "t": ["repair"]}
    assert sidedoor.side_door_rebase("s0", "s0", changes, []).reached
    assert not sidedoor.side_door_rebase("s0", "hand-edited", changes, []).reached
    assert not sidedoor.side_door_rebase("sX", "s3", changes, []).reached
    assert not sidedoor.side_door_rebase(None, "s3", changes, []).reached


def test_diagnose_marks_the_run_triage_and_never_lowers_improve(
    fake: FakeAnthropic, repo: Path
) -> None:
    run_dir = diagnosed(fake, repo, improver({"edit": restoring_edit()}, reply()))
    assert json.loads((run_dir / "run.json").read_text())["mode"] == "triage"
    [clustering] = ledger_reader.read_run(run_dir).of_kind("clustering")
    assert clustering.mode == "triage"
    assert cli.main(["improve", str(run_dir), "--issue", ISSUE]) == 0
    assert json.loads((run_dir / "run.json").read_text())["mode"] == "improve"
    assert cli.main(["diagnose", str(run_dir), "--no-probes"]) == 0
    assert json.loads((run_dir / "run.json").read_text())["mode"] == "improve"
    assert ledger_reader.read_run(run_dir).of_kind("clustering")[-1].mode == "improve"
    assert [ledger.raised_mode(m, "triage") for m in (None, "measure", "triage", "improve")] == [
        "triage",
        "triage",
        "triage",
        "improve",
    ]


def test_the_loop_stops_at_a_baseline_with_harness_errors(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    events = shop(repo) / "runs" / "base" / "events.jsonl"
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    kept = [x for x in lines if not (x["kind"] == "score" and x.get("qid") == PASSING)]
    assert len(kept) == len(lines) - 1
    events.write_text("".join(json.dumps(x) + "\n" for x in kept))
    closed_as_is(events.parent)  # a baseline that closed with that harness error
    fake.policy = Shop(shop(repo))
    code = cli.main(["loop", str(shop(repo))])
    out = capsys.readouterr().out
    assert code == 6, out
    assert "2. baseline: reusing base" in out
    assert f"STOP (needs a person): the baseline base has 1 harness error(s) ({PASSING})" in out
    assert "3. diagnose" not in out and fake.calls("diagnoser") == []
    assert not (shop(repo) / "runs" / "base" / "events.jsonl").read_text().count('"checkpoint"')


def test_the_replay_compares_numbers_within_a_relative_tolerance() -> None:
    stored = [{"status": "Cancelled", "rate": 0.1234567}, {"status": "Returned", "rate": 0.2}]
    assert acceptance.same_rows(
        stored,
        [
            {"status": "Returned", "rate": 0.2 * (1 + 1e-9)},
            {"status": "Cancelled", "rate": 0.1234567 * (1 - 5e-7)},
        ],
    )
    assert not acceptance.same_rows(stored, [stored[0], {"status": "Returned", "rate": 0.2001}])
    assert not acceptance.same_rows(stored, stored[:1])
    assert not acceptance.same_rows(stored, [stored[0], {"status": "returned", "rate": 0.2}])
    assert not acceptance.same_rows([{"n": 1}], [{"n": True}])  # a flag is not a count
    assert acceptance.same_rows([{"n": 4712}], [{"n": 4712.0}])
    assert acceptance.same_rows([{"x": 0.0}], [{"x": 1e-17}])  # summation noise around zero


def test_a_stdio_server_writes_to_the_current_stderr(tmp_path: Path, monkeypatch: Any) -> None:
    import asyncio
    import sys

    from mcp import StdioServerParameters

    from pytest_evalloop.failures import HarnessError
    from pytest_evalloop.targets.profiles import load_profile
    from pytest_evalloop.targets.target import MCPTarget

    log = (tmp_path / "errlog").open("w+")
    monkeypatch.setattr(sys, "stderr", log)
    server = StdioServerParameters(
        command=sys.executable, args=["-c", "import sys; sys.stderr.write('errlog-marker\\n')"]
    )
    target = MCPTarget(
        server, load_profile("embedded", None, tmp_path), name="t", read_timeout_s=30
    )  # type: ignore[arg-type]

    async def connect() -> None:
        with pytest.raises(HarnessError):
            await target.open()
        await target.close()

    asyncio.run(connect())
    log.flush()
    assert "errlog-marker" in (tmp_path / "errlog").read_text()
