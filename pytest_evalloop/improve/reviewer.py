"""The expert review: an independent reader of an edit, for what the mechanical test cannot decide.

The expert test (`improve.expert`) refuses a golden stated in a form it can read. A name said to
be the answer without a word of rank, a figure to one significant figure, a fraction in words,
a hint ("the cancelled share is a bit under a sixth"): those need judgement. After every
mechanical check passed, a fresh model (one call, no tools) reads the edit's diff and the set's
questions, dev and holdout, never a golden value, and says which question the edit answers, if
any. Each flag halts the acceptance check as a golden suspect does, until a person dismisses it
(`evalloop accept ... --dismiss-suspect QID WHY`) or the edit is reverted. A reply that cannot
be read is itself a flag: nobody reviewed the edit.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, ValidationError

from pytest_evalloop.diagnose.agent import last_object
from pytest_evalloop.improve import agent
from pytest_evalloop.improve.expert import Case
from pytest_evalloop.model_api.endpoint import create_message
from pytest_evalloop.model_api.pricing import Usage

if TYPE_CHECKING:
    import anthropic

REVIEW_VERSION = "1"
REVIEW_MARKER = "EXPERT REVIEW."
"""How the review's user text starts (the fake improver answers it with its `review` script)."""
MAX_TOKENS = 2048
DOCTRINE = f"""IMPROVE_VERSION: {agent.IMPROVE_VERSION} (expert review {REVIEW_VERSION})

You review one edit to a semantic model's files, proposed to help an analyst agent answer
questions about the data. You are shown the edit as a diff and the questions of an evaluation
set. You are never shown their answers.

The edit must pass the expert test: it may only say what a domain expert would volunteer about
the data with no question in front of them (what a field means, which source is the system of
record, how a rate is counted, what a code stands for). It must not state the answer to any of
the questions: a figure, a date or a period, a name, a ranking or a yes/no that answers one,
in any wording (rounded, in words, as a fraction or a hint), nor copy a question's text.

Read only the lines the edit adds or changes. For each question the edit answers, give a flag
quoting the words that answer it. A fact about the data that no question asks is not a flag.

End your reply with only this JSON object:
{{"flags": [{{"qid": "the question's id", "quote": "the edit's words", "why": "what it answers"}}]}}
with "flags": [] when the edit answers none of the questions."""


class Flag(BaseModel):
    qid: str
    quote: str = ""
    why: str = ""


class ReviewReply(BaseModel):
    flags: list[Flag] = Field(default_factory=list)


@dataclass
class Review:
    """What the review said: its flags (each `{qid, quote, why, by}`) and what it cost."""

    model: str
    flags: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    problem: str | None = None


def diff_text(before: dict[str, str], after: dict[str, str]) -> str:
    """The edit as a unified diff, one file after another."""
    out: list[str] = []
    for name in sorted(after):
        if before.get(name) == after[name]:
            continue
        out += difflib.unified_diff(
            before.get(name, "").splitlines(),
            after[name].splitlines(),
            fromfile=f"a/{name}",
            tofile=f"b/{name}",
            n=1,
            lineterm="",
        )
    return "\n".join(out)


def prompt(before: dict[str, str], after: dict[str, str], cases: list[Case]) -> str:
    """The review's user text: the diff and every question (qid and text), no golden."""
    questions = [{"qid": c.qid, "question": c.question} for c in cases]
    return agent.fenced_prompt(
        f"{REVIEW_MARKER} Does this edit state the answer to any of these questions?",
        [("EDIT_DIFF", diff_text(before, after)), ("QUESTIONS", agent.shown(questions))],
    )


def read_reply(text: str) -> tuple[list[Flag] | None, str | None]:
    """The reply's flags, or why they cannot be read."""

    obj = last_object(text, "flags")
    if obj is None:
        return None, "the reply ends with no JSON object carrying flags"
    try:
        return ReviewReply.model_validate(obj).flags, None
    except ValidationError as exc:
        return None, f"the reply's object is not a flags list: {exc.errors()[0]['msg']}"


async def review_edit(
    client: anthropic.AsyncAnthropic,
    model: str,
    before: dict[str, str],
    after: dict[str, str],
    cases: list[Case],
) -> Review:
    """One fresh review of the edit from `before` to `after` (see the module docstring)."""

    system = [{"type": "text", "text": DOCTRINE}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt(before, after, cases)}]
    message = await create_message(client, model, MAX_TOKENS, system, None, messages)
    review = Review(model=message.model or model, usage=Usage.of_reply(message.usage))
    text = "".join(getattr(b, "text", "") for b in message.content if b.type == "text")
    flags, problem = read_reply(text)
    known = {c.qid for c in cases}
    if flags is None:
        review.problem = problem
        why = f"the expert review could not be read ({problem}): nobody reviewed this edit"
        review.flags = [{"qid": "", "quote": "", "why": why, "by": "reviewer"}]
        return review
    review.flags = [
        {
            **f.model_dump(),
            "by": "reviewer",
            **({} if f.qid in known else {"note": "no case of the set has this qid"}),
        }
        for f in flags
    ]
    return review
