"""Versioned, idempotent schema migrations for the Postgres source of truth.

Each migration runs once, in its own transaction, under an advisory lock so
several service processes starting together do not race. The embedding
dimension is fixed when the schema is first created and checked afterwards.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from psycopg import sql

from config import BraidError

__all__ = ["MIGRATIONS", "SCHEMA_LOCK", "SchemaMismatch", "TENANT_ROLE", "TENANT_TABLES", "migrate"]

#: The advisory lock start-up DDL is run under (migrations, the tiers' HNSW
#: indexes), so processes starting at once on one database take turns.
SCHEMA_LOCK = 0x42524149  # "BRAI"
_LOCK_KEY = SCHEMA_LOCK


class SchemaMismatch(BraidError):
    """The database was created with settings this config cannot use."""


def _v1(dim: int) -> list[sql.Composable]:
    d = sql.Literal(dim)
    return [
        sql.SQL("CREATE EXTENSION IF NOT EXISTS vector"),
        sql.SQL("CREATE TABLE IF NOT EXISTS braid_meta (key text PRIMARY KEY, value text NOT NULL)"),
        sql.SQL(
            """
            CREATE TABLE memories (
                tenant      text        NOT NULL,
                id          text        NOT NULL,
                content     text        NOT NULL,
                kind        text        NOT NULL,
                tier        text        NOT NULL,
                session_id  text,
                tags        text[]      NOT NULL DEFAULT '{{}}',
                importance  real,
                confidence  real        NOT NULL DEFAULT 1.0,
                metadata    jsonb       NOT NULL DEFAULT '{{}}',
                created_at  timestamptz NOT NULL,
                updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
                embedding   vector({d}) NOT NULL,
                model       text        NOT NULL,
                PRIMARY KEY (tenant, id)
            )
            """
        ).format(d=d),
        sql.SQL("CREATE INDEX memories_tenant_created ON memories (tenant, created_at)"),
        sql.SQL("CREATE INDEX memories_tenant_session ON memories (tenant, session_id)"),
        sql.SQL("CREATE INDEX memories_tags ON memories USING gin (tags)"),
        sql.SQL(
            """
            CREATE TABLE entities (
                id          bigserial   PRIMARY KEY,
                tenant      text        NOT NULL,
                name        text        NOT NULL,
                name_norm   text        NOT NULL,
                type        text,
                summary     text,
                embedding   vector({d}) NOT NULL,
                model       text        NOT NULL,
                created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
                updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
                UNIQUE (tenant, name_norm)
            )
            """
        ).format(d=d),
        sql.SQL(
            """
            CREATE TABLE relations (
                id          bigserial   PRIMARY KEY,
                tenant      text        NOT NULL,
                source_id   bigint      NOT NULL REFERENCES entities (id) ON DELETE CASCADE,
                relation    text        NOT NULL,
                target_id   bigint      NOT NULL REFERENCES entities (id) ON DELETE CASCADE,
                weight      real        NOT NULL DEFAULT 1.0,
                valid_from  timestamptz,
                valid_to    timestamptz,
                created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
            )
            """
        ),
        sql.SQL(
            "CREATE UNIQUE INDEX relations_identity ON relations "
            "(tenant, source_id, relation, target_id, coalesce(valid_from, '-infinity'))"
        ),
        sql.SQL("CREATE INDEX relations_source ON relations (tenant, source_id)"),
        sql.SQL("CREATE INDEX relations_target ON relations (tenant, target_id)"),
        sql.SQL(
            """
            CREATE TABLE mentions (
                tenant      text   NOT NULL,
                memory_id   text   NOT NULL,
                entity_id   bigint NOT NULL REFERENCES entities (id) ON DELETE CASCADE,
                PRIMARY KEY (tenant, memory_id, entity_id),
                FOREIGN KEY (tenant, memory_id) REFERENCES memories (tenant, id) ON DELETE CASCADE
            )
            """
        ),
        sql.SQL("CREATE INDEX mentions_entity ON mentions (tenant, entity_id)"),
        sql.SQL(
            """
            CREATE TABLE outbox (
                id           bigserial   PRIMARY KEY,
                tenant       text        NOT NULL,
                memory_id    text        NOT NULL,
                op           text        NOT NULL CHECK (op IN ('upsert', 'delete')),
                created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
                processed_at timestamptz,
                attempts     int         NOT NULL DEFAULT 0,
                last_error   text
            )
            """
        ),
        sql.SQL("CREATE INDEX outbox_pending ON outbox (id) WHERE processed_at IS NULL"),
        sql.SQL("CREATE INDEX outbox_created ON outbox (created_at)"),
        sql.SQL(
            """
            CREATE TABLE reindex_jobs (
                id          text        PRIMARY KEY,
                target      text        NOT NULL,
                tier        text,
                status      text        NOT NULL,
                progress    jsonb       NOT NULL DEFAULT '{}',
                error       text,
                created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
                finished_at timestamptz
            )
            """
        ),
        sql.SQL("INSERT INTO braid_meta (key, value) VALUES ('embedding_dim', {d})").format(d=sql.Literal(str(dim))),
    ]


def _v2(dim: int) -> list[sql.Composable]:
    """Who said a memory, and indexed-only context text (keyword search only)."""
    return [
        sql.SQL("ALTER TABLE memories ADD COLUMN speaker text"),
        sql.SQL("ALTER TABLE memories ADD COLUMN context text"),
        # The speakers each tenant has, read by the query analysis (few rows).
        sql.SQL("CREATE TABLE speakers (tenant text NOT NULL, name text NOT NULL, PRIMARY KEY (tenant, name))"),
    ]


def _v3(dim: int) -> list[sql.Composable]:
    """Graph fan-out kept cheap: each entity's mention count, maintained by
    every write, and its mentions readable newest memory first."""
    return [
        sql.SQL("ALTER TABLE entities ADD COLUMN mention_count bigint NOT NULL DEFAULT 0"),
        sql.SQL(
            "UPDATE entities e SET mention_count = c.n"
            " FROM (SELECT entity_id, count(*) AS n FROM mentions GROUP BY entity_id) c"
            " WHERE e.id = c.entity_id"
        ),
        # The memory's created_at, copied onto its mentions (they are rewritten
        # with the memory, so the copy cannot go stale).
        sql.SQL("ALTER TABLE mentions ADD COLUMN created_at timestamptz"),
        sql.SQL(
            "UPDATE mentions mn SET created_at = m.created_at FROM memories m"
            " WHERE m.tenant = mn.tenant AND m.id = mn.memory_id"
        ),
        sql.SQL("ALTER TABLE mentions ALTER COLUMN created_at SET NOT NULL"),
        # Replaces mentions_entity (same leading columns); memory_id makes the
        # capped fetch an index-only scan with a stable order.
        sql.SQL("DROP INDEX mentions_entity"),
        sql.SQL("CREATE INDEX mentions_entity_recent ON mentions (tenant, entity_id, created_at DESC, memory_id DESC)"),
    ]


def _v4(dim: int) -> list[sql.Composable]:
    """The bounded count that picks exact or HNSW search (``pgvector.nearest_sql``)
    reads a tier's matching rows from this index alone."""
    return [
        sql.SQL("CREATE INDEX memories_tenant_tier ON memories (tenant, tier, confidence)"),
    ]


