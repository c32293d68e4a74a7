"""Which score of an attempt counts when the judge sampled it (`--eval-judge-samples=j`).

With j > 1 the same re-executed answer is judged j times by fresh judges, and the ledger
carries j `score` events for the attempt, each with its `judgeSample` (0..j-1). The attempt's
counted score is decided here, once, for every reader (`RunLedger.scores`):

- the verdict more than half of the j judge samples gave (any verdict word, or none) counts,
  represented by the first score event that gave it;
- when no verdict has such a majority the judges split: the attempt is `needs_human` with
  reason ``judge_split: <n> <verdict>, ...`` -- a person has to read it.

:func:`agreement` is the share of the j samples that gave the counted verdict, which the
summary and `run.json` report. One score event without `judgeSample` is the ordinary case.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SPLIT = "judge_split"
"""The reason of an attempt whose judge samples reached no majority."""


def counted(events: Sequence[Any]) -> Any:
    """The score event that counts for one attempt, from its score events (file order)."""
    if len(events) == 1:
        return events[0]
    ordered = sorted(events, key=lambda e: e.judge_sample or 0)
    tally = Counter(e.verdict for e in ordered)
    verdict, n = tally.most_common(1)[0]
    if 2 * n > len(ordered):
        return next(e for e in ordered if e.verdict == verdict)
    said = ", ".join(f"{k} {_word(v)}" for v, k in sorted(tally.items(), key=_order))
    return _with(
        ordered[0],
        verdict="needs_human",
        reason=f"{SPLIT}: {said} of {len(ordered)} judge samples",
    )


def _word(verdict: str | None) -> str:
    return verdict or "unscored"


def _order(item: tuple[str | None, int]) -> tuple[int, str]:
    return (-item[1], _word(item[0]))


def _with(event: Any, **changes: Any) -> Any:
    # Validated events are pydantic models; light reads are plain attribute bags, which answer
    # None for any key they lack (so `hasattr` is true of them too: ask for a callable).
    if callable(getattr(event, "model_copy", None)):
        return event.model_copy(update=changes)
    # Not copy.copy: it would look up __setstate__ on the bag and get None back.
    out = object.__new__(type(event))
    out.__dict__.update(vars(event), **changes)
    return out


@dataclass(frozen=True)
class Agreement:
    """How one attempt's judge samples agreed."""

    samples: int
    agreeing: int
    """Samples that gave the counted verdict (0 when they split)."""

    @property
    def unanimous(self) -> bool:
        """Every judge sample gave the same verdict."""
        return self.agreeing == self.samples


def agreement(events: Sequence[Any]) -> Agreement:
    """How an attempt's judge samples agreed with the verdict that counts."""
    tally = Counter(e.verdict for e in events)
    n = tally.most_common(1)[0][1] if tally else 0
    return Agreement(samples=len(events), agreeing=n if 2 * n > len(events) else 0)


def summary(groups: Sequence[Sequence[Any]]) -> dict[str, Any] | None:
    """Judge-sample figures of a run from each attempt's score events (None without samples):
    the `judgeSamples` entry of run.json totals, which the summary prints."""
    sampled = [g for g in groups if len(g) > 1]
    if not sampled:
        return None
    agreements = [agreement(g) for g in sampled]
    unanimous = sum(1 for a in agreements if a.unanimous)
    split = sum(1 for a in agreements if a.agreeing == 0)
    return {
        "samples": max(a.samples for a in agreements),
        "attempts": len(agreements),
        "unanimous": unanimous,
        "majority": len(agreements) - unanimous - split,
        "split": split,
        "agreement": round(sum(a.agreeing / a.samples for a in agreements) / len(agreements), 6),
    }


def summary_line(figures: dict[str, Any] | None) -> list[str]:
    """The terminal line of the judge-sample figures."""
    if not figures:
        return []
    return [
        f"judge samples: {figures['samples']} per attempt over {figures['attempts']} attempts: "
        f"{figures['unanimous']} unanimous, {figures['majority']} by majority, "
        f"{figures['split']} split ({SPLIT}: needs_human); mean agreement "
        f"{figures['agreement']:.1%}"
    ]
