"""Service processes starting at once on one new database (``server.workers``,
pods of a Deployment): the tiers' HNSW indexes and the Typesense collections
are made once, by whichever takes the schema lock first; the others find them."""

from __future__ import annotations

import uuid

import anyio
import pytest

from config import load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.pgvector import ensure_indexes
from indexers.postgres import open_pool, schema_lock
from indexers.typesense import TypesenseClient, TypesenseGroups
from tests.api.conftest import fresh_database

pytestmark = pytest.mark.anyio


async def test_processes_starting_at_once_create_each_index_once(postgres: EmbeddedPostgres) -> None:
    dsn = fresh_database(postgres)
    cfg = load_config()
    pools = [await open_pool(dsn, dim=384, min_size=1, max_size=2) for _ in range(3)]
    created: list[list[str]] = []
    try:

        async def start(pool: object) -> None:
            created.append(await ensure_indexes(pool, cfg))  # type: ignore[arg-type]

        async with anyio.create_task_group() as tg:
            for pool in pools:
                tg.start_soon(start, pool)
    finally:
        for pool in pools:
            await pool.close()
    names = [name for made in created for name in made]
    assert len(created) == 3
    assert sorted(names) == sorted(set(names)), "an index was created twice"
    assert {"memories_hnsw_rag", "entities_hnsw"} <= set(names)


async def test_processes_starting_at_once_make_one_typesense_collection(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense
) -> None:
    """As ``indexers.runtime`` makes them: ``TypesenseGroups.ensure`` under the lock."""
    dsn = fresh_database(postgres)
    alias = f"mem_{uuid.uuid4().hex[:12]}"
    client = TypesenseClient([typesense.url], typesense.api_key, timeout=5.0)
    pools = [await open_pool(dsn, dim=384, min_size=1, max_size=2) for _ in range(3)]
    try:

        async def start(pool: object) -> None:
            async with schema_lock(pool):  # type: ignore[arg-type]
                await TypesenseGroups(client, alias, 384).ensure()

        async with anyio.create_task_group() as tg:
            for pool in pools:
                tg.start_soon(start, pool)
        made = [c["name"] for c in await client.list_collections() if c["name"].startswith(alias)]
        assert len(made) == 2, made  # the keyword collection and its vectors collection
        assert await client.get_alias(alias) in made
    finally:
        for pool in pools:
            await pool.close()
        await client.aclose()