#: Tables holding one tenant's rows each (a ``tenant`` column); row-level
#: security scopes them to ``braid.tenant`` for :data:`TENANT_ROLE`.
#: The tables migration v5 put under row-level security (later ones add their own).
_V5_TABLES = ("memories", "entities", "relations", "mentions", "outbox", "speakers")
#: Every table holding tenant rows: each has the ``tenant_rows`` policy.
TENANT_TABLES = (
    *_V5_TABLES,
    "memory_usage",
    "tenant_generations",
    "relation_support",
    "entity_degrees",
    "relation_tombstones",
    "mention_tombstones",
    "entity_tombstones",
)
TENANT_ROLE = "braid_tenant"


def _v5(dim: int) -> list[sql.Composable]:
    """Tenant isolation in depth: row-level security on every tenant table.

    Tenant-scoped transactions switch to ``braid_tenant`` (a role without
    login, created once per cluster) and set ``braid.tenant``; the policy then
    shows and accepts that tenant's rows only, whatever a statement's WHERE
    says. With ``braid.tenant`` unset the role sees nothing. The owner (the
    role Braid connects as) is not restricted: the outbox worker and reindex
    read across tenants. A table added later must be granted here too.
    """
    role = sql.Identifier(TENANT_ROLE)
    statements: list[sql.Composable] = [
        # Roles belong to the cluster, not the database: another database may
        # have created it already, or be creating it right now.
        sql.SQL(
            "DO $$ BEGIN CREATE ROLE {role} NOLOGIN;"
            " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        ).format(role=role),
        # The connecting role must be allowed to SET ROLE to it (a superuser always is).
        sql.SQL("GRANT {role} TO CURRENT_USER").format(role=role),
        sql.SQL("GRANT USAGE ON SCHEMA public TO {role}").format(role=role),
        sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}").format(role=role),
    ]
    for table in _V5_TABLES:
        statements += _tenant_policy(table)
    return statements


