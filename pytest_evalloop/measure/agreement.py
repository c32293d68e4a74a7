"""How far the judge agrees with people, as a figure: Cohen's kappa with an honest interval.

Computed over a set's human-settled fixtures (`judge-regressions.jsonl`) as the current judge
re-judges them (`--eval-check-judge`, `evalloop check-judge`): each fixture is one pair
(person's verdict, judge's verdict), one per settled attempt (`measure.people`: a superseded
fixture is voided, one people disagree on is left out). Kappa corrects raw agreement for the
agreement two raters with these label frequencies would reach by chance; practitioners' bar is
0.7 over a few hundred labels, so under `FEW_LABELS` the figure carries a warning.

The interval says what it knows (docs/review.md, "Agreement"):

- no interval when people used one verdict only (kappa cannot tell agreement from chance) or
  fewer than `MIN_PER_CLASS` labels of a verdict they used: the figure says which;
- otherwise the hull of two 95% intervals, each with a known way of failing: a percentile
  bootstrap over fixtures (Efron & Tibshirani 1993, ch. 13; `RESAMPLES` from a fixed seed) in
  which a resample whose kappa is undefined (one label only) counts as the whole range, -1 at
  the low end and +1 at the high end, since it says nothing about agreement beyond chance; and
  Cohen's (1960) fixed-margins approximation, the Wilson score interval of the observed
  agreement mapped through kappa = (p_o - p_e) / (1 - p_e). The bootstrap collapses where every
  resample agrees perfectly; the Wilson interval never does, so neither is ever zero-wide.

Each check is recorded in the set's `judge-agreement.jsonl` with the judge's pins; a judge whose
pins differ from the last record's and whose kappa falls below that record's low end is a
**judge regression** (`regression`); a record with no low end calls none.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_evalloop.measure.stats import wilson

AGREEMENT_FILE = "judge-agreement.jsonl"
FEW_LABELS = 30
"""Under this many fixtures kappa's interval is too wide to steer by: the figure says so."""
MIN_PER_CLASS = 3
"""An interval needs at least this many people's labels of each verdict the people used: a
verdict held by k of n fixtures is missing from about e^-k of the resamples (37% at 1, 14% at
2, 5% at 3), so under 3 the interval's tails would say more about which resamples happen to
hold the rare verdict than about the judge."""
RESAMPLES = 2000
SEED = 30
LEVEL = 0.95
METHOD = "bootstrap+wilson"
"""What `judge-agreement.jsonl` records as `intervalMethod` (a record without it has a low end
from the interval that could collapse, and the regression rule does not read it)."""
LABELS = ("match", "no_match", "near_match", "needs_human")
PINS = ("judgeModel", "judgeVersion", "rubricSha")


def kappa(pairs: list[tuple[str, str]]) -> float | None:
    """Cohen's kappa of (person, judge) pairs; None when it is undefined (no pairs, or both
    raters used one and the same label only, so chance agreement is 1)."""
    n = len(pairs)
    if not n:
        return None
    observed = sum(1 for a, b in pairs if a == b) / n
    people = Counter(a for a, _ in pairs)
    judge = Counter(b for _, b in pairs)
    chance = sum(people[label] * judge[label] for label in people) / (n * n)
    if chance >= 1.0:
        return None
    return (observed - chance) / (1.0 - chance)


def interval_problem(pairs: list[tuple[str, str]]) -> str | None:
    """Why these pairs get no interval, or None when they get one."""
    people = Counter(a for a, _ in pairs)
    if not people:
        return "no fixtures"
    if len(people) < 2:
        [(label, n)] = people.items()
        return (
            f"people used one verdict only ({n} {label}): kappa cannot tell agreement from "
            "chance; settle cases of another verdict"
        )
    few = [f"{n} {label}" for label, n in sorted(people.items()) if n < MIN_PER_CLASS]
    if few:
        return (
            f"only {', '.join(few)} among people's labels; an interval needs at least "
            f"{MIN_PER_CLASS} of each verdict they used"
        )
    return None


def interval(pairs: list[tuple[str, str]]) -> tuple[float, float] | None:
    """The 95% interval of `kappa` (the module docstring's hull), None where
    `interval_problem` says why there is none."""
    if interval_problem(pairs) is not None:
        return None
    boot_low, boot_high = _bootstrap(pairs)
    wil_low, wil_high = _fixed_margins(pairs)
    return min(boot_low, wil_low), max(boot_high, wil_high)


