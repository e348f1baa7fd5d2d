"""benchmarks.load.run.flush_typesense against the real Typesense: the node
is asked to compact its store, and a node that refuses fails the load
instead of leaving a read phase on an unflushed store unsaid."""

from __future__ import annotations

import httpx
import pytest

from benchmarks.load.run import flush_typesense
from deploy.embedded import EmbeddedTypesense

pytestmark = pytest.mark.anyio


async def test_it_compacts_the_store_and_says_how_long_it_took(typesense: EmbeddedTypesense) -> None:
    async with httpx.AsyncClient(base_url=typesense.url, headers={"X-TYPESENSE-API-KEY": typesense.api_key}) as ts:
        flushed = await flush_typesense(ts)
    assert 0.0 < flushed["seconds"] < 60.0


async def test_a_refused_compaction_raises(typesense: EmbeddedTypesense) -> None:
    async with httpx.AsyncClient(base_url=typesense.url, headers={"X-TYPESENSE-API-KEY": "wrong"}) as ts:
        with pytest.raises(httpx.HTTPStatusError):
            await flush_typesense(ts)
