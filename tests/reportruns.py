"""Real runs of small copies of the example set, for the report's tests.

A run here is `pytest <set>` in a subprocess against the loopback fake endpoint, exactly as
tests/test_run.py runs them through pytester (whose fixture is per test; the browser tests
share their runs over a module, so they start the subprocess themselves).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from tests import forkserver
from tests.conftest import EXAMPLE_SET, NO_SHUFFLE, SECRET
from tests.test_run import ORACLE, make_set

QIDS = [
    "ecom_accounts_never_ordered",
    "ecom_average_order_value",
    "ecom_avg_age_2022_buyers",
    "ecom_avg_days_to_ship",
    "ecom_cancellation_rate",
    "ecom_order_count",
]
WRONG_BEFORE = QIDS[:2]
"""no_match in the baseline, match in the current run: the two `better` flips."""
WRONG_AFTER = QIDS[2:3]
"""match in the baseline, no_match in the current run: the `worse` flip."""

MARK = "XSSMARK"
PAYLOAD = (
    "<script>window.__pwned=1;alert('s1')</script>"
    "<img src=x onerror=\"window.__pwned=2;alert('s2')\">"
    "<a href=\"javascript:alert('s3')\">click me</a>"
    "</textarea></script><script>window.__pwned=3;console.log('PWNED')</script><!--"
)
"""Breakouts for every context run text can land in: markup, attributes, script, textarea."""
ROW_PAYLOAD = "<img src=x onerror=alert(9)></script><script>alert(10)</script>"
XSS_SQL = f"SELECT '{ROW_PAYLOAD}' AS \"</script><b onmouseover=alert(11)>col\""


def example_rows() -> dict[str, dict[str, Any]]:
    rows = {}
    for line in (EXAMPLE_SET / sets.CASES_FILE).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        rows[row["qid"]] = row
    return rows


def judge_spec(set_dir: Path, wrong: list[str], **extra: Any) -> ScriptSpec:
    """The oracle answerer; the judge says no_match (with a why) for the `wrong` qids."""
    rows = example_rows()
    judge = {
        "default": {"verdict": "match", "confidence": 9, "why": "the figure matches"},
        "by_question": {
            rows[q]["question"]: {"verdict": "no_match", "confidence": 8, "why": f"wrong on {q}"}
            for q in wrong
        },
    }
    data: dict[str, Any] = {
        "cases_file": str(set_dir / sets.CASES_FILE),
        "answerer": {"default": ORACLE},
        "judge": judge,
        **extra,
    }
    return ScriptSpec.model_validate(data)


def run_pytest(fake: FakeAnthropic, set_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`pytest <set_dir> args` in a subprocess pointed at the fake."""
    env = {
        **os.environ,
        "ANTHROPIC_BASE_URL": fake.base_url,
        "ANTHROPIC_API_KEY": SECRET,
    }
    env["PYTEST_ADDOPTS"] = NO_SHUFFLE  # a user's own options stay out; the order stays
    cmd = [sys.executable, "-m", "pytest", str(set_dir), "-p", "no:cacheprovider", "-q", *args]
    return forkserver.run_pytest(cmd, env=env, cwd=set_dir.parent.parent, timeout=600)


def two_runs(root: Path, *extra: str) -> tuple[Path, Path, Path, str]:
    """A baseline and a current run of a six-case set: (set_dir, baseline, current, stdout)."""
    set_dir = make_set(root, QIDS)
    with FakeAnthropic() as fake:
        fake.policy = judge_spec(set_dir, WRONG_BEFORE).policy()
        first = run_pytest(fake, set_dir, "--eval-label=before")
        assert (set_dir / "runs" / "before" / "report.html").is_file(), first.stdout + first.stderr
        fake.policy = judge_spec(set_dir, WRONG_AFTER).policy()
        second = run_pytest(fake, set_dir, "--eval-label=after", "--baseline=before", *extra)
        assert (set_dir / "runs" / "after" / "report.html").is_file(), second.stdout + second.stderr
    runs = set_dir / "runs"
    return set_dir, runs / "before", runs / "after", second.stdout


def repeated_runs(set_dir: Path, runs: dict[str, Path], big_set: Path, cases: int) -> Path:
    """A set of at least `cases` cases, `set_dir`'s rows repeated (qid `<qid>_<i>`), and each
    of `runs` (name: run directory) copied under `big_set/runs/<name>` with its per-case events
    repeated the same way; the artifacts stay the six cases' (every copy names its qid's).
    Returns `big_set`."""
    big_set.mkdir(parents=True)
    for name in ("set.json", "model.json"):
        shutil.copy(set_dir / name, big_set / name)
    rows = [json.loads(x) for x in (set_dir / sets.CASES_FILE).read_text().splitlines()]
    copies = -(-cases // len(rows))
    (big_set / sets.CASES_FILE).write_text(
        "".join(
            json.dumps({**c, "qid": f"{c['qid']}_{i}"}) + "\n" for i in range(copies) for c in rows
        )
    )
    for name, run_dir in runs.items():
        big = big_set / "runs" / name
        keep_out = shutil.ignore_patterns("report.html", "*.cache.json")
        shutil.copytree(run_dir, big, ignore=keep_out)
        lines = (run_dir / ledger.EVENTS_FILE).read_text(encoding="utf-8").splitlines()
        per_case = [e for e in map(json.loads, lines) if e.get("qid")]
        out = [json.dumps({**e, "qid": f"{e['qid']}_{i}"}) for i in range(copies) for e in per_case]
        (big / ledger.EVENTS_FILE).write_text("\n".join(out) + "\n", encoding="utf-8")
    return big_set


def xss_run(root: Path) -> Path:
    """A run whose question, tag, answer, prediction rows and judge's why carry PAYLOAD."""
    set_dir = make_set(root, QIDS[:1])
    case = json.loads((set_dir / sets.CASES_FILE).read_text(encoding="utf-8"))
    case.pop("questionSha", None)
    case["question"] = f"{MARK} {PAYLOAD} how many accounts never ordered?"
    case["tags"] = [*case["tags"], "<svg onload=alert(7)>"]
    (set_dir / sets.CASES_FILE).write_text(json.dumps(case) + "\n", encoding="utf-8")
    steps = [
        {"tool": "get_context", "input": {"query": PAYLOAD}},
        {"tool": "execute_query", "input": {"sql": XSS_SQL}},
        {"text": f"{PAYLOAD}\n\nFinal query:\n```sql\n{XSS_SQL}\n```"},
    ]
    spec = ScriptSpec.model_validate(
        {
            "answerer": {"by_substring": {MARK: steps}},
            "judge": {"default": {"verdict": "no_match", "confidence": 7, "why": PAYLOAD}},
        }
    )
    with FakeAnthropic() as fake:
        fake.policy = spec.policy()
        result = run_pytest(fake, set_dir, "--eval-label=xss")
        assert (set_dir / "runs" / "xss" / "report.html").is_file(), result.stdout + result.stderr
    return set_dir / "runs" / "xss"
