"""Templating a script with a case's fields: ``{name}`` placeholders filled from the case."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)\}")


def template_values(question: str, case: Mapping[str, Any] | None) -> dict[str, Any]:
    """``question``, the case's top-level fields, and its golden fields as ``golden.<name>``
    (and bare ``<name>`` when no top-level field has that name)."""
    values: dict[str, Any] = {}
    golden = case.get("golden") if case else None
    if isinstance(golden, dict):
        values.update(golden)
        values.update({f"golden.{k}": v for k, v in golden.items()})
    values.update(case or {})
    values["question"] = question
    return values


def fill(value: Any, values: Mapping[str, Any]) -> Any:
    """Template every string inside ``value``, in one pass. A string that is exactly one known
    placeholder takes the field's JSON value (a number stays a number); inside longer text a
    non-string field is written as JSON. Unknown placeholders stay as written."""
    if isinstance(value, str):
        whole = _PLACEHOLDER.fullmatch(value)
        if whole and whole.group(1) in values:
            return values[whole.group(1)]
        return _PLACEHOLDER.sub(lambda m: _as_text(values, m), value)
    if isinstance(value, list):
        return [fill(v, values) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, values) for k, v in value.items()}
    return value


def _as_text(values: Mapping[str, Any], match: re.Match[str]) -> str:
    if match.group(1) not in values:
        return match.group(0)
    found = values[match.group(1)]
    return found if isinstance(found, str) else json.dumps(found)


def fill_text(text: str, values: Mapping[str, Any]) -> str:
    """Template a string and keep it a string."""
    return _PLACEHOLDER.sub(lambda m: _as_text(values, m), text)