def _tenant_policy(table: str) -> list[sql.Composable]:
    """Row-level security for one tenant table (see :func:`_v5`)."""
    role = sql.Identifier(TENANT_ROLE)
    t = sql.Identifier(table)
    return [
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {role}").format(t=t, role=role),
        sql.SQL("ALTER TABLE {t} ENABLE ROW LEVEL SECURITY").format(t=t),
        sql.SQL(
            "CREATE POLICY tenant_rows ON {t} TO {role}"
            " USING (tenant = current_setting('braid.tenant', true))"
            " WITH CHECK (tenant = current_setting('braid.tenant', true))"
        ).format(t=t, role=role),
    ]


def _v6(dim: int) -> list[sql.Composable]:
    """One reindex job at a time per database: concurrent jobs shared the
    temporary index names and each held a pool connection through its build."""
    return [
        # Jobs left active by an older Braid died with it (migrations run at
        # start-up, before any job), and several of them would fail the index.
        sql.SQL(
            "UPDATE reindex_jobs SET status = 'interrupted', finished_at = clock_timestamp(),"
            " error = 'the service stopped while the job ran'"
            " WHERE status IN ('queued', 'running')"
        ),
        sql.SQL(
            "CREATE UNIQUE INDEX reindex_jobs_one_active ON reindex_jobs ((true)) WHERE status IN ('queued', 'running')"
        ),
    ]


def _v7(dim: int) -> list[sql.Composable]:
    """Recall bookkeeping: how often each memory was returned, and when last.

    A table of its own, not columns of ``memories``: a memory row carries its
    embedding and is in every tier's HNSW index, and an UPDATE that cannot
    stay on its page (HOT) inserts into every index, the HNSW ones included,
    so counting a recall there would cost an HNSW insert per returned memory.
    """
    return [
        sql.SQL(
            """
            CREATE TABLE memory_usage (
                tenant            text        NOT NULL,
                memory_id         text        NOT NULL,
                usage_count       bigint      NOT NULL DEFAULT 0,
                last_accessed_at  timestamptz NOT NULL,
                PRIMARY KEY (tenant, memory_id),
                FOREIGN KEY (tenant, memory_id) REFERENCES memories (tenant, id) ON DELETE CASCADE
            )
            """
        ),
        *_tenant_policy("memory_usage"),
    ]


def _v8(dim: int) -> list[sql.Composable]:
    """The decay fold (``tiers.<t>.objective: decayed``, :mod:`indexers.postgres.fold`):
    each memory of a decayed tier carries its folded vector and the epoch it
    was folded in; ``fold_epochs`` records each tier's decay rate and anchor."""
    role = sql.Identifier(TENANT_ROLE)
    return [
        sql.SQL("ALTER TABLE memories ADD COLUMN folded vector({d})").format(d=sql.Literal(dim)),
        sql.SQL("ALTER TABLE memories ADD COLUMN fold_epoch int"),
        # Global and never reused: a row's stale epoch can never name a new one.
        sql.SQL("CREATE SEQUENCE fold_epoch_seq"),
        sql.SQL(
            """
            CREATE TABLE fold_epochs (
                tier           text             NOT NULL,
                epoch          int              NOT NULL,
                half_life_days double precision NOT NULL,
                anchor         timestamptz      NOT NULL,
                filling        boolean          NOT NULL DEFAULT false,
                created_at     timestamptz      NOT NULL DEFAULT clock_timestamp(),
                PRIMARY KEY (tier, epoch)
            )
            """
        ),
        # Tier-wide, no tenant's data: tenant transactions read it (writes fold with it).
        sql.SQL("GRANT SELECT ON fold_epochs TO {role}").format(role=role),
    ]


