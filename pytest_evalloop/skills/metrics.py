"""Activation metrics: a confusion matrix per skill, precision, recall, F1, Wilson intervals.

Pure functions over plain values. Only *scored* runs of *implicit* scenarios enter a confusion
matrix: an errored run (crash, timeout, setup failure) is never a true negative, and an explicit
scenario measures whether the skill loads, not whether the agent chose it.

Every scored scenario run counts for every skill of the catalog, because the whole catalog is
installed in each sandbox: a skill that fires in another skill's scenario has a false positive
(unless that scenario is a negative naming it as the `neighbor` that should fire instead, where
firing is a true positive and staying quiet a false negative). `figures` is the one function
the summary table and the session's activation gate both read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_evalloop.measure.stats import wilson

"""The two-sided 95% normal quantile."""


@dataclass
class Confusion:
    """Counts of scored implicit runs, for one skill (and backend), over every scenario."""

    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0
    errors: int = 0
    """Runs of its own scenarios that produced no score; outside every rate."""
    explicit_loaded: int = 0
    explicit_runs: int = 0
    fp_elsewhere: int = 0
    """Of `fp`: activations in other skills' scenarios."""
    fn_elsewhere: int = 0
    """Of `fn`: negatives of other skills that name this one as the neighbour to fire, where
    it did not."""

    def add(
        self,
        *,
        expected: bool,
        activated: bool | None,
        explicit: bool = False,
        elsewhere: bool = False,
    ) -> None:
        """Count one run; ``activated=None`` is an errored run; ``elsewhere``: a run of another
        skill's scenario."""
        if activated is None:
            self.errors += 1
        elif explicit:
            self.explicit_runs += 1
            self.explicit_loaded += int(activated)
        elif expected:
            self.tp += int(activated)
            self.fn += int(not activated)
            self.fn_elsewhere += int(elsewhere and not activated)
        else:
            self.fp += int(activated)
            self.tn += int(not activated)
            self.fp_elsewhere += int(elsewhere and activated)

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
        """2 TP / (2 TP + FP + FN), the harmonic mean of precision and recall; None when either
        is undefined."""
        return f1(self.precision, self.recall)

    def __iadd__(self, other: Confusion) -> Confusion:
        for name in (
            "tp", "fp", "fn", "tn", "errors", "explicit_loaded", "explicit_runs",
            "fp_elsewhere", "fn_elsewhere",
        ):  # fmt: skip
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
    """``0.67 (2/3)`` or ``0.67 (2/3) [0.21, 0.94]``: the rate with its numerator and
    denominator; ``n/a (0/0)`` on an empty denominator."""
    value = ratio(successes, n)
    if value is None:
        return f"n/a ({successes}/{n})"
    bounds = wilson(successes, n) if interval else None
    shown = f"{value:.2f} ({successes}/{n})"
    return shown + (f" [{bounds[0]:.2f}, {bounds[1]:.2f}]" if bounds else "")


# --- tables over activation_score events (any objects with the event's attributes) ----------


def figures(
    scores: Iterable[Any],
    catalog: Iterable[str] = (),
    neighbors: Mapping[tuple[str, str], str] | None = None,
) -> dict[tuple[str, str], Confusion]:
    """One confusion matrix per (skill, backend), in first-seen order, over every scenario run.

    `catalog` is the skills installed in the runs (``run.json`` ``selection.skills``); a skill
    missing from it still counts where it fired. `neighbors` maps ``(skill, scenario)`` to the
    `neighbor` a negative names (`scenarios.neighbors`). For each scored implicit run:
    its own skill is expected to fire on a positive; a negative's ``neighbor`` is expected to
    fire instead; every other skill is expected to stay quiet. An errored run counts as an
    error of its own skill only, and an explicit one only for its own skill's EXPLICIT.
    """
    scores = [s for s in scores if s.status != "skipped"]
    installed = set(catalog)
    skills = list(dict.fromkeys([*catalog, *(s.skill for s in scores)]))
    out: dict[tuple[str, str], Confusion] = {}
    for s in scores:
        own = out.setdefault((s.skill, s.backend), Confusion())
        explicit = s.invocation == "explicit"
        # An errored run has activated=None; a forbid failure on an errored run too.
        own.add(expected=s.expected, activated=s.activated, explicit=explicit)
        if s.activated is None or explicit:
            continue
        fired = set(getattr(s, "other_activations", None) or ())
        neighbor = None if s.expected else (neighbors or {}).get((s.skill, s.scenario))
        if neighbor not in fired and installed and neighbor not in installed:
            neighbor = None  # a neighbour that is no skill of the catalog could not have fired
        for skill in dict.fromkeys([*skills, *sorted(fired), *([neighbor] if neighbor else [])]):
            if skill == s.skill:
                continue
            matrix = out.setdefault((skill, s.backend), Confusion())
            matrix.add(expected=skill == neighbor, activated=skill in fired, elsewhere=True)
    return out


def activation_table(
    scores: Iterable[Any],
    *,
    interval: bool,
    catalog: Iterable[str] = (),
    neighbors: Mapping[tuple[str, str], str] | None = None,
) -> list[str]:
    """``SKILL BACKEND TP FP FN TN ERR PRECISION RECALL F1 EXPLICIT`` plus a total row, from
    `figures`; each rate with its numerator and denominator, and with ``interval`` Wilson 95%
    intervals on precision and recall."""
    table = figures(scores, catalog, neighbors)
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
        # F1 = 2TP / (2TP + FP + FN): the same value as from precision and recall, with its parts.
        rate_text(2 * m.tp, 2 * m.tp + m.fp + m.fn, interval=False)
        if m.fp or m.fn or m.tp
        else "n/a",
        f"{m.explicit_loaded}/{m.explicit_runs}" if m.explicit_runs else "-",
    )


def activation_problems(
    scores: Iterable[Any],
    catalog: Iterable[str] = (),
    neighbors: Mapping[tuple[str, str], str] | None = None,
) -> list[str]:
    """The activation gate, over `figures`: one line per skill and backend that fired where it
    should not or stayed quiet where it should have fired, in any scenario of the catalog. Its
    own scenarios' misses also fail their items; other skills' scenarios fail nothing else."""
    problems = []
    for (skill, backend), m in figures(scores, catalog, neighbors).items():
        if not m.fp and not m.fn:
            continue
        where = []
        if m.fp:
            where.append(
                f"fired in {m.fp} run(s) where it should not ({m.fp_elsewhere} of them other "
                "skills' scenarios)"
            )
        if m.fn:
            where.append(
                f"missed {m.fn} run(s) where it should fire ({m.fn_elsewhere} of them negatives "
                "naming it as the neighbour)"
            )
        problems.append(
            f"activation: {skill} ({backend}) precision "
            f"{rate_text(m.tp, m.tp + m.fp, interval=False)}, recall "
            f"{rate_text(m.tp, m.tp + m.fn, interval=False)}: {'; '.join(where)}"
        )
    return problems


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
