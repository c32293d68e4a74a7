"""Loading sets, cases and judge regressions: the real malloy-samples set as the fixture."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalloop.sets import cases as sets
from tests.conftest import MALLOY_SET


def test_real_set_loads_with_every_seal_reproduced() -> None:
    loaded = sets.load_cases(MALLOY_SET)
    assert loaded.errors == []
    assert len(loaded.rows) == 49
    for _, case in loaded.rows:
        assert case.question_sha == sets.question_sha(case.question)
    splits = [c.split for _, c in loaded.rows]
    assert (splits.count("dev"), splits.count("holdout")) == (35, 14)


def test_unknown_fields_are_kept_verbatim() -> None:
    line = (MALLOY_SET / sets.CASES_FILE).read_text(encoding="utf-8").splitlines()[0]
    original = json.loads(line)
    case = sets.Case.model_validate(original)
    assert case.raw() == original
    assert case.model_extra and "a9Group" in case.model_extra


def test_judge_regressions_load_and_prediction_shas_reproduce() -> None:
    loaded = sets.load_regressions(MALLOY_SET)
    assert loaded.errors == []
    assert len(loaded.rows) == 12
    for _, row in loaded.rows:
        assert row.prediction_sha == sets.prediction_sha(row.prediction)


def test_edited_prediction_breaks_its_seal(malloy_set: Path) -> None:
    path = malloy_set / sets.REGRESSIONS_FILE
    lines = path.read_text(encoding="utf-8").splitlines()
    row = json.loads(lines[2])
    row["prediction"]["final_query"] += " -- edited"
    lines[2] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    loaded = sets.load_regressions(malloy_set)
    assert len(loaded.rows) == 11
    [error] = loaded.errors
    assert error.line == 3 and "prediction edited after sealing" in error.message


def test_dataset_sha_is_name_nul_bytes_nul_over_both_files(malloy_set: Path) -> None:
    import hashlib

    digest = hashlib.sha256()
    for name in ("set.json", "cases.jsonl"):
        digest.update(name.encode() + b"\0" + (malloy_set / name).read_bytes() + b"\0")
    assert sets.dataset_sha(malloy_set) == digest.hexdigest()
    (malloy_set / "set.json").write_text("{}", encoding="utf-8")
    assert sets.dataset_sha(malloy_set) != digest.hexdigest()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "set.json:1: invalid JSON"),
        ("[]", "must hold a JSON object"),
        ('{"name": ""}', "field 'name'"),
        # The whole message: not "Invalid control character at" with nothing after it.
        (
            '{\n  "name": "a\tb"}',
            "set.json:2: invalid JSON: Invalid control character at line 2, "
            "column 13 (found '\\t')",
        ),
    ],
)
def test_bad_set_json_is_one_clear_error(malloy_set: Path, content: str, expected: str) -> None:
    (malloy_set / "set.json").write_text(content, encoding="utf-8")
    with pytest.raises(sets.SetError, match=re.escape(expected)):
        sets.load_set_config(malloy_set)


def test_set_json_that_is_not_utf8_is_one_clear_error(malloy_set: Path) -> None:
    (malloy_set / "set.json").write_bytes(b'{\n  "name": "caf\xe9"}')
    with pytest.raises(
        sets.SetError, match=r"set\.json:2: not valid UTF-8 at byte 15 \(b'\\xe9'\)"
    ):
        sets.load_set_config(malloy_set)


def test_a_row_after_a_line_that_is_not_utf8_still_loads(malloy_set: Path) -> None:
    path = malloy_set / sets.CASES_FILE
    lines = path.read_bytes().split(b"\n")
    lines[0] = b"\x80" + lines[0]
    path.write_bytes(b"\n".join(lines))
    loaded = sets.load_cases(malloy_set)
    [error] = loaded.errors
    assert (error.line, error.message) == (
        1,
        "not valid UTF-8 at byte 1 (b'\\x80'); save the file as UTF-8",
    )
    assert len(loaded.rows) == 48 and loaded.rows[0][0] == 2


def test_question_sha_is_the_first_16_hex_of_sha256() -> None:
    import hashlib

    text = "What were our 2022 bookings?"
    assert sets.question_sha(text) == hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("where", ["../outside/gold.json", "absolute", "gold/link.json"])
def test_a_golden_read_outside_the_set_is_refused(malloy_set: Path, where: str) -> None:
    outside = malloy_set.parent / "outside"
    outside.mkdir()
    (outside / "gold.json").write_text('[{"secret": 42}]', encoding="utf-8")
    if where == "absolute":
        where = str(outside / "gold.json")
    elif where == "gold/link.json":
        (malloy_set / "gold").mkdir(exist_ok=True)
        (malloy_set / "gold" / "link.json").symlink_to(outside / "gold.json")
    golden = {"kind": "rows", "path": where}
    with pytest.raises(sets.GoldenArtifactError, match="is not inside the set") as caught:
        sets.golden_value(malloy_set, golden)
    assert "42" not in str(caught.value).replace(str(malloy_set.parent), "")


def test_a_golden_artifact_json_error_is_whole(malloy_set: Path) -> None:
    (malloy_set / "gold").mkdir(exist_ok=True)
    (malloy_set / "gold" / "bad.json").write_text('[{"a": "x\ty"}]', encoding="utf-8")
    with pytest.raises(sets.GoldenArtifactError, match="Invalid control character at line 1"):
        sets.golden_value(malloy_set, {"kind": "rows", "path": "gold/bad.json"})


@pytest.mark.parametrize("which", ["malloy", "example"])
def test_shown_cases_show_what_load_cases_loads(which: str) -> None:
    from tests.conftest import EXAMPLE_SET

    set_dir = MALLOY_SET if which == "malloy" else EXAMPLE_SET
    shown = sets.shown_cases(set_dir)
    loaded = {case.qid: case for _, case in sets.load_cases(set_dir).rows}
    assert list(shown) == list(loaded)
    for qid, row in shown.items():
        case = loaded[qid]
        assert (row["question"], row["split"], row.get("coverage")) == (
            case.question,
            case.split,
            case.coverage,
        )
        assert row.get("tags", []) == case.tags
        golden = row.get("golden")
        assert (golden is None) == (case.golden is None)
        if golden is not None and case.golden is not None:
            assert golden["kind"] == case.golden.kind
            assert golden.get("value") == case.golden.value
            assert golden.get("mustState", []) == case.golden.must_state


def test_shown_cases_leave_out_what_load_cases_refuses(malloy_set: Path) -> None:
    path = malloy_set / sets.CASES_FILE
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    edited, wrong_split, first = rows[0], rows[1], rows[2]
    edited["question"] += " (edited)"  # its questionSha no longer matches
    wrong_split["split"] = "train"
    excluded = {**rows[3], "state": "excluded", "question": rows[3]["question"] + " (edited)"}
    lines = [json.dumps(r) for r in [edited, wrong_split, first, excluded, *rows[4:]]]
    lines.insert(3, json.dumps({**first, "question": "a later row of the same qid"}))
    lines.insert(4, "{not json")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    shown = sets.shown_cases(malloy_set)
    loaded = {case.qid: case for _, case in sets.load_cases(malloy_set).rows}
    assert edited["qid"] not in shown and wrong_split["qid"] not in shown
    assert shown[first["qid"]]["question"] == first["question"]
    assert shown[excluded["qid"]]["question"] == excluded["question"]  # excluded: no seal check
    assert list(shown) == list(loaded)


def test_a_seal_is_8_to_64_hex_of_the_question_in_either_case(malloy_set: Path) -> None:
    """Issue 24 point 9: the full hash and an upper-case prefix seal; a 2-hex stub does not."""
    import hashlib

    path = malloy_set / sets.CASES_FILE
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    full = [hashlib.sha256(r["question"].encode()).hexdigest() for r in rows]
    seals = [full[0], full[1][:16].upper(), full[2][:8], full[3][:2], full[4][:7], "zz" * 8]
    for row, seal in zip(rows, seals, strict=False):
        row["questionSha"] = seal
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    loaded = sets.load_cases(malloy_set)
    kept = {case.qid for _, case in loaded.rows}
    assert {rows[0]["qid"], rows[1]["qid"], rows[2]["qid"]} <= kept
    refused = {r["qid"] for r in rows[3:6]}
    assert not refused & kept
    messages = [e.message for e in loaded.errors]
    assert len(messages) == 3, messages
    assert all("is not a seal: 8 to 64 hex characters" in m for m in messages), messages
    assert any(full[3][:16] in m for m in messages)  # says what to write
    assert not any("edited after sealing" in m for m in messages)
    # Every reader applies the same rule.
    assert set(sets.shown_cases(malloy_set)) == kept
    assert sets.seal_problem(rows[0]["question"], full[0]) is None
    assert "edited after sealing" in (sets.seal_problem("another question", full[0]) or "")


def test_an_edited_gold_artifact_moves_the_dataset_sha(malloy_set: Path) -> None:
    """Issue 24 point 9: the golden lives in the artifact, so repairing it is a new dataset."""
    path = malloy_set / sets.CASES_FILE
    before_any = sets.dataset_sha(malloy_set)
    assert sets.dataset_sha(malloy_set) == before_any  # a pure function of the bytes
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    rows[0]["golden"] = {"kind": "rows", "path": "gold/first.json"}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (malloy_set / "gold").mkdir()
    artifact = malloy_set / "gold" / "first.json"
    artifact.write_text(json.dumps([{"total": 1}]), encoding="utf-8")
    first = sets.dataset_sha(malloy_set)
    assert first != before_any
    artifact.write_text(json.dumps([{"total": 2}]), encoding="utf-8")  # the repair
    second = sets.dataset_sha(malloy_set)
    assert second != first
    artifact.write_text(json.dumps([{"total": 1}]), encoding="utf-8")
    assert sets.dataset_sha(malloy_set) == first
    artifact.unlink()  # missing: a collection error, and still a pin of its own
    assert sets.dataset_sha(malloy_set) not in (first, second)


def _whole_file_pin(set_dir: Path) -> str:
    """datasetSha as it was computed before the pin read the file a line at a time: the
    whole file's bytes, its rows split by `bytes.splitlines`."""
    import hashlib

    digest = hashlib.sha256()
    cases_bytes = (set_dir / "cases.jsonl").read_bytes()
    for name, data in (
        ("set.json", (set_dir / "set.json").read_bytes()),
        ("cases.jsonl", cases_bytes),
    ):
        digest.update(name.encode() + b"\0" + data + b"\0")
    found = set()
    for line in cases_bytes.splitlines():
        if b'"path"' not in line:
            continue
        try:
            golden = json.loads(line).get("golden")
        except (ValueError, AttributeError):
            continue
        path = golden.get("path") if isinstance(golden, dict) else None
        if isinstance(path, str) and path:
            found.add(path)
    for path in sorted(found):
        digest.update(path.encode() + b"\0")
        try:
            digest.update(sets.golden_file(set_dir, path).read_bytes())
        except (OSError, ValueError):
            digest.update(b"\0missing")
        digest.update(b"\0")
    return digest.hexdigest()


