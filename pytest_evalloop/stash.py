"""Keys for the state pytest-evalloop keeps in `config.stash` (never in module globals)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_evalloop.options import Settings

SETTINGS_KEY = pytest.StashKey[Settings]()
# The runtime and the tally import most of the package; typed Any here so that this module
# stays importable from anywhere without an import cycle.
RUNTIME_KEY = pytest.StashKey[Any]()
TALLY_KEY = pytest.StashKey[Any]()
SESSION_ID_KEY = pytest.StashKey[str]()
LIMITER_KEY = pytest.StashKey[Any]()  # a RunLimiter