def _bootstrap(pairs: list[tuple[str, str]]) -> tuple[float, float]:
    rng = random.Random(SEED)
    lows, highs = [], []
    for _ in range(RESAMPLES):
        value = kappa([pairs[rng.randrange(len(pairs))] for _ in pairs])
        # Undefined: the resample holds one label only, so it bounds nothing.
        lows.append(-1.0 if value is None else value)
        highs.append(1.0 if value is None else value)
    lows.sort()
    highs.sort()
    tail = (1 - LEVEL) / 2
    last = RESAMPLES - 1
    return lows[math.floor(tail * last)], highs[math.ceil((1 - tail) * last)]


def _fixed_margins(pairs: list[tuple[str, str]]) -> tuple[float, float]:
    n = len(pairs)
    people = Counter(a for a, _ in pairs)
    judge = Counter(b for _, b in pairs)
    chance = sum(people[label] * judge[label] for label in people) / (n * n)
    found = wilson(sum(1 for a, b in pairs if a == b), n)
    assert found is not None and chance < 1.0  # two verdicts among people: chance < 1
    low, high = found
    return max(-1.0, (low - chance) / (1 - chance)), min(1.0, (high - chance) / (1 - chance))


def people_agreement(rulings: list[list[str]]) -> tuple[int, int, int, int]:
    """Over attempts two or more people ruled on: (attempts, attempts where all agree, pairs
    of people, pairs that agree)."""
    cases = agreed = pairs = same = 0
    for verdicts in rulings:
        if len(verdicts) < 2:
            continue
        cases += 1
        agreed += len(set(verdicts)) == 1
        for i, a in enumerate(verdicts):
            for b in verdicts[i + 1 :]:
                pairs += 1
                same += a == b
    return cases, agreed, pairs, same


@dataclass(frozen=True)
class Agreement:
    """The judge against people over one set's fixtures."""

    pairs: tuple[tuple[str, str], ...]
    people: tuple[tuple[str, ...], ...] = ()
    """Each live fixture's rulings (one verdict per person), people's agreement's input."""
    disputed: tuple[str, ...] = ()
    """The fixtures people disagree on (out of kappa until one more review settles them)."""

    @property
    def count(self) -> int:
        return len(self.pairs)

    @property
    def raw(self) -> float | None:
        """The share of fixtures where the judge gave the person's verdict."""
        return sum(1 for a, b in self.pairs if a == b) / self.count if self.count else None

    @property
    def kappa(self) -> float | None:
        return kappa(list(self.pairs))

    @property
    def interval(self) -> tuple[float, float] | None:
        return interval(list(self.pairs))

    def confusion(self) -> tuple[list[str], list[list[int]]]:
        """The labels used and the matrix: row = the person's verdict, column = the judge's."""
        used = [label for label in LABELS if any(label in p for p in self.pairs)]
        used += sorted({x for p in self.pairs for x in p} - set(used))
        cells = Counter(self.pairs)
        return used, [[cells[(a, b)] for b in used] for a in used]

    def lines(self) -> list[str]:
        """What every view prints."""
        k, ci, raw = self.kappa, self.interval, self.raw
        problem = interval_problem(list(self.pairs))
        if k is None:
            shown = "n/a (undefined: people and the judge used one and the same label only)"
        else:
            shown = f"{k:.2f}"
            shown += (
                f" (95% interval {ci[0]:.2f} to {ci[1]:.2f})"
                if ci
                else f" (no interval: {problem})"
            )
        out = [
            f"judge vs people: Cohen's kappa {shown}",
            "raw agreement: "
            + ("n/a" if raw is None else f"{raw:.0%}")
            + f" over {self.count} fixtures (one per settled attempt)",
        ]
        out += self.people_lines()
        if self.count < FEW_LABELS:
            out.append(
                f"warning: only {self.count} human-settled fixtures (under {FEW_LABELS}): kappa "
                "is too uncertain to steer by; settle more cases"
            )
        labels, matrix = self.confusion()
        if labels:
            width = max(len(x) for x in labels) + 2
            out.append("confusion (rows: people, columns: judge):")
            out.append(" " * width + "".join(f"{x:>{width}}" for x in labels))
            for label, row in zip(labels, matrix, strict=True):
                out.append(f"{label:<{width}}" + "".join(f"{v:>{width}}" for v in row))
        return out

    def people_lines(self) -> list[str]:
        """People against each other, beside the judge's figure."""
        cases, agreed, pairs, same = people_agreement([list(p) for p in self.people])
        out = []
        if cases:
            out.append(
                f"people vs people: {agreed} of {cases} attempts two or more people ruled on "
                f"agree (pairwise agreement {same / pairs:.0%} over {pairs} pairs)"
            )
        if self.disputed:
            out.append(
                f"people disagree: {len(self.disputed)} fixture(s) out of kappa until one more "
                f"review settles them ({', '.join(self.disputed[:5])})"
            )
        return out

    def record(self, pins: dict[str, Any], at: str) -> dict[str, Any]:
        """The line `judge-agreement.jsonl` keeps of this check."""
        ci = self.interval
        k = self.kappa
        cases, agreed, _, _ = people_agreement([list(p) for p in self.people])
        return {
            "at": at,
            **{key: pins.get(key) for key in PINS},
            "count": self.count,
            "kappa": None if k is None else round(k, 4),
            "low": None if ci is None else round(ci[0], 4),
            "high": None if ci is None else round(ci[1], 4),
            "intervalMethod": METHOD if ci is not None else None,
            "noInterval": interval_problem(list(self.pairs)) if ci is None else None,
            "raw": None if self.raw is None else round(self.raw, 4),
            "peopleCases": cases,
            "peopleAgreed": agreed,
            "peopleDisagree": len(self.disputed),
        }


