"""Tool profiles: which of a target's MCP tools is the context tool and which the query tool.

A profile tells the harness how to read a target it did not write: the tool names, the name of
the argument that carries the query, where rows and the truncation flags sit in the payload,
and the arguments the conductor adds when it re-executes a query. Two profiles are built in:

- ``embedded``: our own server (``get_context`` / ``execute_query(sql)``, JSON in a text block);
- ``publisher``: Malloy Publisher (``malloy_getContext`` / ``malloy_executeQuery``, camelCase
  arguments, JSON inside an embedded resource, ``_limit_hit`` / ``_rows_truncated``).

Anything else is a JSON file validated by :class:`ToolProfile`, or a ``toolProfile`` mapping in
``set.json``. See docs/publisher.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pytest_evalloop.sets.cases import SetConfig

BUILTIN_PROFILES = ("embedded", "publisher")
PUBLISHER_DEFAULT_ENVIRONMENT = "local"
"""Publisher's README names its example environment `local`; a set may say otherwise."""


class NamedQuery(BaseModel):
    """How a query-tool call that names a stored query (instead of sending text) reads as text."""

    model_config = ConfigDict(extra="forbid")

    name_arg: str
    source_arg: str
    template: str = Field(description="uses {name} and {source}")


class ToolProfile(BaseModel):
    """How to drive one kind of MCP target."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    context_tool: str = Field(min_length=1)
    query_tool: str = Field(min_length=1)
    context_query_arg: str = "query"
    """The context tool's argument holding the search terms (recorded as `targets`)."""
    query_arg: str = Field(min_length=1)
    """The query tool's argument holding the query text (what re-execution replays)."""
    fixed_args: dict[str, Any] = Field(default_factory=dict)
    """Added to every query the conductor re-executes (and to hidden arguments, below)."""
    hidden_args: list[str] = Field(default_factory=list)
    """Arguments removed from the schemas the answerer sees and filled from `fixed_args` on
    every call: pins the answerer to one package. The built-in publisher profile hides none,
    because Publisher's own schemas require them and its context tool teaches their values."""
    named_query: NamedQuery | None = None
    results_key: str = "results"
    rows_key: str = "rows"
    columns_key: str = "columns"
    payload: Literal["text_json", "resource_json"] = "text_json"
    truncation_keys: list[str] = Field(default_factory=list)
    client_mode: Literal["auto", "legacy"] = "auto"
    """`legacy` skips mcp 2.x's discovery probe, which older (TypeScript 1.x) servers reject."""

    @model_validator(mode="after")
    def _hidden_args_are_fixed(self) -> ToolProfile:
        missing = [arg for arg in self.hidden_args if arg not in self.fixed_args]
        if missing:
            raise ValueError(
                f"hidden_args {missing} have no value in fixed_args; add them to fixed_args "
                "(the harness fills hidden arguments from there)"
            )
        return self


EMBEDDED = ToolProfile(
    name="embedded",
    context_tool="get_context",
    query_tool="execute_query",
    query_arg="sql",
    payload="text_json",
    truncation_keys=["rowCapHit", "byteCapHit"],
)

_PUBLISHER_BASE = ToolProfile(
    name="publisher",
    context_tool="malloy_getContext",
    query_tool="malloy_executeQuery",
    query_arg="query",
    named_query=NamedQuery(
        name_arg="queryName", source_arg="sourceName", template="run: {source} -> {name}"
    ),
    payload="resource_json",
    truncation_keys=["_limit_hit", "_rows_truncated"],
    client_mode="legacy",
)


def publisher_base() -> ToolProfile:
    """The publisher profile without fixed arguments (a caller that knows the package adds them)."""
    return _PUBLISHER_BASE


class ProfileError(ValueError):
    """A tool profile that cannot be used; the message names the file or key and the fix."""


def load_profile(spec: str | None, set_config: SetConfig, set_dir: Path) -> ToolProfile:
    """The tool profile for `--eval-tool-profile=<spec>` on the set in `set_dir`.

    `spec` is None (then set.json's `toolProfile`, else `embedded`), a built-in name, or the
    path of a JSON profile file (relative to the working directory, else to the set).
    """
    if spec is None:
        spec_from_set = (set_config.model_extra or {}).get("toolProfile")
        if isinstance(spec_from_set, dict):
            return _validate(spec_from_set, f"{set_dir / 'set.json'}: toolProfile", "set")
        spec = spec_from_set if isinstance(spec_from_set, str) else "embedded"
    if spec == "embedded":
        return EMBEDDED
    if spec == "publisher":
        return publisher_profile(set_config, set_dir)
    return _profile_file(spec, set_dir)


def publisher_profile(set_config: SetConfig, set_dir: Path) -> ToolProfile:
    """The publisher profile, its fixed arguments read from set.json.

    Reads the `publisher` block (`environmentName`, `packageName`, `modelPath`), falling back
    to the `targetPackage` / `targetModelPath` keys real malloy-samples sets carry, and to the
    environment `local`.
    """
    block = dict(set_config.publisher or {})
    extra = set_config.model_extra or {}
    fixed = {
        "environmentName": block.get("environmentName", PUBLISHER_DEFAULT_ENVIRONMENT),
        "packageName": block.get("packageName", extra.get("targetPackage")),
        "modelPath": block.get("modelPath", extra.get("targetModelPath")),
    }
    missing = [key for key, value in fixed.items() if not value]
    if missing:
        raise ProfileError(
            f"{set_dir / 'set.json'}: the publisher profile needs {', '.join(missing)}; add "
            '"publisher": {"environmentName": "local", "packageName": "<package>", '
            '"modelPath": "<file>.malloy"} to set.json'
        )
    return _PUBLISHER_BASE.model_copy(update={"fixed_args": fixed})


def _profile_file(spec: str, set_dir: Path) -> ToolProfile:
    candidates = [Path(spec), set_dir / spec]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise ProfileError(
            f"tool profile {spec!r}: not a built-in ({', '.join(BUILTIN_PROFILES)}) and no such "
            f"file (looked for {candidates[0].resolve()} and {candidates[1]}); pass a built-in "
            "name or the path of a JSON profile"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}:{exc.lineno}: invalid JSON in tool profile: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a tool profile is a JSON object, got {type(data).__name__}")
    return _validate(data, str(path), path.stem)


def _validate(data: dict[str, Any], where: str, default_name: str) -> ToolProfile:
    try:
        return ToolProfile.model_validate({"name": default_name, **data})
    except ValidationError as exc:
        problems = "; ".join(
            f"field {'.'.join(str(p) for p in err['loc']) or '(profile)'!r}: {err['msg']}"
            for err in exc.errors()
        )
        raise ProfileError(
            f"{where}: invalid tool profile: {problems}; see docs/publisher.md for the fields"
        ) from exc
