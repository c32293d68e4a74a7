"""The domain failure an eval item raises, shown as its own report instead of a traceback.

Every kind of eval item (a case, a golden re-derivation, a judge regression) raises it, so it
lives apart from any one of them: the item modules import it, never each other.
"""

from __future__ import annotations


class EvalFailure(Exception):
    """A domain failure (no_match, contamination, harness error, golden drift): reported
    without traceback."""

    def __init__(self, report: str, status: str) -> None:
        super().__init__(report)
        self.report = report
        self.status = status
