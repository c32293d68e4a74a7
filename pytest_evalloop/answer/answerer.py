"""The ``anthropic`` answerer: a Messages API tool-use loop over the target's MCP tools.

The answerer is blind: it sees the question and exactly the tools the target lists, nothing
else (no set, no golden, no hint that its answer is checked). Every tool it uses is logged
host-side as a :class:`ToolUse` row, which is what the contamination check and the retrieval
score read. See ``docs/answerer.md``.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_evalloop.failures import HarnessError
from pytest_evalloop.ledger.contract import ReportStatus
from pytest_evalloop.model_api.pricing import PriceTable
from pytest_evalloop.model_api.toolloop import Conversation, LoopPolicy, before_deadline, converse
from pytest_evalloop.roles.contract import (
    AnswerRecord,
    FinalCall,
    FinalSource,
    TargetSession,
    ToolOutcome,
    ToolUse,
)
from pytest_evalloop.targets.bridge import anthropic_tools, tool_result_block, truncate_text

if TYPE_CHECKING:
    import anthropic

SYSTEM_PROMPT = """\
You are a data analyst. A user asks you a question about their data, and you answer it from \
the data your tools expose. One tool describes the data model (its sources, measures, \
dimensions and views, with their documentation); another runs queries against it.

Work like this:
1. Find the definitions first. Call the context tool with the user's own terms before you \
write any query, and read the documentation of what comes back. Prefer a measure or view the \
model already defines over computing your own version of it: its documentation says what it \
means and which filters it applies.
2. Query, using the names exactly as the tools return them.
3. Check the result before you rely on it. Does it have the rows and columns the question \
needs? Are the totals plausible? Was the result cut off by a row limit? Could a join have \
multiplied rows? If something looks wrong, fix the query and run it again.
4. Answer plainly. Lead with the figure or figures the user asked for, with units and the \
period or filters they cover. Where the question is ambiguous, choose the most reasonable \
reading, say which one you chose, and answer it; the user cannot reply to follow-up \
questions. If the data cannot answer the question, say so and say what is missing instead of \
guessing a number.

End your reply with the one query your answer rests on, exactly as you ran it, after a line \
"Final query:" and inside a ```sql fenced block (use that fence whatever language the query \
tool takes), like this:

Final query:
```sql
<the query>
```

Last, for the user's record of how the answer was found, end with one line giving the number \
of tool calls you made for this answer, every call counted, failed ones too:

Tool calls: <number>
"""

SYSTEM_PROMPT_SHA = hashlib.sha256(SYSTEM_PROMPT.encode("utf-8")).hexdigest()
"""The sha of the prompt the claude-code backend appends (the CLI adds the target's MCP
instructions to its own system prompt itself): its `answererPromptSha` pin."""

INSTRUCTIONS_HEADING = "# What the data server says about its tools"
INSTRUCTIONS_SLOT = "<the MCP instructions of the target, as it sent them>"


def system_prompt(instructions: str | None) -> str:
    """The anthropic answerer's system prompt: SYSTEM_PROMPT, then the target's MCP
    `instructions` (what the server says about using its tools) under a heading, as the
    `claude` CLI puts them in its own: both backends answer with the same context."""
    if not instructions or not instructions.strip():
        return SYSTEM_PROMPT
    return f"{SYSTEM_PROMPT}\n{INSTRUCTIONS_HEADING}\n\n{instructions.strip()}\n"


ANSWERER_PROMPT_SHA = hashlib.sha256(system_prompt(INSTRUCTIONS_SLOT).encode("utf-8")).hexdigest()
"""The anthropic answerer's `answererPromptSha` pin: its prompt with the instructions' place
in it, so how they reach the model is pinned (a run without them is a rebase). Their text is
the target's, like its tools' descriptions: the embedded target's derive from its model file
(`modelSha`, the change under test), a server's from its version."""

TRANSCRIPT_RESULT_CHARS = 4_000
"""Each tool result is kept in the transcript up to this many characters."""

# A "final query" label: a line starting (after markdown: `#`, `>`, `*`, `_`, `-`) with the word
# "final" and naming a query within a few words: "Final query:", "**Final query:**",
# "### Final query", "Final Malloy query run against `x`:", "Final queries run:".
_FINAL_LABEL = re.compile(r"^[ \t>#*_-]*final\b[^\n]{0,60}?\bquer(?:y|ies)\b", re.I | re.M)
_FENCE_OPEN = re.compile(r"(?P<fence>`{3,}|~{3,})[^\n]*\n")
_BLANK_LINES = re.compile(r"(?:[ \t]*\r?\n)*")
_TARGET_ARGS = ("query", "search_targets", "targets", "search_text")


