"""The loop on the Malloy example set: a git copy of `evals/ecommerce-malloy` (four cases, the
generated tables linked) whose `order_items.status` doc lost its rule for what a sale is.

The real Malloy compiler serves every step: the baseline and both blind arms are real `pytest`
runs on the malloy target, improve's working copy is compiled by it, the probes and the replay
run through it. The fake's answerer answers the units-sold question right only when the context
it was served carries the status doc's rule, so whether the edit helps is decided by what the
arms were served. One module fixture walks the loop once (baseline, then `evalloop loop`); the
refusal tests start from a copy of the repository as it was before the walk.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop import cli
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from tests import test_improve as improve_tests
from tests.conftest import SECRET
from tests.reportruns import run_pytest
from tests.test_improve import git
from tests.test_malloy_run import _copy_set

pytestmark = [
    pytest.mark.skipif(
        shutil.which("node") is None or shutil.which("npm") is None,
        reason="the malloy target needs node and npm on PATH (install Node.js 20+)",
    ),
]

TARGET = "ecom_units_sold_2022"
PASSING = "ecom_customer_count"
HOLDOUT = ("ecom_profit", "ecom_return_share_of_delivered")
QIDS = (TARGET, PASSING, *HOLDOUT)
MODEL = "ecommerce/ecommerce.malloy"
RULE_LINES = (
    "  #(doc) Cancelled, or Returned. Cancelled lines never ship and are not sales;\n"
    "  #(doc) every other status is a sale (see units_sold).\n"
)
WEAK_LINES = "  #(doc) Cancelled, or Returned.\n"
NEEDLE = "never ship and are not sales"
ISSUE = "base:coverage-ecom-units-sold-2022"
ARGS = {"environmentName": "local", "packageName": "ecommerce", "modelPath": "ecommerce.malloy"}
PROBE = "run: order_items -> { group_by: status; aggregate: order_item_count }"
WRONG_QUERY = "run: order_items -> { where: created_at = @2022; aggregate: order_item_count }"
# The context is asked for the status field by name: what it serves is that field's doc.
CONTEXT = {"environmentName": "local", "packageName": "ecommerce", "query": "order status"}
ORACLE = [
    {"tool": "malloy_getContext", "input": CONTEXT},
    {"tool": "malloy_executeQuery", "input": {**ARGS, "query": "{modelQuery}"}},
    {"text": "Here it is.\n\nFinal query:\n```malloy\n{modelQuery}\n```"},
]
WRONG = [
    {"tool": "malloy_getContext", "input": CONTEXT},
    {"tool": "malloy_executeQuery", "input": {**ARGS, "query": WRONG_QUERY}},
    {"text": f"Answered via the wrong route.\n\nFinal query:\n```malloy\n{WRONG_QUERY}\n```"},
]
DIAGNOSIS = {
    **improve_tests.DIAGNOSIS,
    "probes": [{"why": "statuses", "query": PROBE, "result": "5 statuses"}],
    "reasoning": "the status doc no longer says which lines are sales",
    "primary_code": "COVERAGE",
    # units_sold never came back here: the evidence says insufficient.
    "sufficiency": "insufficient",
    "diagnosis": "The status doc does not say that cancelled lines are not sales.",
    "entity": "the rule that cancelled lines are not sales",
}


def edit(new_tail: str) -> dict[str, Any]:
    """An edit of the weakened doc's last line (and the field under it, unique in the file)."""
    return {"file": MODEL, "old": WEAK_LINES + "  public: status", "new": new_tail}


RESTORING = edit(RULE_LINES + "  public: status")


def reply(**extra: Any) -> dict[str, Any]:
    return {
        "files": [MODEL],
        "probes": [{"why": "the statuses exist", "query": PROBE, "result": "5 rows"}],
        "edit": "say on order_items.status which lines are sales",
        "editTier": 1,
        "disagreement": "NONE",
        "meaningChanged": [],
        "goldenSuspect": [],
        **extra,
    }


def improver(*turns: Any) -> list[Any]:
    return [{"probe": "malloy_executeQuery", "input": {**ARGS, "query": PROBE}}, *turns]


