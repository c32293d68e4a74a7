"""Collection of sets as items, and the errors bad rows produce (run plain, -n 0 and -n 2)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.sets import cases as sets


def _rows(set_dir: Path) -> list[str]:
    return (set_dir / sets.CASES_FILE).read_text(encoding="utf-8").splitlines()


def _write(set_dir: Path, rows: list[str]) -> None:
    (set_dir / sets.CASES_FILE).write_text("\n".join(rows) + "\n", encoding="utf-8")


def test_collects_one_item_per_case(
    pytester: pytest.Pytester, malloy_set: Path, plugin_args: list[str]
) -> None:
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q", *plugin_args)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*cases.jsonl::ecom_2022_sales_bookings", "*49 tests collected*"])


@pytest.mark.parametrize(("split", "count"), [("dev", 35), ("holdout", 14), ("all", 49)])
def test_split_option(pytester: pytest.Pytester, malloy_set: Path, split: str, count: int) -> None:
    result = pytester.runpytest(
        str(malloy_set / "cases.jsonl"), "--collect-only", "-q", f"--eval-split={split}"
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"{count} tests collected*"])


def test_k_matches_qid_tags_and_split(pytester: pytest.Pytester, malloy_set: Path) -> None:
    by_tag = pytester.runpytest(str(malloy_set), "--collect-only", "-q", "-k", "fanout")
    tagged = [json.loads(r) for r in _rows(malloy_set) if "fanout" in json.loads(r)["tags"]]
    assert tagged, "the fixture set should carry fanout-tagged cases"
    by_tag.stdout.fnmatch_lines([f"{len(tagged)}/49 tests collected*"])
    by_split = pytester.runpytest(str(malloy_set), "--collect-only", "-q", "-k", "holdout")
    by_split.stdout.fnmatch_lines(["14/49 tests collected*"])
    by_qid = pytester.runpytest(str(malloy_set), "--collect-only", "-q", "-k", "ecom_yoy")
    by_qid.stdout.fnmatch_lines(["*::ecom_yoy", "1/49 tests collected*"])


def test_samples_suffix_and_excluded_rows(pytester: pytest.Pytester, malloy_set: Path) -> None:
    rows = _rows(malloy_set)
    first = json.loads(rows[0])
    first["state"] = "excluded"
    rows[0] = json.dumps(first)
    _write(malloy_set, rows)
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q", "--eval-samples=2")
    assert result.ret == 0
    out = result.stdout.str()
    assert "::ecom_2022_sales_casual[s1]" in out and "::ecom_2022_sales_casual[s2]" in out
    result.stdout.fnmatch_lines(["96 tests collected*"])
    assert first["qid"] not in result.stdout.str()


def _corrupt(set_dir: Path) -> None:
    rows = _rows(set_dir)
    rows[2] = rows[2][:40]  # line 3: a broken JSON line
    dup = json.loads(rows[0])
    rows[4] = json.dumps({**json.loads(rows[4]), "qid": dup["qid"]})  # line 5: duplicate of line 1
    edited = json.loads(rows[6])
    edited["question"] += " Please."  # line 7: edited after sealing
    rows[6] = json.dumps(edited)
    bad = json.loads(rows[8])
    bad["split"] = "train"  # line 9: schema violation
    rows[8] = json.dumps(bad)
    _write(set_dir, rows)


def test_bad_rows_are_named_and_the_others_still_collect(
    pytester: pytest.Pytester, malloy_set: Path, plugin_args: list[str]
) -> None:
    _corrupt(malloy_set)
    path = malloy_set / "cases.jsonl"
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q", *plugin_args)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str()
    # The whole JSON message: what, the column, and the character (not "... character at").
    assert f"{path}:3: invalid JSON: Invalid control character at column 41 (found '\\n')" in out
    assert f"{path}:5: duplicate qid 'ecom_2022_sales_bookings': already defined on line 1" in out
    assert f"{path}:7: row " in out and "question edited after sealing" in out
    assert f"{path}:9: row " in out and "field 'split': Input should be 'dev' or 'holdout'" in out
    assert "4 errors" in out
    # 49 rows, 4 bad: the 45 others are still collected beside the errors.
    assert out.count("cases.jsonl::ecom_") == 45
    assert "Traceback" not in out


def test_missing_golden_artifact_is_named(pytester: pytest.Pytester, malloy_set: Path) -> None:
    rows = _rows(malloy_set)
    row = json.loads(rows[1])
    row["golden"]["path"] = "gold/missing.json"
    rows[1] = json.dumps(row)
    _write(malloy_set, rows)
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "*cases.jsonl:2: row 'ecom_2022_sales_casual': golden artifact "
            "missing: golden.path 'gold/missing.json'*"
        ]
    )


def _set_row(set_dir: Path, index: int, **changes: object) -> dict[str, object]:
    rows = _rows(set_dir)
    row = {**json.loads(rows[index]), **changes}
    rows[index] = json.dumps(row)
    _write(set_dir, rows)
    return row


@pytest.mark.parametrize(
    "qid", ["../../escape_probe", "../../../escape_deep", "/tmp/abs_qid", "nul\u0000qid", "a b"]
)
def test_a_qid_outside_the_pattern_is_a_collection_error_naming_its_line(
    pytester: pytest.Pytester, malloy_set: Path, qid: str
) -> None:
    _set_row(malloy_set, 3, qid=qid)
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str()
    assert f"{malloy_set / 'cases.jsonl'}:4: row " in out
    assert "is not a valid qid: a qid is 1-128 letters, digits" in out
    assert out.count("cases.jsonl::ecom_") == 48 and "1 error" in out
    assert "Traceback" not in out


def test_a_qid_that_slipped_through_still_cannot_leave_the_run_dir(tmp_path: Path) -> None:
    from pytest_evalloop.answer.pipeline import AttemptContext

    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "artifacts").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (run_dir / "artifacts" / "planted").symlink_to(outside)
    for qid in ("../../escape_probe", "..", "/abs", "nul\0qid", "planted", "a/b"):
        # model_construct skips validation: as if a qid got past collection.
        case = sets.Case.model_construct(qid=qid, question="q", split="dev")
        ctx = AttemptContext(run_dir=run_dir, set_dir=tmp_path, case=case, sample=None, phase="p")
        with pytest.raises(ValueError, match="cannot name a directory|resolves outside"):
            _ = ctx.artifact_dir
    good = sets.Case.model_construct(qid="ecom.q-1_a", question="q", split="dev")
    ctx = AttemptContext(run_dir=run_dir, set_dir=tmp_path, case=good, sample=2, phase="p")
    assert ctx.artifact_dir == run_dir / "artifacts" / "ecom.q-1_a__s2"


def test_the_real_sets_qids_follow_the_pattern() -> None:
    from tests.conftest import EXAMPLE_SET, MALLOY_SET

    for set_dir in (MALLOY_SET, EXAMPLE_SET):
        loaded = sets.load_cases(set_dir)
        assert loaded.errors == [] and loaded.rows
        assert all(sets.qid_problem(case.qid) is None for _, case in loaded.rows)


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_a_golden_path_outside_the_set_is_a_collection_error(
    pytester: pytest.Pytester, malloy_set: Path, where: str
) -> None:
    outside = malloy_set.parent / "outside"
    outside.mkdir()
    (outside / "gold.json").write_text('[{"secret": 42}]', encoding="utf-8")
    if where == "parent":
        golden_path = "../outside/gold.json"
    elif where == "absolute":
        golden_path = str(outside / "gold.json")
    else:
        (malloy_set / "gold").mkdir(exist_ok=True)
        (malloy_set / "gold" / "link.json").symlink_to(outside / "gold.json")
        golden_path = "gold/link.json"
    row = json.loads(_rows(malloy_set)[1])
    _set_row(malloy_set, 1, golden={**row["golden"], "path": golden_path})
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str()
    assert (
        f"cases.jsonl:2: row 'ecom_2022_sales_casual': golden.path {golden_path!r} is not "
        "inside the set: it " in out
    )
    assert "Keep gold artifacts inside" in out
    assert "cases.jsonl::ecom_2022_sales_casual" not in out
    assert out.count("cases.jsonl::ecom_") == 48


def test_a_golden_symlink_inside_the_set_is_fine(
    pytester: pytest.Pytester, malloy_set: Path
) -> None:
    (malloy_set / "gold").mkdir(exist_ok=True)
    (malloy_set / "gold" / "real.json").write_text("[]", encoding="utf-8")
    (malloy_set / "gold" / "link.json").symlink_to(malloy_set / "gold" / "real.json")
    row = json.loads(_rows(malloy_set)[1])
    _set_row(malloy_set, 1, golden={**row["golden"], "path": "gold/link.json"})
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["49 tests collected*"])


def test_invalid_utf8_is_an_error_on_its_line_and_the_other_rows_collect(
    pytester: pytest.Pytester, malloy_set: Path, plugin_args: list[str]
) -> None:
    path = malloy_set / "cases.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b"?", b"\xff\xfe?", 1)
    assert b"\xff" in lines[3]
    path.write_bytes(b"\n".join(lines))
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q", *plugin_args)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str()
    assert f"{path}:4: not valid UTF-8 at byte " in out and "save the file as UTF-8" in out
    assert out.count("cases.jsonl::ecom_") == 48
    assert "Traceback" not in out and "UnicodeDecodeError" not in out


@pytest.mark.parametrize("arg", ["set dir", "cases.jsonl", "a parent dir"])
def test_a_set_without_set_json_says_so_and_where(
    pytester: pytest.Pytester, malloy_set: Path, arg: str
) -> None:
    (malloy_set / "set.json").unlink()
    target = {
        "set dir": malloy_set,
        "cases.jsonl": malloy_set / "cases.jsonl",
        "a parent dir": malloy_set.parent,
    }[arg]
    result = pytester.runpytest(str(target), "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error, not 5 (no tests)
    result.stdout.fnmatch_lines(
        [f"{malloy_set / 'set.json'}: missing: {malloy_set} holds cases.jsonl but no set.json*"]
    )
    result.stdout.fnmatch_lines(["*Interrupted: 1 error during collection*"])


def test_a_set_without_set_json_says_so_under_check_judge(
    pytester: pytest.Pytester, malloy_set: Path
) -> None:
    (malloy_set / "set.json").unlink()
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q", "--eval-check-judge")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"{malloy_set / 'set.json'}: missing: *", "*1 error*"])


def test_excluding_a_row_clears_the_errors_the_hint_says_it_clears(
    pytester: pytest.Pytester, malloy_set: Path
) -> None:
    rows = [json.loads(r) for r in _rows(malloy_set)]
    rows[1]["question"] += " Please."  # a broken seal
    rows[2]["golden"]["path"] = "gold/missing.json"  # a missing artifact
    path = malloy_set / "cases.jsonl"
    _write(malloy_set, [json.dumps(r) for r in rows])
    before = pytester.runpytest(str(malloy_set), "--collect-only", "-q")
    out = before.stdout.str()
    assert out.count('Fix this row (or set its "state" to "excluded") and run again.') == 2
    # Do what the hint says: both errors go, and the two excluded rows are not collected.
    for row in rows[1:3]:
        row["state"] = "excluded"
    _write(malloy_set, [json.dumps(r) for r in rows])
    after = pytester.runpytest(str(malloy_set), "--collect-only", "-q")
    assert after.ret == 0, after.stdout.str()
    after.stdout.fnmatch_lines(["47 tests collected*"])
    assert str(path) not in after.stdout.str()


def test_a_duplicate_qid_hint_does_not_offer_exclusion(
    pytester: pytest.Pytester, malloy_set: Path
) -> None:
    first = json.loads(_rows(malloy_set)[0])
    _set_row(malloy_set, 4, qid=first["qid"], state="excluded")
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str()
    assert f"cases.jsonl:5: duplicate qid {first['qid']!r}: already defined on line 1" in out
    assert "Give one of the two rows a new qid (qids are unique in the file, excluded" in out
    assert '"excluded") and run again' not in out


def test_a_bad_regression_fixture_hint_does_not_offer_exclusion(
    pytester: pytest.Pytester, malloy_set: Path
) -> None:
    path = malloy_set / sets.REGRESSIONS_FILE
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1][:30]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q", "--eval-check-judge")
    out = result.stdout.str()
    assert f"{path}:2: invalid JSON: " in out and "Fix this row and run again." in out
    assert "excluded" not in out


def test_bad_set_json_is_one_error(pytester: pytest.Pytester, malloy_set: Path) -> None:
    (malloy_set / "set.json").write_text("{oops", encoding="utf-8")
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*set.json:1: invalid JSON*", "*1 error*"])


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("--eval-split=train", "--eval-split='train' is not one of dev|holdout|all*"),
        ("--eval-samples=0", "--eval-samples=0 must be at least 1"),
        ("--eval-samples=two", "--eval-samples='two' is not a valid int*"),
        ("--eval-concurrency=0", "--eval-concurrency=0 must be at least 1"),
    ],
)
def test_bad_option_values_are_usage_errors(
    pytester: pytest.Pytester, malloy_set: Path, arg: str, expected: str
) -> None:
    result = pytester.runpytest(str(malloy_set), "--collect-only", arg)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{expected}"])


def test_running_without_an_endpoint_stops_with_one_line(
    pytester: pytest.Pytester, malloy_set: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    result = pytester.runpytest(str(malloy_set))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*set ANTHROPIC_API_KEY*--eval-verify-goldens and --collect-only*"]
    )


def test_ini_twin_sets_the_split(pytester: pytest.Pytester, malloy_set: Path) -> None:
    import shutil

    malloy_set = Path(shutil.copytree(malloy_set, pytester.path / "evals" / "ecommerce"))
    pytester.makeini("[pytest]\neval_split = holdout\n")
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q")
    result.stdout.fnmatch_lines(["14 tests collected*"])
    cli_wins = pytester.runpytest(str(malloy_set), "--collect-only", "-q", "--eval-split=dev")
    cli_wins.stdout.fnmatch_lines(["35 tests collected*"])


def test_plugin_loads_without_xdist(pytester: pytest.Pytester, malloy_set: Path) -> None:
    result = pytester.runpytest(str(malloy_set), "--collect-only", "-q", "-p", "no:xdist")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["49 tests collected*"])


# --- what collection costs: the collector, and what it imports ------------------------------


class _HeapProbe:
    """Records, at session finish, whether collection left the heap frozen."""

    def __init__(self) -> None:
        self.frozen: int | None = None
        self.enabled: bool | None = None

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.frozen = gc.get_freeze_count()
        self.enabled = gc.isenabled()


def test_a_sets_items_are_frozen_until_an_in_process_run_ends(
    pytester: pytest.Pytester, malloy_set: Path
) -> None:
    assert gc.get_freeze_count() == 0
    probe = _HeapProbe()
    reprec = pytester.inline_run(str(malloy_set), "--collect-only", "-q", plugins=[probe])
    assert reprec.ret == 0 and len(reprec.getcalls("pytest_itemcollected")) == 49
    assert probe.frozen and probe.enabled
    # pytester runs in this process, which goes on: the frozen objects were handed back.
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()


def test_collecting_no_set_freezes_nothing(pytester: pytest.Pytester) -> None:
    probe = _HeapProbe()
    pytester.makepyfile(test_plain="def test_one():\n    pass\n")
    reprec = pytester.inline_run("--collect-only", "-q", plugins=[probe])
    assert reprec.ret == 0 and len(reprec.getcalls("pytest_itemcollected")) == 1
    assert probe.frozen == 0 and probe.enabled


@pytest.mark.cold_start  # what a run imports: a fork would start with the SDKs imported
def test_collect_only_imports_no_sdk_and_keeps_the_heap_frozen(
    pytester: pytest.Pytester, malloy_set: Path
) -> None:
    pytester.makepyfile(
        evalloop_probe="""
