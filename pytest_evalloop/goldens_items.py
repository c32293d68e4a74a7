"""`--eval-verify-goldens`: one item per case that re-derives its golden and fails on drift.

Each golden is re-derived on the truth connection (its canonical query and its second,
differently shaped derivation) and through the case's `modelQuery` on the answerer-facing query
tool — the proof that the model can answer it. Offline: no model endpoint is involved.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_evalloop.failures import EvalFailure
from pytest_evalloop.sets import cases as sets
from pytest_evalloop.stash import RUNTIME_KEY, SETTINGS_KEY


class GoldenItem(pytest.Item):
    """Re-derives one case's golden by every route it records."""

    def __init__(self, *, case: sets.Case, lineno: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.lineno = lineno
        self.add_marker(pytest.mark.evalloop)
        self.extra_keyword_matches.update([case.split, *case.tags])

    def runtest(self) -> None:
        from pytest_evalloop.targets.choice import has_truth
        from pytest_evalloop.targets.embedded.goldens import verify_case

        set_dir = self.path.parent
        config = sets.load_set_config(set_dir)
        malloy = has_truth(set_dir, config)
        if (config.target or {}).get("kind") != "embedded" and not malloy:
            pytest.skip(
                "no truth connection for this set (an embedded target, or a malloy target with "
                "a truthPackage, carries one): nothing to re-derive against"
            )
        truth = self._malloy_truth(config) if malloy else None
        drifts = verify_case(
            self.case.raw(), set_dir, model_query_runner=self._runner(config), truth=truth
        )
        if drifts:
            drifted = any(d.problem != "unproven" for d in drifts)
            head = "golden drifted for" if drifted else "golden not proven two ways for"
            lines = [f"{head} {self.case.qid}:"]
            for drift in drifts:
                lines.append(f"  route {drift.route}: {drift.message}")
                lines.append(f"    stored:     {drift.stored!r}")
                lines.append(f"    re-derived: {drift.derived!r}")
            raise EvalFailure("\n".join(lines), "drift")

    def _malloy_truth(self, config: sets.SetConfig) -> Any:
        """The set's truth package server, one per set and process, stopped at the end."""
        from pytest_evalloop.targets.choice import malloy_truth

        truths: dict[Any, Any] = self.config.stash.setdefault(_TRUTHS, {})
        set_dir = self.path.parent
        if set_dir not in truths:
            truth = truths[set_dir] = malloy_truth(set_dir, config)
            self.config.add_cleanup(truth.close)
        return truths[set_dir]

    def _runner(self, config: sets.SetConfig) -> Any:
        from pytest_evalloop.answer.backends import default_target

        runtime = self.config.stash[RUNTIME_KEY]
        settings = self.config.stash[SETTINGS_KEY]
        set_dir = self.path.parent
        targets: dict[Any, Any] = self.config.stash.setdefault(_TARGETS, {})
        if set_dir not in targets:
            targets[set_dir] = default_target(set_dir, config, settings)
        target = targets[set_dir]

        def run(sql: str) -> list[dict[str, Any]]:
            async def go() -> Any:
                session = await runtime.session_for(target)
                return await session.execute(sql)

            outcome = runtime.call(go())
            if outcome.error:
                raise ValueError(f"the answerer-facing query tool refused it: {outcome.error}")
            rows: list[dict[str, Any]] = outcome.rows
            return rows

        return run

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, EvalFailure):
            return excinfo.value.report
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, self.lineno - 1, f"golden of {self.case.qid}"


_TARGETS = pytest.StashKey[dict[Any, Any]]()
_TRUTHS = pytest.StashKey[dict[Any, Any]]()
