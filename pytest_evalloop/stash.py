"""Keys for the state pytest-evalloop keeps in `config.stash` (never in module globals)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_evalloop.options import Settings
    from pytest_evalloop.runtime import Runtime
    from pytest_evalloop.summary import SessionTally

SETTINGS_KEY = pytest.StashKey["Settings"]()
RUNTIME_KEY = pytest.StashKey["Runtime"]()
TALLY_KEY = pytest.StashKey["SessionTally"]()
SESSION_ID_KEY = pytest.StashKey[str]()
