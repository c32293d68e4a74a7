"""Which items may start ahead of pytest's turn, and with which target (see `Runtime`).

The runtime starts the next items of its queue while pytest waits on one, with the roles (the
answerer, judge and target fixtures' values) of the item waited on. Those are every item's
roles only within one file, and only for an item pytest will run: an item of another file (another
set) gets its own set's target, and only when nothing else of its roles or of its set-up can
differ; an item marked to be skipped waits for its turn.
"""

from __future__ import annotations

import concurrent.futures
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import pytest

SETUP_HOOKS = (
    "pytest_runtest_protocol",
    "pytest_runtest_setup",
    "pytest_runtest_call",
    "pytest_fixture_setup",
)
"""A project's plugin (a conftest, a `-p` module, a `pytest_plugins` one) implementing one of
these may prepare (or skip) an item when pytest reaches it."""


def may_start_ahead(item: Any) -> bool:
    """Whether the item may be answered before pytest reaches it, as far as its marks say: not
    when marked to be skipped or not run (pytest may never run it; an answer paid for it would
    be recorded nowhere, or recorded for a case pytest reports as not run)."""
    for mark in item.iter_markers():
        if mark.name in ("skip", "skipif"):
            return False
        if mark.name == "xfail" and not mark.kwargs.get("run", True):
            return False
    return True


class OneAtATimeWarning(UserWarning):
    """A set's cases start one at a time, each in pytest's turn (`StartRule`)."""