def _v9(dim: int) -> list[sql.Composable]:
    """The ``recent`` strategy: a session's newest memories are one backward
    index scan (``ORDER BY created_at DESC, id DESC``), not a sort of the whole
    session. Replaces ``memories_tenant_session`` (the same leading columns)."""
    return [
        sql.SQL("CREATE INDEX memories_tenant_session_created ON memories (tenant, session_id, created_at, id)"),
        sql.SQL("DROP INDEX memories_tenant_session"),
    ]


def _v10(dim: int) -> list[sql.Composable]:
    """Supersession: a memory's ``mem_key`` (a label such as ``user.home_city``)
    and its lifecycle. Writing a memory with a key retires the key's current
    memory (``superseded_at``, the new one's ``created_at``; ``superseded_by``,
    its id). A recall returns current memories only, or with ``as_of`` the
    ones current then. ``superseded_by`` has no foreign key: deleting the
    memory that retired others leaves them retired (unless the delete asks to
    restore the newest).

    Every existing memory gets an outbox row, so the outbox worker rewrites
    its Typesense document with the lifecycle fields the source filters on
    (a document without them is not found until then)."""
    return [
        sql.SQL("ALTER TABLE memories ADD COLUMN mem_key text"),
        sql.SQL("ALTER TABLE memories ADD COLUMN superseded_at timestamptz"),
        sql.SQL("ALTER TABLE memories ADD COLUMN superseded_by text"),
        # A key's versions newest first, and its current one, in one index.
        sql.SQL(
            "CREATE INDEX memories_tenant_key ON memories (tenant, mem_key, created_at DESC, id DESC)"
            " WHERE mem_key IS NOT NULL"
        ),
        sql.SQL("INSERT INTO outbox (tenant, memory_id, op) SELECT tenant, id, 'upsert' FROM memories"),
    ]


def _v11(dim: int) -> list[sql.Composable]:
    """Forgetting and the result cache.

    ``expires_at``: when a memory expires (from the write's ``expires_at`` or
    ``ttl_seconds``); NULL never. The sweeper finds expired memories through
    the partial index on it, and memories past a tier's retention or the
    activation floor through ``memories_created_at`` (``indexers.lifecycle``).
    ``tenant_generations``: a counter per tenant, bumped by every transaction
    that changes what a recall of the tenant can return (writes, deletes,
    graph edits, sweeps); a cached answer is served only at the generation it
    was computed at (``indexers.cache``).
    """
    return [
        sql.SQL("ALTER TABLE memories ADD COLUMN expires_at timestamptz"),
        sql.SQL("CREATE INDEX memories_expires_at ON memories (expires_at) WHERE expires_at IS NOT NULL"),
        sql.SQL("CREATE INDEX memories_created_at ON memories (created_at)"),
        sql.SQL("CREATE TABLE tenant_generations (tenant text PRIMARY KEY, generation bigint NOT NULL DEFAULT 0)"),
        *_tenant_policy("tenant_generations"),
    ]


def _v12(dim: int) -> list[sql.Composable]:
    """Embedding versions: vector search compares a query vector only with
    rows its model made. A memory written with its own embedding was recorded
    as made by ``client``; such vectors were taken to be the service's
    model's (they were compared with its query vectors), and now say so: they
    get the model recorded in ``braid_meta`` (none on a new database), with
    an outbox row each so that their Typesense documents say so too."""
    return [
        sql.SQL(
            """
            WITH moved AS (
                UPDATE memories SET model = meta.value
                  FROM braid_meta AS meta
                 WHERE meta.key = 'embedding_model' AND memories.model = 'client'
                RETURNING memories.tenant, memories.id
            )
            INSERT INTO outbox (tenant, memory_id, op) SELECT tenant, id, 'upsert' FROM moved
            """
        ),
    ]


