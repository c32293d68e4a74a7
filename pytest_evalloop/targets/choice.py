"""Which target a set is answered against: the one place that tells a Malloy package from the
rest.

`--eval-target=malloy:<package dir>` or set.json `"target": {"kind": "malloy", ...}` is a
Malloy package served by the real compiler (`targets/malloy/`); anything else is what
`targets/target.py` builds (a URL, a command line, the embedded server). The plugin, the
backends and every golden route (`truth_source`: which truth connection a set has) ask here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pytest_evalloop.sets.cases import SetConfig

if TYPE_CHECKING:
    from pytest_evalloop.targets.malloy.setpackages import ServedPackage
    from pytest_evalloop.targets.target import MCPTarget


def is_malloy(target: str | None, set_config: SetConfig) -> bool:
    """Whether the set is answered against a Malloy package."""
    from pytest_evalloop.targets.malloy.package import is_malloy as malloy

    return malloy(target, set_config)


def target_pins(
    set_dir: Path, set_config: SetConfig, *, target: str | None, tool_profile: str | None
) -> dict[str, Any]:
    """run.json pins of the set's target, before it serves (see `targets.target.target_pins`)."""
    if is_malloy(target, set_config):
        from pytest_evalloop.targets.malloy.package import MalloyError, malloy_spec
        from pytest_evalloop.targets.malloy.package import target_pins as malloy_pins

        try:
            return malloy_pins(malloy_spec(set_dir, set_config, target))
        except MalloyError:
            return {"targetProfile": "publisher"}  # the usage check says why
    from pytest_evalloop.targets.target import target_pins as mcp_pins

    return mcp_pins(set_dir, set_config, target=target, tool_profile=tool_profile)


def target_problem(set_dir: Path, set_config: SetConfig, *, target: str | None) -> str | None:
    """Why the set cannot be answered (one usage error before anything is paid for), or None.

    A Malloy package (and its truth package) must compile with the real compiler; a set with
    no target at all says what to pass.
    """
    if is_malloy(target, set_config):
        from pytest_evalloop.targets.malloy.package import (
            MalloyError,
            malloy_spec,
            package_problem,
        )

        try:
            return package_problem(malloy_spec(set_dir, set_config, target))
        except MalloyError as exc:
            return str(exc)
    if target is not None:
        return None
    from pytest_evalloop.targets.target import missing_target

    return missing_target(set_dir, set_config)


def build_target(
    set_dir: Path, set_config: SetConfig, *, target: str | None, tool_profile: str | None
) -> MCPTarget:
    """The target for a set (see `targets.target.build_target`), a Malloy package included."""
    if is_malloy(target, set_config):
        from pytest_evalloop.targets.malloy.package import (
            MalloyTarget,
            malloy_spec,
            publisher_fixed_args,
        )
        from pytest_evalloop.targets.malloy.package import target_pins as malloy_pins
        from pytest_evalloop.targets.profiles import load_profile, publisher_base

        spec = malloy_spec(set_dir, set_config, target)
        if tool_profile is None or tool_profile == "publisher":
            profile = publisher_base().model_copy(update={"fixed_args": publisher_fixed_args(spec)})
        else:
            profile = load_profile(tool_profile, set_config, set_dir)
        pins = malloy_pins(spec)
        pins.pop("target", None)
        return MalloyTarget(spec, profile, pins)
    from pytest_evalloop.targets.target import build_target as mcp_target

    return mcp_target(set_dir, set_config, target=target, tool_profile=tool_profile)


class TruthError(ValueError):
    """The set names a truth connection that cannot be used (a truth package that is not
    there, does not compile or lacks its tables): the message says why and what to do."""


@dataclass(frozen=True)
class TruthSource:
    """A set's truth connection, named but not yet opened: the embedded target's raw tables,
    or a Malloy truth package behind a server of its own (the answerer never gets either)."""

    kind: Literal["embedded", "malloy"]
    set_dir: Path
    package: ServedPackage | None = None
    data_from: Path | None = None
    """A Malloy set: the answerer's package's data folder, named in a missing-table command."""

    @property
    def description(self) -> str:
        if self.package is None:
            return "the embedded target's raw tables"
        return f"the truth package {self.package.root} ({self.package.model_path})"

    def open(self) -> Truth:
        """The connection; `close()` it after use. A Malloy truth package that cannot be served
        raises TruthError (the compiler's problems, or which tables to generate)."""
        if self.package is None:
            from pytest_evalloop.targets.embedded.goldens import TruthQueries

            return TruthQueries(self.set_dir)
        from pytest_evalloop.targets.malloy.install import MalloyUnavailable
        from pytest_evalloop.targets.malloy.package import MalloyError
        from pytest_evalloop.targets.malloy.truth import PackageQueries

        try:
            return PackageQueries(self.package, sql=True, data_from=self.data_from)
        except (MalloyError, MalloyUnavailable) as exc:
            raise TruthError(str(exc)) from exc


class Truth(Protocol):
    """An open truth connection: a query's rows (SQL, or Malloy on a truth package)."""

    def rows(self, query: str) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


def truth_source(set_dir: Path, set_config: SetConfig, *, target: str | None) -> TruthSource | None:
    """The set's truth connection, or None when it has none here (`no_truth_reason` says why):
    the one place every golden route asks (the pre-run golden check, `--eval-verify-goldens`,
    `evalloop golden`).

    An embedded set's truth is its target's raw tables. Any other set's is the truth package
    set.json names (`truthPackage`, `truthModelPath`, `truthTableRewrite`), whatever answers
    it: a set.json malloy target, `--eval-target=malloy:<dir>` (its package's folder is looked
    beside too), or another server. A set answered by a local Malloy package whose truth
    package is not there raises TruthError (the package check refuses such a set anyway); a
    set answered elsewhere (a Publisher) may keep its truth package with that server: None.
    """
    if (set_config.target or {}).get("kind") == "embedded":
        return TruthSource("embedded", set_dir)
    from pytest_evalloop.targets.malloy.package import malloy_spec
    from pytest_evalloop.targets.malloy.setpackages import (
        MalloyError,
        PackageNotFound,
        truth_package,
    )

    local = is_malloy(target, set_config)
    try:
        root = malloy_spec(set_dir, set_config, target).root if local else None
        package = truth_package(set_dir, set_config, root)
    except PackageNotFound as exc:
        if local:
            raise TruthError(str(exc)) from exc
        return None
    except MalloyError as exc:
        raise TruthError(str(exc)) from exc
    if package is None:
        return None
    return TruthSource("malloy", set_dir, package, root / "data" if root is not None else None)


def no_truth_reason(set_dir: Path, set_config: SetConfig) -> str:
    """Why a set has no truth connection here (the golden check's `not run: ...`)."""
    from pytest_evalloop.targets.malloy.setpackages import MalloyError, truth_package

    try:
        truth_package(set_dir, set_config)
    except MalloyError as exc:
        return f"no truth connection here: {exc}"
    return (
        f"no truth connection ({set_dir / 'set.json'} names no truthPackage and declares no "
        "embedded target)"
    )
