"""Bring your own target: answer a set against a Malloy Publisher whose URL is in the environment.

Copy this file as the `conftest.py` at (or above) your set and run

    PUBLISHER_MCP_URL=http://127.0.0.1:4040/mcp pytest evals/myset

The `pytest_evalloop_make_target(config, set_dir, set_config)` hook is asked once per set and
process (an xdist worker, or the only process) before the default target is built. Returning
None declines, and the plugin builds its default: `--eval-target` if given, else the set's
embedded server. Here the hook declines when `--eval-target` is on the command line (so the
command line still wins) or when `PUBLISHER_MCP_URL` is unset.

A target is any object with `name` (recorded as `target` in `run.json`), `async open()` returning
a session and `async close()` (see `pytest_evalloop/roles/contract.py`, the `Target` protocol).
`MCPTarget` (`pytest_evalloop/targets/target.py`) is the one the plugin uses: any MCP server (an
`http(s)` URL, a `StdioServerParameters`, or an in-process `MCPServer`) read through a tool
profile. The publisher profile takes `environmentName`, `packageName` and `modelPath` from the
set's `publisher` block in set.json (else `targetPackage` / `targetModelPath`); see
docs/publisher.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

URL_VARIABLE = "PUBLISHER_MCP_URL"


def pytest_evalloop_make_target(config: pytest.Config, set_dir: Path, set_config: Any) -> Any:
    """A Publisher target for the set when `PUBLISHER_MCP_URL` is set, else None (worker)."""
    url = os.environ.get(URL_VARIABLE)
    if not url or config.getoption("eval_target"):
        return None
    from pytest_evalloop.targets.profiles import publisher_profile
    from pytest_evalloop.targets.target import MCPTarget

    # A profile error (no package or model path known) names the set.json keys to add.
    return MCPTarget(url, publisher_profile(set_config, set_dir), name=f"publisher:{url}")