import gc, sys
from pytest_evalloop.items import session_ends_process

def pytest_unconfigure(config):
    heavy = sorted({"anthropic", "mcp", "duckdb", "httpx2"} & set(sys.modules))
    print(f"PROBE ends={session_ends_process(config)} frozen={gc.get_freeze_count() > 0} "
          f"heavy={heavy}")
"""
    )
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess(
        str(malloy_set), "--collect-only", "-q", "-p", "evalloop_probe"
    )
    result.stdout.fnmatch_lines(["49 tests collected*", "PROBE ends=True frozen=True heavy=[]"])


def test_loading_the_plugin_imports_no_models() -> None:
    code = (
        "import sys, pytest_evalloop.plugin; "
        "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'anthropic', 'mcp', "
        "'duckdb', 'pytest_evalloop.sets.cases', 'pytest_evalloop.answer.pipeline', "
        "'pytest_evalloop.ledger.contract', 'pytest_evalloop.ledger.reader', "
        "'pytest_evalloop.ledger.writer'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def _generational_ids() -> set[int]:
    """Ids of the objects in the collector's generations 0-2; a frozen object is in none."""
    return {id(obj) for obj in gc.get_objects()}


def test_settling_the_heap_frees_garbage_cycles_first_then_freezes_the_living(
    pytester: pytest.Pytester,
) -> None:
    from pytest_evalloop.items import CollectedHeap

    heap = CollectedHeap(pytester.parseconfig())
    finalized: list[str] = []

    class Node:
        def __init__(self, name: str) -> None:
            self.name = name
            self.other: Node | None = None

        def __del__(self) -> None:
            finalized.append(self.name)

    try:
        heap.settle()  # nothing was frozen: a run without case items is left alone
        assert gc.get_freeze_count() == 0
        heap.freeze()
        a, b = Node("a"), Node("b")
        a.other, b.other = b, a  # a cycle, unreachable once the names go
        del a, b
        alive = [Node("kept") for _ in range(100)]
        assert all(id(node) in _generational_ids() for node in alive)
        heap.settle()
        # The garbage cycle was collected (its finalizers ran while pytest still listens) and
        # what is alive joined the frozen heap, so pytest's later passes skip it. Checked per
        # object rather than by gc.get_freeze_count(): other threads (xdist's execnet) free
        # frozen objects of their own in between, so a count says nothing about these nodes.
        assert sorted(finalized) == ["a", "b"]
        generational = _generational_ids()
        assert all(gc.is_tracked(node) and id(node) not in generational for node in alive)
    finally:
        heap.release()  # the session's hold on frozen objects ends with it, as at cleanup
        gc.unfreeze()


