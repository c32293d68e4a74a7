"""`--eval-judge-samples=j`: j fresh judges per answer, every score recorded, the majority
counts, a split is needs_human (judge_split); also on a rejudge of stored answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.cli import main as cli
from pytest_evalloop.judge.judgesamples import agreement, counted
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.testing import FakeAnthropic
from tests.test_ledger import _info
from tests.test_run import QIDS, _example_rows, make_set, only_run, run, spec

CASES = QIDS[:3]
M, N, NEAR = {"verdict": "match"}, {"verdict": "no_match"}, {"verdict": "near_match"}


def _judge() -> dict[str, Any]:
    rows = _example_rows()
    q = {qid: rows[qid]["question"] for qid in CASES}
    # Case 0 unanimous match; case 1 match by 2 of 3; case 2 split three ways.
    return {"default": M, "by_question": {q[CASES[1]]: [M, N, M], q[CASES[2]]: [M, N, NEAR]}}


def test_three_judge_samples_record_three_scores_and_the_majority_counts(
    pytester: pytest.Pytester, fake: FakeAnthropic, capsys: pytest.CaptureFixture[str]
) -> None:
    set_dir = make_set(pytester.path, CASES)
    fake.policy = spec(set_dir, _judge()).policy()
    result = run(pytester, set_dir, "--eval-judge-samples=3")
    out = result.stdout.str()
    assert len(fake.calls("answerer")) > 0
    answerer_calls = len(fake.calls("answerer"))
    assert len(fake.calls("judge")) == 9
    run_dir = only_run(set_dir)
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    groups = read.score_groups()
    assert {k[0]: [s.judge_sample for s in g] for k, g in groups.items()} == {
        qid: [0, 1, 2] for qid in CASES
    }
    # Samples 2 and 3 read the whole prompt sample 1 cached: the doctrine and the case prompt.
    from pytest_evalloop.judge.judge import render_doctrine
    from pytest_evalloop.testing.messages_api import count_tokens

    doctrine = count_tokens(json.dumps({"text": render_doctrine(), "type": "text"}))
    for g in groups.values():
        first = g[0]
        wrote = (first.cache_read_tokens or 0) + (first.cache_creation_tokens or 0)
        assert wrote > doctrine + 500
        assert [(s.cache_read_tokens, s.cache_creation_tokens) for s in g[1:]] == [(wrote, 0)] * 2
    counted_now = {k[0]: (s.verdict, s.reason) for k, s in read.scores().items()}
    assert counted_now[CASES[0]][0] == "match"
    assert counted_now[CASES[1]][0] == "match"
    assert counted_now[CASES[2]] == (
        "needs_human",
        "judge_split: 1 match, 1 near_match, 1 no_match of 3 judge samples",
    )
    assert (
        "judge samples: 3 per attempt over 3 attempts: 1 unanimous, 1 by majority, 1 split "
        "(judge_split: needs_human); mean agreement 55.6%" in out
    )
    assert "verdicts: 2 match, 1 needs_human" in out
    totals = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))["totals"]
    assert totals["judgeSamples"] == {
        "samples": 3,
        "attempts": 3,
        "unanimous": 1,
        "majority": 1,
        "split": 1,
        "agreement": round((1 + 2 / 3 + 0) / 3, 6),
    }
    assert (run_dir / "artifacts" / CASES[1] / "judge__j2.json").is_file()
    assert cli(["validate", str(run_dir)]) == 0
    capsys.readouterr()

    # The same stored answers, judged again three times: no answerer call at all.
    fake.policy = spec(set_dir, _judge()).policy()
    again = run(pytester, set_dir, f"--eval-rejudge-from={run_dir.name}", "--eval-judge-samples=3")
    assert len(fake.calls("answerer")) == answerer_calls, again.stdout.str()
    rejudge = set_dir / "runs" / "ecommerce-rejudge-01"
    regroups = ledger_reader.read_run(rejudge).score_groups()
    assert sorted(len(g) for g in regroups.values()) == [3, 3, 3]
    assert "1 split" in again.stdout.str()


def _score(judge_sample: int | None, verdict: str | None) -> ledger.ScoreEvent:
    return ledger.ScoreEvent(
        qid="a",
        sample=None,
        phase="p",
        verdict=verdict,  # type: ignore[arg-type]
        reason="judged",
        judge_sample=judge_sample,
    )


def test_counted_is_the_strict_majority_and_a_split_is_needs_human() -> None:
    two_to_one = [_score(0, "no_match"), _score(1, "match"), _score(2, "match")]
    assert counted(two_to_one).verdict == "match"
    assert counted(two_to_one).judge_sample == 1
    assert agreement(two_to_one).agreeing == 2
    tie = [_score(0, "match"), _score(1, "no_match")]
    split = counted(tie)
    assert (split.verdict, split.reason) == (
        "needs_human",
        "judge_split: 1 match, 1 no_match of 2 judge samples",
    )
    assert agreement(tie).agreeing == 0 and not agreement(tie).unanimous


def test_validate_refuses_a_judge_sample_twice_or_mixed_with_a_plain_score(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "runs" / "r"
    ledger_writer.write_run_info(run_dir, _info())
    writer = ledger_writer.LedgerWriter(run_dir)
    writer.append(_score(0, "match"), _score(1, "match"))
    assert cli(["validate", str(run_dir)]) == 0
    writer.append(_score(1, "no_match"), _score(None, "match"))
    assert cli(["validate", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert "two score events for one judge sample (qid 'a', sample None, judge_sample 1)" in out
    assert "two score events for one attempt (qid 'a', sample None)" in out


def test_bad_judge_samples_is_a_usage_error(pytester: pytest.Pytester) -> None:
    set_dir = make_set(pytester.path, CASES[:1])
    result = run(pytester, set_dir, "--eval-judge-samples=0", "--collect-only")
    assert "--eval-judge-samples=0 must be at least 1" in result.stderr.str()
