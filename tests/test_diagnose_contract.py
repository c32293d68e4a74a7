"""The diagnose vocabulary as the ledger contract enforces it (seed 004, eval-diagnose).

`issue` and `issue_status` lines are refused on write and reported by `evalloop validate` when
they leave the seed's words: components, owners, codes per component, sufficiency, statuses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from pytest_evalloop import cli
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import vocabulary
from pytest_evalloop.ledger import writer as ledger_writer

GOOD_ISSUE: dict[str, Any] = {
    "kind": "issue",
    "issue_id": "run:missing-channel-join",
    "qids": ["q1", "q2"],
    "primary_code": "COVERAGE",
    "contributing_codes": ["NEVER-ASKED"],
    "component": "get_context/model",
    "owner": "model",
    "severity": "high",
    "confidence": "medium",
    "sufficiency": "insufficient",
    "traceIds": ["t1"],
    "diagnosis": "No join from order_items to users is declared.",
}


def make_run(tmp_path: Path, *events: dict[str, Any]) -> Path:
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    info = {
        "runId": "r1",
        "target": "embedded:shop",
        "answererModel": "m",
        "phase": "baseline",
        "started": "2026-01-01T00:00:00Z",
    }
    (run_dir / "run.json").write_text(json.dumps(info), encoding="utf-8")
    lines = "".join(json.dumps(e) + "\n" for e in events)
    (run_dir / "events.jsonl").write_text(lines, encoding="utf-8")
    return run_dir


def errors(run_dir: Path) -> list[str]:
    return [f.message for f in ledger_reader.read_run(run_dir).errors]


def test_a_good_issue_and_its_status_validate(tmp_path: Path, capsys: Any) -> None:
    run_dir = make_run(
        tmp_path,
        GOOD_ISSUE,
        {"kind": "issue_status", "issue_id": GOOD_ISSUE["issue_id"], "status": "open"},
    )
    assert errors(run_dir) == []
    assert cli.main(["validate", str(run_dir)]) == cli.EXIT_OK
    assert '"issue": 1' in capsys.readouterr().out


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"component": "C1"}, "'C1'"),
        ({"owner": "environment"}, "'environment'"),
        ({"primary_code": "WRONG-NUMBER"}, "WRONG-NUMBER"),
        ({"primary_code": "GRAIN"}, "not of get_context/model"),
        ({"contributing_codes": ["MADE-UP"]}, "MADE-UP"),
        (
            {"component": "construction", "primary_code": "GRAIN", "sufficiency": "unknown"},
            "construction with sufficiency 'unknown'",
        ),
        ({"sufficiency": "probably"}, "sufficiency"),
        (
            {"component": "dataset", "primary_code": "BAD-REFERENCE"},
            "the code table gives BAD-REFERENCE to dataset",
        ),
        (
            {"component": "get_context/retrieval", "primary_code": "RETRIEVAL"},
            "owner 'model' for RETRIEVAL (get_context/retrieval)",
        ),
    ],
)
def test_validate_rejects_words_outside_the_vocabulary(
    tmp_path: Path, capsys: Any, change: dict[str, Any], said: str
) -> None:
    run_dir = make_run(tmp_path, {**GOOD_ISSUE, **change})
    found = errors(run_dir)
    assert len(found) == 1 and said in found[0], found
    assert cli.main(["validate", str(run_dir)]) == cli.EXIT_INVALID
    assert said in capsys.readouterr().out


def test_the_writer_refuses_them_too() -> None:
    with pytest.raises(ValidationError, match="C1"):
        ledger.IssueEvent.model_validate({**GOOD_ISSUE, "component": "C1"})
    with pytest.raises(ValidationError, match="environment"):
        ledger.IssueEvent.model_validate({**GOOD_ISSUE, "owner": "environment"})
    with pytest.raises(ValidationError, match="status"):
        ledger.IssueStatusEvent.model_validate({"issue_id": "x", "status": "closed"})


def test_a_status_for_an_undeclared_issue_is_an_error(tmp_path: Path) -> None:
    run_dir = make_run(
        tmp_path, GOOD_ISSUE, {"kind": "issue_status", "issue_id": "nobody", "status": "fixed"}
    )
    [found] = errors(run_dir)
    assert "'nobody'" in found and "no issue event declares" in found


def test_readers_take_the_latest_status(tmp_path: Path) -> None:
    issue_id = GOOD_ISSUE["issue_id"]
    run_dir = make_run(
        tmp_path,
        GOOD_ISSUE,
        {"kind": "issue_status", "issue_id": issue_id, "status": "open"},
        {"kind": "issue_status", "issue_id": issue_id, "status": "batched"},
        {"kind": "issue_status", "issue_id": issue_id, "status": "deferred", "by": "person"},
    )
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    assert read.issue_statuses()[issue_id].status == "deferred"


@given(
    component=st.sampled_from([*vocabulary.ALL_COMPONENTS, "C1", "C2", "environment"]),
    owner=st.sampled_from([*ledger.OWNERS, "environment", "package-skill"]),
    code=st.sampled_from([*sorted(vocabulary.ALL_CODES), "C1", "MADE-UP"]),
    sufficiency=st.sampled_from(["sufficient", "insufficient", "unknown"]),
)
def test_an_issue_is_accepted_exactly_when_every_word_is_the_seeds(
    component: str, owner: str, code: str, sufficiency: str
) -> None:
    data = {
        **GOOD_ISSUE,
        "component": component,
        "owner": owner,
        "primary_code": code,
        "sufficiency": sufficiency,
    }
    row = vocabulary.code_of(component, code)
    legal = (
        row is not None
        and owner in row.owners  # the code table gives each code its owners
        and (component != "construction" or sufficiency == "sufficient")
    )
    try:
        ledger.IssueEvent.model_validate(data)
    except ValidationError:
        assert not legal
    else:
        assert legal


def test_replace_events_drops_only_the_selected_lines(tmp_path: Path) -> None:
    other = {"kind": "checkpoint", "action": "created", "label": "x", "at": "2026-01-01T00:00:00Z"}
    run_dir = make_run(tmp_path, other, GOOD_ISSUE, other)
    before = (run_dir / "events.jsonl").read_bytes().split(b"\n")
    fresh = ledger.IssueEvent.model_validate({**GOOD_ISSUE, "issue_id": "run:new"})
    dropped = ledger_writer.replace_events(run_dir, lambda d: d["kind"] == "issue", [fresh])
    after = (run_dir / "events.jsonl").read_bytes().split(b"\n")
    assert dropped == 1
    assert after[0] == before[0] and after[1] == before[2]  # the other stage's bytes, in order
    read = ledger_reader.read_run(run_dir)
    assert read.errors == [] and list(read.issues()) == ["run:new"]


def test_a_line_diagnose_v1_wrote_keeps_validating_with_a_warning(
    tmp_path: Path, capsys: Any
) -> None:
    # Diagnose v1 did not hold owners to the code table: its runs must keep validating (their
    # measurements are not the diagnosis's), and say what improve will refuse.
    old = {**GOOD_ISSUE, "primary_code": "NO-DISAMBIG", "component": "agent-call"}
    old |= {"owner": "agent-skill", "diagnose_version": "1"}
    run_dir = make_run(tmp_path, old)
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    [warning] = [w.message for w in read.warnings if "NO-DISAMBIG" in w.message]
    assert "written by diagnose v1: owner 'agent-skill' for NO-DISAMBIG" in warning
    assert "improve refuses it" in warning
    assert cli.main(["validate", str(run_dir)]) == cli.EXIT_OK
    capsys.readouterr()
    # Written today (or by hand), the same line is an error.
    strict = make_run(tmp_path / "now", {**old, "diagnose_version": "2"})
    assert any("the code table gives NO-DISAMBIG to model" in e for e in errors(strict))
    # Even a v1 line keeps dataset with dataset.
    mixed = make_run(tmp_path / "mixed", {**old, "owner": "dataset"})
    assert any("agent-call" in e and "owns itself" in e for e in errors(mixed))
