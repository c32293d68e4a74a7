from __future__ import annotations

from pathlib import Path

import pytest

from pytest_evalloop.measure.calibration import (
    BAND_PINS,
    MARKER,
    CalibrationBand,
    load_calibration,
    parse_calibration,
    render_block,
)

REAL_CALIBRATION = Path("/work/shared/reference/malloy-samples/evals/ecommerce/CALIBRATION.md")

PINS = {
    "datasetSha": "d" * 64,
    "judgeVersion": "4",
    "rubricSha": "r" * 64,
    "answererModel": "claude-sonnet-4-5",
    "judgeModel": "claude-sonnet-4-5",
    "answerer": "anthropic",
    "target": "embedded",
    "targetProfile": "embedded",
}


def band(n: int, measured: str = "2026-11-30", **pin_changes: object) -> CalibrationBand:
    return CalibrationBand(
        band=n,
        measured=measured,
        runs=["ecommerce-aa-01", "ecommerce-aa-02"],
        pins={**PINS, **pin_changes},
        scoredInBoth=45,
        flipped=["q3", "q17"][:n],
    )


def test_render_then_parse_round_trips() -> None:
    original = band(2)
    text = "# Calibration record\n\nSome prose.\n\n" + render_block(original)
    parsed = parse_calibration(text)
    assert parsed.problems == []
    [back] = parsed.bands
    assert back.model_dump() == original.model_dump()
    assert back.source == "CALIBRATION.md:10"  # the marker line


def test_rendered_block_names_every_pin_and_is_plain_markdown() -> None:
    text = render_block(band(1))
    assert MARKER in text and "```json" in text
    for name in BAND_PINS:
        assert f'"{name}"' in text
    assert "ecommerce-aa-01" in text and "1 flip(s)" in text
    assert all(len(line) < 100 for line in text.splitlines())


def test_render_says_when_a_pin_is_unset() -> None:
    text = render_block(band(0, judgeVersion=None))
    assert "Unset pins (judgeVersion): no run can match this block." in text


def test_band_for_needs_every_pin_to_match() -> None:
    cal = parse_calibration(render_block(band(2)))
    assert cal.band_for(PINS) is not None
    assert cal.band_for(PINS).band == 2  # type: ignore[union-attr]
    for name in BAND_PINS:
        assert cal.band_for({**PINS, name: "something else"}) is None, name
    assert cal.band_for({**PINS, "judgeVersion": None}) is None


def test_a_block_with_an_unset_pin_never_matches() -> None:
    cal = parse_calibration(render_block(band(2, rubricSha=None)))
    assert cal.bands and cal.band_for({**PINS, "rubricSha": None}) is None


def test_several_matching_blocks_give_the_largest_band() -> None:
    text = "\n".join(
        [
            render_block(band(1, "2026-11-01")),
            render_block(band(3, "2026-11-02")),
            render_block(band(2, "2026-11-03")),
            render_block(band(9, "2026-11-04", judgeVersion="5")),
        ]
    )
    chosen = parse_calibration(text).band_for(PINS)
    assert chosen is not None and (chosen.band, chosen.measured) == (3, "2026-11-02")


def test_malformed_block_is_a_problem_and_others_still_parse() -> None:
    broken = f"{MARKER}\n```json\n{{not json\n```\n"
    invalid = f'{MARKER}\n```json\n{{"band": -1, "measured": "x", "runs": [], "pins": {{}}}}\n```\n'
    cal = parse_calibration(broken + "\n" + invalid + "\n" + render_block(band(1)))
    assert [b.band for b in cal.bands] == [1]
    assert len(cal.problems) == 2
    assert cal.problems[0].startswith("CALIBRATION.md:1: calibration block unreadable")
    assert "--calibration" in cal.problems[0]


def test_marker_without_a_json_block_is_reported() -> None:
    cal = parse_calibration(f"{MARKER}\n\nprose only\n")
    assert cal.bands == []
    assert cal.problems == [
        "CALIBRATION.md: 1 calibration marker(s) but only 0 followed by a ```json block"
    ]


def test_the_real_hand_written_file_parses_to_no_band() -> None:
    if not REAL_CALIBRATION.is_file():
        pytest.fail(f"reference file missing: {REAL_CALIBRATION}")
    cal = load_calibration(REAL_CALIBRATION)
    assert cal.bands == [] and cal.problems == []
    assert cal.band_for(PINS) is None


def test_missing_file_is_an_empty_record(tmp_path: Path) -> None:
    cal = load_calibration(tmp_path / "CALIBRATION.md")
    assert cal.bands == [] and cal.problems == [] and cal.band_for(PINS) is None


def test_appended_blocks_accumulate_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "CALIBRATION.md"
    path.write_text("# Calibration record: ecommerce\n\nprose\n```bash\necho hi\n```\n")
    with path.open("a") as handle:
        handle.write(render_block(band(2)))
        handle.write(render_block(band(4, answererModel="other")))
    cal = load_calibration(path)
    assert [b.band for b in cal.bands] == [2, 4]
    assert cal.band_for(PINS).band == 2  # type: ignore[union-attr]
    assert cal.band_for({**PINS, "answererModel": "other"}).band == 4  # type: ignore[union-attr]
    assert str(path) in (cal.bands[0].source or "")
