"""Which target a set is answered against: the one place that tells a Malloy package from the
rest.

`--eval-target=malloy:<package dir>` or set.json `"target": {"kind": "malloy", ...}` is a
Malloy package served by the real compiler (`targets/malloy/`); anything else is what
`targets/target.py` builds (a URL, a command line, the embedded server). The plugin, the
backends and the golden check ask here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_evalloop.sets.cases import SetConfig

if TYPE_CHECKING:
    from pytest_evalloop.targets.malloy.truth import MalloyTruth
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


def has_truth(set_dir: Path, set_config: SetConfig) -> bool:
    """Whether the set names a Malloy truth package to derive its goldens on."""
    if (set_config.target or {}).get("kind") != "malloy":
        return False
    from pytest_evalloop.targets.malloy.package import MalloyError, malloy_spec

    try:
        return malloy_spec(set_dir, set_config, None).truth_root is not None
    except MalloyError:
        return False


def malloy_truth(set_dir: Path, set_config: SetConfig) -> MalloyTruth:
    """The set's truth package behind its own server (the answerer never gets this one)."""
    from pytest_evalloop.targets.malloy.package import malloy_spec
    from pytest_evalloop.targets.malloy.truth import MalloyTruth

    return MalloyTruth(malloy_spec(set_dir, set_config, None))
