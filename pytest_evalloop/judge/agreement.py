"""How far the judge agrees with people, as a figure: Cohen's kappa with a bootstrap interval.

Computed over a set's human-settled fixtures (`judge-regressions.jsonl`) as the current judge
re-judges them (`--eval-check-judge`, `evalloop check-judge`): each fixture is one pair
(person's verdict, judge's verdict). Kappa corrects raw agreement for the agreement two raters
with these label frequencies would reach by chance; practitioners' bar is 0.7 over a few
hundred labels, so under `FEW_LABELS` the figure carries a warning.

The interval is a percentile bootstrap over fixtures (`RESAMPLES` resamples from a fixed seed,
so the same pairs always print the same interval). Each check is recorded in the set's
`judge-agreement.jsonl` with the judge's pins; a judge whose pins differ from the last record's
and whose kappa falls below that record's interval is a **judge regression** (`regression`).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AGREEMENT_FILE = "judge-agreement.jsonl"
FEW_LABELS = 30
"""Under this many fixtures kappa's interval is too wide to steer by: the figure says so."""
RESAMPLES = 2000
SEED = 30
LEVEL = 0.95
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


def interval(pairs: list[tuple[str, str]]) -> tuple[float, float] | None:
    """The percentile bootstrap interval of `kappa` at `LEVEL` (None: too few defined)."""
    if len(pairs) < 2:
        return None
    rng = random.Random(SEED)
    values = []
    for _ in range(RESAMPLES):
        value = kappa([pairs[rng.randrange(len(pairs))] for _ in pairs])
        if value is not None:
            values.append(value)
    if len(values) < RESAMPLES // 2:
        return None
    values.sort()
    tail = (1 - LEVEL) / 2
    low = values[int(tail * (len(values) - 1))]
    high = values[int((1 - tail) * (len(values) - 1))]
    return low, high


@dataclass(frozen=True)
class Agreement:
    """The judge against people over one set's fixtures."""

    pairs: tuple[tuple[str, str], ...]

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
        shown = "n/a (undefined: one label only)" if k is None else f"{k:.2f}"
        if k is not None:
            shown += f" (95% bootstrap {ci[0]:.2f} to {ci[1]:.2f})" if ci else " (no interval)"
        head = f"judge vs people: Cohen's kappa {shown}"
        out = [
            head,
            "raw agreement: "
            + ("n/a" if raw is None else f"{raw:.0%}")
            + f" over {self.count} fixtures",
        ]
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

    def record(self, pins: dict[str, Any], at: str) -> dict[str, Any]:
        """The line `judge-agreement.jsonl` keeps of this check."""
        ci = self.interval
        k = self.kappa
        return {
            "at": at,
            **{key: pins.get(key) for key in PINS},
            "count": self.count,
            "kappa": None if k is None else round(k, 4),
            "low": None if ci is None else round(ci[0], 4),
            "high": None if ci is None else round(ci[1], 4),
            "raw": None if self.raw is None else round(self.raw, 4),
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


def regression(current: dict[str, Any], previous: dict[str, Any] | None) -> str | None:
    """Why this check is a judge regression, or None: the judge (or its doctrine) changed
    since `previous`, and its kappa fell below `previous`'s interval."""
    if previous is None or current.get("kappa") is None or previous.get("kappa") is None:
        return None
    changed = [key for key in PINS if current.get(key) != previous.get(key)]
    if not changed:
        return None
    floor = previous.get("low") if previous.get("low") is not None else previous["kappa"]
    if current["kappa"] >= floor:
        return None
    return (
        f"JUDGE REGRESSION: kappa {current['kappa']:.2f} is below the last recorded "
        f"{previous['kappa']:.2f} (interval from {floor:.2f}) and the judge changed "
        f"({', '.join(changed)}); old human-settled verdicts flip: fix the judge, not the truth"
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
    k, low, high = record.get("kappa"), record.get("low"), record.get("high")
    text = "n/a" if not isinstance(k, int | float) else f"{k:.2f}"
    if isinstance(low, int | float) and isinstance(high, int | float):
        text += f" (95% bootstrap {low:.2f} to {high:.2f})"
    lines = [
        f"judge vs people: Cohen's kappa {text} over {record['count']} human-settled fixtures "
        f"(judge {record.get('judgeModel')} v{record.get('judgeVersion')}, checked "
        f"{record.get('at')})"
    ]
    if record["count"] < FEW_LABELS:
        lines.append(f"warning: under {FEW_LABELS} fixtures: too uncertain to steer by")
    if record.get("regression"):
        lines.append("JUDGE REGRESSION: kappa fell below the previous judge's interval")
    return lines
