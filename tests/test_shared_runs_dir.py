"""Sets (and skill catalogs) that share one `--eval-runs-dir` in one session: each keeps its
own run. Every process of a session finds its run by the session's id and the set's folder
(`runs._find_session_run`); by the id alone, the first set's run took them all."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop.testing import FakeAnthropic
from tests.test_gate import run
from tests.test_run import QIDS, make_set, spec


def two_sets(pytester: pytest.Pytester, fake: FakeAnthropic, cases: int) -> tuple[Path, Path]:
    """A set of `cases` cases and a copy of it beside it (`shop2`), the fake answering both
    by question (the oracle)."""
    shop = make_set(pytester.path, QIDS[:cases])
    other = shop.parent / "shop2"
    shutil.copytree(shop, other)
    fake.policy = spec(shop).policy()
    return shop, other


def test_sets_sharing_one_runs_folder_keep_a_run_each(
    pytester: pytest.Pytester, fake: FakeAnthropic, plugin_args: list[str]
) -> None:
    # Runs were found by session id alone: the second set took the first set's run, which
    # then held every attempt of both (and validated), and the second had no run at all.
    from pytest_evalloop.ledger import reader as ledger_reader

    shop, other = two_sets(pytester, fake, 2)
    shared = pytester.path / "shared"
    result = pytester.runpytest_subprocess(
        str(shop.parent), "-p", "no:cacheprovider", f"--eval-runs-dir={shared}", *plugin_args
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    runs = sorted(p for p in shared.iterdir() if p.is_dir())
    assert len(runs) == 2, runs
    by_set = {}
    for run_dir in runs:
        read = ledger_reader.read_run(run_dir)
        assert read.errors == [], [str(f) for f in read.errors]
        assert read.info is not None and read.info.status == "complete"
        by_set[read.info.set_dir] = len(read.scores())
    assert by_set == {str(shop.resolve()): 2, str(other.resolve()): 2}


@pytest.mark.parametrize("runs_dir", [False, True], ids=["beside", "shared"])
def test_a_set_named_twice_through_a_link_answers_each_case_once(
    pytester: pytest.Pytester, fake: FakeAnthropic, plugin_args: list[str], runs_dir: bool
) -> None:
    # pytest collects a file once per path it is named by: both copies went into the set's one
    # run, every case answered twice, the run invalid, and the session still exited 0.
    from pytest_evalloop.ledger import reader as ledger_reader

    shop = make_set(pytester.path, QIDS[:2])
    link = shop.parent / "lnk"
    link.symlink_to(shop)
    fake.policy = spec(shop).policy()
    shared = pytester.path / "shared"
    extra = [f"--eval-runs-dir={shared}"] if runs_dir else []
    result = pytester.runpytest_subprocess(
        str(shop), str(link), "-p", "no:cacheprovider", "--eval-label=once", *extra, *plugin_args
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["*2 passed*"])  # (xdist shows no worker's deselected)
    assert len(fake.calls("judge")) == 2
    read = ledger_reader.read_run((shared if runs_dir else shop / "runs") / "once")
    assert read.errors == [], [str(f) for f in read.errors]
    assert read.info is not None and read.info.status == "complete"
    assert len(read.scores()) == 2


@pytest.mark.parametrize(
    "layout", ["one --eval-runs-dir", "runs linked", "set linked", "named by package"]
)
def test_one_run_label_for_two_sets_that_share_its_folder_is_refused_before_anything_opens(
    pytester: pytest.Pytester, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    # The first set opened its run and answered, and the second was refused only then. Found
    # by the hostile pass beyond one --eval-runs-dir: runs/ folders linked to one place, and a
    # set reached through a link in a folder the command line walks.
    from tests.test_comparable import flat

    shop, other = two_sets(pytester, fake, 2)
    shared = pytester.path / "shared"
    args = [str(shop), str(other), f"--eval-runs-dir={shared}"]
    if layout == "runs linked":
        shared.mkdir()
        for set_dir in (shop, other):
            (set_dir / "runs").symlink_to(shared)
        args = [str(shop), str(other)]
    elif layout == "set linked":
        walked = pytester.path / "walked"
        walked.mkdir()
        (walked / "a").symlink_to(shop)
        (walked / "b").symlink_to(other)
        args = [str(walked), f"--eval-runs-dir={shared}"]
    elif layout == "named by package":
        # `--pyargs`: the folder holding both sets is a package named by its import name,
        # found on PYTHONPATH (no path of that name is beside the session).
        package = pytester.path / "lib" / "evpkg"
        package.parent.mkdir()
        shop.parent.rename(package)
        (package / "__init__.py").write_text("")
        shop, other = package / shop.name, package / other.name
        monkeypatch.setenv("PYTHONPATH", str(package.parent))
        args = ["--pyargs", "evpkg", f"--eval-runs-dir={shared}"]
    result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider", "--eval-label=pr-7")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    told = flat(result.stderr.str())
    assert "--eval-label=pr-7 names one run (" in told and "for 2 sets of this session" in told
    assert str(shop.resolve()) in told and str(other.resolve()) in told
    assert fake.requests == [] and not (shared / "pr-7").exists()
    if layout == "one --eval-runs-dir":
        # One set per session, or each set's runs beside it, as the message offers: both run.
        assert run(pytester, shop, f"--eval-runs-dir={shared}", "--eval-label=pr-7").ret == 0
        beside = pytester.runpytest_subprocess(
            str(shop), str(other), "-p", "no:cacheprovider", "--eval-label=pr-7"
        )
        assert beside.ret == pytest.ExitCode.OK, beside.stdout.str()
        assert (shop / "runs" / "pr-7" / "run.json").is_file()
        assert (other / "runs" / "pr-7" / "run.json").is_file()


@pytest.mark.parametrize("ref", ["label", "path"])
def test_one_run_resumed_by_two_sets_of_a_session_is_refused_before_anything_opens(
    pytester: pytest.Pytester, fake: FakeAnthropic, ref: str
) -> None:
    # Found by the hostile pass: a run given by its path (or a label in a shared runs folder)
    # names one run for every set of the session; a copy of the set took it over and answered
    # its rest, and the set it belonged to was refused only then.
    from tests.test_comparable import flat
    from tests.test_gate import script

    shop = make_set(pytester.path, QIDS[:4])
    fake.policy = script(shop, {QIDS[1]}).policy()
    shared = pytester.path / "shared"
    where = [f"--eval-runs-dir={shared}"] if ref == "label" else []
    stopped = run(pytester, shop, *where, "--eval-label=part", "-x", "--eval-concurrency=1")
    assert stopped.ret == 8, stopped.stdout.str()
    copy = shop.parent / "copy"
    shutil.copytree(shop, copy, ignore=shutil.ignore_patterns("runs"))
    part = (shared if ref == "label" else shop / "runs") / "part"
    named = "part" if ref == "label" else str(part)
    calls = len(fake.requests)
    result = pytester.runpytest_subprocess(
        str(copy), str(shop), "-p", "no:cacheprovider", *where, f"--eval-resume={named}"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    told = flat(result.stderr.str())
    assert f"--eval-resume={named} names one run (" in told and "for 2 sets" in told
    assert len(fake.requests) == calls  # nothing answered
    # Resumed from its own set alone, it finishes.
    fake.policy = script(shop, set()).policy()
    resumed = run(pytester, shop, *where, f"--eval-resume={named}")
    assert resumed.ret == pytest.ExitCode.TESTS_FAILED, resumed.stdout.str()


def test_a_run_is_resumed_from_its_own_set_not_from_a_copy_while_that_set_is_there(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # The run was adopted by whichever set named it: the copy answered the rest against its own
    # model and conftest, and the run then said it was the copy's.
    from pytest_evalloop.ledger import reader as ledger_reader
    from tests.test_comparable import flat
    from tests.test_gate import script

    shop = make_set(pytester.path, QIDS[:4])
    fake.policy = script(shop, {QIDS[1]}).policy()
    shared = pytester.path / "shared"
    stopped = run(
        pytester,
        shop,
        f"--eval-runs-dir={shared}",
        "--eval-label=part",
        "-x",
        "--eval-concurrency=1",
    )
    assert stopped.ret == 8, stopped.stdout.str()
    copy = shop.parent / "copy"
    shutil.copytree(shop, copy, ignore=shutil.ignore_patterns("runs"))
    refused = run(pytester, copy, f"--eval-runs-dir={shared}", "--eval-resume=part")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR, refused.stdout.str()
    told = flat(refused.stderr.str())
    assert f"part is a run of the set at {shop.resolve()}, which is still there" in told
    assert f"pytest {shop.resolve()} --eval-resume=part" in told
    # A set that moved is no longer there: its run is adopted where it is now.
    moved = shop.parent / "moved"
    shop.rename(moved)
    fake.policy = script(moved, set()).policy()
    resumed = run(pytester, moved, f"--eval-runs-dir={shared}", "--eval-resume=part")
    # Finished: the case that failed before the stop keeps its score (never answered again).
    assert resumed.ret == pytest.ExitCode.TESTS_FAILED, resumed.stdout.str()
    read = ledger_reader.read_run(shared / "part")
    assert read.errors == [] and read.info is not None
    assert read.info.status == "complete" and read.info.set_dir == str(moved.resolve())
    assert len(read.scores()) == 4


def test_each_set_s_cases_are_answered_against_its_own_target(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # Found by the hostile pass: items were started ahead with the waiting item's roles, so
    # a session of two sets answered the second set's cases against the first set's model,
    # and the second run recorded the first set's target and model pins.
    import json

    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.sets import cases as sets
    from pytest_evalloop.targets.target import target_pins

    shop, other = two_sets(pytester, fake, 6)
    config = json.loads((other / "set.json").read_text())
    config["name"] = "shop2"
    (other / "set.json").write_text(json.dumps(config))
    model = other / "model.json"
    model.write_text(model.read_text().replace('"doc": "', '"doc": "MARKER_SHOP2 '))
    result = pytester.runpytest_subprocess(
        str(shop.parent), "-p", "no:cacheprovider", "--eval-concurrency=8", "--eval-label=m"
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    for set_dir in (shop, other):
        read = ledger_reader.read_run(set_dir / "runs" / "m")
        assert read.errors == [] and read.info is not None
        own = target_pins(set_dir, sets.load_set_config(set_dir), target=None, tool_profile=None)
        assert (read.info.target, read.info.model_sha) == (own["target"], own["modelSha"])
        transcripts = [
            (set_dir / "runs" / "m" / a.transcript_path).read_text()
            for a in read.of_kind("attempt")
            if a.transcript_path
        ]
        assert len(transcripts) == 6
        # What the answerer was shown came from this set's model, every case.
        assert all(("MARKER_SHOP2" in t) == (set_dir == other) for t in transcripts)


@pytest.mark.parametrize("left_out", ["--ignore", "--ignore-glob", "collect_ignore"])
def test_a_set_pytest_leaves_out_is_no_set_of_the_session(
    pytester: pytest.Pytester, fake: FakeAnthropic, left_out: str
) -> None:
    # Found by the second hostile pass: the sets a session named were walked past pytest's
    # own ignore options, so a session that collects one set was refused as if it ran two.
    shop, other = two_sets(pytester, fake, 2)
    args = [str(shop.parent), f"--eval-runs-dir={pytester.path / 'shared'}", "--eval-label=x"]
    if left_out == "--ignore":
        args.append(f"--ignore={other}")
    elif left_out == "--ignore-glob":
        args.append("--ignore-glob=*/shop2")
    else:
        (shop.parent / "conftest.py").write_text('collect_ignore = ["shop2"]\n')
    result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*2 passed*"])
    assert (pytester.path / "shared" / "x" / "run.json").is_file()


def split_sets(pytester: pytest.Pytester, fake: FakeAnthropic) -> tuple[Path, Path, list[str]]:
    """Two sets of two cases each with other questions (`shop`: the first two, `shop2`: the
    next two); the fake answers all four (the oracle). Returns them and the four questions."""
    from pytest_evalloop.sets import cases as sets
    from tests.test_gate import questions, script

    shop = make_set(pytester.path, QIDS[:4])
    asked = questions(shop)
    whole = shutil.copytree(shop, pytester.path / "all-four")  # the fake reads its rows
    fake.policy = script(whole, set()).policy()
    other = shop.parent / "shop2"
    shutil.copytree(shop, other)
    rows = (shop / sets.CASES_FILE).read_text().splitlines(keepends=True)
    (shop / sets.CASES_FILE).write_text("".join(rows[:2]))
    (other / sets.CASES_FILE).write_text("".join(rows[2:]))
    return shop, other, [asked[q] for q in QIDS[:4]]


def test_the_next_sets_cases_start_while_this_sets_last_is_waited_on(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # The look-ahead stopped at every other file: a set's last cases ran with the slots
    # around them empty, and node ids alternating between sets ran one at a time. Here the
    # first set's first case can end only once the second set's first case was asked.
    from pytest_evalloop.ledger import reader as ledger_reader

    shop, other, asked = split_sets(pytester, fake)
    from tests.test_concurrency import HeldUntilAsked

    policy = HeldUntilAsked(fake.policy, held=asked[0], until=asked[2])
    fake.policy = policy
    result = pytester.runpytest_subprocess(
        str(shop.parent), "-p", "no:cacheprovider", "--eval-concurrency=2", "--eval-label=a",
        timeout=120,  # a guard for a hang (the look-ahead never crossed), not a measure
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert policy.asked.is_set()
    for set_dir in (shop, other):
        read = ledger_reader.read_run(set_dir / "runs" / "a")
        assert read.errors == [] and len(read.scores()) == 2


CONFTESTS = {
    "autouse fixture": (
        "@pytest.fixture(autouse=True)\n"
        "def set_up(request):\n"
        "    pathlib.Path(MARKS, request.node.path.parent.name).touch()\n"
    ),
    "setup hook": (
        "def pytest_runtest_setup(item):\n    pathlib.Path(MARKS, item.path.parent.name).touch()\n"
    ),
    # A role made for the item's own set: its value differs between sets, its definition not.
    "answerer per set": (
        "@pytest.fixture\n"
        "def evalloop_answerer(evalloop_answerer, request):\n"
        "    pathlib.Path(MARKS, request.node.path.parent.name).touch()\n"
        "    made = copy.copy(evalloop_answerer)\n"
        "    made.model = 'answerer-for-' + request.node.path.parent.name\n"
        "    return made\n"
    ),
}


@pytest.mark.parametrize("where", ["its own", "shared"])
@pytest.mark.parametrize("conftest", sorted(CONFTESTS))
def test_a_set_a_conftest_prepares_starts_in_its_turn(
    pytester: pytest.Pytester, fake: FakeAnthropic, conftest: str, where: str
) -> None:
    # A conftest may prepare a set's cases (an autouse fixture, a hook) or give them roles of
    # their own (an answerer read off the item): those items are never started ahead by
    # another set's item, only once pytest reaches their set. Found by the hostile pass: with
    # a shared conftest, the second set's cases went ahead with the first set's answerer.
    shop, other, asked = split_sets(pytester, fake)
    marks = pytester.path / "set-up"
    marks.mkdir()
    folder = other if where == "its own" else shop.parent
    (folder / "conftest.py").write_text(
        f"import copy, pathlib, pytest\nMARKS = {str(marks)!r}\n{CONFTESTS[conftest]}"
    )
    inner = fake.policy
    set_up_first: dict[str, bool] = {}

    def policy(request: Any) -> Any:
        if request.role == "answerer" and request.turn == 1 and request.question in asked[2:]:
            set_up_first[request.question] = (marks / other.name).exists()
        return inner(request)

    fake.policy = policy
    result = pytester.runpytest_subprocess(
        str(shop.parent), "-p", "no:cacheprovider", "--eval-concurrency=8", "--eval-label=b"
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    # Each of its cases was asked once its set was reached: after its first item's set-up.
    assert set_up_first == {asked[2]: True, asked[3]: True}
    if conftest == "answerer per set":
        models = {r.question: r.model for r in fake.calls("answerer")}
        assert {models[q] for q in asked[2:]} == {"answerer-for-shop2"}
        if where == "shared":
            assert {models[q] for q in asked[:2]} == {"answerer-for-shop"}


@pytest.mark.parametrize("mark", ["skip", "xfail(run=False)"])
def test_an_item_marked_not_to_run_is_never_answered_ahead(
    pytester: pytest.Pytester, fake: FakeAnthropic, mark: str
) -> None:
    # Found by the hostile passes: items a conftest marked skip (or xfail not run) were
    # answered ahead of their turn (paid for, recorded nowhere, or recorded for a case pytest
    # reports as not run), and a set skipped whole left an interrupted run.
    shop, other, asked = split_sets(pytester, fake)
    made = "pytest.mark.skip(reason='not today')" if mark == "skip" else f"pytest.mark.{mark}"
    (shop.parent / "conftest.py").write_text(
        "import pytest\n"
        "def pytest_collection_modifyitems(items):\n"
        "    for item in items:\n"
        f"        if item.path.parent.name == 'shop2' or item.name.endswith({QIDS[1]!r}):\n"
        f"            item.add_marker({made})\n"
    )
    result = pytester.runpytest_subprocess(
        str(shop.parent), "-p", "no:cacheprovider", "--eval-concurrency=8", "--eval-label=s"
    )
    # (A case of the set not run leaves its run unfinished: exit 8, as without look-ahead.)
    assert result.ret == 8, result.stdout.str()
    if mark == "skip":
        result.assert_outcomes(passed=1, skipped=3)
    else:
        result.assert_outcomes(passed=1, xfailed=3)
    assert {r.question for r in fake.calls("answerer")} == {asked[0]}
    assert not (other / "runs" / "s").exists()


@pytest.mark.parametrize("order", ["by set", "alternating"])
def test_a_set_a_plugin_module_skips_is_never_answered_ahead(
    pytester: pytest.Pytester, fake: FakeAnthropic, order: str
) -> None:
    # Found by the hostile pass: a set-up hook outside any conftest (a module given with `-p`,
    # or named in `pytest_plugins`) that skips one set: its cases went ahead anyway.
    shop, other, asked = split_sets(pytester, fake)
    pytester.makepyfile(
        skipper="import pytest\n"
        "def pytest_runtest_setup(item):\n"
        "    if item.path.parent.name == 'shop2':\n"
        "        pytest.skip('not this set')\n"
    )
    targets = [str(shop.parent)]
    if order == "alternating":
        # a's first, b's first, a's second, b's second
        targets = [f"{shop}/cases.jsonl::{QIDS[0]}", f"{other}/cases.jsonl::{QIDS[2]}"]
        targets += [f"{shop}/cases.jsonl::{QIDS[1]}", f"{other}/cases.jsonl::{QIDS[3]}"]
    result = pytester.runpytest_subprocess(
        *targets, "-p", "skipper", "-p", "no:cacheprovider", "--eval-concurrency=8",
        "--eval-label=p",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=2, skipped=2)
    assert {r.question for r in fake.calls("answerer")} == set(asked[:2])
    assert not (other / "runs" / "p").exists()


def test_last_failed_answers_only_the_cases_it_selects(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # Found by the hostile pass: the look-ahead planned its queue before `--lf` deselected,
    # so cases pytest deselected were answered ahead and recorded in the run as passes.
    from tests.test_gate import script

    shop, other, asked = split_sets(pytester, fake)
    fake.policy = script(pytester.path / "all-four", {QIDS[1], QIDS[2]}).policy()
    files = [str(shop / "cases.jsonl"), str(other / "cases.jsonl")]
    first = pytester.runpytest_subprocess(*files, "--eval-label=all", "--eval-concurrency=8")
    first.assert_outcomes(passed=2, failed=2)
    calls = len(fake.calls("answerer"))
    again = pytester.runpytest_subprocess(
        *files, "--lf", "--eval-label=again", "--eval-concurrency=8"
    )
    again.assert_outcomes(failed=2, deselected=2)
    assert {r.question for r in fake.calls("answerer")[calls:]} == {asked[1], asked[2]}


def test_pyargs_imports_nothing_before_the_session_and_a_test_beside_a_set_is_no_set(
    pytester: pytest.Pytester, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the hostile pass: the lookup of `--pyargs` names imported their parents at
    # configure (a package that needs its conftest's session start crashed the session, with no
    # set involved), and a Python test in a set's folder counted as that set.
    package = pytester.path / "lib" / "mypkg"
    (package / "tests").mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import os\n"
        "if not os.environ.get('MYPKG_READY'):\n"
        "    raise RuntimeError('mypkg imported before the session set it up')\n"
    )
    (package / "tests" / "__init__.py").write_text("")
    (package / "tests" / "test_ok.py").write_text("def test_ok():\n    pass\n")
    pytester.makeconftest(
        "import os\ndef pytest_sessionstart(session):\n    os.environ['MYPKG_READY'] = '1'\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pyargs", "mypkg.tests")
    assert plain.ret == pytest.ExitCode.OK, plain.stdout.str() + plain.stderr.str()
    # One set run, beside a Python test that lives in another set's folder.
    shop, other = two_sets(pytester, fake, 2)
    (shop / "test_helpers.py").write_text("def test_helper():\n    pass\n")
    shared = pytester.path / "shared"
    result = pytester.runpytest_subprocess(
        str(shop / "test_helpers.py"), str(other), "-p", "no:cacheprovider",
        f"--eval-runs-dir={shared}", "--eval-label=x",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=3)