_ROW_PARTS = st.sampled_from(
    [
        b'{"qid": "a", "golden": {"path": "gold/a.json"}}',
        b'{"qid": "b", "golden": {"path": "gold/b.json"}}',
        b'{"qid": "c", "golden": {"path": "../out.json"}}',
        b'{"qid": "d", "golden": {"path": "gold/missing.json"}}',
        b'{"qid": "e", "golden": {"value": 1}, "note": "\\"path\\""}',
        b'{"qid": "f", "golden": "path"}',
        b'{"path": "gold/a.json"}',
        b"[1, 2]",
        b"{not json",
        b"",
        b"   ",
        b"\xff\xfe",
    ]
)
_BREAKS = st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\n", b"\x0b", b""])


@settings(max_examples=80, deadline=None)
@given(
    parts=st.lists(st.tuples(_ROW_PARTS, _BREAKS), max_size=8),
    tail=st.booleans(),
    set_json=st.binary(max_size=40),
)
def test_the_pin_read_a_line_at_a_time_is_the_whole_file_pin(
    tmp_path_factory: pytest.TempPathFactory,
    parts: list[tuple[bytes, bytes]],
    tail: bool,
    set_json: bytes,
) -> None:
    """Any bytes in cases.jsonl (rows, junk, CRs, CRLFs, rows with no break between them, no
    newline at the end), gold artifacts present, missing or outside: the pin a line at a time
    is the pin of the whole file."""
    set_dir = tmp_path_factory.mktemp("pin")
    (set_dir / "gold").mkdir()
    (set_dir / "gold" / "a.json").write_bytes(b'{"rows": [1]}')
    (set_dir / "gold" / "b.json").write_bytes(b"")
    (set_dir / "set.json").write_bytes(set_json)
    data = b"".join(row + brk for row, brk in parts) + (b"\n" if tail else b"")
    (set_dir / "cases.jsonl").write_bytes(data)
    assert sets.dataset_sha(set_dir) == _whole_file_pin(set_dir)
