"""The names a set gives out that become paths: a case's qid (its artifacts folder in every
run, and its pytest node id), a run's label and phase (its run folder).

Apart from the models that read a set: the session checks `--eval-label` and `--eval-phase`
at every start, before it knows whether it will read any set.
"""

from __future__ import annotations

import re

# A qid names a directory of every run (`artifacts/<qid>/`) and a pytest node id, so it is a
# plain file-name word: letters, digits, `.`, `_` and `-`, starting with a letter or digit, at
# most 128 characters. That rules out `/`, `\`, `..` as a whole name, NUL, spaces and `::`.
# The real sets (malloy-samples, evals/ecommerce) use letters, digits and `_` only.
QID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_QID = re.compile(QID_PATTERN)


def qid_problem(qid: str) -> str | None:
    """Why `qid` is not a valid qid, or None when it is (see `QID_PATTERN`)."""
    if _QID.fullmatch(qid):
        return None
    return (
        f"qid {qid!r} is not a valid qid: a qid is 1-128 letters, digits, '.', '_' or '-', "
        "starting with a letter or digit (it names the case's artifacts directory of a run)"
    )


def name_problem(flag: str, value: str) -> str | None:
    """Why a run label or phase given as `flag` is not a plain name, or None when it is.

    A label names the run's directory and a phase part of one (`<set>-<phase>-<nn>`), so both
    get the qid's treatment (`QID_PATTERN`): no `/`, no `..`, nothing that leaves the runs
    directory.
    """
    if _QID.fullmatch(value):
        return None
    return (
        f"{flag}={value!r} is not a valid name: 1-128 letters, digits, '.', '_' or '-', "
        "starting with a letter or digit (it names a run directory under the set's runs/)"
    )
