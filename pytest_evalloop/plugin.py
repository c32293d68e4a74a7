"""The pytest11 entry point of pytest-evalloop."""

from __future__ import annotations
