"""Request and response bodies of the HTTP API (msgspec Structs).

Static bounds live here; bounds that come from the config (top_k, budget,
batch size, tiers, embedding dimension) are checked in :mod:`service.validate`.
:class:`BodySchemaPlugin` makes the OpenAPI schema say what the decoder enforces.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

# Litestar's own Struct schema plugin has no public import path (litestar is pinned).
from litestar._openapi.schema_generation.plugins import StructSchemaPlugin  # type: ignore[attr-defined]
from litestar.openapi.spec import OpenAPIType, Reference, Schema
from litestar.typing import FieldDefinition
from msgspec import Meta

from config import NAME_PATTERN
from indexers.base import MemoryRecord
from indexers.bookkeeping import BookkeepingStats
from indexers.cache import CacheStats
from indexers.extraction import ExtractionStats
from indexers.postgres import ReplicaStats, TenantCounts
from indexers.results import RecallResult
from indexers.sweep import SweepStats

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator

__all__ = [
    "FREE_LABEL_PATTERN",
    "ID_PATTERN",
    "Id",
    "BodySchemaPlugin",
    "DeletedOut",
    "EntityDeletedOut",
    "Name",
    "RelationName",
    "RelationsDeletedOut",
    "GraphEntityIn",
    "GraphIn",
    "GraphOut",
    "HealthOut",
    "IdsOut",
    "JobOut",
    "JobStartedOut",
    "MemoriesIn",
    "MAX_MEM_KEY",
    "MEM_KEY_PATTERN",
    "MemKey",
    "MemoryIn",
    "MemoryOut",
    "VersionsOut",
    "RecallIn",
    "RecallOut",
    "ReindexIn",
    "ReloadOut",
    "RelationIn",
    "StatsCountsOut",
    "StatsOut",
    "TenantStatsOut",
]

# msgspec matches a pattern with re.search, where `$` also matches before a
# final newline: `(?!\n)` keeps "abc\n" out (and means nothing to other readers
# of the OpenAPI schema, where `$` is the end).
ID_PATTERN = r"^[A-Za-z0-9_.:\-]+(?!\n)$"
Id = Annotated[str, Meta(min_length=1, max_length=128, pattern=ID_PATTERN)]
Label = Annotated[str, Meta(min_length=1, max_length=64, pattern=ID_PATTERN)]
# Tags and session ids may be free text, but never a backtick (Typesense
# quoting) or a NUL (Postgres refuses it in text).
FREE_LABEL_PATTERN = r"^[^`\x00]+$"
FreeLabel = Annotated[str, Meta(min_length=1, max_length=128, pattern=FREE_LABEL_PATTERN)]
Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
# Litestar 2.25 drops a zero bound from an optional field's schema (it tests the
# bound for truth); the extra schema puts ``minimum: 0`` back.
OptionalUnit = Annotated[float, Meta(ge=0.0, le=1.0, extra_json_schema={"extra": {"minimum": 0.0}})] | None
Name = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^[^\x00]+$")]
Vector = list[float]
Stamp = Annotated[datetime, Meta(tz=True)]
#: A memory's ``mem_key``: the fact it states, e.g. ``user.home_city``;
#: 1-200 characters, none of them a control character (service.validate
#: also refuses one that is only spaces).
MEM_KEY_PATTERN = r"^[^\x00-\x1f\x7f]+$"
MAX_MEM_KEY = 200
MemKey = Annotated[str, Meta(min_length=1, max_length=MAX_MEM_KEY, pattern=MEM_KEY_PATTERN)]


class _In(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pass


class BodySchemaPlugin(StructSchemaPlugin):
    """Request bodies in the OpenAPI schema as the decoder takes them. Litestar 2.25
    leaves out two things msgspec enforces: a body refuses unknown fields
    (``additionalProperties: false``), and the bounds of a list's string items
    (``tags: list[FreeLabel]``)."""

    def is_plugin_supported_field(self, field_definition: FieldDefinition) -> bool:
        return super().is_plugin_supported_field(field_definition) and field_definition.is_subclass_of(_In)

    def to_openapi_schema(self, field_definition: FieldDefinition, schema_creator: SchemaCreator) -> Schema:
        schema = super().to_openapi_schema(field_definition, schema_creator)
        schema.additional_properties = False
        info = msgspec.inspect.type_info(field_definition.type_)
        assert isinstance(info, msgspec.inspect.StructType)
        for field in info.fields:
            item = _list_item(field.type)
            array = _array(schema.properties[field.encode_name]) if schema.properties else None
            if isinstance(item, msgspec.inspect.StrType) and array and isinstance(array.items, Schema):
                array.items.min_length = item.min_length
                array.items.max_length = item.max_length
                array.items.pattern = item.pattern
        return schema


def _list_item(t: msgspec.inspect.Type) -> msgspec.inspect.Type | None:
    """The item type of a list field (optional or not), else None."""
    if isinstance(t, msgspec.inspect.UnionType):
        lists = [u for u in t.types if isinstance(u, msgspec.inspect.ListType)]
        return lists[0].item_type if len(lists) == 1 else None
    return t.item_type if isinstance(t, msgspec.inspect.ListType) else None


def _array(schema: Schema | Reference) -> Schema | None:
    """The array schema of a property, looking inside ``oneOf`` (an optional list)."""
    if isinstance(schema, Schema) and schema.type == OpenAPIType.ARRAY:
        return schema
    if isinstance(schema, Schema) and schema.one_of:
        arrays = [s for s in schema.one_of if isinstance(s, Schema) and s.type == OpenAPIType.ARRAY]
        return arrays[0] if len(arrays) == 1 else None
    return None


#: A memory's text: not only spaces, no NUL (service.validate says which, and
#: the length limit is config). The schema says so for its readers; the checks
#: stay in validate, whose 400s name the field.
Content = Annotated[
    str, Meta(extra_json_schema={"extra": {"min_length": 1, "pattern": r"^[^\x00]*[^\s\x00][^\x00]*$"}})
]


class MemoryIn(_In, frozen=True):
    content: Content
    id: Id | None = None
    kind: Label = "note"
    #: The memory tier; omitted, the config's ``defaultTier``.
    tier: Label | None = None
    session_id: FreeLabel | None = None
    tags: Annotated[list[FreeLabel], Meta(max_length=64)] = []
    importance: OptionalUnit = None
    confidence: Unit = 1.0
    created_at: Stamp | None = None
    #: Who said or wrote it; a recall naming this speaker boosts the memory.
    speaker: Name | None = None
    #: Indexed-only text (e.g. neighbouring turns): keyword-searched, never shown.
    context: str | None = None
    metadata: dict[str, Any] = {}
    entities: Annotated[list[Name], Meta(max_length=64)] = []
    #: The memory's embedding, if the writer makes its own (unit length is not
    #: required: it is normalised); omitted, the service embeds ``content``.
    embedding: Vector | None = None
    #: The model that made ``embedding`` (only with it); omitted, the
    #: service's ``embedding.model``. Vector search compares a memory only
    #: with query vectors of its model.
    embedding_model: FreeLabel | None = None
    #: The fact it states (e.g. ``user.home_city``): writing it retires the
    #: key's current memory, or it is retired at once if that one is newer.
    mem_key: MemKey | None = None
    #: When the memory expires (RFC 3339; may be past): from then on no recall
    #: returns it and the sweeper removes it. Not with ``ttl_seconds``.
    expires_at: Stamp | None = None
    #: Expire this many seconds after the write is accepted (stored as
    #: ``expires_at``). Not with ``expires_at``.
    ttl_seconds: Annotated[int, Meta(ge=1, le=315_360_000_000)] | None = None


class MemoriesIn(_In, frozen=True):
    memories: Annotated[list[MemoryIn], Meta(min_length=1)]


class IdsOut(msgspec.Struct):
    ids: list[str]
    #: The memories this write retired: the current ones of its ``mem_key`` s.
    superseded: list[str] = []


class DeletedOut(msgspec.Struct, omit_defaults=True):
    deleted: str
    #: With ``restore_previous``: the retired version of the deleted memory's
    #: key made current again; absent when none was (there was none, or the
    #: deleted memory was not its key's current one).
    restored: str | None = None


class MemoryOut(msgspec.Struct):
    """One stored memory with its lifecycle."""

    id: str
    content: str
    kind: str
    tier: str
    created_at: datetime
    confidence: float
    importance: float | None
    speaker: str | None
    session_id: str | None
    tags: list[str]
    context: str | None
    metadata: dict[str, Any]
    #: The model its embedding was made by (the service's ``embedding.model``,
    #: or the writer's ``embedding_model``). Only memories of the service's
    #: model take part in a recall's vector search by query text.
    model: str | None
    #: When it expires (the write's ``expires_at`` or ``ttl_seconds``);
    #: ``null``: never by itself (a tier's retention or the activation floor
    #: may still end it). Once past, no recall returns it and the sweeper
    #: removes it, whether current or not.
    expires_at: datetime | None
    mem_key: str | None
    #: When a newer version of its key retired it; ``null`` while current.
    superseded_at: datetime | None
    #: The id of the version that retired it.
    superseded_by: str | None
    #: Whether no newer version of its key retired it: a recall (without
    #: ``as_of``) may return it unless it has expired.
    current: bool

    @classmethod
    def of(cls, record: MemoryRecord) -> MemoryOut:
        return cls(
            id=record.id,
            content=record.content,
            kind=record.kind,
            tier=record.tier,
            created_at=record.created_at,
            confidence=record.confidence,
            importance=record.importance,
            speaker=record.speaker,
            session_id=record.session_id,
            tags=list(record.tags),
            context=record.context,
            metadata=record.metadata,
            model=record.model,
            expires_at=record.expires_at,
            mem_key=record.mem_key,
            superseded_at=record.superseded_at,
            superseded_by=record.superseded_by,
            current=record.superseded_at is None,
        )


class VersionsOut(msgspec.Struct):
    mem_key: str
    #: The key's versions, newest first (by ``created_at``, then id).
    memories: list[MemoryOut]


class GraphEntityIn(_In, frozen=True):
    name: Name
    type: Label | None = None
    summary: Annotated[str, Meta(max_length=4000)] | None = None


RelationName = Annotated[str, Meta(min_length=1, max_length=100, pattern=r"^[^\x00]+$")]


class RelationIn(_In, frozen=True):
    source: Name
    relation: RelationName
    target: Name
    weight: Annotated[float, Meta(gt=0.0, le=1000.0)] = 1.0
    valid_from: Stamp | None = None
    valid_to: Stamp | None = None


class GraphIn(_In, frozen=True):
    entities: list[GraphEntityIn] = []
    relations: list[RelationIn] = []


class GraphOut(msgspec.Struct):
    entities: int
    relations: int


class RelationsDeletedOut(msgspec.Struct):
    #: How many relations were deleted.
    deleted: int


class EntityDeletedOut(msgspec.Struct):
    deleted: str
    #: Relations deleted with the entity (its mentions go too; memories stay).
    relations: int


class RecallIn(_In, frozen=True):
    #: What to recall; may be empty or left out with strategy ``auto`` (which
    #: then runs as ``recent``) or ``recent``.
    query: str = ""
    #: ``auto`` (every source, fused), ``semantic`` (vector sources), ``keyword``
    #: (keyword sources, no query embedding) or ``recent`` (the newest memories
    #: passing the filters, no query needed).
    strategy: Literal["auto", "semantic", "keyword", "recent"] = "auto"
    top_k: int | None = None
    budget_tokens: int | None = None
    min_confidence: OptionalUnit = None
    session_id: FreeLabel | None = None
    tags: Annotated[list[FreeLabel], Meta(max_length=64)] | None = None
    kinds: Annotated[list[Label], Meta(max_length=64)] | None = None
    tiers: Annotated[list[Label], Meta(max_length=16)] | None = None
    created_after: Stamp | None = None
    created_before: Stamp | None = None
    #: Search only these sources (names as in the answer's ``sources``); default all enabled.
    sources: Annotated[list[Label], Meta(min_length=1, max_length=16)] | None = None
    #: The query's embedding, if the caller makes its own; omitted, the
    #: service embeds ``query``.
    embedding: Vector | None = None
    #: The model that made ``embedding`` (only with it); omitted, the
    #: service's ``embedding.model``. Vector search compares it only with
    #: memories whose embedding that model made.
    embedding_model: FreeLabel | None = None
    #: Relation hops the graph walk may go (default graph.maxHops, at most limits.maxHops).
    hops: int | None = None
    #: "Now" for the time-based ranking factors (RFC 3339; default the server's clock).
    reference_time: Stamp | None = None
    #: Count this recall's returned memories as used (``usage_count``, ``last_accessed_at``).
    track: bool = True
    #: Only memories whose metadata contains this JSON object (jsonb ``@>``); no
    #: array in it may hold an object or an array.
    metadata: dict[str, Any] | None = None
    #: Only memories with an importance of at least this (one without does not match).
    min_importance: OptionalUnit = None
    #: Time travel (RFC 3339): the answer as it was then: memories created by
    #: then and not yet superseded then, relations valid then; also "now" for
    #: the time-based factors unless ``reference_time`` is given.
    as_of: Stamp | None = None


#: The recall answer is the engine's result, as is.
RecallOut = RecallResult


class ReindexIn(_In, frozen=True):
    #: ``typesense``: the collection rebuilt from Postgres; ``pgvector``: the
    #: HNSW indexes (of ``tier``, or every tier); ``all``: both;
    #: ``embeddings``: every memory and entity whose embedding another model
    #: made, embedded again by the service's ``embedding.model``; ``graph``:
    #: entities and relations extracted again from every memory by the
    #: extractor ``graph.extract`` names (links made before stay);
    #: ``placement``: tenants with ``postgres.ownIndexAbove`` memories or
    #: more in a tier given HNSW indexes of their own, and those with
    #: ``typesense.ownCollectionAbove`` or more moved to a Typesense
    #: collection pair of their own; ``import``: ``tenant`` made ready for a
    #: bulk load (its own Typesense pair now, its own HNSW indexes reserved
    #: and built in one pass by the next ``placement`` job).
    target: Literal["typesense", "pgvector", "all", "embeddings", "graph", "placement", "import"]
    #: Only with ``pgvector`` or ``all``: the one tier whose index is rebuilt.
    tier: Label | None = None
    #: Only with ``import`` (and required there): the tenant to be loaded.
    tenant: Annotated[str, Meta(pattern=NAME_PATTERN)] | None = None


class JobStartedOut(msgspec.Struct):
    job_id: str


class JobOut(msgspec.Struct):
    job_id: str
    target: str
    tier: str | None
    status: str
    progress: dict[str, Any]
    error: str | None
    created_at: datetime
    finished_at: datetime | None


class ReloadOut(msgspec.Struct):
    reloaded: bool
    path: str
    #: Changed keys read only at start-up: the old values hold until a restart.
    restart_required: list[str]
    #: Changed tier index settings (m, efConstruction): they apply through a reindex.
    reindex_required: list[str]


class HealthOut(msgspec.Struct):
    status: Literal["ok", "degraded"]
    backends: dict[str, dict[str, Any]]
    #: Recall bookkeeping (usage counts): queued, written, and dropped (queue
    #: full) or failed (Postgres refused the batch) since start.
    bookkeeping: BookkeepingStats
    #: This process's sweeper: expired memories removed since start, and its last run.
    lifecycle: SweepStats
    #: This process's recall result cache (``cache.ttlMs``).
    cache: CacheStats
    #: This process's entity extraction on write (``graph.extract``): memories
    #: extracted from, and those whose extraction failed (stored all the same).
    extraction: ExtractionStats
    #: The streaming replica recalls read (``postgres.replicaDsn``): up or
    #: down, its replay position, and recalls this process served from it and
    #: from the primary; null without one.
    replica: ReplicaStats | None = None


class StatsCountsOut(msgspec.Struct):
    """Stored rows, counted. Every memory count is of the rows stored now:
    ``superseded`` and ``expired`` are among ``memories``, not beside them."""

    #: Memories stored: current, superseded and expired (not yet swept) alike.
    memories: int
    #: Tier -> memories.
    by_tier: dict[str, int]
    #: Embedding model -> memories whose stored vector it made (a writer's own
    #: vector counts under its ``embedding_model``).
    by_model: dict[str, int]
    #: Memories whose stored vector the service's model (``embedding_model``)
    #: did not make: the ones ``by_model`` counts under another model. The
    #: service's query vectors are never compared with theirs; the reindex
    #: target ``embeddings`` embeds them with its model.
    stale_embeddings: int
    #: Embedding model -> entities whose stored vector it made.
    entities_by_model: dict[str, int]
    #: Memories a newer version of their ``mem_key`` retired.
    superseded: int
    #: Memories expired now by the running config (``expires_at``, a tier's
    #: ``retentionDays``, ``lifecycle.forgetBelow``) that no sweep removed
    #: yet: exactly the ones the sweeper's next run removes.
    expired: int
    #: Outbox rows not yet applied to Typesense.
    outbox_pending: int

    @classmethod
    def total(cls, tenants: list[TenantStatsOut]) -> StatsCountsOut:
        """The sums over ``tenants``."""
        by_tier: Counter[str] = Counter()
        by_model: Counter[str] = Counter()
        entities: Counter[str] = Counter()
        for t in tenants:
            by_tier.update(t.by_tier)
            by_model.update(t.by_model)
            entities.update(t.entities_by_model)
        return cls(
            memories=sum(t.memories for t in tenants),
            by_tier=dict(sorted(by_tier.items())),
            by_model=dict(sorted(by_model.items())),
            stale_embeddings=sum(t.stale_embeddings for t in tenants),
            entities_by_model=dict(sorted(entities.items())),
            superseded=sum(t.superseded for t in tenants),
            expired=sum(t.expired for t in tenants),
            outbox_pending=sum(t.outbox_pending for t in tenants),
        )


class TenantStatsOut(StatsCountsOut):
    """One tenant's stored rows, counted."""

    tenant: str

    @classmethod
    def of(cls, counts: TenantCounts, embedding_model: str) -> TenantStatsOut:
        return cls(tenant=counts.tenant, **_counts(counts, embedding_model))


