"""The figure lines every view of a run shows beyond its counts: the repeat figures, the judge
sample agreement and retrieval precision.

The terminal summary, report.html, the Markdown summary and `evalloop report` all print these
lines from these functions, so no view can show a figure another lacks or word it otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_evalloop.judge import judgesamples
from pytest_evalloop.measure import repeats, stats

if TYPE_CHECKING:
    from pytest_evalloop.measure.aggregates import Tally


def pass_rate_interval(tally: Tally) -> tuple[float, float, str] | None:
    """The pass rate's 95% interval and its name, never of a withheld pass rate.

    One attempt per case: Wilson over the decided attempts. With several samples per case the
    attempts are not independent trials, and the interval that fits is the case-clustered one
    of another estimator (the mean of per-case fractions): it is on that figure's own line
    (`sample_lines`), never on the attempt pass rate's."""
    if tally.withheld is not None or tally.pass_rate is None:
        return None
    if repeats.figures(tally) is not None:
        return None
    bounds = stats.wilson(tally.passed, tally.decided)
    return None if bounds is None else (*bounds, "95% Wilson interval")


def interval_text(tally: Tally) -> str:
    """The interval as every view appends it to the pass rate ("" when there is none)."""
    interval = pass_rate_interval(tally)
    if interval is None:
        return ""
    low, high, name = interval
    return f", {name} {low:.1%}\u2013{high:.1%}"


def sample_lines(
    tally: Tally, judge_summary: dict[str, Any] | None, verbosity: int = 0
) -> list[str]:
    """What answerer samples and judge samples say (none without samples)."""
    lines = repeats.summary_lines(repeats.figures(tally), verbosity)
    lines.extend(judgesamples.summary_line(judge_summary))
    return lines


def precision_line(tally: Tally) -> list[str]:
    """Retrieval precision and noise over the attempts of covered cases (none without)."""
    if tally.precision is None or tally.noise is None:
        return []
    at = ""
    returned = tally.returned
    if returned:
        spread = f", {min(returned)}-{max(returned)}" if min(returned) != max(returned) else ""
        # Precision is a share of what came back: printed with its N, as precision@N is.
        at = f" at N = {sum(returned) / len(returned):.1f} entities returned per attempt{spread}"
    return [
        f"retrieval precision: mean {tally.precision:.2f} over {len(tally.precisions)} "
        f"attempts of covered cases{at}; noise {tally.noise:.1f} unwanted entities per attempt"
    ]


def figure_lines(
    tally: Tally, judge_summary: dict[str, Any] | None, verbosity: int = 0
) -> list[str]:
    """Every figure line of a run, from its tally and its judge-sample figures
    (`judgesamples.summary`, as run.json totals `judgeSamples` records them)."""
    return sample_lines(tally, judge_summary, verbosity) + precision_line(tally)
