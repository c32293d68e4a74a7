"""Hooks users and plugins may implement to extend pytest-evalloop.

Register nothing: pytest finds `pytest_evalloop_*` functions in any conftest or plugin, and
checks them against these specs (a misspelt hook is an error, not silence).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

hookspec = pytest.hookspec


@hookspec(firstresult=True)
def pytest_evalloop_make_answerer(config: pytest.Config, backend: str) -> Any | None:
    """Build the answerer for `--eval-answerer=<backend>`, or return None to decline.

    Called in the process that runs items (a worker under xdist) when the default
    `evalloop_answerer` fixture is first used. Return an object with `backend`, `model` and
    `async answer(question, session) -> AnswerRecord` (see :mod:`pytest_evalloop.roles.contract`).

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def pytest_evalloop_make_judge(config: pytest.Config) -> Any | None:
    """Build the judge, or return None for the default Anthropic judge.

    Called where items run (a worker under xdist). Return an object with `model`, `version`,
    `rubric_sha` and `async judge(materials) -> JudgeOutcome`.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def pytest_evalloop_make_target(
    config: pytest.Config, set_dir: Path, set_config: Any
) -> Any | None:
    """Build the target a set is answered against, or return None for the default.

    Called where items run, once per set and process. Return an object with `name`,
    `async open() -> TargetSession` and `async close()`.

    .. versionadded:: 0.1
    """


@hookspec
def pytest_evalloop_item_result(item: pytest.Item, result: Any) -> None:
    """Called after an item's attempt ended, with its :class:`ItemResult`.

    Called in the process that ran the item (a worker under xdist), before pytest reports it.

    .. versionadded:: 0.1
    """


@hookspec
def pytest_evalloop_run_finished(config: pytest.Config, run_dir: Path, results: list[Any]) -> None:
    """Called once per run after its `run.json` was closed, with the run's item results.

    Called on the controller, before the terminal summary is printed.

    .. versionadded:: 0.1
    """
