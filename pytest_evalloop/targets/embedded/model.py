"""The embedded target's semantic model: sources, dimensions, measures, joins and views.

The file format is documented in docs/semantic-model.md. A model is installed into a DuckDB
connection by `install_sources`, which builds one table per source (its dimensions are the
columns) and one view per named query, then drops the raw data so the answerer can only reach
what the model exposes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:
    import duckdb

EntityKind = Literal["source", "dimension", "measure", "view", "join"]
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
_RAW_SCHEMA = "evalloop_raw"


class ModelFileError(ValueError):
    """A semantic model file that cannot be loaded; the message names the file and the field."""


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str
    doc: str = Field(min_length=1)
    # Other words people use for this part ("revenue", "bookings"): shown with the doc and
    # indexed for retrieval, so a question can find the part without naming it.
    aliases: list[str] = Field(default_factory=list)

    @field_validator("aliases")
    @classmethod
    def _real_aliases(cls, value: list[str]) -> list[str]:
        cleaned = [a.strip() for a in value]
        if not all(cleaned):
            raise ValueError("aliases must be non-empty strings; remove the empty entry")
        return list(dict.fromkeys(cleaned))

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _IDENT.match(value):
            raise ValueError(f"{value!r} is not a lower-case SQL identifier ([a-z_][a-z0-9_]*)")
        return value


class Dimension(_Part):
    """A column of the source's relation; `expr` says how it is computed from the raw data."""

    expr: str | None = None  # SQL over the source's `from`; defaults to the raw column `name`

    @property
    def build_sql(self) -> str:
        return self.expr or self.name


class Measure(_Part):
    """An aggregate SQL expression over the source's columns, ready to paste into a SELECT."""

    sql: str = Field(min_length=1)


class Join(_Part):
    """How to JOIN another source onto this one; `name` is the joined source's name."""

    on: str = Field(min_length=1)
    relationship: Literal["many_to_one", "one_to_many", "one_to_one"]


class View(_Part):
    """A named query over source relations, installed as the relation `<source>__<view>`."""

    sql: str = Field(min_length=1)


class Source(_Part):
    """One queryable relation: built from raw tables by `from`, exposing its dimensions."""

    from_: str = Field(alias="from", min_length=1)
    grain: str = Field(min_length=1)
    primary_key: str | None = None
    dimensions: list[Dimension] = Field(min_length=1)
    measures: list[Measure] = Field(default_factory=list)
    joins: list[Join] = Field(default_factory=list)
    views: list[View] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> Source:
        names = [d.name for d in self.dimensions] + [m.name for m in self.measures]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source {self.name!r} names {dupes} more than once")
        if self.primary_key and self.primary_key not in names:
            raise ValueError(f"primary_key {self.primary_key!r} is not a dimension of {self.name}")
        return self

    def columns(self) -> list[str]:
        return [d.name for d in self.dimensions]


class Entity(BaseModel):
    """One retrievable piece of the model; `id` is `kind:source:name`."""

    id: str
    kind: EntityKind
    source: str
    name: str
    doc: str
    sql: str | None
    aliases: list[str] = Field(default_factory=list)


def view_relation(source: str, view: str) -> str:
    """The relation name a view is installed under."""
    return f"{source}__{view}"


class SemanticModel(BaseModel):
    """A semantic model: documented sources over the raw tables of a dataset.

    Treat a loaded model as read-only (its fields cannot be reassigned; build a changed copy
    with `model_copy(update=...)`): its entities are derived once and remembered.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    doc: str
    sources: list[Source] = Field(min_length=1)
    # The judge asks for definitions on every case; deriving ~100 entities each time cost
    # milliseconds per case. Filled on first use, tagged with the identity of the `sources`
    # list it was derived from, so a `model_copy(update={"sources": ...})` derives its own.
    _entities: tuple[int, tuple[Entity, ...]] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _joins_resolve(self) -> SemanticModel:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique, got {names}")
        for source in self.sources:
            for join in source.joins:
                if join.name not in names:
                    raise ValueError(
                        f"join {source.name}.{join.name} names no source; known: {names}"
                    )
        return self

    @classmethod
    def load(cls, path: Path) -> SemanticModel:
        """Read a model file (JSON); raise ModelFileError naming the file and the bad field."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ModelFileError(f"semantic model {path}: cannot read ({exc})") from exc
        except json.JSONDecodeError as exc:
            raise ModelFileError(
                f"semantic model {path}: invalid JSON at line {exc.lineno} column {exc.colno}:"
                f" {exc.msg}; fix the file (format: docs/semantic-model.md)"
            ) from exc
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<top>'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ModelFileError(
                f"semantic model {path}: {problems} (format: docs/semantic-model.md)"
            ) from exc

    def source(self, name: str) -> Source | None:
        """The source called `name`, or None."""
        return next((s for s in self.sources if s.name == name), None)

    def entities(self) -> list[Entity]:
        """Every entity of the model, sources first, each followed by its parts (shared
        objects: do not modify them)."""
        known = self._entities
        if known is None or known[0] != id(self.sources):
            derived = tuple(e for source in self.sources for e in _source_entities(source))
            known = self._entities = (id(self.sources), derived)
        return list(known[1])

    def entity(self, entity_id: str) -> Entity | None:
        """The entity with this id, or None."""
        return next((e for e in self.entities() if e.id == entity_id), None)

    def definitions_for(self, entity_ids: Iterable[str]) -> str:
        """Docs and SQL of these entities and of their sources, as plain text for the judge."""
        wanted = list(dict.fromkeys(entity_ids))
        by_id = {e.id: e for e in self.entities()}
        unknown = [i for i in wanted if i not in by_id]
        blocks: list[str] = []
        for source in self.sources:
            picked = [by_id[i] for i in wanted if i in by_id and by_id[i].source == source.name]
            if picked:
                blocks.append(_source_block(source, picked))
        if unknown:
            blocks.append("Not in this model: " + ", ".join(unknown))
        return "\n\n".join(blocks)


