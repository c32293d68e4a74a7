"""A real run with a needs_human, a match and a no_match case, for the review tests.

`pytest <set>` in a subprocess against the loopback fake endpoint (tests/reportruns.py's way),
the judge scripted per question: the first case match, the second needs_human (confidence 4),
the third no_match.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_evalloop.testing import FakeAnthropic, ScriptSpec
from tests.reportruns import QIDS, example_rows, run_pytest
from tests.test_run import ORACLE, make_set

MATCHED, DOUBTED, FAILED = QIDS[0], QIDS[1], QIDS[2]
UNANSWERED = QIDS[3]
"""With `unanswered=True`: a fourth case the answerer leaves without a final query (unscored,
so no person may review it)."""


def review_run(root: Path, *, question_prefix: str = "", unanswered: bool = False) -> Path:
    """The run directory of a three-case run (`MATCHED`, `DOUBTED`, `FAILED`; `UNANSWERED`
    too when asked)."""
    set_dir = make_set(root, [MATCHED, DOUBTED, FAILED, *([UNANSWERED] if unanswered else [])])
    rows = example_rows()
    judge: dict[str, Any] = {
        "default": {"verdict": "match", "confidence": 9, "why": "the figure matches"},
        "by_question": {
            rows[DOUBTED]["question"]: {"verdict": "match", "confidence": 4, "why": "unsure"},
            rows[FAILED]["question"]: {"verdict": "no_match", "confidence": 8, "why": "off"},
        },
    }
    spec = ScriptSpec.model_validate(
        {
            "cases_file": str(set_dir / "cases.jsonl"),
            "answerer": {
                "default": ORACLE,
                "by_question": (
                    {rows[UNANSWERED]["question"]: [{"text": "I cannot tell from the data."}]}
                    if unanswered
                    else {}
                ),
            },
            "judge": judge,
        }
    )
    with FakeAnthropic() as fake:
        fake.policy = spec.policy()
        done = run_pytest(fake, set_dir, "--eval-label=r1")
    run_dir = set_dir / "runs" / "r1"
    assert (run_dir / "report.html").is_file(), done.stdout + done.stderr
    return run_dir
