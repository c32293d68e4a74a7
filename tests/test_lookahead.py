"""Within one set: which cases the runtime may answer before pytest reaches them
(`lookahead.StartRule`). A case the project's own code sets up may be skipped there, so it
starts only in its turn; what pytest sets up alone (or a broader-scoped fixture, already set up
for the case waited on) leaves the look-ahead on."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path

import pytest

from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import QIDS
from tests.test_shared_runs_dir import split_sets

SKIPPERS = {  # each: what it is, and the warning's name for it
    "setup hook": (
        "def pytest_runtest_setup(item):\n"
        "    if item.name.endswith(SKIPPED):\n"
        "        pytest.skip('not this one')\n"
    ),
    "autouse fixture": (
        "@pytest.fixture(autouse=True)\n"
        "def only_some(request):\n"
        "    if request.node.name.endswith(SKIPPED):\n"
        "        pytest.skip('not this one')\n"
    ),
}


def one_set(pytester: pytest.Pytester, fake: FakeAnthropic) -> tuple[Path, list[str]]:
    """`split_sets`'s first set alone (two cases) and the questions of all four."""
    shop, other, asked = split_sets(pytester, fake)
    shutil.rmtree(other)
    return shop, asked


def run_under(
    pytester: pytest.Pytester, shop: Path, conftest: str, label: str, *args: str
) -> pytest.RunResult:
    """`pytest <shop>` with `conftest` beside the set, at concurrency 8 unless `args` say."""
    (shop.parent / "conftest.py").write_text(conftest)
    return pytester.runpytest_subprocess(
        str(shop), "-p", "no:cacheprovider", "--eval-concurrency=8", f"--eval-label={label}", *args
    )


@pytest.mark.parametrize("skipper", sorted(SKIPPERS))
def test_a_case_the_project_skips_at_set_up_is_never_answered_ahead(
    pytester: pytest.Pytester, fake: FakeAnthropic, skipper: str
) -> None:
    # Found by the hostile pass: a conftest that skipped one case at its set-up let the
    # look-ahead answer it first; pytest said "1 passed, 1 skipped", the run "2 match",
    # complete. Now it is never asked, and its run is unfinished, as with a skip mark.
    shop, asked = one_set(pytester, fake)
    skips = f"import pytest\nSKIPPED = {QIDS[1]!r}\n{SKIPPERS[skipper]}"  # the one after
    result = run_under(pytester, shop, skips, "k")
    assert result.ret == 8, result.stdout.str()  # a case of the set not run: unfinished
    result.assert_outcomes(passed=1, skipped=1)
    assert {r.question for r in fake.calls("answerer")} == {asked[0]}
    result.stdout.fnmatch_lines(["verdicts: 1 match", "run: k (interrupted) at *"])
    # Said once, with what keeps the set's cases in pytest's turn.
    named = {
        "setup hook": "pytest_runtest_setup of *conftest.py",
        "autouse fixture": "*'only_some' of *conftest.py",
    }
    result.stdout.fnmatch_lines(
        [f"*OneAtATimeWarning: evalloop: the cases of *shop start one at a time*{named[skipper]}*"]
    )
    assert result.stdout.str().count("OneAtATimeWarning") == 1


def test_the_warning_is_never_raised_under_warnings_as_errors(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # Found by the hostile pass: under `filterwarnings = error` the warning raised in the item
    # waited on, erroring it while its attempt ran on and was counted (2 errors, "3 match").
    shop, asked = one_set(pytester, fake)
    pytester.makeini(
        "[pytest]\nfilterwarnings =\n    error\n    ignore::DeprecationWarning\n"
        "asyncio_default_fixture_loop_scope = function\n"
    )
    harmless = "import pytest\n@pytest.fixture(autouse=True)\ndef harmless():\n    yield\n"
    result = run_under(pytester, shop, harmless, "w")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=2, warnings=1)
    # Said at the fixture that keeps the set one at a time, in the project's own file.
    result.stdout.fnmatch_lines(["*conftest.py:*: OneAtATimeWarning: *'harmless'*"])


def test_a_module_that_shadows_an_installed_plugin_is_the_project_s_code(
    pytester: pytest.Pytester, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the hostile pass: a `pytest_timeout.py` on the path is what pytest-timeout's
    # entry point loads, and was trusted as the installed plugin: its set-up hook skipped a
    # case the look-ahead had answered.
    shop, asked = one_set(pytester, fake)
    (pytester.path / "pytest_timeout.py").write_text(
        f"import pytest\nSKIPPED = {QIDS[1]!r}\n{SKIPPERS['setup hook']}"
    )
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))
    # A cold Python (not the suite's fork server, which imported pytest-timeout already).
    result = pytester.run(
        sys.executable, "-m", "pytest", str(shop), "-p", "no:cacheprovider",
        "--eval-concurrency=8", "--eval-label=t",
    )  # fmt: skip
    result.assert_outcomes(passed=1, skipped=1)
    assert {r.question for r in fake.calls("answerer")} == {asked[0]}
    result.stdout.fnmatch_lines(
        ["*OneAtATimeWarning: *pytest_runtest_setup of *pytest_timeout.py*"]
    )


