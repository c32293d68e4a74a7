"""Shared fixtures of pytest-evalloop's own suite."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MALLOY_SET = SHARED / "reference" / "malloy-samples" / "evals" / "ecommerce"
EXAMPLE_SET = REPO / "evals" / "ecommerce"


@pytest.fixture(params=[[], ["-n", "0"], ["-n", "2"]], ids=["plain", "n0", "n2"])
def plugin_args(request: pytest.FixtureRequest) -> list[str]:
    """Run an end-to-end test plain, under `-n 0` and under `-n 2`."""
    return list(request.param)


@pytest.fixture
def malloy_set(tmp_path: Path) -> Path:
    """A private copy of the real malloy-samples eval set (49 cases), safe to corrupt."""
    if not MALLOY_SET.is_dir():
        pytest.fail(f"the reference set is missing at {MALLOY_SET}; shared/ must sit beside the repo")
    target = tmp_path / "evals" / "ecommerce"
    shutil.copytree(MALLOY_SET, target)
    return target