def _counts(counts: TenantCounts, embedding_model: str) -> dict[str, Any]:
    return {
        "memories": sum(counts.by_tier.values()),
        "by_tier": counts.by_tier,
        "by_model": counts.by_model,
        "stale_embeddings": sum(n for model, n in counts.by_model.items() if model != embedding_model),
        "entities_by_model": counts.entities_by_model,
        "superseded": counts.superseded,
        "expired": counts.expired,
        "outbox_pending": counts.outbox_pending,
    }


class StatsOut(msgspec.Struct):
    #: The model the service embeds memories, entities and queries with.
    embedding_model: str
    #: Every tenant with a stored memory, entity or pending outbox row, by
    #: name; with ``?tenant=``, that tenant alone (zero counts if it has nothing).
    tenants: list[TenantStatsOut]
    #: The sums over ``tenants``.
    totals: StatsCountsOut

    @classmethod
    def of(cls, embedding_model: str, counts: list[TenantCounts]) -> StatsOut:
        tenants = [TenantStatsOut.of(c, embedding_model) for c in counts]
        return cls(embedding_model=embedding_model, tenants=tenants, totals=StatsCountsOut.total(tenants))


# Request examples for the OpenAPI schema: what a client sends most often.
WRITE_EXAMPLE = {
    "memories": [
        {
            "content": "Caroline moved to Lisbon in March.",
            "kind": "fact",
            "session_id": "s-12",
            "speaker": "Caroline",
            "created_at": "2026-01-15T09:30:00Z",
            "importance": 0.7,
            "mem_key": "caroline.home_city",
        }
    ]
}
GRAPH_EXAMPLE = {
    "entities": [{"name": "Caroline", "type": "person"}, {"name": "Lisbon", "type": "place"}],
    "relations": [{"source": "Caroline", "relation": "lives_in", "target": "Lisbon"}],
}
RECALL_EXAMPLE = {"query": "Where does Caroline live now?", "top_k": 8, "budget_tokens": 800}
