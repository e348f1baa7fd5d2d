"""What the client sends and what it gets back: frozen msgspec Structs.

Request Structs (:class:`Memory`, :class:`Entity`, :class:`Relation`) leave
out every field left unset (``omit_defaults``), so the service applies its own
defaults. Response Structs are decoded straight from the response bytes; they
ignore fields they do not know, so a newer service does not break an older
client, and enumerations (a status, a strategy) are plain strings for the same
reason. The field meanings are the HTTP API's (README, "HTTP API").
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

import msgspec

__all__ = [
    "BookkeepingStats",
    "CacheStats",
    "Deleted",
    "Entity",
    "EntityDeleted",
    "ExtractionStats",
    "GraphWritten",
    "Health",
    "Job",
    "JobStarted",
    "Memory",
    "QueryInfo",
    "Recall",
    "RecallItem",
    "Relation",
    "RelationsDeleted",
    "Reloaded",
    "SourceReport",
    "Stats",
    "StatsCounts",
    "StoredMemory",
    "SweepStats",
    "TenantStats",
    "Versions",
    "Written",
]


# --- requests -----------------------------------------------------------------


class Memory(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One memory to write (``POST /v1/memories``). Only ``content`` is required;
    a field left ``None`` is not sent and the service's default applies."""

    content: str
    #: Given: the write is an idempotent upsert of this id. The client gives
    #: every memory without one a fresh UUID before sending, so a retried
    #: write never stores it twice.
    id: str | None = None
    kind: str | None = None
    tier: str | None = None
    session_id: str | None = None
    tags: tuple[str, ...] = ()
    importance: float | None = None
    confidence: float | None = None
    created_at: datetime | None = None
    speaker: str | None = None
    #: Indexed-only text (e.g. the neighbouring turns): keyword-searched, never shown.
    context: str | None = None
    metadata: dict[str, Any] | None = None
    entities: tuple[str, ...] = ()
    embedding: tuple[float, ...] | None = None
    embedding_model: str | None = None
    #: The fact it states (e.g. ``user.home_city``): the write retires the key's current memory.
    mem_key: str | None = None
    expires_at: datetime | None = None
    ttl_seconds: int | None = None


