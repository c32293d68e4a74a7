"""Policies: what the fake Messages API answers to each request.

A policy is any callable taking a :class:`FakeRequest` and returning an outcome: a
:class:`Reply`, a :class:`Fault` (an HTTP error), :class:`Malformed`, :class:`Hang` or
:class:`Disconnect` (a plain ``str`` is read as a text reply). :class:`ScriptSpec` is the
declarative, JSON-serialisable kind, usable in-process and from ``--policy-file``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pytest_evalloop.testing.fake_diagnoser import DiagnoserPlayer, DiagnoserScripts, Role, role_of
from pytest_evalloop.testing.fake_improver import ImproverScripts, play_improver
from pytest_evalloop.testing.templates import fill, fill_text, template_values

__all__ = ["fill", "fill_text", "template_values"]  # re-exported: importers name them here

#: A request whose system text contains this string is the judge's; any other is the answerer's.
JUDGE_MARKER = "JUDGE_VERSION:"
#: ``declare_final`` steps become a call of this tool, when the request offers it.
FINAL_QUERY_TOOL = "submit_final_query"
#: Header names whose values never reach the request log.
SECRET_HEADERS = frozenset({"x-api-key", "authorization", "proxy-authorization", "cookie"})
NO_SCRIPT_TEXT = "The fake has no script for this request."
EXHAUSTED_TEXT = "I have nothing further to add."


class ScriptError(ValueError):
    """A policy script cannot be played (bad file, unreadable cases file)."""


# --------------------------------------------------------------------------- the request


@dataclass(frozen=True)
class ToolExchange:
    """A ``tool_use`` of an earlier assistant turn and the ``tool_result`` that answered it."""

    tool_use_id: str
    name: str
    input: dict[str, Any]
    result: str | None
    is_error: bool = False


@dataclass(frozen=True)
class FakeRequest:
    """A validated ``POST /v1/messages`` request, reduced to what a policy decides on.

    ``turn`` is 1 + the number of assistant messages; ``question`` is the first user text
    (``<system-reminder>`` blocks, which Claude Code sends ahead of the prompt, skipped);
    ``call_index`` counts every ``/v1/messages`` request the fake has received (from 0).
    """

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
        """Names of the offered tools, in order."""
        return [str(t.get("name", "")) for t in self.tools]

    def offers(self, tool: str) -> bool:
        """Whether the request offers a tool of that name."""
        return tool in self.tool_names

    @property
    def user_text(self) -> str:
        """The text of every user turn (tool results excluded), joined by blank lines."""
        return "\n\n".join(
            text for m in self.messages if m.get("role") == "user" for text in texts_of(m)
        )


def texts_of(message: Mapping[str, Any]) -> list[str]:
    """The text blocks of a message whose content is a string or a list of blocks."""
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [str(b.get("text", "")) for b in content if _is_block(b, "text")]


def _is_block(block: Any, kind: str) -> bool:
    return isinstance(block, dict) and block.get("type") == kind


def _system_text(body: Mapping[str, Any]) -> str:
    """Top-level ``system`` plus any ``system``-role messages (allowed since SDK 2.0)."""
    parts: list[str] = []
    system = body.get("system")
    if isinstance(system, str):
        parts.append(system)
    elif isinstance(system, list):
        parts.extend(str(b.get("text", "")) for b in system if _is_block(b, "text"))
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "system":
            parts.extend(texts_of(message))
    return "\n\n".join(parts)


def _result_text(block: Mapping[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if _is_block(b, "text"))
    return ""


def _exchanges(messages: list[dict[str, Any]]) -> list[ToolExchange]:
    results: dict[str, tuple[str, bool]] = {}
    for message in messages:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if _is_block(block, "tool_result"):
                entry = (_result_text(block), bool(block.get("is_error")))
                results[str(block.get("tool_use_id"))] = entry
    out: list[ToolExchange] = []
    for message in messages:
        if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if _is_block(block, "tool_use"):
                use_id = str(block.get("id"))
                text, is_error = results.get(use_id, (None, False))
                raw_input = block.get("input")
                tool_input = raw_input if isinstance(raw_input, dict) else {}
                out.append(ToolExchange(use_id, str(block.get("name")), tool_input, text, is_error))
    return out


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Lower-cased header names; credential values replaced by ``REDACTED``."""
    return {k.lower(): "REDACTED" if k.lower() in SECRET_HEADERS else v for k, v in headers.items()}