@pytest.mark.parametrize("where", ["beside the set", "--eval-runs-dir", "through a link"])
def test_run_directories_are_never_walked_for_tests(
    pytester: pytest.Pytester, malloy_set: Path, where: str
) -> None:
    """A set's history holds thousands of artifact folders: collection walked them all, and each
    run made the next start slower. A conftest.py that fails on import, a failing test and a
    copy of the set inside a run's directory show it is not walked: no error, no extra items."""
    runs = malloy_set / "runs" if where == "beside the set" else malloy_set.parent / "history"
    run = runs / "r1"
    nested = run / "artifacts" / "deep"
    nested.mkdir(parents=True)
    for name in ("run.json", "events.jsonl"):
        (run / name).write_text("{}\n")
    (run / "conftest.py").write_text("raise SystemExit('walked into a run')\n")
    (nested / "test_walked.py").write_text("def test_walked():\n    assert False\n")
    for name in (sets.CASES_FILE, sets.SET_FILE):
        (nested / name).write_bytes((malloy_set / name).read_bytes())
    if where == "through a link":
        (malloy_set.parent / "linked").symlink_to(run, target_is_directory=True)
    args = [str(malloy_set.parent), "--collect-only", "-q", "-p", "no:cacheprovider"]
    if where == "--eval-runs-dir":
        args.append(f"--eval-runs-dir={runs}")
    result = pytester.runpytest(*args)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["49 tests collected*"])
    assert "walked" not in result.stdout.str()


