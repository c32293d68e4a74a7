"""The target each set's items are answered against in this process: made once, and opened
before the first item needs it.

A target behind a server process (the Malloy compiler's, a stdio MCP command) takes about a
second to start. Opened by the first item, that second sits on the run's critical path, after
the item has also imported the model SDKs (another second, on this process's CPU). Opened as
the session's items start, on the runtime's event loop, the server starts in its own process
while this one imports: the first item finds it up, or nearly. An in-process target is left to
its first item: its open would run on this interpreter beside the imports, and lose.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_evalloop import options
from pytest_evalloop.stash import SETTINGS_KEY, runtime_of

TARGETS_KEY = pytest.StashKey[dict[Path, Any]]()
"""Each set's target in this process, by set directory (the fixture's and the early open's)."""


def target_for(config: pytest.Config, set_dir: Path, set_config: Any) -> Any:
    """The set's target, made on first need: `--eval-rejudge-from`'s replay, else a conftest's
    `pytest_evalloop_make_target`, else the set's own (`backends.default_target`)."""
    cache = config.stash.setdefault(TARGETS_KEY, {})
    found = cache.get(set_dir)
    if found is not None:
        return found
    settings = config.stash[SETTINGS_KEY]
    if settings.rejudge_from:
        made = _replay_target(set_dir, settings)
    else:
        made = config.hook.pytest_evalloop_make_target(
            config=config, set_dir=set_dir, set_config=set_config
        )
        if made is None:
            from pytest_evalloop.answer.backends import default_target

            made = default_target(set_dir, set_config, settings)
    cache[set_dir] = made
    return made


def open_early(session: pytest.Session, fixture: Any) -> None:
    """Start opening the first item's target on the runtime's loop, without waiting for it
    (controller without xdist, worker). `fixture` is the plugin's own `evalloop_target`:
    a conftest that replaces that fixture decides its target itself, so nothing is opened.

    Its failure is not raised here: the first item that awaits the same open raises it, as it
    would have without this."""
    config = session.config
    settings = config.stash[SETTINGS_KEY]
    if options.answers_no_case(config.option) or settings.estimate or settings.rejudge_from:
        return
    if settings.verify_goldens or settings.check_judge:
        return
    from pytest_evalloop.items import CaseItem

    first = next((item for item in session.items if isinstance(item, CaseItem)), None)
    if first is None or not uses_own(first, fixture) or _skipped(first):
        return
    try:
        target = target_for(config, first.set_dir, first.set_config)
        elsewhere = _served_elsewhere(target)
    except (Exception, pytest.skip.Exception, pytest.fail.Exception, pytest.xfail.Exception):
        # A conftest's hook (or its target's attributes) raised or skipped: not here, outside
        # any item (pytest would call it an internal error); the first item asks again.
        return
    if not elsewhere:
        return
    runtime = runtime_of(config)
    runtime.submit(runtime.session_for(target))


def _skipped(item: Any) -> bool:
    """Whether the item carries a skip mark: a session whose items are skipped starts nothing
    (a skip decided later, in a hook, is not seen: the server then starts for nothing)."""
    return any(mark.name in ("skip", "skipif") for mark in item.iter_markers())


def _served_elsewhere(target: Any) -> bool:
    """Whether the target's server is another process (a stdio command, a URL): only then
    does opening it early overlap anything. Opening an in-process server on the loop's thread
    while this one imports the SDKs was measured slower, not faster (start to first call
    1.98 -> 2.61 s at 500 cases): the two threads trade the interpreter's lock at every one of
    the import's system calls."""
    from mcp import StdioServerParameters

    server = getattr(target, "server", None)
    return hasattr(target, "open") and isinstance(server, (str, StdioServerParameters))


def uses_own(item: Any, fixture: Any, name: str = "evalloop_target") -> bool:
    """Whether the item's fixture `name` is the plugin's own (`fixture`), not a conftest's."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.get(name) if info is not None else None
    if not defs:
        return False
    return getattr(defs[-1].func, "__wrapped__", defs[-1].func) is getattr(
        fixture, "__wrapped__", fixture
    )


def _replay_target(set_dir: Path, settings: Any) -> Any:
    from pytest_evalloop.answer.replay import ReplayTarget
    from pytest_evalloop.measure.comparison import resolve_run
    from pytest_evalloop.session.runs import runs_dir_for

    parent = runs_dir_for(set_dir, settings.runs_dir)
    try:
        source = resolve_run(settings.rejudge_from or "", set_dir=set_dir, runs_dir=parent)
    except ValueError as exc:
        raise pytest.UsageError(f"--eval-rejudge-from: {exc}") from exc
    return ReplayTarget(source)