def parse_request(body: Mapping[str, Any], headers: Mapping[str, str], index: int) -> FakeRequest:
    """Reduce a validated request body to a :class:`FakeRequest` (headers redacted)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    system = _system_text(body)
    # Claude Code puts its context in user text blocks wrapped in <system-reminder> before the
    # prompt; the question is the first user text that is not one of those.
    question = next(
        (
            t
            for m in messages
            if m.get("role") == "user"
            for t in texts_of(m)
            if not t.lstrip().startswith(_REMINDER)
        ),
        "",
    )
    return FakeRequest(
        role=role_of(system, JUDGE_MARKER),
        model=str(body.get("model")),
        system=system,
        messages=messages,
        tools=[t for t in body.get("tools") or [] if isinstance(t, dict)],
        question=question,
        exchanges=_exchanges(messages),
        turn=1 + sum(1 for m in messages if m.get("role") == "assistant"),
        headers=redact_headers(headers),
        call_index=index,
        max_tokens=int(body.get("max_tokens") or 0),
        stream=bool(body.get("stream")),
        body=dict(body),
    )


_REMINDER = "<system-reminder>"


def tool_use_id(request: FakeRequest, position: int) -> str:
    """A ``toolu_`` id unique across the fake's lifetime (call index + block position)."""
    return f"toolu_fake{request.call_index:06d}{position:02d}"


# --------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class ToolCall:
    """A ``tool_use`` block of a reply; the fake assigns ``id`` when it is ``None``."""

    name: str
    input: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class Reply:
    """A successful reply: optional text, then tool calls.

    ``stop_reason`` defaults to ``tool_use`` when there are tool calls, else ``end_turn``; the
    fake replaces it by ``max_tokens`` when the content does not fit ``max_tokens``.
    ``held_until`` (in-process fakes only) holds the reply back until a test sets the event
    (or the fake stops), so a test orders events without guessing a latency; the policy that
    returns it is not blocked, other requests go on.
    """

    text: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop_reason: str | None = None
    latency: float = 0.0
    held_until: threading.Event | None = None


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


@dataclass(frozen=True)
class Fault:
    """An HTTP error with the API's error body and optional ``retry-after`` (seconds),
    ``retry-after-ms`` and ``x-should-retry`` headers."""

    status: int = 529
    retry_after: float | None = None
    retry_after_ms: float | None = None
    message: str | None = None
    error_type: str | None = None
    should_retry: bool | None = None
    latency: float = 0.0
    echo_credentials: bool = False
    """A gateway's error: the message quotes the request's credential headers back."""

    @property
    def type(self) -> str:
        """The ``error.type`` of the body: explicit, else the API's word for the status."""
        return self.error_type or _ERROR_TYPES.get(self.status, "api_error")


@dataclass(frozen=True)
class Malformed:
    """A reply whose body is not valid JSON (status 200 unless told otherwise).

    ``content_type`` None sends it as JSON (or as an event stream to a streaming request).
    """

    body: str = '{"id": "msg_fake", "type": "message", "content": [{"type": "te'
    status: int = 200
    latency: float = 0.0
    content_type: str | None = None


HTML_PAGE = (
    "<html><head><title>502 Bad Gateway</title></head>"
    "<body><h1>502 Bad Gateway</h1><p>upstream unavailable</p></body></html>"
)
"""What a proxy in front of the API answers when it cannot reach it (served with status 200)."""


@dataclass(frozen=True)
class Hang:
    """No answer for ``seconds`` (or until the fake stops); then the connection closes.
    ``None``: no answer until the fake stops, for a test whose client must give up first."""

    seconds: float | None = 30.0


@dataclass(frozen=True)
class Disconnect:
    """The connection closes without any answer."""


Outcome: TypeAlias = Reply | Fault | Malformed | Hang | Disconnect
Policy: TypeAlias = Callable[[FakeRequest], "Outcome | str"]


# --------------------------------------------------------------------------- the script spec


class _Strict(BaseModel):
    # A typo in a policy file must fail loudly, not silently script nothing.
    model_config = ConfigDict(extra="forbid")


class AnswererStep(_Strict):
    """One answerer step: ``tool`` (+ ``input``), ``declare_final``, ``text`` or
    ``report_calls``.

    ``report_calls`` writes the answer's "Tool calls: N" line: ``"honest"`` counts the tool
    calls the conversation holds so far (this turn's included), a number claims that many
    (more than were made is an inflated report). A script without one omits the report.
    Steps sharing a ``turn`` number (consecutive) go out in one assistant turn.
    """

    tool: str | None = None
    input: dict[str, Any] = Field(default_factory=dict)
    declare_final: str | None = None
    text: str | None = None
    report_calls: Literal["honest"] | int | None = None
    turn: int | None = None

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> AnswererStep:
        kinds = [k for k in _STEP_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                "an answerer step needs exactly one of tool / declare_final / text / "
                f"report_calls; got {kinds}"
            )
        if self.input and self.tool is None:
            raise ValueError("'input' belongs to a 'tool' step")
        return self


