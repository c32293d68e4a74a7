"""Mechanical evidence and failure shapes (seed 004, eval-diagnose steps 1 and 3), on crafted
attempts: pure functions, no model call."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalloop.diagnose import evidence as ev
from pytest_evalloop.diagnose.shapes import failure_shapes, golden_rows
from pytest_evalloop.ledger import contract as ledger
from pytest_evalloop.sets import cases as sets

STATUS = [
    {"status": "Complete", "orders": 54749},
    {"status": "Cancelled", "orders": 10825},
    {"status": "Returned", "orders": 5681},
    {"status": "Shipped", "orders": 928},
]


def names(gold: list[dict[str, Any]], pred: list[dict[str, Any]], **kw: Any) -> set[str]:
    return {s.shape for s in failure_shapes(gold, pred, **kw)}


def test_agreeing_rows_have_no_shape() -> None:
    assert names(STATUS, list(reversed(STATUS))) == set()


def test_row_count_and_superset() -> None:
    extra = [*STATUS, {"status": "Processing", "orders": 299}]
    assert names(STATUS, extra) == {"row_count", "superset"}


def test_subset() -> None:
    assert names(STATUS, STATUS[:2]) == {"row_count", "subset"}


def test_a_clean_integer_multiple_is_fanout() -> None:
    doubled = [{"status": r["status"], "orders": r["orders"] * 3} for r in STATUS]
    shapes = failure_shapes(STATUS, doubled)
    assert {s.shape for s in shapes} == {"integer_multiple"}
    assert "x 3" in shapes[0].detail and "fanout" in shapes[0].look_here


def test_same_keys_other_values() -> None:
    other = [
        {"status": r["status"], "orders": r["orders"] + 7 * i + 1} for i, r in enumerate(STATUS)
    ]
    assert names(STATUS, other) == {"same_keys_other_values"}


def test_right_keys_wrong_aggregates_on_a_minority() -> None:
    one_off = [dict(r) for r in STATUS]
    one_off[1]["orders"] += 17
    assert names(STATUS, one_off) == {"minority_differ"}


def test_extremes_match_means_differ() -> None:
    gold = [{"day": d, "n": v} for d, v in zip("abcd", [1, 5, 6, 10], strict=True)]
    pred = [{"day": d, "n": v} for d, v in zip("abcd", [1, 2, 3, 10], strict=True)]
    assert "extremes_match_means_differ" in names(gold, pred)


def test_identical_high_precision_values_across_keys() -> None:
    gold = [{"brand": "a", "sales": 123.45}, {"brand": "b", "sales": 99.1}]
    pred = [{"brand": "a", "sales": 4821.77}, {"brand": "b", "sales": 4821.77}]
    assert "identical_values" in names(gold, pred)


def test_a_magnitude_that_cannot_be_true() -> None:
    assert "implausible_magnitude" in names([{"n": 4712}], [{"n": 4712 * 5000 + 3}])


def test_columns_pair_by_the_judges_pairing_and_by_position() -> None:
    gold = [{"accounts_without_orders": 4712}]
    assert names(gold, [{"n": 4712}]) == set()
    assert names(gold, [{"x": 1, "n": 9424}], pairing={"accounts_without_orders": "n"}) == {
        "integer_multiple"
    }


def test_a_scalar_golden_is_one_row() -> None:
    assert golden_rows("scalar", {"n": 3}) == [{"n": 3}]
    assert golden_rows("scalar", 3) == [{"value": 3}]
    assert golden_rows("unanswerable", None) is None


rows = st.lists(
    st.tuples(st.text("abcdefgh", min_size=1, max_size=4), st.integers(1, 10**6)),
    min_size=1,
    max_size=8,
    unique_by=lambda t: t[0],
)


@given(rows)
def test_rows_always_agree_with_themselves(data: list[tuple[str, int]]) -> None:
    gold = [{"k": k, "v": v} for k, v in data]
    assert failure_shapes(gold, list(reversed(gold))) == []


@given(rows, st.integers(2, 50))
def test_every_integer_multiple_is_found(data: list[tuple[str, int]], k: int) -> None:
    gold = [{"k": key, "v": v} for key, v in data]
    pred = [{"k": key, "v": v * k} for key, v in data]
    assert "integer_multiple" in names(gold, pred)


@given(rows, rows)
def test_extra_rows_are_a_superset(
    data: list[tuple[str, int]], more: list[tuple[str, int]]
) -> None:
    gold = [{"k": k, "v": v} for k, v in data]
    extra = [{"k": "z" + k, "v": v} for k, v in more]
    assert {"row_count", "superset"} <= names(gold, gold + extra)


# --- the evidence of one attempt ---------------------------------------------------------

CASE = sets.Case.model_validate(
    {
        "qid": "q1",
        "question": "Revenue by channel?",
        "split": "dev",
        "golden": {
            "status": "verified",
            "kind": "rows",
            "value": [{"traffic_source": "Search", "revenue": 10.0}],
            "mustNotUse": ["order_item_count"],
        },
        "expectedEntities": {
            "required": ["dimension:users:traffic_source", "join:order_items:users"],
            "requiredAnyOf": [["measure:order_items:total_sales", "measure:order_items:net_sales"]],
        },
    }
)


def attempt(**kw: Any) -> ledger.AttemptEvent:
    data: dict[str, Any] = {
        "qid": "q1",
        "sample": None,
        "phase": "baseline",
        "question_sha": "x",
        "submitted": True,
        "final_query": "SELECT traffic_source, sum(order_item_count) FROM order_items JOIN users",
        "n_get_context": 1,
        "n_execute": 2,
        "n_execute_errors": 1,
    }
    return ledger.AttemptEvent.model_validate({**data, **kw})


def calls() -> list[ledger.ToolCallEvent]:
    base = {"qid": "q1", "sample": None, "phase": "baseline"}
    return [
        ledger.ToolCallEvent.model_validate(
            {
                **base,
                "tool": "get_context",
                "role": "context",
                "seq": 1,
                "traceId": "t1",
                "targets": ["revenue by channel"],
                "rankedSummary": {
                    "entityIds": [
                        "measure:order_items:total_sales",
                        "dimension:users:traffic_source",
                    ],
                    "ranks": [1, 4],
                    "resultCount": 10,
                },
            }
        ),
        ledger.ToolCallEvent.model_validate(
            {**base, "tool": "execute_query", "role": "query", "seq": 2, "error": "no column x"}
        ),
    ]


def retrieval() -> ledger.RetrievalScoreEvent:
    return ledger.RetrievalScoreEvent.model_validate(
        {
            "qid": "q1",
            "entities": [
                {
                    "id": "dimension:users:traffic_source",
                    "delivery": "exact",
                    "rank": 4,
                    "group": None,
                },
                {
                    "id": "join:order_items:users",
                    "delivery": "missing",
                    "rank": None,
                    "group": None,
                },
                {
                    "id": "measure:order_items:total_sales",
                    "delivery": "exact",
                    "rank": 1,
                    "group": 0,
                },
            ],
        }
    )


def score(**kw: Any) -> ledger.ScoreEvent:
    data = {"qid": "q1", "sample": None, "phase": "baseline", "verdict": "no_match", "reason": "r"}
    return ledger.ScoreEvent.model_validate({**data, **kw})


def gather(**kw: Any) -> ev.Evidence:
    args: dict[str, Any] = {
        "attempt": attempt(),
        "tool_calls": calls(),
        "score": score(),
        "retrieval": retrieval(),
        "case": CASE,
        "golden_value": CASE.golden.value if CASE.golden else None,
        "prediction": {"rows": [{"traffic_source": "Search", "revenue": 30.0}]},
        "transcript_kept": True,
    }
    return ev.gather(**{**args, **kw})


def test_what_was_asked_returned_used_and_left_unused() -> None:
    e = gather()
    assert [(a.seq, a.targets, a.result_count) for a in e.asked] == [
        (1, ["revenue by channel"], 10)
    ]
    needed = {n.id: n for n in e.needed}
    assert needed["dimension:users:traffic_source"].asked_by == 1
    assert needed["dimension:users:traffic_source"].used
    assert needed["join:order_items:users"].delivery == "missing"
    assert e.needed_unused == ["measure:order_items:total_sales"]
    assert e.used == ["dimension:users:traffic_source"]
    assert e.must_not_use_used == ["order_item_count"]
    assert e.query_errors == ["no column x"]
    assert [s.shape for s in e.shapes] == ["integer_multiple"]
    assert e.trace_ids == ["t1"]


def test_a_needed_entity_never_returned_is_insufficient_and_not_eligible() -> None:
    e = gather()
    assert (e.eligible, e.sufficiency) == (False, "insufficient")


def test_sufficiency_is_unknown_when_the_rendered_result_was_not_kept() -> None:
    delivered = retrieval().model_copy(
        update={"entities": [{**x, "delivery": "exact", "rank": 2} for x in retrieval().entities]}
    )
    assert gather(retrieval=delivered).sufficiency == "sufficient"
    unkept = gather(retrieval=delivered, transcript_kept=False)
    assert (unkept.eligible, unkept.sufficiency) == (True, "unknown")
    assert ev.eligibility([unkept, gather()]) == "1 / 2"


def test_not_submitted_on_an_answerable_case_is_a_refusal() -> None:
    e = gather(attempt=attempt(submitted=False, final_query=None), prediction=None)
    assert (e.submitted, e.refusal, e.shapes) == (False, "refusal_on_answerable", [])


def test_an_answer_on_an_absent_case() -> None:
    absent = CASE.model_copy(
        update={"golden": sets.Golden.model_validate({"kind": "unanswerable"})}
    )
    assert gather(case=absent, golden_value=None).refusal == "answer_on_absent"


def test_select_is_dev_only_and_routes_doubted_goldens_to_dataset() -> None:
    def case(qid: str, split: str) -> sets.Case:
        return sets.Case.model_validate({"qid": qid, "question": qid, "split": split})

    cases = {q: case(q, "holdout" if q == "h" else "dev") for q in "abcdefh"}
    scores = {
        ("a", None): score(qid="a"),
        ("b", None): score(qid="b", contaminated=True, verdict=None),
        ("c", None): score(qid="c", gold_status="verified_wrong"),
        ("d", None): score(qid="d", verdict="match"),
        ("e", None): score(qid="e", verdict=None, reason="not_submitted"),
        ("h", None): score(qid="h"),
    }
    attempts = {(q, None): attempt(qid=q) for q in "abcdefh"}
    attempts[("f", None)] = attempt(qid="f", error="endpoint down")
    chosen, skipped = ev.select(attempts, scores, cases)
    assert [(s.qid, s.route) for s in chosen] == [("a", "agent"), ("c", "dataset"), ("e", "agent")]
    assert skipped[("h", None)].startswith("holdout")
    assert skipped[("b", None)].startswith("contaminated")
    assert skipped[("f", None)].startswith("harness error")
    assert skipped[("d", None)] == "not a failure (match)"


@pytest.mark.parametrize(
    ("entity", "query", "used"),
    [
        ("source:users:users", "select * from users", True),
        ("dimension:users:age", "select age from users", True),
        ("dimension:users:age", "select age from orders", False),
        ("join:order_items:users", "order_items join users", True),
    ],
)
def test_uses(entity: str, query: str, used: bool) -> None:
    assert ev.uses(entity, ev.query_words(query)) is used
