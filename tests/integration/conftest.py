"""What the integration modules share: a fresh database of their own, migrated and indexed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool

from config import load_config
from deploy.embedded import EmbeddedPostgres
from indexers.pgvector import ensure_indexes
from indexers.postgres import open_pool
from tests.api.conftest import fresh_database


@pytest.fixture(scope="module")
async def pool(postgres: EmbeddedPostgres) -> AsyncIterator[AsyncConnectionPool]:
    """A pool on a database of the module's own, migrated, with the shipped tiers' indexes
    (a module may define its own ``pool`` instead)."""
    pool = await open_pool(fresh_database(postgres), dim=384, min_size=1, max_size=4)
    await ensure_indexes(pool, load_config())
    yield pool
    await pool.close()