_STEP_KINDS = ("tool", "declare_final", "text", "report_calls")
AnswererScript: TypeAlias = list[AnswererStep | list[AnswererStep]]


class JudgeVerdict(_Strict):
    """A verdict, rendered as ``prose`` then the six-field object in a ```json fence."""

    verdict: str
    confidence: int = 9
    why: str = "The re-executed rows contain the golden answer."
    column_pairing: dict[str, Any] | None = Field(default_factory=dict)
    gold_status: str = "verified"
    gold_note: str | None = None
    prose: str = "I compared the re-executed rows with the golden answer, row by row."


class JudgeText(_Strict):
    """A judge reply of exactly this text (malformed-judge tests)."""

    text: str


JudgeReply: TypeAlias = JudgeVerdict | JudgeText | str
JudgeScript: TypeAlias = JudgeReply | list[JudgeReply]


class AnswererScripts(_Strict):
    """By exact question, else by the first ``by_substring`` key in the question, else
    ``default``."""

    default: AnswererScript | None = None
    by_question: dict[str, AnswererScript] = Field(default_factory=dict)
    by_substring: dict[str, AnswererScript] = Field(default_factory=dict)
    latency: float | None = None
    latency_by_substring: dict[str, float] = Field(default_factory=dict)
    """The latency of a case's replies when its question holds the key (the first key found):
    a few slow cases among quick ones, as a real endpoint's answers vary."""


class JudgeScripts(_Strict):
    """The judge's prompt embeds the question, so a ``by_question`` key matches when it
    occurs in the judge's user text (longest key first); then ``by_substring``, then
    ``default``. A list is consumed one entry per call; its last entry then repeats, or with
    ``cycle`` the list starts over (verdicts that vary per sample and per judge sample)."""

    default: JudgeScript | None = None
    by_question: dict[str, JudgeScript] = Field(default_factory=dict)
    by_substring: dict[str, JudgeScript] = Field(default_factory=dict)
    latency: float | None = None
    cycle: bool = False


class FaultSpec(_Strict):
    """Serve a fault ``times`` times to requests of ``role`` once ``after`` requests of that
    role went through, and then to every ``every``-th of them. Faults are consumed in list
    order.

    Kinds: ``status`` (an HTTP error, 529 unless ``status`` says otherwise), ``malformed`` (a
    200 whose body is broken JSON, or ``body`` as ``content_type``), ``html`` (a 200 that is a
    proxy's HTML page), ``gateway`` (a 400 whose message echoes the request's credentials, as
    a careless gateway does), ``hang`` (no answer for ``seconds``; ``null``: until the fake stops), ``disconnect``.
    """

    role: Literal["answerer", "judge", "diagnoser", "improver", "any"] = "any"
    kind: Literal["status", "malformed", "html", "gateway", "hang", "disconnect"] = "status"
    status: int | None = None
    retry_after: float | None = None
    retry_after_ms: float | None = None
    message: str | None = None
    body: str | None = None
    content_type: str | None = None
    times: int = 1
    after: int = 0
    every: int = Field(default=1, ge=1)
    seconds: float | None = 30.0

    def outcome(self) -> Outcome:
        """The outcome this spec serves."""
        if self.kind in ("malformed", "html"):
            html = self.kind == "html"
            default = HTML_PAGE if html else Malformed.body
            return Malformed(
                body=default if self.body is None else self.body,
                status=self.status or 200,
                content_type=self.content_type or ("text/html; charset=utf-8" if html else None),
            )
        if self.kind == "hang":
            return Hang(self.seconds)
        if self.kind == "disconnect":
            return Disconnect()
        gateway = self.kind == "gateway"
        return Fault(
            status=self.status or (400 if gateway else 529),
            retry_after=self.retry_after,
            retry_after_ms=self.retry_after_ms,
            message=self.message,
            echo_credentials=gateway,
        )


