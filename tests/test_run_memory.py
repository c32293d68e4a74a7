"""What a run keeps of each case once it is written: a row read back, not held; scores found
again by where their lines start, not held.

Each property is checked against the reading it replaced: the rows `load_cases` gives, and the
counted score of every line of the ledger parsed whole.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_evalloop.freedmemory import FreedMemory
from pytest_evalloop.judge.judgesamples import counted
from pytest_evalloop.keptreports import (
    SHARED_PARTS,
    SharedDict,
    SharedList,
    same_value,
    share_equal_parts,
)
from pytest_evalloop.ledger import reader as ledger_reader
from pytest_evalloop.ledger.resume import ScoredAttempts
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import QIDS, make_set, spec

TEXT = st.text(
    alphabet=st.characters(
        blacklist_categories=("Cs",), blacklist_characters="\n\r\x85\u2028\u2029"
    ),
    min_size=1,
    max_size=40,
).filter(lambda s: s.strip())
QID = st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,12}", fullmatch=True)


def _row(qid: str, question: str, split: str) -> str:
    return json.dumps({"qid": qid, "question": question, "split": split}, ensure_ascii=False)


rows_strategy = st.lists(
    st.tuples(QID, TEXT, st.sampled_from(["dev", "holdout"])),
    min_size=1,
    max_size=12,
    unique_by=lambda r: r[0],
)
junk_strategy = st.lists(
    st.sampled_from(["", "   ", "{not json", '{"qid": "Bad Qid!"}']), max_size=3
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=rows_strategy, junk=junk_strategy, data=st.data())
def test_a_row_read_back_alone_is_the_row_the_set_loaded(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[str, str, str]],
    junk: list[str],
    data: st.DataObject,
) -> None:
    set_dir = tmp_path_factory.mktemp("set")
    lines = [_row(*r) for r in rows]
    for bad in junk:  # blank and broken lines between the rows move every offset after them
        lines.insert(data.draw(st.integers(0, len(lines))), bad)
    path = set_dir / sets.CASES_FILE
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    loaded = sets.load_cases(set_dir)
    assert {case.qid for _, case in loaded.rows} == {r[0] for r in rows}
    for lineno, case in loaded.rows:
        back = sets.case_at(path, loaded.lines[lineno], lineno, case.qid)
        assert back == case
    # The file changed since: rows reordered (each still found, by its bytes, wherever it is
    # now), one dropped and one edited (each said to be changed: never another row, never the
    # row as it is now rather than as it was collected).
    order = data.draw(st.permutations(rows))
    dropped, edited, kept = order[-1], order[0] if len(order) > 1 else None, list(order[:-1])
    new_lines = [_row(*r) for r in kept]
    if edited is not None:
        new_lines[0] = _row(edited[0], edited[1] + " (edited)", edited[2])
    path.write_text("\n".join(new_lines) + "\n", encoding="utf-8")
    for lineno, case in loaded.rows:
        ref = loaded.lines[lineno]
        if case.qid in (dropped[0], edited[0] if edited else None):
            with pytest.raises(sets.CaseChanged, match="changed or removed during the session"):
                sets.case_at(path, ref, lineno, case.qid)
        else:
            assert sets.case_at(path, ref, lineno, case.qid) == case


KEY = st.tuples(st.sampled_from(["q1", "q2", "q3"]), st.sampled_from([None, 1, 2]))
VERDICT = st.sampled_from(["match", "no_match", "near_match", None])


def _score(key: tuple[str, int | None], verdict: str | None, judge_sample: int | None) -> str:
    event = {"kind": "score", "qid": key[0], "sample": key[1], "verdict": verdict}
    if judge_sample is not None:
        event["judge_sample"] = judge_sample
    return json.dumps(event)


line_strategy = st.one_of(
    st.builds(_score, KEY, VERDICT, st.one_of(st.none(), st.integers(1, 3))),
    st.builds(
        lambda q: json.dumps({"kind": "attempt", "qid": q, "sample": None}), KEY.map(lambda k: k[0])
    ),
    st.just('{"kind": "score", "qid": "q1", torn'),
)


def _oracle(path: Path) -> dict[tuple[str, int | None], Any]:
    """Every score line parsed whole, counted per attempt: what the kept scores answered."""
    found: dict[tuple[str, int | None], list[Any]] = {}
    for raw in path.read_bytes().split(b"\n"):
        try:
            data = json.loads(raw)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("kind") == "score" and "qid" in data:
            key = (str(data["qid"]), data.get("sample"))
            found.setdefault(key, []).append(ledger_reader.LightEvent(data))
    return {key: counted(events) for key, events in found.items()}


def _same(one: Any, other: Any) -> bool:
    if one is None or other is None:
        return one is other
    return vars(one) == vars(other)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    first=st.lists(line_strategy, max_size=10),
    more=st.lists(line_strategy, max_size=6),
    data=st.data(),
)
def test_a_score_found_again_by_its_offset_is_the_score_the_ledger_holds(
    tmp_path_factory: pytest.TempPathFactory,
    first: list[str],
    more: list[str],
    data: st.DataObject,
) -> None:
    run_dir = tmp_path_factory.mktemp("run")
    path = run_dir / "events.jsonl"
    path.write_text("".join(line + "\n" for line in first), encoding="utf-8")
    scored = ScoredAttempts(run_dir)
    keys = [(q, s) for q in ("q1", "q2", "q3") for s in (None, 1, 2)]
    want = _oracle(path)
    for key in keys:
        assert _same(scored.get(*key), want.get(key))
    with path.open("a", encoding="utf-8") as handle:  # appended since: read on the next look
        handle.write("".join(line + "\n" for line in more))
    want = _oracle(path)
    for key in keys:
        assert _same(scored.get(*key), want.get(key))
    # Rewritten in place (same file, its lines in another order): the offsets kept point into
    # other lines now; the answer is still what the file holds.
    lines = path.read_text(encoding="utf-8").splitlines()
    shuffled = data.draw(st.permutations(lines))
    with path.open("r+", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in shuffled))
    assert os.stat(path).st_size == sum(len(x.encode()) + 1 for x in lines)
    want = _oracle(path)
    for key in keys:
        assert _same(scored.get(*key), want.get(key))


def test_an_attempt_line_moved_to_where_its_score_was_is_not_read_as_that_score(
    tmp_path: Path,
) -> None:
    # Found by the property above: the same attempt's line, not a score, at the kept offset.
    score = '{"kind": "score", "qid": "q1", "sample": null, "verdict": "match"}'
    attempt = '{"kind": "attempt", "qid": "q1", "sample": null}'
    path = tmp_path / "events.jsonl"
    path.write_text(f"{score}\n{attempt}\n", encoding="utf-8")
    scored = ScoredAttempts(tmp_path)
    assert scored.get("q1", None).verdict == "match"
    with path.open("r+", encoding="utf-8") as handle:
        handle.write(f'{attempt}\n{score[:-8]}"no_match"}}\n')
    assert scored.get("q1", None).verdict == "no_match"


def run_with_conftest(
    pytester: pytest.Pytester,
    fake: FakeAnthropic,
    qids: list[str],
    conftest: str,
    *args: str,
    relative: bool = False,
) -> tuple[Path, pytest.RunResult]:
    """A set of `qids` run by pytest beside `conftest`, the fake answering as an oracle."""
    set_dir = make_set(pytester.path, qids)
    fake.policy = spec(set_dir).policy()
    (pytester.path / "conftest.py").write_text(conftest, encoding="utf-8")
    where = set_dir.relative_to(pytester.path) if relative else set_dir
    return set_dir, pytester.runpytest_subprocess(str(where), "-p", "no:cacheprovider", *args)


CONFTEST = """
import gc
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    from pytest_evalloop.sets.cases import Case
    gc.unfreeze()  # the plugin froze the collected heap; frozen objects are not listed
    gc.collect()
    live = sum(1 for o in gc.get_objects() if type(o) is Case)
    print(f"\\nLIVE CASES {live}")
    back = sorted(item.case.qid for item in session.items)
    print(f"READ BACK {' '.join(back)}")