def test_a_skip_raised_after_the_verdict_is_reported_as_pytest_s_skip(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # Found by the hostile pass: a plugin's call hook that skipped once the case was answered
    # left the verdict on the report, so pytest counted the skipped case as passed.
    shop, asked = one_set(pytester, fake)
    skips = (
        "import pytest\n"
        "@pytest.hookimpl(trylast=True)\n"  # after pytest's own, which answers the case
        "def pytest_runtest_call(item):\n"
        f"    if item.name.endswith({QIDS[0]!r}):\n"
        "        pytest.skip('skipped once answered')\n"
    )
    result = run_under(pytester, shop, skips, "c", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * skipped once answered"])
    assert {r.question for r in fake.calls("answerer")} == set(asked[:2])


def test_a_broader_fixture_of_the_project_leaves_the_look_ahead_on(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # A session-scoped fixture was set up for the case waited on already: nothing of the next
    # case's set-up is the project's, so it starts while the first is waited on (the first can
    # end only once the second was asked).
    from tests.test_concurrency import HeldUntilAsked

    shop, asked = one_set(pytester, fake)
    policy = HeldUntilAsked(fake.policy, held=asked[0], until=asked[1])
    fake.policy = policy
    broader = (
        "import pytest\n"
        "@pytest.fixture(autouse=True, scope='session')\n"
        "def prepared():\n"
        "    yield\n"
        "def pytest_sessionstart(session):\n"  # a hook outside the items' set-up
        "    pass\n"
    )
    # The timeout is a guard for a hang (nothing started ahead), not a measure.
    result = run_under(pytester, shop, broader, "m", "--eval-concurrency=2", "--timeout=120")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert policy.asked.is_set()
    result.assert_outcomes(passed=2)
    assert "OneAtATimeWarning" not in result.stdout.str()


LATER = {
    # A mark a hook outside the items' set-up adds once the look-ahead started the case.
    "marked by the item before": (
        "def pytest_runtest_teardown(item, nextitem):\n"
        "    if nextitem is not None and nextitem.name.endswith(DROPPED):\n"
        "        nextitem.add_marker(pytest.mark.skip(reason='marked late'))\n"
    ),
    # An item dropped from the session after the look-ahead planned its queue.
    "dropped after the plan": (
        "@pytest.hookimpl(trylast=True)\n"
        "def pytest_collection_finish(session):\n"
        "    session.items[:] = [i for i in session.items if not i.name.endswith(DROPPED)]\n"
    ),
}


@pytest.mark.parametrize("later", sorted(LATER))
def test_a_case_answered_ahead_that_pytest_never_runs_leaves_its_run_unfinished(
    pytester: pytest.Pytester, fake: FakeAnthropic, later: str
) -> None:
    # Found by the hostile pass: what pytest decides after the look-ahead started a case
    # cannot be seen ahead; the case was answered, pytest never ran it, and the run counted
    # it, complete. Now the close names it, and the run is unfinished (exit 8), as when pytest
    # skips a case no look-ahead started.
    from pytest_evalloop.ledger import reader as ledger_reader
    from pytest_evalloop.measure.comparable import NEVER_RUN
    from tests.test_gate import Held

    shop, asked = one_set(pytester, fake)
    # The first case is held until the second's verdict is in its ledger: the second is then
    # an attempt pytest never ran, never one the session's end cancelled (CI drew that once).
    scored = threading.Event()
    fake.policy = Held(fake.policy, {asked[0]}, scored)
    watcher = threading.Thread(
        target=_wait_for_score, args=(shop / "runs" / "n" / "events.jsonl", QIDS[1], scored)
    )
    watcher.start()
    try:
        later_code = f"import pytest\nDROPPED = {QIDS[1]!r}\n{LATER[later]}"
        result = run_under(pytester, shop, later_code, "n")
    finally:
        scored.set()
        watcher.join()
    assert result.ret == 8, result.stdout.str()
    assert asked[1] in {r.question for r in fake.calls("answerer")}  # started ahead
    info = ledger_reader.read_run_info(shop / "runs" / "n")
    assert info.status == "interrupted" and info.selection is not None
    left = {reason: entry["qids"] for reason, entry in info.selection["leftOut"].items()}
    assert left == {NEVER_RUN: [QIDS[1]]}
    assert info.selection["attempted"] == 1 and info.selection["whole"] is False


def _wait_for_score(events: Path, qid: str, scored: threading.Event) -> None:
    """Set `scored` once `events` holds a score of `qid` (or once the test set it)."""
    while not scored.wait(0.02):
        try:
            lines = events.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line being written
            if event.get("kind") == "score" and event.get("qid") == qid:
                scored.set()
