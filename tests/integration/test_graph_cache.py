"""The graph walked in the service (indexers.graph_cache) against the real embedded Postgres.

The oracle is the walk statement itself (``indexers.graph._walk_sql``, which
still walks recalls with ``as_of``): on random graphs the copy kept in the
service must read the same relations in the same order, and a cached
tenant's recalls must equal an uncached source's after every kind of change
another process can make.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import msgspec
import numpy as np
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from config import BraidConfig, load_config
from indexers.base import Filters, SearchQuery
from indexers.extraction import ExtractedEntity, ExtractedRelation, Extraction
from indexers.graph import GraphSource, _walk_sql
from indexers.graph_cache import CHANGED_SQL, ENTITIES_SQL, Delta, TenantGraph
from indexers.postgres import EntityInput, MemoryInput, PostgresStore, RelationInput, bump_generations
from indexers.postgres.generations import GENERATION_SQL

pytestmark = pytest.mark.anyio

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def graph_config(**changes: Any) -> BraidConfig:
    cfg = load_config()
    # Name seeding only (no entity is 0.99-similar to a question): the seeds are the names asked.
    # The cache on unless a test says otherwise (it is off in the shipped config).
    changes = {"cache_rows": 200_000, **changes}
    return msgspec.structs.replace(cfg, graph=msgspec.structs.replace(cfg.graph, seed_min_similarity=0.99, **changes))


async def random_graph(pool: AsyncConnectionPool, tenant: str, rng: random.Random) -> list[int]:
    """40 entities and ~300 relations with tied weights, self loops, derived
    relations of weight 0, and validity windows past and future; the entity ids."""
    now = datetime.now(UTC)
    async with pool.connection() as conn:
        cur = await conn.execute(
            "INSERT INTO entities (tenant, name, name_norm, embedding, model)"
            " SELECT %s, 'E' || i, 'e' || i, array_fill(0.05, ARRAY[384])::vector, 'none'"
            " FROM generate_series(0, 39) i RETURNING id",
            (tenant,),
        )
        ids = [row[0] for row in await cur.fetchall()]
        seen = set()
        rows = []
        for _ in range(300):
            src, dst = rng.choice(ids), rng.choice(ids)
            rel = rng.choice(["knows", "likes", "mentioned_with"])
            if (src, rel, dst) in seen:
                continue
            seen.add((src, rel, dst))
            window = rng.random()
            valid_from = now + timedelta(days=1) if window < 0.08 else now - timedelta(days=3) if window < 0.3 else None
            valid_to = now - timedelta(days=1) if 0.3 <= window < 0.38 else None
            rows.append(
                (
                    tenant,
                    src,
                    rel,
                    dst,
                    rng.choice([0.0, 0.5, 1.0, 1.0, 2.0, 3.5]),
                    rng.random() < 0.5,
                    valid_from,
                    valid_to,
                )
            )
        async with conn.cursor() as c:
            await c.executemany(
                "INSERT INTO relations (tenant, source_id, relation, target_id, weight, derived, valid_from, valid_to)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                rows,
            )
    return ids


async def statement_walk(
    pool: AsyncConnectionPool, tenant: str, names: list[str], **params: Any
) -> tuple[list[Any], list[Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            _walk_sql(False, False, True), {"tenant": tenant, "names": names, "as_of": None, **params}
        )
        rows = await cur.fetchall()
    return [r[1] for r in rows if r[0] is None], [r for r in rows if r[0] is not None]


async def cached(pool: AsyncConnectionPool, tenant: str) -> TenantGraph:
    async with pool.connection() as conn:
        cur = await conn.execute(CHANGED_SQL, {"tenant": tenant, "since": "0", "running": [], "limit": 100_000})
        rows = await cur.fetchall()
    graph = TenantGraph()
    graph.apply(Delta(("1", ()), rows, []))
    return graph


async def test_the_walk_in_the_service_reads_what_the_statement_reads(pool: AsyncConnectionPool) -> None:
    checked = 0
    for seed in range(3):
        rng = random.Random(seed)
        tenant = f"walk-{seed}"
        ids = await random_graph(pool, tenant, rng)
        graph = await cached(pool, tenant)
        for _ in range(12):
            picked = rng.sample(range(40), rng.randint(1, 3))
            params = {
                "hops": rng.choice([0, 1, 2, 3]),
                "fanout": rng.choice([1, 3, 16]),
                "max_edges": rng.choice([7, 2000]),
            }
            seeds, rows = await statement_walk(pool, tenant, [f"e{i}" for i in picked], **params)
            assert sorted(seeds) == sorted(ids[i] for i in picked)
            edges = graph.walk(seeds, now=time.time(), **params)
            # Everything but the names, which the service reads for facts only.
            assert [e[:6] + e[8:] for e in edges] == [tuple(r[:6]) + (r[8],) for r in rows], params
            checked += bool(rows)
    # The comparison is not vacuous: most walks read relations.
    assert checked >= 24


class Writer:
    def __init__(self, pool: AsyncConnectionPool, embedder: Any) -> None:
        self.store = PostgresStore(pool)
        self.embedder = embedder

    async def graph(self, tenant: str, names: list[str], relations: list[RelationInput]) -> None:
        vectors = await self.embedder.embed(names)
        entities = [EntityInput(name=n, embedding=v, model=self.embedder.model) for n, v in zip(names, vectors)]
        await self.store.write_graph(tenant, entities, relations)

    async def memory(
        self, tenant: str, memory_id: str, content: str, entities: tuple[str, ...], created_at: datetime = T0
    ) -> None:
        (vector,) = await self.embedder.embed([content])
        await self.store.write_memories(
            tenant,
            [
                MemoryInput(
                    id=memory_id,
                    content=content,
                    kind="note",
                    tier="session",
                    created_at=created_at,
                    entities=entities,
                    embedding=vector,
                    model=self.embedder.model,
                )
            ],
        )


def query(tenant: str, text: str, limit: int = 20) -> SearchQuery:
    return SearchQuery(tenant=tenant, text=text, vector=None, limit=limit, filters=Filters())


async def both(cached_source: GraphSource, statement: GraphSource, q: SearchQuery) -> list[tuple[str, float]]:
    """The cached source's hits, checked equal to the statement's (a tenant's
    first recall walks by the statement and starts its load: waited for)."""
    got = [(h.id, round(h.score, 9), h.content) for h in await cached_source.search(q)]
    await cached_source.settle()
    want = [(h.id, round(h.score, 9), h.content) for h in await statement.search(q)]
    assert got == want
    return [(i, s) for i, s, _ in got]


async def test_a_cached_tenant_sees_every_change_another_process_makes(
    pool: AsyncConnectionPool, embedder: Any
) -> None:
    cfg = graph_config()
    source = GraphSource(pool, lambda: cfg)
    uncached = GraphSource(pool, lambda: graph_config(cache_rows=0))
    w = Writer(pool, embedder)
    t = "changes"
    await w.graph(t, ["Alex", "TypeScript", "Bob"], [RelationInput("Alex", "prefers", "TypeScript")])
    await w.memory(t, "m-ts", "The web client is typed.", ("TypeScript",))
    q = query(t, "What does Alex like?")

    first = await both(source, uncached, q)
    assert source.cache.get(t) is not None, "the first recall loads the tenant"
    assert [i for i, _ in first if not i.startswith("rel:")] == ["m-ts"]

    # A new relation and a memory behind it (written as another process would).
    await w.graph(t, ["Alex", "Rust"], [RelationInput("Alex", "learns", "Rust", weight=2.0)])
    await w.memory(t, "m-rust", "The parser is in Rust.", ("Rust",))
    hits = await both(source, uncached, q)
    assert "m-rust" in dict(hits)

    # A weight change re-orders the walk's relations (its transaction bumps the
    # tenant's generation last, as every writer of Braid's does).
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("UPDATE relations SET weight = 0.1 WHERE tenant = %s AND relation = 'learns'", (t,))
        await bump_generations(conn, [t])
    after = await both(source, uncached, q)
    assert dict(after)["m-rust"] < dict(hits)["m-rust"]

    # A memory deleted: its mentions go with it.
    await w.memory(t, "m-rust-2", "Rust again.", ("Rust",))
    assert "m-rust-2" in dict(await both(source, uncached, q))
    assert await w.store.delete_memory(t, "m-rust-2") is not None
    assert "m-rust-2" not in dict(await both(source, uncached, q))

    # A relation deleted, then an entity with its relations (a cascade leaves tombstones too).
    await w.store.delete_relations(t, "Alex", "Rust")
    assert "m-rust" not in dict(await both(source, uncached, q))
    await w.store.delete_entity(t, "TypeScript")
    assert not [i for i, _ in await both(source, uncached, q) if i in ("m-ts", "m-rust")]
    graph = source.cache.get(t)
    assert graph is not None and all(r[2] != "prefers" for r in graph.rels.values())


#: The newest transaction id that wrote or deleted any of a tenant's relations, mentions or entities.
_LAST_CHANGE_SQL = " UNION ALL ".join(
    f"SELECT max(changed)::text AS c FROM {table} WHERE tenant = %(t)s"
    for table in ("relations", "mentions", "entities", "relation_tombstones", "mention_tombstones", "entity_tombstones")
)


async def test_every_write_that_changes_a_tenants_graph_moves_its_generation(
    pool: AsyncConnectionPool, embedder: Any
) -> None:
    """A kept copy whose generation has not moved is walked without reading
    changes: so no write of Braid's may change a tenant's relations, mentions
    or entities without bumping its generation in the same transaction."""
    w = Writer(pool, embedder)
    t = "generations"

    async def state() -> tuple[int, int]:
        async with pool.connection() as conn:
            cur = await conn.execute(f"SELECT max(c::xid8)::text FROM ({_LAST_CHANGE_SQL}) x", {"t": t})
            (last,) = await cur.fetchone()  # type: ignore[misc]
            cur = await conn.execute("SELECT generation FROM tenant_generations WHERE tenant = %s", (t,))
            row = await cur.fetchone()
        return int(last or 0), int(row[0]) if row else 0

    steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("graph write", lambda: w.graph(t, ["Ada", "Lisp"], [RelationInput("Ada", "writes", "Lisp")])),
        ("memory write", lambda: w.memory(t, "m1", "Ada writes Lisp.", ("Ada", "Lisp"))),
        ("memory rewrite", lambda: w.memory(t, "m1", "Ada writes Prolog.", ("Ada", "Prolog"))),
        (
            "re-extraction",
            lambda: w.store.apply_extraction(
                t,
                ["m1"],
                [
                    Extraction(
                        entities=(ExtractedEntity("Ada", "PERSON"), ExtractedEntity("Lisp", "PRODUCT")),
                        relations=(ExtractedRelation("Ada", "learns", "Lisp"),),
                    )
                ],
            ),
        ),
        ("relations deleted", lambda: w.store.delete_relations(t, "Ada", "Lisp")),
        ("memory deleted", lambda: w.store.delete_memory(t, "m1")),
        ("entity deleted", lambda: w.store.delete_entity(t, "Lisp")),
    ]
    before = await state()
    for name, step in steps:
        await step()
        after = await state()
        assert after[0] > before[0], f"{name} changed nothing in the graph: the step checks nothing"
        assert after[1] > before[1], f"{name} changed the graph without moving the generation"
        before = after


async def test_memories_scored_in_the_service_are_the_statements(pool: AsyncConnectionPool, embedder: Any) -> None:
    rng = random.Random(7)
    t = "memory-step"
    await random_graph(pool, t, rng)
    w = Writer(pool, embedder)
    # Entities named by many memories (past the cap of 3 below), times that tie, a superseded memory.
    for i in range(60):
        named = tuple(f"E{j}" for j in rng.sample(range(12), rng.randint(1, 3)))
        await w.memory(t, f"m{i:03d}", f"memory {i}", named, created_at=T0 + timedelta(hours=rng.randint(0, 4)))
    async with pool.connection() as conn:
        await conn.execute("UPDATE memories SET superseded_at = now() WHERE tenant = %s AND id = 'm007'", (t,))
    for cap in (3, 100):
        source = GraphSource(pool, lambda cap=cap: graph_config(mentions_per_entity=cap))  # type: ignore[misc]
        uncached = GraphSource(pool, lambda cap=cap: graph_config(mentions_per_entity=cap, cache_rows=0))  # type: ignore[misc]
        scored = 0
        for _ in range(15):
            names = " ".join(f"E{j}" for j in rng.sample(range(14), rng.randint(1, 3)))
            # Past the facts (half the random relations are a client's): the memories.
            hits = await both(source, uncached, query(t, names, limit=300))
            scored += sum(1 for i, _ in hits if i.startswith("m"))
        assert source.cache.get(t) is not None and scored > 30
        assert "m007" not in {i for i, _ in hits}


async def test_a_change_whose_transaction_began_before_the_cursor_is_not_missed(
    pool: AsyncConnectionPool, embedder: Any
) -> None:
    source = GraphSource(pool, lambda: graph_config())
    w = Writer(pool, embedder)
    t = "in-flight"
    await w.graph(t, ["Ada", "Lisp", "Prolog"], [RelationInput("Ada", "writes", "Lisp")])
    q = query(t, "Ada")
    await source.search(q)
    await source.settle()
    assert source.cache.get(t) is not None
    async with await psycopg.AsyncConnection.connect(pool.conninfo) as other:
        # The relation's transaction has its id before the next recall reads a
        # cursor, and commits after that recall: a cursor taken from the
        # recall's own snapshot would step over it.
        cur = await other.execute(
            "INSERT INTO relations (tenant, source_id, relation, target_id)"
            " SELECT %s, a.id, 'writes', p.id FROM entities a, entities p"
            " WHERE a.tenant = %s AND p.tenant = %s AND a.name = 'Ada' AND p.name = 'Prolog' RETURNING id",
            (t, t, t),
        )
        (rid,) = await cur.fetchone()  # type: ignore[misc]
        # A later transaction completes meanwhile: the newest snapshot's xmax
        # passes the open one, its xmin does not.
        await w.graph("in-flight-other", ["Later"], [])
        facts = {h.content for h in await source.search(q)}
        assert "Ada writes Prolog." not in facts
        # Its last statement bumps the tenant's generation, as every writer's does.
        await bump_generations(other, [t])
        await other.commit()
    facts = {h.content for h in await source.search(q)}
    assert "Ada writes Prolog." in facts
    graph = source.cache.get(t)
    assert graph is not None and rid in graph.rels


async def test_a_tenant_is_loaded_off_the_recall_and_its_deadline(pool: AsyncConnectionPool, embedder: Any) -> None:
    source = GraphSource(pool, lambda: graph_config())
    w = Writer(pool, embedder)
    t = "loaded-aside"
    await w.graph(t, ["Noor", "Haskell"], [RelationInput("Noor", "teaches", "Haskell")])
    await w.memory(t, "m-hs", "Lectures on Haskell.", ("Haskell",))
    q = query(t, "Noor")
    # A recall cancelled at once (its deadline passed) does not take the tenant's first read with it.
    with anyio.move_on_after(0):
        await source.search(q)
    assert source.cache.get(t) is None
    # Meanwhile the tenant's recalls are walked by the statement, and start no second read.
    assert source.cache.refresh(t) is None
    before = dict(source.cache.walks)
    assert "m-hs" in {h.id for h in await source.search(q)}
    assert source.cache.walks["postgres"] == before["postgres"] + 1
    await source.settle()
    assert source.cache.get(t) is not None
    assert "m-hs" in {h.id for h in await source.search(q)}
    assert source.cache.walks["here"] == before["here"] + 1


async def test_a_tenant_over_the_limit_is_walked_by_postgres(pool: AsyncConnectionPool, embedder: Any) -> None:
    source = GraphSource(pool, lambda: graph_config(cache_rows=2))
    uncached = GraphSource(pool, lambda: graph_config(cache_rows=0))
    w = Writer(pool, embedder)
    t = "too-big"
    await w.graph(
        t,
        ["Kim", "Go", "Zig", "Nim"],
        [RelationInput("Kim", "uses", "Go"), RelationInput("Kim", "uses", "Zig"), RelationInput("Kim", "uses", "Nim")],
    )
    q = query(t, "Kim")
    hits = await both(source, uncached, q)
    assert len(hits) == 3
    assert source.cache.get(t) is None and source.cache.relations == 0
    # Refused for a while: the next recall does not read the tenant whole again.
    assert source.cache.refresh(t) is None


async def test_tombstones_are_kept_for_a_while_then_dropped(pool: AsyncConnectionPool, embedder: Any) -> None:
    w = Writer(pool, embedder)
    t = "tombstones"
    await w.graph(t, ["Old", "New"], [RelationInput("Old", "before", "New"), RelationInput("New", "after", "Old")])
    assert await w.store.delete_relations(t, "Old", "New") == 1
    assert await w.store.delete_relations(t, "New", "Old") == 1
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM relation_tombstones WHERE tenant = %s", (t,))
        assert (await cur.fetchone()) == (2,)
        await conn.execute(
            "UPDATE relation_tombstones SET dropped_at = dropped_at - interval '2 hours'"
            " WHERE tenant = %s AND relation_id = (SELECT min(relation_id) FROM relation_tombstones WHERE tenant = %s)",
            (t, t),
        )
    assert await w.store.drop_tombstones() >= 1
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM relation_tombstones WHERE tenant = %s", (t,))
        assert (await cur.fetchone()) == (1,)


async def statement_seeds(pool: AsyncConnectionPool, tenant: str, names: list[str], **params: Any) -> dict[int, float]:
    """The seeds the walk statement finds (its rows without a relation), compared exactly (``exact_below`` high)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            _walk_sql(True, False, True),
            {
                "tenant": tenant,
                "names": names,
                "as_of": None,
                "hops": 0,
                "fanout": 1,
                "max_edges": 1,
                "exact_below": 1_000_000,
                **params,
            },
        )
        rows = await cur.fetchall()
    return dict(sorted((r[1], r[5]) for r in rows if r[0] is None))