"""


def test_no_parsed_row_outlives_its_item_and_each_reads_back_its_own(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir, result = run_with_conftest(pytester, fake, QIDS, CONFTEST, "-s")
    assert result.parseoutcomes().get("passed") == len(QIDS), result.stdout.str()
    out = result.stdout.str()
    assert "LIVE CASES 0" in out, out
    assert f"READ BACK {' '.join(sorted(QIDS))}" in out
    # A match carries no failure lines to the controller; a no_match still does (test_run).
    read = ledger_reader.read_run(next(p for p in (set_dir / "runs").iterdir() if p.is_dir()))
    assert len(read.scores()) == len(QIDS)


REPORTS_KEPT = """
import pytest

@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session):
    from pytest_evalloop.stash import TALLY_KEY
    tally = session.config.stash[TALLY_KEY]
    print(f"\\nKEPT AT FINISH {sum(len(v) for v in tally.kept.values())}")
    return (yield)

@pytest.hookimpl(wrapper=True)
def pytest_runtest_logreport(report):
    outcome = yield
    result = getattr(report, "evalloop", None)
    if result and report.when == "call":  # after every plugin's hook: still whole
        print(f"\\nWRAPPER SAW {'whole' if 'answerer_usage' in result else 'cut'}")
    return outcome

