"""Keys for the state pytest-evalloop keeps in `config.stash` (never in module globals).

Imports nothing of the package at run time, so every layer may read the keys (the layer order
puts this module at the bottom): the settings' type is named for the annotation only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_evalloop.options import Settings

SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()
# The runtime and the tally import most of the package; typed Any here so that this module
# stays importable from anywhere without an import cycle.
RUNTIME_KEY = pytest.StashKey[Any]()
RUNTIME_FACTORY_KEY = pytest.StashKey[Callable[[], Any]]()
PROGRESS_KEY = pytest.StashKey[Any]()  # the process's ProgressModel, which its runtime feeds
# The runs the process writes (a WriterClaims): its runtime's, and the close's and a Ctrl-C's
# whether or not the process made a runtime (an xdist controller closes its workers' runs).
CLAIMS_KEY = pytest.StashKey[Any]()
TALLY_KEY = pytest.StashKey[Any]()
SESSION_ID_KEY = pytest.StashKey[str]()
LIMITER_KEY = pytest.StashKey[Any]()  # a RunLimiter


def runtime_of(config: pytest.Config) -> Any:
    """The process's runtime, made on first need (main thread, controller or worker).

    A session that names no set and collects no case (a project's own unit tests, run with the
    plugin installed) never makes one: the runtime's modules (the pipeline, the judge and their
    pydantic models) are most of what the plugin would otherwise import at every start.
    """
    runtime = config.stash.get(RUNTIME_KEY, None)
    if runtime is None:
        runtime = config.stash[RUNTIME_FACTORY_KEY]()
        config.stash[RUNTIME_KEY] = runtime
    return runtime
