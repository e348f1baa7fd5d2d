"""benchmarks.typesense_term_key: the stored forms it compares."""

from __future__ import annotations

from datetime import UTC, datetime

from benchmarks.typesense_term_key import _document
from indexers.base import MemoryRecord
from indexers.typesense.documents import record_document, tenant_key


def test_each_variant_stores_the_same_terms_behind_its_own_prefix() -> None:
    rec = MemoryRecord(
        id="m",
        tenant="t",
        content="Blue password",
        kind="note",
        tier="session",
        created_at=datetime(2024, 1, 1, tzinfo=UTC),
        confidence=1.0,
    )
    key = tenant_key("t")
    assert _document(rec, "key32")["tenant_terms"] == [key + "blue", key + "password"]
    assert _document(rec, "key8") == record_document(rec)  # what Braid sends now
    bare = _document(rec, "bare")
    assert bare["tenant_terms"] == ["blue", "password"] and "tenant_key" not in bare and "current_key" in bare
    old = _document(rec, "old")
    assert old["terms"] == ["blue", "password"]
    assert not {"tenant_key", "current_key", "tenant_terms"} & old.keys()
