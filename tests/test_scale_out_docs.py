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
from typing import Any

import pytest
import yaml

from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.sets.partition import parse_shard
from pytest_evalloop.testing import FakeAnthropic
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
        base = subprocess.run(
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
            capture_output=True,
            text=True,
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