class StartRule:
    """Whether an item may be answered before pytest reaches it (`Runtime.may_start_ahead`):
    its marks allow it, and nothing of the project's own code runs at its set-up, where it
    could skip it: no hook of `SETUP_HOOKS` from a conftest that applies to it or from a `-p`
    or `pytest_plugins` module, and no function-scoped fixture of theirs (a broader one was
    set up for the item waited on already).

    Why: a conftest's `pytest_runtest_setup` that skipped one case of a set let the look-ahead
    answer it; pytest reported it skipped, and the run counted its verdict (1 passed, 1 skipped,
    "2 match", complete). Such a project's cases start one at a time, in pytest's turn, and a
    warning per set says what keeps them there.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._hook_of_project: dict[Any, tuple[str, Any] | None] = {}  # by the item's path
        self._warned: set[Any] = set()

    def __call__(self, item: Any) -> bool:
        if not may_start_ahead(item):
            return False
        trusted = _installed(self.config)  # asked once items run: every plugin is registered
        if item.path not in self._hook_of_project:
            self._hook_of_project[item.path] = next(
                (
                    (f"{hook} of {_file_of(impl.plugin)}", impl.function)
                    for hook in SETUP_HOOKS
                    for impl in getattr(item.ihook, hook).get_hookimpls()
                    if _top(impl.plugin) not in trusted
                ),
                None,
            )
        found = self._hook_of_project[item.path] or next(
            (
                (f"the fixture {fd.argname!r} of {_file_of(fd.func)}", fd.func)
                for defs in (_defs(item) or {}).values()
                for fd in defs
                if fd.scope == "function" and _top(fd.func) not in trusted
            ),
            None,
        )
        if found is None:
            return True
        if item.path not in self._warned:
            self._warned.add(item.path)
            _warn(item.path.parent, *found)
        return False


def _warn(set_dir: Any, why: str, code: Any) -> None:
    """The warning, at the project's code that caused it; said, never raised: under `-W error`
    it failed the item waited on, whose attempt ran on and was counted."""
    code = getattr(getattr(code, "__wrapped__", code), "__code__", None)
    with warnings.catch_warnings():
        warnings.simplefilter("always", OneAtATimeWarning)
        warnings.warn_explicit(
            OneAtATimeWarning(
                f"evalloop: the cases of {set_dir} start one at a time, each in pytest's turn: "
                f"{why} runs at each case's set-up and may skip it, so none is answered ahead. "
                "A session-scoped fixture, or that code kept from the set's cases, lets them "
                "run --eval-concurrency at a time"
            ),
            OneAtATimeWarning,
            filename=getattr(code, "co_filename", "<unknown>"),
            lineno=getattr(code, "co_firstlineno", 0),
        )


def _file_of(obj: Any) -> str:
    """A plugin or fixture function, named by its file when it has one."""
    target = getattr(obj, "__wrapped__", obj)
    if not isinstance(target, types.ModuleType):
        target = sys.modules.get(getattr(target, "__module__", "") or "", target)
    return str(getattr(target, "__file__", None) or getattr(target, "__name__", None) or target)


def target_ahead(config: pytest.Config, own: dict[str, Any], waiting: Any, candidate: Any) -> Any:
    """The target `candidate`, an item of another file, would be answered against, when that
    is known before pytest sets it up; else None, and it starts when pytest reaches it.

    Known only when nothing of its roles or set-up can differ from `waiting`'s but the set:
    its answerer, judge and target fixtures are the plugin's own (`own`, by name; a conftest's
    may read the item, as `request.node`); it uses the very fixture definitions `waiting` uses,
    each of them pytest's, this plugin's or an installed plugin's (a project's autouse fixture
    may prepare the set); the same conftests apply to both; and no plugin but those implements
    a hook of its set-up (`SETUP_HOOKS`). Its target is then `target_for` its own set.

    Why: the look-ahead stopped at every other file, so each set's last attempts ran with the
    slots around them empty, and node ids alternating between two sets ran one at a time
    (2 x 48 cases at 100 ms, concurrency 16: 64.7 s; crossing, 6.2 s).
    """
    from pytest_evalloop.settargets import target_for, uses_own  # the runtime imports this

    if not all(uses_own(candidate, fixture, name) for name, fixture in own.items()):
        return None
    if not _same_fixtures(waiting, candidate):
        return None
    trusted = _installed(config)
    if not all(
        _top(fd.func) in trusted for defs in (_defs(candidate) or {}).values() for fd in defs
    ):
        return None  # a fixture of a conftest, a `-p` module or a `pytest_plugins` one
    for hook in SETUP_HOOKS:
        if any(_top(i.plugin) not in trusted for i in getattr(config.hook, hook).get_hookimpls()):
            return None  # a set-up hook of user code (a conftest, `-p`, `pytest_plugins`)
    conftests = getattr(config.pluginmanager, "_getconftestmodules", None)
    if conftests is None:
        return None
    if list(conftests(candidate.path)) != list(conftests(waiting.path)):
        return None
    try:
        return target_for(config, candidate.set_dir, candidate.set_config)
    except (Exception, pytest.skip.Exception, pytest.fail.Exception, pytest.xfail.Exception):
        return None  # as in `settargets.open_early`: the item asks again in its turn


_TRUSTED = pytest.StashKey[set[str]]()


def _installed(config: pytest.Config) -> set[str]:
    """The top-level packages of pytest, this plugin and the plugins installed as
    distributions: generic code, which treats every set alike. Fixtures and hooks of anything
    else (a conftest, a module given with `-p`, a `pytest_plugins` module) are the project's,
    and may prepare or skip one set's items. Found once a session: reading the distributions'
    file lists costs about 10 ms."""
    trusted = config.stash.get(_TRUSTED, None)
    if trusted is None:
        trusted = config.stash[_TRUSTED] = {"_pytest", "pytest", "pytest_evalloop", "pluggy"}
        for plugin, dist in config.pluginmanager.list_plugin_distinfo():
            if _installed_by(plugin, dist):
                trusted.add(_top(plugin))
    return trusted


def _installed_by(plugin: Any, dist: Any) -> bool:
    """Whether a plugin's module is a file its distribution installed. Its entry point imports
    the module by name, so a module of that name earlier on the path (the project's own
    `pytest_timeout.py`) is what loads, and is the project's code, not the distribution's."""
    file = getattr(plugin, "__file__", None)
    if not file:
        return False
    loaded = Path(file).resolve()
    return any(
        Path(dist.locate_file(part)).resolve() == loaded
        for part in dist.files or ()
        if part.name == loaded.name
    )


def _top(obj: Any) -> str:
    """The top-level package an object (a module, a function, a plugin object) comes from."""
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
    else:
        target = getattr(obj, "__wrapped__", obj)
        name = getattr(target, "__module__", None) or type(target).__module__
    return name.partition(".")[0]


def _defs(item: Any) -> dict[str, Any] | None:
    return getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", None)


def _same_fixtures(one: Any, other: Any) -> bool:
    """Whether two items use the same fixture definitions, each name for name."""
    mine, theirs = _defs(one), _defs(other)
    if mine is None or theirs is None or mine.keys() != theirs.keys():
        return False
    return all(
        len(defs) == len(theirs[name])
        and all(a is b for a, b in zip(defs, theirs[name], strict=True))
        for name, defs in mine.items()
    )


def never_run(
    futures: dict[str, concurrent.futures.Future[Any]], where: dict[str, tuple[str, str]]
) -> dict[str, list[str]]:
    """Per run directory, the cases the runtime started ahead and pytest never ran: items no
    `run_item` waited on by the session's end. Something pytest did after the look-ahead started
    them (a mark a hook added later, an item dropped from the session) kept them from running;
    those the ledger holds an attempt of are left out by the run's close, so a verdict pytest
    never reported does not pass for a whole run's."""
    out: dict[str, list[str]] = {}
    for nodeid in futures:
        if nodeid in where:
            run_dir, qid = where[nodeid]
            out.setdefault(str(Path(run_dir).resolve()), []).append(qid)
    return out