def extract_declared_final(answer_text: str | None) -> str | None:
    """The query in the fenced block right after a "final query" label; the last such wins.

    The one parser of declared final queries (the claude-code backend uses it too). The label
    may be bold, a heading or carry a few more words; the fence may open on the label's own
    line or after any number of blank lines, with any language tag (```sql, ```malloy, none)
    or as ~~~. Prose between the label and the fence means the label declared nothing.
    """
    if not answer_text:
        return None
    text = answer_text.replace("\r\n", "\n")
    found = [q for m in _FINAL_LABEL.finditer(text) if (q := _fenced_after(text, m.end()))]
    return found[-1] if found else None


def _fenced_after(text: str, pos: int) -> str | None:
    """The non-empty body of the fence that opens on the rest of this line or after blank
    lines; None when anything else comes first."""
    eol = text.find("\n", pos)
    eol = len(text) if eol == -1 else eol
    rest_of_label = text[pos:eol]
    inline = min(
        (i for i in (rest_of_label.find("```"), rest_of_label.find("~~~")) if i >= 0), default=-1
    )
    if inline >= 0:
        start = pos + inline
    else:
        blank = _BLANK_LINES.match(text, min(eol + 1, len(text)))
        start = blank.end() if blank else eol
        start += len(text[start:]) - len(text[start:].lstrip(" \t"))
    opened = _FENCE_OPEN.match(text, start)
    if opened is None:
        return None
    fence, body_start = opened.group("fence"), opened.end()
    closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.M)
    closed = closing.search(text, body_start)
    # A model sometimes closes the fence on the query's last line ("select 1```").
    end = closed.start() if closed else text.find(fence, body_start)
    if end == -1:
        return None  # an unterminated fence: the reply was cut off mid-query
    body = text[body_start:end].strip()
    return body or None


_PUNCTUATION_SPACE = re.compile(r"\s*([{}()\[\],;:=<>!+*/-])\s*")


def same_query(a: str, b: str) -> bool:
    """Whether two query texts are the same query written differently: whitespace (also
    around punctuation) and trailing semicolons do not count."""
    return _normal(a) == _normal(b)


def _normal(text: str) -> str:
    return _PUNCTUATION_SPACE.sub(r"\1", " ".join(text.split())).rstrip(";")


def final_call(
    declared: str | None, log: list[ToolUse], source: FinalSource | None = None
) -> FinalCall:
    """The final query and the call that re-executes it: the one rule, for every backend.

    A declared final query beats the last successful query call, which beats the last query
    call. A declared query the answerer ran is replayed as that call (its last successful run
    of it, else its last run); one it never ran borrows the arguments of its last successful (else last) query call.
    ``source`` is a replayed record's stored choice, kept as it was.
    """
    calls = [(seq, u) for seq, u in enumerate(log, start=1) if u.role == "query" and u.query]
    successful = [c for c in calls if c[1].ok]
    if declared and declared.strip():
        query = declared.strip()
        ran = [c for c in calls if same_query(c[1].query or "", query)]
        if ran:
            replayed = ([c for c in ran if c[1].ok] or ran)[-1]
            return _replay(replayed, query, source or "declared")
        if not calls:
            return FinalCall(query=query, source=source or "declared")
        _, use = (successful or calls)[-1]
        return FinalCall(
            query=query, source=source or "declared", tool=use.tool, arguments=dict(use.input)
        )
    if successful:
        return _replay(successful[-1], successful[-1][1].query, source or "last_successful")
    if calls:
        return _replay(calls[-1], calls[-1][1].query, source or "last_call")
    return FinalCall(query=None, source="none")


def _replay(call: tuple[int, ToolUse], query: str | None, source: FinalSource) -> FinalCall:
    seq, use = call
    return FinalCall(
        query=query, source=source, tool=use.tool, arguments=dict(use.input), exact=True, seq=seq
    )


def choose_final_query(declared: str | None, log: list[ToolUse]) -> tuple[str | None, str]:
    """The final query and how it was chosen (`final_call` without the call).

    ``(None, "none")`` means nothing was submitted (not a wrong answer).
    """
    chosen = final_call(declared, log)
    return chosen.query, chosen.source


# --------------------------------------------------------------------------- the calls report

REPORT_LABEL = "Tool calls"
"""The label of the answer's last line, where the answerer reports how many tools it called
(seed 001: the check compares that report with the host log)."""

# The line as written, bolded, quoted or bulleted; "MCP tool calls" too.
_REPORT_LINE = re.compile(
    r"^[ \t>*_#-]*(?:mcp[ \t]+)?tool[ \t]+calls[*_ \t]*(?::|(?=\d))(.*)$",
    re.IGNORECASE | re.MULTILINE,
)
_NUMBER = re.compile(r"\d+")