@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config):
    from pytest_evalloop.stash import TALLY_KEY
    keys = set()
    for reports in terminalreporter.stats.values():
        for report in reports:
            keys.update(getattr(report, "evalloop", None) or {})
    tally = config.stash[TALLY_KEY]
    print(f"\\nREPORT KEYS {sorted(keys)}")
    by_item = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if hasattr(report, "keywords"):
                by_item.setdefault(report.nodeid, []).append(report)
    whole = sum(len(r) == 3 for r in by_item.values())
    one = sum(len({id(x.keywords) for x in r}) == 1 for r in by_item.values() if len(r) == 3)
    print(f"ITEMS {whole} ONE KEYWORDS DICT {one}")
    print(f"KEPT {sum(len(v) for v in tally.kept.values())} UNANSWERED {len(tally.unanswered)}")
"""
HANDED = """
def pytest_evalloop_run_finished(config, run_dir, results):
    print(f"\\nHANDED {len(results)} {sorted({r['final_query'] is not None for r in results})}")
"""


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist"])
@pytest.mark.parametrize("hooked", [False, True], ids=["no-hook", "run-finished-hook"])
def test_a_logged_report_keeps_only_its_words_and_results_are_kept_only_for_a_hook(
    pytester: pytest.Pytester, fake: FakeAnthropic, hooked: bool, workers: tuple[str, ...]
) -> None:
    """pytest keeps every report to the session's end: once logged, a report carries only the
    words the summary asks of it, and the controller keeps each whole result only when a
    `pytest_evalloop_run_finished` hook is there to be handed them."""
    conftest = REPORTS_KEPT + (HANDED if hooked else "")
    set_dir, result = run_with_conftest(pytester, fake, QIDS, conftest, "-s", "-ra", *workers)
    out = result.stdout.str()
    assert result.parseoutcomes().get("passed") == len(QIDS), out
    # The conftest's session-finish wrapper raises in an xdist worker (no tally there), before
    # our hook: the worker still lets its run go (otherplugins.WorkerLetsGo), so the run closes
    # complete. It used to be left `running` after a 10 s wait, exit 8, and this test passed.
    assert result.ret == 0, out
    [run_dir] = [p for p in (set_dir / "runs").iterdir() if p.is_dir()]
    assert ledger_reader.read_run_info(run_dir).status == "complete", out
    assert "REPORT KEYS ['reason', 'status']" in out, out
    assert out.count("WRAPPER SAW whole") == len(QIDS) and "WRAPPER SAW cut" not in out, out
    assert f"KEPT AT FINISH {len(QIDS) if hooked else 0}" in out, out
    assert "KEPT 0 UNANSWERED 0" in out, out  # handed on, then let go
    # An item's three reports (setup, call, teardown) hold one copy of its keywords.
    assert f"ITEMS {len(QIDS)} ONE KEYWORDS DICT {len(QIDS)}" in out, out
    if hooked:  # handed whole, as ItemResult dumps: every attempt's final query among them
        assert f"HANDED {len(QIDS)} [True]" in out, out
    assert f"{len(QIDS)} passed" in out


SETTLES_COUNTED = """
import pytest
from pytest_evalloop.items import CollectedHeap

SETTLES = []
_settle = CollectedHeap.settle


