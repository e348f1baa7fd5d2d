"""benchmarks.typesense_key_clause: the filters it compares."""

from __future__ import annotations

from benchmarks.typesense_key_clause import _filter
from indexers.typesense.bm25 import _filter as source_filter
from indexers.typesense.documents import tenant_key, tenant_terms


def test_shipped_is_the_source_s_candidate_filter_and_terms_drops_only_the_tenant_clause() -> None:
    key = tenant_key("big")
    keyed = tenant_terms("big", ["elena", "lisbon"])
    shipped = _filter("shipped", key, keyed)
    assert shipped == source_filter(f"current_key:={key}", key[:8], ["elena", "lisbon"])
    assert _filter("shipped/0", key, keyed) == shipped
    assert _filter("terms", key, keyed) == _filter("terms/0", key, keyed) == shipped.split(" && ", 1)[1]
    assert key not in _filter("terms", key, keyed).replace(key[:8], "")