def report_line(calls: int) -> str:
    """The report line as the system prompt asks for it (the fakes write it this way)."""
    return f"{REPORT_LABEL}: {calls}"


def extract_reported_calls(answer_text: str | None) -> tuple[int | None, ReportStatus]:
    """How many tool calls the answer says it made, and whether it said so.

    The last "Tool calls:" line wins. Its first number is the count; a line that only names
    per-tool counts ("get_context 1, execute_query 2") is their sum. No such line is
    ``missing``; a line without a number is ``unreadable``. Neither is a clean report: the
    under-report rule cannot be checked, and the attempt records why.
    """
    lines = list(_REPORT_LINE.finditer(answer_text or ""))
    if not lines:
        return None, "missing"
    said = lines[-1].group(1).strip(" \t*_`")
    total = re.match(r"(\d+)\b(?!\s*[=:])", said)
    if total is not None:
        return int(total.group(1)), "reported"
    counts = [int(n) for n in _NUMBER.findall(said)]
    return (sum(counts), "reported") if counts else (None, "unreadable")


# --------------------------------------------------------------------------- the loop


@dataclass
class _Loop:
    """What one answer call keeps beside its conversation: the host-side log and transcript,
    and what the target said it served."""

    log: list[ToolUse] = field(default_factory=list)
    transcript: list[dict[str, Any]] = field(default_factory=list)
    served_revision: str | None = None
    served_model_sha: str | None = None


MAX_OUTPUT_TOKENS = 4096
"""The longest reply one answerer call may get (its `max_tokens`): the spend ceiling's bound."""