def _counted(self):
    before = self.settled
    _settle(self)
    if self.settled and not before:  # this call did the settling
        SETTLES.append(1)


CollectedHeap.settle = _counted


def pytest_evalloop_run_finished(config, run_dir, results):
    raise RuntimeError("a run-finished hook that fails")


def pytest_unconfigure(config):
    print(f"\\nSETTLES {len(SETTLES)}")
"""


def test_the_heap_settles_once_when_the_close_stops_before_the_reports(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    """A `pytest_evalloop_run_finished` hook that raises stops the close before the reports
    (where the heap settles while the chart process writes them): it still settles, once."""
    _, result = run_with_conftest(pytester, fake, QIDS, SETTLES_COUNTED, "-s")
    out = result.stdout.str()
    assert "SETTLES 1" in out, out
    assert "a run-finished hook that fails" in out + result.stderr.str(), out


EDIT_MIDRUN = """
import json
from pathlib import Path

from pytest_evalloop.sets.cases import question_sha

DONE = []


def pytest_runtest_logstart(nodeid, location):
    # Before the first item runs (and before any is scheduled ahead): a row is put above every
    # case, and the last case's question is edited.
    if DONE:
        return
    DONE.append(nodeid)
    path = Path(nodeid.split("::")[0])
    lines = path.read_text(encoding="utf-8").splitlines()
    last = json.loads(lines[-1])
    last["question"] += " Answer in euros."
    last["questionSha"] = question_sha(last["question"])  # edited and sealed again: valid
    extra = dict(last, qid="inserted_later")
    lines = [json.dumps(extra)] + lines[:-1] + [json.dumps(last)]
    path.write_text("\\n".join(lines) + "\\n", encoding="utf-8")
