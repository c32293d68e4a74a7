"""The skill rubric judge: grades prose rubric items and question behaviour of one scenario run.

Separate from the answer judge on purpose: it reads a transcript and a diff rather than a
result set, so its doctrine (``skills/doctrine.md``) is versioned on its own. Its rendered text
is pinned by ``SKILL_JUDGE_VERSION`` and :func:`rubric_sha`, both stamped on each
``activation_score`` event it graded.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from pytest_evalloop.answer.backends import ClientFactory

SKILL_JUDGE_VERSION = "1"
SUMMARY_CHARS = 24_000
"""The whole run summary the judge sees is cut to this many characters."""


@cache
def render_doctrine() -> str:
    """The judge's system prompt: skills/doctrine.md with its version filled in."""
    text = resources.files("pytest_evalloop.skills").joinpath("doctrine.md").read_text("utf-8")
    return text.replace("{{SKILL_JUDGE_VERSION}}", SKILL_JUDGE_VERSION)


@cache
def rubric_sha() -> str:
    """sha256 hex of the rendered doctrine."""
    return hashlib.sha256(render_doctrine().encode("utf-8")).hexdigest()


class RubricRequest(BaseModel):
    """What the judge sees of one run."""

    prompt: str
    summary: str
    criteria: list[str] = Field(default_factory=list)
    interaction: dict[str, Any] | None = None


class RubricItem(BaseModel):
    """One graded rubric item."""

    model_config = ConfigDict(populate_by_name=True)

    criterion: str
    passed: bool = Field(alias="pass")
    reason: str = ""


class InteractionVerdict(BaseModel):
    """The judge's reading of the agent's questions; None means "does not apply"."""

    model_config = ConfigDict(populate_by_name=True)

    asked_user: bool | None = Field(default=None, alias="askedUser")
    question_was_material: bool | None = Field(default=None, alias="questionWasMaterial")
    question_was_repository_answerable: bool | None = Field(
        default=None, alias="questionWasRepositoryAnswerable"
    )
    proceeded_with_assumption: bool | None = Field(default=None, alias="proceededWithAssumption")
    assumption_was_reasonable: bool | None = Field(default=None, alias="assumptionWasReasonable")
    task_succeeded: bool | None = Field(default=None, alias="taskSucceeded")
    reason: str = ""


class RubricReply(BaseModel):
    """The judge's grades: one item per criterion, in the request's order."""

    items: list[RubricItem] = Field(default_factory=list)
    interaction: InteractionVerdict | None = None


class JudgeReplyError(ValueError):
    """A judge reply that does not grade every criterion; the run becomes an error."""


class SkillJudge(Protocol):
    """Anything that grades a :class:`RubricRequest` (override with ``SKILL_JUDGE_KEY``)."""

    model: str

    async def grade(self, request: RubricRequest) -> RubricReply:
        """Grade every criterion of the request (and the interaction, when given)."""
        ...


def render_request(request: RubricRequest) -> str:
    """The user turn: the request, the run summary and the numbered rubric."""
    parts = [
        "## The user's request\n" + request.prompt.strip(),
        "## What the agent did\n" + _cut(request.summary, SUMMARY_CHARS),
    ]
    if request.criteria:
        numbered = "\n".join(f"{n}. {c}" for n, c in enumerate(request.criteria, 1))
        parts.append("## Rubric\n" + numbered)
    if request.interaction:
        parts.append("## Interaction\n" + json.dumps(request.interaction, indent=2))
    return "\n\n".join(parts)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit} chars cut]"


def _normal(text: str) -> str:
    return re.sub(r"\W+", " ", text).strip().lower()


def parse_reply(text: str, request: RubricRequest) -> RubricReply:
    """The last JSON object of a reply, its items matched to the criteria by normalised text,
    else by position; raises JudgeReplyError when a criterion is left ungraded."""
    data = _last_object(text)
    if data is None:
        raise JudgeReplyError(f"the skill judge's reply holds no JSON object: {text[-300:]!r}")
    try:
        reply = RubricReply.model_validate(data)
    except ValidationError as exc:
        raise JudgeReplyError(f"the skill judge's reply does not fit the schema: {exc}") from exc
    by_text = {_normal(i.criterion): i for i in reply.items}
    items: list[RubricItem] = []
    for index, criterion in enumerate(request.criteria):
        found = by_text.get(_normal(criterion))
        if found is None and index < len(reply.items):
            found = reply.items[index]
        if found is None:
            raise JudgeReplyError(f"the skill judge left rubric item {criterion!r} ungraded")
        items.append(
            RubricItem.model_validate(
                {"criterion": criterion, "pass": found.passed, "reason": found.reason}
            )
        )
    if request.interaction and reply.interaction is None:
        raise JudgeReplyError("the skill judge gave no interaction verdict although one was asked")
    return RubricReply(items=items, interaction=reply.interaction)


def _last_object(text: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict) and "items" in value:
            found = value
    return found


class AnthropicSkillJudge:
    """The default skill judge: one fresh Messages API call per run, doctrine as system."""

    def __init__(self, *, model: str, client_factory: ClientFactory, max_tokens: int = 2048):
        self.model = model
        self.max_tokens = max_tokens
        self._client_factory = client_factory

    async def grade(self, request: RubricRequest) -> RubricReply:
        """Grade one run; an endpoint failure or an unusable reply raises."""
        client = self._client_factory()
        try:
            message = await client.messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                system=render_doctrine(),
                messages=[{"role": "user", "content": render_request(request)}],
            )
        finally:
            # Each grade runs on a loop of its own: close its client before that loop ends.
            release = getattr(self._client_factory, "release", None)
            if release is not None:
                await release()
        text = "".join(getattr(b, "text", "") for b in message.content if b.type == "text")
        return parse_reply(text, request)
