"""Retrieval score: which of the entities a case depends on reached the answerer.

Per attempt, over everything the attempt's context-tool calls returned. An expected entity
was delivered by the first route that holds, in this order:

- ``exact``: a returned entity has its id;
- ``sibling_source``: a returned entity has the same kind and name on another source;
- ``named_in_doc``: its name appears, as a whole word, in the doc of a returned entity;
- ``missing``: none of these. Only this is a retrieval miss.

``required`` ids count one each; each ``requiredAnyOf`` group counts once, delivered when any
member is. ``strict_recall`` counts exact deliveries only, so the lenient number never hides
the strict one.

Precision asks the other question: of the distinct entities the attempt was handed, how many
were wanted? Wanted is ``required`` ∪ every ``requiredAnyOf`` member ∪ ``acceptable``, matched
on the exact id (an alias on a sibling source is a delivery route for recall, but it is still
one more entity in the answerer's context). ``noise`` counts the rest. Precision is None when
nothing was returned. A case whose ``coverage`` is ``absent`` has nothing to retrieve: its
recall and precision are None (the model lacks the entity; that is not a retrieval failure).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel

from pytest_evalloop.roles.contract import ContextResult

Delivery = Literal["exact", "sibling_source", "named_in_doc", "missing"]


class EntityDelivery(BaseModel):
    """How one expected entity reached the answerer; ``group`` indexes requiredAnyOf."""

    id: str
    delivery: Delivery
    rank: int | None
    group: int | None


class RetrievalScore(BaseModel):
    """Entity recall and precision for one attempt; recall is None when the case expects
    nothing, precision when nothing was returned."""

    required: int
    delivered: int
    recall: float | None
    entities: list[EntityDelivery]
    strict_recall: float | None
    returned: int = 0
    """Distinct entity ids the attempt's context calls returned."""
    precision: float | None = None
    noise: int = 0
    """Returned entities outside required ∪ requiredAnyOf ∪ acceptable."""


def result_id(r: ContextResult) -> str:
    """The entity id of a returned result: its own, else ``kind:source:name``."""
    return r.id or f"{r.kind}:{r.source}:{r.name}"


def _kind_and_name(entity_id: str) -> tuple[str, str]:
    parts = entity_id.split(":")
    return parts[0].casefold(), parts[-1].casefold()


def _best_rank(results: list[ContextResult]) -> int | None:
    return min((r.rank for r in results), default=None)


def _named_in(name: str, doc: str) -> bool:
    if name not in doc.casefold():
        return False  # the usual answer, without compiling and running a pattern
    # A word, not a substring: `sales` must not be found inside `total_sales_2022`.
    pattern = rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])"
    return re.search(pattern, doc, flags=re.IGNORECASE) is not None


def _deliver(entity_id: str, returned: list[ContextResult], group: int | None) -> EntityDelivery:
    """Find the first route by which ``entity_id`` was delivered."""
    wanted = entity_id.casefold()
    kind, name = _kind_and_name(entity_id)
    # The routes in order of preference, each tried only when the ones before found nothing.
    routes: list[tuple[Delivery, Callable[[ContextResult], bool]]] = [
        ("exact", lambda r: result_id(r).casefold() == wanted),
        ("sibling_source", lambda r: (r.kind.casefold(), r.name.casefold()) == (kind, name)),
        ("named_in_doc", lambda r: bool(name) and _named_in(name, r.doc)),
    ]
    for delivery, delivers in routes:
        hits = [r for r in returned if delivers(r)]
        if hits:
            return EntityDelivery(
                id=entity_id, delivery=delivery, rank=_best_rank(hits), group=group
            )
    return EntityDelivery(id=entity_id, delivery="missing", rank=None, group=group)


def _units(expected: dict[str, Any]) -> list[tuple[int | None, list[str]]]:
    """The counted units: each required id alone (group None), each non-empty group once."""
    units: list[tuple[int | None, list[str]]] = [
        (None, [i]) for i in dict.fromkeys(expected.get("required") or [])
    ]
    for index, group in enumerate(expected.get("requiredAnyOf") or []):
        if group:
            units.append((index, list(dict.fromkeys(group))))
    return units


def _wanted(expected: dict[str, Any]) -> set[str]:
    ids = list(expected.get("required") or []) + list(expected.get("acceptable") or [])
    for group in expected.get("requiredAnyOf") or []:
        ids += group or []
    return {i.casefold() for i in ids}


def score_retrieval(
    expected: dict[str, Any] | None, returned: list[ContextResult], coverage: str | None = None
) -> RetrievalScore:
    """Score one attempt's retrieval against the case's ``expectedEntities``."""
    expected = expected or {}
    distinct = {result_id(r).casefold() for r in returned}
    noise = len(distinct - _wanted(expected))
    if coverage == "absent":
        return RetrievalScore(
            required=0, delivered=0, recall=None, entities=[], strict_recall=None,
            returned=len(distinct), precision=None, noise=noise,
        )  # fmt: skip
    units = _units(expected)
    entities: list[EntityDelivery] = []
    delivered = strict = 0
    for group, ids in units:
        found = [_deliver(i, returned, group) for i in ids]
        entities += found
        delivered += any(f.delivery != "missing" for f in found)
        strict += any(f.delivery == "exact" for f in found)
    total = len(units)
    return RetrievalScore(
        required=total,
        delivered=delivered,
        recall=delivered / total if total else None,
        entities=entities,
        strict_recall=strict / total if total else None,
        returned=len(distinct),
        precision=(len(distinct) - noise) / len(distinct) if distinct else None,
        noise=noise,
    )
