"""Ranked retrieval over a semantic model's entities (the embedded context tool's search).

Lexical BM25 (Okapi, with the `rank_bm25` library's parameters and idf floor, scored exactly as
it scores) over one document per entity: its name (repeated, a boost, as Publisher's lunr index
boosts `name`), its aliases, its source and its doc.
snake_case / camelCase names are split into words so that "order status" finds
`order_status`. Then every part inherits a share of its source's score, so that when a
question is plainly about one source, that source's parts outrank same-named parts of others.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import math
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
    """What retrieval needs from an entity (`pytest_evalloop.targets.embedded.model.Entity` fits).

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


@functools.lru_cache(maxsize=8192)
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


# Okapi BM25 parameters, as rank_bm25.BM25Okapi's defaults: term-frequency saturation, length
# normalisation, and the floor (a share of the mean idf) for words in over half the documents.
OKAPI_K1 = 1.5
OKAPI_B = 0.75
OKAPI_EPSILON = 0.25


def okapi_postings(corpus: Sequence[Sequence[str]]) -> dict[str, list[tuple[int, float]]]:
    """Per word, the (document position, BM25 weight) of every document holding it.

    A query's score for a document is the sum, over the query's words in order, of that
    document's weight for the word: the same float operations in the same order as
    `rank_bm25.BM25Okapi.get_scores`, so the scores are bit for bit its scores (a document
    without the word gets +0.0 there, which changes nothing, so it is not stored). Computed
    once per index, this leaves a query a few dictionary lookups and additions.
    """
    counts: list[dict[str, int]] = []
    holders: dict[str, int] = {}  # word -> number of documents holding it, in first-seen order
    for document in corpus:
        frequencies: dict[str, int] = {}
        for word in document:
            frequencies[word] = frequencies.get(word, 0) + 1
        counts.append(frequencies)
        for word in frequencies:
            holders[word] = holders.get(word, 0) + 1
    size = len(corpus)
    average_length = sum(len(d) for d in corpus) / size
    idf = {w: math.log(size - n + 0.5) - math.log(n + 0.5) for w, n in holders.items()}
    floor = OKAPI_EPSILON * (sum(idf.values()) / len(idf))
    idf = {w: floor if value < 0 else value for w, value in idf.items()}
    postings: dict[str, list[tuple[int, float]]] = {}
    for position, (document, frequencies) in enumerate(zip(corpus, counts, strict=True)):
        norm = OKAPI_K1 * (1 - OKAPI_B + OKAPI_B * len(document) / average_length)
        for word, count in frequencies.items():
            weight = idf[word] * (count * (OKAPI_K1 + 1) / (count + norm))
            postings.setdefault(word, []).append((position, weight))
    return postings


class EntityIndex:
    """A BM25 index over one model's entities, built once and queried many times."""

    def __init__(self, entities: Sequence[EntityLike]) -> None:
        # Sort once so that equal scores always come back in the same order.
        self.entities = sorted(entities, key=lambda e: (KIND_ORDER.get(e.kind, 9), e.id))
        corpus = [_document(e) for e in self.entities]
        # Okapi divides by the average document length; an empty model would divide by 0.
        self._postings = okapi_postings(corpus) if any(corpus) else None
        # Position of each entity's source entity (-1 for a source, or a part whose source has
        # no entity), so a part's inherited share is one list lookup per query.
        self._sources = sorted({e.source for e in self.entities})
        source_at = {e.source: i for i, e in enumerate(self.entities) if e.kind == "source"}
        self._source_of = [
            -1 if e.kind == "source" else source_at.get(e.source, -1) for e in self.entities
        ]

    def rank(self, query: str, *, source: str | None = None, limit: int = 10) -> list[RankedEntity]:
        """Entities matching `query`, best first; empty query lists sources (or one source's entities)."""
        terms = tokenize(query)
        if not terms:
            return self._listing(source, limit)
        if self._postings is None:
            return []
        scores = self._scores(terms)
        # (-score, position) orders best first, ties by index order.
        scored = [(-score, position) for position, score in scores.items() if score > 0]
        if source is not None:
            scored = [pair for pair in scored if _in_source(self.entities[pair[1]], source)]
        best = heapq.nsmallest(limit, scored)
        return [
            _ranked(self.entities[position], rank, -negative)
            for rank, (negative, position) in enumerate(best, start=1)
        ]

    def _scores(self, terms: list[str]) -> dict[int, float]:
        """Score per entity holding a query word (the rest score 0), by position: BM25, plus a
        share of its source's BM25 for each part that matched."""
        assert self._postings is not None
        raw: dict[int, float] = {}
        for term in terms:
            for position, weight in self._postings.get(term, ()):
                raw[position] = raw.get(position, 0.0) + weight
        # Only parts that matched by themselves inherit: the source lifts, it never adds hits.
        source_of = self._source_of
        return {
            position: score + SOURCE_SHARE * raw.get(source_of[position], 0.0)
            if score > 0 and source_of[position] >= 0
            else score
            for position, score in raw.items()
        }

    def _listing(self, source: str | None, limit: int) -> list[RankedEntity]:
        if source is None:
            chosen = [e for e in self.entities if e.kind == "source"]
        else:
            chosen = [e for e in self.entities if _in_source(e, source)]
        return [_ranked(e, rank, 0.0) for rank, e in enumerate(chosen[:limit], start=1)]

    def sources(self) -> list[str]:
        """Names of the model's sources, in index order."""
        return list(self._sources)


def _in_source(entity: EntityLike, source: str | None) -> bool:
    return source is None or entity.source.lower() == source.lower()


def _ranked(entity: EntityLike, rank: int, score: float) -> RankedEntity:
    # Unvalidated construction: every field is a str, int or float already (an entity's
    # fields are validated strings), and this runs for every hit of every context call.
    return RankedEntity.model_construct(
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
