"""The expert test, mechanically: an edit may not write the set's answers into the model.

Seed 004 (eval-improve, step 1): *would a domain expert have said this about their data with no
question in front of them?* The prompt asks the improver to hold to it; this refuses what can be
refused without judgement, whatever the prompt achieved: a case's qid, a run of a question's
words, or a golden's figure written into a doc, a name or a comment. A figure the file held
before the edit is not new (a year the model already names is not the answer leaking in).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

QUESTION_WINDOW = 7
"""Consecutive words of a question that count as its text (shorter questions: all of them)."""
MIN_FIGURE = 100
"""Integers below this are too common to be a golden's figure (counts of months, top-5)."""
_NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def numbers_in(text: str) -> set[Decimal]:
    """Every figure written in `text` (thousands separators dropped)."""
    out = set()
    for token in _NUMBER.findall(text):
        try:
            out.add(Decimal(token.replace(",", "")))
        except InvalidOperation:
            continue
    return out


def golden_figures(value: Any) -> set[Decimal]:
    """The figures a golden holds that are specific enough to be its answer."""
    out: set[Decimal] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, bool):
            continue
        elif isinstance(item, (int, float)):
            figure = Decimal(str(item))
            if figure != figure.to_integral_value() or abs(figure) >= MIN_FIGURE:
                out.add(figure)
        elif isinstance(item, str) and _NUMBER.fullmatch(item.strip()):
            stack.append(float(item.strip().replace(",", "")))
    return out


def _same_figure(written: Decimal, golden: Decimal) -> bool:
    # A figure written rounded is still the figure: 1234.57 for 1234.5678, 1,235 for 1234.6.
    exponent = written.as_tuple().exponent
    places = -exponent if isinstance(exponent, int) and exponent < 0 else 0
    if places == 0 and abs(written) < MIN_FIGURE:
        return False  # a small integer is no golden's figure, whatever it rounds
    if places > 12:
        return written == golden
    return golden.quantize(Decimal(1).scaleb(-places)) == written


def expert_problems(
    added: str,
    before: str,
    qids: Iterable[str],
    questions: Iterable[str],
    goldens: Iterable[tuple[str, Any]],
) -> list[str]:
    """Why the words an edit adds fail the expert test ([] when they pass).

    `added` is what the edit wrote (see `workcopy.added_text`), `before` the file's text before
    it; `goldens` pairs a qid with its golden value.
    """
    problems = []
    lowered = added.lower()
    for qid in qids:
        if qid and re.search(rf"(?<![\w-]){re.escape(qid.lower())}(?![\w-])", lowered):
            problems.append(f"the edit writes case id {qid!r} into the model")
    added_words = " " + " ".join(words(added)) + " "
    for question in questions:
        q = words(question)
        size = min(QUESTION_WINDOW, len(q))
        if size < 4:
            continue
        for start in range(0, len(q) - size + 1):
            window = " " + " ".join(q[start : start + size]) + " "
            if window in added_words:
                problems.append(
                    f"the edit writes a case's question text into the model ({window.strip()!r})"
                )
                break
    written = numbers_in(added) - numbers_in(before)
    for qid, value in goldens:
        for figure in golden_figures(value):
            hit = next((w for w in written if _same_figure(w, figure)), None)
            if hit is not None:
                problems.append(
                    f"the edit writes {hit} into the model, the expected figure of case {qid!r}"
                )
    return list(dict.fromkeys(problems))
