"""Implement pytest-evalloop's hooks: react to each item's result and to each finished run.

Copy this file as the `conftest.py` at (or above) your set. It works with any answerer and
judge (the built-in ones or your own) and under xdist:

- `pytest_evalloop_item_result(item, result)` runs where the item ran (an xdist worker, or the
  only process), right after the attempt, with the `ItemResult` object
  (`pytest_evalloop/answer/pipeline.py`). Here it records the status and verdict as the item's
  `user_properties`, which travel with the reports to the controller and into `--junitxml`.
- `pytest_evalloop_run_finished(config, run_dir, results)` runs once per run on the controller,
  after `run.json` was closed and before the terminal summary, with the run's results as JSON
  dicts (the same fields as `ItemResult`). Here it writes one CSV row per attempt to
  `--summary-csv` (default `evalloop-summary.csv` in the rootdir) and keeps one line per
  `no_match`, which `pytest_terminal_summary` prints in a section of its own.

Hook names are checked against the plugin's hookspecs: a misspelt `pytest_evalloop_*` function
is an error at startup, not a hook that silently never runs.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

CSV_FIELDS = ("run", "qid", "sample", "status", "verdict", "reason", "recall", "final_query")
NO_MATCH_LINES = pytest.StashKey[list[str]]()
CSV_WRITTEN = pytest.StashKey[set[Path]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """The CSV's path: a conftest may add options like any plugin."""
    parser.addoption(
        "--summary-csv",
        default=None,
        help="Write one CSV row per eval attempt here (default: evalloop-summary.csv in rootdir)",
    )


def pytest_evalloop_item_result(item: pytest.Item, result: Any) -> None:
    """Attach the attempt's status and verdict to the item (worker)."""
    item.user_properties.append(("evalloop_status", result.status))
    item.user_properties.append(("evalloop_verdict", str(result.verdict)))


def pytest_evalloop_run_finished(
    config: pytest.Config, run_dir: Path, results: list[dict[str, Any]]
) -> None:
    """Append the run's attempts to the CSV; remember its no_match cases (controller)."""
    path = Path(config.getoption("summary_csv") or config.rootpath / "evalloop-summary.csv")
    written = config.stash.setdefault(CSV_WRITTEN, set())
    # A session may close several runs (one per set): the first one this session starts the file.
    mode = "a" if path in written else "w"
    written.add(path)
    with path.open(mode, newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, CSV_FIELDS, extrasaction="ignore")
        if mode == "w":
            writer.writeheader()
        for result in sorted(results, key=lambda r: (r["qid"], r["sample"] or 0)):
            writer.writerow({**result, "run": run_dir.name})
    lines = config.stash.setdefault(NO_MATCH_LINES, [])
    for result in results:
        if result["status"] == "no_match":
            lines.append(f"NO_MATCH {run_dir.name} {result['qid']}: {result['why'] or '(no why)'}")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print one line per no_match after the run (controller)."""
    lines = config.stash.get(NO_MATCH_LINES, [])
    if lines:
        terminalreporter.write_sep("-", f"no_match cases ({len(lines)})")
        for line in sorted(lines):
            terminalreporter.write_line(line)
