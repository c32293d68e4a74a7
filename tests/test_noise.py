"""`evalloop noise A B`: an A/A pair's flips split into judge and answerer noise, checked
against a hand-computed example; the CALIBRATION.md block; a comparison marks unstable flips."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalloop.cli import main as cli
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.measure import noise
from tests.test_ledger import _attempt, _info

M, N = "match", "no_match"


def _answer(qid: str, sample: int | None, text: str) -> ledger.AttemptEvent:
    attempt = _attempt(qid, sample)
    return attempt.model_copy(update={"final_query": f"SELECT '{text}'", "answer_text": text})


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


def _write(root: Path, run_id: str, side: int, answers: int | None = None, **extra: object) -> Path:
    run_dir = root / "runs" / run_id
    pins = {"answerer": "anthropic", "targetProfile": "embedded", **extra}
    ledger_writer.write_run_info(run_dir, _info(run_id, **pins))
    writer = ledger_writer.LedgerWriter(run_dir)
    for qid, sides in PAIR.items():
        # Each side wrote its own answer unless told whose answers it holds (a rejudge's).
        writer.append(_answer(qid, None, f"side {side if answers is None else answers}"))
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
        "  judge noise: 2 (the same answers on both sides, or one answer drew both match and "
        "no_match): q2, q6" in out
    )
    assert (
        "  answerer noise: 2 (the answers differ; each was judged twice or more with one "
        "decision): q1, q4" in out
    )
    assert "unstable cases (5): q1, q2, q3, q4, q6" in out
    assert "unattributed:" not in out and '"unattributedBand": 0' in out
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
    rejudge = _write(tmp_path, "aa-rejudge", 1, answers=0, rejudgeOf="aa-1")
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
                _answer(qid, None, f"side {side}"),
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


# The noise split's design table (docs/measurement.md, "Which noise"): each design, one flipped
# case q1, and the source the flip must be charged to. A side is its samples, each sample its
# answer and the verdicts of its judge samples; `rejudgeOf` names the source of a rejudge.
Side = list[tuple[str, list[str]]]
DESIGNS: dict[str, tuple[Side, Side, dict[str, str], dict[str, str], str]] = {
    "B rejudges A": ([("x", [M])], [("x", [N])], {}, {"rejudgeOf": "A"}, "judge"),
    "A rejudges B": ([("x", [M])], [("x", [N])], {"rejudgeOf": "B"}, {}, "judge"),
    "both rejudge one source": (
        [("x", [M])],
        [("x", [N])],
        {"rejudgeOf": "src"},
        {"rejudgeOf": "src"},
        "judge",
    ),
    "byte-identical answers": ([("x", [M])], [("x", [N])], {}, {}, "judge"),
    "judge samples, one answer split": ([("x", [M, M, N])], [("y", [N, N, N])], {}, {}, "judge"),
    "judge samples, unanimous, answers differ": (
        [("x", [M, M, M])],
        [("y", [N, N, N])],
        {},
        {},
        "answerer",
    ),
    "answerer and judge samples, unanimous": (
        [("x", [M, M, M]), ("y", [M, M, M]), ("z", [N, N, N])],
        [("u", [N, N, N]), ("v", [N, N, N]), ("w", [M, M, M])],
        {},
        {},
        "answerer",
    ),
    "answerer samples, judged once, answers distinct": (
        [("x", [M]), ("y", [M]), ("z", [N])],
        [("u", [N]), ("v", [N]), ("w", [M])],
        {},
        {},
        "unattributed",
    ),
    "answerer samples, judged once, all one way": (
        [("x", [M]), ("y", [M]), ("z", [M])],
        [("u", [N]), ("v", [N]), ("w", [N])],
        {},
        {},
        "unattributed",
    ),
    "answerer samples, judged once, answers recur": (
        [("x", [M]), ("x", [M]), ("y", [N])],
        [("y", [N]), ("y", [N]), ("x", [M])],
        {},
        {},
        "answerer",
    ),
    "answerer samples, a recurring answer judged both ways": (
        [("x", [M]), ("x", [M]), ("y", [N])],
        [("x", [N]), ("y", [N]), ("y", [N])],
        {},
        {},
        "judge",
    ),
    "only one side judge-sampled": ([("x", [M, M, M])], [("y", [N])], {}, {}, "unattributed"),
    "one sample, one judge, answers differ": ([("x", [M])], [("y", [N])], {}, {}, "unattributed"),
}


def _write_design(root: Path, run_id: str, side: Side, extra: dict[str, str]) -> Path:
    run_dir = root / "runs" / run_id
    pins = {"answerer": "anthropic", "targetProfile": "embedded", **extra}
    ledger_writer.write_run_info(run_dir, _info(run_id, **pins))
    writer = ledger_writer.LedgerWriter(run_dir)
    for i, (text, verdicts) in enumerate(side, start=1):
        sample = i if len(side) > 1 else None
        writer.append(_answer("q1", sample, text))
        for j, verdict in enumerate(verdicts):
            writer.append(
                ledger.ScoreEvent(
                    qid="q1",
                    sample=sample,
                    phase="baseline",
                    verdict=verdict,  # type: ignore[arg-type]
                    reason="judged",
                    contaminated=False,
                    judge_sample=j if len(verdicts) > 1 else None,
                )
            )
    return run_dir


@pytest.mark.parametrize("design", list(DESIGNS))
def test_every_design_of_the_noise_table_is_attributed_as_documented(
    design: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    side_a, side_b, extra_a, extra_b, expected = DESIGNS[design]
    a = _write_design(tmp_path, "A", side_a, extra_a)
    b = _write_design(tmp_path, "B", side_b, extra_b)
    assert cli(["noise", str(a), str(b), "-v", "--calibration"]) == 0
    out = capsys.readouterr().out
    assert "flipped: 1 of 1 scored in both" in out
    counts = {"judge": "judge noise", "answerer": "answerer noise", "unattributed": "unattributed"}
    for source, label in counts.items():
        want = 1 if source == expected else 0
        if source == "unattributed" and not want:
            assert "  unattributed:" not in out
        else:
            assert f"  {label}: {want} " in out, (design, out)
    assert f'"{expected}Band": 1' in out
    # The docs' table lists this design under the same attribution.
    docs = (Path(__file__).parents[1] / "docs" / "measurement.md").read_text(encoding="utf-8")
    row = next(line for line in docs.splitlines() if line.startswith(f"| {design} |"))
    assert row.rstrip(" |").endswith(expected), row


def test_byte_identical_answers_are_never_called_different(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "answerer noise: 1 ... the answers differ" for byte-identical queries and answers
    # judged three times each (the tool never compared the answers).
    a = _write_design(tmp_path, "A", [("x", [M, M, M])], {})
    b = _write_design(tmp_path, "B", [("x", [N, N, N])], {})
    assert cli(["noise", str(a), str(b), "-v"]) == 0
    out = capsys.readouterr().out
    assert "judge noise: 1" in out and "answerer noise: 0" in out
    assert "    q1: the same answers on both sides" in out


_answers = st.lists(
    st.builds(
        noise.Answer,
        fingerprint=st.sampled_from("abcd"),
        verdicts=st.lists(st.sampled_from([M, N, "near_match", None]), min_size=1, max_size=3).map(
            tuple
        ),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(_answers, _answers, st.randoms())
def test_attribution_is_symmetric_and_ignores_order(
    side_a: list[noise.Answer], side_b: list[noise.Answer], rnd: Any
) -> None:
    found = noise.attribute(side_a, side_b)
    assert noise.attribute(side_b, side_a) == found
    shuffled_a, shuffled_b = side_a[:], side_b[:]
    rnd.shuffle(shuffled_a)
    rnd.shuffle(shuffled_b)
    assert noise.attribute(shuffled_a, shuffled_b) == found
    # The same answers on both sides: only the judge can have moved.
    same = [noise.Answer(x.fingerprint, (M,)) for x in side_a]
    assert noise.attribute(side_a, same).source == "judge"
    # An answer judged once, never seen elsewhere, and no split: never charged to the answerer.
    if found.source == "answerer":
        pooled: dict[str, int] = {}
        for x in (*side_a, *side_b):
            pooled[x.fingerprint] = pooled.get(x.fingerprint, 0) + len(x.verdicts)
        assert min(pooled.values()) >= 2


def test_a_case_near_match_every_time_is_not_unstable_in_the_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: every such case was "inconsistent" and tagged [unstable in the A/A pair].
    stable = [("x", ["near_match"]), ("y", ["near_match"])]
    a = _write_design(tmp_path, "A", stable, {})
    b = _write_design(tmp_path, "B", stable, {})
    assert cli(["noise", str(a), str(b)]) == 0
    assert "unstable cases (0)" in capsys.readouterr().out
