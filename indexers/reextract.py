"""The reindex target ``graph``: extract entities and relations again from
every stored memory, with the extractor ``graph.extract`` names now.

For memories written while extraction was ``none`` or failing, by an older
Braid, or before a change of extractor. Memories are read in (tenant, id)
order, :data:`BATCH` at a time; each tenant's part of a batch is extracted
on the extractor's lane, its new entities embedded on the embedder's write
lane (recalls have their own lanes), and written in one transaction
(:meth:`indexers.postgres.PostgresStore.apply_extraction`): the extracted
entities are linked, the links made before stay (a client's, or known names
found in the text), and each memory supports exactly the relations extracted
now. Recalls keep working throughout.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from itertools import groupby
from typing import Any

from config import BraidConfig

from .embedding import Embedder, NameVectors
from .extraction import Extractor
from .postgres import EntityInput, PostgresStore, normalize_name

__all__ = ["BATCH", "reextract"]

log = logging.getLogger("braid.reindex")

#: Memories read and extracted per step.
BATCH = 128


async def reextract(
    store: PostgresStore,
    embedder: Embedder,
    extractor: Extractor,
    cfg: BraidConfig,
    report: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """Extract again from every memory, reporting ``{"graph": {...}}`` progress
    after each batch: ``done``/``total`` memories, ``entities`` created and
    ``relations`` extracted so far."""
    pool = store.pool
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM memories")
        row = await cur.fetchone()
    total = int(row[0]) if row else 0
    progress: dict[str, Any] = {"extractor": extractor.name, "done": 0, "total": total, "entities": 0, "relations": 0}
    await report({"graph": progress})
    speakers: dict[str, frozenset[str]] = {}
    after = ("", "")
    #: A name another tenant had is not embedded again in this job.
    names_seen = NameVectors()
    while True:
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT tenant, id, content FROM memories WHERE (tenant, id) > (%s, %s) ORDER BY tenant, id LIMIT %s",
                (*after, BATCH),
            )
            rows = await cur.fetchall()
            for tenant in {r[0] for r in rows} - speakers.keys():
                cur = await conn.execute("SELECT name FROM speakers WHERE tenant = %s", (tenant,))
                speakers[tenant] = frozenset(normalize_name(n) for (n,) in await cur.fetchall())
        if not rows:
            break
        for tenant, group in groupby(rows, key=lambda r: r[0]):
            part = list(group)
            found = await extractor.extract(
                [r[2] for r in part], skip=speakers[tenant], max_entities=cfg.graph.extract_max_entities
            )
            names: dict[str, tuple[str, str]] = {}
            for x in found:
                for e in x.entities:
                    names.setdefault(normalize_name(e.name), (e.name, e.type))
            existing = await store.existing_entities(tenant, [n for n, _ in names.values()])
            new = [(n, t) for norm, (n, t) in sorted(names.items()) if norm not in existing]
            vectors = await names_seen.embed(embedder, [n for n, _ in new])
            entities = [
                EntityInput(name=n, embedding=v, model=embedder.model, type=t)
                for (n, t), v in zip(new, vectors, strict=True)
            ]
            await store.apply_extraction(
                tenant, [r[1] for r in part], found, entities, entity_exact_below=cfg.tiers[cfg.entity_tier].exact_below
            )
            progress["entities"] += len(entities)
            progress["relations"] += sum(len(x.relations) for x in found)
        after = (rows[-1][0], rows[-1][1])
        progress["done"] += len(rows)
        await report({"graph": progress})
        log.info("re-extracting: %d/%d memories, %d entities created", progress["done"], total, progress["entities"])
