"""Ranked retrieval over a semantic model's entities (the embedded context tool's search).

Lexical BM25 (the `rank_bm25` library) over one document per entity: its name (repeated, a
boost, as Publisher's lunr index boosts `name`), its aliases, its source and its doc.
snake_case / camelCase names are split into words so that "order status" finds
`order_status`. Then every part inherits a share of its source's score, so that when a
question is plainly about one source, that source's parts outrank same-named parts of others.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel

__all__ = ["EntityIndex", "RankedEntity", "index_for", "rank", "tokenize"]

NAME_BOOST = 3
# Aliases already appear once in the entity's doc ("Also called: ..."); this adds them again.
ALIAS_BOOST = 1
# Share of its source entity's BM25 score that a matching part (dimension, measure, join,
# view) inherits. Anything in 0.1-0.5 gave the same dev-split recall; 0.25 sits in the middle.
SOURCE_SHARE = 0.25
KIND_ORDER = {"source": 0, "view": 1, "measure": 2, "dimension": 3, "join": 4}
# Function words and question scaffolding: they carry no meaning in a question about data.
# Words such as "total", "count", "average", "never" or "each" are kept on purpose: they
# separate measures from dimensions or change what is counted.
STOP_WORDS = frozenset(
    """a about after also an and any are as at be been before being but by can could did do
    does for from had has have he her his how i if in into is it its just me more most much
    my of on only or our over please same she should show so some such tell than that the
    their them then there these they this those to too us very was we were what when where
    which while who whom why will with would yet you your give many still""".split()
)
# Irregular forms a suffix stripper cannot reach, and the words that all mean count(DISTINCT).
LEMMAS = {
    "sold": "sell",
    "bought": "buy",
    "paid": "pay",
    "spent": "spend",
    "took": "take",
    "brought": "bring",
    "kept": "keep",
    "sent": "send",
    "lost": "lose",
    "made": "make",
    "different": "distinct",
    "unique": "distinct",
}
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NON_WORD = re.compile(r"[^a-z0-9]+")


class EntityLike(Protocol):
    """What retrieval needs from an entity (`pytest_evalloop.embedded.model.Entity` fits).

    An `aliases` attribute (a list of strings) is used when present.
    """

    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def doc(self) -> str: ...


class RankedEntity(BaseModel):
    """One retrieval hit; `rank` starts at 1."""

    id: str
    kind: str
    name: str
    source: str
    doc: str
    rank: int
    score: float


def stem(word: str) -> str:
    """A light suffix stripper, the same on both sides of the match.

    Plurals (categories -> category, orders -> order), then -ing / -ed / -ment with a doubled
    consonant undone (shipping, shipped, shipment -> ship), then a final -e (created, create ->
    creat). Crude next to Porter, but it makes question wording meet doc wording.
    """
    if word in LEMMAS:
        return LEMMAS[word]
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "xes", "ches", "shes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ed", "ment"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            if _doubled(word):
                word = word[:-1]
            break
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


def _doubled(word: str) -> bool:
    # shipp -> ship, but sell / fill / pass keep their pair; long -ll words (cancell) drop it.
    if len(word) < 4 or word[-1] != word[-2] or word[-1] in "aeious":
        return False
    return word[-1] != "l" or len(word) >= 6


def tokenize(text: str) -> list[str]:
    """Lowercase words with identifiers split, punctuation and stop words dropped, stemmed."""
    spaced = _CAMEL.sub(" ", text or "")
    words = _NON_WORD.split(spaced.lower())
    return [stem(w) for w in words if w and w not in STOP_WORDS]


def _aliases(entity: EntityLike) -> list[str]:
    return list(getattr(entity, "aliases", None) or [])


def _document(entity: EntityLike) -> list[str]:
    name = tokenize(entity.name)
    aliases = [t for alias in _aliases(entity) for t in tokenize(alias)]
    return (
        name * NAME_BOOST + aliases * ALIAS_BOOST + tokenize(entity.source) + tokenize(entity.doc)
    )


class EntityIndex:
    """A BM25 index over one model's entities, built once and queried many times."""

    def __init__(self, entities: Sequence[EntityLike]) -> None:
        from rank_bm25 import BM25Okapi

        # Sort once so that equal scores always come back in the same order.
        self.entities = sorted(entities, key=lambda e: (KIND_ORDER.get(e.kind, 9), e.id))
        corpus = [_document(e) for e in self.entities]
        # BM25Okapi divides by the average document length; an empty model would divide by 0.
        self._bm25 = BM25Okapi(corpus) if any(corpus) else None

    def rank(self, query: str, *, source: str | None = None, limit: int = 10) -> list[RankedEntity]:
        """Entities matching `query`, best first; empty query lists sources (or one source's entities)."""
        terms = tokenize(query)
        if not terms:
            return self._listing(source, limit)
        if self._bm25 is None:
            return []
        scores = self._scores(terms)
        scored = [
            (score, position)
            for position, score in enumerate(scores)
            if score > 0 and _in_source(self.entities[position], source)
        ]
        scored.sort(key=lambda pair: (-pair[0], pair[1]))
        return [
            _ranked(self.entities[position], rank, score)
            for rank, (score, position) in enumerate(scored[:limit], start=1)
        ]

    def _scores(self, terms: list[str]) -> list[float]:
        """BM25 per entity, plus a share of its source's score for each part that matched."""
        assert self._bm25 is not None
        raw = [float(x) for x in self._bm25.get_scores(terms)]
        by_source = {e.source: raw[i] for i, e in enumerate(self.entities) if e.kind == "source"}
        # Only parts that matched by themselves inherit: the source lifts, it never adds hits.
        return [
            score + SOURCE_SHARE * by_source.get(e.source, 0.0)
            if score > 0 and e.kind != "source"
            else score
            for score, e in zip(raw, self.entities, strict=True)
        ]

    def _listing(self, source: str | None, limit: int) -> list[RankedEntity]:
        if source is None:
            chosen = [e for e in self.entities if e.kind == "source"]
        else:
            chosen = [e for e in self.entities if _in_source(e, source)]
        return [_ranked(e, rank, 0.0) for rank, e in enumerate(chosen[:limit], start=1)]

    def sources(self) -> list[str]:
        """Names of the model's sources, in index order."""
        return sorted({e.source for e in self.entities})


def _in_source(entity: EntityLike, source: str | None) -> bool:
    return source is None or entity.source.lower() == source.lower()


def _ranked(entity: EntityLike, rank: int, score: float) -> RankedEntity:
    return RankedEntity(
        id=entity.id,
        kind=entity.kind,
        name=entity.name,
        source=entity.source,
        doc=entity.doc,
        rank=rank,
        score=round(score, 6),
    )


_INDEXES: dict[str, EntityIndex] = {}
_INDEXES_LOCK = threading.Lock()


def index_for(entities: Sequence[EntityLike]) -> EntityIndex:
    """The cached index for this exact list of entities (keyed by ids, names, docs, aliases)."""
    digest = hashlib.sha256()
    for e in entities:
        parts = [e.id, e.kind, e.source, e.name, e.doc, *_aliases(e)]
        digest.update("\x1f".join(parts).encode())
        digest.update(b"\x1e")
    key = digest.hexdigest()
    with _INDEXES_LOCK:
        index = _INDEXES.get(key)
        if index is None:
            index = _INDEXES[key] = EntityIndex(entities)
        return index


def rank(
    query: str, entities: Sequence[EntityLike], *, source: str | None = None, limit: int = 10
) -> list[RankedEntity]:
    """Rank `entities` against `query`, best first, `rank` starting at 1."""
    return index_for(entities).rank(query, source=source, limit=limit)
