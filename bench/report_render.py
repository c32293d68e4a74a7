"""CPU seconds to build and render the report of a 10,000-case run, alone and against a
10,000-case baseline (issue 17: "10,000 cases render in under 5 s").

    .venv/bin/python bench/report_render.py              # 10,000 cases, median of 3
    .venv/bin/python bench/report_render.py --cases 2000 --repeat 5 --keep

The runs are those of tests/test_report.py's 10,000-case test: two real runs of six of the
example set's cases against the loopback fake endpoint (the baseline and the current run of
tests/reportruns.py, three cases flipping), their per-case events and the set's rows repeated
to N cases (qids `<qid>_<i>`). Each measurement is a fresh process that times `report.build`
and `report_html.render` with `time.process_time`, plus the CPU of the child process that
draws the charts (reaped after the render), so the figure is CPU, which a shared machine inflates far less than wall;
wall is printed beside it. A run's read cache is removed before each measurement.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def measure(runs_dir: Path, pair: bool) -> dict[str, float]:
    """One build + render in this process (the child's side)."""
    from pytest_evalloop.report import charts
    from pytest_evalloop.report.html import render
    from pytest_evalloop.report.report import build

    for cache in runs_dir.glob("*/*.cache.json"):
        cache.unlink()
    wall, cpu = time.perf_counter(), time.process_time()
    report = build(runs_dir / "current", baseline_dir=runs_dir / "baseline" if pair else None)
    html = render(report)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # The charts are drawn in a child process: stopped (so reaped), its CPU is added too.
    charts.shutdown()
    drawn = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu += drawn.ru_utime + drawn.ru_stime
    return {
        "cpu": cpu,
        "wall": wall,
        "mb": len(html.encode("utf-8")) / 1e6,
        "cases": len(report.cases),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases per run (10,000)")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per figure (3)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--measure", nargs=2, metavar=("RUNS_DIR", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(Path(args.measure[0]), args.measure[1] == "pair")))
        return 0
    sys.path.insert(0, str(REPO))
    from tests.reportruns import repeated_runs, two_runs

    work = Path(tempfile.mkdtemp(prefix="evalloop-report-bench-"))
    try:
        print(f"two runs of six cases, then {args.cases} cases each, in {work}", file=sys.stderr)
        set_dir, before, current, _ = two_runs(work / "small")
        big = repeated_runs(
            set_dir, {"baseline": before, "current": current}, work / "evals" / "big", args.cases
        )
        for mode, title in (("single", "alone"), ("pair", "against a baseline of as many")):
            figures = []
            for _ in range(args.repeat):
                child = [sys.executable, __file__, "--measure", str(big / "runs"), mode]
                done = subprocess.run(child, capture_output=True, text=True, check=True, cwd=REPO)
                figures.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"  {mode}: {figures[-1]}", file=sys.stderr)
            cpu = statistics.median(f["cpu"] for f in figures)
            wall = statistics.median(f["wall"] for f in figures)
            print(
                f"report of {figures[0]['cases']} cases, {title}: {cpu:.2f} s CPU, {wall:.2f} s "
                f"wall (median of {args.repeat}), {figures[0]['mb']:.1f} MB"
            )
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
