"""People's verdicts on one attempt, as one human label: the rule every view and the
regressions file read (`aggregates.settled_scores`, `review.record_review`).

An attempt may be reviewed many times, by one person or several. They count once:

- **each person once**: a person's latest verdict review is their ruling (their earlier ones
  are superseded); a "golden is wrong" review is no verdict and changes no ruling;
- **the latest review stands**: the label is the verdict of the latest ruling, and it stands
  when more people hold it than hold any other verdict;
- **people disagree** otherwise (a tie: A said no_match, C near_match): the attempt has no
  human label, it is shown and counted apart (neither pass nor fail, out of kappa) until one
  more review settles it: a third person siding with one of them, or one of the two changing
  their ruling.

Pure functions over review events (validated or light reads: `qid`, `sample`, `reviewer`,
`verdict`, `golden_wrong`), in ledger order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

Key = tuple[str, int | None]


@dataclass(frozen=True)
class HumanLabel:
    """People's word on one attempt."""

    verdict: str
    """The latest ruling's verdict: the label when `disagree` is False."""
    reviewer: str
    """Who gave the latest ruling."""
    rulings: tuple[tuple[str, str], ...]
    """Each person's current ruling, (reviewer, verdict), in the order they were last given."""

    @property
    def disagree(self) -> bool:
        """People disagree: the latest verdict is not held by more people than any other."""
        held = Counter(v for _, v in self.rulings)
        mine = held[self.verdict]
        return any(n >= mine for v, n in held.items() if v != self.verdict)

    @property
    def settled(self) -> bool:
        """One human label stands (people do not disagree)."""
        return not self.disagree

    def text(self) -> str:
        """`A no_match, C near_match`: the rulings as every view prints them."""
        return ", ".join(f"{who} {verdict}" for who, verdict in self.rulings)


def label_of(reviews: Iterable[object]) -> HumanLabel | None:
    """The human label of one attempt's reviews (ledger order); None with no verdict review."""
    latest: dict[str, str] = {}
    for review in reviews:
        verdict = getattr(review, "verdict", None)
        if getattr(review, "golden_wrong", False) or verdict is None:
            continue
        who = str(getattr(review, "reviewer", "") or "")
        # Re-inserted so the order is the order rulings were last given.
        latest.pop(who, None)
        latest[who] = str(verdict)
    if not latest:
        return None
    last_who, last_verdict = list(latest.items())[-1]
    return HumanLabel(verdict=last_verdict, reviewer=last_who, rulings=tuple(latest.items()))


def labels(reviews: Iterable[object]) -> dict[Key, HumanLabel]:
    """The human label per attempt of a run's review events (ledger order)."""
    per: dict[Key, list[object]] = {}
    for review in reviews:
        key = (getattr(review, "qid", ""), getattr(review, "sample", None))
        per.setdefault(key, []).append(review)
    found = {key: label_of(events) for key, events in per.items()}
    return {key: label for key, label in found.items() if label is not None}