class Shop(improve_tests.Shop):
    """The answerer depends on what it was served (the embedded walk's rule, test_improve's
    `Shop`); the diagnoser and improver are scripted for the Malloy set."""

    def __init__(self, set_dir: Path, improver_turns: list[Any]) -> None:
        rows = {
            json.loads(x)["qid"]: json.loads(x)
            for x in (set_dir / "cases.jsonl").read_text().splitlines()
        }
        self.needs = {rows[TARGET]["question"]: NEEDLE}
        base: dict[str, Any] = {
            "cases_file": str(set_dir / "cases.jsonl"),
            "judge": {
                "default": {"verdict": "match", "confidence": 9, "why": "the figure matches"},
                "by_substring": {
                    "via the wrong route": {"verdict": "no_match", "confidence": 9, "why": "no"}
                },
            },
            "diagnoser": {"by_substring": {f"Case {TARGET}.": [DIAGNOSIS]}},
            "improver": {"default": improver_turns},
        }
        self.right = ScriptSpec.model_validate({**base, "answerer": {"default": ORACLE}}).policy()
        self.wrong = ScriptSpec.model_validate({**base, "answerer": {"default": WRONG}}).policy()
        self.answerer_bodies: list[str] = []


def copy_set(dest: Path) -> Path:
    """Four cases of the set, the status doc weakened; the tables linked, not copied."""
    dest.mkdir(parents=True)
    _copy_set(dest, tuple(QIDS))
    model = dest / MODEL
    text = model.read_text()
    assert text.count(RULE_LINES) == 1
    model.write_text(text.replace(RULE_LINES, WEAK_LINES))
    return dest


@dataclass
class Walk:
    before: Path
    """The repository with the baseline run, before the loop (a copy to start other tests)."""
    repo: Path
    """The repository after `evalloop loop`."""
    code: int
    out: str
    policy: Shop


def shop(repo: Path) -> Path:
    return repo / "evals" / "ecommerce-malloy"


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    root = tmp_path_factory.mktemp("malloy-loop")
    before = root / "before"
    set_dir = copy_set(shop(before))
    git(before, "init", "-q")
    git(before, "add", "evals")
    git(before, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "weakened")
    with FakeAnthropic() as fake, pytest.MonkeyPatch.context() as mp:
        policy = Shop(set_dir, improver({"edit": RESTORING}, reply()))
        fake.policy = policy
        done = run_pytest(fake, set_dir, "--eval-label=base")
        assert (set_dir / "runs" / "base" / "run.json").is_file(), done.stdout + done.stderr
        repo = root / "walked"
        shutil.copytree(before, repo, symlinks=True)
        mp.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        mp.setenv("ANTHROPIC_API_KEY", SECRET)
        mp.chdir(repo)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(["loop", "evals/ecommerce-malloy"])
        yield Walk(before=before, repo=repo, code=code, out=out.getvalue(), policy=policy)


def verdicts(run_dir: Path) -> dict[str, str | None]:
    return {k[0]: s.verdict for k, s in ledger_reader.read_run(run_dir).scores().items()}


def test_the_malloy_loop_restores_the_doc_accepts_and_checkpoints(walk: Walk) -> None:
    out = walk.out
    assert walk.code == 0, out
    base = shop(walk.before) / "runs" / "base"
    assert verdicts(base) == {
        TARGET: "no_match",
        PASSING: "match",
        HOLDOUT[0]: "match",
        HOLDOUT[1]: "match",
    }
    for step in (
        "1. target: malloy (local), model files ecommerce/ecommerce.malloy",
        "2. baseline: reusing base",
        "3. diagnose",
        f"4. improve: {ISSUE}",
        "check load: ok",
        "5. acceptance check",
        "acceptance check: accepted (docs)",
        "holdout delta: 0",
        "6. checkpoint: ecommerce-malloy-checkpoint-02",
    ):
        assert step in out, out
    run_dir = shop(walk.repo) / "runs" / "base"
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    [candidate] = read.of_kind("candidate")
    assert candidate.status == "proposed" and candidate.files == [MODEL]
    assert candidate.meaning_changed == [] and candidate.golden_suspect == []
    assert any(c["check"] == "load" and c["ok"] for c in candidate.checks), candidate.checks
    [check] = read.of_kind("acceptance_check")
    assert check.decision == "accepted" and check.class_ == "docs" and check.regressions == []
    assert check.holdout_delta == 0 and len(check.final_run_ids) == 2
    assert {r["qid"]: r["status"] for r in check.replay} == {q: "same" for q in (PASSING, *HOLDOUT)}
    assert read.issue_statuses()[ISSUE].status == "fixed"
    created = [c for c in read.of_kind("checkpoint") if c.action == "created"]
    assert [c.label for c in created] == [
        "ecommerce-malloy-checkpoint-01",
        "ecommerce-malloy-checkpoint-02",
    ]
    assert created[1].model_git_sha == git(walk.repo, "rev-parse", "HEAD").strip()
    assert RULE_LINES in (shop(walk.repo) / MODEL).read_text()
    assert git(walk.repo, "status", "--porcelain", "--", f"evals/ecommerce-malloy/{MODEL}") == ""
    for arm in check.final_run_ids:
        arm_dir = shop(walk.repo) / "runs" / arm
        assert verdicts(arm_dir)[TARGET] == "match"
        info = json.loads((arm_dir / "run.json").read_text())
        assert info["phase"] == "blind_gate" and info["mode"] == "improve"
        assert info["target"] == "malloy:ecommerce-malloy/ecommerce"
        assert cli.main(["validate", str(arm_dir)]) == 0
    assert cli.main(["validate", str(run_dir)]) == 0
    for body in walk.policy.answerer_bodies:
        for leak in (ISSUE, "cand-01", DIAGNOSIS["diagnosis"]):
            assert leak not in body


