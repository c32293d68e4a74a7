"""Throughput benchmark of pytest-evalloop against the fake endpoint, beside inspect-ai.

    .venv/bin/python bench/throughput.py [--cases N --latency S --concurrency C --quick]

A benchmark, not a test: it prints figures measured side by side in one run on this machine
(see bench/README.md for what each figure means and the targets they are read against).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ledgers  # noqa: E402 - bench/ modules, importable once the line above ran
import processes  # noqa: E402
import workload  # noqa: E402
from processes import Measured  # noqa: E402

from pytest_evalloop.options import DEFAULT_ANSWERER_MODEL  # noqa: E402
from pytest_evalloop.testing import FakeAnthropicProcess  # noqa: E402

TARGETS = {
    "wall/ideal": 1.15,
    "vs serial": 30.0,
    "vs -n 4": 8.0,
    "cpu ms/case": 15.0,
    "rss MB": 300.0,
    "collect s": 2.0,
    "flips s": 1.0,
    "rpm error": 0.05,
    "ours/floor": 1.10,
    "cpu over floor ms": 6.0,
    "nW ours/floor": 1.15,
    "vs inspect": 4.0,
    # Issue 49: peak RSS may grow by at most this from 800 to 4,000 cases (the bench's N/5
    # run to its N run).
    "rss growth MB": 20.0,
}
EVALLOOP = Path(sys.executable).with_name("evalloop")
INSPECT = Path(sys.executable).with_name("inspect")
# inspect asks the fake for the model our answerer uses by default (the fake accepts any id).
PEER_MODEL = DEFAULT_ANSWERER_MODEL
# The pytest plugins an install of pytest-evalloop brings: its own, and those of the packages
# it depends on (pytest-xdist, syrupy, anyio through the SDKs). This checkout's venv also holds
# the suite's dev plugins (hypothesis, pytest-randomly, which imports numpy, pytest-html, ...):
# about 1.5 s of imports at every start that no user of the plugin alone pays. The bench loads
# only these by default; --dev-plugins measures with everything the venv autoloads.
INSTALLED_PLUGINS = ("evalloop", "xdist", "xdist.looponfail", "syrupy", "anyio")


@dataclass
class Run:
    """One measured configuration of one harness on the workload."""

    name: str
    cases: int
    processes: int
    concurrency: int
    calls: int
    measured: Measured
    latency: float
    passed: int = 0
    fake_cpu: float = 0.0
    """CPU the fake endpoint spent serving this run (not part of the harness's figures)."""
    startup: float | None = None
    """Seconds from starting the process to the fake receiving its first model call."""
    eval_phase: float | None = None
    """Seconds from the first model call to the last one's reply (last call + latency)."""

    @property
    def ideal(self) -> float:
        """Calls x latency / (concurrency x processes): the wall of a harness costing nothing."""
        return self.calls * self.latency / (self.concurrency * self.processes)

    @property
    def cpu_ms_per_case(self) -> float:
        """CPU of the run (all its processes) per case, in milliseconds."""
        return 1000.0 * self.measured.cpu / self.cases


@dataclass
class Results:
    """Every figure the bench measured, for the report."""

    runs: dict[str, Run] = field(default_factory=dict)
    serial_estimate: float | None = None
    serial_note: str = ""
    collect: list[Measured] = field(default_factory=list)
    """Repeated runs of the same command (a short wall is at the mercy of one hiccup)."""
    collect_cases: int = 0
    flips: list[Measured] = field(default_factory=list)
    flips_cases: int = 0
    rpm: str = "not available"
    rpm_ok: bool | None = None
    inspect: str = ""


class Bench:
    """Builds the workload, keeps the fake endpoint running, and measures child processes."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.latency: float = args.latency
        self.fake: FakeAnthropicProcess | None = None

    # --- the workload and the endpoint ---------------------------------------------------

    def make_set(self, name: str, cases: int) -> Path:
        """A synthetic set of `cases` cases in its own folder under the work dir."""
        return workload.make_set(self.work / name, cases)

    def start_fake(
        self, cases_file: Path, slow_every: int = 0, **extra: str
    ) -> FakeAnthropicProcess:
        """Start a fake endpoint playing the workload's script for `cases_file` (with
        `slow_every`, its uneven variant: see `workload.script_spec`)."""
        spec = self.work / f"spec-{len(list(self.work.glob('spec-*')))}.json"
        data = workload.script_spec(cases_file, self.latency, slow_every)
        spec.write_text(json.dumps(data), "utf-8")
        return processes.start_fake({"BENCH_SPEC": str(spec), **extra})

    def env(self, fake: FakeAnthropicProcess) -> dict[str, str]:
        """The children's environment: pointed at the fake, no plugin autoload surprises."""
        env = {**os.environ, **fake.env()}
        env.pop("PYTEST_ADDOPTS", None)
        env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        if not self.args.dev_plugins:
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        # Python's default: bytecode and pytest's rewritten plugin modules are cached after the
        # warm-up run. With this variable set (some shells and containers set it), every child
        # would compile and rewrite the package's modules again, a cost no installed use pays.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        return env

    def plugin_args(self) -> list[str]:
        """`-p` for each plugin an install brings (autoload is off; see INSTALLED_PLUGINS)."""
        if self.args.dev_plugins:
            return []
        return [arg for name in INSTALLED_PLUGINS for arg in ("-p", name)]

    # --- our harness -----------------------------------------------------------------------

    def pytest_run(
        self,
        name: str,
        set_dir: Path,
        cases: int,
        *,
        concurrency: int,
        workers: int = 0,
        extra: Sequence[str] = (),
        fake: FakeAnthropicProcess | None = None,
        check: bool = True,
        label: str | None = None,
    ) -> Run:
        """One measured `pytest <set>` run; with `check`, fails loudly unless every case passed.

        `name` is the report's row; `label` (default: `name`) is the run's `--eval-label`, which
        must be a valid name (it names the run's folder): the row may read as prose, the label not.
        """
        fake = fake or self.fake
        assert fake is not None
        fake.reset()
        cmd = [
            processes.PYTHON,
            "-m",
            "pytest",
            str(set_dir),
            "-q",
            "-p",
            "no:cacheprovider",
            *self.plugin_args(),
            f"--eval-concurrency={concurrency}",
            f"--eval-label={label or name}",
            # The set's own runs directory (the default, spelled out): the report finds the
            # set's rows there (its `../..`), questions, goldens and tags, as a user's does.
            f"--eval-runs-dir={set_dir / 'runs'}",
        ]
        if workers:
            cmd += ["-n", str(workers)]
        cmd += list(extra)
        budget = 300.0 + 3.0 * workload.CALLS_PER_CASE * cases * self.latency
        fake_cpu = processes.process_cpu(fake.process.pid)
        started = time.time()
        measured = processes.measure(cmd, self.env(fake), self.work, timeout=budget)
        fake_cpu = processes.process_cpu(fake.process.pid) - fake_cpu
        found = re.search(r"(\d+) passed", measured.output)
        passed = int(found.group(1)) if found else 0
        if check and (measured.returncode != 0 or passed != cases):
            raise RuntimeError(
                f"bench run {name!r} ({' '.join(cmd)}) did not pass all {cases} cases "
                f"(exit {measured.returncode}); its output ends:\n{measured.tail()}"
            )
        return self.stamped_run(
            Run(name, cases, max(workers, 1), concurrency, 0, measured, self.latency, passed),
            fake,
            started,
            fake_cpu,
        )

    def stamped_run(
        self, run: Run, fake: FakeAnthropicProcess, started: float, fake_cpu: float
    ) -> Run:
        """`run` with its calls, startup and eval phase read off the fake's request stamps."""
        stamps = [
            r.received_at for r in fake.requests() if r.path == "/v1/messages" and r.status == 200
        ]
        run.calls, run.fake_cpu = len(stamps), fake_cpu
        if stamps:
            run.startup = min(stamps) - started
            run.eval_phase = max(stamps) - min(stamps) + self.latency
        return run

    def collect_time(self, cases: int) -> Measured:
        """Wall of `pytest <set> --collect-only -q` over a synthetic set of `cases` cases."""
        set_dir = self.make_set("collect", cases)
        assert self.fake is not None
        cmd = [processes.PYTHON, "-m", "pytest", str(set_dir), "--collect-only", "-q"]
        cmd += ["-p", "no:cacheprovider", *self.plugin_args()]
        measured = processes.measure(cmd, self.env(self.fake), self.work, timeout=600)
        if measured.returncode != 0 or f"{cases} tests collected" not in measured.output:
            raise RuntimeError(
                f"collecting {cases} cases ({' '.join(cmd)}) failed (exit "
                f"{measured.returncode}); its output ends:\n{measured.tail()}"
            )
        return measured

    def flips_time(self, source: Path, cases: int, repeat: int) -> list[Measured]:
        """Walls of `evalloop flips A B` between two runs of `cases` cases grown from `source`.

        Every read of a run parses its events.jsonl (docs/ledger.md, "Nothing derived is
        read"), so there is one timing: no cached and uncached variants.
        """
        pair = [
            ledgers.grow_run(source, self.work / "flips" / "big-a", cases, no_match_every=97),
            ledgers.grow_run(source, self.work / "flips" / "big-b", cases, no_match_every=89),
        ]
        cmd = [str(EVALLOOP), "flips", *map(str, pair)]
        return [self._flips_once(cmd) for _ in range(repeat)]

    def _flips_once(self, cmd: list[str]) -> Measured:
        assert self.fake is not None
        measured = processes.measure(cmd, self.env(self.fake), self.work, timeout=600)
        if measured.returncode != 0 or "bench_case_" not in measured.output:
            raise RuntimeError(
                f"`{' '.join(cmd)}` failed (exit {measured.returncode}); its output ends:\n"
                f"{measured.tail()}"
            )
        return measured

    # --- the shared rate limit ---------------------------------------------------------------

    def rpm_check(self, rpm: int, cases: int) -> tuple[str, bool | None]:
        """Achieved requests/min under `--eval-rpm` with `-n 4`, against an enforcing endpoint."""
        if importlib.util.find_spec("pytest_evalloop.model_api.ratelimit") is None:
            return "not available (pytest_evalloop/model_api/ratelimit.py is not there yet)", None
        set_dir = self.make_set("rpm", cases)
        stamps = self.work / "rpm-stamps.txt"
        # The fake enforces the same limit with one second of burst, like a real endpoint.
        fake = self.start_fake(
            set_dir / "cases.jsonl",
            BENCH_RPM_LIMIT=str(rpm),
            BENCH_RPM_BURST=str(max(1, rpm // 60)),
            BENCH_STAMPS=str(stamps),
        )
        try:
            run = self.pytest_run(
                "rpm",
                set_dir,
                cases,
                concurrency=16,
                workers=4,
                extra=[f"--eval-rpm={rpm}"],
                fake=fake,
                check=False,
            )
        finally:
            fake.stop()
        text, ok = rpm_summary(stamps.read_text(encoding="utf-8"), rpm)
        if run.passed != cases:
            text += f"; only {run.passed} of {cases} cases passed (429s exhausted the retries)"
            ok = False
        info = json.loads((set_dir / "runs" / "rpm" / "run.json").read_text("utf-8"))
        if not info.get("limiter") and not ok:
            # No limiter record in run.json and a failed check: the flag did nothing yet.
            return (
                f"not available: --eval-rpm has no effect yet (no limiter in run.json); {text}",
                None,
            )
        return text, ok

    # --- the floor -----------------------------------------------------------------------------

    def floor_run(
        self,
        set_dir: Path,
        cases: int,
        concurrency: int,
        workers: int = 1,
        *,
        fake: FakeAnthropicProcess | None = None,
        name: str | None = None,
    ) -> Run:
        """The same model and tool calls made by the required SDKs alone (`bench/floor.py`).

        With `workers` > 1, the floor of `-n W`: that many processes, `concurrency` each.
        """
        fake = fake or self.fake
        assert fake is not None
        fake.reset()
        cmd = [
            processes.PYTHON,
            str(processes.BENCH_DIR / "floor.py"),
            str(set_dir / "cases.jsonl"),
        ]
        cmd += ["--concurrency", str(concurrency), "--processes", str(workers)]
        budget = 300.0 + 3.0 * workload.CALLS_PER_CASE * cases * self.latency
        fake_cpu = processes.process_cpu(fake.process.pid)
        started = time.time()
        measured = processes.measure(cmd, self.env(fake), self.work, budget)
        fake_cpu = processes.process_cpu(fake.process.pid) - fake_cpu
        if measured.returncode != 0 or f"floor: {cases} cases played" not in measured.output:
            raise RuntimeError(
                f"the floor run ({' '.join(cmd)}) failed (exit {measured.returncode}); its "
                f"output ends:\n{measured.tail()}"
            )
        name = name or ("floor (SDKs alone)" if workers == 1 else f"floor -n {workers}")
        run = Run(name, cases, workers, concurrency, 0, measured, self.latency, cases)
        return self.stamped_run(run, fake, started, fake_cpu)

    # --- the peer ------------------------------------------------------------------------------

    def inspect_run(self, set_dir: Path, cases: int, concurrency: int) -> Run | str:
        """The same workload through inspect-ai, or the reason it could not be measured."""
        if importlib.util.find_spec("inspect_ai") is None or not INSPECT.exists():
            return (
                "not measured (inspect-ai is not installed: pip install -r bench/requirements.txt)"
            )
        assert self.fake is not None
        self.fake.reset()
        cmd = [
            str(INSPECT),
            "eval",
            "inspect_task.py",  # inspect resolves task files relative to the working directory
            "-T",
            f"cases_file={set_dir / 'cases.jsonl'}",
            "--model",
            f"anthropic/{PEER_MODEL}",
            "--max-connections",
            str(concurrency),
            "--max-samples",
            str(concurrency),
            "--log-dir",
            str(self.work / "inspect-logs"),
            "--display",
            "plain",
        ]
        budget = 300.0 + 3.0 * workload.CALLS_PER_CASE * cases * self.latency
        fake_cpu = processes.process_cpu(self.fake.process.pid)
        measured = processes.measure(cmd, self.env(self.fake), processes.BENCH_DIR, budget)
        fake_cpu = processes.process_cpu(self.fake.process.pid) - fake_cpu
        calls = sum(1 for r in self.fake.requests() if r.path == "/v1/messages" and r.status == 200)
        if measured.returncode != 0 or "accuracy" not in measured.output:
            return f"not measured (inspect eval exited {measured.returncode}: {measured.tail(3)})"
        return Run(
            "inspect-ai", cases, 1, concurrency, calls, measured, self.latency, cases, fake_cpu
        )


def rpm_summary(stamps_text: str, rpm: int) -> tuple[str, bool]:
    """Achieved rate of served requests and the 429s seen, from the fake's request stamps."""
    stamps = [line.split() for line in stamps_text.splitlines() if line.strip()]
    served = sorted(float(t) for t, status in stamps if status == "200")
    limited = sorted(float(t) for t, status in stamps if status == "429")
    if len(served) < 2:
        return "not measured (fewer than two requests were served)", False
    achieved = (len(served) - 1) / (served[-1] - served[0]) * 60.0
    worst_second = max_in_window(limited, 1.0)
    error = abs(achieved - rpm) / rpm
    ok = error <= TARGETS["rpm error"] and worst_second <= 1
    text = (
        f"{achieved:.0f} req/min against --eval-rpm={rpm} ({100 * error:.1f}% off) over "
        f"{len(served)} requests; 429s: {len(limited)} (at most {worst_second} in one second)"
    )
    return text, ok


def median_wall(runs: Sequence[Measured]) -> tuple[float, str]:
    """The median wall of repeated runs, and every wall in the order measured (for the report)."""
    walls = [m.wall for m in runs]
    return statistics.median(walls), " / ".join(f"{w:.2f}" for w in walls)


def max_in_window(times: Sequence[float], width: float) -> int:
    """The most events that fall in any window of `width` seconds."""
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] > width:
            start += 1
        best = max(best, end - start + 1)
    return best


# --- the report --------------------------------------------------------------------------------


def run_rows(results: Results) -> list[str]:
    """One line per measured run: wall against ideal, CPU per case, peak RSS."""
    head = (
        f"{'configuration':<26}{'cases':>6}{'calls':>7}{'wall s':>9}{'ideal s':>9}"
        f"{'x ideal':>9}{'cpu s':>8}{'ms/case':>9}{'rss MB':>8}{'fake cpu s':>11}"
    )
    lines = [head, "-" * len(head)]
    for run in results.runs.values():
        m = run.measured
        lines.append(
            f"{run.name:<26}{run.cases:>6}{run.calls:>7}{m.wall:>9.2f}{run.ideal:>9.2f}"
            f"{m.wall / run.ideal:>9.2f}{m.cpu:>8.2f}{run.cpu_ms_per_case:>9.1f}"
            f"{m.max_rss_mb:>8.0f}{run.fake_cpu:>11.2f}"
        )
    return lines


def figure(label: str, value: str, verdict: bool | None, target: str) -> str:
    """One headline figure with its target and whether it was met."""
    mark = {True: "ok  ", False: "MISS", None: "    "}[verdict]
    return f"  {mark} {label:<40}{value:<52}(target {target})"


def headline(results: Results, args: argparse.Namespace) -> list[str]:
    """The figures the issue asks for, each beside its target."""
    runs = results.runs
    main, out = runs["evalloop"], []
    ratio = main.measured.wall / main.ideal
    out.append(figure("wall vs ideal", f"{ratio:.2f} x", ratio <= TARGETS["wall/ideal"], "<= 1.15"))
    if main.eval_phase is not None and main.startup is not None:
        # The whole process's wall includes interpreter start, imports and collection, which
        # no concurrency can hide; these split it so each part can be read on its own.
        phase = main.eval_phase / main.ideal
        text = f"{phase:.2f} x ideal ({main.eval_phase:.2f} s)"
        out.append(figure("  first call to last reply", text, None, "-"))
        out.append(figure("  start to first call", f"{main.startup:.2f} s", None, "-"))
    floor = runs.get("floor")
    if floor is not None:
        # What no harness on the required SDKs can beat here: if the floor misses a target,
        # so must everything built on it, and ours / floor is what the plugin itself adds.
        text = f"{floor.measured.wall / floor.ideal:.2f} x ideal ({floor.measured.wall:.2f} s)"
        out.append(figure("  floor: the SDKs alone", text, None, "-"))
        over = main.measured.wall / floor.measured.wall
        limit = TARGETS["ours/floor"]
        out.append(
            figure("  ours / the floor (wall)", f"{over:.2f} x", over <= limit, f"<= {limit}")
        )
        quiet = runs.get("report-off")
        if quiet is not None:
            text = f"{quiet.measured.wall / floor.measured.wall:.2f} x"
            out.append(figure("    ... with --eval-report=off", text, None, "-"))
        if floor.eval_phase is not None and floor.startup is not None:
            text = f"{floor.eval_phase / floor.ideal:.2f} x ideal; start to first call {floor.startup:.2f} s"
            out.append(figure("  floor: first call to last reply", text, None, "-"))
    uneven, its_floor = runs.get("uneven"), runs.get("floor-uneven")
    if uneven is not None and its_floor is not None:
        over = uneven.measured.wall / its_floor.measured.wall
        text = f"{over:.2f} x (every {args.uneven}th case {workload.SLOW_FACTOR}x slower)"
        out.append(figure("  uneven latency: ours / the floor", text, None, "-"))
    for key, run in runs.items():
        if key.startswith("evalloop-n"):
            ratio = run.measured.wall / run.ideal
            label = f"  under -n {run.processes}, {run.concurrency} in flight each"
            out.append(figure(label, f"{ratio:.2f} x ideal", None, "-"))
            its_floor = runs.get(f"floor-n{run.processes}")
            if its_floor is not None:
                over = run.measured.wall / its_floor.measured.wall
                limit = TARGETS["nW ours/floor"]
                text = (
                    f"{over:.2f} x (floor {its_floor.measured.wall:.2f} s, "
                    f"{its_floor.measured.wall / its_floor.ideal:.2f} x ideal)"
                )
                out.append(
                    figure("    ours / its floor (wall)", text, over <= limit, f"<= {limit}")
                )
    if results.serial_estimate is not None:
        speed = results.serial_estimate / main.measured.wall
        note = f"{speed:.1f} x{results.serial_note}"
        out.append(
            figure("faster than one-at-a-time", note, speed >= TARGETS["vs serial"], ">= 30")
        )
    if "n4" in runs:
        speed = runs["n4"].measured.wall / main.measured.wall
        out.append(figure("faster than -n 4 alone", f"{speed:.1f} x", speed >= 8.0, ">= 8"))
    cpu = main.cpu_ms_per_case
    out.append(figure("harness CPU per case", f"{cpu:.1f} ms", cpu <= 15.0, "<= 15 ms"))
    if floor is not None:
        out.append(figure("  floor: the SDKs alone", f"{floor.cpu_ms_per_case:.1f} ms", None, "-"))
        adds = cpu - floor.cpu_ms_per_case
        limit = TARGETS["cpu over floor ms"]
        out.append(
            figure("  ours over the floor", f"{adds:.1f} ms", adds <= limit, f"<= {limit:g} ms")
        )
        quiet = runs.get("report-off")
        if quiet is not None:
            text = f"{quiet.cpu_ms_per_case - floor.cpu_ms_per_case:.1f} ms"
            out.append(figure("    ... with --eval-report=off", text, None, "-"))
    small = runs.get("evalloop-small")
    if small is not None:
        marginal = 1000 * (main.measured.cpu - small.measured.cpu) / (main.cases - small.cases)
        out.append(figure("  marginal (startup excluded)", f"{marginal:.1f} ms", None, "-"))
    rss = main.measured.max_rss_mb
    out.append(figure("peak RSS per process", f"{rss:.0f} MB", rss <= 300.0, "<= 300 MB"))
    if small is not None:
        growth = rss - small.measured.max_rss_mb
        text = f"{growth:+.0f} MB from {small.cases} to {main.cases} cases"
        limit = TARGETS["rss growth MB"]
        out.append(figure("  RSS growth", text, growth <= limit, f"<= {limit:g} MB, N/5 -> N"))
    if results.collect:
        wall, spread = median_wall(results.collect)
        text = f"{wall:.2f} s ({results.collect_cases} cases; median of {spread})"
        out.append(figure("collect", text, wall < TARGETS["collect s"], "< 2 s"))
    if results.flips:
        wall, spread = median_wall(results.flips)
        text = f"{wall:.2f} s (2 x {results.flips_cases} cases; median of {spread})"
        out.append(figure("evalloop flips", text, wall < TARGETS["flips s"], "< 1 s"))
    out.append(figure(f"shared limit, -n 4, --eval-rpm={args.rpm}", "", results.rpm_ok, "+-5%"))
    out.append(f"         {results.rpm}")
    peer = runs.get("inspect-ai")
    if peer is not None:
        speed = peer.measured.wall / main.measured.wall
        limit = TARGETS["vs inspect"]
        out.append(
            figure(
                "inspect-ai wall on the same workload",
                f"{speed:.2f} x our wall",
                speed >= limit,
                f">= {limit:g} x",
            )
        )
        out.append(
            figure(
                "  inspect-ai wall vs ideal", f"{peer.measured.wall / peer.ideal:.2f} x", None, "-"
            )
        )
        out.append(
            figure("  inspect-ai CPU per sample", f"{peer.cpu_ms_per_case:.1f} ms", None, "-")
        )
    else:
        out.append(f"  inspect-ai: {results.inspect}")
    return out


def print_report(results: Results, args: argparse.Namespace, machine: str) -> None:
    """The table of runs, then the headline figures."""
    print()
    print(
        f"workload: {args.cases} cases x {workload.CALLS_PER_CASE} model calls "
        f"({workload.ANSWERER_CALLS} answerer, {workload.JUDGE_CALLS} judge; "
        f"{workload.TOOL_CALLS_PER_CASE} MCP tool calls) at {args.latency * 1000:.0f} ms per call, "
        f"concurrency {args.concurrency}; {machine}"
    )
    plugins = (
        "every plugin the venv autoloads (--dev-plugins)"
        if args.dev_plugins
        else "those an install brings: " + ", ".join(INSTALLED_PLUGINS)
    )
    print(f"pytest plugins: {plugins}")
    print("ideal = calls x latency / (concurrency x processes)")
    print()
    print("\n".join(run_rows(results)))
    print()
    print("\n".join(headline(results, args)))


# --- the command ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Options; --quick shrinks every default so the whole bench takes under two minutes."""
    parser = argparse.ArgumentParser(prog="bench/throughput.py", description=__doc__)
    parser.add_argument("--cases", type=int, help="cases in the workload (default 500; quick 100)")
    parser.add_argument("--latency", type=float, help="seconds per model call (0.2; quick 0.05)")
    parser.add_argument("--concurrency", type=int, default=64, help="cases in flight (64)")
    parser.add_argument("--quick", action="store_true", help="100 cases at 50 ms, smaller extras")
    parser.add_argument(
        "--serial-cases", type=int, help="cases the one-at-a-time run measures (100; quick 20)"
    )
    parser.add_argument("--collect-cases", type=int, default=10_000, help="cases to collect")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of the collect and flips timings (median)"
    )
    parser.add_argument("--rpm", type=int, default=600, help="shared requests/min limit")
    parser.add_argument("--rpm-cases", type=int, help="cases of the -n 4 limit run (100; quick 20)")
    parser.add_argument("--no-inspect", action="store_true", help="skip the inspect-ai run")
    parser.add_argument("--no-n4", action="store_true", help="skip the -n 4 alone run")
    parser.add_argument(
        "--dev-plugins",
        action="store_true",
        help="run pytest with every plugin this venv autoloads (the suite's dev plugins too), "
        "not only those an install of the plugin brings",
    )
    parser.add_argument(
        "--no-rpm", action="store_true", help="skip the shared-limit run (-n 4, --eval-rpm)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="also run the workload under -n W with C/W cases in flight per process "
        "(default: one per core; 1 skips it)",
    )
    parser.add_argument(
        "--uneven",
        type=int,
        default=16,
        metavar="K",
        help="also run ours and the floor with every K-th case's answerer calls "
        f"{workload.SLOW_FACTOR}x slower (default 16; 0 skips it)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dir and print it")
    args = parser.parse_args(argv)
    quick = args.quick
    args.cases = args.cases or (100 if quick else 500)
    args.latency = args.latency if args.latency is not None else (0.05 if quick else 0.2)
    if args.latency <= 0:
        # Every figure is read against the ideal wall, calls x latency / concurrency.
        parser.error(f"--latency={args.latency:g}: give a latency above 0 (seconds per call)")
    args.serial_cases = min(args.cases, args.serial_cases or (20 if quick else 100))
    args.rpm_cases = args.rpm_cases or (20 if quick else 100)
    if quick and args.workers == parser.get_default("workers"):
        args.workers = 1  # the -n W row is for the full run; quick keeps under two minutes
    return args


