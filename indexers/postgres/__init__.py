"""Postgres, the source of truth: connection pool, migrations, and every write.

One job a module:

* :mod:`.models`: :class:`MemoryInput`, :class:`EntityInput` and
  :class:`RelationInput`, what the store writes.
* :mod:`.names`: how entity names compare (:func:`normalize_name`) and the
  names a text could mention (:func:`name_candidates`).
* :mod:`.pool`: :func:`open_pool` (migrations first, see
  :mod:`indexers.migrations`), transactions scoped to one tenant by row-level
  security (:func:`tenant_transaction`, :func:`scope_to_tenant`, and
  :func:`tenant_reads` for reads in one round trip), :func:`on_connection`
  (work a caller may stop waiting for without cutting it) and
  :class:`PoolSource`, the base of the sources that read Postgres.
* :mod:`.sql`: the memory columns read, rows as hits or records, and the SQL
  conditions of a search's filters (:func:`filter_clause`).
* :mod:`.store`: :class:`PostgresStore`, every memory write in one
  transaction with its outbox rows, and the reads derived indexes need.
* :mod:`.graph_writes`: the store's entity and relation edits.
* :mod:`.lifecycle`: supersession by ``mem_key`` inside a write's
  transaction, the per-key locks, and the restore of a retired version.
* :mod:`.generations`: the per-tenant write generation every change bumps
  (:func:`bump_generations`), which a cached recall checks (:func:`read_generation`)
  and so does a walk of a kept graph (:func:`current_generation`).
* :mod:`.stats`: what is stored, counted per tenant (:func:`tenant_counts`).
* :mod:`.replica`: which Postgres a recall reads, the primary or a streaming
  replica past the tenant's last write (:class:`ReplicaRouter`).
"""

from __future__ import annotations

from .arrays import TextArray
from .generations import bump_generations, current_generation, read_generation
from .lifecycle import Deleted, Written
from .models import EntityInput, MemoryInput, RelationInput
from .names import entity_text, name_candidates, normalize_name
from .pool import (
    NOTIFY_CHANNEL,
    PING_TIMEOUT_S,
    PoolSource,
    Read,
    end_given_up,
    on_connection,
    open_pool,
    open_replica_pool,
    schema_lock,
    scope_to_tenant,
    settings_read,
    tenant_reads,
    tenant_transaction,
)
from .replica import ReplicaRouter, ReplicaStats, format_lsn, parse_lsn, primary_lsn
from .sql import (
    HIT_COLUMNS,
    RECORD_COLUMNS,
    by_ids_sql,
    filter_clause,
    hit_from_row,
    lifecycle_clause,
    record_from_row,
)
from .stats import TenantCounts, tenant_counts
from .store import PostgresStore

__all__ = [
    "HIT_COLUMNS",
    "NOTIFY_CHANNEL",
    "PING_TIMEOUT_S",
    "RECORD_COLUMNS",
    "Deleted",
    "Read",
    "EntityInput",
    "MemoryInput",
    "PoolSource",
    "PostgresStore",
    "RelationInput",
    "ReplicaRouter",
    "ReplicaStats",
    "TenantCounts",
    "Written",
    "bump_generations",
    "current_generation",
    "by_ids_sql",
    "filter_clause",
    "format_lsn",
    "hit_from_row",
    "lifecycle_clause",
    "entity_text",
    "name_candidates",
    "normalize_name",
    "end_given_up",
    "on_connection",
    "open_pool",
    "open_replica_pool",
    "parse_lsn",
    "primary_lsn",
    "read_generation",
    "record_from_row",
    "TextArray",
    "schema_lock",
    "scope_to_tenant",
    "settings_read",
    "tenant_counts",
    "tenant_reads",
    "tenant_transaction",
]