"""


def test_a_row_edited_during_the_run_is_a_harness_error_not_the_edited_question(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    set_dir, result = run_with_conftest(pytester, fake, QIDS[:4], EDIT_MIDRUN, "-rA", relative=True)
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    # The three untouched cases answered their collected rows, though every line moved down.
    assert outcomes.get("passed") == 3, out
    assert outcomes.get("errors") == 1, out
    assert f"{QIDS[3]} (line 4 when collected) was changed or removed during the session" in out
    assert "Traceback" not in out
    run_dir = next(p for p in (set_dir / "runs").iterdir() if p.is_dir())
    read = ledger_reader.read_run(run_dir)
    asked = {e.qid: e.question for e in read.of_kind("attempt") if getattr(e, "question", None)}
    assert "inserted_later" not in {key[0] for key in read.scores()}
    assert QIDS[3] not in {key[0] for key in read.scores()}
    assert all("euros" not in q for q in asked.values())
    # Two selected rows of the set as it is now were not answered: no whole run (no gate
    # decides on it).
    selection = ledger_reader.read_run_info(run_dir).selection or {}
    assert selection.get("whole") is False, json.dumps(selection)


# Values equal under == but of other kinds (0, False, 0.0; 1, True) must never be taken for
# one another (found by the hostile pass).
LEAF = st.sampled_from([0, 1, False, True, 0.0, -0.0, 1.0, "1", None])
PART = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), LEAF, max_size=3),
    st.lists(st.tuples(st.sampled_from(["x", "y"]), LEAF), max_size=2),
)


class _Report:
    def __init__(self, parts: dict[str, Any]) -> None:
        self.__dict__.update(parts)


def _kinds(value: Any) -> Any:
    """A value with every leaf's kind beside it (so 0 and False read apart)."""
    if isinstance(value, dict):
        return ("dict", [(k, _kinds(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value) is tuple, [_kinds(v) for v in value])
    return (type(value).__name__, repr(value))  # repr: -0.0 reads apart from 0.0


@given(st.lists(st.fixed_dictionaries({name: PART for name in SHARED_PARTS}), max_size=5))
def test_sharing_an_items_report_parts_changes_no_value_and_shares_only_what_cannot_change(
    parts: list[dict[str, Any]],
) -> None:
    reports = [_Report({k: copy.deepcopy(v) for k, v in p.items()}) for p in parts]
    share_equal_parts(reports)
    for name in SHARED_PARTS:
        values = [getattr(r, name) for r in reports]
        # Every report reads what it held, to the kind of each value and the order of keys.
        assert [_kinds(v) for v in values] == [_kinds(p[name]) for p in parts]
        for i, one in enumerate(values):
            for other in values[i + 1 :]:
                if one is None or other is None:
                    continue
                if same_value(one, other):
                    assert one is other  # the same values are one object...
                    assert isinstance(one, SharedDict | SharedList)  # ...that cannot change
                else:
                    assert one is not other
        for one in values:
            if isinstance(one, SharedDict):
                with pytest.raises(TypeError, match="shared by logged eval reports"):
                    one["a"] = 2
                assert (
                    type(copy.copy(one)) is dict and type(pickle.loads(pickle.dumps(one))) is dict
                )
            elif isinstance(one, SharedList):
                with pytest.raises(TypeError, match="cannot be changed once they are logged"):
                    one.append(("x", 1))
                assert type(pickle.loads(pickle.dumps(one))) is list
            elif one is not None:  # held by one report only: its own, as changeable as before
                assert type(one) in (dict, list)


def test_a_cases_file_swapped_for_a_pipe_is_a_named_error_never_a_wait(tmp_path: Path) -> None:
    # Found by the hostile pass: a read back opened a pipe in the file's place and waited.
    path = tmp_path / sets.CASES_FILE
    os.mkfifo(path)
    with pytest.raises(sets.CaseChanged, match="no longer a regular file"):
        sets.case_at(path, sets.LineRef(0, bytes(16)), 3, "q1")
    # ... nor the close's reads of the set (what it selected, its datasetSha): a named OSError.
    (tmp_path / sets.SET_FILE).write_text('{"name": "s"}')
    with pytest.raises(OSError, match="no longer a regular file"):
        list(sets.iter_cases(tmp_path, []))
    with pytest.raises(OSError, match="no longer a regular file"):
        sets.dataset_sha(tmp_path)


PATHS = {
    "evals/shop/cases.jsonl": True,
    "cases.jsonl": True,
    "evals\\shop\\cases.jsonl": True,
    "tests/test_plain.py": False,
    # Another plugin's files whose names end the same (found by the hostile pass).
    "tests/api_cases.jsonl": False,
    "testcases.jsonl": False,
    "evals/shop/cases.jsonl.bak": False,
}


@given(st.lists(st.sampled_from(sorted(PATHS))), st.integers(1, 5))
def test_the_heap_is_trimmed_once_every_n_eval_items_and_never_for_other_tests(
    locations: list[str], every: int
) -> None:
    trims: list[int] = []
    freed = FreedMemory(every=every, trim=lambda: trims.append(1))
    for i, path in enumerate(locations):
        freed.pytest_runtest_logfinish(f"{path}::t{i}", (path, i, f"t{i}"))
    evals = sum(PATHS[path] for path in locations)
    assert freed.logged == evals
    assert len(trims) == freed.trims == evals // every


TRIMS = """
import pytest

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    config.pluginmanager.get_plugin("evalloop-freed-memory").every = 2

@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    freed = session.config.pluginmanager.get_plugin("evalloop-freed-memory")
    print(f"\\nLOGGED {freed.logged} TRIMS {freed.trims}")
"""


def test_a_run_trims_the_c_heap_as_its_eval_items_finish(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    """The C library's own trim runs (glibc here) every `every` eval items, and a plain test
    in the same session is not counted."""
    (pytester.path / "test_plain.py").write_text("def test_plain():\n    pass\n")
    set_dir = make_set(pytester.path, QIDS)
    fake.policy = spec(set_dir).policy()
    (pytester.path / "conftest.py").write_text(TRIMS, encoding="utf-8")
    result = pytester.runpytest_subprocess(
        str(set_dir), str(pytester.path / "test_plain.py"), "-p", "no:cacheprovider", "-s"
    )
    out = result.stdout.str()
    assert result.parseoutcomes().get("passed") == len(QIDS) + 1, out
    assert f"LOGGED {len(QIDS)} TRIMS {len(QIDS) // 2}" in out, out


RESULT_FIELDS = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["match", "no_match", "near_match", "harness_error"]),
        "verdict": st.sampled_from(["match", "no_match", "near_match", None]),
        "why": st.one_of(st.none(), TEXT),
        "run_dir": st.sampled_from(["/runs/a-01", "/runs/b-02", ""]),
        "contaminated": st.booleans(),
        "carried": st.booleans(),
        "wall_seconds": st.floats(0, 100),
        "answerer_cost": st.one_of(st.none(), st.floats(0, 1)),
    }
)


