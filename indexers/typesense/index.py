"""The write and admin side of the Typesense index, used by the outbox and reindex.

Memories live in two versioned collections made together: the keyword
collection ``<alias>_<unix ms>`` behind ``alias``, and its vectors
collection ``<alias>_<unix ms>_vectors`` behind ``<alias>_vectors``
(:func:`~.documents.vectors_collection`, :func:`~.documents.vectors_alias`).
A rebuild fills a new pair and switches both aliases. Writes always name
collections, never an alias.

A collection made by an older Braid holds each memory's embedding in its
one document. It keeps serving as it is: :meth:`TypesenseIndex.ensure`
points the vectors alias at it too, and writes to it keep both documents in
one (:func:`~.documents.combined_document`) while both aliases name it,
until a Typesense reindex builds the pair and switches the aliases.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import anyio

from config import is_safe_name

from ..base import BackendError, MemoryRecord
from .client import TypesenseClient
from .documents import (
    collection_schema,
    combined_document,
    document_id,
    record_document,
    tenant_key,
    vector_document,
    vectors_alias,
    vectors_collection,
    vectors_schema,
)

__all__ = ["IMPORT_CONCURRENCY", "TypesenseIndex"]

log = logging.getLogger("braid.typesense")

#: Import requests of one upsert in flight at once (each carries one
#: document with a vector; see :mod:`indexers.typesense.client`).
IMPORT_CONCURRENCY = 4


class TypesenseIndex:
    """The write/admin side: versioned collection pairs behind ``alias`` and
    ``<alias>_vectors``. A collection is named by its keyword collection;
    its vectors collection goes with it. Without ``vectors``
    (``typesense.vectors: none``) there are keyword collections only, and no
    vector is written."""

    def __init__(
        self, client: TypesenseClient, alias: str, dim: int, *, vectors: bool = True, stems: bool = False
    ) -> None:
        if not is_safe_name(alias):
            raise ValueError(f"invalid Typesense alias {alias!r}")
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim!r}")
        self.client = client
        self.alias = alias
        self.vectors_alias = vectors_alias(alias)
        self.vectors = vectors
        #: Keyword documents hold their words' stems too (``typesense.stems``).
        self.stems = stems
        self.dim = dim
        self._last_ms = 0

    def schema(self, name: str) -> dict[str, Any]:
        """The schema of keyword collection ``name`` (:func:`collection_schema`)."""
        return collection_schema(name)

    def vectors_schema(self, name: str) -> dict[str, Any]:
        """The schema of vectors collection ``name`` (:func:`vectors_schema`)."""
        return vectors_schema(name, self.dim)

    async def ensure(self) -> str:
        """Make sure both aliases point at collections; returns the keyword one.

        A keyword collection without its vectors alias (made by an older
        Braid) gets one: the collection itself if its documents hold their
        embeddings (logged: a reindex splits it), else a new vectors
        collection beside it (filled by the next writes and reindex)."""
        current = await self.client.get_alias(self.alias)
        if current is None:
            name = await self.new_collection()
            await self.switch_alias(name)
            return name
        await self.add_missing_fields(current)
        if not self.vectors:
            return current
        vectors = await self.client.get_alias(self.vectors_alias)
        if vectors is None:
            if await self._has_embeddings(current):
                vectors = current
            else:
                vectors = vectors_collection(current)
                if await self.client.get_collection(vectors) is None:
                    await self.client.create_collection(self.vectors_schema(vectors))
            await self.client.upsert_alias(self.vectors_alias, vectors)
        if vectors == current:
            log.warning(
                "Typesense collection %s holds its documents' embeddings (an older Braid's): keyword"
                ' searches read them too; POST /admin/reindex {"target": "typesense"} splits it',
                current,
            )
        else:
            await self._add_missing(vectors, self.vectors_schema(vectors))
        return current

    async def _has_embeddings(self, name: str) -> bool:
        collection = await self.client.get_collection(name)
        return any(f["name"] == "embedding" for f in (collection or {}).get("fields", []))

    async def add_missing_fields(self, name: str) -> list[str]:
        """Add the schema's fields a keyword collection made by an older Braid
        lacks (their values arrive with the next write or reindex); returns them."""
        return await self._add_missing(name, self.schema(name))

    async def _add_missing(self, name: str, schema: dict[str, Any]) -> list[str]:
        collection = await self.client.get_collection(name)
        have = {f["name"] for f in (collection or {}).get("fields", [])}
        missing = [f for f in schema["fields"] if f["name"] not in have | {"id"}]
        if collection is not None and missing:
            await self.client.update_collection(name, {"fields": missing})
        return [f["name"] for f in missing]

    async def new_collection(self) -> str:
        """Create an empty versioned collection pair (not yet behind the
        aliases); returns the keyword collection's name."""
        self._last_ms = max(time.time_ns() // 1_000_000, self._last_ms + 1)
        name = f"{self.alias}_{self._last_ms}"
        await self.client.create_collection(self.schema(name))
        if self.vectors:
            await self.client.create_collection(self.vectors_schema(vectors_collection(name)))
        return name

    async def switch_alias(self, name: str) -> str | None:
        """Point the aliases at ``name`` and its vectors collection (the
        keyword alias first); returns the keyword collection it pointed at."""
        previous = await self.client.get_alias(self.alias)
        await self.client.upsert_alias(self.alias, name)
        if self.vectors:
            await self.client.upsert_alias(self.vectors_alias, vectors_collection(name))
        return previous

    async def drop_collection(self, name: str) -> None:
        """Drop a keyword collection and its vectors collection, neither of
        them behind an alias (absent is fine)."""
        for alias in (self.alias, self.vectors_alias):
            target = await self.client.get_alias(alias)
            if target in (name, vectors_collection(name)):
                raise ValueError(f"refusing to drop {target!r}: alias {alias!r} points at it")
        await self.client.delete_collection(name)
        await self.client.delete_collection(vectors_collection(name))

    async def current_collection(self) -> str | None:
        """The keyword collection behind the alias, or ``None``."""
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

    async def _write_targets(self, collection: str | None) -> tuple[str, str | None]:
        """The keyword and vectors collections a write goes to: ``collection``
        and its vectors collection, else those behind the aliases, resolved
        now (a reindex in any process may just have switched them; both the
        same collection: an older Braid's; no vectors one without
        ``vectors``). Never an alias itself: Typesense 0.24.1 can lose writes
        addressed to an alias when it replays its log after a restart."""
        if not self.vectors:
            return collection or await self.client.get_alias(self.alias) or await self.ensure(), None
        if collection is not None:
            return collection, vectors_collection(collection)
        aliases = await self.client.list_aliases()
        keyword, vectors = aliases.get(self.alias), aliases.get(self.vectors_alias)
        if keyword is None or vectors is None:
            keyword = await self.ensure()
            vectors = await self.client.get_alias(self.vectors_alias) or vectors_collection(keyword)
        return keyword, vectors

    async def upsert(
        self, records: Sequence[MemoryRecord], collection: str | None = None, *, fresh: bool = False
    ) -> None:
        """Insert or replace whole documents (a field left out is removed):
        the keyword documents in one import request and, meanwhile, the
        vector documents.

        A vector document with an embedding is sent in an import request of
        its own (see :mod:`indexers.typesense.client`), unless ``fresh``:
        ``collection`` never had a document with a vector deleted or
        replaced, and nothing else writes to it meanwhile (a reindex filling
        the collection it just created, each memory once), so it has no freed
        slot to race for and ``records`` go in one request."""
        if fresh and collection is None:
            raise ValueError("fresh needs the collection named: the live one has had deletes")
        keyword, vectors = await self._write_targets(collection)
        vector_field = None if fresh else "embedding"
        if vectors is None:
            await self.client.import_documents(
                keyword, [record_document(record, stems=self.stems) for record in records]
            )
            return
        if keyword == vectors:
            docs = [combined_document(record, stems=self.stems) for record in records]
            await self.client.import_documents(keyword, docs, vector_field=vector_field, concurrency=IMPORT_CONCURRENCY)
            return
        errors: list[BackendError] = []

        async def send(collection: str, docs: list[dict[str, Any]], vector_field: str | None) -> None:
            try:
                await self.client.import_documents(
                    collection, docs, vector_field=vector_field, concurrency=IMPORT_CONCURRENCY
                )
            except BackendError as exc:
                errors.append(exc)

        # The two collections are written at once (a keyword search may find
        # a memory whose vector document is still on its way, as before).
        async with anyio.create_task_group() as tg:
            tg.start_soon(send, keyword, [record_document(record, stems=self.stems) for record in records], None)
            tg.start_soon(send, vectors, [vector_document(record) for record in records], vector_field)
        if errors:
            raise errors[0]

    async def delete(self, keys: Sequence[tuple[str, str]], collection: str | None = None) -> None:
        """Delete memories by ``(tenant, memory id)`` (both documents); absent ones are ignored."""
        ids = [document_id(tenant, memory_id) for tenant, memory_id in keys]
        keyword, vectors = await self._write_targets(collection)
        await self.client.delete_documents(keyword, ids)
        if vectors is not None and vectors != keyword:
            await self.client.delete_documents(vectors, ids)

    async def count(self, tenant: str | None = None, collection: str | None = None) -> int:
        """How many documents (of ``tenant``, if given) ``collection`` or the alias holds."""
        filter_by = None if tenant is None else f"tenant_key:={tenant_key(tenant)}"
        return await self.client.count(collection or self.alias, filter_by)

    async def fetch(self, id: str, *, tenant: str, collection: str | None = None) -> dict[str, Any] | None:
        """The tenant's stored keyword document for memory ``id``, or ``None``."""
        return await self.client.get_document(collection or self.alias, document_id(tenant, id))

    async def fetch_vector(self, id: str, *, tenant: str, collection: str | None = None) -> dict[str, Any] | None:
        """The tenant's stored vector document for memory ``id`` (in
        ``collection``'s vectors collection, else behind the vectors alias), or ``None``."""
        where = self.vectors_alias if collection is None else vectors_collection(collection)
        return await self.client.get_document(where, document_id(tenant, id))