def test_a_folder_named_runs_or_named_by_eval_runs_dir_is_still_collected(
    pytester: pytest.Pytester, malloy_set: Path
) -> None:
    """Only a run's own directory is skipped, known by its ledger: a user's `runs/` beside a
    set.json (another tool's), and a set that `--eval-runs-dir` names, are collected as ever."""
    (pytester.path / "tool").mkdir()
    (pytester.path / "tool" / sets.SET_FILE).write_text("{}")
    (pytester.path / "tool" / "runs").mkdir()
    (pytester.path / "tool" / "runs" / "test_real.py").write_text("def test_real():\n    pass\n")
    result = pytester.runpytest(
        str(pytester.path / "tool"),
        str(malloy_set),
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--eval-runs-dir={malloy_set}",
    )
    result.stdout.fnmatch_lines(["*test_real.py::test_real", "50 tests collected*"])


def test_ini_paths_are_read_from_the_ini_files_folder(
    pytester: pytest.Pytester, malloy_set: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path in the ini file means the same folder from wherever pytest starts (pytest's own
    rule for its ini paths): a session started in a subfolder used to put its runs, read its
    prices and write its summary relative to that subfolder."""
    import shutil

    from pytest_evalloop.stash import SETTINGS_KEY

    set_dir = Path(shutil.copytree(malloy_set, pytester.path / "evals" / "ecommerce"))
    pytester.makeini(
        "[pytest]\neval_runs_dir = kept/runs\neval_prices = prices.json\n"
        "eval_summary_md = out/summary.md\n"
    )
    (pytester.path / "prices.json").write_text("{}")
    seen: list[Any] = []

    class Probe:
        @pytest.hookimpl(trylast=True)
        def pytest_collection_finish(self, session: pytest.Session) -> None:
            seen.append(session.config.stash[SETTINGS_KEY])

    inner = pytester.path / "evals"
    monkeypatch.chdir(inner)
    result = pytester.runpytest(str(set_dir), "--collect-only", "-q", plugins=[Probe()])
    assert result.ret == 0, result.outlines
    settings = seen[-1]
    assert settings.runs_dir == (pytester.path / "kept" / "runs").resolve()
    assert settings.summary_md == pytester.path / "out" / "summary.md"
    assert Path(settings.prices).resolve() == (pytester.path / "prices.json").resolve()
    # An empty value on the command line (an unset variable) names no folder: the ini's.
    pytester.runpytest(str(set_dir), "--collect-only", "-q", "--eval-runs-dir=", plugins=[Probe()])
    assert seen[-1].runs_dir == (pytester.path / "kept" / "runs").resolve()
    # The command line's paths stay relative to where pytest started.
    result = pytester.runpytest(
        str(set_dir), "--collect-only", "-q", "--eval-runs-dir=here", plugins=[Probe()]
    )
    assert seen[-1].runs_dir == (inner / "here").resolve()


def test_a_session_without_eval_items_starts_no_chart_process(pytester: pytest.Pytester) -> None:
    """A project's plain tests, with the plugin installed, close no run: the session writes no
    report, and starts no chart process for one (a Python start at every such session's end)."""
    from pytest_evalloop.report import charts

    charts.shutdown()
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")
    # The suite's runs draw no charts unless asked (tests/conftest.py): these ask.
    result = pytester.runpytest("-q", "--eval-report-charts=on")
    assert result.ret == 0
    assert not charts._running
    collect_only = pytester.runpytest("-q", "--collect-only", "--eval-report-charts=on")
    assert collect_only.ret == 0
    assert not charts._running


def test_without_an_ini_file_ini_paths_are_read_from_where_pytest_starts(
    pytester: pytest.Pytester, malloy_set: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ini file: an `-o` path means what pytest's own ini paths mean then, the folder
    pytest started in (not the rootdir); a `~` on the command line is the home folder (no
    shell expands one after `=`)."""
    import shutil

    from pytest_evalloop.skills import plugin as skills_plugin
    from pytest_evalloop.stash import SETTINGS_KEY

    set_dir = Path(shutil.copytree(malloy_set, pytester.path / "evals" / "ecommerce"))
    seen: list[Any] = []

    class Probe:
        @pytest.hookimpl(trylast=True)
        def pytest_collection_finish(self, session: pytest.Session) -> None:
            seen.append(session.config.stash[SETTINGS_KEY])
            seen.append(skills_plugin._settings(session.config).fixtures_dir)

    inner = pytester.path / "evals"
    monkeypatch.chdir(inner)
    monkeypatch.setenv("HOME", str(pytester.path / "home"))
    result = pytester.runpytest(
        str(set_dir),
        "--collect-only",
        "-q",
        "-o",
        "eval_runs_dir=out",
        "-o",
        "eval_skill_fixtures=fx",
        "--eval-summary-md=~/summary.md",
        plugins=[Probe()],
    )
    assert result.ret == 0, result.outlines
    settings, fixtures = seen[-2:]
    assert settings.runs_dir == (inner / "out").resolve()
    assert fixtures == (inner / "fx").resolve()
    assert settings.summary_md == pytester.path / "home" / "summary.md"


@pytest.mark.parametrize(
    "price",
    ['{"input": 1e308, "output": 1, "cache_read": 1, "cache_write": 1}', '{"input": -1}', "NaN"],
)
def test_a_price_file_that_is_no_price_is_a_usage_error(
    pytester: pytest.Pytester, malloy_set: Path, price: str
) -> None:
    """A price file is read before any item runs: a price beyond any model's (every cost
    infinite, written into the ledger as a word JSON has not), a negative one, or none at all
    is a usage error naming the file, the model and the field, not a traceback."""
    prices = pytester.path / "prices.json"
    prices.write_text('{"claude-sonnet-4-6": ' + price + "}")
    result = pytester.runpytest(str(malloy_set), "--collect-only", f"--eval-prices={prices}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*--eval-prices: price file {prices}: model 'claude-sonnet-4-6'*"]
    )
    assert "Traceback" not in result.stderr.str()
