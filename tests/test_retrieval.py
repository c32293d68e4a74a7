"""Retrieval quality of the embedded context tool: tokenising, aliases, the source share, recall."""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest

from pytest_evalloop.targets.embedded.model import ModelFileError, SemanticModel
from pytest_evalloop.targets.embedded.retrieval import EntityIndex, index_for, rank, tokenize

ROOT = Path(__file__).resolve().parent.parent
ECOMMERCE = ROOT / "evals" / "ecommerce"


@dataclass(frozen=True)
class Ent:
    """A bare EntityLike, so retrieval is tested apart from the model file format."""

    kind: str
    source: str
    name: str
    doc: str
    aliases: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.source}:{self.name}"


def _model(**measure_extra: Any) -> dict[str, Any]:
    measure = {"name": "total_sales", "doc": "Sum of sale price.", "sql": "sum(amount)"}
    return {
        "name": "m",
        "doc": "A shop.",
        "sources": [
            {
                "name": "orders",
                "doc": "One row per order.",
                "grain": "order",
                "from": "orders",
                "aliases": ["checkouts"],
                "dimensions": [{"name": "amount", "doc": "Order amount.", "aliases": ["value"]}],
                "measures": [measure | measure_extra],
            }
        ],
    }


def _load(tmp_path: Path, payload: dict[str, Any]) -> SemanticModel:
    path = tmp_path / "model.json"
    path.write_text(json.dumps(payload), encoding="utf-8")
    return SemanticModel.load(path)


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "retrieval_recall", ROOT / "bench" / "retrieval_recall.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_irregular_forms_and_distinct_words_meet_their_stems() -> None:
    assert tokenize("units sold") == tokenize("unit sell") == ["unit", "sell"]
    assert tokenize("How many different customers?") == ["distinct", "customer"]
    assert tokenize("unique buyers") == ["distinct", "buyer"]
    # "list" is a data word (list price), not scaffolding; "still" and "than" are.
    assert tokenize("still more than the list price") == tokenize("list price")
    assert tokenize("list price")[0] == "list"


def test_aliases_load_show_in_the_doc_and_reach_the_entity(tmp_path: Path) -> None:
    model = _load(tmp_path, _model(aliases=["revenue", " bookings ", "revenue"]))
    entity = model.entity("measure:orders:total_sales")
    assert entity is not None
    assert entity.aliases == ["revenue", "bookings"]
    assert entity.doc == "Sum of sale price. Also called: revenue, bookings."
    source = model.entity("source:orders:orders")
    assert source is not None and source.aliases == ["checkouts"]
    assert "Also called: checkouts." in source.doc
    plain = model.entity("dimension:orders:amount")
    assert plain is not None and plain.doc == "Order amount. Also called: value."
    assert "Also called: revenue, bookings." in model.definitions_for([entity.id])


def test_an_empty_alias_is_an_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"sources\.0\.measures\.0\.aliases: .*non-empty"):
        _load(tmp_path, _model(aliases=["revenue", "  "]))


def test_an_alias_alone_makes_a_part_findable() -> None:
    bare = [
        Ent("measure", "orders", "total_sales", "Sum of sale price."),
        Ent("measure", "orders", "order_count", "Number of orders."),
        Ent("dimension", "orders", "status", "Lifecycle status."),
        Ent("dimension", "orders", "created_at", "When the order was placed."),
    ]
    # BM25's idf is 0 for a word in half of a tiny corpus, hence four entities here.
    aliased = [replace(bare[0], aliases=["bookings"]), *bare[1:]]
    assert rank("bookings last year", bare) == []
    hits = rank("bookings last year", aliased)
    assert [h.id for h in hits] == ["measure:orders:total_sales"]
    # The cache key covers aliases: the two lists must not share an index.
    assert index_for(bare) is not index_for(aliased)


def test_a_part_inherits_a_share_of_its_source_score() -> None:
    entities = [
        Ent("source", "orders", "orders", "One row per checkout."),
        Ent("source", "returns", "returns", "One row per refund request."),
        Ent("dimension", "orders", "status", "Lifecycle status."),
        Ent("dimension", "returns", "status", "Lifecycle status."),
        Ent("dimension", "returns", "reason", "Why it came back."),
    ]
    hits = rank("refund status", entities)
    ids = [h.id for h in hits]
    # Equal on their own; the id tie-break alone would put orders first.
    assert ids.index("dimension:returns:status") < ids.index("dimension:orders:status")
    assert hits[0].id == "source:returns:returns"
    # The source lifts parts that matched; it adds no part that matched nothing.
    assert "dimension:returns:reason" not in ids


def test_empty_index_and_unmatched_query_return_nothing() -> None:
    assert EntityIndex([]).rank("anything") == []
    assert rank("zebra quantum", [Ent("dimension", "orders", "status", "Status.")]) == []


def _shingles(text: str, n: int) -> set[str]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_example_aliases_are_not_lifted_from_case_questions() -> None:
    model = SemanticModel.load(ECOMMERCE / "model.json")
    questions = [
        json.loads(line)["question"]
        for line in (ECOMMERCE / "cases.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    question_runs = set().union(*(_shingles(q, 3) for q in questions))
    aliases = [a for e in model.entities() for a in e.aliases]
    assert len(aliases) > 50
    lifted = [a for a in aliases if _shingles(a, 3) & question_runs]
    assert lifted == []


def test_bench_report_splits_and_counts_any_of_groups() -> None:
    bench = _bench()
    rows = [
        {"qid": "a", "split": "dev", "ranks": {"x": 1, "y": 7}, "any_of": [3]},
        {"qid": "b", "split": "holdout", "ranks": {"z": None}, "any_of": []},
    ]
    figures = bench.report(rows)
    assert figures["dev"]["recall@5"] == 0.5 and figures["dev"]["recall@10"] == 1.0
    assert figures["dev"]["complete@5"] == 0.0 and figures["dev"]["complete@10"] == 1.0
    assert figures["holdout"]["recall@10"] == 0.0 and figures["holdout"]["anyOf@10"] is None
    assert figures["all"]["entities"] == 3 and figures["all"]["recall@10"] == pytest.approx(0.667)


@pytest.fixture(scope="module")
def ecommerce_recall() -> dict[str, dict[str, Any]]:
    bench = _bench()
    rows = anyio.run(bench.ranks_for, ECOMMERCE, bench.answerable_cases(ECOMMERCE))
    figures: dict[str, dict[str, Any]] = bench.report(rows)
    return figures


def test_ecommerce_recall_stays_above_the_measured_floor(
    ecommerce_recall: dict[str, dict[str, Any]],
) -> None:
    # Measured with the question verbatim (docs/embedded-target.md): dev 0.808 / 0.962,
    # holdout 0.417 / 0.750, all 0.684 / 0.895. The floors leave one entity of slack per split.
    dev, holdout, every = (ecommerce_recall[s] for s in ("dev", "holdout", "all"))
    assert (dev["cases"], holdout["cases"], every["entities"]) == (18, 8, 38)
    assert dev["recall@5"] >= 0.76 and dev["recall@10"] >= 0.92
    assert holdout["recall@5"] >= 0.33 and holdout["recall@10"] >= 0.66
    assert every["recall@5"] >= 0.65 and every["recall@10"] >= 0.86