class ScriptSpec(_Strict):
    """The declarative policy. ``down`` fails every call (endpoint down); ``cases_file`` (a
    cases.jsonl) feeds case fields to ``{name}`` templates; ``latency`` delays every reply."""

    answerer: AnswererScripts = Field(default_factory=AnswererScripts)
    judge: JudgeScripts = Field(default_factory=JudgeScripts)
    diagnoser: DiagnoserScripts = Field(default_factory=DiagnoserScripts)
    improver: ImproverScripts = Field(default_factory=ImproverScripts)
    faults: list[FaultSpec] = Field(default_factory=list)
    down: FaultSpec | None = None
    cases_file: str | None = None
    latency: float = 0.0

    @classmethod
    def load(cls, path: str | Path) -> ScriptSpec:
        """Read a spec JSON file; a relative ``cases_file`` is taken from the file's folder."""
        path = Path(path)
        try:
            spec = cls.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ScriptError(f"policy file {path}: not a readable ScriptSpec: {exc}") from exc
        if spec.cases_file and not Path(spec.cases_file).is_absolute():
            resolved = str((path.parent / spec.cases_file).resolve())
            spec = spec.model_copy(update={"cases_file": resolved})
        return spec

    def policy(self) -> ScriptPolicy:
        """A fresh stateful policy playing this spec."""
        return ScriptPolicy(self)


def as_policy(policy: Policy | ScriptSpec | None) -> Policy:
    """A callable policy from a callable, a :class:`ScriptSpec`, or ``None`` (empty spec)."""
    if policy is None:
        return ScriptPolicy(ScriptSpec())
    if isinstance(policy, ScriptSpec):
        return ScriptPolicy(policy)
    if callable(policy):
        return policy
    raise TypeError(
        f"policy {policy!r} is neither callable nor a ScriptSpec; pass a function taking a "
        "FakeRequest, or ScriptSpec.model_validate({...})"
    )


# --------------------------------------------------------------------------- templating