def _v13(dim: int) -> list[sql.Composable]:
    """The Typesense documents' ``terms``, ``length`` and ``context_length``
    (the ``bm25`` keyword mode, the default): every existing memory gets an
    outbox row, so the outbox worker rewrites its document with them (a
    document without them is not found by ``bm25`` until then)."""
    return [sql.SQL("INSERT INTO outbox (tenant, memory_id, op) SELECT tenant, id, 'upsert' FROM memories")]


def _v14(dim: int) -> list[sql.Composable]:
    """The Typesense documents' ``term_counts`` (read by the ``bm25``
    ranking instead of the texts): every existing memory gets an outbox
    row, so the outbox worker rewrites its document with them."""
    return [sql.SQL("INSERT INTO outbox (tenant, memory_id, op) SELECT tenant, id, 'upsert' FROM memories")]


def _v15(dim: int) -> list[sql.Composable]:
    """Relations extracted from memories' texts (``graph.extract``,
    :mod:`indexers.postgres.derived`): ``relations.derived`` marks them, and
    ``relation_support`` records which memories state each one, so its weight
    is their number, kept exact as memories are rewritten, deleted or swept."""
    return [
        sql.SQL("ALTER TABLE relations ADD COLUMN derived boolean NOT NULL DEFAULT false"),
        sql.SQL(
            """
            CREATE TABLE relation_support (
                tenant      text   NOT NULL,
                memory_id   text   NOT NULL,
                relation_id bigint NOT NULL REFERENCES relations (id) ON DELETE CASCADE,
                PRIMARY KEY (tenant, memory_id, relation_id),
                FOREIGN KEY (tenant, memory_id) REFERENCES memories (tenant, id) ON DELETE CASCADE
            )
            """
        ),
        # A relation's delete cascades here: found by this index, not a scan.
        sql.SQL("CREATE INDEX relation_support_relation ON relation_support (relation_id)"),
        *_tenant_policy("relation_support"),
    ]


def _v16(dim: int) -> list[sql.Composable]:
    """An entity's relations, heaviest first, straight from an index in each
    direction: the walk with ``graph.fanout`` takes the first few
    (:func:`indexers.graph._walk_sql`, a merge of the two index scans) instead
    of sorting all of a hub's hundreds. The indexes they replace were their
    prefixes."""
    return [
        sql.SQL("CREATE INDEX relations_source_weight ON relations (tenant, source_id, weight DESC, id)"),
        sql.SQL("CREATE INDEX relations_target_weight ON relations (tenant, target_id, weight DESC, id)"),
        sql.SQL("DROP INDEX relations_source"),
        sql.SQL("DROP INDEX relations_target"),
    ]


def _v17(dim: int) -> list[sql.Composable]:
    """Room on each entity's page for its next versions: every write that
    mentions an entity bumps its ``mention_count``, an update no index reads,
    which Postgres can then make in place (a HOT update) instead of writing a
    new version into every index, the entity tier's HNSW among them
    (benchmarks/results/write-profile*.md). Pages written from now on are
    half filled; a table rewrite (``VACUUM FULL entities``) applies it to
    those already there."""
    return [sql.SQL("ALTER TABLE entities SET (fillfactor = 50)")]


def _v18(dim: int) -> list[sql.Composable]:
    """A memory's pending outbox rows, in order: the outbox worker claims a
    row only when no older row of the same memory is pending, so that two
    workers (two service processes) never apply a memory's versions out of
    order (:mod:`indexers.sync`)."""
    return [sql.SQL("CREATE INDEX outbox_pending_memory ON outbox (tenant, memory_id, id) WHERE processed_at IS NULL")]


