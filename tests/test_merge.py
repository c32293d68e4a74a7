"""A run split over three jobs (`--eval-shard`), merged (`evalloop merge`) and gated once
(`evalloop gate`), against the same set run on one machine, on one scripted endpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.cli import main as evalloop
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure.comparison import compare, read_compared, run_view
from pytest_evalloop.measure.gate import EXIT_GATE_REJECTED, EXIT_HARNESS_FAILURE
from pytest_evalloop.measure.shardrule import shard_note
from pytest_evalloop.scale import merge
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.sets.partition import shard_of
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from tests import forkserver
from tests.conftest import EXAMPLE_SET, SECRET
from tests.sealing import closed_as_is
from tests.test_run import ORACLE

ROWS = [c for _, c in sets.load_cases(EXAMPLE_SET).rows if c.state == "selected"]
QUESTION = {c.qid: c.question for c in ROWS}
ORDERED = sorted(QUESTION)
BASE_FAILS = set(ORDERED[:5])
"""The baseline fails five cases ..."""
POST_FAILS = set(ORDERED[5:9])
"""... the post-edit run fixes them and breaks four others: 5 better, 4 worse, so the bar
rejects (more than 3 worse), whoever counts it."""
GROUP = "ci-run-77"


def script(no_match: set[str]) -> ScriptSpec:
    return ScriptSpec.model_validate(
        {
            "cases_file": str(EXAMPLE_SET / sets.CASES_FILE),
            "answerer": {"default": ORACLE},
            "judge": {
                "default": {"verdict": "match"},
                "by_question": {QUESTION[q]: {"verdict": "no_match"} for q in no_match},
            },
        }
    )


def pytest_cmd(runs_dir: Path, label: str, *args: str, resume: bool = False) -> list[str]:
    """The example set run into `runs_dir` as `label` (or resuming the run `label`)."""
    return [
        sys.executable,
        "-m",
        "pytest",
        str(EXAMPLE_SET),
        "-p",
        "no:cacheprovider",
        "-q",
        f"--eval-runs-dir={runs_dir}",
        f"--eval-resume={label}" if resume else f"--eval-label={label}",
        "--eval-report=off",
        *args,
    ]


def run_all(
    cmds: list[list[str]], env: dict[str, str], cwd: Path
) -> list[subprocess.CompletedProcess[str]]:
    """Start every command at once (the CI matrix), then wait for each."""
    procs = [forkserver.PytestRun(c, cwd=cwd, env=env, merge=True) for c in cmds]
    done = []
    for cmd, proc in zip(cmds, procs, strict=True):
        out, _ = proc.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(cmd, proc.returncode, out, ""))
    return done


@dataclass
class Runs:
    root: Path
    base: Path
    whole: Path
    whole_exit: int
    shards: list[Path]
    shard_outputs: list[str]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """A baseline, the post-edit run on one machine (gated in-run), and the same run as three
    shards in three processes with three runs directories, all on one scripted fake."""
    root = tmp_path_factory.mktemp("scaleout")
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_RUN_ID", "CI_PIPELINE_ID")}
    with FakeAnthropic(script(BASE_FAILS)) as fake:
        env = {**env, **fake.env(SECRET), "PYTHONPATH": os.pathsep.join(sys.path)}
        [base] = run_all([pytest_cmd(root / "base-runs", "base")], env, root)
        assert (root / "base-runs" / "base" / "run.json").is_file(), base.stdout
        fake.policy = script(POST_FAILS).policy()
        whole_args = [f"--baseline={root / 'base-runs' / 'base'}", "--eval-gate=bar"]
        [whole] = run_all([pytest_cmd(root / "whole-runs", "whole", *whole_args)], env, root)
        shard_cmds = [
            pytest_cmd(
                root / f"shard{i}-runs",
                f"shard-{i}",
                f"--eval-shard={i}/3",
                f"--eval-run-group={GROUP}",
            )
            for i in (1, 2, 3)
        ]
        shard_runs = run_all(shard_cmds, env, root)
        for i, done in enumerate(shard_runs, start=1):
            assert (root / f"shard{i}-runs" / f"shard-{i}" / "run.json").is_file(), done.stdout
    yield Runs(
        root=root,
        base=root / "base-runs" / "base",
        whole=root / "whole-runs" / "whole",
        whole_exit=whole.returncode,
        shards=[root / f"shard{i}-runs" / f"shard-{i}" for i in (1, 2, 3)],
        shard_outputs=[done.stdout for done in shard_runs],
    )


def verdicts(run_dir: Path) -> dict[tuple[str, int | None], str | None]:
    return {k: s.verdict for k, s in ledger_reader.read_run(run_dir).scores().items()}


def copies(runs: Runs, tmp_path: Path) -> list[Path]:
    """Private copies of the three shards, safe to edit."""
    out = []
    for path in runs.shards:
        shutil.copytree(path, tmp_path / path.name)
        out.append(tmp_path / path.name)
    return out


def edit_info(run_dir: Path, **changes: Any) -> None:
    """Make a stored run one that closed with these run.json fields (sealed as such)."""
    path = run_dir / ledger.RUN_FILE
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data), encoding="utf-8")
    if data.get("status") not in (None, "running"):
        closed_as_is(run_dir)


def test_three_shards_merged_are_the_run_one_machine_made(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for index, shard in enumerate(runs.shards, start=1):
        info = ledger_reader.read_run_info(shard)
        assert info.run_group == GROUP and info.status == "complete"
        assert info.shard == {
            "index": index,
            "count": 3,
            "rule": "sha256(qid) mod N",
            "rateShare": "split",
            "rpm": 0,
            "tpm": 0,
        }
        assert {q for q, _ in verdicts(shard)} == {q for q in QUESTION if shard_of(q, 3) == index}
    merged = tmp_path / "merged"
    assert evalloop(["merge", *map(str, runs.shards), "-o", str(merged)]) == 0
    said = capsys.readouterr().out
    assert f"merged 3 of 3 shards of run group {GROUP}" in said and ": complete" in said
    # The same per-case verdicts as one machine's run.
    assert verdicts(merged) == verdicts(runs.whole)
    assert len(verdicts(merged)) == len(QUESTION)
    assert evalloop(["validate", str(merged)]) == 0
    info = ledger_reader.read_run_info(merged)
    assert info.status == "complete" and info.run_group == GROUP and info.shard is None
    assert [s["index"] for s in info.shards or []] == [1, 2, 3]
    assert info.merged and info.merged["complete"] and info.merged["missing"] == []
    # Costs and tokens add up over the shards.
    parts = [ledger_reader.read_run_info(s) for s in runs.shards]
    for role in ("answerer", "judge"):
        assert info.costs[role].calls == sum(p.costs[role].calls for p in parts)
        assert info.costs[role].input_tokens == sum(p.costs[role].input_tokens for p in parts)
        # A role's cost is summed to the micro-dollar, rounded at each event
        # (`aggregates.role_costs`): the merged run's running sum and the shards' own can part
        # by half a micro-dollar per event added.
        calls = info.costs[role].calls
        assert info.costs[role].cost_usd == pytest.approx(
            sum(p.costs[role].cost_usd or 0 for p in parts), rel=0, abs=0.5e-6 * (calls + 1)
        )
    assert (
        info.costs["answerer"].calls
        == ledger_reader.read_run_info(runs.whole).costs["answerer"].calls
    )
    assert (info.totals or {}) == (ledger_reader.read_run_info(runs.whole).totals or {})
    # The artifacts came along, under the same layout.
    for attempt in ledger_reader.read_run(merged).of_kind("attempt"):
        assert (merged / attempt.prediction_path).is_file()
    # The same flip table against the baseline.
    base = run_view(read_compared(runs.base))
    one, many = (
        compare(base, run_view(read_compared(runs.whole))),
        compare(base, run_view(read_compared(merged))),
    )
    assert [f.qid for f in many.better] == [f.qid for f in one.better] == sorted(BASE_FAILS)
    assert [f.qid for f in many.worse] == [f.qid for f in one.worse] == sorted(POST_FAILS)
    # The same gate exit status: the in-run gate's on one machine, `evalloop gate` after merging.
    assert runs.whole_exit == EXIT_GATE_REJECTED
    summary = tmp_path / "summary.md"
    code = evalloop(
        ["gate", str(runs.base), str(merged), "--eval-gate=bar", f"--eval-summary-md={summary}"]
    )
    out = capsys.readouterr().out
    assert code == runs.whole_exit, out
    assert "gate bar: REJECTED" in out
    assert "**Gate: rejected**" in summary.read_text(encoding="utf-8")
    # The report, the runs index and the summary show one run with its shards listed.
    note = f"merged 3 of 3 shards of run group {GROUP} (1: shard-1, 2: shard-2, 3: shard-3)"
    assert note in (merged / "report.html").read_text(encoding="utf-8")
    assert note in (tmp_path / "index.html").read_text(encoding="utf-8")
    assert note in summary.read_text(encoding="utf-8")
    recorded = ledger_reader.read_run_info(merged).gate or {}
    assert recorded["decision"] == "rejected" and recorded["better"] == 5
    assert recorded["worse"] == 4
    # And `evalloop flips --gate` says the same.
    assert evalloop(["flips", str(runs.base), str(merged), "--gate=bar"]) == EXIT_GATE_REJECTED


def test_every_view_prints_the_same_shards_line(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import html

    merged = tmp_path / "merged"
    assert evalloop(["merge", *map(str, runs.shards), "-o", str(merged)]) == 0
    merge_out = capsys.readouterr().out
    note = f"merged 3 of 3 shards of run group {GROUP} (1: shard-1, 2: shard-2, 3: shard-3)"
    assert shard_note(ledger_reader.read_run_info(merged)) == note
    # The terminal: `evalloop merge` and `evalloop report` print the summary's shards line.
    assert evalloop(["report", str(merged)]) == 0
    report_out = capsys.readouterr().out
    for out in (merge_out, report_out):
        assert [ln for ln in out.splitlines() if ln.startswith("shards:")] == [f"shards: {note}"]
    # report.html: the same line, as the header's `shards` row.
    page = (merged / "report.html").read_text(encoding="utf-8")
    assert f"<tr><th>shards</th><td><code>{html.escape(note)}</code></td></tr>" in page
    # The Markdown summary: the same line, as a list item.
    summary = tmp_path / "summary.md"
    evalloop(["gate", str(runs.base), str(merged), f"--eval-summary-md={summary}"])
    capsys.readouterr()
    lines = summary.read_text(encoding="utf-8").splitlines()
    assert [ln for ln in lines if ln.startswith("- shards:")] == [f"- shards: {note}"]
    # A shard's own terminal summary says which shard it is.
    for index, out in enumerate(runs.shard_outputs, start=1):
        assert f"shards: shard {index}/3 of run group {GROUP}" in out.splitlines(), out


def test_a_gate_over_one_shard_alone_refuses(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    # The comparability rule refuses it: nothing whole was measured to decide on (exit 7).
    assert evalloop(["gate", str(runs.base), str(runs.shards[0])]) == EXIT_HARNESS_FAILURE
    out = " ".join(capsys.readouterr().out.split())
    assert "REFUSED" in out and "is shard 1/3 of a sharded run" in out
    assert "evalloop merge" in out
    code = evalloop(["flips", str(runs.base), str(runs.shards[1]), "--gate=bar"])
    assert code == EXIT_HARNESS_FAILURE
    assert "is shard 2/3 of a sharded run" in " ".join(capsys.readouterr().out.split())
    # Without a gate, the flips of a shard are still shown (a look, not a decision).
    assert evalloop(["flips", str(runs.base), str(runs.shards[1])]) == 0


def test_a_missing_shard_refuses_the_merge_or_makes_an_aborted_run(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "merged"
    two = [str(runs.shards[0]), str(runs.shards[2])]
    assert evalloop(["merge", *two, "-o", str(out)]) == merge.EXIT_MISSING
    err = capsys.readouterr().err
    assert "not merged: missing shard(s) 2/3" in err and "--partial" in err
    assert not out.exists() and not list(tmp_path.iterdir())
    assert evalloop(["merge", *two, "-o", str(out), "--partial"]) == 0
    info = ledger_reader.read_run_info(out)
    assert info.status == "aborted"
    assert info.abort_reason == "partial merge: missing shard(s) 2/3"
    assert evalloop(["validate", str(out)]) == 0
    # An aborted run is a harness failure to the gate, as a run that aborted on its own is.
    assert evalloop(["gate", str(runs.base), str(out)]) == EXIT_HARNESS_FAILURE


def test_a_shard_under_another_judge_model_refuses_the_merge(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = copies(runs, tmp_path)
    edit_info(shards[1], judgeModel="claude-haiku-4-5")
    code = evalloop(["merge", *map(str, shards), "-o", str(tmp_path / "merged")])
    err = capsys.readouterr().err
    assert code == merge.EXIT_PIN_MISMATCH
    assert "pin judgeModel differs between shards" in err
    assert f"claude-haiku-4-5 in shard(s) 2/3 ({shards[1]})" in err
    assert not (tmp_path / "merged").exists()


def test_a_case_in_two_shards_refuses_the_merge(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = copies(runs, tmp_path)
    # Shard 1's lines appended to shard 2's ledger: its cases are now in both.
    with open(shards[1] / ledger.EVENTS_FILE, "ab") as handle:
        handle.write((shards[0] / ledger.EVENTS_FILE).read_bytes())
    closed_as_is(shards[1])  # a shard that closed so (unsealed, it would not even validate)
    code = evalloop(["merge", *map(str, shards), "-o", str(tmp_path / "merged")])
    err = capsys.readouterr().err
    assert code == merge.EXIT_CASE_TWICE
    assert "is in two shards" in err and "shard 1/3" in err and "shard 2/3" in err


def test_two_shards_claiming_one_index_and_another_run_group_are_refused(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = copies(runs, tmp_path)
    twin = tmp_path / "shard-1-again"
    shutil.copytree(shards[0], twin)
    code = evalloop(["merge", *map(str, shards), str(twin), "-o", str(tmp_path / "m")])
    assert code == merge.EXIT_INDEX_TWICE
    assert "both claim shard 1/3" in capsys.readouterr().err
    edit_info(shards[2], runGroup="ci-run-78")
    code = evalloop(["merge", *map(str, shards), "-o", str(tmp_path / "m")])
    assert code == merge.EXIT_OTHER_RUN
    assert "of run group 'ci-run-78'" in capsys.readouterr().err
    # Distinct statuses, so a CI step can tell them apart.
    codes = {
        merge.EXIT_MISSING,
        merge.EXIT_PIN_MISMATCH,
        merge.EXIT_CASE_TWICE,
        merge.EXIT_INDEX_TWICE,
        merge.EXIT_OTHER_RUN,
        merge.EXIT_INVALID,
        merge.EXIT_USAGE,
    }
    assert len(codes) == 7 and not codes & {0, EXIT_GATE_REJECTED, EXIT_HARNESS_FAILURE}


def test_a_shard_resumes_only_as_itself(runs: Runs, tmp_path: Path) -> None:
    # Before: `--eval-resume` compared the design and the pins but not the shard, so shard 2
    # resumed as shard 1 (or with no --eval-shard) answered other shards' cases into shard 2's
    # ledger, and another run group's merge took it in.
    run_dir = tmp_path / "runs" / "shard-2"
    shutil.copytree(runs.shards[1], run_dir)
    edit_info(run_dir, status="interrupted")
    scored = verdicts(run_dir)

    def resume(*args: str) -> list[str]:
        return pytest_cmd(run_dir.parent, "shard-2", *args, resume=True)

    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_RUN_ID", "CI_PIPELINE_ID")}
    refusals = {
        ("--eval-shard=1/3", f"--eval-run-group={GROUP}"): (
            "--eval-shard: run has 2/3, this session 1/3"
        ),
        ("--eval-shard=2/4", f"--eval-run-group={GROUP}"): (
            "--eval-shard: run has 2/3, this session 2/4"
        ),
        ("--eval-shard=2/3", "--eval-run-group=ci-run-78"): (
            "--eval-run-group: run has 'ci-run-77', this session 'ci-run-78'"
        ),
        (f"--eval-run-group={GROUP}",): "--eval-shard: run has 2/3, this session no shard",
    }
    with FakeAnthropic(script(POST_FAILS)) as fake:
        env = {**env, **fake.env(SECRET), "PYTHONPATH": os.pathsep.join(sys.path)}
        done = run_all([resume(*args) for args in refusals], env, tmp_path)
        for refused, shown in zip(done, refusals.values(), strict=True):
            assert refused.returncode == pytest.ExitCode.USAGE_ERROR, refused.stdout
            assert (
                f"--eval-resume=shard-2: shard-2 was started with another design ({shown})"
                in refused.stdout
            ), refused.stdout
            assert "Traceback" not in refused.stdout
        # Nothing was answered or judged, and the run is still the interrupted shard 2.
        assert fake.calls() == []
        assert ledger_reader.read_run_info(run_dir).status == "interrupted"
        # As itself, the shard resumes and closes, with its own cases only.
        [again] = run_all([resume("--eval-shard=2/3", f"--eval-run-group={GROUP}")], env, tmp_path)
    # Its carried verdicts are its items' outcomes: a case the judge failed fails again.
    failing = any(shard_of(q, 3) == 2 for q in POST_FAILS)
    assert again.returncode == (pytest.ExitCode.TESTS_FAILED if failing else 0), again.stdout
    assert "this session answered 0 of the run's" in again.stdout
    assert ledger_reader.read_run_info(run_dir).status == "complete"
    assert verdicts(run_dir) == scored
    assert {q for q, _ in scored} == {q for q in QUESTION if shard_of(q, 3) == 2}


def test_an_unsharded_run_does_not_merge(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = evalloop(["merge", str(runs.whole), "-o", str(tmp_path / "m")])
    assert code == merge.EXIT_OTHER_RUN
    assert "not a shard" in capsys.readouterr().err


def test_the_in_run_gate_of_a_shard_refuses(runs: Runs, tmp_path: Path) -> None:
    with FakeAnthropic(script(POST_FAILS)) as fake:
        env = {**os.environ, **fake.env(SECRET), "PYTHONPATH": os.pathsep.join(sys.path)}
        cmd = pytest_cmd(
            tmp_path / "runs",
            "gated-shard",
            "--eval-shard=3/3",
            f"--eval-run-group={GROUP}",
            f"--baseline={runs.base}",
            "--eval-gate=bar",
        )
        [done] = run_all([cmd], env, tmp_path)
    # Known before the first request: one usage error, nothing paid for.
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "--eval-shard=3/3" in said and "decides on whole runs" in said
    assert not fake.calls()


@pytest.mark.parametrize("kind", ["link", "pipe"])
def test_a_shard_whose_artifacts_hold_a_link_or_a_pipe_refuses_the_merge(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    # Found by the hostile pass: the seal counts regular files only, so a link planted among a
    # shard's artifacts (to /proc/self/environ, say) was copied, target bytes and all, into a
    # freshly sealed merged run that validated.
    shards = copies(runs, tmp_path)
    secret = tmp_path / "outside-secret.txt"
    secret.write_text("ANTHROPIC_API_KEY=sk-not-for-a-run\n")
    folder = next(p for p in (shards[0] / "artifacts").iterdir() if p.is_dir())
    planted = folder / "notes.json"
    if kind == "link":
        planted.symlink_to(secret)
    else:
        os.mkfifo(planted)
    code = evalloop(["merge", *map(str, shards), "-o", str(tmp_path / "merged")])
    err = capsys.readouterr().err
    assert code == merge.EXIT_INVALID
    assert "its artifacts hold what no run writes" in err and "notes.json" in err
    assert not (tmp_path / "merged").exists()