def load_cases(path: str | Path) -> dict[str, dict[str, Any]]:
    """The cases of a cases.jsonl keyed by question text."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ScriptError(f"cases_file {path}: cannot be read ({exc}); fix the path") from exc
    cases: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            case = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScriptError(f"cases_file {path}:{number}: not JSON ({exc})") from exc
        if isinstance(case, dict) and isinstance(case.get("question"), str):
            cases[case["question"]] = case
    return cases


# --------------------------------------------------------------------------- playing scripts


def render_verdict(verdict: JudgeVerdict) -> str:
    """Prose, then the verdict object in a ```json fence (what a judge model writes)."""
    obj = verdict.model_dump(exclude={"prose"})
    return f"{verdict.prose}\n\n```json\n{json.dumps(obj, indent=2)}\n```\n"


def plan_turns(script: AnswererScript, offers_final: bool) -> list[list[AnswererStep]]:
    """Group a script into assistant turns: a list is one turn; consecutive steps with the same
    ``turn`` number are one turn; any other step is a turn of its own. ``declare_final`` steps
    are dropped when the request offers no ``submit_final_query`` tool."""
    turns: list[list[AnswererStep]] = []
    last: int | None = None
    for entry in script:
        steps = entry if isinstance(entry, list) else [entry]
        kept = [s for s in steps if offers_final or s.declare_final is None]
        if not kept:
            continue
        number = None if isinstance(entry, list) else entry.turn
        if number is not None and number == last and turns:
            turns[-1].extend(kept)
        else:
            turns.append(kept)
        last = number
    return turns


def steps_reply(
    steps: list[AnswererStep], values: Mapping[str, Any], latency: float, calls_so_far: int = 0
) -> Reply:
    """The reply for one planned turn: its texts (and report line) joined, then its tool calls
    in order. ``calls_so_far`` is what an honest report counts besides this turn's calls."""
    from pytest_evalloop.answer.answerer import report_line

    calls: list[ToolCall] = []
    for step in steps:
        if step.tool is not None:
            calls.append(ToolCall(step.tool, fill(step.input, values)))
        elif step.declare_final is not None:
            query = fill_text(step.declare_final, values)
            calls.append(ToolCall(FINAL_QUERY_TOOL, {"query": query}))
    texts: list[str] = []
    for step in steps:
        if step.text is not None:
            texts.append(fill_text(step.text, values))
        elif step.report_calls is not None:
            honest = calls_so_far + len(calls)
            texts.append(
                report_line(honest if step.report_calls == "honest" else step.report_calls)
            )
    return Reply(text="\n\n".join(texts) or None, tool_calls=calls, latency=latency)


class ScriptPolicy:
    """Plays a :class:`ScriptSpec`, keeping fault counts and judge-list positions."""

    def __init__(self, spec: ScriptSpec) -> None:
        self.spec = spec
        self._lock = threading.Lock()
        self._cases: dict[str, dict[str, Any]] | None = None
        self.reset()

    def reset(self) -> None:
        """Rewind: faults unconsumed, role counts zero, judge lists at their start."""
        with self._lock:
            self._fault_left = [f.times for f in self.spec.faults]
            self._served: dict[str, int] = {
                "answerer": 0,
                "judge": 0,
                "diagnoser": 0,
                "improver": 0,
            }
            self._diagnoser = DiagnoserPlayer(self.spec.diagnoser, EXHAUSTED_TEXT)
            self._cursor: dict[str, int] = {}

    def __call__(self, request: FakeRequest) -> Outcome:
        with self._lock:
            fault = self._take_fault(request.role)
            self._served[request.role] += 1
            if fault is not None:
                return fault
            if request.role == "judge":
                return self._judge(request)
            if request.role in ("diagnoser", "improver"):
                return self._agent(request)
            return self._answer(request)

    def _agent(self, request: FakeRequest) -> Reply:
        if request.role == "diagnoser":
            played = self._diagnoser.play(request.system, request.question, request.turn)
        else:
            played = play_improver(
                self.spec.improver, request.question, request.turn, EXHAUSTED_TEXT
            )
        said, text, given = played
        if said == "tool":
            return Reply(tool_calls=[ToolCall(text or "", given)])
        return Reply(text=NO_SCRIPT_TEXT if text is None else text)

    def _take_fault(self, role: Role) -> Outcome | None:
        if self.spec.down is not None:
            return self.spec.down.outcome()
        for i, spec in enumerate(self.spec.faults):
            # `after` counts the fault's own audience: one role, or every request for "any".
            seen = sum(self._served.values()) if spec.role == "any" else self._served[role]
            eligible = spec.role in ("any", role) and seen >= spec.after
            eligible = eligible and (seen - spec.after) % spec.every == 0
            if eligible and self._fault_left[i] > 0:
                self._fault_left[i] -= 1
                return spec.outcome()
        return None

    def _latency(self, role_latency: float | None) -> float:
        return self.spec.latency if role_latency is None else role_latency

    def _case(self, question: str) -> dict[str, Any] | None:
        if not self.spec.cases_file:
            return None
        if self._cases is None:
            self._cases = load_cases(self.spec.cases_file)
        return self._cases.get(question)

    def _answer(self, request: FakeRequest) -> Reply:
        scripts = self.spec.answerer
        latency = self._latency(scripts.latency)
        slow = (v for k, v in scripts.latency_by_substring.items() if k in request.question)
        latency = next(slow, latency)
        script = scripts.by_question.get(request.question)
        if script is None:
            matches = (s for k, s in scripts.by_substring.items() if k in request.question)
            script = next(matches, scripts.default)
        if script is None:
            return Reply(text=NO_SCRIPT_TEXT, latency=latency)
        turns = plan_turns(script, request.offers(FINAL_QUERY_TOOL))
        if request.turn > len(turns):
            return Reply(text=EXHAUSTED_TEXT, latency=latency)
        values = template_values(request.question, self._case(request.question))
        return steps_reply(turns[request.turn - 1], values, latency, len(request.exchanges))

    def _judge(self, request: FakeRequest) -> Reply:
        scripts = self.spec.judge
        text = request.user_text
        key, script = "default", scripts.default
        by_length = sorted(scripts.by_question, key=len, reverse=True)
        matched = next((q for q in by_length if q in text), None)
        if matched is not None:
            key, script = f"q:{matched}", scripts.by_question[matched]
        else:
            sub = next((s for s in scripts.by_substring if s in text), None)
            if sub is not None:
                key, script = f"s:{sub}", scripts.by_substring[sub]
        latency = self._latency(scripts.latency)
        if script is None:
            return Reply(text=NO_SCRIPT_TEXT, latency=latency)
        return Reply(text=self._judge_text(key, script), latency=latency)

    def _judge_text(self, key: str, script: JudgeScript) -> str:
        if isinstance(script, list):
            if not script:
                return NO_SCRIPT_TEXT
            position = self._cursor.get(key, 0)
            self._cursor[key] = position + 1
            last = len(script) - 1
            script = script[
                position % len(script) if self.spec.judge.cycle else min(position, last)
            ]
        if isinstance(script, JudgeVerdict):
            return render_verdict(script)
        if isinstance(script, JudgeText):
            return script.text
        return script
