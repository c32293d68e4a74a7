"""Bring your own judge: override the `evalloop_judge` fixture.

Copy this file as the `conftest.py` at (or above) your set and every attempt is scored by
`ScalarRuleJudge` instead of the built-in LLM judge. The plugin still decides what reaches a
judge: contaminated attempts, goldens that are not verified and answerable cases with no final
query are never judged (their score is `verdict: null` with the reason).

A judge is any object with (see `pytest_evalloop/roles/contract.py`, the `Judge` protocol):

- `model`, `version` and `rubric_sha` (strings), pinned in `run.json` (`judgeModel`,
  `judgeVersion`, `rubricSha`) and stamped on every score: change the rules, change the version,
  and a comparison against an older run warns that it is a rebase, not a delta;
- `async judge(materials: JudgeMaterials) -> JudgeOutcome` (`pytest_evalloop/judge/judge.py`).
  `materials` holds the golden, the rows the plugin re-executed (never the answerer's own
  report), the final query and the answer text.

`ScalarRuleJudge` decides by rule and calls no endpoint: a scalar golden matches when the
single re-executed row carries every golden value (paired by column name, else by value) within
the golden's rounding; an unanswerable case matches when nothing was submitted; anything else is
`needs_human`, which pytest reports as skipped with that status word.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Literal

import pytest

from pytest_evalloop.judge.judge import JudgeMaterials, JudgeOutcome

Verdict = Literal["match", "near_match", "no_match", "needs_human"]

RULES = """\
scalar-rules 1
1. Only scalar and unanswerable goldens are decided; every other kind is needs_human.
2. A scalar golden is a mapping of column to value; its optional "round" key gives the decimal
   places, and numbers then agree within half a unit of the last place (plus 1e-9).
   Without "round", numbers agree within a relative 1e-9; text agrees ignoring case and spaces.
3. The re-executed prediction must be exactly one row. Each golden column pairs with the
   prediction column of the same name when the values agree, else with the first unpaired
   column whose value agrees. All paired: match. Any unpaired: no_match.
4. An unanswerable golden matches when no final query was submitted, and is needs_human
   otherwise: whether the answer explains the gap is a reading, not a rule.
"""


def _agree(predicted: Any, golden: Any, places: int | None) -> bool:
    numbers = (int, float)
    if isinstance(golden, bool) or isinstance(predicted, bool):
        return predicted == golden
    if isinstance(golden, numbers) and isinstance(predicted, numbers):
        if places is not None:
            return abs(predicted - golden) <= 0.5 * 10**-places + 1e-9
        return math.isclose(predicted, golden, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(golden, str) and isinstance(predicted, str):
        return " ".join(golden.lower().split()) == " ".join(predicted.lower().split())
    return bool(predicted == golden)


def pair_columns(
    golden: dict[str, Any], row: dict[str, Any], places: int | None
) -> dict[str, str | None]:
    """Golden column -> prediction column (None when no column of the row agrees)."""
    pairing: dict[str, str | None] = {}
    used: set[str] = set()
    for name, want in golden.items():
        same = name in row and _agree(row[name], want, places)
        other = (c for c in row if c not in used and _agree(row[c], want, places))
        match = name if same else next(other, None)
        pairing[name] = match
        if match is not None:
            used.add(match)
    return pairing


class ScalarRuleJudge:
    """A rule-based judge for scalar goldens; its version and rubric sha pin the rules."""

    model = "scalar-rules"
    version = "rules-1"
    rubric_sha = hashlib.sha256(RULES.encode("utf-8")).hexdigest()

    async def judge(self, materials: JudgeMaterials) -> JudgeOutcome:
        """Decide one attempt by the rules in `RULES`."""
        if materials.golden_kind == "unanswerable":
            return self._unanswerable(materials)
        if materials.golden_kind != "scalar":
            return self._outcome(
                "needs_human", f"{materials.golden_kind} goldens are not decided by rule (rule 1)"
            )
        rows = materials.prediction_rows
        if rows is None or len(rows) != 1:
            got = "no rows" if rows is None else f"{len(rows)} rows"
            return self._outcome("no_match", f"expected one re-executed row, got {got} (rule 3)")
        value = materials.golden_value
        golden = dict(value) if isinstance(value, dict) else {"value": value}
        places = golden.pop("round", None)
        pairing = pair_columns(golden, rows[0], places if isinstance(places, int) else None)
        missing = [name for name, column in pairing.items() if column is None]
        if missing:
            wanted = ", ".join(f"{name}={golden[name]!r}" for name in missing)
            return self._outcome("no_match", f"no column agrees with {wanted}", pairing)
        return self._outcome("match", "every golden value is in the row", pairing)

    def _unanswerable(self, materials: JudgeMaterials) -> JudgeOutcome:
        if materials.final_query is None:
            return self._outcome("match", "declined, as the unanswerable golden requires (rule 4)")
        return self._outcome("needs_human", "a query was submitted for an unanswerable case")

    def _outcome(
        self, verdict: Verdict, why: str, pairing: dict[str, str | None] | None = None
    ) -> JudgeOutcome:
        return JudgeOutcome(
            verdict=verdict,
            reason=why,
            confidence=10,
            judge_verdict=verdict,
            why=why,
            column_pairing=pairing,
            judge_version=self.version,
            rubric_sha=self.rubric_sha,
            attempts=1,
            model=self.model,
        )


@pytest.fixture(scope="session")
def evalloop_judge() -> ScalarRuleJudge:
    """Every attempt under this conftest is judged by `ScalarRuleJudge`."""
    return ScalarRuleJudge()
