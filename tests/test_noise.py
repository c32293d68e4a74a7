"""`evalloop noise A B`: an A/A pair's flips split into judge and answerer noise, checked
against a hand-computed example; the CALIBRATION.md block; a comparison marks unstable flips."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_evalloop.cli import main as cli
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import writer as ledger_writer
from tests.test_ledger import _attempt, _info

M, N = "match", "no_match"

# Each case's three judge samples in run A and in run B, and what a hand count says:
PAIR = {
    "q1": ([M, M, M], [N, N, N]),  # flip, every judge agreed on each side: answerer noise
    "q2": ([M, M, N], [N, N, M]),  # flip m -> n, but A's answer drew an n: judge noise
    "q3": ([M, M, M], [M, N, M]),  # no flip (m, m), B's judges split: unstable
    "q4": ([N, N, N], [M, M, M]),  # flip, unanimous both sides: answerer noise
    "q5": ([N, N, N], [N, N, N]),  # stable
    "q6": ([N, M, N], [M, M, N]),  # flip n -> m, A's answer drew an m: judge noise
}
# Hand count: 4 flips (q1, q2, q4, q6) of 6 scored in both; judge 2 (q2, q6); answerer 2
# (q1, q4); unstable: the flips plus q3 (non-unanimous judges) = q1, q2, q3, q4, q6.


def _write(root: Path, run_id: str, side: int, **extra: object) -> Path:
    run_dir = root / "runs" / run_id
    pins = {"answerer": "anthropic", "targetProfile": "embedded", **extra}
    ledger_writer.write_run_info(run_dir, _info(run_id, **pins))
    writer = ledger_writer.LedgerWriter(run_dir)
    for qid, sides in PAIR.items():
        writer.append(_attempt(qid))
        for i, verdict in enumerate(sides[side]):
            writer.append(
                ledger.ScoreEvent(
                    qid=qid,
                    sample=None,
                    phase="baseline",
                    verdict=verdict,  # type: ignore[arg-type]
                    reason="judged",
                    contaminated=False,
                    judge_sample=i,
                )
            )
    return run_dir


def test_noise_separates_judge_and_answerer_flips_as_counted_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _write(tmp_path, "aa-1", 0), _write(tmp_path, "aa-2", 1)
    assert cli(["noise", str(a), str(b), "--calibration"]) == 0
    out = capsys.readouterr().out
    assert "flipped: 4 of 6 scored in both (67%)" in out
    assert (
        "  judge noise: 2 (the same answers judged again could give the other verdict): q2, q6"
        in out
    )
    assert (
        "  answerer noise: 2 (every judge sample agreed on each side; the answers differ): q1, q4"
        in out
    )
    assert "unstable cases (5): q1, q2, q3, q4, q6" in out
    assert "unattributed" not in out
    assert (
        "Of the 4: 2 judge noise (the same answers judged again could flip), 2 answerer noise"
        in out
    )
    assert '"judgeBand": 2' in out and '"answererBand": 2' in out
    assert '"unstable": [\n    "q1",' in out
    assert '"datasetSha": "def"' in out  # the pins the bands belong to

    # Written into the set's CALIBRATION.md, a later comparison under the same pins marks a
    # flip that is on the unstable list.
    block = out[out.index("## A/A band") :]
    (tmp_path / "set.json").write_text("{}", encoding="utf-8")
    (tmp_path / "CALIBRATION.md").write_text(block, encoding="utf-8")
    assert cli(["flips", str(a), str(b)]) == 0
    flipped = capsys.readouterr().out
    assert "q1: match -> no_match [unstable in the A/A pair]" in flipped
    assert "A/A noise band 4" in flipped


def test_a_rejudge_pair_is_all_judge_noise_and_one_sample_is_unattributed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _write(tmp_path, "aa-1", 0)
    rejudge = _write(tmp_path, "aa-rejudge", 1, rejudgeOf="aa-1")
    assert cli(["noise", str(a), str(rejudge)]) == 0
    out = capsys.readouterr().out
    assert "judge noise: 4" in out and "answerer noise: 0" in out

    # One judge sample per attempt and different answers: nothing can separate the two.
    for name, side in (("one-1", 0), ("one-2", 1)):
        run_dir = tmp_path / "runs" / name
        ledger_writer.write_run_info(run_dir, _info(name))
        writer = ledger_writer.LedgerWriter(run_dir)
        for qid, sides in PAIR.items():
            verdict = max(set(sides[side]), key=sides[side].count)
            writer.append(
                _attempt(qid),
                ledger.ScoreEvent(
                    qid=qid,
                    sample=None,
                    phase="baseline",
                    verdict=verdict,
                    reason="judged",  # type: ignore[arg-type]
                ),
            )
    assert cli(["noise", "one-1", "one-2", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "unattributed: 4" in out and "--eval-judge-samples=3" in out


def test_noise_refuses_a_pair_that_is_not_an_a_a(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _write(tmp_path, "aa-1", 0)
    other = _write(tmp_path, "aa-2", 1, judgeModel="claude-other")
    assert cli(["noise", str(a), str(other)]) == 2
    assert "not an A/A pair: pins differ" in capsys.readouterr().err


def test_noise_says_why_a_run_is_not_found_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path, "aa-1", 0)
    assert cli(["noise", "aa-9", "aa-1", "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("evalloop noise: no run 'aa-9' in ") and "Traceback" not in err
    assert cli(["noise", "aa-1"]) == 2  # argparse's own usage error, its status kept
    assert "evalloop noise: error: the following arguments are required: current" in (
        capsys.readouterr().err
    )
