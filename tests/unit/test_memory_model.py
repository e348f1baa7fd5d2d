"""The memory model is declared once (indexers.base.Shown and MemoryRecord);
everything that stores, indexes, returns or accepts a memory follows it. A
field added to the model fails here until each place gives it a meaning."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import msgspec

from indexers.base import RECORD_FIELDS, SHOWN_FIELDS, Hit, MemoryRecord, Shown
from indexers.postgres import HIT_COLUMNS, RECORD_COLUMNS, MemoryInput, hit_from_row
from indexers.postgres.sql import _fields
from indexers.results import RecallItem
from indexers.typesense import metadata
from indexers.typesense.documents import KEY_FIELDS, TERM_FIELDS, collection_schema, document_field, vectors_schema
from service.schemas import MemoryIn


def names(struct: type[msgspec.Struct]) -> list[str]:
    return [f.name for f in msgspec.structs.fields(struct)]


def test_hits_records_and_items_extend_the_shown_fields() -> None:
    for struct in (Hit, MemoryRecord, RecallItem):
        assert issubclass(struct, Shown)
        assert names(struct)[: len(SHOWN_FIELDS)] == list(SHOWN_FIELDS)


def test_sql_columns_are_the_model_fields() -> None:
    assert HIT_COLUMNS == ", ".join(f"m.{n}" for n in SHOWN_FIELDS)
    assert RECORD_COLUMNS == ", ".join(f"m.{n}" for n in RECORD_FIELDS)


def test_the_typesense_schemas_have_a_field_for_every_stored_field() -> None:
    keyword = {f["name"] for f in collection_schema("c")["fields"]}
    vectors = {f["name"] for f in vectors_schema("c_vectors", 4)["fields"]}
    stored = {document_field(n) for n in RECORD_FIELDS}
    # The document's own id is tenant-qualified; the memory's id is `memory_id`;
    # metadata is held as the containment filter's tokens (indexers/typesense/metadata.py);
    # the bm25 keyword mode's terms and length are derived from content and context;
    # the tenant's keys, which filters read, from the tenant and the lifecycle.
    # A keyword document holds every stored field but the embedding...
    assert keyword == (stored - {"embedding"}) | {"id", *TERM_FIELDS, *KEY_FIELDS}
    # ...and a vector document the embedding with what filters and hits read.
    assert vectors == (stored - {"context", "superseded_by"}) | {"id", *KEY_FIELDS}
    assert document_field("metadata") == metadata.FIELD


def test_writes_carry_every_stored_field() -> None:
    written = set(names(MemoryInput))
    # The tenant comes from the key, the lifecycle from the write's mem_key
    # (indexers.postgres.lifecycle); everything else is written.
    assert set(RECORD_FIELDS) - {"tenant", "superseded_at", "superseded_by"} <= written
    # The API accepts every written field except what the service fills in
    # (the model; whether created_at was its own "now").
    assert written - {"model", "stamped"} <= set(names(MemoryIn))


def test_a_hit_from_a_row_reads_every_shown_field_as_the_generic_reader_does() -> None:
    # hit_from_row is written out for the shown fields once (indexers.postgres.sql):
    # every field, each converted as _fields converts it.
    here = timezone(timedelta(hours=2))
    rows = [
        {
            "id": "m1",
            "content": "Prefers tea.",
            "kind": "fact",
            "tier": "session",
            "created_at": datetime(2026, 1, 15, 9, 30, tzinfo=here),
            "confidence": 1,
            "speaker": "Ana",
            "importance": 1,
            "mem_key": "user.drink",
            "expires_at": datetime(2027, 1, 1, tzinfo=here),
        },
        {
            "id": "m2",
            "content": "x",
            "kind": "session",
            "tier": "rag",
            "created_at": datetime(2026, 1, 15, tzinfo=UTC),
            "confidence": 0.25,
            "speaker": None,
            "importance": None,
            "mem_key": None,
            "expires_at": None,
        },
    ]
    for row in rows:
        hit = hit_from_row({**row, "distance": 0.1}, 0.5)
        assert hit == Hit(**_fields(row, SHOWN_FIELDS), score=0.5)
        assert hit.created_at.utcoffset() == timedelta(0)
        assert isinstance(hit.confidence, float)
    assert hit_from_row(rows[0], 1.0).expires_at == datetime(2026, 12, 31, 22, tzinfo=UTC)
    assert hit_from_row(rows[0], 1.0).importance == 1.0
