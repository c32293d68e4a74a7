"""Undecided items in pytest's own reporting: `-v` status words, `-rs`/`-ra` reasons."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import QIDS, _example_rows, make_set, spec


@pytest.fixture
def mixed_run(pytester: pytest.Pytester, fake: FakeAnthropic) -> Any:
    """A four-case set scripted to one match, one near_match, one needs_human, one unscored."""
    qids = QIDS[:4]
    set_dir = make_set(pytester.path, qids)
    rows = _example_rows()
    q = {qid: rows[qid]["question"] for qid in qids}
    judge = {
        "default": {"verdict": "match", "confidence": 9},
        "by_question": {
            q[qids[1]]: {"verdict": "near_match", "confidence": 8, "why": "rounded to tens"},
            q[qids[2]]: {"verdict": "match", "confidence": 3, "why": "could not pair columns"},
        },
    }
    cases = (set_dir / "cases.jsonl").read_text(encoding="utf-8").splitlines()
    cases[3] = cases[3].replace('"status": "verified"', '"status": "provisional"', 1)
    (set_dir / "cases.jsonl").write_text("\n".join(cases) + "\n", encoding="utf-8")
    fake.policy = spec(set_dir, judge).policy()

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess(str(set_dir), "-p", "no:cacheprovider", *args)

    return run, qids


@pytest.mark.parametrize("chars", ["-rs", "-ra", "-rA"])
def test_short_summary_lists_undecided_items_with_their_reasons(mixed_run: Any, chars: str) -> None:
    run, qids = mixed_run
    result = run(chars)
    out = result.stdout.str()
    assert "short test summary info" in out, out
    tail = out[out.index("short test summary info") :]
    assert f"NEAR_MATCH evals/shop/cases.jsonl::{qids[1]} - rounded to tens" in tail
    assert f"NEEDS_HUMAN evals/shop/cases.jsonl::{qids[2]} - low_confidence" in tail
    assert "could not pair columns" in tail
    assert f"UNSCORED evals/shop/cases.jsonl::{qids[3]} - " in tail
    assert "provisional" in tail.split(qids[3], 1)[1].splitlines()[0]
    # a match is pytest's own passed line: listed once under -rA, not at all under -rs/-ra
    matches = tail.count(f"MATCH evals/shop/cases.jsonl::{qids[0]}\n")
    assert matches == (1 if chars == "-rA" else 0), tail


def test_without_r_chars_no_short_summary_and_v_shows_whole_words(mixed_run: Any) -> None:
    run, qids = mixed_run
    result = run("-vv", "-rN")
    out = result.stdout.str()
    assert "short test summary info" not in out
    for qid, word in zip(qids, ("MATCH", "NEAR_MATCH", "NEEDS_HUMAN", "UNSCORED"), strict=True):
        line = next(
            ln for ln in out.splitlines() if ln.startswith(f"evals/shop/cases.jsonl::{qid} ")
        )
        assert f" {word}" in line, line
    # -vv shows the whole reason beside the word (the terminal may wrap the line)
    assert f"{qids[1]} NEAR_MATCH (near_match: rounded to tens)" in " ".join(out.split()), out


def test_junit_skip_messages_carry_the_outcome_word(mixed_run: Any, tmp_path: Any) -> None:
    """Issue 24 point 9: a junit reader saw `<skipped message="rounded to tens">` only."""
    import xml.etree.ElementTree as ET

    run, qids = mixed_run
    xml = tmp_path / "junit.xml"
    run(f"--junitxml={xml}")
    skipped = {
        case.get("name"): skip.get("message") or ""
        for case in ET.parse(xml).getroot().iter("testcase")
        for skip in case.iter("skipped")
    }
    assert skipped[qids[1]] == "near_match: rounded to tens"
    assert skipped[qids[2]].startswith("needs_human: low_confidence")
    assert skipped[qids[3]].startswith("unscored: ") and "provisional" in skipped[qids[3]]
    assert qids[0] not in skipped