class Entity(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One graph entity to write (``POST /v1/graph``)."""

    name: str
    type: str | None = None
    summary: str | None = None


class Relation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One graph relation to write; entities it names that do not exist are created."""

    source: str
    relation: str
    target: str
    weight: float | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None


# --- answers ------------------------------------------------------------------


class Written(msgspec.Struct, frozen=True):
    """``POST /v1/memories``: the ids written, in order, and the memories the write retired."""

    ids: list[str]
    superseded: list[str] = []


class Deleted(msgspec.Struct, frozen=True):
    """``DELETE /v1/memories/{id}``."""

    deleted: str
    #: With ``restore_previous``: the retired version made current again.
    restored: str | None = None


class StoredMemory(msgspec.Struct, frozen=True):
    """One stored memory with its lifecycle (``GET /v1/memories/{id}``)."""

    id: str
    content: str
    kind: str
    tier: str
    created_at: datetime
    confidence: float
    importance: float | None = None
    speaker: str | None = None
    session_id: str | None = None
    tags: list[str] = []
    context: str | None = None
    metadata: dict[str, Any] = {}
    model: str | None = None
    expires_at: datetime | None = None
    mem_key: str | None = None
    superseded_at: datetime | None = None
    superseded_by: str | None = None
    current: bool = True


class Versions(msgspec.Struct, frozen=True):
    """``GET /v1/memories?mem_key=``: the key's versions, newest first."""

    mem_key: str
    memories: list[StoredMemory]


class GraphWritten(msgspec.Struct, frozen=True):
    entities: int
    relations: int


class RelationsDeleted(msgspec.Struct, frozen=True):
    deleted: int


class EntityDeleted(msgspec.Struct, frozen=True):
    deleted: str
    #: Relations deleted with the entity (its mentions go too; memories stay).
    relations: int


class RecallItem(msgspec.Struct, frozen=True, kw_only=True):
    """One recalled memory and how its score came about:
    ``score == rrf_score * product(factors.values())``,
    ``rrf_score == sum(contributions.values())``."""

    id: str
    content: str
    kind: str
    tier: str
    created_at: datetime
    confidence: float
    speaker: str | None = None
    importance: float | None = None
    mem_key: str | None = None
    expires_at: datetime | None = None
    score: float
    rrf_score: float
    #: Source -> the item's rank in that source's list (None: not in it).
    ranks: dict[str, int | None]
    #: Source -> its RRF contribution.
    contributions: dict[str, float]
    #: Factor name (``recency``, ``speaker``, ...) -> multiplier.
    factors: dict[str, float]
    in_block: bool
    truncated: bool


class SourceReport(msgspec.Struct, frozen=True):
    """How one source fared: ``ok``, ``timeout``, ``error``, ``no_vector`` or ``skipped``."""

    status: str
    ms: float
    hits: int
    error: str | None = None


class QueryInfo(msgspec.Struct, frozen=True):
    """What the service's query analysis made of the query."""

    text: str
    #: Known speakers the query is about (their memories are boosted).
    speakers: list[str]
    dates: list[tuple[date, date]]
    current: bool = False
    #: Known speakers the query only addresses or names as who says it (not boosted).
    addressed: list[str] = msgspec.field(default_factory=list)
    #: Known speakers named only as the other party of another named
    #: speaker's act ("... recommend to Melanie"; not boosted).
    others: list[str] = msgspec.field(default_factory=list)
    #: Known speakers the query's first person means (``query.selfSpeakers``; boosted by ``selfBoost``).
    selves: list[str] = msgspec.field(default_factory=list)


class Recall(msgspec.Struct, frozen=True):
    """``POST /v1/recall``: the memory block and how it was made."""

    #: The token-budgeted block, ready to paste into a prompt.
    block: str
    tokens: int
    items: list[RecallItem]
    sources: dict[str, SourceReport]
    degraded: list[str]
    embedding_ms: float
    embedding_status: str
    query: QueryInfo
    strategy: str
    cached: bool = False


class JobStarted(msgspec.Struct, frozen=True):
    job_id: str


class Job(msgspec.Struct, frozen=True):
    """A reindex job: ``queued``, ``running``, ``done``, ``failed`` or ``interrupted``."""

    job_id: str
    target: str
    status: str
    progress: dict[str, Any]
    created_at: datetime
    tier: str | None = None
    error: str | None = None
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        """True once the job will not change any more (``done``, ``failed``, ``interrupted``)."""
        return self.status not in ("queued", "running")


class Reloaded(msgspec.Struct, frozen=True):
    """``POST /admin/config/reload``."""

    reloaded: bool
    path: str
    restart_required: list[str]
    reindex_required: list[str]


class StatsCounts(msgspec.Struct, frozen=True):
    memories: int
    by_tier: dict[str, int]
    by_model: dict[str, int]
    stale_embeddings: int
    entities_by_model: dict[str, int]
    superseded: int
    expired: int
    outbox_pending: int


class TenantStats(StatsCounts, frozen=True):
    tenant: str


class Stats(msgspec.Struct, frozen=True):
    """``GET /admin/stats``: stored rows per tenant and in total."""

    embedding_model: str
    tenants: list[TenantStats]
    totals: StatsCounts


class BookkeepingStats(msgspec.Struct, frozen=True):
    queued: int
    written: int
    dropped: int
    failed: int


class SweepStats(msgspec.Struct, frozen=True):
    swept: int
    last_run: datetime | None
    last_swept: int
    error: str | None


class CacheStats(msgspec.Struct, frozen=True):
    entries: int
    hits: int
    misses: int


class ExtractionStats(msgspec.Struct, frozen=True):
    """Entity extraction on write (``graph.extract``) in the service process."""

    extractor: str
    memories: int = 0
    failed: int = 0
    entities: int = 0
    relations: int = 0


class Health(msgspec.Struct, frozen=True):
    """``GET /health``: ``ok`` when every backend is up, else ``degraded``."""

    status: str
    backends: dict[str, dict[str, Any]]
    bookkeeping: BookkeepingStats | None = None
    lifecycle: SweepStats | None = None
    cache: CacheStats | None = None
    extraction: ExtractionStats | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"
