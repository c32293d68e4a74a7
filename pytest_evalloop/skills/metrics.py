"""Activation metrics: a confusion matrix per skill, precision, recall, F1, Wilson intervals.

Pure functions over plain values. Only *scored* runs of *implicit* scenarios enter a confusion
matrix: an errored run (crash, timeout, setup failure) is never a true negative, and an explicit
scenario measures whether the skill loads, not whether the agent chose it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pytest_evalloop.measure.stats import wilson

"""The two-sided 95% normal quantile."""


@dataclass
class Confusion:
    """Counts of scored implicit runs of one skill (and backend)."""

    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0
    errors: int = 0
    """Runs that produced no score; outside every rate."""
    explicit_loaded: int = 0
    explicit_runs: int = 0

    def add(self, *, expected: bool, activated: bool | None, explicit: bool = False) -> None:
        """Count one run; ``activated=None`` is an errored run."""
        if activated is None:
            self.errors += 1
        elif explicit:
            self.explicit_runs += 1
            self.explicit_loaded += int(activated)
        elif expected:
            self.tp += int(activated)
            self.fn += int(not activated)
        else:
            self.fp += int(activated)
            self.tn += int(not activated)

    @property
    def precision(self) -> float | None:
        """TP / (TP + FP); None when the skill never fired."""
        return ratio(self.tp, self.tp + self.fp)

    @property
    def recall(self) -> float | None:
        """TP / (TP + FN); None without a scored positive."""
        return ratio(self.tp, self.tp + self.fn)

    @property
    def f1(self) -> float | None:
        """The harmonic mean of precision and recall; None when either is undefined."""
        return f1(self.precision, self.recall)

    def __iadd__(self, other: Confusion) -> Confusion:
        for name in ("tp", "fp", "fn", "tn", "errors", "explicit_loaded", "explicit_runs"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self


def ratio(numerator: int, denominator: int) -> float | None:
    """numerator / denominator, or None on a zero denominator (never a made-up 0 or 1)."""
    return numerator / denominator if denominator else None


def f1(precision: float | None, recall: float | None) -> float | None:
    """F1 from precision and recall; 0 when both are 0, None when either is undefined."""
    if precision is None or recall is None:
        return None
    if precision + recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def rate_text(successes: int, n: int, *, interval: bool) -> str:
    """``0.67`` or ``0.67 [0.21, 0.94]``; ``n/a`` on an empty denominator."""
    value = ratio(successes, n)
    if value is None:
        return "n/a"
    bounds = wilson(successes, n) if interval else None
    return f"{value:.2f}" + (f" [{bounds[0]:.2f}, {bounds[1]:.2f}]" if bounds else "")


# --- tables over activation_score events (any objects with the event's attributes) ----------


def confusions(scores: Iterable[Any]) -> dict[tuple[str, str], Confusion]:
    """One confusion matrix per (skill, backend), in first-seen order."""
    out: dict[tuple[str, str], Confusion] = {}
    for s in scores:
        if s.status == "skipped":
            continue
        matrix = out.setdefault((s.skill, s.backend), Confusion())
        # An errored run has activated=None; a forbid failure on an errored run too.
        matrix.add(expected=s.expected, activated=s.activated, explicit=s.invocation == "explicit")
    return out


def activation_table(scores: Iterable[Any], *, interval: bool) -> list[str]:
    """``SKILL BACKEND TP FP FN TN ERRORS PRECISION RECALL F1 EXPLICIT`` plus a total row;
    with ``interval``, precision and recall carry Wilson 95% intervals."""
    table = confusions(scores)
    if not table:
        return ["no scenario run was scored"]
    total = Confusion()
    rows: list[tuple[str, ...]] = [
        ("SKILL", "BACKEND", "TP", "FP", "FN", "TN", "ERR", "PRECISION", "RECALL", "F1", "EXPLICIT")
    ]
    for (skill, backend), m in table.items():
        total += m
        rows.append(_row(skill, backend, m, interval))
    if len(table) > 1:
        rows.append(_row("all", "", total, interval))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]


def _row(skill: str, backend: str, m: Confusion, interval: bool) -> tuple[str, ...]:
    score = m.f1
    return (
        skill,
        backend,
        str(m.tp),
        str(m.fp),
        str(m.fn),
        str(m.tn),
        str(m.errors),
        rate_text(m.tp, m.tp + m.fp, interval=interval),
        rate_text(m.tp, m.tp + m.fn, interval=interval),
        "n/a" if score is None else f"{score:.2f}",
        f"{m.explicit_loaded}/{m.explicit_runs}" if m.explicit_runs else "-",
    )


PREFERENCE_ORDER = ("prefer", "provider-default", "minimize")


def preference_order_problems(scores: Iterable[Any]) -> list[str]:
    """Under ``all``: for each ``choice`` scenario, the asked rate must not increase from
    prefer to provider-default to minimize. Returns one line per scenario out of order."""
    asked: dict[tuple[str, str, str], dict[str, list[bool]]] = {}
    for s in scores:
        if s.ambiguity != "choice" or s.activated is None or s.asked_user is None:
            continue
        key = (s.skill, s.scenario, s.backend)
        asked.setdefault(key, {}).setdefault(s.question_preference, []).append(bool(s.asked_user))
    problems = []
    for (skill, scenario, backend), by_pref in sorted(asked.items()):
        if not all(p in by_pref for p in PREFERENCE_ORDER):
            continue
        rates = [sum(by_pref[p]) / len(by_pref[p]) for p in PREFERENCE_ORDER]
        if not rates[0] >= rates[1] >= rates[2]:
            shown = ", ".join(f"{p} {r:.2f}" for p, r in zip(PREFERENCE_ORDER, rates, strict=True))
            problems.append(
                f"question preference out of order for {skill}/{scenario} ({backend}): asked "
                f"rate {shown}; expected prefer >= provider-default >= minimize"
            )
    return problems