def measure_uneven(
    bench: Bench, results: Results, main_set: Path, args: argparse.Namespace
) -> None:
    """Ours and the floor over the same cases with every K-th case slow (`--uneven K`): a
    harness that starts a case only when an earlier one is reported, not when a slot frees,
    keeps slots empty behind each slow case (measured before the fix: 2.8x the wall)."""
    n, conc = args.cases, args.concurrency
    fake = bench.start_fake(main_set / "cases.jsonl", slow_every=args.uneven)
    try:
        results.runs["uneven"] = bench.pytest_run(
            f"evalloop, 1 in {args.uneven} slow",
            main_set,
            n,
            concurrency=conc,
            fake=fake,
            label="evalloop-uneven",
        )
        results.runs["floor-uneven"] = bench.floor_run(
            main_set, n, conc, fake=fake, name=f"floor, 1 in {args.uneven} slow"
        )
    finally:
        fake.stop()


def measure_all(bench: Bench, args: argparse.Namespace) -> Results:
    """Every run, in an order that keeps the big ones warm (data cache, bytecode)."""
    results = Results()
    n, conc = args.cases, args.concurrency
    main_set = bench.make_set("main", n)
    bench.fake = bench.start_fake(main_set / "cases.jsonl", BENCH_GRADER="inspect")
    step = progress()
    # The warm-up fills the data cache and bytecode; its wall is the fixed cost of one run.
    one = bench.pytest_run("warm-up", bench.make_set("warm", 1), 1, concurrency=1)
    step(f"warm-up (1 case): {one.measured.wall:.1f} s")
    small_n = max(1, n // 5)
    small = None
    if small_n < n:
        small = bench.pytest_run(
            "evalloop-small", bench.make_set("small", small_n), small_n, concurrency=conc
        )
        step(f"{small_n} cases at concurrency {conc}: {small.measured.wall:.1f} s")
    main = bench.pytest_run("evalloop", main_set, n, concurrency=conc)
    step(f"{n} cases at concurrency {conc}: {main.measured.wall:.1f} s")
    results.runs = {"evalloop": main}
    # Right after the headline, so both see the machine in the same state.
    floor = bench.floor_run(main_set, n, conc)
    results.runs["floor"] = floor
    step(f"floor, the SDKs alone, {n} cases: {floor.measured.wall:.1f} s")
    # The same run without the HTML report its close writes: what the report itself costs.
    quiet = bench.pytest_run(
        "evalloop, report off",
        main_set,
        n,
        concurrency=conc,
        extra=["--eval-report=off"],
        label="evalloop-report-off",
    )
    results.runs["report-off"] = quiet
    step(f"{n} cases with --eval-report=off: {quiet.measured.wall:.1f} s")
    if small is not None:
        results.runs["evalloop-small"] = small
    if args.uneven:
        measure_uneven(bench, results, main_set, args)
        step(
            f"uneven: ours {results.runs['uneven'].measured.wall:.1f} s, "
            f"floor {results.runs['floor-uneven'].measured.wall:.1f} s"
        )
    k = args.serial_cases
    serial = bench.pytest_run("serial", bench.make_set("serial", k), k, concurrency=1)
    results.runs["serial"] = serial
    fixed = one.measured.wall
    results.serial_estimate = serial.measured.wall
    if k < n:
        results.serial_estimate = fixed + (serial.measured.wall - fixed) * n / k
        results.serial_note = f" (serial measured on {k} cases, scaled to {n})"
    step(f"{k} cases one at a time: {serial.measured.wall:.1f} s")
    if args.workers > 1:
        per = max(1, conc // args.workers)
        name = f"evalloop-n{args.workers}"
        results.runs[name] = bench.pytest_run(
            name, main_set, n, concurrency=per, workers=args.workers
        )
        step(
            f"{n} cases under -n {args.workers} --eval-concurrency={per}: "
            f"{results.runs[name].measured.wall:.1f} s"
        )
        # Right after it, as the headline's floor is: the same calls over W SDK-only processes.
        key = f"floor-n{args.workers}"
        results.runs[key] = bench.floor_run(main_set, n, per, workers=args.workers)
        step(f"floor under {args.workers} processes: {results.runs[key].measured.wall:.1f} s")
    if not args.no_n4:
        results.runs["n4"] = bench.pytest_run("n4", main_set, n, concurrency=1, workers=4)
        step(f"{n} cases under -n 4 --eval-concurrency=1: {results.runs['n4'].measured.wall:.1f} s")
    results.collect_cases = args.collect_cases
    results.collect = [bench.collect_time(args.collect_cases) for _ in range(args.repeat)]
    step(f"collect {args.collect_cases}: {median_wall(results.collect)[1]} s")
    results.flips_cases = args.collect_cases
    results.flips = bench.flips_time(
        main_set / "runs" / "evalloop", args.collect_cases, args.repeat
    )
    step(f"flips 2 x {args.collect_cases}: {median_wall(results.flips)[1]} s")
    if args.no_rpm:
        results.rpm = "not measured (--no-rpm)"
    else:
        results.rpm, results.rpm_ok = bench.rpm_check(args.rpm, args.rpm_cases)
        step(f"shared limit: {results.rpm}")
    if args.no_inspect:
        results.inspect = "not measured (--no-inspect)"
    else:
        peer = bench.inspect_run(main_set, n, conc)
        if isinstance(peer, Run):
            results.runs["inspect-ai"] = peer
            step(f"inspect-ai {n} samples: {peer.measured.wall:.1f} s")
        else:
            results.inspect = peer
            step(f"inspect-ai: {peer}")
    return results


def progress() -> Callable[[str], None]:
    """A printer of progress lines to stderr, so the report on stdout stays clean."""

    def step(text: str) -> None:
        print(f"  .. {text}", file=sys.stderr, flush=True)

    return step


def machine_line(load_before: float, work: Path) -> str:
    """Cores, Python, load and the work folder's filesystem, so a figure is never read without
    the machine it came from."""
    load_after = os.getloadavg()[0]
    return (
        f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, load average "
        f"{load_before:.1f} at the start and {load_after:.1f} at the end (other work on the "
        f"machine inflates wall times; CPU figures hold better); runs written to "
        f"{filesystem_of(work)} (a run makes 5 files and folders a case: see README.md, "
        "'Issue 49, eleventh pass')"
    )


def filesystem_of(path: Path) -> str:
    """The type and mount point of the filesystem `path` lies on (from /proc/self/mounts), or
    'an unknown filesystem'."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return "an unknown filesystem"
    where = str(path.resolve())
    best = ("", "")
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, parts[2])
    return f"{best[1]} at {best[0]}" if best[0] else "an unknown filesystem"


def main(argv: Sequence[str] | None = None) -> int:
    """Run every measurement and print the report; exit 0 even when a target is missed."""
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="evalloop-bench-"))
    bench = Bench(args, work)
    load = os.getloadavg()[0]
    try:
        results = measure_all(bench, args)
        print_report(results, args, machine_line(load, work))
    finally:
        if bench.fake is not None:
            bench.fake.stop()
        if args.keep:
            print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
