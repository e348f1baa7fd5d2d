"""The write and admin side of the Typesense index, used by the outbox and reindex.

Memories live in a versioned collection (``<alias>_<unix ms>``) behind an
alias, so a rebuild fills a new collection and switches the alias
atomically. Writes always name a collection, never the alias.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from config import is_safe_name

from ..base import BackendError, MemoryRecord
from .client import TypesenseClient
from .documents import collection_schema, document_id, quoted, record_document

__all__ = ["IMPORT_CONCURRENCY", "TypesenseIndex"]

#: Import requests of one upsert in flight at once (each carries one
#: document with a vector; see :mod:`indexers.typesense.client`).
IMPORT_CONCURRENCY = 4


class TypesenseIndex:
    """The write/admin side: versioned collections behind ``alias``."""

    def __init__(self, client: TypesenseClient, alias: str, dim: int) -> None:
        if not is_safe_name(alias):
            raise ValueError(f"invalid Typesense alias {alias!r}")
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim!r}")
        self.client = client
        self.alias = alias
        self.dim = dim
        self._last_ms = 0

    def schema(self, name: str) -> dict[str, Any]:
        """The schema of collection ``name`` (:func:`collection_schema`)."""
        return collection_schema(name, self.dim)

    async def ensure(self) -> str:
        """Make sure the alias points at a collection; returns that collection."""
        current = await self.client.get_alias(self.alias)
        if current is not None:
            await self.add_missing_fields(current)
            return current
        name = await self.new_collection()
        await self.switch_alias(name)
        return name

    async def add_missing_fields(self, name: str) -> list[str]:
        """Add the schema's fields a collection made by an older Braid lacks
        (their values arrive with the next write or reindex); returns them."""
        collection = await self.client.get_collection(name)
        have = {f["name"] for f in (collection or {}).get("fields", [])}
        missing = [f for f in self.schema(name)["fields"] if f["name"] not in have | {"id"}]
        if collection is not None and missing:
            await self.client.update_collection(name, {"fields": missing})
        return [f["name"] for f in missing]

    async def new_collection(self) -> str:
        """Create an empty versioned collection (not yet behind the alias)."""
        self._last_ms = max(time.time_ns() // 1_000_000, self._last_ms + 1)
        name = f"{self.alias}_{self._last_ms}"
        await self.client.create_collection(self.schema(name))
        return name

    async def switch_alias(self, name: str) -> str | None:
        """Point the alias at ``name``; returns the collection it pointed at."""
        previous = await self.client.get_alias(self.alias)
        await self.client.upsert_alias(self.alias, name)
        return previous

    async def drop_collection(self, name: str) -> None:
        """Drop a collection that is not behind the alias (absent is fine)."""
        if name == await self.current_collection():
            raise ValueError(f"refusing to drop {name!r}: alias {self.alias!r} points at it")
        await self.client.delete_collection(name)

    async def current_collection(self) -> str | None:
        """The collection behind the alias, or ``None``."""
        return await self.client.get_alias(self.alias)

    async def ready(self) -> bool:
        """Whether searches can be served: a node is healthy *and* the alias
        resolves to a collection that answers. (``/health`` alone says ok
        after a restart before the documents are loaded.)"""
        try:
            if not await self.client.health() or await self.current_collection() is None:
                return False
            await self.count()
        except BackendError:
            return False
        return True

    async def _write_target(self, collection: str | None) -> str:
        """The collection a write goes to: ``collection``, else the one behind
        the alias, resolved now (a reindex in any process may just have
        switched it). Never the alias itself: Typesense 0.24.1 can lose writes
        addressed to an alias when it replays its log after a restart."""
        if collection is not None:
            return collection
        current = await self.client.get_alias(self.alias)
        return current if current is not None else await self.ensure()

    async def upsert(
        self, records: Sequence[MemoryRecord], collection: str | None = None, *, fresh: bool = False
    ) -> None:
        """Insert or replace whole documents (a field left out is removed).

        A document with an embedding is sent in an import request of its own
        (see :mod:`indexers.typesense.client`), unless ``fresh``:
        ``collection`` never had a document with a vector deleted or
        replaced, and nothing else writes to it meanwhile (a reindex filling
        the collection it just created, each memory once), so it has no freed
        slot to race for and ``records`` go in one request."""
        if fresh and collection is None:
            raise ValueError("fresh needs the collection named: the live one has had deletes")
        docs = [record_document(record) for record in records]
        await self.client.import_documents(
            await self._write_target(collection),
            docs,
            vector_field=None if fresh else "embedding",
            concurrency=IMPORT_CONCURRENCY,
        )

    async def delete(self, keys: Sequence[tuple[str, str]], collection: str | None = None) -> None:
        """Delete memories by ``(tenant, memory id)``; absent ones are ignored."""
        ids = [document_id(tenant, memory_id) for tenant, memory_id in keys]
        await self.client.delete_documents(await self._write_target(collection), ids)

    async def count(self, tenant: str | None = None, collection: str | None = None) -> int:
        """How many documents (of ``tenant``, if given) ``collection`` or the alias holds."""
        filter_by = None if tenant is None else f"tenant:={quoted(tenant)}"
        return await self.client.count(collection or self.alias, filter_by)

    async def fetch(self, id: str, *, tenant: str, collection: str | None = None) -> dict[str, Any] | None:
        """The tenant's stored document for memory ``id``, or ``None``."""
        return await self.client.get_document(collection or self.alias, document_id(tenant, id))