def _v19(dim: int) -> list[sql.Composable]:
    """Entity degrees in a narrow table of their own, at fillfactor 50, and
    ``entities`` back at 100. Migration 17 made the mention-count bumps HOT
    by half filling the pages of ``entities``, whose rows carry the name's
    vector inline: that doubled its heap (20,000 entities: 39 against 78 MiB;
    2.4 GB with its indexes at 2,050 tenants, ``benchmarks/results/
    tenants-s29.md``). A bump now rewrites a ~40-byte row, in place, and
    ``entities`` is written only when an entity is created or edited. An
    entity no memory names has no row (its degree is 0).

    The column goes: a Braid process from before this migration fails its
    writes once it has run (they bump ``entities.mention_count``), so stop
    the older processes before starting a newer one on the database (README,
    "How it works", Graph source).
    Pages of ``entities`` half filled so far stay so until ``VACUUM FULL
    entities``."""
    return [
        sql.SQL(
            """
            CREATE TABLE entity_degrees (
                entity_id     bigint PRIMARY KEY REFERENCES entities (id) ON DELETE CASCADE,
                tenant        text   NOT NULL,
                mention_count bigint NOT NULL
            ) WITH (fillfactor = 50)
            """
        ),
        sql.SQL(
            "INSERT INTO entity_degrees (entity_id, tenant, mention_count)"
            " SELECT id, tenant, mention_count FROM entities WHERE mention_count <> 0"
        ),
        sql.SQL("ALTER TABLE entities DROP COLUMN mention_count"),
        sql.SQL("ALTER TABLE entities SET (fillfactor = 100)"),
        *_tenant_policy("entity_degrees"),
    ]


def _v20(dim: int) -> list[sql.Composable]:
    """Tenants moved to a Typesense collection pair of their own, and how
    far each move is (:mod:`indexers.typesense.placement`). Read by every
    process, for every tenant: no row-level security, like ``reindex_jobs``."""
    return [
        sql.SQL(
            """
            CREATE TABLE typesense_placements (
                tenant    text        PRIMARY KEY,
                alias     text        NOT NULL UNIQUE,
                state     text        NOT NULL CHECK (state IN ('copying', 'live')),
                placed_at timestamptz NOT NULL DEFAULT clock_timestamp()
            )
            """
        )
    ]


def _tombstones(table: str, tombstones: str, key: dict[str, tuple[str, str]]) -> list[sql.Composable]:
    """``tombstones``: the ``key`` of every row deleted from ``table`` (column
    -> its type and the deleted row's column it copies), with the deleting
    transaction's id (``changed``) and time, filled by a trigger (cascades
    included), under row-level security."""
    columns = "".join(f"                {name:<11} {kind:<11} NOT NULL,\n" for name, (kind, _) in key.items())
    function = f"braid_{table}_dropped"
    return [
        sql.SQL(
            f"""
            CREATE TABLE {tombstones} (
                tenant      text        NOT NULL,
{columns}                changed     xid8        NOT NULL DEFAULT pg_current_xact_id(),
                dropped_at  timestamptz NOT NULL DEFAULT clock_timestamp()
            )
            """
        ),
        sql.SQL(f"CREATE INDEX {tombstones}_tenant_changed ON {tombstones} (tenant, changed)"),
        sql.SQL(f"CREATE INDEX {tombstones}_dropped ON {tombstones} (dropped_at)"),
        sql.SQL(
            f"""
            CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO {tombstones} (tenant, {", ".join(key)})
                VALUES (OLD.tenant, {", ".join(f"OLD.{old}" for _, old in key.values())});
                RETURN OLD;
            END $$
            """
        ),
        sql.SQL(f"CREATE TRIGGER {table}_dropped AFTER DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION {function}()"),
        *_tenant_policy(tombstones),
    ]


