"""The Postgres source of truth: migrations and every write, against the real
embedded Postgres 18. Each test gets a fresh database."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import numpy as np
import psycopg
import pytest

from deploy.embedded import EmbeddedPostgres
from indexers.extraction import COOCCURRENCE, ExtractedEntity, ExtractedRelation, Extraction
from indexers.migrations import MIGRATIONS, SchemaMismatch, migrate
from indexers.postgres import (
    Deleted,
    EntityInput,
    MemoryInput,
    PostgresStore,
    RelationInput,
    by_ids_sql,
    name_candidates,
    normalize_name,
    open_pool,
)
from tests.api.conftest import fresh_database

pytestmark = pytest.mark.anyio

DIM = 384
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
MISMATCH = "the database stores 384-d embeddings but embedding.dim is 8; use a new database or the matching model"


def vector(seed: int) -> tuple[float, ...]:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return tuple(float(x) for x in v / np.linalg.norm(v))


def memory(mid: str | None, content: str, **fields: Any) -> MemoryInput:
    values: dict[str, Any] = {"kind": "note", "tier": "session", "created_at": T0}
    values.update(fields)
    return MemoryInput(content=content, id=mid, embedding=vector(len(content)), model="synthetic", **values)


def entity(name: str, **fields: Any) -> EntityInput:
    return EntityInput(name=name, embedding=vector(len(name)), model="synthetic", **fields)


@pytest.fixture
def dsn(postgres: EmbeddedPostgres) -> str:
    return fresh_database(postgres)


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[PostgresStore]:
    pool = await open_pool(dsn, dim=DIM, min_size=1, max_size=4)
    yield PostgresStore(pool)
    await pool.close()


async def rows(store: PostgresStore, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    async with store.pool.connection() as conn:
        cur = await conn.execute(sql, params or None)
        return await cur.fetchall()


async def outbox(store: PostgresStore, tenant: str) -> list[tuple[str, str]]:
    return [
        (mid, op)  # type: ignore[misc]
        for mid, op in await rows(store, "SELECT memory_id, op FROM outbox WHERE tenant = %s ORDER BY id", tenant)
    ]


async def mentions(store: PostgresStore, tenant: str, memory_id: str) -> list[str]:
    return [
        name
        for (name,) in await rows(
            store,
            "SELECT e.name_norm FROM mentions m JOIN entities e ON e.id = m.entity_id"
            " WHERE m.tenant = %s AND m.memory_id = %s ORDER BY 1",
            tenant,
            memory_id,
        )
    ]


# --- migrations --------------------------------------------------------------


async def old_memories(conn: psycopg.AsyncConnection[Any]) -> None:
    """Tenant ``t``'s memories old1..old3, written straight into an older schema."""
    await conn.execute(
        "INSERT INTO memories (tenant, id, content, kind, tier, created_at, embedding, model)"
        " SELECT 't', 'old' || n, 'an old memory', 'note', 'session', now(), %s::vector, 'm'"
        " FROM generate_series(1, 3) n",
        (str(list(vector(1))),),
    )


async def test_migrations_apply_once(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        assert await migrate(conn, dim=DIM) == sorted(MIGRATIONS)
        assert await migrate(conn, dim=DIM) == []
        cur = await conn.execute("SELECT version FROM braid_migrations ORDER BY 1")
        assert [v for (v,) in await cur.fetchall()] == sorted(MIGRATIONS)
        cur = await conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1"
        )
        assert [t for (t,) in await cur.fetchall()] == [
            "braid_meta",
            "braid_migrations",
            "entities",
            "entity_degrees",
            "entity_tombstones",
            "fold_epochs",
            "memories",
            "memory_usage",
            "mention_tombstones",
            "mentions",
            "outbox",
            "pgvector_own_indexes",
            "reindex_jobs",
            "relation_support",
            "relation_tombstones",
            "relations",
            "speakers",
            "tenant_generations",
            "typesense_placements",
        ]
        cur = await conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = 'memories'::regclass AND attname IN ('embedding', 'folded') ORDER BY 1"
        )
        assert await cur.fetchall() == [("embedding", "vector(384)"), ("folded", "vector(384)")]


