"""Keys for the state pytest-evalloop keeps in `config.stash` (never in module globals).

Imports nothing of the package at run time, so every layer may read the keys (the layer order
puts this module at the bottom): the settings' type is named for the annotation only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_evalloop.options import Settings

SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()
# The runtime and the tally import most of the package; typed Any here so that this module
# stays importable from anywhere without an import cycle.
RUNTIME_KEY = pytest.StashKey[Any]()
TALLY_KEY = pytest.StashKey[Any]()
SESSION_ID_KEY = pytest.StashKey[str]()
LIMITER_KEY = pytest.StashKey[Any]()  # a RunLimiter