async def test_the_seeds_found_in_the_service_are_the_statements(pool: AsyncConnectionPool) -> None:
    """On 60 entities of random vectors (two models, repeated vectors that tie,
    a zero vector), the copy's seeds equal the walk statement's: the named
    entities, and the nearest of the query's model past the floor."""
    rng = np.random.default_rng(3)
    t = "seeds"
    vectors = rng.normal(size=(60, 384)).astype(np.float32)
    vectors[10] = vectors[11] = vectors[12]  # ties at one similarity, broken by id
    vectors[20] = 0.0
    models = ["m" if i % 5 else "other" for i in range(60)]
    async with pool.connection() as conn, conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO entities (tenant, name, name_norm, embedding, model) VALUES (%s, %s, %s, %s, %s)",
            [(t, f"E{i}", f"e{i}", vectors[i], models[i]) for i in range(60)],
        )
    graph = TenantGraph()
    async with pool.connection() as conn:
        cur = await conn.execute(ENTITIES_SQL, {"tenant": t, "since": "0", "running": [], "limit": 100_000})
        graph.apply(Delta(("1", ()), [], [], entities=await cur.fetchall()))
    assert len(graph.entities) == 60
    checked = 0
    for _ in range(40):
        near = int(rng.integers(60))
        query_vector = vectors[near] + rng.normal(scale=float(rng.choice([0.2, 1.0, 3.0])), size=384)
        names = [f"e{i}" for i in rng.choice(62, size=int(rng.integers(0, 3)), replace=False)]
        params = {"limit": int(rng.choice([1, 3, 8, 100])), "min_similarity": float(rng.choice([-1.0, 0.1, 0.5]))}
        want = await statement_seeds(pool, t, names, vec=query_vector.astype(np.float32), model="m", **params)
        got = graph.seeds(names, query_vector, model="m", **params)
        assert list(got) == list(want), (names, params)
        assert got == pytest.approx(want, abs=1e-6)
        checked += len(want) > len(names)
    assert checked >= 20, "most queries are seeded by vector"