def _v21(dim: int) -> list[sql.Composable]:
    """What changed in a tenant's relations and mentions, and since when, so
    that a service process can keep a tenant's graph in memory and read only
    the changes (:mod:`indexers.graph_cache`).

    ``relations.changed`` is the id of the transaction that last wrote the
    row (set on insert by its default, on update by a trigger, whatever the
    statement), ``mentions.changed`` the one that made it (mentions are
    never updated); a deleted relation leaves its id in
    ``relation_tombstones``, a deleted mention its entity and memory in
    ``mention_tombstones`` (triggers again, cascades included), kept for an
    hour by the sweeper. A reader that keeps a snapshot taken before it
    reads (its xmax and the transactions it saw running) and next reads the
    rows changed by those transactions or from that xmax on misses no
    committed change: a transaction the snapshot did not see was running
    then or had no id yet, and gets one from xmax on."""
    return [
        sql.SQL("ALTER TABLE relations ADD COLUMN changed xid8 NOT NULL DEFAULT pg_current_xact_id()"),
        sql.SQL("CREATE INDEX relations_tenant_changed ON relations (tenant, changed)"),
        sql.SQL(
            """
            CREATE FUNCTION braid_relation_changed() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                NEW.changed := pg_current_xact_id();
                RETURN NEW;
            END $$
            """
        ),
        sql.SQL(
            "CREATE TRIGGER relations_changed BEFORE UPDATE ON relations"
            " FOR EACH ROW EXECUTE FUNCTION braid_relation_changed()"
        ),
        *_tombstones("relations", "relation_tombstones", {"relation_id": ("bigint", "id")}),
        sql.SQL("ALTER TABLE mentions ADD COLUMN changed xid8 NOT NULL DEFAULT pg_current_xact_id()"),
        sql.SQL("CREATE INDEX mentions_tenant_changed ON mentions (tenant, changed)"),
        *_tombstones(
            "mentions", "mention_tombstones", {"entity_id": ("bigint", "entity_id"), "memory_id": ("text", "memory_id")}
        ),
    ]


def _v22(dim: int) -> list[sql.Composable]:
    """Large tenants' own HNSW indexes in a memory tier (:mod:`indexers.own_index`),
    a row once the index is built. Read by every process, for every tenant: no
    row-level security, like ``typesense_placements``."""
    return [
        sql.SQL(
            """
            CREATE TABLE pgvector_own_indexes (
                tenant   text        NOT NULL,
                tier     text        NOT NULL,
                name     text        NOT NULL UNIQUE,
                built_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                PRIMARY KEY (tenant, tier)
            )
            """
        )
    ]


def _v23(dim: int) -> list[sql.Composable]:
    """What changed in a tenant's entities, as migration 21 for relations, so
    that a service process keeping a tenant's graph also keeps its entities'
    names and vectors and finds a walk's seeds itself
    (:meth:`indexers.graph_cache.TenantGraph.seeds`). ``entities.changed``:
    the transaction that last wrote the row (insert by default, update by
    the trigger migration 21 made for relations); a deleted entity leaves
    its id in ``entity_tombstones``."""
    return [
        sql.SQL("ALTER TABLE entities ADD COLUMN changed xid8 NOT NULL DEFAULT pg_current_xact_id()"),
        sql.SQL("CREATE INDEX entities_tenant_changed ON entities (tenant, changed)"),
        sql.SQL(
            "CREATE TRIGGER entities_changed BEFORE UPDATE ON entities"
            " FOR EACH ROW EXECUTE FUNCTION braid_relation_changed()"
        ),
        *_tombstones("entities", "entity_tombstones", {"entity_id": ("bigint", "id")}),
    ]


def _v24(dim: int) -> list[sql.Composable]:
    """``memories.own``: the row's tenant has an index of its own in the
    row's tier (:mod:`indexers.own_index`), so the tier's shared HNSW index
    (built from now on ``WHERE tier = ... AND NOT own``) leaves it out: a
    large tenant's writes insert into one graph, not two. Set on write by
    ``braid_own_index`` (security definer: ``pgvector_own_indexes`` names
    every tenant and has no row-level security) and by the placement job for
    rows written before; ``memories_own`` finds a tenant's flagged rows. An
    existing shared index keeps every row until its tier's next reindex."""
    role = sql.Identifier(TENANT_ROLE)
    return [
        sql.SQL("ALTER TABLE memories ADD COLUMN own boolean NOT NULL DEFAULT false"),
        sql.SQL("CREATE INDEX memories_own ON memories (tenant, tier) WHERE own"),
        sql.SQL(
            """
            CREATE FUNCTION braid_own_index(t text, tr text) RETURNS boolean
            LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS
            $$ SELECT EXISTS (SELECT 1 FROM pgvector_own_indexes o WHERE o.tenant = t AND o.tier = tr) $$
            """
        ),
        sql.SQL("REVOKE ALL ON FUNCTION braid_own_index(text, text) FROM PUBLIC"),
        sql.SQL("GRANT EXECUTE ON FUNCTION braid_own_index(text, text) TO {role}").format(role=role),
    ]


