"""Policies: what the fake Messages API answers to each request.

A policy is any callable taking a :class:`ParsedRequest` and returning a :class:`Reply` or a
:class:`Fault`. :class:`ScriptSpec` is the declarative, JSON-serialisable kind: it can be written
to a file and handed to the fake running as a separate process.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["answerer", "judge"]

#: A request whose system text contains this string is the judge's; any other is the answerer's.
JUDGE_MARKER = "JUDGE_VERSION:"
#: ``declare_final`` steps become a call of this tool, when the request offers it.
FINAL_QUERY_TOOL = "submit_final_query"

FaultKind = Literal["status", "malformed", "hang", "disconnect"]


# --- what a policy sees -----------------------------------------------------------------------


@dataclass(frozen=True)
class ToolExchange:
    """One ``tool_use`` block of an earlier assistant turn and the ``tool_result`` answering it."""

    tool_use_id: str
    name: str
    input: dict[str, Any]
    result: str | None
    is_error: bool = False


@dataclass(frozen=True)
class ParsedRequest:
    """A validated ``POST /v1/messages`` request, reduced to what a policy decides on."""

    role: Role
    model: str
    system: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    question: str
    exchanges: list[ToolExchange]
    turn: int
    headers: dict[str, str]
    call_index: int
    max_tokens: int
    stream: bool = False
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def tool_names(self) -> list[str]:
        """Names of the tools the request offers, in order."""
        return [str(t.get("name", "")) for t in self.tools]

    def offers(self, tool: str) -> bool:
        """Whether the request offers a tool of that name."""
        return tool in self.tool_names

    @property
    def user_text(self) -> str:
        """All text of all user turns (not tool results), joined by blank lines."""
        return "\n\n".join(
            text for m in self.messages if m.get("role") == "user" for text in texts_of(m)
        )


def texts_of(message: Mapping[str, Any]) -> list[str]:
    """The text blocks of one message, whether its content is a string or a block list."""
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [
        str(b.get("text", ""))
        for b in content
        if isinstance(b, dict) and b.get("type") == "text"
    ]


# --- what a policy returns --------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """A text content block of a reply."""

    text: str


@dataclass(frozen=True)
class ToolUse:
    """A ``tool_use`` content block of a reply; the fake assigns its id."""

    name: str
    input: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """A successful reply. ``stop_reason`` defaults to ``tool_use`` when any block calls a
    tool and ``end_turn`` otherwise; ``latency`` seconds pass before the first byte."""

    content: list[Text | ToolUse]
    stop_reason: str | None = None
    latency: float = 0.0

    @classmethod
    def text(cls, text: str, *, latency: float = 0.0) -> Reply:
        """A reply of one text block that ends the turn."""
        return cls([Text(text)], latency=latency)

    @classmethod
    def tools(cls, *calls: ToolUse, text: str | None = None, latency: float = 0.0) -> Reply:
        """A tool-use turn, optionally preceded by a text block."""
        blocks: list[Text | ToolUse] = [Text(text)] if text else []
        return cls([*blocks, *calls], latency=latency)


@dataclass(frozen=True)
class Fault:
    """A failure instead of a reply.

    ``status``: an HTTP error with the API's error body and ``retry-after`` /
    ``retry-after-ms`` headers when given. ``malformed``: status 200 with a body that is not
    JSON. ``hang``: no answer for ``hang_seconds`` (then the connection closes).
    ``disconnect``: the connection closes without any answer.
    """

    kind: FaultKind = "status"
    status: int = 529
    retry_after: float | None = None
    retry_after_ms: float | None = None
    message: str | None = None
    error_type: str | None = None
    hang_seconds: float = 30.0
    latency: float = 0.0


Policy = Callable[[ParsedRequest], "Reply | Fault"]


# --- the declarative script -------------------------------------------------------------------


class _Strict(BaseModel):
    # A typo in a policy file must fail loudly rather than silently script nothing.
    model_config = ConfigDict(extra="forbid")


class ToolStep(_Strict):
    """Call ``tool`` with ``input``; strings in ``input`` are templated."""

    tool: str
    input: dict[str, Any] = Field(default_factory=dict)
    turn: int | None = None


class FinalStep(_Strict):
    """Declare the final query through ``submit_final_query`` (only if the request offers it)."""

    declare_final: str
    turn: int | None = None


class TextStep(_Strict):
    """Reply with text; on its own turn it ends the conversation."""

    text: str
    turn: int | None = None


AnswerStep = ToolStep | FinalStep | TextStep
AnswererScript = list[AnswerStep | list[AnswerStep]]


class JudgeVerdict(_Strict):
    """A judge verdict, rendered as prose followed by the object in a ```json fence."""

    verdict: str
    confidence: int = 9
    why: str = "The re-executed rows contain the golden value."
    column_pairing: dict[str, str] = Field(default_factory=dict)
    gold_status: str = "verified"
    gold_note: str | None = None
    prose: str = "I compared the re-executed rows with the golden answer."


class RawReply(_Strict):
    """A judge reply of exactly this text (for malformed-judge tests)."""

    raw: str


JudgeReply = JudgeVerdict | RawReply | str
JudgeScript = JudgeReply | list[JudgeReply]


class AnswererScripts(_Strict):
    """Answerer scripts: by exact question, by substring of the question, else ``default``."""

    default: AnswererScript | None = None
    by_question: dict[str, AnswererScript] = Field(default_factory=dict)
    by_substring: dict[str, AnswererScript] = Field(default_factory=dict)
    latency: float | None = None


class JudgeScripts(_Strict):
    """Judge scripts. The judge's prompt embeds the question, so ``by_question`` keys match
    when they occur in the judge's user text (longest key first); then ``by_substring``."""

    default: JudgeScript | None = None
    by_question: dict[str, JudgeScript] = Field(default_factory=dict)
    by_substring: dict[str, JudgeScript] = Field(default_factory=dict)
    latency: float | None = None


class FaultSpec(_Strict):
    """A fault served ``times`` times to requests of ``role``, once ``after`` requests of that
    role have been served. Faults are consumed in list order."""

    role: Literal["answerer", "judge", "any"] = "any"
    kind: FaultKind = "status"
    status: int = 529
    retry_after: float | None = None
    retry_after_ms: float | None = None
    message: str | None = None
    times: int = 1
    after: int = 0
    hang_seconds: float = 30.0

    def fault(self) -> Fault:
        """The :class:`Fault` this spec serves."""
        return Fault(
            kind=self.kind,
            status=self.status,
            retry_after=self.retry_after,
            retry_after_ms=self.retry_after_ms,
            message=self.message,
            hang_seconds=self.hang_seconds,
        )


class ScriptSpec(_Strict):
    """The declarative policy. ``down`` makes every call fail with that fault (endpoint down);
    ``cases_file`` (a cases.jsonl) feeds case fields to ``{field}`` templates."""

    answerer: AnswererScripts = Field(default_factory=AnswererScripts)
    judge: JudgeScripts = Field(default_factory=JudgeScripts)
    faults: list[FaultSpec] = Field(default_factory=list)
    down: FaultSpec | None = None
    cases_file: str | None = None
    latency: float = 0.0

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptSpec:
        """Load a spec from JSON; a relative ``cases_file`` is resolved against the file's
        directory."""
        path = Path(path)
        try:
            spec = cls.model_validate_json(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError(f"policy file {path} is not a valid ScriptSpec: {exc}") from exc
        if spec.cases_file and not Path(spec.cases_file).is_absolute():
            resolved = (path.parent / spec.cases_file).resolve()
            spec = spec.model_copy(update={"cases_file": str(resolved)})
        return spec

    def policy(self) -> ScriptPolicy:
        """A fresh stateful policy playing this spec."""
        return ScriptPolicy(self)


# --- playing a script -------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)\}")
NO_SCRIPT_TEXT = "The fake has no script for this request."
EXHAUSTED_TEXT = "I have nothing further to add."


def render_verdict(verdict: JudgeVerdict) -> str:
    """The reply text of a judge verdict: prose, then the JSON object in a ```json fence."""
    obj = verdict.model_dump(exclude={"prose"})
    return f"{verdict.prose}\n\n```json\n{json.dumps(obj, indent=2)}\n```\n"


def load_cases(path: str | Path) -> dict[str, dict[str, Any]]:
    """Cases of a cases.jsonl keyed by their question text."""
    cases: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            case = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number} is not a JSON object: {exc}") from exc
        if isinstance(case, dict) and isinstance(case.get("question"), str):
            cases[case["question"]] = case
    return cases


def template_values(question: str, case: Mapping[str, Any] | None) -> dict[str, str]:
    """Values for ``{name}`` placeholders: ``question``, the case's top-level fields, and its
    ``golden`` fields both as ``golden.name`` and, where no top-level field has the name, bare."""
    raw: dict[str, Any] = {}
    golden = case.get("golden") if case else None
    if isinstance(golden, dict):
        raw.update(golden)
        raw.update({f"golden.{k}": v for k, v in golden.items()})
    if case:
        raw.update(case)
    raw["question"] = question
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}


def fill(value: Any, values: Mapping[str, str]) -> Any:
    """Template every string inside ``value``; unknown placeholders stay as written."""
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [fill(v, values) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, values) for k, v in value.items()}
    return value


def plan_turns(script: AnswererScript, offers_final: bool) -> list[list[AnswerStep]]:
    """Group a script into turns: a list step is one turn, consecutive steps sharing a
    ``turn`` number are one turn, any other step is a turn of its own. ``declare_final`` steps
    are dropped when the request offers no ``submit_final_query`` tool."""
    turns: list[list[AnswerStep]] = []
    last_turn: int | None = None
    for entry in script:
        steps = entry if isinstance(entry, list) else [entry]
        kept = [s for s in steps if offers_final or not isinstance(s, FinalStep)]
        if not kept:
            continue
        number = kept[0].turn if not isinstance(entry, list) else None
        if number is not None and number == last_turn and turns:
            turns[-1].extend(kept)
        else:
            turns.append(list(kept))
        last_turn = number
    return turns


def _step_block(step: AnswerStep, values: Mapping[str, str]) -> Text | ToolUse:
    if isinstance(step, ToolStep):
        return ToolUse(step.tool, fill(step.input, values))
    if isinstance(step, FinalStep):
        return ToolUse(FINAL_QUERY_TOOL, {"query": fill(step.declare_final, values)})
    return Text(fill(step.text, values))


class ScriptPolicy:
    """Plays a :class:`ScriptSpec`; keeps the fault and judge-list cursors."""

    def __init__(self, spec: ScriptSpec) -> None:
        self.spec = spec
        self._lock = threading.Lock()
        self._cases: dict[str, dict[str, Any]] | None = None
        self.reset()

    def reset(self) -> None:
        """Forget consumed faults, role counts and judge-list positions."""
        with self._lock:
            self._fault_left = [f.times for f in self.spec.faults]
            self._served: dict[str, int] = {"answerer": 0, "judge": 0}
            self._cursor: dict[str, int] = {}

    def __call__(self, request: ParsedRequest) -> Reply | Fault:
        with self._lock:
            fault = self._take_fault(request.role)
            self._served[request.role] += 1
            if fault is not None:
                return fault
            if request.role == "judge":
                return self._judge(request)
            return self._answer(request)

    def _take_fault(self, role: Role) -> Fault | None:
        if self.spec.down is not None:
            return self.spec.down.fault()
        for i, spec in enumerate(self.spec.faults):
            eligible = spec.role in ("any", role) and self._served[role] >= spec.after
            if self._fault_left[i] > 0 and eligible:
                self._fault_left[i] -= 1
                return spec.fault()
        return None

    def _latency(self, role_latency: float | None) -> float:
        return self.spec.latency if role_latency is None else role_latency

    def _case(self, question: str) -> dict[str, Any] | None:
        if not self.spec.cases_file:
            return None
        if self._cases is None:
            self._cases = load_cases(self.spec.cases_file)
        return self._cases.get(question)

    def _answer(self, request: ParsedRequest) -> Reply:
        scripts = self.spec.answerer
        latency = self._latency(scripts.latency)
        script = scripts.by_question.get(request.question)
        if script is None:
            script = next(
                (s for k, s in scripts.by_substring.items() if k in request.question),
                scripts.default,
            )
        if script is None:
            return Reply.text(NO_SCRIPT_TEXT, latency=latency)
        turns = plan_turns(script, request.offers(FINAL_QUERY_TOOL))
        if request.turn > len(turns):
            return Reply.text(EXHAUSTED_TEXT, latency=latency)
        values = template_values(request.question, self._case(request.question))
        blocks = [_step_block(s, values) for s in turns[request.turn - 1]]
        return Reply(blocks, latency=latency)

    def _judge(self, request: ParsedRequest) -> Reply:
        scripts = self.spec.judge
        latency = self._latency(scripts.latency)
        text = request.user_text
        key, script = "default", scripts.default
        for q in sorted(scripts.by_question, key=len, reverse=True):
            if q in text:
                key, script = f"q:{q}", scripts.by_question[q]
                break
        else:
            for sub, candidate in scripts.by_substring.items():
                if sub in text:
                    key, script = f"s:{sub}", candidate
                    break
        if script is None:
            return Reply.text(NO_SCRIPT_TEXT, latency=latency)
        return Reply.text(self._judge_text(key, script), latency=latency)

    def _judge_text(self, key: str, script: JudgeScript) -> str:
        if isinstance(script, list):
            if not script:
                return NO_SCRIPT_TEXT
            # One entry per call; the last one repeats once the list is used up.
            position = self._cursor.get(key, 0)
            self._cursor[key] = position + 1
            script = script[min(position, len(script) - 1)]
        if isinstance(script, JudgeVerdict):
            return render_verdict(script)
        if isinstance(script, RawReply):
            return script.raw
        return script
