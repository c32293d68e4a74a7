"""What the side door re-derives a golden on: the set's truth connection and its model's route.

`promote`, `attest` and `repair` ask the same question a run's golden check asks (does the truth
data still produce this golden?) on the same connection: `targets.choice.truth_source`, the
embedded target's raw tables or the truth package set.json names (`truthPackage`,
`truthModelPath`, `truthTableRewrite`), looked for beside the answerer's package when
`--eval-target=malloy:<dir>` names one. A `Rederivation` opens it once per command, so
`attest --all-provisional` starts one truth server for every golden, not one per golden.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop.goldens.change import GoldenRefused, GoldenUsageError
from pytest_evalloop.sets import cases as sets

if TYPE_CHECKING:
    from pytest_evalloop.targets.choice import Truth, TruthSource
    from pytest_evalloop.targets.embedded.goldens import Derivation, ModelQueryRunner


class Rederivation:
    """A set's truth connection (opened on first use) and its model route, for one command."""

    def __init__(self, set_dir: Path, config: sets.SetConfig, *, target: str | None = None):
        from pytest_evalloop.targets.choice import TruthError, truth_source

        self.set_dir = Path(set_dir)
        self.config = config
        self.target = target
        try:
            self.source: TruthSource | None = truth_source(self.set_dir, config, target=target)
        except TruthError as exc:
            raise GoldenUsageError(
                f"{exc}; the truth connection must be found to re-derive"
            ) from exc
        self._truth: Truth | None = None
        self._model: Any = None

    @property
    def has_truth(self) -> bool:
        return self.source is not None

    def truth(self) -> Truth:
        """The open truth connection; one that cannot be served refuses the change, saying why
        ("could not verify": a missing table, a package that does not compile)."""
        from pytest_evalloop.targets.choice import TruthError

        assert self.source is not None, "ask has_truth first"
        if self._truth is None:
            try:
                self._truth = self.source.open()
            except TruthError as exc:
                raise GoldenRefused(
                    f"could not verify on {self.source.description}: {exc}"
                ) from exc
        return self._truth

    def derive(self, row: dict[str, Any], runner: ModelQueryRunner | None = None) -> Derivation:
        """Every route of the row's golden on the truth connection (and `runner`'s model)."""
        from pytest_evalloop.targets.embedded.goldens import derive_golden

        return derive_golden(row, self.set_dir, model_query_runner=runner, truth=self.truth())

    def drift_messages(self, row: dict[str, Any], runner: ModelQueryRunner | None) -> list[str]:
        """One line per route that does not reproduce the golden ([] when it holds)."""
        return [f"route {d.route}: {d.message}" for d in self.derive(row, runner).drifts]

    def model_runner(self, row: dict[str, Any]) -> ModelQueryRunner | None:
        """The answerer-facing query path of the set's own model, when the case has a
        modelQuery: the embedded sandbox, or the Malloy package in restricted mode."""
        if not row.get("modelQuery"):
            return None
        target = self.config.target or {}
        if target.get("kind") == "embedded" and target.get("model"):
            return self._embedded_runner(str(target["model"]))
        from pytest_evalloop.targets.choice import is_malloy

        if is_malloy(self.target, self.config):
            return self._malloy_runner()
        return None

    def _embedded_runner(self, model_file: str) -> ModelQueryRunner:
        from pytest_evalloop.targets.embedded.goldens import data_dir_for
        from pytest_evalloop.targets.embedded.model import SemanticModel
        from pytest_evalloop.targets.embedded.sandbox import Sandbox

        sandbox = Sandbox(SemanticModel.load(self.set_dir / model_file), data_dir_for(self.set_dir))

        def run(sql: str) -> list[dict[str, Any]]:
            return sandbox.execute(sql).rows

        return run

    def _malloy_runner(self) -> ModelQueryRunner:
        from pytest_evalloop.targets.malloy.package import MalloyError, malloy_spec
        from pytest_evalloop.targets.malloy.truth import PackageQueries

        if self._model is None:
            try:
                self._model = PackageQueries(
                    malloy_spec(self.set_dir, self.config, self.target).package
                )
            except MalloyError as exc:
                raise GoldenRefused(f"could not verify by the model's route: {exc}") from exc
        rows: ModelQueryRunner = self._model.rows
        return rows

    def close(self) -> None:
        """Stop what was started (the truth package's server, the model's)."""
        for opened in (self._truth, self._model):
            if opened is not None:
                opened.close()
        self._truth = self._model = None
