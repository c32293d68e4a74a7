"""What a text states, read the way a person reads it: figures, periods and sentences.

The expert test (`improve.expert`) compares what an edit writes with the set's goldens; this
module only reads. A figure is a number with what is written around it: a currency symbol or
word, a scale (`4.7 thousand`, `4.712k`, `$5.2M`, `1.2 billion`), a percent sign or word, and the
precision it is written to (its significant figures). Numbers written in words ("four thousand
seven hundred", "fourteen point nine three percent") are read as digits first, by `text2num`
(a maintained parser; imported at point of use). A period is a month with its year
("December 2021", "Dec. 2021", "2021-12", "12/2021") or a month named alone.

Two figures are the same when they round to the same number at the coarser of their two
precisions, with at least two significant figures (`same_figure`); a ratio and its percent are
one figure (0.1493 and 14.93 %), and a fall is its size (`fell 5.75%` states -0.0575).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from functools import cache

MIN_DIGITS = 2
"""Significant figures a figure needs to be compared at all: one (40 %, $5 million, 100) says
too little to tell a golden from any other round number."""
SCALES = {
    "k": 3,
    "thousand": 3,
    "m": 6,
    "mn": 6,
    "mm": 6,
    "million": 6,
    "b": 9,
    "bn": 9,
    "billion": 9,
}
"""Scale words and suffixes, as powers of ten (`m` and `b` only attached to the digits:
`5.2M`, `$1.2B`; spaced, `5.2 m` is read as metres or minutes and left alone)."""
_SPACED_SCALES = {"thousand", "million", "billion", "mn", "bn", "k"}
_FIGURE = re.compile(
    r"""
    (?<![\w.,])
    (?P<cur>[$€£¥])?\s?
    (?P<sign>[-−])?
    (?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)
    (?:[eE](?P<exp>[-+]?\d{1,3}))?
    (?![\d]|[.,]\d)
    (?:(?P<attached>[kKmMbB]|mn|bn|MM)\b|\s?(?P<spaced>thousand|million|billion|mn|bn|k)\b)?
    (?:\s?(?P<pct>%|percent\b|per\s?cent\b|pct\b|percentage\ points?\b))?
    (?:\s?(?P<cur2>dollars?|usd|eur|euros?|gbp|pounds?)\b)?
    """,
    re.VERBOSE | re.IGNORECASE,
)
_SEPARATOR = re.compile(r"(?<=\d)[\u00a0\u202f\u2009'’](?=\d{3}(?!\d))")
_WORD_SCALE = re.compile(r"(\d[\d,]*(?:\.\d+)?) (1000|1000000|1000000000)\b")
_SCALE_OF = {"1000": "thousand", "1000000": "million", "1000000000": "billion"}


@dataclass(frozen=True)
class Figure:
    """A number as a text writes it."""

    text: str
    value: Decimal
    """With its scale applied (`4.7 thousand` is 4700); a percent keeps its number (15)."""
    digits: int
    """Significant figures as written (`4,700`: 2; `4.70`: 3; `0.1493`: 4)."""
    percent: bool = False
    money: bool = False
    scaled: bool = False
    decimal: bool = False
    grouped: bool = False

    @property
    def bare(self) -> bool:
        """A whole number with nothing written around it (`30`, `2022`)."""
        return not (self.percent or self.money or self.scaled or self.decimal or self.grouped)

    @property
    def counts(self) -> bool:
        """Specific enough to state a golden: two significant figures or more, and not a bare
        whole number below 100 (`12 months`, `top 5`) nor a bare year (`2022`)."""
        if self.digits < MIN_DIGITS:
            return False
        if self.bare and abs(self.value) < 100:
            return False
        return not (self.bare and 1900 <= self.value <= 2100)


def significant(digits: str) -> int:
    """Significant figures of a number written as `digits` (no sign, separators dropped): a
    decimal keeps its trailing zeros, a whole number does not (`4700` is two)."""
    if "." in digits:
        whole, frac = digits.split(".", 1)
        return len((whole + frac).lstrip("0")) or 1
    return len(digits.lstrip("0").rstrip("0")) or 1


def exact_digits(value: Decimal) -> int:
    """Significant figures of a stored value: every digit it holds (an exact count of 24000 is
    five figures, not two)."""
    digits = value.as_tuple().digits
    return max(1, len(digits) - next((i for i, d in enumerate(digits) if d), len(digits)))


@cache
def _alpha2digit() -> object:
    from text_to_num import alpha2digit

    return alpha2digit


def as_digits(text: str) -> str:
    """`text` with its spelled numbers in digits and its separators made plain: what
    `figures_in` reads."""
    import unicodedata

    # Separators first (NFKC would make a no-break space a plain one), then full-width and
    # other compatibility digits as ASCII.
    text = unicodedata.normalize("NFKC", _SEPARATOR.sub(",", text.replace("−", "-")))
    convert = _alpha2digit()
    try:
        text = convert(text, "en")  # type: ignore[operator]
    except (ValueError, RuntimeError):  # pragma: no cover - the parser refused the text
        pass
    # text2num reads "4.7 thousand" as "4.7 1000": give the scale its word back.
    return _WORD_SCALE.sub(lambda m: f"{m.group(1)} {_SCALE_OF[m.group(2)]}", text)


def figures_in(text: str) -> list[Figure]:
    """Every figure `text` writes, in order."""
    out = []
    for found in _FIGURE.finditer(as_digits(text)):
        raw = found.group("num")
        plain = raw.replace(",", "")
        try:
            value = Decimal(plain if not plain.startswith(".") else "0" + plain)
        except InvalidOperation:  # pragma: no cover - the pattern admits digits only
            continue
        if found.group("sign"):
            value = -value
        if found.group("exp"):
            value = value.scaleb(int(found.group("exp")))
        scale = (found.group("attached") or found.group("spaced") or "").lower()
        if found.group("spaced") and scale not in _SPACED_SCALES:
            scale = ""
        if scale:
            value = value.scaleb(SCALES[scale])
        out.append(
            Figure(
                text=found.group(0).strip(),
                value=value,
                digits=significant(plain),
                percent=bool(found.group("pct")),
                money=bool(found.group("cur") or found.group("cur2")),
                scaled=bool(scale),
                decimal="." in plain or bool(found.group("exp")),
                grouped="," in raw,
            )
        )
    return out


def round_to(value: Decimal, digits: int, rounding: str) -> Decimal:
    """`value` at `digits` significant figures."""
    if value == 0:
        return value
    quantum = Decimal(1).scaleb(value.adjusted() - digits + 1)
    return value.quantize(quantum, rounding=rounding)


def _forms(value: Decimal, percent: bool) -> list[Decimal]:
    # A ratio and its percent are one figure: 0.1493 is 14.93 %, 15 % is 0.15.
    forms = [value]
    if percent:
        forms.append(value.scaleb(-2))
    elif 0 < abs(value) < 1:
        forms.append(value.scaleb(2))
    return forms


def same_figure(written: Figure, golden: Decimal, golden_digits: int) -> bool:
    """Whether `written` states `golden`: at the coarser of the two precisions (at least
    `MIN_DIGITS` significant figures) they round to the same number, either way of rounding a
    half, a ratio read as its percent and a percent as its ratio. Magnitudes are compared: a
    fall is said in words as often as with a sign (`fell by 28,422` states -28421.78)."""
    digits = min(written.digits, golden_digits)
    if digits < MIN_DIGITS:
        return False
    for w in _forms(abs(written.value), written.percent):
        for g in _forms(abs(golden), False):
            if w == 0 or g == 0 or w.adjusted() - g.adjusted() not in (-1, 0, 1):
                continue
            for rounding in (ROUND_HALF_UP, ROUND_HALF_EVEN):
                if round_to(w, digits, rounding) == round_to(g, digits, rounding):
                    return True
    return False


# --- periods ------------------------------------------------------------------------------

MONTHS: dict[str, int] = {
    **{name.lower(): i for i, name in enumerate(calendar.month_name) if name},
    **{name.lower(): i for i, name in enumerate(calendar.month_abbr) if name},
    "sept": 9,
}
_MONTH_WORD = "|".join(sorted(MONTHS, key=len, reverse=True))
_NAMED = re.compile(
    rf"\b(?P<mon>{_MONTH_WORD})\b\.?(?:\s+\d{{1,2}}(?:st|nd|rd|th)?,?)?"
    rf"(?:\s+(?:of\s+)?(?P<year>(?:19|20)\d\d)\b)?",
    re.IGNORECASE,
)
_DAY_FIRST = re.compile(
    rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?P<mon>{_MONTH_WORD})\b\.?,?\s+(?P<year>(?:19|20)\d\d)\b",
    re.IGNORECASE,
)
_ISO = re.compile(r"(?<![\d-])(?P<year>(?:19|20)\d\d)[-/.](?P<mon>0?[1-9]|1[0-2])(?![\d])")
_US = re.compile(r"(?<![\d/])(?P<mon>0?[1-9]|1[0-2])/(?:\d{1,2}/)?(?P<year>(?:19|20)\d\d)\b")
AMBIGUOUS_MONTHS = frozenset({"may", "march", "mar", "jan", "sat"})
"""Month words that are also common words: read as a month only with a year beside them."""


@dataclass(frozen=True)
class Period:
    """A month as a text names it; `year` None when it is named alone."""

    month: int
    year: int | None
    text: str


def periods_in(text: str) -> list[Period]:
    """Every month a text names, with its year where one is written beside it."""
    out = []
    for pattern in (_DAY_FIRST, _NAMED, _ISO, _US):
        for found in pattern.finditer(text):
            raw = found.group("mon")
            year = int(found.group("year")) if found.group("year") else None
            if raw.isdigit():
                month = int(raw)
            else:
                if year is None and (raw.lower() in AMBIGUOUS_MONTHS or not raw[0].isupper()):
                    continue
                month = MONTHS[raw.lower()]
            out.append(Period(month, year, found.group(0)))
    return out


# --- sentences ----------------------------------------------------------------------------

_ABBREVIATED = re.compile(rf"\b({_MONTH_WORD}|no|approx|e\.g|i\.e|etc)\.", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+|(?<=\")\s*,\s*(?=\")")


def sentences(text: str) -> list[str]:
    """`text` cut where a sentence (or a JSON string) ends; a decimal point never cuts."""
    text = _ABBREVIATED.sub(lambda m: m.group(1), text)
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def changed_sentences(before: str, after: str) -> list[str]:
    """The sentences of `after` that `before` does not hold as they are: where an edit wrote."""
    old = set(sentences(before))
    return [s for s in sentences(after) if s not in old]
