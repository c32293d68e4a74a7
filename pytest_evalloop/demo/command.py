"""`evalloop demo`: the command (see the package docstring for what it runs)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_evalloop.testing import ScriptSpec

SET_NAME = "ecommerce"
SET_FILES = ("set.json", "cases.jsonl", "model.json")
BASELINE = "demo-baseline"
CHANGED = "demo-change"
SAY = "evalloop demo:"
EXIT_INTERRUPTED = 130


def shipped(name: str) -> Path:
    """A file that ships in this folder of the package (the set's files are under `ecommerce/`)."""
    return Path(str(resources.files("pytest_evalloop.demo").joinpath(name)))


def demo_main(argv: list[str]) -> int:
    """`evalloop demo [--dir DIR]`."""
    parser = argparse.ArgumentParser(
        prog="evalloop demo",
        description="Run the example set twice against the loopback fake (no key, no network): "
        "a baseline, then a model doc changed and gated against it.",
    )
    parser.add_argument(
        "--dir", help="an empty or new folder to work in (default: a new temporary folder)"
    )
    args = parser.parse_args(argv)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="evalloop-demo-"))
    work = work.resolve()
    if work.exists() and (not work.is_dir() or any(work.iterdir())):
        print(
            f"{SAY} {work} is not an empty folder; give a new or empty folder with --dir",
            file=sys.stderr,
        )
        return 2
    try:
        (work / "evals").mkdir(parents=True, exist_ok=True)
    except OSError as error:
        print(
            f"{SAY} cannot write {work}: {error}; give a folder you can write with --dir",
            file=sys.stderr,
        )
        return 2
    return run_demo(work)


def run_demo(work: Path) -> int:
    """The demo in `work`; returns the gated run's exit status (see the module docstring), or
    130 after a Ctrl-C (the shell's code for it) once the run it stopped has closed."""
    try:
        return _run_demo(work)
    except KeyboardInterrupt:
        say(f"interrupted (Ctrl-C); the fake is stopped; what ran so far is in {work}")
        return EXIT_INTERRUPTED


def _run_demo(work: Path) -> int:
    from pytest_evalloop.testing import FakeAnthropic, ScriptSpec

    started = time.monotonic()
    set_dir = work / "evals" / SET_NAME
    set_dir.mkdir(parents=True)
    for name in SET_FILES:
        shutil.copyfile(shipped(f"{SET_NAME}/{name}"), set_dir / name)
    spec = ScriptSpec.load(shipped("spec.json"))
    change = json.loads(shipped("change.json").read_text(encoding="utf-8"))
    say(f"working in {work} (a copy of the example set; your own files are not touched)")
    with FakeAnthropic(spec) as fake:
        say(f"the fake Messages API listens on {fake.base_url} (loopback: no key, no network)")
        # The user's own endpoint variables stay out: every call goes to the fake.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        env.update(fake.env())
        say(f"1/2 the baseline: pytest evals/{SET_NAME} --eval-label={BASELINE}")
        first = _pytest(work, env, f"--eval-label={BASELINE}")
        if first not in (0, 1):
            say(f"the baseline run exited {first}; stopped (its output is above)")
            return first
        doc = apply_change(set_dir, change)
        fake.policy = after_change(spec, change["fixes"]).policy()
        say(f"{change['file']}: the doc of `{change['source']}` now ends {doc!r}")
        say(
            f"2/2 the change, gated: pytest evals/{SET_NAME} --eval-label={CHANGED} "
            f"--baseline={BASELINE} --eval-gate=bar"
        )
        second = _pytest(
            work, env, f"--eval-label={CHANGED}", f"--baseline={BASELINE}", "--eval-gate=bar"
        )
    say("the fake is stopped")
    for line in closing_lines(set_dir / "runs", second, time.monotonic() - started):
        say(line)
    return second


def say(line: str) -> None:
    """One line of the demo's own, flushed before a child run writes to the same terminal."""
    print(f"{SAY} {line}", flush=True)


def _pytest(work: Path, env: dict[str, str], *options: str) -> int:
    argv = [sys.executable, "-m", "pytest", f"evals/{SET_NAME}", "-p", "no:cacheprovider"]
    # A user's pytest-randomly would only add its seed line: eval items keep file order anyway.
    argv += ["-p", "no:randomly", *options]
    child = subprocess.Popen(argv, cwd=work, env=env)
    interrupted = False
    while True:
        try:
            code = child.wait()
        except KeyboardInterrupt:
            # The Ctrl-C reached the child too (one process group): let it close its run as
            # interrupted rather than kill it mid-write, as subprocess.run would.
            interrupted = True
            continue
        if interrupted:
            raise KeyboardInterrupt
        return code


def apply_change(set_dir: Path, change: dict[str, str]) -> str:
    """Append `change['append']` to the doc of one source of the copy's model; returns it."""
    path = set_dir / change["file"]
    model = json.loads(path.read_text(encoding="utf-8"))
    [source] = [s for s in model["sources"] if s["name"] == change["source"]]
    source["doc"] = f"{source['doc']} {change['append']}"
    path.write_text(json.dumps(model, indent=2) + "\n", encoding="utf-8")
    return change["append"]


def after_change(spec: ScriptSpec, fixed: list[str]) -> ScriptSpec:
    """The spec once the doc says what the fixed questions needed: their scripted misreadings
    and verdicts are gone, so the fake answers them as the golden does."""
    answerer = spec.answerer.model_copy(
        update={
            "by_question": {q: s for q, s in spec.answerer.by_question.items() if q not in fixed}
        }
    )
    judge = spec.judge.model_copy(
        update={"by_question": {q: s for q, s in spec.judge.by_question.items() if q not in fixed}}
    )
    return spec.model_copy(update={"answerer": answerer, "judge": judge})


def closing_lines(runs_dir: Path, exit_status: int, seconds: float) -> list[str]:
    """Where the report is and what the gate decided."""
    from pytest_evalloop.ledger import reader as ledger_reader

    gate: dict[str, object] = {}
    try:
        gate = ledger_reader.read_run_info(runs_dir / CHANGED).gate or {}
    except (OSError, ValueError):
        pass
    decision = gate.get("decision", "not recorded")
    return [
        f"done in {seconds:.0f} s",
        f"  report:     {runs_dir / CHANGED / 'report.html'} (the flips against {BASELINE})",
        f"  runs index: {runs_dir / 'index.html'}",
        f"  gate:       {decision} (bar), exit {exit_status}",
        "  your own set next: `evalloop init evals/<name>` (README, 'Use it in your project')",
    ]
