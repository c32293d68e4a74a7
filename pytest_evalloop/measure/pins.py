"""Which pins break a comparison, and which one is the change under test.

`run.json` pins what a run was: the set, the judge, the answerer, the target, and the model the
target actually served. Comparing two runs, the pins fall in three kinds:

- **breaking** (`BREAKING`): dataset, judge model, judge version, rubric sha (the doctrine),
  the judge's per-case prompt template (`judgePromptSha`), answerer model and backend, the
  answerer's system prompt (`answererPromptSha`), target (and its tool profile). Two runs that differ in one of them measure different
  things: their comparison is a rebase, not a delta.
- **under test** (`UNDER_TEST`): the served model (`modelSha`, and `servedRevision` where the
  target reports one). This is what a baseline comparison exists to change; a flip table names
  it as what changed. An A/A pair must not differ in it.
- **recorded** (`RECORDED`): versions of the tools (`answererVersion`, `harnessVersion`, the
  harness's git commit `harnessCommit`, `-dirty` when edited, `targetVersion`) and where an MCP URL target listened (`mcpUrl`: its host and port are the
  socket, not the model; the `target` pin holds the rest), kept for the record and shown when
  they differ, but neither a mismatch nor the change.

:func:`classify` is the one place that decides; the flip table, the baseline gate, calibration
bands and `--eval-resume` all call it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

BREAKING = (
    "datasetSha",
    "judgeModel",
    "judgeVersion",
    "rubricSha",
    "judgePromptSha",
    "answererModel",
    "answererPromptSha",
    "answerer",
    "target",
    "targetProfile",
)
"""Pins whose difference makes a comparison a rebase (run.json names)."""
UNDER_TEST = ("modelSha", "servedRevision")
"""The model the target served: the change a baseline comparison measures."""
RECORDED = ("answererVersion", "harnessVersion", "harnessCommit", "targetVersion", "mcpUrl")
"""Tool versions: recorded, shown when they differ, never a mismatch."""
ALL_PINS = BREAKING + UNDER_TEST + RECORDED

PinKind = Literal["breaking", "under_test", "recorded"]
OVERRIDE_FLAG = "--eval-allow-pin-mismatch"
"""The flag that lets a gate decide on a pair whose breaking pins differ."""


class PinDiff(BaseModel):
    """One pin whose value differs between two runs (None = unset)."""

    model_config = ConfigDict(defer_build=True)

    name: str
    baseline: Any
    current: Any


class PinComparison(BaseModel):
    """Every pin that differs between two runs, sorted by what the difference means."""

    model_config = ConfigDict(defer_build=True)

    breaking: list[PinDiff] = Field(default_factory=list)
    under_test: list[PinDiff] = Field(default_factory=list)
    recorded: list[PinDiff] = Field(default_factory=list)

    @property
    def comparable(self) -> bool:
        """No breaking pin differs: a delta, not a rebase."""
        return not self.breaking

    @property
    def same_configuration(self) -> bool:
        """Neither a breaking pin nor the model differs (an A/A pair, a resumable run)."""
        return not self.breaking and not self.under_test


def pins_of(info: Mapping[str, Any]) -> dict[str, Any]:
    """The pins of a run, by their run.json names, from its run.json data (unset -> None)."""
    return {name: _normal(info.get(name)) for name in ALL_PINS}


def _normal(value: Any) -> Any:
    if value == "":
        return None
    if isinstance(value, list):
        # A run that saw several served revisions: order is not meaning.
        return sorted(value) if len(value) != 1 else value[0]
    return value


def kind_of(name: str) -> PinKind:
    """What a difference in this pin means."""
    if name in BREAKING:
        return "breaking"
    if name in UNDER_TEST:
        return "under_test"
    if name in RECORDED:
        return "recorded"
    raise ValueError(f"{name!r} is not a pin; pins are {', '.join(ALL_PINS)}")


def classify(
    baseline: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    only_known: frozenset[str] = frozenset(),
) -> PinComparison:
    """Sort the pins that differ between two runs' pins (an unset pin differs from a set one).

    `only_known`: pins compared only when both sides have a value (a run that has not been
    served yet cannot know what it will be served).
    """
    found = PinComparison()
    for name in ALL_PINS:
        before, after = _normal(baseline.get(name)), _normal(current.get(name))
        if before == after:
            continue
        if name in only_known and (before is None or after is None):
            continue
        getattr(found, kind_of(name)).append(PinDiff(name=name, baseline=before, current=after))
    return found


def describe(diffs: list[PinDiff]) -> str:
    """`name: a -> b; ...`, for one-line messages."""
    return "; ".join(f"{d.name}: {show(d.baseline)} -> {show(d.current)}" for d in diffs)


def show(value: Any, width: int = 40) -> str:
    """A pin value for a terminal line (unset shown as such; long values cut)."""
    if isinstance(value, list):
        value = ", ".join(map(str, value))
    text = "(unset)" if value in (None, "") else str(value)
    return text if len(text) <= width else text[: width - 3] + "..."
