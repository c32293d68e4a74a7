"""docs/scale-out.md's examples work: the GitHub Actions workflow's steps run with N = 3 shard
processes against the loopback fake, and the Kubernetes indexed Job deals indexes 1..N."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.measure import comparable
from pytest_evalloop.measure.gate import EXIT_GATE_REJECTED, EXIT_HARNESS_FAILURE
from pytest_evalloop.measure.shardrule import shard_note
from pytest_evalloop.scale import merge
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.sets.partition import parse_shard
from pytest_evalloop.testing import FakeAnthropic
from tests import forkserver
from tests.conftest import EXAMPLE_SET, REPO, SECRET
from tests.test_merge import BASE_FAILS, script

DOC = REPO / "docs" / "scale-out.md"
RUN_ID = "4242"
SKIPPED_USES = ("actions/checkout", "actions/setup-python")


def yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def expand(text: str, matrix: dict[str, Any]) -> str:
    """What Actions substitutes before a step runs: matrix values, the run id, secrets."""
    text = text.replace("${{ github.run_id }}", RUN_ID)
    text = text.replace("${{ secrets.ANTHROPIC_API_KEY }}", SECRET)
    for key, value in matrix.items():
        text = text.replace(f"${{{{ matrix.{key} }}}}", str(value))
    assert "${{" not in text, f"an expression this test does not stand in for: {text}"
    return text


class Runner:
    """Plays a job's steps in a checkout: `run` steps through bash, the artifact actions as
    copies into one artifact store, the set-up steps skipped (this interpreter has the
    package)."""

    def __init__(self, repo: Path, store: Path, env: dict[str, str]) -> None:
        self.repo, self.store, self.env = repo, store, env

    def job(self, job: dict[str, Any], matrix: dict[str, Any], summary: Path) -> list[int]:
        codes = []
        for step in job["steps"]:
            uses = step.get("uses", "")
            args = {k: expand(str(v), matrix) for k, v in (step.get("with") or {}).items()}
            if uses.startswith(SKIPPED_USES) or step.get("run", "").startswith("pip install"):
                continue
            if uses.startswith("actions/upload-artifact"):
                shutil.copytree(self.repo / args["path"], self.store / args["name"])
            elif uses.startswith("actions/download-artifact"):
                pattern = args["pattern"].replace("*", ".*")
                for found in sorted(self.store.iterdir()):
                    if re.fullmatch(pattern, found.name):
                        shutil.copytree(found, self.repo / args["path"] / found.name)
            else:
                env = {**self.env, "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_RUN_ID": RUN_ID}
                env.update({k: expand(str(v), matrix) for k, v in (step.get("env") or {}).items()})
                done = subprocess.run(
                    ["bash", "-ec", expand(step["run"], matrix)],
                    cwd=self.repo,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                assert done.returncode == 0, f"{step.get('name')}: {done.stdout}{done.stderr}"
                codes.append(done.returncode)
        return codes


def test_the_github_workflow_runs_three_shards_merges_and_gates(tmp_path: Path) -> None:
    workflow = yaml.safe_load(yaml_blocks()[0])
    shard_job, gate_job = workflow["jobs"]["shard"], workflow["jobs"]["gate"]
    shards = shard_job["strategy"]["matrix"]["shard"]
    assert shards == [1, 2, 3] and gate_job["needs"] == "shard"
    repo = tmp_path / "repo"
    set_dir = repo / "evals" / "ecommerce"
    set_dir.mkdir(parents=True)
    for name in ("set.json", "model.json", "cases.jsonl"):
        shutil.copy(EXAMPLE_SET / name, set_dir / name)
    (tmp_path / "store").mkdir()
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("CI_PIPELINE_ID", "EVALLOOP_RUN_GROUP")}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    summary = tmp_path / "step-summary.md"
    with FakeAnthropic(script(BASE_FAILS)) as fake:
        env.update(fake.env(SECRET))
        # The committed baseline: five cases failed.
        base = forkserver.run_pytest(
            [
                sys.executable,
                "-m",
                "pytest",
                str(set_dir),
                "-q",
                "-p",
                "no:cacheprovider",
                "--eval-label=baseline",
                "--eval-report=off",
            ],
            cwd=repo,
            env=env,
            timeout=600,
        )
        assert (set_dir / "runs" / "baseline" / "run.json").is_file(), base.stdout
        fake.policy = script(set()).policy()  # the change fixes them and breaks nothing
        runner = Runner(repo, tmp_path / "store", env)
        errors: list[BaseException] = []

        def one(value: int) -> None:
            try:
                runner.job(shard_job, {"shard": value}, summary)
            except BaseException as exc:  # noqa: BLE001 -- handed to the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(value,)) for value in shards]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        runner.job(gate_job, {}, summary)
    merged = set_dir / "runs" / f"merged-{RUN_ID}"
    info = ledger_reader.read_run_info(merged)
    assert info.status == "complete" and info.run_group == f"github-{RUN_ID}"
    assert [s["index"] for s in info.shards or []] == [1, 2, 3]
    assert (info.gate or {})["decision"] == "accepted"
    said = summary.read_text(encoding="utf-8")
    assert "**Gate: accepted**" in said
    assert f"merged 3 of 3 shards of run group github-{RUN_ID}" in said
    assert (tmp_path / "store" / "merged-run" / "report.html").is_file()
    assert "merged 3 of 3 shards" in (set_dir / "runs" / "index.html").read_text(encoding="utf-8")


def test_the_kubernetes_job_deals_indexes_one_to_n() -> None:
    job, gate = yaml.safe_load_all(yaml_blocks()[1])
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    [container] = spec["template"]["spec"]["containers"]
    command = container["args"][0]
    flag = re.search(r"--eval-shard=(\S+)", command)
    assert flag is not None
    count = spec["completions"]
    assert spec["parallelism"] == count
    dealt = [parse_shard(flag[1], {"JOB_COMPLETION_INDEX": str(i)}) for i in range(count)]
    assert [(s.index, s.count) for s in dealt] == [(i, count) for i in range(1, count + 1)]
    # Each pod's label (its run directory) is its 1-based index, as the shell expands it.
    label = re.search(r"--eval-label=(\S+)", command)
    assert label is not None
    for i in range(count):
        shown = subprocess.run(
            ["sh", "-c", f"echo {label[1]}"],
            env={"JOB_COMPLETION_INDEX": str(i)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert shown == f"shard-{i + 1}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["EVALLOOP_RUN_GROUP"] == job["metadata"]["name"]
    gate_args = gate["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "evalloop merge /runs/shard-*" in gate_args and "--eval-gate=bar" in gate_args


@pytest.mark.parametrize("needle", ["evalloop merge", "evalloop gate", "--eval-shard"])
def test_the_doc_is_linked_from_the_configuration_reference(needle: str) -> None:
    assert needle in DOC.read_text(encoding="utf-8")
    assert "scale-out.md" in (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_every_exit_status_the_doc_names_is_the_one_the_code_uses() -> None:
    rows = dict(
        re.findall(
            r"^\| (\d+) \| (.+) \|$",
            section("2. Merge: `evalloop merge <shard run>... -o <run dir>`"),
            re.M,
        )
    )
    said = {
        merge.EXIT_OK: "merged",
        merge.EXIT_INVALID: "does not validate",
        merge.EXIT_USAGE: "bad arguments",
        merge.EXIT_MISSING: "is missing",
        merge.EXIT_PIN_MISMATCH: "a pin differs between shards",
        merge.EXIT_CASE_TWICE: "a case is in two shards",
        merge.EXIT_INDEX_TWICE: "two shards claim one index",
        merge.EXIT_OTHER_RUN: "a shard of another run group",
    }
    assert sorted(map(int, rows)) == sorted(said)
    for code, words in said.items():
        assert words in rows[str(code)], (code, rows[str(code)])
    assert f"exit {EXIT_HARNESS_FAILURE})" in rows[str(merge.EXIT_MISSING)]
    gate = section(
        "3. Gate once, on the whole run: `evalloop gate <baseline> <merged> --eval-gate=bar`"
    )
    flat = " ".join(gate.split())
    assert (
        f"(0 accepted, {EXIT_GATE_REJECTED} rejected / unresolved / refused, "
        f"{EXIT_HARNESS_FAILURE} harness failure or runs that cannot carry a decision)" in flat
    )
    assert "**one shard alone refuses**" in flat
    assert f"before the first request (exit {int(pytest.ExitCode.USAGE_ERROR)})" in flat
    assert f"by the comparability rule (exit {EXIT_HARNESS_FAILURE}," in flat
    assert f"is a usage error (exit {int(pytest.ExitCode.USAGE_ERROR)})" in DOC.read_text(
        encoding="utf-8"
    )


def transcript() -> list[tuple[str, list[str], int]]:
    """The commands of "What it looks like", each with its output and exit status."""
    [block] = re.findall(r"```\n(\$ .*?)```", section("What it looks like"), re.DOTALL)
    steps: list[tuple[str, list[str], int]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], [], 0))
        elif (code := re.fullmatch(r"\(exit (\d+)\)", line)) is not None:
            steps[-1] = (steps[-1][0], steps[-1][1], int(code[1]))
        else:
            steps[-1][1].append(line)
    return steps


def test_the_transcript_is_what_the_code_prints_and_decides() -> None:
    steps = transcript()
    shard_steps = [s for s in steps if "--eval-shard=" in s[0]]
    assert len(shard_steps) == 3
    group = "github-4242"
    counts = []
    for index, (command, out, code) in enumerate(shard_steps, start=1):
        assert f"--eval-shard={index}/3" in command
        assert code == pytest.ExitCode.TESTS_FAILED  # some cases did not match; no gate
        info = SimpleNamespace(shard={"index": index, "count": 3}, run_group=group)
        assert f"shards: {shard_note(info)}" in out
        [verdicts] = [ln for ln in out if ln.startswith("verdicts: ")]
        counts.append(sum(int(n) for n in re.findall(r"(\d+) \w+", verdicts)))
    selected = [c for _, c in sets.load_cases(EXAMPLE_SET).rows if c.state == "selected"]
    assert sum(counts) == len(selected)
    by_verb = {
        c.split()[1] if c.startswith("evalloop") else c.split()[0]: (c, o, x) for c, o, x in steps
    }
    _, merged_out, merged_code = by_verb["merge"]
    assert merged_code == merge.EXIT_OK
    assert [f"  shard {i}/3: shard-{i} (complete), {n} cases" for i, n in enumerate(counts, 1)] == [
        ln.rsplit(",", 1)[0] for ln in merged_out if ln.startswith("  shard ")
    ]
    shards = [{"index": i, "runId": f"shard-{i}"} for i in (1, 2, 3)]
    merged = SimpleNamespace(shards=shards, merged={"count": 3, "missing": []}, run_group=group)
    assert f"shards: {shard_note(merged)}" in merged_out
    assert f"- shards: {shard_note(merged)}" in by_verb["cat"][1]
    assert "valid: 0 errors" in by_verb["validate"][1][0]
    gates = [s for s in steps if s[0].startswith("evalloop gate")]
    assert [code for _, _, code in gates] == [EXIT_GATE_REJECTED, EXIT_HARNESS_FAILURE]
    # One shard alone: the comparability rule's refusal, in its own words.
    alone = comparable.RunFacts(
        name="shard-1",
        run_id="shard-1",
        status="complete",
        shard={"index": 1, "count": 3},
        seal=None,
        selection={"whole": True},
    )
    [why] = comparable.alone(alone, "current")
    said = " ".join(" ".join(gates[1][1]).split())
    assert f"gate bar: REFUSED -- these runs cannot carry a decision: {why.text}" in said
    # The unsharded run: the same verdicts, the same flips and gate status, and no flip
    # against the merged run.
    [whole] = [s for s in steps if s[0].startswith("pytest") and "--eval-shard" not in s[0]]
    assert whole[2] == EXIT_GATE_REJECTED

    def line(out: list[str], start: str) -> list[str]:
        return [ln for ln in out if ln.startswith(start)]

    for start in ("verdicts: ", "answerer: ", "judge: "):
        assert line(whole[1], start) == line(merged_out, start)
    flips = [s for s in steps if s[0].startswith("evalloop flips")]
    table = "better (no_match -> match): 5   worse (match -> no_match): 4"
    assert table in flips[0][1] and table in whole[1]
    assert "better (no_match -> match): 0   worse (match -> no_match): 0" in flips[1][1]
    assert "gate bar: REJECTED" in " ".join(gates[0][1]) and "gate bar: REJECTED" in " ".join(
        whole[1]
    )