def last_record(set_dir: Path) -> dict[str, Any] | None:
    """The latest line of the set's `judge-agreement.jsonl` (None: none, or unreadable)."""
    path = set_dir / AGREEMENT_FILE
    if not path.is_file():
        return None
    last = None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            last = row
    return last


def low_end(record: dict[str, Any] | None) -> float | None:
    """A record's low end, where one exists: recorded by this interval (`intervalMethod`)."""
    if record is None or record.get("intervalMethod") != METHOD:
        return None
    low = record.get("low")
    return float(low) if isinstance(low, int | float) and not isinstance(low, bool) else None


def regression(current: dict[str, Any], previous: dict[str, Any] | None) -> str | None:
    """Why this check is a judge regression, or None: the judge (or its doctrine) changed
    since `previous`, and its kappa fell below `previous`'s low end (only where it has one)."""
    if previous is None or current.get("kappa") is None:
        return None
    changed = [key for key in PINS if current.get(key) != previous.get(key)]
    floor = low_end(previous)
    if not changed or floor is None or current["kappa"] >= floor:
        return None
    return (
        f"JUDGE REGRESSION: kappa {current['kappa']:.2f} is below the last recorded "
        f"interval (from {floor:.2f}) and the judge changed ({', '.join(changed)}); old "
        "human-settled verdicts flip: fix the judge, not the truth"
    )


def unbounded(current: dict[str, Any], previous: dict[str, Any] | None) -> str | None:
    """What a check says when the judge changed and its kappa is below the last one's, but the
    last record has no low end to call a regression by (None otherwise)."""
    if previous is None or current.get("kappa") is None or low_end(previous) is not None:
        return None
    before = previous.get("kappa")
    changed = [key for key in PINS if current.get(key) != previous.get(key)]
    if not changed or not isinstance(before, int | float) or current["kappa"] >= before:
        return None
    why = previous.get("noInterval") or "it was recorded without this interval"
    return (
        f"kappa {current['kappa']:.2f} is below the last recorded {before:.2f} and the judge "
        f"changed ({', '.join(changed)}), but the last record has no interval ({why}): not "
        "called a regression; settle more cases"
    )


def append_record(set_dir: Path, record: dict[str, Any]) -> None:
    """Append one check's line to the set's `judge-agreement.jsonl`."""
    with (set_dir / AGREEMENT_FILE).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def shown(set_dir: Path) -> list[str]:
    """The set's last recorded kappa as a run's report shows it ([] when none is recorded)."""
    record = last_record(set_dir)
    if record is None or not isinstance(record.get("count"), int):
        return []
    k, low, high = record.get("kappa"), low_end(record), record.get("high")
    text = "n/a" if not isinstance(k, int | float) else f"{k:.2f}"
    if low is not None and isinstance(high, int | float):
        text += f" (95% interval {low:.2f} to {high:.2f})"
    elif isinstance(k, int | float):
        text += f" (no interval: {record.get('noInterval') or 'recorded before intervals'})"
    lines = [
        f"judge vs people: Cohen's kappa {text} over {record['count']} human-settled fixtures "
        f"(judge {record.get('judgeModel')} v{record.get('judgeVersion')}, checked "
        f"{record.get('at')})"
    ]
    if record.get("peopleCases"):
        lines.append(
            f"people vs people: {record.get('peopleAgreed')} of {record['peopleCases']} "
            "attempts two or more people ruled on agree"
        )
    if record.get("peopleDisagree"):
        lines.append(f"people disagree: {record['peopleDisagree']} fixture(s), out of kappa")
    if record["count"] < FEW_LABELS:
        lines.append(f"warning: under {FEW_LABELS} fixtures: too uncertain to steer by")
    if record.get("regression"):
        lines.append("JUDGE REGRESSION: kappa fell below the previous judge's interval")
    return lines