def test_restore_returns_the_malloy_model_to_the_first_checkpoint(
    walk: Walk, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(walk.repo, repo, symlinks=True)  # the walk's own tree stays as it ended
    set_dir = shop(repo)
    assert cli.main(["restore", "ecommerce-malloy-checkpoint-01", "--set", str(set_dir)]) == 0
    text = (set_dir / MODEL).read_text()
    assert WEAK_LINES + "  public: status" in text and NEEDLE not in text
    read = ledger_reader.read_run(set_dir / "runs" / "base")
    first = next(c for c in read.of_kind("checkpoint") if c.action == "created")
    last = read.of_kind("checkpoint")[-1]
    assert (last.action, last.label, last.model_git_sha) == (
        "restored",
        "ecommerce-malloy-checkpoint-01",
        first.model_git_sha,
    )
    assert read.errors == []


@pytest.fixture
def diagnosed(walk: Walk, tmp_path: Path, fake: FakeAnthropic) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(walk.before, repo, symlinks=True)
    fake.policy = Shop(shop(repo), [])
    assert cli.main(["diagnose", str(shop(repo) / "runs" / "base"), "--no-probes"]) == 0
    return repo


def _improve(fake: FakeAnthropic, repo: Path, turns: list[Any]) -> tuple[int, Any]:
    fake.policy = Shop(shop(repo), turns)
    run_dir = shop(repo) / "runs" / "base"
    code = cli.main(["improve", str(run_dir), "--issue", ISSUE])
    [candidate] = ledger_reader.read_run(run_dir).of_kind("candidate")
    return code, candidate


def test_an_edit_that_does_not_compile_is_refused_before_any_arm(
    fake: FakeAnthropic, diagnosed: Path
) -> None:
    broken = edit(RULE_LINES + "  public: status\n  dimension: status_code is status +")
    before = (shop(diagnosed) / MODEL).read_text()
    runs_before = sorted(p.name for p in (shop(diagnosed) / "runs").iterdir())
    code, candidate = _improve(fake, diagnosed, improver({"edit": broken}, reply()))
    assert code == 6 and candidate.status == "refused"
    assert any("does not load: ecommerce.malloy:" in r for r in candidate.refusals), (
        candidate.refusals
    )
    assert (shop(diagnosed) / MODEL).read_text() == before
    assert sorted(p.name for p in (shop(diagnosed) / "runs").iterdir()) == runs_before
    run_dir = shop(diagnosed) / "runs" / "base"
    assert cli.main(["accept", str(run_dir), "--candidate", "base:cand-01"]) == 2
    assert sorted(p.name for p in (shop(diagnosed) / "runs").iterdir()) == runs_before


def test_an_edit_writing_a_qid_into_a_doc_is_refused(fake: FakeAnthropic, diagnosed: Path) -> None:
    leak = edit(f"  #(doc) Cancelled, or Returned (see {TARGET}).\n  public: status")
    before = (shop(diagnosed) / MODEL).read_text()
    code, candidate = _improve(fake, diagnosed, improver({"edit": leak}, reply()))
    assert code == 6 and candidate.status == "refused"
    assert any(f"case id {TARGET!r}" in r for r in candidate.refusals), candidate.refusals
    assert (shop(diagnosed) / MODEL).read_text() == before
