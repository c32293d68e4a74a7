"""The ledger contract: strict writes, tolerant reads, labels, and `evalloop validate`."""

from __future__ import annotations

import gc
import json
import multiprocessing
from pathlib import Path

import pytest

from pytest_evalloop.cli import main as cli
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.ledger import gcpolicy, seal
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger import writer as ledger_writer
from pytest_evalloop.measure import aggregates


def _info(run_id: str = "ecommerce-baseline-01", **extra: object) -> ledger.RunInfo:
    data = {
        "runId": run_id,
        "label": run_id,
        "target": "embedded:ecommerce",
        "answererModel": "claude-x",
        "phase": "baseline",
        "started": ledger.now_iso(),
        "judgeModel": "claude-y",
        "judgeVersion": "1",
        "rubricSha": "abc",
        "datasetVersion": 1,
        "datasetSha": "def",
        **extra,
    }
    return ledger.RunInfo.model_validate(data)


def _attempt(qid: str, sample: int | None = None) -> ledger.AttemptEvent:
    return ledger.AttemptEvent(
        qid=qid,
        sample=sample,
        phase="baseline",
        question_sha="0" * 16,
        submitted=True,
        final_query="SELECT 1",
        contaminated=False,
    )


def _score(qid: str, verdict: str = "match") -> ledger.ScoreEvent:
    return ledger.ScoreEvent(
        qid=qid,
        sample=None,
        phase="baseline",
        verdict=verdict,  # type: ignore[arg-type]
        reason="judged",
        contaminated=False,
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "ecommerce-baseline-01"
    ledger_writer.write_run_info(run, _info())
    writer = ledger_writer.LedgerWriter(run)
    for qid in ("a", "b"):
        writer.append(_attempt(qid), _score(qid))
    return run


def test_writer_output_validates_clean(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    read = ledger_reader.read_run(run_dir)
    assert read.findings == []
    assert [e.kind for e in read.events] == ["attempt", "score", "attempt", "score"]
    assert cli(["validate", str(run_dir)]) == 0
    assert "valid: 0 errors, 0 warnings" in capsys.readouterr().out


def test_every_line_is_one_complete_json_object_kind_first(run_dir: Path) -> None:
    raw = (run_dir / ledger.EVENTS_FILE).read_text(encoding="utf-8")
    assert raw.endswith("\n")
    for line in raw.splitlines():
        assert line.startswith('{"kind": ')
        json.loads(line)


def test_strict_on_write(run_dir: Path) -> None:
    event = _attempt("c")
    event.model_extra["surprise"] = 1  # type: ignore[index]
    with pytest.raises(ledger.LedgerWriteError, match="surprise"):
        ledger_writer.LedgerWriter(run_dir).append(event)
    with pytest.raises(ValueError):
        ledger.ScoreEvent(qid="c", sample=None, phase="p", verdict="great", reason="r")  # type: ignore[arg-type]


def test_torn_last_line_missing_field_and_duplicate_score_are_errors(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    info = json.loads((run_dir / ledger.RUN_FILE).read_text())
    del info["answererModel"]
    (run_dir / ledger.RUN_FILE).write_text(json.dumps(info))
    ledger_writer.LedgerWriter(run_dir).append(_score("a", "no_match"))
    with open(run_dir / ledger.EVENTS_FILE, "a", encoding="utf-8") as handle:
        handle.write('{"kind": "score", "qid": "b", "sam')
    assert cli(["validate", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert "missing required field: 'answererModel'" in out
    assert "two score events for one attempt (qid 'a', sample None)" in out
    assert "torn last line" in out
    assert "events.jsonl ends in a torn line (line 6)" in out  # and the chain says so too
    assert "INVALID: 4 errors" in out


def test_no_run_json_and_not_a_dir_are_usage_errors(tmp_path: Path) -> None:
    """A folder that is not a run names no ledger to validate: a usage error, as docs/configuration.md
    says, never `INVALID` (which would say a run was there and broke)."""
    (tmp_path / "r").mkdir()
    assert cli(["validate", str(tmp_path / "r")]) == 2
    assert cli(["validate", str(tmp_path / "nope")]) == 2


def test_tolerant_read_legacy_gate_string_booleans_unknown_fields(run_dir: Path) -> None:
    lines = [
        {"kind": "gate", "decision": "accepted", "reason": "old"},
        {
            "kind": "attempt",
            "qid": "c",
            "sample": None,
            "phase": "baseline",
            "question_sha": "x",
            "submitted": True,
            "final_query": "q",
            "contaminated": "false",
            "newField": 1,
        },
    ]
    with open(run_dir / ledger.EVENTS_FILE, "a", encoding="utf-8") as handle:
        handle.writelines(json.dumps(line) + "\n" for line in lines)
    (run_dir / seal.CHAIN_FILE).unlink()  # a ledger written before chains
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    warnings = " ".join(str(w) for w in read.warnings)
    assert "legacy kind 'gate' read as 'acceptance_check'" in warnings
    assert "grandfathered string contaminated='false'" in warnings
    assert "unknown fields ['newField']" in warnings
    assert read.attempts()[("c", None)].contaminated is False


def test_missing_pins_are_warnings(tmp_path: Path) -> None:
    run = tmp_path / "r"
    ledger_writer.write_run_info(
        run,
        ledger.RunInfo.model_validate(
            {"runId": "r", "target": "t", "answererModel": "m", "phase": "p", "started": "s"}
        ),
    )
    read = ledger_reader.read_run(run)
    assert read.errors == []
    assert {w.message for w in read.warnings} >= {f"missing pin {p!r}" for p in ledger.PINS}


def test_labels_take_the_smallest_unused_number(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    assert ledger_writer.next_label(runs, "ecommerce", "baseline") == "ecommerce-baseline-01"
    (runs / "ecommerce-baseline-01").mkdir(parents=True)
    ledger_writer.write_run_info(runs / "renamed", _info("ecommerce-baseline-02"))
    (runs / "ecommerce-baseline-04").mkdir()
    (runs / "ecommerce-loop-03").mkdir()
    assert ledger_writer.next_label(runs, "ecommerce", "baseline") == "ecommerce-baseline-03"
    assert ledger_writer.next_label(runs, "ecommerce", "loop") == "ecommerce-loop-01"


def _append_many(run_dir: str, worker: int) -> None:
    writer = ledger_writer.LedgerWriter(Path(run_dir))
    for i in range(200):
        writer.append(_attempt(f"w{worker}-{i}" + "x" * 5000), _score(f"w{worker}-{i}"))


def test_concurrent_processes_never_interleave_lines(run_dir: Path) -> None:
    ctx = multiprocessing.get_context("spawn")  # no fork of a process whose threads hold locks
    procs = [ctx.Process(target=_append_many, args=(str(run_dir), w)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    read = ledger_reader.read_run(run_dir)
    assert read.errors == []
    assert len(read.of_kind("attempt")) == 2 + 600


def test_schema_command_prints_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "runId" in schema["run.json"]["properties"]
    kinds = json.dumps(schema["event"])
    for kind in ledger.EVENT_KINDS:
        assert kind in kinds


# --- reading large runs for comparisons ----------------------------------------------------

COMPARED = frozenset({"attempt", "score"})


def _tool_call(qid: str) -> ledger.ToolCallEvent:
    return ledger.ToolCallEvent(
        qid=qid, sample=None, phase="baseline", tool="execute_query", role="query", seq=1
    )


def test_partial_read_gives_the_full_reads_values_and_refuses_other_keys(run_dir: Path) -> None:
    ledger_writer.LedgerWriter(run_dir).append(_tool_call("a"), _score("c", "no_match"))
    full = ledger_reader.read_run(run_dir, kinds=COMPARED)
    fields = frozenset({"verdict", "final_query", "contaminated"})
    part = ledger_reader.read_run(run_dir, kinds=COMPARED, validate=False, fields=fields)
    assert part.findings == full.findings == []
    assert [e.kind for e in part.events] == [e.kind for e in full.events]
    for got, want in zip(part.events, full.events, strict=True):
        assert isinstance(got, ledger_reader.PartialEvent)
        for key in ("kind", "qid", "sample", *fields):
            assert getattr(got, key) == getattr(want, key, None), key
    with pytest.raises(AttributeError, match="'reason' was not read"):
        _ = part.events[1].reason
    assert set(part.scores()) == set(full.scores()) == {("a", None), ("b", None), ("c", None)}


def test_light_read_reports_bad_lines_instead_of_raising(run_dir: Path) -> None:
    with open(run_dir / ledger.EVENTS_FILE, "a", encoding="utf-8") as handle:
        handle.write('{"kind": "score", "qid": "x", not json\n')  # ours by its prefix, broken
        handle.write('{"kind": "score_x", "qid": "y", "sample": null}\n')  # not a score
        handle.write('{"kind": "tool_call", "qid": "z", "sam')  # a skipped kind, torn
    for fields in (None, frozenset({"verdict"})):
        read = ledger_reader.read_run(run_dir, kinds=COMPARED, validate=False, fields=fields)
        messages = [(f.where.rsplit(":", 1)[1], f.message) for f in read.findings]
        assert ("5", "invalid JSON") in messages
        assert any(where == "7" and "torn last line" in m for where, m in messages)
        assert set(read.scores()) == {("a", None), ("b", None)}


def test_reading_pauses_the_collector_and_restores_its_state(run_dir: Path) -> None:
    assert gc.isenabled()
    with gcpolicy.gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        ledger_reader.read_run(run_dir, validate=False)
        assert not gc.isenabled()  # a caller's own pause is left alone
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), gcpolicy.gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_models_build_their_validators_on_first_use() -> None:
    # Deferred builds still validate: the first use of each model builds it.
    with pytest.raises(ValueError, match="verdict"):
        ledger.ScoreEvent(qid="q", sample=None, phase="p", verdict="great", reason="r")  # type: ignore[arg-type]
    event, warnings = ledger.parse_event({"kind": "gate", "qid": "q", "decision": "accepted"})
    assert isinstance(event, ledger.AcceptanceCheckEvent) and warnings


def test_closing_a_run_counts_what_a_full_validated_read_counts(tmp_path: Path) -> None:
    from pytest_evalloop.session import runs

    run = tmp_path / "runs" / "closing"
    ledger_writer.write_run_info(run, _info("closing"))
    writer = ledger_writer.LedgerWriter(run)
    for i, qid in enumerate(("a", "b", "c")):
        attempt = _attempt(qid).model_copy(
            update={"input_tokens": 100 + i, "output_tokens": 7, "cost_usd": 0.25}
        )
        score = _score(qid).model_copy(
            update={"input_tokens": 40, "cache_read_tokens": 3 * i, "cost_usd": 0.125}
        )
        if qid == "b":
            score = score.model_copy(update={"gold_status": "suspect", "gold_note": "odd rows"})
        writer.append(
            attempt, ledger.ToolCallEvent(qid=qid, sample=None, phase="baseline", tool="t"), score
        )
    full = ledger_reader.read_run(run)

    closed = runs.finish_run(run, interrupted=False)

    info = ledger_reader.read_run_info(run)
    assert info.status == "complete"
    assert aggregates.role_costs(closed) == aggregates.role_costs(full)
    assert info.costs["answerer"].input_tokens == 303 and info.costs["answerer"].calls == 3
    assert info.costs["judge"].cache_read_tokens == 9 and info.costs["judge"].cost_usd == 0.375
    assert info.doubted_goldens == [{"qid": "b", "gold_status": "suspect", "gold_note": "odd rows"}]


@pytest.mark.parametrize("rejudge", [False, True])
def test_the_cost_table_counts_requests_not_lines(tmp_path: Path, rejudge: bool) -> None:
    # Issue 25 (7). Before: `calls` counted attempts (44 where 132 requests were made) and 4
    # answerer calls for a rejudge that made none.
    from pytest_evalloop.session import runs

    run = tmp_path / "runs" / "r"
    extra = {"rejudgeOf": "source"} if rejudge else {}
    ledger_writer.write_run_info(run, _info("r", **extra))
    writer = ledger_writer.LedgerWriter(run)
    for qid, turns, tries in (("a", 3, 1), ("b", 2, 2), ("c", 4, 0)):
        attempt = _attempt(qid).model_copy(
            update={"num_turns": turns, "input_tokens": 10, "cost_usd": 0.0}
        )
        score = _score(qid).model_copy(
            update={"judge_attempts": tries, "input_tokens": 5, "cost_usd": 0.0}
        )
        writer.append(attempt, score)
    closed = runs.finish_run(run, interrupted=False)
    costs = ledger_reader.read_run_info(run).costs
    assert costs["answerer"].calls == (0 if rejudge else 9)
    assert costs["judge"].calls == 3
    assert aggregates.role_costs(closed) == aggregates.role_costs(ledger_reader.read_run(run))


# --- nothing derived is read ---------------------------------------------------------------

LIGHT = {"kinds": frozenset({"attempt", "score"}), "validate": False}


def _light(
    run: Path, fields: frozenset[str] = ledger_reader.COMPARED_FIELDS
) -> ledger_reader.RunLedger:
    return ledger_reader.read_run(run, fields=fields, **LIGHT)  # type: ignore[arg-type]


def _verdicts(read: ledger_reader.RunLedger) -> dict[str, str]:
    return {e.qid: e.verdict for e in read.of_kind("score")}


def test_a_forged_read_cache_is_never_read(run_dir: Path) -> None:
    # An earlier version kept light reads in events.cache.json, stamped with the ledger's
    # inode, size and mtime: a file anyone could rewrite with a matching stamp and other
    # verdicts, which a gate then read. Every read parses the ledger itself now.
    stat = (run_dir / ledger.EVENTS_FILE).stat()
    forged = {
        "format": 1,
        "stamp": [stat.st_ino, stat.st_size, stat.st_mtime_ns],
        "kinds": ["attempt", "score"],
        "fields": sorted(ledger_reader.COMPARED_FIELDS | {"kind", "qid", "sample"}),
        "events": [{"kind": "score", "qid": "a", "sample": None, "verdict": "no_match"}],
    }
    (run_dir / "events.cache.json").write_text(json.dumps(forged))
    assert _verdicts(_light(run_dir)) == {"a": "match", "b": "match"}
    assert _verdicts(ledger_reader.read_run(run_dir)) == {"a": "match", "b": "match"}
    with pytest.raises(AttributeError, match="final_query"):
        _ = _light(run_dir, fields=frozenset({"verdict"})).of_kind("attempt")[0].final_query


def test_a_lone_surrogate_in_an_event_is_written_and_reads_back_the_same(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Half a UTF-16 pair (a model's reply may escape one; json.loads hands it back as is) has
    no UTF-8 form: appending it failed the attempt. It goes as its JSON escape, and reads back."""
    reason = "an emoji cut in half: \ud83d."
    event = _score("c")
    event.reason = reason
    ledger_writer.LedgerWriter(run_dir).append(_attempt("c"), event)
    raw = (run_dir / ledger.EVENTS_FILE).read_bytes()
    raw.decode("utf-8")  # strict: the file is UTF-8
    assert b"\\ud83d" in raw
    read = ledger_reader.read_run(run_dir)
    assert read.findings == []
    assert [e.reason for e in read.events if e.kind == "score" and e.qid == "c"] == [reason]
    assert cli(["validate", str(run_dir)]) == 0
