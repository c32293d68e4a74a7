"""What the fake Messages API says as the diagnose agent and the clustering call.

A request whose system text carries ``DIAGNOSE_VERSION:`` is the diagnoser's; with
``DIAGNOSE_STEP: clustering`` it is the clustering call. Scripts are keyed by a substring of
the request's first user text (a case's prompt names its qid: ``Case <qid>.``), else
``default``. A case script is a list of CONVERSATIONS, one per fresh conversation the
conductor starts; a conversation is a list of TURNS, one per assistant turn (a refused reply is
answered in the same conversation, so a retry is the next turn). A turn is a reply text, a
JSON object (rendered as prose then the object), or ``{"probe": tool, "input": {...}}``.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

DIAGNOSE_MARKER = "DIAGNOSE_VERSION:"
CLUSTERING_MARKER = "DIAGNOSE_STEP: clustering"

Role = Literal["answerer", "judge", "diagnoser", "improver"]
Turn = str | dict[str, Any]


def role_of(system: str, judge_marker: str) -> Role:
    """Whose request it is, from its system text: the judge's, the improver's, the diagnoser's,
    else the answerer's."""
    if judge_marker in system:
        return "judge"
    if "IMPROVE_VERSION:" in system:
        return "improver"
    return "diagnoser" if DIAGNOSE_MARKER in system else "answerer"


Played = tuple[str, str | None, dict[str, Any]]
"""What a turn says: ("text", text, {}) or ("tool", name, input); text None: no script."""


class DiagnoserScripts(BaseModel):
    """``by_substring``: key found in the case prompt -> the turns of its conversation (every
    conversation of that case plays the same turns); ``cluster``: the clustering call's replies,
    one per call (the last repeats)."""

    model_config = ConfigDict(extra="forbid")

    default: list[Turn] | None = None
    by_substring: dict[str, list[Turn]] = Field(default_factory=dict)
    cluster: list[Turn] = Field(default_factory=list)


def render_turn(turn: Turn) -> Played:
    """One scripted turn as what the reply says."""
    if isinstance(turn, str):
        return ("text", turn, {})
    if "probe" in turn:
        return ("tool", str(turn["probe"]), dict(turn.get("input") or {}))
    body = json.dumps(turn, indent=1)
    return ("text", f"I walked the ladder rung by rung.\n\n```json\n{body}\n```", {})


class DiagnoserPlayer:
    """Plays `DiagnoserScripts` (the policy turns what it says into a reply), keeping the
    clustering call's position. `exhausted` is said past the last scripted turn."""

    def __init__(self, scripts: DiagnoserScripts, exhausted: str) -> None:
        self.scripts = scripts
        self.exhausted = exhausted
        self._lock = threading.Lock()
        self._clusters = 0

    def play(self, system: str, question: str, turn: int) -> Played:
        if CLUSTERING_MARKER in system:
            with self._lock:
                position, self._clusters = self._clusters, self._clusters + 1
            script = self.scripts.cluster
            if not script:
                return ("text", None, {})
            return render_turn(script[min(position, len(script) - 1)])
        turns = next(
            (t for key, t in self.scripts.by_substring.items() if key in question),
            self.scripts.default,
        )
        if turns is None:
            return ("text", None, {})
        if turn > len(turns):
            return ("text", self.exhausted, {})
        return render_turn(turns[turn - 1])
