"""The transcript in docs/scale-out.md ("What it looks like"): the example set as three shards
and as one run, on one scripted fake endpoint, with the doc's own commands.

    .venv/bin/python bench/scale_out.py [--keep DIR]

The scenario is tests/test_merge.py's: a baseline whose judge fails five cases, then a run
(sharded and not) that fixes those five and breaks four others, so the bar rejects (more than 3
worse). Prints each command as `$ command`, its output (a shard's pytest output cut to its
evalloop summary), and `(exit N)` when N is not 0. Not a test: tests/test_merge.py asserts
the same facts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "evals" / "ecommerce"
SET = "evals/ecommerce"
RUNS = f"{SET}/runs"
RUN_ID = "4242"
ORACLE = [
    {"tool": "get_context", "input": {"query": "{question}"}},
    {"tool": "execute_query", "input": {"sql": "{modelQuery}"}},
    {"text": "The answer follows.\n\nFinal query:\n```sql\n{modelQuery}\n```"},
]


def spec(no_match: set[str]) -> Any:
    from pytest_evalloop.sets import cases as sets
    from pytest_evalloop.testing import ScriptSpec

    question = {c.qid: c.question for _, c in sets.load_cases(EXAMPLE).rows}
    return ScriptSpec.model_validate(
        {
            "cases_file": str(EXAMPLE / sets.CASES_FILE),
            "answerer": {"default": ORACLE},
            "judge": {
                "default": {"verdict": "match"},
                "by_question": {question[q]: {"verdict": "no_match"} for q in no_match},
            },
        }
    )


def shard_command(index: int) -> str:
    """The workflow's shard step, as its job runs it (Actions expands the matrix value)."""
    return (
        f"pytest {SET} -q -p no:cacheprovider --eval-shard={index}/3 --eval-rpm=900 "
        f"--eval-runs-dir=shard-runs --eval-label=shard-{index} --eval-report=off"
    )


def evalloop_summary(out: str) -> list[str]:
    """A pytest run's output from its `evalloop:` sections on (the dots and the short summary
    of the NO_MATCH items before them left out)."""
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines) if " evalloop: " in line), 0)
    return lines[start:]


def show(
    command: str, done: subprocess.CompletedProcess[str], lines: list[str], work: Path
) -> None:
    print(f"$ {command}")
    for line in lines:
        # Paths as the commands gave them: relative to the checkout the jobs run in.
        print(line.replace(f"{work}/", ""))
    if done.returncode:
        print(f"(exit {done.returncode})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="Work in this directory and keep it")
    args = parser.parse_args(argv)
    from pytest_evalloop.sets import cases as sets
    from pytest_evalloop.testing import FakeAnthropic

    work = args.keep or Path(tempfile.mkdtemp(prefix="evalloop-scale-out-"))
    (work / SET).mkdir(parents=True, exist_ok=True)
    for name in ("set.json", "model.json", sets.CASES_FILE):
        shutil.copy(EXAMPLE / name, work / SET / name)
    selected = sorted(c.qid for _, c in sets.load_cases(EXAMPLE).rows if c.state == "selected")
    env = {k: v for k, v in os.environ.items() if k not in ("CI_PIPELINE_ID", "GITHUB_RUN_ID")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")

    def run(command: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command],
            cwd=work,
            env={**env, **(extra or {})},
            capture_output=True,
            text=True,
            timeout=900,
        )

    try:
        with FakeAnthropic(spec(set(selected[:5]))) as fake:
            env.update(fake.env("fake-key-not-a-secret"))
            base = run(f"pytest {SET} -q -p no:cacheprovider --eval-label=baseline")
            assert (work / RUNS / "baseline" / "run.json").is_file(), base.stdout
            fake.policy = spec(set(selected[5:9])).policy()
            # The matrix: three jobs at once, each its own runs directory (GITHUB_RUN_ID as
            # Actions sets it for every job of one workflow run).
            procs = [
                subprocess.Popen(
                    ["bash", "-c", shard_command(i)],
                    cwd=work,
                    env={**env, "GITHUB_RUN_ID": RUN_ID},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for i in (1, 2, 3)
            ]
            for index, proc in enumerate(procs, start=1):
                out, _ = proc.communicate(timeout=900)
                done = subprocess.CompletedProcess([], proc.returncode, out, "")
                show(
                    f"GITHUB_RUN_ID={RUN_ID} {shard_command(index)}",
                    done,
                    evalloop_summary(out),
                    work,
                )
            merged = f"{RUNS}/merged-{RUN_ID}"
            steps = [
                f"evalloop merge shard-runs/shard-* -o {merged}",
                f"evalloop validate {merged}",
                f"evalloop flips {RUNS}/baseline {merged}",
                f"evalloop gate {RUNS}/baseline {merged} --eval-gate=bar --eval-summary-md "
                "summary.md",
                "cat summary.md",
                f"evalloop gate {RUNS}/baseline shard-runs/shard-1 --eval-gate=bar",
            ]
            table: list[str] = []
            for command in steps:
                done = run(command)
                lines = (done.stdout + done.stderr).splitlines()
                if command.startswith("evalloop flips"):
                    table = lines[: next(i for i, ln in enumerate(lines) if "paired test" in ln)]
                elif command.startswith("evalloop gate") and table and lines[: len(table)] == table:
                    # The gate prints the flip table `evalloop flips` printed, line for line.
                    lines = [f"[the {len(table)} lines of the flip table above]"] + lines[
                        len(table) :
                    ]
                show(command, done, lines, work)
            whole = (
                f"pytest {SET} -q -p no:cacheprovider --eval-rpm=900 --eval-label=whole "
                f"--eval-report=off --baseline={RUNS}/baseline --eval-gate=bar"
            )
            done = run(whole)
            show(whole, done, evalloop_summary(done.stdout), work)
            same = f"evalloop flips {RUNS}/whole {merged}"
            done = run(same)
            show(same, done, (done.stdout + done.stderr).splitlines(), work)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