def _v25(dim: int) -> list[sql.Composable]:
    """The Typesense documents' ``tenant_key``, ``current_key`` and
    ``tenant_terms`` (every filter names a tenant by its key:
    :mod:`indexers.typesense.documents`): every existing memory gets an
    outbox row, so the outbox worker rewrites its documents with them (a
    document without them is not found until then; the recall's read of
    unindexed memories serves the newest meanwhile)."""
    return [sql.SQL("INSERT INTO outbox (tenant, memory_id, op) SELECT tenant, id, 'upsert' FROM memories")]


#: ``braid_meta``'s key for the last outbox row migration 26 queued.
TERM_KEY_REWRITE = "term_key_rewrite_through"


def _v26(dim: int) -> list[sql.Composable]:
    """The keyword documents' ``tenant_terms`` behind the tenant's term key
    (8 hex digits, :func:`indexers.typesense.documents.term_key`) instead of
    its whole 32-digit key: every existing memory gets an outbox row, so the
    outbox worker rewrites its documents, and ``braid_meta`` keeps the last
    of those rows' ids. While one of them is pending, a recall's term
    filters name both forms of each term (:class:`indexers.sync.TermKeyRewrite`),
    so an older document is still found."""
    return [
        sql.SQL("INSERT INTO outbox (tenant, memory_id, op) SELECT tenant, id, 'upsert' FROM memories"),
        sql.SQL("INSERT INTO braid_meta (key, value) SELECT {k}, coalesce(max(id), 0)::text FROM outbox").format(
            k=sql.Literal(TERM_KEY_REWRITE)
        ),
    ]


def _v27(dim: int) -> list[sql.Composable]:
    """``entities.small``: an entity of a tenant holding at most the entity
    tier's ``exactBelow`` entities (:mod:`indexers.postgres.unshared`), whose
    searches compare every entity exactly, so the entities' HNSW index (built
    from now on ``WHERE NOT small``) leaves it out; ``entities_small`` finds
    a tenant's flagged ones. An existing index keeps every entity until the
    entity tier's next reindex."""
    return [
        sql.SQL("ALTER TABLE entities ADD COLUMN small boolean NOT NULL DEFAULT false"),
        sql.SQL("CREATE INDEX entities_small ON entities (tenant) WHERE small"),
    ]


#: version -> builder of its statements, given the embedding dimension.
MIGRATIONS: dict[int, Callable[[int], list[sql.Composable]]] = {
    1: _v1,
    2: _v2,
    3: _v3,
    4: _v4,
    5: _v5,
    6: _v6,
    7: _v7,
    8: _v8,
    9: _v9,
    10: _v10,
    11: _v11,
    12: _v12,
    13: _v13,
    14: _v14,
    15: _v15,
    16: _v16,
    17: _v17,
    18: _v18,
    19: _v19,
    20: _v20,
    21: _v21,
    22: _v22,
    23: _v23,
    24: _v24,
    25: _v25,
    26: _v26,
    27: _v27,
}


async def migrate(conn: psycopg.AsyncConnection, *, dim: int) -> list[int]:
    """Apply pending migrations; return the versions applied (empty if none)."""
    applied: list[int] = []
    await conn.set_autocommit(True)
    await conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS braid_migrations ("
            " version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur = await conn.execute("SELECT version FROM braid_migrations")
        done = {row[0] for row in await cur.fetchall()}
        for version in sorted(MIGRATIONS):
            if version in done:
                continue
            async with conn.transaction():
                for statement in MIGRATIONS[version](dim):
                    await conn.execute(statement)  # type: ignore[call-overload]  # psycopg takes any Composable
                await conn.execute("INSERT INTO braid_migrations (version) VALUES (%s)", (version,))
            applied.append(version)
        cur = await conn.execute("SELECT value FROM braid_meta WHERE key = 'embedding_dim'")
        row = await cur.fetchone()
        if row is not None and int(row[0]) != dim:
            raise SchemaMismatch(
                f"the database stores {row[0]}-d embeddings but embedding.dim is {dim}; "
                "use a new database or the matching model"
            )
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied
