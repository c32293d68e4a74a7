"""A set's target starts opening as the session's items start, not when the first item needs it;
a conftest that replaces the `evalloop_target` fixture decides its own target, untouched."""

from __future__ import annotations

import sys

import pytest
from mcp import StdioServerParameters

from pytest_evalloop.settargets import _served_elsewhere
from pytest_evalloop.targets.profiles import EMBEDDED
from pytest_evalloop.targets.target import MCPTarget
from pytest_evalloop.testing import FakeAnthropic
from tests.test_run import QIDS
from tests.test_run_memory import run_with_conftest

WATCHED = """
import threading
import pytest
from pytest_evalloop.answer.backends import default_target
from pytest_evalloop.stash import SETTINGS_KEY

OPENED = threading.Event()
MADE = []


class Watched:
    '''The set's own target, telling when its open began.'''

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def open(self):
        OPENED.set()
        return await self.inner.open()


LOOKED = []


def _first_item(nodeid):
    # True once: at the first item's logstart (before its protocol, hooks and fixtures).
    if LOOKED:
        return False
    LOOKED.append(nodeid)
    return True


def _watched(config, set_dir, set_config):
    MADE.append(set_dir)
    return Watched(default_target(set_dir, set_config, config.stash[SETTINGS_KEY]))
"""

BY_HOOK = (
    WATCHED
    + """

def pytest_evalloop_make_target(config, set_dir, set_config):
    return _watched(config, set_dir, set_config)


def pytest_runtest_logstart(nodeid, location):
    if not _first_item(nodeid):
        return
    # Before the first item's protocol, its setup hooks and fixtures: the open began already.
    # (The wait only bounds a failure: without the early open nothing sets the event.)
    print(f"\\nOPEN BEGAN BEFORE THE FIRST ITEM {OPENED.wait(30)}")
"""
)

BY_FIXTURE = (
    WATCHED
    + """

def pytest_evalloop_make_target(config, set_dir, set_config):
    MADE.append(("hook", set_dir))
    return None


@pytest.fixture
def evalloop_target(request):
    node = request.node
    return _watched(request.config, node.set_dir, node.set_config)


def pytest_runtest_logstart(nodeid, location):
    if _first_item(nodeid):
        print(f"\\nMADE BEFORE THE FIRST ITEM {len(MADE)}")
"""
)


def test_the_first_items_target_is_opening_before_that_item_runs(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    # The set's own server as a stdio command: a server in its own process, opened early.
    set_dir = pytester.path / "evals" / "shop"
    server = (
        f"{sys.executable} -m pytest_evalloop.targets.embedded.server {set_dir} --transport stdio"
    )
    _, result = run_with_conftest(
        pytester, fake, QIDS[:3], BY_HOOK, "-s", f"--eval-target={server}"
    )
    assert result.parseoutcomes().get("passed") == 3, result.stdout.str()
    result.stdout.fnmatch_lines(["*OPEN BEGAN BEFORE THE FIRST ITEM True*"])


def test_a_conftests_own_target_fixture_is_not_opened_for_it(
    pytester: pytest.Pytester, fake: FakeAnthropic
) -> None:
    _, result = run_with_conftest(pytester, fake, QIDS[:2], BY_FIXTURE, "-s")
    assert result.parseoutcomes().get("passed") == 2, result.stdout.str()
    # Neither the hook nor the conftest's fixture was asked for a target before the first
    # item's setup: the plugin did not make one of its own to open early.
    result.stdout.fnmatch_lines(["*MADE BEFORE THE FIRST ITEM 0*"])


def test_collect_only_opens_nothing(pytester: pytest.Pytester, fake: FakeAnthropic) -> None:
    finish = "\n\ndef pytest_sessionfinish(session):\n    print(f'\\nMADE {len(MADE)}')\n"
    _, result = run_with_conftest(pytester, fake, QIDS[:2], BY_HOOK + finish, "-s", "--co")
    result.stdout.fnmatch_lines(["*MADE 0*"])


def test_only_a_target_served_by_another_process_is_opened_early() -> None:
    # An in-process server opened on the loop's thread beside the SDK imports was measured
    # slower to the first call (1.98 -> 2.61 s at 500 cases): it is left to its first item.
    from mcp.server.mcpserver import MCPServer

    profile = EMBEDDED
    stdio = StdioServerParameters(command=sys.executable, args=["-c", "pass"])
    assert _served_elsewhere(MCPTarget(stdio, profile, name="stdio"))
    assert _served_elsewhere(MCPTarget("http://127.0.0.1:9/mcp", profile, name="url"))
    in_process = MCPTarget(MCPServer(name="here"), profile, name="here")
    assert not _served_elsewhere(in_process)
    assert not _served_elsewhere(object())


RAISING_HOOK = """
import pytest

def pytest_evalloop_make_target(config, set_dir, set_config):
    {body}
"""


@pytest.mark.parametrize(
    ("body", "outcome"),
    [
        ("raise RuntimeError('no server today')", {"errors": 2}),
        ("pytest.skip('the server is down')", {"skipped": 2}),
        (
            "return type('T', (), {'server': property(lambda self: 1 / 0)})()",
            {"errors": 2},
        ),
    ],
    ids=["raises", "skips", "server-attribute-raises"],
)
def test_a_conftest_hook_that_raises_or_skips_is_the_items_not_an_internal_error(
    pytester: pytest.Pytester, fake: FakeAnthropic, body: str, outcome: dict[str, int]
) -> None:
    # Found by the hostile pass: the early open asked the hook outside any item.
    _, result = run_with_conftest(pytester, fake, QIDS[:2], RAISING_HOOK.format(body=body))
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(**outcome)
