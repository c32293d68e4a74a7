"""The expert test, mechanically: an edit may not write the set's answers into the model.

Seed 004 (eval-improve, step 1): *would a domain expert have said this about their data with no
question in front of them?* The prompt asks the improver to hold to it; this refuses what can be
refused without judgement, whatever the prompt achieved, over every case of the set, dev and
holdout alike (the improver never sees a holdout golden, but an edit may still state one):

- a case's qid, or seven consecutive words of a question, in the words the edit adds;
- a golden's figure stated in any common form (`improve.figures`: a ratio or its percent, a
  scale, words, a currency, two to four significant figures or more) in a sentence the edit
  wrote, unless the file already held that figure (a constant of the model is not the answer
  leaking in);
- a golden's answer period (`December 2021`, `2021-12`; a month alone beside a word of rank
  or the year)
  or its categorical answer (the top brand, the name in a single-row golden) stated beside a
  word of rank (top, most, highest, peak, ...) in a sentence the edit wrote.

What it cannot decide (a name said to be the answer without a word of rank, a figure written
to one significant figure, a fraction in words) is what the independent reviewer reads
(`improve.reviewer`). Each problem has two wordings: one for people (the ledger), naming the
case and its golden; one for the improver, which never names a holdout case or its answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from pytest_evalloop.improve import figures as fig

QUESTION_WINDOW = 7
"""Consecutive words of a question that count as its text (shorter questions: all of them)."""
MIN_FIGURE = 100
"""A golden's whole numbers below this are counts of months, ranks or rounding places, too
common to be its answer."""
METADATA_KEYS = frozenset({"round", "currency", "unit", "units", "rank"})
"""Keys of a golden value that describe it rather than answer the question."""
RANKING = frozenset(
    {
        "top",
        "most",
        "highest",
        "largest",
        "biggest",
        "best",
        "leading",
        "leads",
        "led",
        "leader",
        "peak",
        "peaks",
        "peaked",
        "strongest",
        "greatest",
        "max",
        "maximum",
        "record",
        "bestseller",
        "bestselling",
        "best-selling",
        "top-selling",
        "number one",
        "#1",
        "no. 1",
        "no 1",
        "ahead",
        "outsells",
        "dominant",
        "dominates",
        "winner",
        "lowest",
        "least",
        "worst",
        "weakest",
        "smallest",
    }
)
"""Words that say a name or a month is where a ranking ends: the answer to a `which` question."""
_PICK = re.compile(
    r"\b(which|who|whose|when|top|most|highest|lowest|largest|biggest|best|worst|peak|"
    r"strongest|weakest|least)\b"
)
_EACH = re.compile(r"\b(each|every|per)\b")
_ASKS_WHEN = re.compile(r"\b(when|month|months|date|day|week|quarter)\b")
_WORD = re.compile(r"[a-z0-9]+")
_YEAR = re.compile(r"\b((?:19|20)\d\d)\b")
_ISO_PERIOD = re.compile(r"^((?:19|20)\d\d)-(0[1-9]|1[0-2])(?:-\d\d)?(?:[T ].*)?$")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Case:
    """What the expert test knows of one case: its question, split and golden value."""

    qid: str
    question: str
    split: str
    value: Any


@dataclass(frozen=True)
class Problem:
    """One failure of the expert test: `text` for people, `shown` for the improver."""

    text: str
    shown: str


# --- what a golden holds ------------------------------------------------------------------


@dataclass(frozen=True)
class GoldenFigure:
    key: str
    value: Decimal
    digits: int


def _leaves(
    value: Any, key: str = "", places: int | None = None
) -> Iterator[tuple[str, Any, int | None]]:
    """(key, leaf, decimal places the golden is stated to: its `round`, where it says)."""
    if isinstance(value, dict):
        stated = value.get("round")
        if isinstance(stated, int) and not isinstance(stated, bool) and 0 <= stated <= 12:
            places = stated
        for k, v in value.items():
            if str(k) not in METADATA_KEYS:
                yield from _leaves(v, str(k), places)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item, key, places)
    else:
        yield key, value, places


def golden_figures(value: Any) -> list[GoldenFigure]:
    """The figures a golden holds that are specific enough to be its answer: every number but
    booleans, whole numbers below `MIN_FIGURE`, years, and metadata (`round`, `currency`). A
    golden that says it is rounded to N places holds N places (1.6 at `round: 2` is 1.60,
    three figures, though the JSON number lost its zero); a whole number keeps its own digits
    (a count of 101740 beside `round: 4` is a count, not 101740.0000)."""
    out = []
    for key, leaf, places in _leaves(value):
        if isinstance(leaf, bool) or leaf is None:
            continue
        if isinstance(leaf, str):
            try:
                number = Decimal(leaf.strip().replace(",", ""))
            except InvalidOperation:
                continue
        elif isinstance(leaf, (int, float)):
            number = Decimal(repr(leaf)) if isinstance(leaf, float) else Decimal(leaf)
        else:
            continue
        if not number.is_finite():
            continue
        whole = number == number.to_integral_value()
        if whole and abs(number) < MIN_FIGURE:
            continue
        if whole and "year" in key.lower() and 1900 <= number <= 2100:
            continue
        exponent = number.as_tuple().exponent
        if places is not None and not whole and isinstance(exponent, int) and exponent > -places:
            number = number.quantize(Decimal(1).scaleb(-places))
        out.append(GoldenFigure(key, number, fig.exact_digits(number)))
    return out


def _rows(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, list):
        return [r for r in value if isinstance(r, dict)]
    if isinstance(value, dict):
        return [value]
    return [] if value is None else [{"value": value}]


def _row_periods(row: dict[str, Any], question: str) -> list[tuple[int, int]]:
    out = []
    for value in row.values():
        if isinstance(value, str) and (found := _ISO_PERIOD.match(value.strip())):
            out.append((int(found.group(1)), int(found.group(2))))
    months = [
        v
        for k, v in row.items()
        if str(k).lower().endswith("month") and isinstance(v, int) and 1 <= v <= 12
    ]
    years = [
        v
        for k, v in row.items()
        if "year" in str(k).lower() and isinstance(v, int) and 1900 <= v <= 2100
    ]
    named = sorted(set(_YEAR.findall(question)))
    year = years[0] if years else (int(named[0]) if len(named) == 1 else None)
    if months and year is not None:
        out.append((year, months[0]))
    return out


def answers(case: Case) -> tuple[list[str], list[tuple[int, int]]]:
    """The names and periods a case's golden gives as its answer: those of a single-row
    golden, or of the rows a `which`/`top`/`most` question picks (its first N, N the count it
    asks for, every row for `each`); periods only when the question asks for a time (when,
    which month, ...); never ones its question already names."""
    rows = _rows(case.value)
    question = case.question.lower()
    if not rows or (len(rows) > 1 and not _PICK.search(question)):
        return [], []
    if len(rows) == 1 or _EACH.search(question):
        picked = rows
    else:
        counts = [int(n) for n in re.findall(r"\b(\d{1,2})\b", fig.as_digits(question))]
        picked = rows[: max(1, next((n for n in counts if 1 < n <= 20), 1))]
    names: list[str] = []
    periods: list[tuple[int, int]] = []
    for row in picked:
        for key, value in row.items():
            if str(key) in METADATA_KEYS or not isinstance(value, str):
                continue
            text = value.strip()
            if len(text) < 3 or _ISO_PERIOD.match(text) or not re.search(r"[A-Za-z]", text):
                continue
            if re.search(rf"(?<!\w){re.escape(text.lower())}(?!\w)", question):
                continue
            names.append(text)
        if _ASKS_WHEN.search(question):
            periods += _row_periods(row, case.question)
    named_months = {p.month for p in fig.periods_in(case.question)}
    periods = [p for p in periods if p[1] not in named_months]
    return list(dict.fromkeys(names)), list(dict.fromkeys(periods))


# --- the test -----------------------------------------------------------------------------


def _ranked(sentence: str, question: str) -> bool:
    lowered = sentence.lower()
    ranking = RANKING | {w for w in words(question) if w.endswith("est") and len(w) > 4}
    return any(re.search(rf"(?<![\w#]){re.escape(w)}(?!\w)", lowered) for w in ranking)


def _problem(case: Case, what: str, states: str) -> Problem:
    text = f"the edit writes {what} into the model, {states} of case {case.qid!r} ({case.split})"
    if case.split == "holdout":
        shown = (
            f"the edit writes {what} into the model, which states the answer of a holdout case "
            "(neither named nor shown to you: holdout answers never reach the improver)"
        )
        return Problem(text, shown)
    return Problem(text, text)


def _figure_problems(changed: list[str], before: str, cases: list[Case]) -> list[Problem]:
    held = {f.value for f in fig.figures_in(before)}
    written = [f for s in changed for f in fig.figures_in(s) if f.counts and f.value not in held]
    out = []
    for case in cases:
        for golden in golden_figures(case.value):
            hit = next(
                (w for w in written if fig.same_figure(w, golden.value, golden.digits)), None
            )
            if hit is not None:
                states = f"which states {golden.value} (golden {golden.key or 'value'})"
                out.append(_problem(case, repr(hit.text), states))
    return out


def _answer_problems(changed: list[str], cases: list[Case]) -> list[Problem]:
    out = []
    for case in cases:
        names, periods = answers(case)
        if not names and not periods:
            continue
        for sentence in changed:
            ranked = _ranked(sentence, case.question)
            for period in fig.periods_in(sentence):
                for year, month in periods:
                    if period.month != month or period.year not in (year, None):
                        continue
                    # A month alone states the answer beside a word of rank or its year.
                    if period.year is None and not (ranked or str(year) in sentence):
                        continue
                    states = f"which states {year}-{month:02d}, the answer period"
                    out.append(_problem(case, repr(sentence[:160]), states))
            for name in names:
                stated = re.search(rf"(?<!\w){re.escape(name.lower())}(?!\w)", sentence.lower())
                if stated and ranked:
                    states = f"which states {name!r} as the answer"
                    out.append(_problem(case, repr(sentence[:160]), states))
    return out


def _text_problems(added: str, cases: list[Case]) -> list[Problem]:
    out = []
    lowered = added.lower()
    added_words = " " + " ".join(words(added)) + " "
    for case in cases:
        if case.qid and re.search(rf"(?<![\w-]){re.escape(case.qid.lower())}(?![\w-])", lowered):
            text = f"the edit writes case id {case.qid!r} into the model"
            out.append(Problem(text, text))
        q = words(case.question)
        size = min(QUESTION_WINDOW, len(q))
        if size < 4:
            continue
        for start in range(0, len(q) - size + 1):
            window = " " + " ".join(q[start : start + size]) + " "
            if window in added_words:
                text = f"the edit writes a case's question text into the model ({window.strip()!r})"
                out.append(Problem(text, text))
                break
    return out


def expert_problems(before: str, after: str, cases: Iterable[Case]) -> list[Problem]:
    """Why the edit from `before` to `after` (one file's text) fails the expert test; [] when
    it passes."""
    from pytest_evalloop.improve.workcopy import added_text

    cases = list(cases)
    changed = fig.changed_sentences(before, after)
    problems = [
        *_text_problems(added_text(before, after), cases),
        *_figure_problems(changed, before, cases),
        *_answer_problems(changed, cases),
    ]
    return list({p.text: p for p in problems}.values())
