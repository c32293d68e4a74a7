"""The loop's guards hold (issue 42), end to end on the embedded target.

The repository, the weakened set, its baseline `base` and the scripted policy are
`tests/test_improve.py`'s; each test walks one way a careful user found around a guard:
a golden written another way, a narrowed baseline, a restore over uncommitted work, a budget
that a step overran, a commented-out line read as docs, an untracked conftest.py, a forged
side-door record.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from pytest_evalloop import cli
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.testing import FakeAnthropic
from tests.reportruns import run_pytest
from tests.test_improve import (
    QIDS,
    TARGET,
    WEAK,
    Shop,
    git,
    improver,
    reply,
    restoring_edit,
    shop,
    stored_repo,  # noqa: F401 (a fixture)
)
from tests.test_improve import repo as repo  # noqa: F401, PLC0414 (a fixture)

LEAK_DOC = '"doc": "Order lifecycle status. About 0.1493 of all orders end Cancelled."'
HINT_DOC = '"doc": "Order lifecycle status. Roughly one order in seven ends Cancelled."'


def log(repo: Path) -> list[str]:
    return git(repo, "log", "--format=%s").splitlines()


def runs_of(repo: Path) -> list[str]:
    return sorted(p.name for p in (shop(repo) / "runs").iterdir() if p.is_dir())


# --- 1. a golden written another way ---------------------------------------------------------


def test_a_leak_the_digit_match_missed_is_refused_and_nothing_is_committed(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    leak = {"file": "model.json", "old": WEAK, "new": LEAK_DOC}
    fake.policy = Shop(shop(repo), improver({"edit": leak}, reply()))
    before = (shop(repo) / "model.json").read_text()
    code = cli.main(["loop", str(shop(repo))])
    out = capsys.readouterr().out
    assert code == 6, out
    assert "STOP (needs a person): candidate base:cand-01 is refused" in out
    assert "'0.1493'" in out and "14.93" in out and TARGET in out, out
    assert out.rstrip().splitlines()[-1].startswith("spent $")
    [candidate] = ledger_reader.read_run(shop(repo) / "runs" / "base").of_kind("candidate")
    assert candidate.status == "refused"
    # Refused when proposed: the improver was told at once, and the edit never applied.
    assert any("refused, not applied" in r and "0.1493" in r for r in candidate.refusals)
    assert (shop(repo) / "model.json").read_text() == before
    assert not ledger_reader.read_run(shop(repo) / "runs" / "base").of_kind("acceptance_check")
    # Nothing committed but the checkpoint that pins the model before improve.
    assert log(repo) == ["evalloop checkpoint ecommerce-checkpoint-01", "the weakened model"]
    assert not [r for r in runs_of(repo) if "blind_gate" in r]
    assert [c for c in fake.calls("improver") if c.turn == 3], "it went on after the refusal"


def test_a_leak_only_the_reviewer_reads_halts_the_check_until_a_person_dismisses_it(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    hint = {"file": "model.json", "old": WEAK, "new": HINT_DOC}
    flag = {"qid": TARGET, "quote": "one order in seven", "why": "states the cancellation rate"}
    policy = Shop(shop(repo), improver({"edit": hint}, reply()))
    policy.right.spec.improver.review = {"flags": [flag]}
    policy.wrong.spec.improver.review = {"flags": [flag]}
    fake.policy = policy
    code = cli.main(["loop", str(shop(repo))])
    out = capsys.readouterr().out
    assert code == 6, out
    assert "EXPERT FLAG ecom_cancellation_rate: 'one order in seven'" in out
    assert "STOP (needs a person): the acceptance check halted before any run" in out
    assert "the expert review flagged ecom_cancellation_rate" in out
    run_dir = shop(repo) / "runs" / "base"
    read = ledger_reader.read_run(run_dir)
    [candidate] = read.of_kind("candidate")
    assert candidate.status == "proposed" and candidate.expert_flags[0]["qid"] == TARGET
    assert candidate.expert_review and candidate.expert_review["flags"] == 1
    [check] = read.of_kind("acceptance_check")
    assert check.decision == "unresolved" and check.final_run_ids == []
    assert log(repo) == ["evalloop checkpoint ecommerce-checkpoint-01", "the weakened model"]
    assert not [r for r in runs_of(repo) if "blind_gate" in r]
    # The reviewer read the diff and every question, dev and holdout; never a golden's value.
    [review] = [c for c in fake.calls("improver") if (c.question or "").startswith("EXPERT")]
    cases = [json.loads(x) for x in (shop(repo) / "cases.jsonl").read_text().splitlines()]
    body = review.model_dump_json()
    for case in cases:
        assert case["qid"] in body
        for value in re.findall(r"\d+\.\d+|\d{3,}", json.dumps(case["golden"].get("value"))):
            assert value not in body, value
    # A person reads the flag and dismisses it: the check then runs.
    code = cli.main(
        [
            "accept",
            str(run_dir),
            "--candidate",
            "base:cand-01",
            "--dismiss-suspect",
            TARGET,
            "a person read it: a seventh is a ratio of the data, not the 14.93 % asked",
        ]
    )
    out = capsys.readouterr().out
    assert "halted" not in out.split("acceptance check:")[-1].split("reason:")[0], out
    checks = ledger_reader.read_run(run_dir).of_kind("acceptance_check")
    assert len(checks) == 2 and len(checks[-1].final_run_ids) == 2
    assert "dismissed" in (checks[-1].reason or "")
    assert code in (0, 6)


# --- 2. whole runs only ----------------------------------------------------------------------


def test_the_loop_never_reuses_a_narrowed_baseline(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    fake.policy = Shop(shop(repo))
    shutil.rmtree(shop(repo) / "runs" / "base")
    done = run_pytest(fake, shop(repo), "-k", TARGET, "--eval-label=narrow")
    assert (shop(repo) / "runs" / "narrow" / "run.json").is_file(), done.stdout + done.stderr
    code = cli.main(["loop", str(shop(repo)), "--no-review"])
    out = capsys.readouterr().out
    assert code == 6, out  # the unscripted improver proposes nothing
    assert "not reusing narrow: " in out and "-k" in out, out
    assert "2. baseline: none on these model files and dataset; running one" in out
    [new] = [r for r in runs_of(repo) if r.startswith("ecommerce-baseline")]
    info = json.loads((shop(repo) / "runs" / new / "run.json").read_text())
    assert info["selection"]["whole"] is True and info["status"] == "complete"
    assert len(ledger_reader.read_run(shop(repo) / "runs" / new).scores()) == len(QIDS)


def test_accept_and_improve_refuse_a_narrowed_baseline_before_any_request(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    from pytest_evalloop.ledger import contract as ledger
    from pytest_evalloop.ledger import writer as ledger_writer

    fake.policy = Shop(shop(repo))
    done = run_pytest(fake, shop(repo), "-k", TARGET, "--eval-label=narrow")
    narrow = shop(repo) / "runs" / "narrow"
    assert (narrow / "run.json").is_file(), done.stdout + done.stderr
    assert cli.main(["diagnose", str(narrow), "--no-probes"]) == 0
    paid = len(fake.calls())
    capsys.readouterr()
    issue = next(iter(ledger_reader.read_run(narrow).issues()))
    assert cli.main(["improve", str(narrow), "--issue", issue]) == 2
    err = capsys.readouterr().err
    assert "narrow cannot be the baseline of an acceptance check" in err and "-k" in err, err
    # A candidate recorded on it all the same (through the ledger's writer) is refused too.
    sha = (shop(repo) / "model.json").read_bytes()
    ledger_writer.LedgerWriter(narrow).append(
        ledger.CandidateEvent(
            candidateId="narrow:cand-01",
            issue_ids=[issue],
            files=["model.json"],
            status="proposed",
            fileShas={"model.json": __import__("hashlib").sha256(sha).hexdigest()},
        )
    )
    assert cli.main(["accept", str(narrow), "--candidate", "narrow:cand-01"]) == 2
    err = capsys.readouterr().err
    assert "cannot be the baseline of an acceptance check" in err and "-k" in err, err
    assert len(fake.calls()) == paid  # nothing was asked of the endpoint
    assert not [r for r in runs_of(repo) if "blind_gate" in r]


# --- 3. restore never loses work -------------------------------------------------------------


def test_restore_refuses_over_uncommitted_work_and_force_saves_it_first(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    fake.policy = Shop(shop(repo), improver({"edit": restoring_edit()}, reply()))
    assert cli.main(["loop", str(shop(repo)), "--no-review"]) == 0
    capsys.readouterr()
    model = shop(repo) / "model.json"
    mine = model.read_text().replace("Order lifecycle status", "Order status, as I wrote it")
    model.write_text(mine)
    argv = ["restore", "ecommerce-checkpoint-01", "--set", str(shop(repo))]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "uncommitted changes in evals/shop/model.json" in err
    assert "git stash push -- evals/shop/model.json" in err and "--force" in err
    assert model.read_text() == mine  # nothing lost
    assert cli.main([*argv, "--force"]) == 0
    out = capsys.readouterr().out
    saved = Path(re.search(r"to (\S+\.patch);", out).group(1))  # type: ignore[union-attr]
    assert saved.is_file() and "as I wrote it" in saved.read_text()
    assert "as I wrote it" not in model.read_text() and WEAK in model.read_text()
    # The printed command brings the work back, byte for byte.
    command = out.split("to bring them back: ")[1].splitlines()[0]
    subprocess.run(command, shell=True, check=True, capture_output=True)
    assert model.read_text() == mine


# --- 4. one budget ---------------------------------------------------------------------------


def test_the_loop_stops_before_its_budget_and_says_what_it_spent(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    fake.policy = Shop(shop(repo), improver({"edit": restoring_edit()}, reply()))
    code = cli.main(["loop", str(shop(repo)), "--budget-usd", "0.40"])
    out = capsys.readouterr().out
    assert code == 6, out
    last = out.rstrip().splitlines()[-1]
    spent = float(re.match(r"spent \$(\d+\.\d+) of budget \$0\.40$", last).group(1))  # type: ignore[union-attr]
    assert spent <= 0.40, out
    assert "STOP (needs a person): stopped before the budget" in out
    assert not [
        c
        for c in ledger_reader.read_run(shop(repo) / "runs" / "base").of_kind("checkpoint")
        if c.issue_ids
    ]


def test_every_paid_step_runs_under_what_is_left(
    fake: FakeAnthropic, repo: Path, capsys: Any
) -> None:
    fake.policy = Shop(shop(repo), improver({"edit": restoring_edit()}, reply()))
    shutil.rmtree(shop(repo) / "runs" / "base")
    small = [
        "--eval-max-turns=4",
        "--eval-max-tokens=20000",
        "--eval-answerer-model=claude-haiku-4-5",
    ]
    code = cli.main(
        [
            "loop",
            str(shop(repo)),
            "--budget-usd",
            "25",
            "--diagnoser-model",
            "claude-haiku-4-5",
            "--improver-model",
            "claude-haiku-4-5",
            "--eval-judge-model=claude-haiku-4-5",
            *small,
        ]
    )
    out = capsys.readouterr().out
    last = out.rstrip().splitlines()[-1]
    spent = float(re.match(r"spent \$(\d+\.\d+) of budget \$25\.00$", last).group(1))  # type: ignore[union-attr]
    assert 0 < spent <= 25, out
    ceilings = []
    total = 0.0
    for name in runs_of(repo):
        spend = json.loads((shop(repo) / "runs" / name / "run.json").read_text()).get("spend") or {}
        if "ceilingUsd" in spend:
            ceilings.append(spend["ceilingUsd"])
            assert spend["spentUsd"] <= spend["ceilingUsd"]
            total += spend["spentUsd"]
    # The baseline and both arms each ran under what was left, a smaller share each time.
    assert len(ceilings) == 3, (ceilings, out)
    assert ceilings[0] <= 25 and ceilings == sorted(ceilings, reverse=True)
    assert total <= spent <= 25
    assert code == 0, out