async def test_one_active_reindex_migration_ends_jobs_an_older_braid_left(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import indexers.migrations as migrations

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        monkeypatch.setattr(migrations, "MIGRATIONS", {v: f for v, f in MIGRATIONS.items() if v < 6})
        await migrate(conn, dim=DIM)
        for job in ("a", "b"):
            await conn.execute("INSERT INTO reindex_jobs (id, target, status) VALUES (%s, 'all', 'running')", (job,))
        monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS)
        assert await migrate(conn, dim=DIM) == [v for v in sorted(MIGRATIONS) if v >= 6]
        cur = await conn.execute("SELECT id, status FROM reindex_jobs ORDER BY id")
        assert await cur.fetchall() == [("a", "interrupted"), ("b", "interrupted")]
        with pytest.raises(psycopg.errors.UniqueViolation):
            for job in ("c", "d"):
                await conn.execute("INSERT INTO reindex_jobs (id, target, status) VALUES (%s, 'all', 'queued')", (job,))


async def test_migration_10_sends_every_existing_memory_to_typesense_again(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older database's memories get the lifecycle columns (current, no key)
    and an outbox row each, so their Typesense documents gain the lifecycle."""
    from indexers import migrations

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        monkeypatch.setattr(migrations, "MIGRATIONS", {v: f for v, f in MIGRATIONS.items() if v < 10})
        await migrate(conn, dim=DIM)
        await old_memories(conn)
        monkeypatch.setattr(migrations, "MIGRATIONS", {v: f for v, f in MIGRATIONS.items() if v < 13})
        # A database at 9 goes through supersession (10), forgetting (11) and
        # embedding versions (12, which finds no `client` vectors here).
        assert await migrate(conn, dim=DIM) == [10, 11, 12]
        cur = await conn.execute("SELECT memory_id, op FROM outbox WHERE processed_at IS NULL ORDER BY memory_id")
        assert await cur.fetchall() == [("old1", "upsert"), ("old2", "upsert"), ("old3", "upsert")]
        # The bm25 fields (13) and their term counts (14): each memory's
        # document is rewritten once more by each.
        for version in (13, 14):
            monkeypatch.setattr(migrations, "MIGRATIONS", {v: f for v, f in MIGRATIONS.items() if v <= version})
            await conn.execute("UPDATE outbox SET processed_at = now()")
            assert await migrate(conn, dim=DIM) == [version]
            cur = await conn.execute("SELECT memory_id, op FROM outbox WHERE processed_at IS NULL ORDER BY memory_id")
            assert await cur.fetchall() == [("old1", "upsert"), ("old2", "upsert"), ("old3", "upsert")]
        monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS)
        cur = await conn.execute("SELECT DISTINCT mem_key, superseded_at, superseded_by, expires_at FROM memories")
        assert await cur.fetchall() == [(None, None, None, None)]
        cur = await conn.execute("SELECT count(*) FROM tenant_generations")
        assert await cur.fetchall() == [(0,)]


async def test_migration_26_rewrites_every_document_and_the_old_terms_are_asked_for_until_then(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 26 queues every memory (their keyword documents get the
    short term key) and keeps the last queued row: the rewrite is pending
    while one of those rows is, and a row written after it does not hold it."""
    from indexers import migrations
    from indexers.sync import TermKeyRewrite

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        monkeypatch.setattr(migrations, "MIGRATIONS", {v: f for v, f in MIGRATIONS.items() if v < 26})
        await migrate(conn, dim=DIM)
        await old_memories(conn)
        await conn.execute("UPDATE outbox SET processed_at = now()")
        monkeypatch.setattr(migrations, "MIGRATIONS", {v: f for v, f in MIGRATIONS.items() if v <= 26})
        assert await migrate(conn, dim=DIM) == [26]
        cur = await conn.execute("SELECT memory_id FROM outbox WHERE processed_at IS NULL ORDER BY id")
        queued = [m for (m,) in await cur.fetchall()]
        assert sorted(queued) == ["old1", "old2", "old3"]
        cur = await conn.execute("SELECT value FROM braid_meta WHERE key = %s", (migrations.TERM_KEY_REWRITE,))
        (through,) = await cur.fetchone() or (None,)
        cur = await conn.execute("SELECT max(id) FROM outbox")
        assert (await cur.fetchone() or (None,))[0] == int(through)

    pool = await open_pool(dsn, dim=DIM, min_size=1, max_size=2)
    try:
        rewrite = TermKeyRewrite()
        assert await rewrite.check(pool) and rewrite()
        async with pool.connection() as conn:
            await conn.execute("UPDATE outbox SET processed_at = now() WHERE memory_id IN ('old1', 'old2')")
            assert await rewrite.check(pool)  # old3 still pending
            # A row queued after the migration does not hold the rewrite pending.
            await conn.execute("INSERT INTO outbox (tenant, memory_id, op) VALUES ('t', 'new', 'upsert')")
            await conn.execute("UPDATE outbox SET processed_at = now() WHERE memory_id = 'old3'")
        assert not await rewrite.check(pool) and not rewrite()
    finally:
        await pool.close()


async def test_a_new_database_has_no_term_key_rewrite_pending(store: PostgresStore) -> None:
    from indexers.sync import TermKeyRewrite

    await store.write_memories("t", [memory("m1", "written after every migration")])
    rewrite = TermKeyRewrite()
    assert rewrite() and not await rewrite.check(store.pool)


async def test_migration_12_records_the_model_of_vectors_writers_gave(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Vectors a writer gave were recorded as ``client`` and compared with the
    service's query vectors: they now carry the model the database records,
    with an outbox row each; other models' rows are left as they are."""
    from indexers import migrations

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        monkeypatch.setattr(migrations, "MIGRATIONS", {v: f for v, f in MIGRATIONS.items() if v < 12})
        await migrate(conn, dim=DIM)
        await conn.execute("INSERT INTO braid_meta (key, value) VALUES ('embedding_model', 'the-model')")
        await conn.execute(
            "INSERT INTO memories (tenant, id, content, kind, tier, created_at, embedding, model)"
            " SELECT 't', 'm' || n, 'a memory', 'note', 'session', now(), %s::vector,"
            " CASE WHEN n < 3 THEN 'client' ELSE 'other-model' END"
            " FROM generate_series(1, 4) n",
            (str(list(vector(1))),),
        )
        monkeypatch.setattr(migrations, "MIGRATIONS", {v: f for v, f in MIGRATIONS.items() if v < 13})
        assert await migrate(conn, dim=DIM) == [12]
        cur = await conn.execute("SELECT id, model FROM memories ORDER BY id")
        assert await cur.fetchall() == [
            ("m1", "the-model"),
            ("m2", "the-model"),
            ("m3", "other-model"),
            ("m4", "other-model"),
        ]
        cur = await conn.execute("SELECT memory_id, op FROM outbox WHERE processed_at IS NULL ORDER BY memory_id")
        assert await cur.fetchall() == [("m1", "upsert"), ("m2", "upsert")]


async def test_a_database_with_11_but_not_10_gets_10(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database migrated by a Braid without supersession (1-9 and 11) gains
    migration 10 alone: versions apply in order and need not be contiguous."""
    from indexers import migrations

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        monkeypatch.setattr(migrations, "MIGRATIONS", {v: f for v, f in MIGRATIONS.items() if v != 10})
        assert 11 in await migrate(conn, dim=DIM)
        monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS)
        assert await migrate(conn, dim=DIM) == [10]
        cur = await conn.execute("SELECT version FROM braid_migrations ORDER BY version")
        assert [v for (v,) in await cur.fetchall()] == sorted(MIGRATIONS)


async def test_concurrent_migrations_apply_once(dsn: str) -> None:
    results: list[list[int]] = []

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            results.append(await migrate(conn, dim=DIM))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(run)
    assert sorted(results) == [[], [], sorted(MIGRATIONS)]


async def test_dimension_mismatch_is_refused(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await migrate(conn, dim=DIM)
        with pytest.raises(SchemaMismatch) as info:
            await migrate(conn, dim=8)
        assert str(info.value) == MISMATCH
        # The advisory lock was released: another session can migrate at once.
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            with anyio.fail_after(5):
                assert await migrate(other, dim=DIM) == []
    with pytest.raises(SchemaMismatch) as info:
        await open_pool(dsn, dim=8, min_size=1, max_size=1)
    assert str(info.value) == MISMATCH


# --- memories ----------------------------------------------------------------


async def test_upsert_by_id_keeps_one_row_and_replaces_it(store: PostgresStore) -> None:
    assert (await store.write_memories("t", [memory("m1", "first version", tags=("a",))])).ids == ["m1"]
    later = T0 + timedelta(days=1)
    await store.write_memories(
        "t", [memory("m1", "second version", kind="preference", created_at=later, confidence=0.7)]
    )
    assert await rows(store, "SELECT id, content, kind, tags, confidence, created_at FROM memories") == [
        ("m1", "second version", "preference", [], pytest.approx(0.7), later)
    ]
    assert await outbox(store, "t") == [("m1", "upsert"), ("m1", "upsert")]

    records = await store.fetch_records([("t", "m1"), ("t", "missing"), ("other", "m1")])
    assert list(records) == [("t", "m1")]
    record = records[("t", "m1")]
    assert (record.content, record.kind, record.created_at) == ("second version", "preference", later)
    assert record.embedding == pytest.approx(vector(len("second version")), abs=1e-6)


async def test_every_write_adds_one_outbox_row_per_memory_and_notifies(store: PostgresStore, dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN braid_outbox")
        ids = (
            await store.write_memories("t", [memory(None, "one"), memory(None, "two"), memory("three", "three")])
        ).ids
        with anyio.fail_after(5):
            notes = [n async for n in listener.notifies(timeout=5, stop_after=1)]
        assert [n.channel for n in notes] == ["braid_outbox"]
    assert len(ids) == len(set(ids)) == 3 and ids[2] == "three"
    assert await outbox(store, "t") == [(i, "upsert") for i in ids]
    assert await outbox(store, "other") == []
    assert await rows(store, "SELECT count(*) FROM outbox WHERE processed_at IS NULL") == [(3,)]


async def test_a_write_failing_late_stores_nothing_and_the_next_one_lands(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error in one of the write's last statements, after its rows,
    mentions and support were written (a real Postgres error, injected by
    replacing the supersession step), rolls all of them back."""
    import indexers.postgres.store as store_module

    await store.write_graph("t", [entity("Alex")], [])

    async def failing(conn: psycopg.AsyncConnection, *args: Any) -> tuple[list[str], list[str]]:
        await conn.execute("SELECT 1 / 0")
        return [], []

    monkeypatch.setattr(store_module, "supersede", failing)
    with pytest.raises(psycopg.errors.DivisionByZero):
        await store.write_memories("t", [memory("m1", "Alex went home")])
    for table in ("memories", "mentions", "outbox", "speakers"):
        assert await rows(store, f"SELECT count(*) FROM {table}") == [(0,)], table
    monkeypatch.undo()
    await store.write_memories("t", [memory("m1", "Alex went home")])
    assert await rows(store, "SELECT id FROM memories") == [("m1",)]
    assert await mentions(store, "t", "m1") == ["alex"]


async def test_same_id_in_two_tenants_is_two_memories(store: PostgresStore) -> None:
    await store.write_memories("a", [memory("m1", "for a")])
    await store.write_memories("b", [memory("m1", "for b")])
    assert await rows(store, "SELECT tenant, content FROM memories ORDER BY 1") == [
        ("a", "for a"),
        ("b", "for b"),
    ]


async def test_mentions_come_from_explicit_names_and_known_names_in_the_text(
    store: PostgresStore,
) -> None:
    await store.write_graph("t", [entity("TypeScript"), entity("Alex"), entity("Node")], [])
    await store.write_memories(
        "t",
        [
            memory("m1", "The web client was rewritten.", entities=("  typescript",)),
            memory("m2", "Alex likes TYPESCRIPT a lot."),
        ],
    )
    assert await mentions(store, "t", "m1") == ["typescript"]
    assert await mentions(store, "t", "m2") == ["alex", "typescript"]
    # An upsert recomputes the links.
    await store.write_memories("t", [memory("m2", "Node runs the server.")])
    assert await mentions(store, "t", "m2") == ["node"]
    # Names of another tenant's entities do not link.
    await store.write_memories("u", [memory("m3", "Alex likes TypeScript.")])
    assert await mentions(store, "u", "m3") == []


async def test_names_with_inner_punctuation_are_found_in_text(store: PostgresStore) -> None:
    await store.write_graph("t", [entity("Node.js"), entity("C++"), entity("C#"), entity("Go")], [])
    await store.write_memories("t", [memory("m1", "We moved the API from C++ (and some C#) to Node.js, not Go.")])
    assert await mentions(store, "t", "m1") == ["c#", "c++", "go", "node.js"]


def test_name_candidates() -> None:
    assert name_candidates("Alex likes Node.js!", max_words=2) == [
        "alex",
        "alex likes",
        "js",
        "likes",
        "likes node",
        "likes node.js",
        "node",
        "node js",
        "node.js",
    ]


async def test_new_entities_are_created_with_the_memories_and_never_overwritten(
    store: PostgresStore,
) -> None:
    await store.write_graph("t", [entity("TypeScript", type="language", summary="typed JS")], [])
    await store.write_memories(
        "t",
        [memory("m1", "x", entities=("typescript", "Rust"))],
        new_entities=[entity("typescript "), entity("Rust")],
    )
    assert await rows(store, "SELECT name, name_norm, type, summary FROM entities WHERE tenant = 't' ORDER BY 2") == [
        ("Rust", "rust", None, None),
        ("TypeScript", "typescript", "language", "typed JS"),
    ]
    assert await mentions(store, "t", "m1") == ["rust", "typescript"]
    assert await store.existing_entities("t", ["RUST", " type  script", "TypeScript"]) == {
        "rust",
        "typescript",
    }
    assert await store.existing_entities("u", ["Rust"]) == set()


async def test_delete_removes_the_memory_and_its_mentions(store: PostgresStore) -> None:
    await store.write_graph("t", [entity("TypeScript")], [])
    await store.write_memories("t", [memory("m1", "TypeScript notes"), memory("m2", "TypeScript too")])
    assert await mentions(store, "t", "m1") == ["typescript"]

    assert await store.delete_memory("t", "m1") == Deleted(deleted="m1")
    assert await rows(store, "SELECT id FROM memories") == [("m2",)]
    assert await mentions(store, "t", "m1") == []
    assert await mentions(store, "t", "m2") == ["typescript"]
    assert await rows(store, "SELECT count(*) FROM entities") == [(1,)]
    assert await outbox(store, "t") == [("m1", "upsert"), ("m2", "upsert"), ("m1", "delete")]

    assert await store.delete_memory("t", "m1") is None
    assert await store.delete_memory("other", "m2") is None
    assert await rows(store, "SELECT id FROM memories") == [("m2",)]
    assert len(await outbox(store, "t")) == 3


# --- graph -------------------------------------------------------------------


def test_normalize_name() -> None:
    assert normalize_name("  Type\tScript  Lang ") == "type script lang"
    assert normalize_name("STRASSE") == normalize_name("straße")


async def test_entity_names_are_unique_case_and_space_insensitively(store: PostgresStore) -> None:
    await store.write_graph("t", [entity("TypeScript")], [])
    await store.write_graph("t", [entity("typescript ")], [])
    await store.write_graph("t", [entity("TYPESCRIPT"), entity("  TypeScript")], [])
    await store.write_graph("u", [entity("TypeScript")], [])
    assert await rows(store, "SELECT tenant, name_norm FROM entities ORDER BY 1") == [
        ("t", "typescript"),
        ("u", "typescript"),
    ]


async def test_relations_upsert_by_identity(store: PostgresStore) -> None:
    since = T0 - timedelta(days=30)
    counts = await store.write_graph(
        "t",
        [entity("Alex"), entity("TypeScript")],
        [
            RelationInput("Alex", "prefers", "TypeScript"),
            RelationInput("alex", "prefers", "typescript", weight=2.0),  # same identity
            RelationInput("Alex", "prefers", "TypeScript", valid_from=since),  # another period
        ],
    )
    assert counts == {"entities": 2, "relations": 3}
    assert await rows(
        store,
        "SELECT s.name, r.relation, t.name, r.weight, r.valid_from FROM relations r"
        " JOIN entities s ON s.id = r.source_id JOIN entities t ON t.id = r.target_id"
        " ORDER BY r.valid_from NULLS FIRST",
    ) == [
        ("Alex", "prefers", "TypeScript", 2.0, None),
        ("Alex", "prefers", "TypeScript", 1.0, since),
    ]
    # A relation naming an entity that does not exist is not written.
    await store.write_graph("t", [], [RelationInput("Alex", "knows", "Nobody")])
    assert await rows(store, "SELECT count(*) FROM relations") == [(2,)]


# --- mention counts ----------------------------------------------------------


async def counts(store: PostgresStore) -> tuple[dict[str, int], dict[str, int]]:
    """(entity_degrees.mention_count, counted from mentions), by entity name, non-zero only."""
    kept = await rows(
        store,
        "SELECT e.name_norm, d.mention_count FROM entity_degrees d JOIN entities e ON e.id = d.entity_id"
        " WHERE d.mention_count <> 0",
    )
    real = await rows(
        store,
        "SELECT e.name_norm, count(*) FROM mentions m JOIN entities e ON e.id = m.entity_id GROUP BY 1",
    )
    return dict(kept), dict(real)  # type: ignore[arg-type]


async def test_a_mention_count_bump_updates_a_narrow_row_in_place(store: PostgresStore) -> None:
    """Migration 19: the counts live in ``entity_degrees`` at fillfactor 50,
    so bumping a page's worth of them (as a write naming the entities does)
    makes no new index entries (every update HOT) and leaves ``entities``
    unwritten; ``entities`` itself is back at fillfactor 100, so a page holds
    twice the entities it did at 50."""
    await store.write_graph("hot", [entity(f"E{i}") for i in range(40)], [])
    await store.write_memories("hot", [memory(f"m{i}", "x", entities=(f"E{i}",)) for i in range(40)])
    async with store.pool.connection() as conn, conn.transaction():
        await conn.execute("UPDATE entity_degrees SET mention_count = mention_count + 1 WHERE tenant = 'hot'")
        cur = await conn.execute(
            "SELECT pg_stat_get_xact_tuples_updated('entity_degrees'::regclass),"
            " pg_stat_get_xact_tuples_hot_updated('entity_degrees'::regclass),"
            " pg_stat_get_xact_tuples_updated('entities'::regclass)"
        )
        assert await cur.fetchone() == (40, 40, 0)
        cur = await conn.execute(
            "SELECT relname, reloptions FROM pg_class WHERE relname IN ('entities', 'entity_degrees') ORDER BY 1"
        )
        assert await cur.fetchall() == [("entities", ["fillfactor=100"]), ("entity_degrees", ["fillfactor=50"])]


async def test_mention_counts_follow_writes_rewrites_and_deletes(store: PostgresStore) -> None:
    await store.write_graph("t", [entity("Alex"), entity("Rust"), entity("Go")], [])
    await store.write_memories(
        "t",
        [
            memory("m1", "Alex likes Rust.", entities=("Go",)),
            memory("m2", "Rust, Rust and Rust.", entities=("rust",)),  # counted once
            memory("m3", "Nothing known here."),
        ],
    )
    kept, real = await counts(store)
    assert kept == real == {"alex": 1, "rust": 2, "go": 1}
    # A rewrite with a different entity list moves the counts.
    await store.write_memories("t", [memory("m1", "Go only.", created_at=T0 + timedelta(days=2))])
    kept, real = await counts(store)
    assert kept == real == {"rust": 1, "go": 1}
    # A same-entities rewrite changes nothing; mentions carry the memory's date.
    await store.write_memories("t", [memory("m2", "Still Rust.", created_at=T0 + timedelta(days=1))])
    assert await counts(store) == ({"rust": 1, "go": 1}, {"rust": 1, "go": 1})
    assert await rows(store, "SELECT memory_id, created_at FROM mentions ORDER BY 1") == [
        ("m1", T0 + timedelta(days=2)),
        ("m2", T0 + timedelta(days=1)),
    ]
    # A new entity created by the write is counted too; another tenant is apart.
    await store.write_memories("t", [memory("m3", "x", entities=("Zig", "Alex"))], new_entities=[entity("Zig")])
    await store.write_graph("u", [entity("Rust")], [])
    await store.write_memories("u", [memory("m1", "Rust")])
    assert await rows(
        store,
        "SELECT e.tenant, e.name_norm, d.mention_count FROM entities e JOIN entity_degrees d ON d.entity_id = e.id"
        " ORDER BY 1, 2",
    ) == [
        ("t", "alex", 1),
        ("t", "go", 1),
        ("t", "rust", 1),
        ("t", "zig", 1),
        ("u", "rust", 1),
    ]

    assert await store.delete_memory("t", "m2") == Deleted(deleted="m2")
    assert await store.delete_memory("t", "m2") is None
    kept, real = await counts(store)
    assert kept == real == {"alex": 1, "go": 1, "zig": 1, "rust": 1}  # u's rust
    assert await rows(
        store,
        "SELECT d.mention_count FROM entity_degrees d JOIN entities e ON e.id = d.entity_id"
        " WHERE e.tenant = 't' AND e.name_norm = 'rust'",
    ) == [(0,)]


async def test_concurrent_writers_neither_deadlock_nor_miscount(store: PostgresStore) -> None:
    names = ["Ada", "Bo", "Cy", "Di", "Ed", "Flo"]
    await store.write_graph("t", [entity(n) for n in names[:3]], [])

    async def writer(w: int) -> None:
        # Overlapping entity sets in a different order per writer; half of the
        # names are created by the writes themselves, also in different orders.
        order = names[w:] + names[:w]
        if w % 2:
            order.reverse()
        for r in range(6):
            mid = f"w{w}-{r % 3}"  # rewrites: each memory is written twice
            picked = tuple(order[: 2 + (r + w) % 4])
            # Each memory supports relations between its names, listed in the
            # writer's order: overlapping relations, reached in different orders.
            extracted = Extraction(
                entities=tuple(ExtractedEntity(n, "person") for n in picked),
                relations=tuple(ExtractedRelation(a, COOCCURRENCE, b) for a, b in zip(picked, picked[1:])),
            )
            await store.write_memories(
                "t",
                [memory(mid, f"note {w} {r}", entities=picked), memory(f"{mid}-b", " ".join(reversed(picked)))],
                new_entities=[entity(n) for n in reversed(order[3:])],
                extracted=[extracted, Extraction()],
            )
            if r == 4:
                await store.delete_memory("t", f"w{w}-0-b")
            if r == 5:
                await store.delete_memory("t", f"w{w}-1")

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for w in range(4):
                tg.start_soon(writer, w)
    kept, real = await counts(store)
    assert kept == real
    assert sum(real.values()) > 40
    # Every derived relation weighs as many memories as support it.
    weights = await rows(
        store,
        "SELECT r.id, r.weight, (SELECT count(*) FROM relation_support s WHERE s.relation_id = r.id)"
        " FROM relations r WHERE r.derived",
    )
    assert weights and all(w == supported for _, w, supported in weights)
    assert sum(w for _, w, _ in weights) > 10


async def test_migration_v3_backfills_counts_and_dates(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pgvector.psycopg import register_vector_async

    from indexers import migrations

    later = {v: migrations.MIGRATIONS[v] for v in migrations.MIGRATIONS if v >= 3}
    for v in later:
        monkeypatch.delitem(migrations.MIGRATIONS, v)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        assert await migrate(conn, dim=DIM) == [1, 2]
        await register_vector_async(conn)
        emb = np.asarray(vector(1), dtype=np.float32)
        for i, name in enumerate(["alex", "rust", "idle"]):
            await conn.execute(
                "INSERT INTO entities (id, tenant, name, name_norm, embedding, model)"
                " VALUES (%s, 't', %s, %s, %s, 'x')",
                (i + 1, name, name, emb),
            )
        for i in range(3):
            await conn.execute(
                "INSERT INTO memories (tenant, id, content, kind, tier, created_at, embedding, model)"
                " VALUES ('t', %s, 'c', 'note', 'session', %s, %s, 'x')",
                (f"m{i}", T0 + timedelta(days=i), emb),
            )
        await conn.execute(
            "INSERT INTO mentions (tenant, memory_id, entity_id) VALUES"
            " ('t', 'm0', 1), ('t', 'm0', 2), ('t', 'm1', 2), ('t', 'm2', 2)"
        )
        for v, build in later.items():
            monkeypatch.setitem(migrations.MIGRATIONS, v, build)
        assert await migrate(conn, dim=DIM) == sorted(later)
        # Counted by migration 3, then moved to their own table by migration 19.
        cur = await conn.execute(
            "SELECT e.name, d.mention_count FROM entities e LEFT JOIN entity_degrees d ON d.entity_id = e.id"
            " ORDER BY e.id"
        )
        assert await cur.fetchall() == [("alex", 1), ("rust", 3), ("idle", None)]
        cur = await conn.execute("SELECT memory_id, entity_id, created_at FROM mentions ORDER BY 1, 2")
        assert await cur.fetchall() == [
            ("m0", 1, T0),
            ("m0", 2, T0),
            ("m1", 2, T0 + timedelta(days=1)),
            ("m2", 2, T0 + timedelta(days=2)),
        ]
        cur = await conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'mentions' ORDER BY 1")
        assert [n for (n,) in await cur.fetchall()] == [
            "mentions_entity_recent",
            "mentions_pkey",
            "mentions_tenant_changed",
        ]


# --- health ------------------------------------------------------------------


async def test_ping_logs_the_reason_once_per_failure_streak(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="braid.postgres")

    def logged() -> list[tuple[str, str]]:
        return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "braid.postgres"]

    # A zero timeout: no answer can come in time, as from a stalled server.
    assert await store.ping(timeout=0) is False
    assert await store.ping(timeout=0) is False
    assert logged() == [("WARNING", "postgres ping failed: no answer within 0 s")]

    assert await store.ping() is True
    assert await store.ping() is True
    assert await store.ping(timeout=0) is False
    assert logged() == [
        ("WARNING", "postgres ping failed: no answer within 0 s"),
        ("INFO", "postgres answers pings again"),
        ("WARNING", "postgres ping failed: no answer within 0 s"),
    ]


async def test_ping_logs_the_error_that_failed_it(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    pool = await open_pool(dsn, dim=DIM, min_size=1, max_size=1)
    await pool.close()
    caplog.set_level(logging.WARNING, logger="braid.postgres")
    assert await PostgresStore(pool).ping() is False
    assert [r.getMessage() for r in caplog.records if r.name == "braid.postgres"] == [
        "postgres ping failed: the pool 'braid' is already closed"
    ]


# --- reads by id ----------------------------------------------------------------


async def test_reads_by_id_look_each_id_up_by_primary_key_under_a_generic_plan(store: PostgresStore, dsn: str) -> None:
    """The lifecycle check and the embeddings read (``by_ids_sql``) are
    prepared statements: whatever plan Postgres caches, each id is one
    primary-key look-up, not a scan of the tenant's rows (as the generic plan
    of ``tenant = $1 AND id = ANY($2)`` did with many tenants and one large)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO memories (tenant, id, content, kind, tier, created_at, embedding, model, session_id)"
            " SELECT CASE WHEN i <= 3000 THEN 'big' ELSE 't' || (i %% 40) END, 'm' || i, 'text ' || i, 'note',"
            " 'session', %s, array_fill(0.1::real, ARRAY[%s])::vector, 'synthetic', 's' || (i %% 7)"
            " FROM generate_series(1, 5000) AS i",
            (T0, DIM),
        )
        conn.execute("UPDATE memories SET superseded_at = %s WHERE tenant = 'big' AND id = 'm2'", (T0,))
        conn.execute("ANALYZE memories")
        ids = [f"m{i}" for i in range(1, 3001, 60)]
        for columns, where in (("m.id", "m.superseded_at IS NULL"), ("m.id, m.embedding", "m.model = 'synthetic'")):
            conn.execute("SET plan_cache_mode = force_generic_plan")
            conn.execute("DEALLOCATE ALL")
            statement = by_ids_sql(columns, where).replace("%(ids)s", "$1").replace("%(tenant)s", "$2")
            conn.execute(f"PREPARE q(text[], text) AS {statement}")
            plan = "\n".join(
                row[0]
                for row in psycopg.ClientCursor(conn).execute("EXPLAIN EXECUTE q(%s, %s)", (ids, "big")).fetchall()
            )
            assert "Index Scan using memories_pkey" in plan, plan
            assert "Nested Loop" in plan, plan
            assert "Index Cond: ((tenant = $2) AND (id = r.id))" in plan, plan

    # And what they answer: the tenant's current memories among the ids, no other tenant's.
    asked = ["m1", "m2", "m3", "m3001", "nope"]
    assert await store.live("big", asked, None) == {"m1", "m3"}
    assert await store.live("big", asked, T0 - timedelta(days=1)) == set()
    assert await store.live("big", asked, T0 + timedelta(days=1)) == {"m1", "m3"}
    assert set(await store.embeddings("big", asked, "synthetic")) == {"m1", "m2", "m3"}
    assert await store.embeddings("big", asked, "other") == {}