async def test_a_kept_tenant_sends_only_its_changes_and_answers_as_the_statement(
    pool: AsyncConnectionPool, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vector-seeded walk of a kept tenant reads its generation, then what
    changed only when it moved, nothing else (no seeds statement, no vector
    search settings: the seeds are found in the service), and finds what the
    walk statement finds, also after its entities change."""
    import indexers.graph

    cfg = msgspec.structs.replace(
        graph_config(), graph=msgspec.structs.replace(graph_config().graph, seed_min_similarity=0.3)
    )
    uncached_cfg = msgspec.structs.replace(cfg, graph=msgspec.structs.replace(cfg.graph, cache_rows=0))
    source = GraphSource(pool, lambda: cfg)
    uncached = GraphSource(pool, lambda: uncached_cfg)
    w = Writer(pool, embedder)
    t = "kept-seeds"
    await w.graph(t, ["Ada", "Lisp", "Grace"], [RelationInput("Ada", "writes", "Lisp")])
    await w.memory(t, "m1", "Ada writes Lisp.", ("Ada", "Lisp"))
    await w.memory(t, "m2", "Grace wrote compilers.", ("Grace",))
    (vector,) = await embedder.embed(["the programmer Ada"])
    q = msgspec.structs.replace(query(t, "who writes programs?"), vector=vector, model=embedder.model)
    await both(source, uncached, q)
    assert source.cache.get(t) is not None

    sent: list[tuple[list[str], Any]] = []
    real = indexers.graph.tenant_reads

    async def recorded(pool: Any, tenant: str, reads: Any, **kwargs: Any) -> Any:
        sent.append(([r.sql for r in reads], kwargs.get("settings")))
        return await real(pool, tenant, reads, **kwargs)

    monkeypatch.setattr(indexers.graph, "tenant_reads", recorded)
    unchanged = source.cache.walks["unchanged"]
    hits = await both(source, uncached, q)
    assert "m1" in dict(hits)
    # Nothing written since the copy's read: one round trip, the generation
    # read first with the memories, no change read.
    assert source.cache.walks["unchanged"] == unchanged + 1
    # (The statement's own reads follow the cached source's one.)
    assert GENERATION_SQL not in sent[1][0]
    statements, _ = sent[0]
    assert statements[0] == GENERATION_SQL
    assert not any("changed" in sql or "pg_current_snapshot" in sql for sql in statements)
    # Entities deleted and made by another process: the copy walked first is
    # found behind, and walked again from the changes alone.
    await w.store.delete_entity(t, "Ada")
    await w.graph(t, ["Hopper"], [RelationInput("Hopper", "knows", "Grace")])
    sent.clear()
    stale = source.cache.walks["stale"]
    await both(source, uncached, q)
    assert source.cache.walks["unchanged"] == unchanged + 1
    assert source.cache.walks["stale"] == stale + 1
    assert sent[0][0][0] == GENERATION_SQL
    statements, scope_settings = sent[1]
    assert scope_settings is None
    assert statements and all("changed" in sql or "pg_current_snapshot" in sql for sql in statements)
    assert not any("seeds AS MATERIALIZED" in sql or "set_config" in sql for sql in statements)
    graph = source.cache.get(t)
    assert graph is not None and "ada" not in graph.named and "hopper" in graph.named
    # Its generation moved at the last read: written again, the next walk
    # reads the generation first (no copy walked twice)...
    await w.graph(t, ["Turing"], [RelationInput("Turing", "knows", "Grace")])
    sent.clear()
    await both(source, uncached, q)
    assert source.cache.walks["stale"] == stale + 1
    assert GENERATION_SQL not in sent[0][0]
    assert all("changed" in sql or "pg_current_snapshot" in sql for sql in sent[0][0])
    # ...and so does the one after, which finds it unmoved...
    sent.clear()
    await both(source, uncached, q)
    assert source.cache.walks["unchanged"] == unchanged + 2
    assert GENERATION_SQL not in sent[0][0]
    assert not any("changed" in sql for sql in sent[0][0])
    # ...after which the copy is walked at once again.
    sent.clear()
    await both(source, uncached, q)
    assert source.cache.walks["unchanged"] == unchanged + 3
    assert sent[0][0][0] == GENERATION_SQL


async def test_a_ranked_read_goes_on_past_candidates_that_fail_the_lifecycle_rules(
    pool: AsyncConnectionPool, embedder: Any
) -> None:
    """The memories the service scores are read a slice at a time (the limit
    and a margin): when the best candidates are superseded, the next slices
    are read until the limit is filled, and the answer is the statement's."""
    t = "slices"
    w = Writer(pool, embedder)
    await w.graph(t, ["Hub", "Spoke"], [RelationInput("Hub", "has", "Spoke")])
    for i in range(40):
        await w.memory(t, f"m{i:02d}", f"memory {i} of the hub", ("Hub",))
    async with pool.connection() as conn:
        # Every memory ties on the hub's share, so they rank by id: the first 30 fail.
        await conn.execute(
            "UPDATE memories SET superseded_at = now() WHERE tenant = %s AND id < 'm30'",
            (t,),
        )
    source = GraphSource(pool, lambda: graph_config())
    uncached = GraphSource(pool, lambda: graph_config(cache_rows=0))
    await source.search(query(t, "Hub"))
    await source.settle()
    assert source.cache.get(t) is not None
    hits = await both(source, uncached, query(t, "Hub", limit=5))
    # The fact (Hub has Spoke) takes one place of five.
    assert [i for i, _ in hits if not i.startswith("rel:")] == ["m30", "m31", "m32", "m33"] and len(hits) == 5