def _source_entities(source: Source) -> list[Entity]:
    s = source.name
    columns = ", ".join(source.columns())
    out = [
        _entity(
            "source", s, source, f"{source.doc} Grain: {source.grain}", f"SELECT {columns} FROM {s}"
        )
    ]
    for dim in source.dimensions:
        out.append(_entity("dimension", s, dim, dim.doc, f"{s}.{dim.name}"))
    for measure in source.measures:
        out.append(_entity("measure", s, measure, measure.doc, measure.sql))
    for join in source.joins:
        doc = f"{join.doc} Relationship: {join.relationship} ({s} to {join.name})."
        out.append(_entity("join", s, join, doc, f"JOIN {join.name} ON {join.on}"))
    for view in source.views:
        rel = view_relation(s, view.name)
        doc = f"{view.doc} Query it with: SELECT * FROM {rel}"
        out.append(_entity("view", s, view, doc, view.sql))
    return out


def _entity(kind: EntityKind, source: str, part: _Part, doc: str, sql: str) -> Entity:
    # The aliases ride along in the doc so the answerer (and the judge) see why a part matched.
    if part.aliases:
        doc = f"{doc} Also called: {', '.join(part.aliases)}."
    return Entity(
        id=f"{kind}:{source}:{part.name}",
        kind=kind,
        source=source,
        name=part.name,
        doc=doc,
        sql=sql,
        aliases=part.aliases,
    )


def _source_block(source: Source, picked: list[Entity]) -> str:
    lines = [
        f"source {source.name}: {source.doc}",
        f"  grain: {source.grain}",
        f"  columns: {', '.join(source.columns())}",
    ]
    if any(d.expr for d in source.dimensions):
        lines.append(f"  built from: {source.from_}")
    dims = {d.name: d for d in source.dimensions}
    for ent in picked:
        if ent.kind == "source":
            continue
        lines.append(f"  {ent.kind} {ent.id}: {ent.doc}")
        if ent.kind == "dimension" and dims[ent.name].expr:
            lines.append(f"    derived as: {dims[ent.name].expr}")
        elif ent.sql:
            lines.append(f"    sql: {ent.sql}")
    return "\n".join(lines)


def install_sources(con: duckdb.DuckDBPyConnection, model: SemanticModel, data_dir: Path) -> None:
    """Build the answerer-facing relations in `con` and leave nothing else visible.

    The raw parquet files are copied into memory under a private schema, each source becomes a
    table named after it (columns = its dimensions), each view a DuckDB view named
    `<source>__<view>`; then the raw schema is dropped, so after this call the connection needs
    no file access and no raw table can be named.
    """
    from pytest_evalloop.targets.embedded.data import TABLES

    data_dir = Path(data_dir)
    con.execute(f"CREATE SCHEMA {_RAW_SCHEMA}")
    try:
        for table in TABLES:
            path = data_dir / f"{table}.parquet"
            if not path.is_file():
                raise FileNotFoundError(
                    f"embedded data file {path} is missing; call ensure_data() to generate it"
                )
            con.execute(
                f"CREATE TABLE {_RAW_SCHEMA}.{table} AS SELECT * FROM read_parquet(?)",
                [str(path)],
            )
        # Unqualified names in `from` resolve to the raw tables while sources are built.
        con.execute(f"SET search_path = '{_RAW_SCHEMA}'")
        for source in model.sources:
            _create_source(con, source)
        con.execute("RESET search_path")
        for source in model.sources:
            for view in source.views:
                rel = view_relation(source.name, view.name)
                con.execute(f"CREATE VIEW main.{rel} AS {view.sql}")
    finally:
        con.execute("RESET search_path")
        con.execute(f"DROP SCHEMA IF EXISTS {_RAW_SCHEMA} CASCADE")


def _create_source(con: duckdb.DuckDBPyConnection, source: Source) -> None:
    select = ", ".join(f"{d.build_sql} AS {d.name}" for d in source.dimensions)
    order = f" ORDER BY {source.primary_key}" if source.primary_key else ""
    try:
        con.execute(
            f"CREATE TABLE main.{source.name} AS SELECT {select} FROM {source.from_}{order}"
        )
    except Exception as exc:
        raise ModelFileError(
            f"source {source.name!r}: building it from raw data failed: {exc}; check its `from`"
            " and dimension `expr` values"
        ) from exc