class AnthropicAnswerer:
    """Answers with an async Messages API tool-use loop over the target's MCP tools.

    ``client_factory`` is called once per answer and may return a shared client; the answerer
    never closes it. Retries are the client's (``max_retries``; they honour ``retry-after``).
    """

    backend = "anthropic"
    prompt_sha = ANSWERER_PROMPT_SHA
    """Its system prompt's sha256, the instructions' place in it: `answererPromptSha`."""

    def __init__(
        self,
        *,
        model: str,
        client_factory: Callable[[], anthropic.AsyncAnthropic],
        max_turns: int = 16,
        timeout_s: float = 300.0,
        max_tokens_budget: int = 400_000,
        max_output_tokens: int = MAX_OUTPUT_TOKENS,
        prices: PriceTable | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.model = model
        self.client_factory = client_factory
        self.max_turns = max_turns
        self.timeout_s = timeout_s
        self.max_tokens_budget = max_tokens_budget
        self.max_output_tokens = max_output_tokens
        self.prices = prices if prices is not None else PriceTable()

    @property
    def version(self) -> str:
        """The SDK this backend speaks through: pinned as the run's answererVersion."""
        from importlib.metadata import version

        return f"anthropic {version('anthropic')}"

    async def answer(self, question: str, session: TargetSession) -> AnswerRecord:
        """Answer ``question`` with the session's tools; raise HarnessError when the endpoint
        fails after the client's retries or rejects the configuration."""
        started = time.monotonic()
        state = _Loop()
        conv = Conversation(messages=[{"role": "user", "content": question}])
        client = self.client_factory()
        if await before_deadline(self.timeout_s, self._run(client, session, state, conv)):
            conv.stop = "timeout"
        # A final reply's own text (None when it had none); cut short, the latest text said.
        answer_text = conv.text if conv.final_text is None else (conv.final_text or None)
        reported, report_status = extract_reported_calls(answer_text)
        return AnswerRecord(
            answer_text=answer_text,
            tool_log=state.log,
            declared_final=extract_declared_final(answer_text),
            reported_calls=reported,
            reported_calls_status=report_status,
            usage=conv.usage,
            cost_usd=self.prices.cost(self.model, conv.usage),
            # What the API served, not what was asked for (an alias resolves to a snapshot).
            model=conv.model or self.model,
            num_turns=conv.turns,
            wall_seconds=round(time.monotonic() - started, 3),
            stop=conv.stop,
            transcript=state.transcript,
            served_revision=state.served_revision,
            served_model_sha=state.served_model_sha,
        )

    async def _run(
        self,
        client: anthropic.AsyncAnthropic,
        session: TargetSession,
        state: _Loop,
        conv: Conversation,
    ) -> None:
        """The tools the target lists, then the one tool loop (model_api/toolloop.py)."""
        specs = await session.list_tools()
        known = {t.name for t in specs}

        async def run_tool(block: dict[str, Any]) -> dict[str, Any]:
            return await self._use_tool(session, known, block, state)

        policy = LoopPolicy(
            model=self.model,
            system=system_prompt(getattr(session, "instructions", None)),
            max_output_tokens=self.max_output_tokens,
            max_turns=self.max_turns,
            tools=anthropic_tools(specs),
            run_tool=run_tool,
            token_budget=self.max_tokens_budget,
            # Two breakpoints move with the conversation (caching.conversation_request), so turn
            # N reads turns 1..N-1 from the cache instead of paying for them again.
            moving_breakpoints=True,
            record=lambda message, _reply: state.transcript.append(_transcript_entry(message)),
        )
        await converse(client, policy, conv)

    async def _use_tool(
        self,
        session: TargetSession,
        known: set[str],
        block: dict[str, Any],
        state: _Loop,
    ) -> dict[str, Any]:
        """Run one ``tool_use`` through the session, log it, and return its ``tool_result``."""
        name = str(block.get("name"))
        arguments = block.get("input")
        arguments = dict(arguments) if isinstance(arguments, dict) else {}
        if name not in known:
            message = f"unknown tool {name!r}; the available tools are: {', '.join(sorted(known))}"
            outcome = ToolOutcome(text=message, is_error=True, error=message)
            state.log.append(ToolUse(tool=name, input=arguments, ok=False, error=message))
            return tool_result_block(str(block.get("id")), outcome)
        try:
            outcome = await session.call(name, arguments)
        except HarnessError:
            raise
        except Exception as exc:
            rejected = _rejected_arguments(exc)
            if rejected is None:
                raise HarnessError(
                    f"target {session.name!r}: calling tool {name!r} failed "
                    f"({type(exc).__name__}: {exc}); check that the target is running"
                ) from exc
            # Bad arguments are the model's mistake: show it, as a tool error, and go on.
            outcome = ToolOutcome(text=rejected, is_error=True, error=rejected)
        state.log.append(log_row(session, name, arguments, outcome))
        payload = outcome.payload if isinstance(outcome.payload, dict) else {}
        revision = payload.get("servedRevision")
        if isinstance(revision, str):
            # The revision the target says it served (seed: from the context tool, not a name).
            state.served_revision = revision
        content_sha = payload.get("sourceContentSha")
        if isinstance(content_sha, str):
            # Publisher's content hash over every model path of the package it served.
            state.served_model_sha = content_sha
        return tool_result_block(str(block.get("id")), outcome)


def _rejected_arguments(exc: Exception) -> str | None:
    """The message of a JSON-RPC "invalid params" rejection (Publisher's schema check), else
    None: any other failure of a tool call is the harness's, not the model's."""
    from mcp import MCPError
    from mcp.types import INVALID_PARAMS

    if isinstance(exc, MCPError) and exc.code == INVALID_PARAMS:
        return f"MCP error {exc.code}: {exc.message}"
    return None


def log_row(
    session: TargetSession, name: str, arguments: dict[str, Any], outcome: ToolOutcome
) -> ToolUse:
    """The host-side log row of one MCP call: role, query, targets, trace id, context results
    (shared with the claude-code backend so both logs read the same)."""
    role = session.role_of(name)
    row = ToolUse(
        tool=name,
        input=arguments,
        is_mcp=True,
        role=role,
        ok=not outcome.is_error,
        error=outcome.error or (outcome.text[:2_000] if outcome.is_error else None),
    )
    if role == "query":
        row.query = session.query_of(name, arguments)
    if role == "context":
        row.targets = _targets_of(arguments)
        if isinstance(outcome.payload, dict) and outcome.payload.get("traceId") is not None:
            row.trace_id = str(outcome.payload["traceId"])
        if not outcome.is_error:
            row.context_results = [r.model_dump() for r in session.context_results(outcome)]
    return row


def _targets_of(arguments: dict[str, Any]) -> str | list[str] | None:
    """What a context call searched for: its query argument (or a search-target list)."""
    for key in _TARGET_ARGS:
        value = arguments.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return [str(v.get("search_text", v)) if isinstance(v, dict) else str(v) for v in value]
    return None


def _transcript_entry(message: dict[str, Any]) -> dict[str, Any]:
    """A JSON-able copy of a message with each tool result cut to a few KB."""
    content = message["content"]
    if not isinstance(content, list):
        return dict(message)
    blocks = []
    for block in content:
        if block.get("type") == "tool_result":
            block = dict(block)
            block["content"] = [
                dict(part, text=truncate_text(part["text"], TRANSCRIPT_RESULT_CHARS))
                if part.get("type") == "text"
                else part
                for part in block.get("content", [])
            ]
        blocks.append(block)
    return {"role": message["role"], "content": blocks}