@given(st.lists(RESULT_FIELDS, min_size=1, max_size=6))
def test_an_items_properties_read_as_before_and_few_valued_pairs_are_one_tuple(
    fields: list[dict[str, Any]],
) -> None:
    from pytest_evalloop import otherplugins
    from pytest_evalloop.answer.pipeline import ItemResult

    props = []
    for one in fields:
        result = ItemResult(qid="q", sample=None, **one)
        got = otherplugins.user_properties(result, [])
        # What the pairs say is what they said when each item had its own.
        want = [
            ("evalloop_status", one["status"]),
            ("evalloop_verdict", one["verdict"]),
            ("evalloop_why", one["why"] or None),
        ]
        assert got[:3] == want
        assert dict(got)["evalloop_run_id"] == (Path(one["run_dir"]).name or None)
        assert dict(got)["evalloop_contaminated"] is one["contaminated"]
        props.append(got)
    for one, other in zip(props, props[1:], strict=False):
        for a, b in zip(one, other, strict=True):
            if a[0] == "evalloop_why" and a[1] is not None:
                continue  # free text: its own tuple, equal or not
            if a == b and type(a[1]) is type(b[1]) and not isinstance(a[1], float | int):
                assert a is b


@given(
    st.lists(
        st.fixed_dictionaries(
            {"status": st.sampled_from(["match", "no_match", None]), "reason": st.text(max_size=3)},
            optional={"why": TEXT, "verdict": st.just("match")},
        ),
        max_size=6,
    )
)
def test_a_slimmed_result_says_what_it_said_and_equal_ones_are_one_dict(
    results: list[dict[str, Any]],
) -> None:
    from pytest_evalloop.keptreports import slimmed

    kept = [slimmed(dict(r)) for r in results]
    for result, one in zip(results, kept, strict=True):
        assert one["status"] == result.get("status") and one["reason"] == result.get("reason")
        assert ("why" in one) == (result.get("status") == "no_match" and bool(result.get("why")))
        assert isinstance(one, SharedDict)  # frozen on every report, shared or not
    for one in kept:
        for other in kept:
            if one == other and "why" not in one and not one["reason"]:
                assert one is other


def test_words_with_no_reason_stay_one_dict_after_thousands_of_reasons() -> None:
    # Found by the hostile pass: a bounded cache filled by free-text reasons first stopped
    # sharing the match words that came after.
    from pytest_evalloop.keptreports import slimmed

    for i in range(1000):
        slimmed({"status": "near_match", "reason": f"near_match: rounded, case {i}"})
    first, second = slimmed({"status": "match", "reason": ""}), slimmed({"status": "match"})
    assert first is second and first == {"status": "match", "reason": ""}


WORDS = """
def pytest_collection_finish(session):
    items = [i for i in session.items if hasattr(i, "qid")]
    holdout = [i.qid for i in items if "holdout" in i.extra_keyword_matches]
    print(f"\\nHOLDOUT {sorted(holdout)}")
    words = [w for i in items for w in i.extra_keyword_matches if w == "dev"]
    print(f"DEV WORDS {len(words)} OBJECTS {len({id(w) for w in words})}")
"""


