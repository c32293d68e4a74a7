"""Contamination check over the host-side tool log of one answerer attempt (seed 001).

An attempt is contaminated when its log shows any of:

1. any tool (file tool, shell, or MCP query text) referencing a protected path: the set's
   ``evals/`` tree or a gold artifact;
2. a non-MCP (file or shell) tool referencing the model file under test; the model path as an
   argument of an MCP call is not contamination, because the server resolves it and the
   answerer never reads the file;
3. more tool calls reported by the answerer than the host logged (every tool, MCP included).

With no host log the answer is ``"unknown"``, never a clean pass.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel

# Characters that continue a path component or identifier. A needle only matches where it is
# not glued to one of these, so `status` in SQL never matches a protected `set.json`, and
# `evals/shop` never matches inside `evals/shop2`.
_WORDISH = r"A-Za-z0-9_\-"
# A bare file name is only a needle when it is distinctive enough not to occur in ordinary
# SQL or prose: it must have an extension and some length.
_MIN_NAME_LEN = 6


class ToolUse(BaseModel):
    """One row of the host-side tool log: which tool, with what input, MCP or not."""

    tool: str
    input: dict[str, Any]
    is_mcp: bool


class ContaminationResult(BaseModel):
    """The check's finding; ``contaminated`` is ``"unknown"`` when there was no host log."""

    contaminated: bool | Literal["unknown"]
    reasons: list[str]


class _Needle(NamedTuple):
    text: str  # normalised, lower-cased
    path: str  # the protected or model path it stands for, for the reason


def _normalise(text: str) -> str:
    text = text.replace("\\", "/").lower()
    text = re.sub(r"/+", "/", text)
    while "/./" in text:
        text = text.replace("/./", "/")
    return text


def _distinctive_name(name: str) -> bool:
    return "." in name.strip(".") and len(name) >= _MIN_NAME_LEN


def _path_forms(path: Path) -> set[str]:
    """Every way a tool input is likely to spell ``path``: absolute, and tails of 2+ parts."""
    forms: set[str] = set()
    for variant in {path.absolute(), path.resolve()}:
        forms.add(str(variant))
        parts = variant.parts[1:]  # drop the root
        for start in range(len(parts) - 1):
            forms.add("/".join(parts[start:]))
    if _distinctive_name(path.name):
        forms.add(path.name)
    return forms


def _needles(
    paths: list[Path], model_paths: list[Path]
) -> tuple[tuple[_Needle, ...], tuple[_Needle, ...]]:
    """The protected and model needles, built once per distinct state of the paths.

    Every attempt of a run checks the same paths, and building the needles means resolving
    paths and listing directories. A directory's mtime changes whenever an entry is added or
    removed, so keying on it keeps the cached bare-name needles as true as a fresh listing.
    """
    return _cached_needles(
        tuple(paths), tuple(model_paths), tuple(_listing_stamp(p) for p in paths)
    )


def _listing_stamp(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns if path.is_dir() else None
    except OSError:
        return None


@functools.lru_cache(maxsize=64)
def _cached_needles(
    paths: tuple[Path, ...], model_paths: tuple[Path, ...], stamps: tuple[int | None, ...]
) -> tuple[tuple[_Needle, ...], tuple[_Needle, ...]]:
    del stamps  # part of the cache key only
    return (
        tuple(_protected_needles(list(paths), list(model_paths))),
        tuple(_model_needles(list(model_paths))),
    )


def _protected_needles(paths: list[Path], model_paths: list[Path]) -> list[_Needle]:
    models = {p.resolve() for p in model_paths}
    needles: list[_Needle] = []
    for path in paths:
        forms = _path_forms(path)
        if path.is_dir():
            # Files directly in the set directory (cases.jsonl, set.json...) can be reached by a
            # bare name from a shell whose working directory is the set itself. A model file
            # served from the set is left to the model rule, so naming it to MCP stays legal.
            forms |= {
                child.name
                for child in path.iterdir()
                if child.is_file()
                and _distinctive_name(child.name)
                and child.resolve() not in models
            }
        needles += [_Needle(text=_normalise(f), path=str(path)) for f in forms]
    return needles


def _model_needles(paths: list[Path]) -> list[_Needle]:
    return [_Needle(text=_normalise(f), path=str(p)) for p in paths for f in _path_forms(p)]


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a tool input, recursively (dict values, list items)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _matches(needle: str, haystack: str) -> bool:
    if needle not in haystack:
        return False  # the common case, and a plain substring test is far cheaper than a regex
    pattern = rf"(?<![{_WORDISH}.$]){re.escape(needle)}(?![{_WORDISH}])"
    return re.search(pattern, haystack) is not None


def _first_hit(needles: tuple[_Needle, ...], haystack: str) -> _Needle | None:
    return next((n for n in needles if _matches(n.text, haystack)), None)


def _mcp_model_arg(use: ToolUse, keys: frozenset[str], model: tuple[_Needle, ...]) -> set[str]:
    """Top-level MCP argument keys whose value names the model under test: exempt."""
    if not use.is_mcp:
        return set()
    return {
        key
        for key, value in use.input.items()
        if key in keys and isinstance(value, str) and _first_hit(model, _normalise(value))
    }


def _use_reasons(
    use: ToolUse,
    protected: tuple[_Needle, ...],
    model: tuple[_Needle, ...],
    model_keys: frozenset[str],
) -> list[str]:
    exempt = _mcp_model_arg(use, model_keys, model)
    values = {k: v for k, v in use.input.items() if k not in exempt}
    haystack = "\n".join(_normalise(s) for s in _strings(values))
    reasons: list[str] = []
    for path in dict.fromkeys(n.path for n in protected if _matches(n.text, haystack)):
        reasons.append(f"{use.tool} touched protected path {path}")
    if not use.is_mcp:
        hit = _first_hit(model, haystack)
        if hit is not None:
            reasons.append(f"{use.tool} (a file tool) touched the model under test {hit.path}")
    return reasons


def check_contamination(
    log: list[ToolUse] | None,
    *,
    reported_calls: int | None,
    protected_paths: list[Path],
    model_paths: list[Path],
    mcp_model_arg_keys: frozenset[str] = frozenset({"modelPath"}),
) -> ContaminationResult:
    """Check one attempt's host-side tool log; reasons name the tool and the path."""
    if log is None:
        return ContaminationResult(
            contaminated="unknown",
            reasons=["no host-side tool log: the attempt cannot be shown clean"],
        )
    protected, model = _needles(protected_paths, model_paths)
    reasons: list[str] = []
    for use in log:
        reasons += _use_reasons(use, protected, model, mcp_model_arg_keys)
    if reported_calls is not None and reported_calls > len(log):
        reasons.append(
            f"answerer reported {reported_calls} tool calls but the host logged only {len(log)}"
        )
    return ContaminationResult(contaminated=bool(reasons), reasons=reasons)
