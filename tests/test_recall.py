"""Retrieval score: delivery routes per expected entity, recall and strict recall."""

from __future__ import annotations

import pytest

from pytest_evalloop.answer.recall import EntityDelivery, result_id, score_retrieval
from pytest_evalloop.roles.contract import ContextResult


def hit(
    kind: str, source: str, name: str, rank: int, doc: str = "", id: str | None = None
) -> ContextResult:
    return ContextResult(id=id, kind=kind, source=source, name=name, doc=doc, rank=rank)


def test_nothing_expected_has_no_recall() -> None:
    for expected in (None, {}, {"required": [], "requiredAnyOf": [[]], "acceptable": ["x:y:z"]}):
        score = score_retrieval(expected, [hit("measure", "orders", "total", 1)])
        assert (score.required, score.delivered, score.recall, score.strict_recall) == (
            0,
            0,
            None,
            None,
        )
        assert score.entities == []


def test_ids_are_derived_when_the_server_sends_none() -> None:
    assert result_id(hit("measure", "orders", "total_sales", 1)) == "measure:orders:total_sales"
    assert result_id(hit("measure", "orders", "total_sales", 1, id="m-17")) == "m-17"


def test_each_route_in_order() -> None:
    returned = [
        hit("measure", "order_items", "total_sales", 2),
        hit("dimension", "users_v2", "state", 1),
        hit(
            "source",
            "order_items",
            "order_items",
            3,
            doc="Line items. Use order_items.status for state.",
        ),
    ]
    expected = {
        "required": [
            "measure:order_items:total_sales",  # exact (derived id)
            "dimension:users:state",  # sibling source users_v2
            "dimension:order_items:status",  # named in the source's doc
            "measure:order_items:margin",  # nowhere
        ]
    }
    score = score_retrieval(expected, returned)
    assert [(e.delivery, e.rank) for e in score.entities] == [
        ("exact", 2),
        ("sibling_source", 1),
        ("named_in_doc", 3),
        ("missing", None),
    ]
    assert (score.required, score.delivered) == (4, 3)
    assert score.recall == pytest.approx(0.75)
    assert score.strict_recall == pytest.approx(0.25)


def test_exact_beats_sibling_and_best_rank_wins() -> None:
    returned = [
        hit("measure", "other", "total", 1),
        hit("measure", "orders", "total", 5),
        hit("measure", "orders", "total", 3),
    ]
    score = score_retrieval({"required": ["measure:orders:total"]}, returned)
    assert score.entities == [
        EntityDelivery(id="measure:orders:total", delivery="exact", rank=3, group=None)
    ]


def test_sibling_route_needs_the_same_kind() -> None:
    returned = [hit("dimension", "other", "total", 1)]
    score = score_retrieval({"required": ["measure:orders:total"]}, returned)
    assert score.entities[0].delivery == "missing"


def test_named_in_doc_is_a_whole_word() -> None:
    returned = [
        hit("measure", "orders", "total_sales_2022", 1, doc="see total_sales_2022 and sales_tax")
    ]
    score = score_retrieval({"required": ["measure:orders:sales"]}, returned)
    assert score.entities[0].delivery == "missing"
    returned = [hit("source", "orders", "orders", 1, doc="Revenue is `sales`, net of tax.")]
    assert score_retrieval({"required": ["measure:orders:sales"]}, returned).recall == 1.0


def test_required_any_of_counts_each_group_once() -> None:
    returned = [hit("measure", "orders", "a", 1), hit("measure", "orders", "b", 2)]
    expected = {
        "required": ["measure:orders:a"],
        "requiredAnyOf": [
            ["measure:orders:b", "measure:orders:c"],  # one member delivered: group delivered
            ["measure:orders:a", "measure:orders:b"],  # both delivered: still one unit
            ["measure:orders:x", "measure:orders:y"],  # none delivered
        ],
    }
    score = score_retrieval(expected, returned)
    assert (score.required, score.delivered) == (4, 3)
    assert score.recall == pytest.approx(0.75)
    assert [(e.id, e.group, e.delivery) for e in score.entities] == [
        ("measure:orders:a", None, "exact"),
        ("measure:orders:b", 0, "exact"),
        ("measure:orders:c", 0, "missing"),
        ("measure:orders:a", 1, "exact"),
        ("measure:orders:b", 1, "exact"),
        ("measure:orders:x", 2, "missing"),
        ("measure:orders:y", 2, "missing"),
    ]


def test_strict_recall_counts_only_exact_deliveries_per_unit() -> None:
    returned = [hit("measure", "v2", "a", 1), hit("measure", "orders", "b", 2)]
    expected = {
        "required": ["measure:orders:a"],
        "requiredAnyOf": [["measure:orders:b", "measure:orders:z"]],
    }
    score = score_retrieval(expected, returned)
    assert score.recall == 1.0
    assert score.strict_recall == pytest.approx(0.5)


def test_duplicate_required_ids_count_once() -> None:
    score = score_retrieval({"required": ["measure:o:a", "measure:o:a"]}, [])
    assert (score.required, score.delivered, score.recall) == (1, 0, 0.0)


def test_precision_counts_required_any_of_and_acceptable_as_wanted() -> None:
    expected = {
        "required": ["measure:orders:total"],
        "requiredAnyOf": [["dimension:orders:status", "dimension:items:status"]],
        "acceptable": ["source:orders:orders"],
    }
    returned = [
        hit("measure", "orders", "total", 1),
        hit("measure", "orders", "total", 3),  # the same entity twice is one entity
        hit("dimension", "items", "status", 2),
        hit("source", "orders", "orders", 4),
        hit("measure", "orders", "margin", 5),  # noise
    ]
    score = score_retrieval(expected, returned)
    assert (score.returned, score.noise) == (4, 1)
    assert score.precision == 3 / 4
    assert score.recall == 1.0


def test_a_sibling_alias_delivers_for_recall_but_is_noise_for_precision() -> None:
    score = score_retrieval(
        {"required": ["measure:orders:total"]}, [hit("measure", "x", "total", 1)]
    )
    assert (score.recall, score.precision, score.noise) == (1.0, 0.0, 1)


def test_nothing_returned_has_no_precision() -> None:
    score = score_retrieval({"required": ["measure:orders:total"]}, [])
    assert (score.precision, score.noise, score.returned, score.recall) == (None, 0, 0, 0.0)


def test_absent_coverage_has_neither_recall_nor_precision() -> None:
    returned = [hit("measure", "orders", "total", 1), hit("measure", "orders", "other", 2)]
    score = score_retrieval({"required": ["measure:orders:total"]}, returned, "absent")
    assert (score.recall, score.precision, score.required) == (None, None, 0)
    assert (score.returned, score.noise) == (2, 1)
    assert (
        score_retrieval({"required": ["measure:orders:total"]}, returned, "covered").recall == 1.0
    )
