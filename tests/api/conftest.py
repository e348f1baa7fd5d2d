"""An app per test against the real backends: a fresh database and Typesense
alias each time, keys for two tenants and an admin."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psycopg
import pytest
from litestar import Litestar

from config import BraidConfig, ConfigHolder, load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.runtime import Backends, Runtime
from service import AppSettings, create_app
from service.auth import Keyring

AGENT_A = "agent-key-tenant-a-0123456789"
AGENT_B = "agent-key-tenant-b-0123456789"
ADMIN_A = "admin-key-tenant-a-0123456789"
#: Tenant ``Tenant_A``, whose name a Typesense filter folds into ``tenant-a``'s.
AGENT_FOLDED = "agent-key-tenant-folded-0123456789"


def fresh_database(pg: EmbeddedPostgres) -> str:
    name = f"braid_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return pg.dsn().replace("/postgres?", f"/{name}?")


def test_config(alias: str, **changes: Any) -> BraidConfig:
    cfg = load_config()
    cfg = msgspec.structs.replace(cfg, typesense=msgspec.structs.replace(cfg.typesense, collection=alias))
    return msgspec.structs.replace(cfg, **changes) if changes else cfg


def patient(cfg: BraidConfig) -> BraidConfig:
    """``cfg`` with deadlines a loaded machine cannot miss (10 s for the query
    embedding and every source), for tests of behaviour that a degraded
    answer would blur, not of the machine's speed."""
    cfg = msgspec.structs.replace(cfg, embedding=msgspec.structs.replace(cfg.embedding, query_deadline_ms=10_000))
    for name in cfg.sources:
        cfg = cfg.with_source(name, deadline_ms=10_000)
    return cfg


@dataclass
class Braid:
    client: httpx.AsyncClient
    app: Litestar
    dsn: str
    alias: str
    headers: Callable[[str], dict[str, str]] = field(default=lambda key: {"Authorization": f"Bearer {key}"})

    @property
    def runtime(self) -> Runtime:
        return self.app.state.runtime  # type: ignore[no-any-return]

    async def post(self, path: str, body: Any, key: str = AGENT_A) -> Any:
        return await self.client.post(path, json=body, headers=self.headers(key))

    async def remember(self, *memories: dict[str, Any], key: str = AGENT_A) -> list[str]:
        r = await self.post("/v1/memories", {"memories": list(memories)}, key)
        assert r.status_code == 201, r.text
        return r.json()["ids"]  # type: ignore[no-any-return]

    async def recall(self, query: str, key: str = AGENT_A, **fields: Any) -> dict[str, Any]:
        r = await self.post("/v1/recall", {"query": query, **fields}, key)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    async def synced(self, timeout: float = 10.0) -> None:
        """Wait until the outbox is empty (every write reached Typesense)."""
        import anyio

        sync = self.runtime.sync
        with anyio.move_on_after(timeout):
            while await sync.pending():
                await anyio.sleep(0.01)
            return
        raise AssertionError(
            f"outbox not drained after {timeout}s: pending={await sync.pending()} "
            f"applied={sync.applied} last_error={sync.last_error}"
        )


def make_app(
    postgres: EmbeddedPostgres,
    typesense: EmbeddedTypesense,
    embedder: Any,
    cfg: BraidConfig | None = None,
    config_path: str | None = None,
    dsn: str | None = None,
    alias: str | None = None,
    replica_dsn: str | None = None,
    typesense_clusters: tuple[tuple[tuple[str, ...], str], ...] = (),
    settle_heap: bool = False,
) -> tuple[Litestar, str, str]:
    """An app on a fresh database and Typesense alias (or on ``dsn``'s and
    ``alias``'s), its recalls reading ``replica_dsn`` when given. ``embedder``
    None: the app opens ``cfg``'s embedding provider."""
    dsn = dsn or fresh_database(postgres)
    alias = alias or f"mem_{uuid.uuid4().hex[:10]}"
    cfg = cfg or test_config(alias)
    cfg = msgspec.structs.replace(cfg, typesense=msgspec.structs.replace(cfg.typesense, collection=alias))
    ring = Keyring()
    ring.add(AGENT_A, tenant="tenant-a", role="agent")
    ring.add(AGENT_B, tenant="tenant-b", role="agent")
    ring.add(AGENT_FOLDED, tenant="Tenant_A", role="agent")
    ring.add(ADMIN_A, tenant="tenant-a", role="admin")
    settings = AppSettings(
        config=ConfigHolder(cfg, config_path),
        backends=Backends(
            postgres_dsn=dsn,
            typesense_nodes=(typesense.url,),
            typesense_api_key=typesense.api_key,
            postgres_replica_dsn=replica_dsn,
            typesense_clusters=typesense_clusters,
        ),
        keyring=ring,
        embedder=embedder,
        settle_heap=settle_heap,
    )
    return create_app(settings), dsn, alias


@pytest.fixture
async def braid(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> AsyncIterator[Braid]:
    app, dsn, alias = make_app(postgres, typesense, embedder)
    async with serve(app) as client:
        yield Braid(client=client, app=app, dsn=dsn, alias=alias)


@asynccontextmanager
async def serve(app: Litestar) -> AsyncIterator[httpx.AsyncClient]:
    """The app's lifespan and an HTTP client, both on the test's event loop
    (Litestar's test client runs the app on a loop of its own, and the app's
    pools could then not be used from the test)."""
    transport = httpx.ASGITransport(app=app)
    async with (
        app.lifespan(),
        httpx.AsyncClient(transport=transport, base_url="http://braid.test", timeout=60) as client,
    ):
        yield client


@dataclass
class FileConfigured:
    """A Braid whose config is a file the test rewrites and reloads."""

    braid: Braid
    path: Path

    def write(self, text: str) -> None:
        """Write the config file: ``text`` plus the test's own Typesense alias."""
        self.path.write_text(f"typesense:\n  collection: {self.braid.alias}\n{text}")

    async def reload(self, key: str = ADMIN_A) -> httpx.Response:
        return await self.braid.client.post("/admin/config/reload", headers=self.braid.headers(key))


@pytest.fixture
async def configured(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, tmp_path: Path
) -> AsyncIterator[FileConfigured]:
    path = tmp_path / "braid.yaml"
    path.write_text("searchTopK: 10\n")
    app, dsn, alias = make_app(postgres, typesense, embedder, load_config(path), str(path))
    async with serve(app) as client:
        yield FileConfigured(Braid(client=client, app=app, dsn=dsn, alias=alias), path)


def record_searches(braid: Braid) -> list[list[str]]:
    """From now on, each Typesense ``multi_search`` the service sends is
    appended to the returned list as the kinds of its searches (``"vector"``
    or ``"keyword"``); the searches still run."""
    sent: list[list[str]] = []
    client = braid.runtime.typesense
    inner = client.multi_search

    async def recording(searches: Any) -> Any:
        sent.append(["vector" if "vector_query" in s else "keyword" for s in searches])
        return await inner(searches)

    client.multi_search = recording  # type: ignore[method-assign]
    return sent
