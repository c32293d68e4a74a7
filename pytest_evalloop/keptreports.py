"""What an eval item's reports keep once they are all logged.

pytest keeps every report to the session's end (the terminal reporter's stats), so what each
report holds is what the controller holds at 50,000 cases. Until the item's reports are all
logged (`pytest_runtest_logfinish`), every hook of every plugin sees them whole; from then on
(`summary.SessionTally`):

- the result a report carries keeps only the words the summary asks of it (`slimmed`), and
  equal words are one dict for every item;
- the parts pytest copies onto each of an item's reports (its keywords, user_properties and
  sections), when they hold the same values, are one object the reports share
  (`share_equal_parts`).

A shared object cannot be changed: a plugin that changes one report's part after logging gets
a `TypeError` that says why, never a change that shows on the item's other reports (or, for
the result's words, on every other item's); the result's words are frozen on every logged
eval report, shared or not, so that holds whatever came first. A copy (`dict(part)`,
`list(part)`, `copy.copy`, `copy.deepcopy`, pickling, JSON) is a plain, changeable one;
pytest's `pytest_report_to_serializable` dict holds the report's parts themselves, frozen ones
included, as it holds every other part.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NoReturn

from pytest_evalloop.sets.pin import CASES_FILE

SHARED_PARTS = ("keywords", "user_properties", "sections")
"""The parts pytest copies onto each of an item's reports."""

_REFUSED = (
    "this {kind} is shared by logged eval reports (pytest-evalloop keeps one copy of what an "
    "item's reports, or every item's status words, hold alike): it cannot be changed once they "
    "are logged; change it in pytest_runtest_logreport, or replace the report's attribute"
)


def is_cases_path(path: str) -> bool:
    """Whether a location's path names a set's cases file: its file name is exactly
    `cases.jsonl` (another plugin's `api_cases.jsonl` is not one), with either separator."""
    return re.split(r"[\\/]", str(path))[-1] == CASES_FILE


def is_eval_report(report: Any) -> bool:
    """Whether a report is an eval item's, by its location: what the controller knows of an
    item that ran in an xdist worker."""
    location = getattr(report, "location", None)
    return isinstance(location, tuple) and bool(location) and is_cases_path(location[0])


class SharedDict(dict[Any, Any]):
    """A dict that logged reports share: read like any dict, never changed."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(_REFUSED.format(kind="dict"))

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


class SharedList(list[Any]):
    """A list that logged reports share: read like any list, never changed."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(_REFUSED.format(kind="list"))

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = clear = extend = insert = pop = remove = reverse = sort = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


_PLAIN = (str, bytes, int, float, bool, type(None))


def same_value(one: Any, other: Any) -> bool:
    """Whether two parts hold the same values, kinds included: `0` is not `False`, `1` is not
    `1.0`, keys in the same order; a value of any other kind only when it is the same object."""
    if one is other:
        return True
    if isinstance(one, dict) and isinstance(other, dict):
        return list(one) == list(other) and all(
            type(k) is str and same_value(one[k], other[k]) for k in one
        )
    if isinstance(one, list | tuple) and isinstance(other, list | tuple):
        if isinstance(one, tuple) != isinstance(other, tuple) or len(one) != len(other):
            return False
        return all(same_value(a, b) for a, b in zip(one, other, strict=True))
    if type(one) is not type(other) or not isinstance(one, _PLAIN):
        return False
    if isinstance(one, float):  # -0.0 is not 0.0 (== says it is)
        return one.hex() == other.hex()
    return bool(one == other)


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return value if isinstance(value, SharedDict) else SharedDict(value)
    if isinstance(value, list):
        return value if isinstance(value, SharedList) else SharedList(value)
    return value if isinstance(value, tuple) else None


def share_equal_parts(reports: Sequence[Any]) -> None:
    """Let an item's logged reports hold one object for each of `SHARED_PARTS` whose values
    are the same among them (`same_value`): pytest keeps every report to the session's end,
    and each of an item's three holds its own copy of the item's keywords (a dict of every
    name up its chain), its user_properties and its sections. A part that differs (a marker
    added during the call) stays the report's own."""
    for name in SHARED_PARTS:
        groups: list[list[Any]] = []
        for report in reports:
            value = getattr(report, name, None)
            if not isinstance(value, dict | list | tuple):
                continue
            group = next((g for g in groups if same_value(getattr(g[0], name), value)), None)
            if group is None:
                groups.append([report])
            else:
                group.append(report)
        for group in groups:
            if len(group) < 2:
                continue
            shared = _frozen(getattr(group[0], name))
            if shared is None:
                continue
            for report in group:
                setattr(report, name, shared)


def slimmed(result: dict[str, Any]) -> dict[str, Any]:
    """What a logged report keeps of its result: the words the terminal summary asks of it
    (the status words, `-r` lines, a no_match's why; `pytest_report_teststatus` again at the
    summary). Everything else was counted or handed on while it was logged."""
    kept = {"status": result.get("status"), "reason": result.get("reason", "")}
    if result.get("status") == "no_match" and result.get("why"):
        kept["why"] = result["why"]
        return SharedDict(kept)
    # Frozen whatever it says, so a change after logging fails the same way on every item.
    # Most items say the same few words with no reason ("match"): one dict for all of them.
    # A reason is the judge's free text, so those with one are each their own.
    status = kept["status"]
    if kept["reason"] or not isinstance(status, str | None):
        return SharedDict(kept)
    shared = _NO_REASON.get(status)
    if shared is None:
        shared = _NO_REASON[status] = SharedDict(kept)
    return shared


_NO_REASON: dict[str | None, SharedDict] = {}
"""One frozen `{status, reason: ""}` per status word (a handful)."""
