"""What the fake Messages API says as the improver (`evalloop improve`).

A request whose system text carries ``IMPROVE_VERSION:`` is the improver's. Its script is a list
of TURNS, one per assistant turn of the one conversation, keyed by a substring of the request's
first user text (the prompt names the issue: ``Issue <issue_id>.``), else ``default``. A turn is
a reply text, a JSON object (rendered as a report line then the object), ``{"probe": tool,
"input": {...}}`` (a call of the target's tool) or ``{"edit": {"file", "old", "new"}}`` (a call
of ``propose_edit``; an object whose ``edit`` is text is the reply object).

The expert review (a fresh call whose user text starts ``EXPERT REVIEW.``) is answered by
``review``, one turn for every review, else with no flags.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

IMPROVE_MARKER = "IMPROVE_VERSION:"
EDIT_TOOL = "propose_edit"
REVIEW_MARKER = "EXPERT REVIEW."
NO_FLAGS = '{"flags": []}'

Turn = str | dict[str, Any]
Played = tuple[str, str | None, dict[str, Any]]


class ImproverScripts(BaseModel):
    """``by_substring``: key found in the prompt -> the turns of its conversation."""

    model_config = ConfigDict(extra="forbid")

    default: list[Turn] | None = None
    by_substring: dict[str, list[Turn]] = Field(default_factory=dict)
    review: Turn | None = None
    """What the expert review says (every review; None: no flags)."""


def play_improver(scripts: ImproverScripts, question: str, turn: int, exhausted: str) -> Played:
    """What the improver says on this turn: ("text", text, {}) or ("tool", name, input)."""
    if question.startswith(REVIEW_MARKER):
        review = scripts.review
        if review is None:
            return ("text", NO_FLAGS, {})
        return ("text", review if isinstance(review, str) else json.dumps(review), {})
    turns = next((t for k, t in scripts.by_substring.items() if k in question), scripts.default)
    if turns is None:
        return ("text", None, {})
    if turn > len(turns):
        return ("text", exhausted, {})
    step = turns[turn - 1]
    if isinstance(step, str):
        return ("text", step, {})
    if "probe" in step:
        return ("tool", str(step["probe"]), dict(step.get("input") or {}))
    if isinstance(step.get("edit"), dict):  # a reply object's "edit" is its one-line text
        return ("tool", EDIT_TOOL, dict(step["edit"]))
    body = json.dumps(step, indent=1)
    return ("text", f"COMPONENT / PRIMARY_CODE / OWNER: scripted\n\n{body}", {})
