"""CALIBRATION.md blocks: the A/A noise band of a set, written by the tool and read back.

An A/A pair is two runs of the same configuration over the same set; every flip between them is
noise by construction, so their flip count is the set's noise band. A band is a property of the
configuration it was measured under, so each block names its pins and is quoted only for runs
whose pins all match (seed 004, eval-loop measurement).

A block is a marker comment followed by a fenced JSON object, so the rest of the file stays
prose a human writes::

    <!-- evalloop:calibration v1 -->
    ```json
    {"band": 2, "measured": "2026-11-30", "runs": ["a", "b"], "pins": {...}}
    ```

Hand-written prose (and other fenced blocks) around the markers is ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_evalloop.measure import pins as pin_rules

CALIBRATION_FILE = "CALIBRATION.md"
MARKER = "<!-- evalloop:calibration v1 -->"
# The pins a band belongs to: the breaking pins (`pins.BREAKING`), whose change can move it. The
# served model is not among them: a band measured on the baseline's model is quoted for the
# comparison of that baseline with an edited model.
# The prompt pins are breaking too, but a user's own judge or answerer may carry none: a band
# needs the others set, and records the prompt pins when they are (`matches` compares them all).
PROMPT_PINS = ("judgePromptSha", "answererPromptSha")
BAND_PINS = tuple(name for name in pin_rules.BREAKING if name not in PROMPT_PINS)

_BLOCK = re.compile(
    re.escape(MARKER) + r"[ \t]*\r?\n\s*```json[ \t]*\r?\n(?P<body>.*?)\r?\n[ \t]*```",
    re.DOTALL,
)


class CalibrationBand(BaseModel):
    """One measured A/A band and the configuration it belongs to."""

    model_config = ConfigDict(extra="ignore")

    band: int = Field(ge=0)
    """Cases that flipped (match <-> no_match) between the two runs of the A/A pair."""
    measured: str
    """The date the pair was compared (ISO, YYYY-MM-DD)."""
    runs: list[str] = Field(min_length=2, max_length=2)
    pins: dict[str, Any]
    scored_in_both: int | None = Field(default=None, alias="scoredInBoth")
    flipped: list[str] = Field(default_factory=list)
    """The qids that flipped: the contested cases to seed judge-regressions.jsonl from."""
    judge_band: int | None = Field(default=None, ge=0, alias="judgeBand")
    """Of the band, flips the judge explains (`evalloop noise`; None: not separated)."""
    answerer_band: int | None = Field(default=None, ge=0, alias="answererBand")
    """Of the band, flips the answerer explains (the answers differ; the judge was steady)."""
    unattributed_band: int | None = Field(default=None, ge=0, alias="unattributedBand")
    """Of the band, flips nothing could attribute (different answers, some judged once)."""
    unstable: list[str] | None = None
    """Cases that flipped, split their judges or their samples in the pair (`evalloop noise`);
    a comparison marks a flip on this list."""
    source: str | None = Field(default=None, exclude=True)
    """Where the block was read from (`file:line`), for messages; never rendered."""

    def matches(self, pins: dict[str, Any]) -> bool:
        """Whether a run with these pins may quote this band: every band pin set and equal."""
        if any(self.pins.get(name) in (None, "") for name in BAND_PINS):
            return False
        return pin_rules.classify(self.pins, pins).comparable


@dataclass
class Calibration:
    """The blocks of one CALIBRATION.md, and the blocks that could not be read."""

    bands: list[CalibrationBand] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def band_for(self, pins: dict[str, Any]) -> CalibrationBand | None:
        """The band a run with these pins may quote, or None when no block matches.

        When several A/A pairs were measured for one configuration, each is a floor on the
        true band, so the largest is returned (the latest among equals).
        """
        matching = [band for band in self.bands if band.matches(pins)]
        if not matching:
            return None
        return max(reversed(matching), key=lambda band: (band.band, band.measured))


def today() -> str:
    """Today's UTC date as YYYY-MM-DD."""
    return datetime.now(UTC).date().isoformat()


def render_block(band: CalibrationBand) -> str:
    """A CALIBRATION.md block for one A/A pair, ready to append to the file."""
    body = band.model_dump(mode="json", by_alias=True, exclude_none=True)
    body["pins"] = {name: band.pins.get(name) for name in BAND_PINS} | {
        name: band.pins[name] for name in PROMPT_PINS if band.pins.get(name) not in (None, "")
    }
    missing = [name for name in BAND_PINS if band.pins.get(name) in (None, "")]
    first, second = band.runs
    lines = [
        f"## A/A band: {band.band} flip(s), measured {band.measured}",
        "",
        f"Runs `{first}` and `{second}`: the same configuration twice, so every flip is noise.",
        "Quote this band only for runs whose pins all match the block below; it is a floor.",
    ]
    if band.judge_band is not None and band.answerer_band is not None:
        rest = band.unattributed_band or 0
        unattributed = f", {rest} unattributed (different answers judged once)" if rest else ""
        lines.append(
            f"Of the {band.band}: {band.judge_band} judge noise (the same answers judged again "
            f"could flip), {band.answerer_band} answerer noise (the answers differ)"
            f"{unattributed}."
        )
    if missing:
        lines.append(f"Unset pins ({', '.join(missing)}): no run can match this block.")
    lines += ["", MARKER, "```json", json.dumps(body, indent=2, ensure_ascii=False), "```", ""]
    return "\n".join(lines)


def parse_calibration(text: str, *, source: str = CALIBRATION_FILE) -> Calibration:
    """Every calibration block in a CALIBRATION.md; malformed blocks become problems."""
    found = Calibration()
    for match in _BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        where = f"{source}:{line}"
        try:
            data = json.loads(match["body"])
            band = CalibrationBand.model_validate(data)
        except (ValueError, ValidationError) as exc:
            detail = str(exc).splitlines()[0]
            found.problems.append(
                f"{where}: calibration block unreadable ({detail}); re-render it with "
                "`evalloop flips A B --calibration`"
            )
            continue
        band.source = where
        found.bands.append(band)
    markers = text.count(MARKER)
    if markers > len(found.bands) + len(found.problems):
        found.problems.append(
            f"{source}: {markers} calibration marker(s) but only "
            f"{len(found.bands) + len(found.problems)} followed by a ```json block"
        )
    return found


def load_calibration(path: Path) -> Calibration:
    """Parse a CALIBRATION.md file; a missing file is an empty record (no band)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Calibration()
    return parse_calibration(text, source=str(path))
