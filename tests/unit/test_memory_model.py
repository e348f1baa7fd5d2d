"""The memory model is declared once (indexers.base.Shown and MemoryRecord);
everything that stores, indexes, returns or accepts a memory follows it. A
field added to the model fails here until each place gives it a meaning."""

from __future__ import annotations

import msgspec

from indexers.base import RECORD_FIELDS, SHOWN_FIELDS, Hit, MemoryRecord, Shown
from indexers.postgres import HIT_COLUMNS, RECORD_COLUMNS, MemoryInput
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
