"""What k samples per case say about a run: per-case fractions, pass@k, pass^k, consistency
and the clustered interval of the pass rate (`--eval-samples=k`).

The figures are computed from a run's :class:`~pytest_evalloop.measure.aggregates.Tally` (the one
rule of which attempts count) through :mod:`pytest_evalloop.measure.stats` (the estimators), so the
terminal summary, `run.json` totals and every other view show the same numbers:
:func:`figures` decides them, :func:`summary_lines` and :func:`totals` only present them.

An attempt that leaves every aggregate (gold_wrong, contaminated, harness_error) is not a
sample of its case here either; a near_match, needs_human or unscored attempt is a sample that
was not decided. pass@k and pass^k are over the cases with k decided samples and consistency
over the cases with k samples; a case with fewer is left out of that figure and named, so no
figure is ever computed on fewer samples than its label says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_evalloop.measure import caveats, stats

if TYPE_CHECKING:
    from pytest_evalloop.measure.aggregates import Tally

SHOWN_UNSTABLE = 10
"""Inconsistent cases the summary names (all with -v)."""


@dataclass(frozen=True)
class RepeatFigures:
    """A run's repeat figures: one :class:`stats.CaseCounts` per case and what they add up to."""

    samples: int
    """The samples a case was given (k): the most attempts any case has, a dropped one too."""
    cases: dict[str, stats.CaseCounts]
    metrics: stats.RepeatMetrics
    rate: stats.PassRate | None
    """The mean per-case pass fraction with its clustered 95% interval (None: nothing decided)."""

    @property
    def unstable(self) -> list[str]:
        """Cases whose samples did not all reach the same outcome, in case order."""
        return [qid for qid, c in self.cases.items() if not c.consistent]

    @property
    def short(self) -> list[str]:
        """Cases left out of pass@k and pass^k: fewer than k decided samples."""
        return [qid for qid, c in self.cases.items() if c.decided < self.samples]

    @property
    def missing(self) -> list[str]:
        """Cases left out of the consistent share: fewer than k samples (one left every
        aggregate: a harness error, gold_wrong)."""
        return [qid for qid, c in self.cases.items() if c.samples < self.samples]


def case_counts(tally: Tally) -> dict[str, stats.CaseCounts]:
    """Each case's samples counted under the aggregates rule, by qid (xdist and concurrency
    shuffle the ledger's order; a listing should not)."""
    from pytest_evalloop.measure.aggregates import DECIDED

    passes: dict[str, int] = {}
    decided: dict[str, int] = {}
    samples: dict[str, int] = {}
    words: dict[str, set[str]] = {}
    for attempt in tally.attempts:
        if not attempt.counts:
            continue
        qid = attempt.qid
        samples[qid] = samples.get(qid, 0) + 1
        decided[qid] = decided.get(qid, 0) + (attempt.outcome in DECIDED)
        passes[qid] = passes.get(qid, 0) + (attempt.outcome == "match")
        words.setdefault(qid, set()).add(attempt.outcome)
    return {
        qid: stats.CaseCounts(
            passes=passes[qid], decided=decided[qid], samples=n, uniform=len(words[qid]) == 1
        )
        for qid, n in sorted(samples.items())
    }


def samples_given(tally: Tally) -> int:
    """k: the most attempts any case has, counting the ones that left every aggregate."""
    per_case: dict[str, int] = {}
    for attempt in tally.attempts:
        per_case[attempt.qid] = per_case.get(attempt.qid, 0) + 1
    return max(per_case.values(), default=0)


def figures(tally: Tally) -> RepeatFigures | None:
    """The repeat figures of a run; None when no case was given more than one sample, or when
    the run's pass rate is withheld (the same reasons withhold these)."""
    if tally.withheld is not None:
        return None
    cases = case_counts(tally)
    k = samples_given(tally)
    if k < 2 or not cases:
        return None
    counts = list(cases.values())
    return RepeatFigures(
        samples=k,
        cases=cases,
        metrics=stats.repeat_metrics(counts, k),
        rate=stats.clustered_interval(counts),
    )


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _cases(n: int) -> str:
    return f"{n} case" if n == 1 else f"{n} cases"


def summary_lines(fig: RepeatFigures | None, verbosity: int = 0) -> list[str]:
    """The terminal lines of the repeat figures (none without samples)."""
    if fig is None:
        return []
    m, k = fig.metrics, fig.samples
    limit = None if verbosity > 0 else SHOWN_UNSTABLE
    lines = [
        f"samples: {k} per case over {_cases(m.cases)}: pass@{k} {_pct(m.pass_at_k)}, "
        f"pass^{k} {_pct(m.pass_hat_k)} (over {_cases(m.complete)} with {k} decided samples), "
        f"consistent {_pct(m.consistent)} (over {_cases(m.full)} with {k} samples: one "
        "outcome each)"
    ]
    if fig.short:
        lines.append(
            f"left out of pass@{k}/pass^{k}: {_cases(len(fig.short))} with fewer than {k} "
            f"decided samples: {_listing(fig, fig.short, limit)}"
        )
    if fig.rate is not None:
        r = fig.rate
        lines.append(
            f"mean pass rate: {r.mean:.1%}, 95% interval {r.low:.1%}-{r.high:.1%} (per-case "
            f"fractions over {r.cases} cases with a decided sample, each case one cluster; "
            f"effective n {r.effective_n:.1f}){caveats.clustered_interval_note(r.cases)}"
        )
    unstable = fig.unstable
    if unstable:
        lines.append(f"inconsistent cases ({len(unstable)}): {_listing(fig, unstable, limit)}")
    return lines


def _listing(fig: RepeatFigures, qids: list[str], limit: int | None) -> str:
    shown = qids if limit is None else qids[:limit]
    more = f", … (+{len(qids) - len(shown)}; -v lists all)" if len(shown) < len(qids) else ""
    return ", ".join(f"{qid} {_fraction(fig.cases[qid], fig.samples)}" for qid in shown) + more


def _fraction(c: stats.CaseCounts, k: int) -> str:
    undecided = c.samples - c.decided
    extra = f", {undecided} undecided" if undecided else ""
    dropped = f", {k - c.samples} dropped" if c.samples < k else ""
    return f"{c.passes}/{c.decided}{extra}{dropped}"


def totals(fig: RepeatFigures | None) -> dict[str, Any]:
    """The `repeats` entry of `run.json` totals (empty without samples)."""
    if fig is None:
        return {}
    m, r = fig.metrics, fig.rate
    return {
        "repeats": {
            "samples": fig.samples,
            "cases": m.cases,
            "passAtK": _round(m.pass_at_k),
            "passHatK": _round(m.pass_hat_k),
            "passAtKCases": m.complete,
            "leftOutOfPassAtK": fig.short,
            "consistent": _round(m.consistent),
            "consistentCases": m.full,
            "meanPassRate": None if r is None else _round(r.mean),
            "interval95": None if r is None else [_round(r.low), _round(r.high)],
            "effectiveN": None if r is None else _round(r.effective_n),
            "unstable": fig.unstable,
            "perCase": {
                qid: {"passes": c.passes, "decided": c.decided, "samples": c.samples}
                for qid, c in fig.cases.items()
            },
        }
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
