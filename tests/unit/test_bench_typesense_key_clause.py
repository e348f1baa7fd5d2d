"""benchmarks.typesense_key_clause: the filters it compares."""

from __future__ import annotations

from datetime import UTC, datetime

from benchmarks.typesense_key_clause import _filter
from indexers.base import Filters
from indexers.typesense.bm25 import _filter as source_filter
from indexers.typesense.documents import narrow_filter, tenant_key, tenant_terms


def test_shipped_is_the_source_s_candidate_filter_and_terms_drops_only_the_tenant_clause() -> None:
    key = tenant_key("big")
    keyed = tenant_terms("big", ["elena", "lisbon"])
    shipped = _filter("shipped", key, keyed)
    assert shipped == source_filter(f"current_key:={key}", key[:8], ["elena", "lisbon"])
    assert _filter("shipped/0", key, keyed) == shipped
    assert _filter("terms", key, keyed) == _filter("terms/0", key, keyed) == shipped.split(" && ", 1)[1]
    assert key not in _filter("terms", key, keyed).replace(key[:8], "")


def test_terms_is_what_the_source_sends_in_a_tenants_own_pair() -> None:
    key = tenant_key("big")
    alone = narrow_filter("big", Filters(), alone=True)
    assert alone == ""
    assert _filter("terms", key, tenant_terms("big", ["elena"])) == source_filter(alone, key[:8], ["elena"])
    # With as_of the tenant is still named: superseded documents are in its pair.
    assert key in narrow_filter("big", Filters(as_of=datetime(2026, 1, 1, tzinfo=UTC)), alone=True)
