"""benchmarks.load.run.flush_typesense against the real Typesense: the node
is asked to compact its store, and a node that refuses fails the load
instead of leaving a read phase on an unflushed store unsaid."""

from __future__ import annotations

import pytest

from benchmarks.load.run import flush_typesense
from deploy.embedded import EmbeddedTypesense

pytestmark = pytest.mark.anyio


async def test_it_compacts_the_store_and_says_how_long_it_took(typesense: EmbeddedTypesense) -> None:
    flushed = await flush_typesense(typesense.url, typesense.api_key)
    assert 0.0 < flushed["seconds"] < 60.0


async def test_a_refused_compaction_raises(typesense: EmbeddedTypesense) -> None:
    with pytest.raises(RuntimeError, match="did not compact"):
        await flush_typesense(typesense.url, "wrong")
