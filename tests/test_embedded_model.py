"""The semantic model file: loading, entities, definitions, and the installed relations."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from pytest_evalloop.targets.embedded.data import TABLES, ensure_data
from pytest_evalloop.targets.embedded.model import (
    ModelFileError,
    SemanticModel,
    install_sources,
    view_relation,
)

MODEL_PATH = Path(__file__).resolve().parents[1] / "evals" / "ecommerce" / "model.json"


@pytest.fixture(scope="module")
def model() -> SemanticModel:
    return SemanticModel.load(MODEL_PATH)


@pytest.fixture(scope="module")
def answerer(model: SemanticModel) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    install_sources(con, model, ensure_data())
    return con


def _write(tmp_path: Path, payload: object) -> Path:
    path = tmp_path / "model.json"
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


def _minimal() -> dict[str, object]:
    return {
        "name": "m",
        "doc": "d",
        "sources": [
            {
                "name": "orders",
                "doc": "Orders.",
                "grain": "one row per order",
                "from": "orders",
                "dimensions": [{"name": "order_id", "doc": "Id."}],
                "measures": [{"name": "order_count", "doc": "Orders.", "sql": "count(*)"}],
            }
        ],
    }


def test_example_model_has_every_table_as_a_source(model: SemanticModel) -> None:
    names = [s.name for s in model.sources]
    assert set(TABLES) <= set(names)
    assert all(s.doc and s.grain for s in model.sources)


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, '{"name": "m",\n "doc": }')
    with pytest.raises(ModelFileError, match=r"model\.json: invalid JSON at line 2"):
        SemanticModel.load(path)


def test_missing_field_names_its_path(tmp_path: Path) -> None:
    payload = _minimal()
    del payload["sources"][0]["measures"][0]["sql"]  # type: ignore[index]
    with pytest.raises(ModelFileError, match=r"model\.json: sources\.0\.measures\.0\.sql"):
        SemanticModel.load(_write(tmp_path, payload))


def test_unknown_key_and_bad_identifier_are_rejected(tmp_path: Path) -> None:
    payload = _minimal()
    payload["sources"][0]["dimensions"][0]["dco"] = "typo"  # type: ignore[index]
    with pytest.raises(ModelFileError, match=r"dimensions\.0\.dco"):
        SemanticModel.load(_write(tmp_path, payload))
    payload = _minimal()
    payload["sources"][0]["name"] = "Order Items"  # type: ignore[index]
    with pytest.raises(ModelFileError, match="not a lower-case SQL identifier"):
        SemanticModel.load(_write(tmp_path, payload))


def test_join_to_unknown_source_is_rejected(tmp_path: Path) -> None:
    payload = _minimal()
    payload["sources"][0]["joins"] = [  # type: ignore[index]
        {"name": "users", "doc": "x", "on": "a = b", "relationship": "many_to_one"}
    ]
    with pytest.raises(ModelFileError, match="join orders.users names no source"):
        SemanticModel.load(_write(tmp_path, payload))


def test_missing_file_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="cannot read"):
        SemanticModel.load(tmp_path / "nope.json")


def test_entity_ids_are_unique_and_well_formed(model: SemanticModel) -> None:
    entities = model.entities()
    ids = [e.id for e in entities]
    assert len(ids) == len(set(ids))
    for ent in entities:
        assert ent.id == f"{ent.kind}:{ent.source}:{ent.name}"
        assert ent.doc
    assert model.entity("source:orders:orders") is not None
    assert model.entity("measure:order_items:total_sales").sql == "sum(sale_price)"  # type: ignore[union-attr]
    assert model.entity("measure:nowhere:nothing") is None
    kinds = {e.kind for e in entities}
    assert kinds == {"source", "dimension", "measure", "view", "join"}


def test_view_and_join_entities_say_how_to_use_them(model: SemanticModel) -> None:
    view = model.entity("view:order_items:sales_by_year")
    assert view is not None and "SELECT * FROM order_items__sales_by_year" in view.doc
    join = model.entity("join:orders:order_items")
    assert join is not None
    assert join.sql == "JOIN order_items ON order_items.order_id = orders.order_id"
    assert "one_to_many" in join.doc


def test_definitions_for_groups_by_source(model: SemanticModel) -> None:
    text = model.definitions_for(
        ["measure:order_items:total_sales", "dimension:order_items:unit_cost", "nope:x:y"]
    )
    assert text.startswith("source order_items:")
    assert "sql: sum(sale_price)" in text
    assert "derived as: ii.cost" in text
    assert "built from: order_items oi JOIN inventory_items ii" in text
    assert text.rstrip().endswith("Not in this model: nope:x:y")
    assert "source users" not in text
    assert model.definitions_for([]) == ""


def test_installed_relations_are_exactly_sources_and_views(
    model: SemanticModel, answerer: duckdb.DuckDBPyConnection
) -> None:
    rows = answerer.execute(
        "SELECT table_schema, table_name FROM information_schema.tables"
    ).fetchall()
    expected = {s.name for s in model.sources} | {
        view_relation(s.name, v.name) for s in model.sources for v in s.views
    }
    assert {schema for schema, _ in rows} == {"main"}
    assert {name for _, name in rows} == expected
    with pytest.raises(duckdb.Error):
        answerer.execute("SELECT * FROM evalloop_raw.order_items")


def test_source_columns_are_its_dimensions(
    model: SemanticModel, answerer: duckdb.DuckDBPyConnection
) -> None:
    for source in model.sources:
        cols = [d[0] for d in answerer.execute(f"SELECT * FROM {source.name} LIMIT 0").description]
        assert cols == source.columns(), source.name
    # order_items.unit_cost is inventory_items.cost of the unit on that line
    mismatch = answerer.execute(
        "SELECT count(*) FROM order_items JOIN inventory_items"
        " ON order_items.inventory_item_id = inventory_items.id"
        " WHERE order_items.unit_cost <> inventory_items.cost"
    ).fetchone()
    assert mismatch == (0,)


def test_every_measure_pastes_into_a_select(
    model: SemanticModel, answerer: duckdb.DuckDBPyConnection
) -> None:
    for source in model.sources:
        for measure in source.measures:
            row = answerer.execute(f"SELECT {measure.sql} FROM {source.name}").fetchone()
            assert row is not None and row[0] is not None, measure.name


def test_every_join_and_view_runs(
    model: SemanticModel, answerer: duckdb.DuckDBPyConnection
) -> None:
    for source in model.sources:
        base = answerer.execute(f"SELECT count(*) FROM {source.name}").fetchone()
        for join in source.joins:
            sql = f"SELECT count(*) FROM {source.name} JOIN {join.name} ON {join.on}"
            joined = answerer.execute(sql).fetchone()
            assert joined is not None and base is not None
            if join.relationship == "many_to_one":  # never fans out
                assert joined[0] <= base[0], join.name
        for view in source.views:
            rows = answerer.execute(f"SELECT * FROM {view_relation(source.name, view.name)}")
            assert rows.fetchall(), view.name


def test_install_needs_every_data_file(model: SemanticModel, tmp_path: Path) -> None:
    con = duckdb.connect(":memory:")
    with pytest.raises(FileNotFoundError, match="ensure_data"):
        install_sources(con, model, tmp_path)
    # a failed install leaves nothing half-built behind
    assert con.execute(
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'evalloop_raw'"
    ).fetchone() == (0,)


def test_bad_from_clause_is_named(tmp_path: Path) -> None:
    payload = _minimal()
    payload["sources"][0]["from"] = "no_such_table"  # type: ignore[index]
    broken = SemanticModel.load(_write(tmp_path, payload))
    with pytest.raises(ModelFileError, match="source 'orders': building it from raw data failed"):
        install_sources(duckdb.connect(":memory:"), broken, ensure_data())