def test_a_cases_split_and_tags_are_in_pytests_extra_keyword_matches_as_one_string_each(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    """pytest's own attribute holds the words -k matches (a conftest may read or drop them;
    the hostile pass found them moved out of it), each word one string for the whole file."""
    set_dir = make_set(pytester.path, QIDS)
    path = set_dir / sets.CASES_FILE
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows[0]["split"] = "holdout"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (pytester.path / "conftest.py").write_text(WORDS, encoding="utf-8")
    result = pytester.runpytest_subprocess(str(set_dir), "--collect-only", "-q", "-s")
    out = result.stdout.str()
    assert f"HOLDOUT ['{rows[0]['qid']}']" in out, out
    dev = sum(r.get("split", "dev") == "dev" for r in rows)
    assert f"DEV WORDS {dev} OBJECTS 1" in out, out
    by_word = pytester.runpytest_subprocess(str(set_dir), "--collect-only", "-q", "-k", "holdout")
    assert f"1/{len(rows)} tests collected" in by_word.stdout.str(), by_word.stdout.str()


def test_a_trim_that_fails_stops_the_trims_and_never_the_run() -> None:
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise OSError("no heap to trim")

    freed = FreedMemory(every=1, trim=broken)
    for i in range(3):
        freed.pytest_runtest_logfinish(f"cases.jsonl::q{i}", ("cases.jsonl", i, f"q{i}"))
    assert calls == [1] and freed.trims == 0 and freed.logged == 3


# --- the SDKs' objects, out of the collector's way once imported ------------------------------

SDK_FROZEN = """
import gc
import sys
import pytest

def pytest_collection_finish(session):
    print(f"\\nSDKS BEFORE THE RUN {'anthropic' in sys.modules} {'mcp' in sys.modules}")

@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    import anthropic
    import mcp.server.lowlevel
    listed = {id(o) for o in gc.get_objects()}  # frozen objects are not listed
    print(f"\\nSDK LISTED {id(anthropic.AsyncAnthropic) in listed} "
          f"{id(mcp.server.lowlevel.Server) in listed} enabled={gc.isenabled()}")
"""


@pytest.mark.cold_start  # a warm fork has the SDKs imported before collection
def test_the_sdks_imported_for_the_attempts_are_frozen_with_the_collected_heap(
    pytester: pytest.Pytester, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the plugins an install brings, as a user's run has them: none of this suite's own
    # (which import the SDKs before collection, so the collected heap took them already).
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    plugins = ("-p", "evalloop", "-p", "xdist", "-p", "syrupy", "-p", "anyio")
    _, result = run_with_conftest(pytester, fake, QIDS[:2], SDK_FROZEN, "-s", *plugins)
    assert result.parseoutcomes().get("passed") == 2, result.stdout.str()
    # Imported once the items run, after collection froze its heap: the case this is about.
    assert "SDKS BEFORE THE RUN False False" in result.stdout.lines, result.stdout.str()
    lines = [line for line in result.stdout.lines if line.startswith("SDK LISTED")]
    assert lines and all(line == "SDK LISTED False False enabled=True" for line in lines), lines


def test_an_import_block_freezes_only_beside_a_session_s_frozen_heap() -> None:
    import gc

    from pytest_evalloop.ledger import gcpolicy

    assert gc.get_freeze_count() == 0
    with gcpolicy.imports_kept():
        assert not gc.isenabled()
        built = [object() for _ in range(3)]
    # A program that froze nothing is left as it was.
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.freeze()  # a host program's own freeze: no session's hold
    try:
        before = gc.get_freeze_count()
        with gcpolicy.imports_kept():
            built = [[n] for n in range(1000)]
        assert gc.get_freeze_count() <= before  # nothing would ever hand these back
        gcpolicy.session_froze()
        try:
            # Not to the object: frozen objects other threads drop meanwhile (xdist's) leave
            # the count, and the earlier `built`, frozen by the host's freeze, just left it.
            ahead = gc.get_freeze_count()
            with gcpolicy.imports_kept():
                built = [[n] for n in range(1000)]
            assert gc.get_freeze_count() - ahead > len(built) // 2  # else 0 or fewer
            assert gc.isenabled()
        finally:
            gcpolicy.session_unfroze()
    finally:
        gc.unfreeze()


def test_a_host_program_s_own_frozen_objects_do_not_grow_over_sessions(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    import gc

    import duckdb  # imported up front: an in-process run must not import it a second time

    set_dir = make_set(pytester.path, QIDS[:1])
    fake.policy = spec(set_dir).policy()
    held = [[n] for n in range(1000)]
    assert duckdb.connect
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        for _ in range(2):
            pytester.inline_run(str(set_dir), "-p", "no:cacheprovider")
            assert gc.get_freeze_count() <= before, "a session froze objects it never let go"
            # And the host's own stay frozen: a session's release unfroze them with its own.
            listed = {id(o) for o in gc.get_objects()}  # frozen objects are not listed
            assert id(held) not in listed and id(held[0]) not in listed
    finally:
        gc.unfreeze()
    assert held
