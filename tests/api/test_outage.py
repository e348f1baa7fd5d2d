"""Typesense killed while the service runs: recalls still answer from the other
sources, writes are accepted, and every write reaches Typesense once it is back."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense

from .conftest import Braid, make_app, serve

pytestmark = pytest.mark.anyio


@pytest.fixture
async def own_typesense() -> AsyncIterator[EmbeddedTypesense]:
    home = Path(tempfile.mkdtemp(prefix="braid-ts-"))
    ts = EmbeddedTypesense(home)
    ts.start()
    yield ts
    ts.stop()
    shutil.rmtree(home, ignore_errors=True)


async def test_typesense_down_degrades_then_catches_up(
    postgres: EmbeddedPostgres, own_typesense: EmbeddedTypesense, embedder: Any
) -> None:
    app, dsn, alias = make_app(postgres, own_typesense, embedder)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        before = await braid.remember({"content": "The password is Blue"})
        await braid.synced()

        own_typesense.kill()
        out = await braid.recall("password Blue")
        assert out["degraded"] == ["typesense"]
        assert out["sources"]["typesense"]["status"] == "error"
        assert out["items"][0]["id"] == before[0]  # still answered, by pgvector
        health = await client.get("/health")
        assert health.status_code == 503
        assert health.json()["backends"]["typesense"]["status"] == "down"

        during = []
        for i in range(20):
            during += await braid.remember({"content": f"Written while Typesense was down, number {i}"})
        assert len(during) == 20

        own_typesense.start()  # same data dir and port
        await braid.synced(timeout=30)
        for mid in during:
            assert await ts_fetch(own_typesense, alias, mid) is not None, mid
        out = await braid.recall("written while Typesense was down", sources=["typesense"], top_k=50)
        assert out["degraded"] == []
        assert set(during) <= {i["id"] for i in out["items"]}
        health = await client.get("/health")
        assert health.status_code == 200


async def ts_fetch(ts: EmbeddedTypesense, alias: str, mid: str) -> Any:
    """Read the document straight from Typesense, not through the app."""
    import httpx

    async with httpx.AsyncClient(base_url=ts.url, headers={"X-TYPESENSE-API-KEY": ts.api_key}) as c:
        for _ in range(50):
            r = await c.get(f"/collections/{alias}/documents/tenant-a:{mid}")
            if r.status_code == 200:
                return r.json()
            await anyio.sleep(0.1)
    return None
