"""Every input check beyond the body schema (which :mod:`service.decode` applies):
bounds from the running config, cross-field rules, path and query values.
Each failure is an :class:`InputError` that names the field and what is wrong."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import numpy as np

from config import BraidConfig, BraidError, is_safe_name, source_defaults
from indexers.base import Filters
from indexers.engine import GraphWrite, MemoryWrite
from indexers.postgres import EntityInput, RelationInput
from indexers.results import RecallOptions
from indexers.typesense.metadata import filter_tokens, unsupported_path

from .decode import MAX_METADATA_DEPTH
from .schemas import MAX_MEM_KEY, GraphIn, Id, MemKey, MemoriesIn, Name, RecallIn, ReindexIn, RelationName

__all__ = [
    "InputError",
    "entity_name",
    "graph_write",
    "MAX_VERSIONS",
    "mem_key",
    "memory_id",
    "memory_writes",
    "recall_options",
    "reindex",
    "relation_key",
    "tenant",
    "versions_limit",
]


class InputError(BraidError):
    """A request that is well-formed JSON but cannot be served as asked."""


def _vector(values: Sequence[float] | None, dim: int, where: str) -> tuple[float, ...] | None:
    """``values`` scaled to unit length. Scaled by the largest magnitude first, so
    huge finite components (1e300) cannot overflow the squares and tiny ones
    cannot underflow them: any finite non-zero vector keeps its direction."""
    if values is None:
        return None
    if len(values) != dim:
        raise InputError(f"{where} has {len(values)} dimensions; expected {dim}")
    # In numpy, each step the same IEEE operation on each component as the
    # plain loops it replaced (the sum of squares still exact, by fsum).
    array = np.asarray(values, dtype=np.float64)
    if not np.isfinite(array).all():
        raise InputError(f"{where} contains NaN or infinite values")
    peak = float(np.abs(array).max())
    if peak == 0.0:
        raise InputError(f"{where} is the zero vector")
    scaled = array / peak
    norm = math.sqrt(math.fsum((scaled * scaled).tolist()))
    return tuple((scaled / norm).tolist())


def _utc(value: datetime, where: str) -> datetime:
    """``value`` in UTC; refused when UTC takes it out of years 1-9999 (Postgres
    would store it, but it could never be read back)."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InputError(f"{where}: {value.isoformat()} is outside the years 1-9999 once converted to UTC") from None


def _depth(value: Any) -> int:
    """Levels of objects and arrays in a decoded JSON value (a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _metadata(value: dict[str, Any], where: str) -> dict[str, Any]:
    depth = _depth(value)
    if depth > MAX_METADATA_DEPTH:
        raise InputError(f"{where} nests {depth} levels of objects and arrays; the limit is {MAX_METADATA_DEPTH}")
    return value


#: Most values (scalars and empty containers) a recall's metadata filter may hold:
#: each is one clause of the Typesense filter.
MAX_METADATA_FILTER_VALUES = 64


def _has_nul(value: Any) -> bool:
    """Whether a decoded JSON value has a NUL in a string or a key."""
    if isinstance(value, dict):
        return any("\x00" in k or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return isinstance(value, str) and "\x00" in value


def _metadata_filter(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A recall's ``metadata`` filter; ``{}`` (contained in everything) is no filter."""
    if not value:
        return None
    _metadata(value, "metadata")
    where = unsupported_path(value)
    if where is not None:
        raise InputError(f"{where}: an array in a metadata filter may hold only strings, numbers, booleans and null")
    if _has_nul(value):
        raise InputError("metadata contains a NUL character (Postgres cannot compare it)")
    count = len(filter_tokens(value))
    if count > MAX_METADATA_FILTER_VALUES:
        raise InputError(f"metadata has {count} values to match; the limit is {MAX_METADATA_FILTER_VALUES}")
    return value


def _text(value: str, where: str, max_chars: int) -> str:
    if not value.strip():
        raise InputError(f"{where} must not be empty")
    if len(value) > max_chars:
        raise InputError(f"{where} has {len(value)} characters; the limit is {max_chars}")
    if "\x00" in value:
        raise InputError(f"{where} contains a NUL character")
    return value


def memory_writes(body: MemoriesIn, cfg: BraidConfig) -> list[MemoryWrite]:
    if len(body.memories) > cfg.limits.max_batch:
        raise InputError(f"memories has {len(body.memories)} items; the limit is {cfg.limits.max_batch} per request")
    tiers = cfg.memory_tiers
    now = datetime.now(UTC)
    seen: set[str] = set()
    out = []
    for i, m in enumerate(body.memories):
        where = f"memories[{i}]"
        tier = cfg.default_tier if m.tier is None else m.tier
        if tier not in tiers:
            raise InputError(f"{where}.tier: unknown tier {tier!r}; memory tiers are {tiers}")
        if m.expires_at is not None and m.ttl_seconds is not None:
            raise InputError(f"{where}: give expires_at or ttl_seconds, not both")
        expires_at = None if m.expires_at is None else _utc(m.expires_at, f"{where}.expires_at")
        if m.ttl_seconds is not None:
            try:
                expires_at = now + timedelta(seconds=m.ttl_seconds)
            except OverflowError:
                raise InputError(f"{where}.ttl_seconds: {m.ttl_seconds} s from now is after the year 9999") from None
        if m.id is not None:
            if m.id in seen:
                raise InputError(f"{where}.id: {m.id!r} appears twice in this request")
            seen.add(m.id)
        out.append(
            MemoryWrite(
                content=_text(m.content, f"{where}.content", cfg.limits.max_content_chars),
                kind=m.kind,
                tier=tier,
                created_at=now if m.created_at is None else _utc(m.created_at, f"{where}.created_at"),
                id=m.id,
                session_id=m.session_id,
                tags=tuple(dict.fromkeys(m.tags)),
                importance=m.importance,
                confidence=m.confidence,
                speaker=None if m.speaker is None else _text(m.speaker, f"{where}.speaker", 200).strip(),
                context=None
                if m.context is None or not m.context.strip()
                else _text(m.context, f"{where}.context", cfg.limits.max_content_chars),
                metadata=_metadata(m.metadata, f"{where}.metadata"),
                entities=tuple(m.entities),
                embedding=_vector(m.embedding, cfg.embedding.dim, f"{where}.embedding"),
                model=_embedding_model(m.embedding, m.embedding_model, where),
                mem_key=None if m.mem_key is None else _blank_key(m.mem_key, f"{where}.mem_key"),
                expires_at=expires_at,
                stamped=m.created_at is None,
            )
        )
    return out


def _embedding_model(embedding: list[float] | None, model: str | None, where: str) -> str | None:
    """The model a given ``embedding`` names; ``None``: the service's."""
    if model is not None and embedding is None:
        prefix = f"{where}." if where else ""
        raise InputError(f"{prefix}embedding_model names the model of {prefix}embedding: give both or neither")
    return model


_MEM_KEY_RULE = f"1-{MAX_MEM_KEY} characters, not all spaces, no control characters"


def _blank_key(value: str, where: str) -> str:
    if not value.strip():
        raise InputError(f"{where} must not be blank ({_MEM_KEY_RULE})")
    return value


def mem_key(value: str | None) -> str:
    """The ``mem_key`` query parameter of a versions list, by the rule of a written one."""
    if value is None:
        raise InputError("mem_key is required: GET /v1/memories?mem_key=<key> lists that key's versions")
    try:
        key = msgspec.convert(value, MemKey)
    except msgspec.ValidationError:
        raise InputError(f"mem_key {value!r} is not a valid key ({_MEM_KEY_RULE})") from None
    return _blank_key(key, "mem_key")


#: Most versions one list returns.
MAX_VERSIONS = 1000


def versions_limit(value: int) -> int:
    if not 1 <= value <= MAX_VERSIONS:
        raise InputError(f"limit must be between 1 and {MAX_VERSIONS}, got {value}")
    return value


def recall_options(body: RecallIn, cfg: BraidConfig) -> RecallOptions:
    if not body.query.strip() and body.strategy in ("semantic", "keyword"):
        raise InputError(
            f"query must not be empty with strategy {body.strategy!r} (strategies 'auto' and 'recent' take none)"
        )
    # An empty query: auto runs as recent, which needs none.
    query = _text(body.query, "query", cfg.limits.max_content_chars) if body.query.strip() else ""
    lim = cfg.limits
    if body.top_k is not None and not 1 <= body.top_k <= lim.max_top_k:
        raise InputError(f"top_k must be between 1 and {lim.max_top_k}, got {body.top_k}")
    if body.budget_tokens is not None and not 1 <= body.budget_tokens <= lim.max_budget_tokens:
        raise InputError(f"budget_tokens must be between 1 and {lim.max_budget_tokens}, got {body.budget_tokens}")
    if body.hops is not None and not 0 <= body.hops <= lim.max_hops:
        raise InputError(f"hops must be between 0 and {lim.max_hops}, got {body.hops}")
    if body.sources is not None:
        known = list({**source_defaults(), **cfg.sources})
        for i, name in enumerate(body.sources):
            if name not in known:
                raise InputError(f"sources[{i}]: unknown source {name!r}; sources are {known}")
    if body.tiers is not None:
        unknown = [t for t in body.tiers if t not in cfg.tiers]
        if unknown:
            raise InputError(f"tiers: unknown tier(s) {unknown}; tiers are {list(cfg.tiers)}")
    after = None if body.created_after is None else _utc(body.created_after, "created_after")
    before = None if body.created_before is None else _utc(body.created_before, "created_before")
    if after and before and after > before:
        raise InputError("created_after is later than created_before")
    return RecallOptions(
        query=query,
        top_k=body.top_k,
        budget_tokens=body.budget_tokens,
        min_confidence=body.min_confidence,
        filters=Filters(
            session_id=body.session_id,
            tags=None if body.tags is None else tuple(body.tags),
            kinds=None if body.kinds is None else tuple(body.kinds),
            tiers=None if body.tiers is None else tuple(body.tiers),
            created_after=after,
            created_before=before,
            metadata=_metadata_filter(body.metadata),
            min_importance=body.min_importance,
            as_of=None if body.as_of is None else _utc(body.as_of, "as_of"),
        ),
        sources=None if body.sources is None else tuple(body.sources),
        embedding=_vector(body.embedding, cfg.embedding.dim, "embedding"),
        embedding_model=_embedding_model(body.embedding, body.embedding_model, ""),
        hops=body.hops,
        reference_time=None if body.reference_time is None else _utc(body.reference_time, "reference_time"),
        track=body.track,
        strategy=body.strategy,
    )


def graph_write(body: GraphIn, cfg: BraidConfig) -> GraphWrite:
    if not body.entities and not body.relations:
        raise InputError("give at least one entity or relation")
    limit = cfg.limits.max_batch
    for field, items in (("entities", body.entities), ("relations", body.relations)):
        if len(items) > limit:
            raise InputError(f"{field} has {len(items)} items; the limit is {limit} per request")
    relations = []
    for i, r in enumerate(body.relations):
        where = f"relations[{i}]"
        valid_from = None if r.valid_from is None else _utc(r.valid_from, f"{where}.valid_from")
        valid_to = None if r.valid_to is None else _utc(r.valid_to, f"{where}.valid_to")
        if valid_from and valid_to and valid_from >= valid_to:
            raise InputError(f"{where}: valid_from must be before valid_to")
        relations.append(
            RelationInput(
                source=r.source,
                relation=r.relation,
                target=r.target,
                weight=r.weight,
                valid_from=valid_from,
                valid_to=valid_to,
            )
        )
    return GraphWrite(
        entities=tuple(
            EntityInput(name=e.name, type=e.type, summary=e.summary, embedding=(), model="") for e in body.entities
        ),
        relations=tuple(relations),
    )


def _path_value(value: str) -> str:
    # A `:path` parameter keeps the slash that starts it.
    return value[1:] if value.startswith("/") else value


def memory_id(value: str) -> str:
    """A memory id from the URL path, by the same rule as a written id."""
    value = _path_value(value)
    try:
        return msgspec.convert(value, Id)
    except msgspec.ValidationError:
        raise InputError(f"memory id {value!r} is not a valid id (letters, digits, _.:- up to 128)") from None


def entity_name(value: str, where: str = "entity name") -> str:
    """An entity name from the URL path or query, by the same rule as a written one."""
    value = _path_value(value) if where == "entity name" else value
    try:
        name = msgspec.convert(value, Name)
    except msgspec.ValidationError:
        raise InputError(f"{where} {value!r} is not a valid name (1-200 characters, no NUL)") from None
    if not name.strip():
        raise InputError(f"{where} must not be blank")
    return name


def relation_key(source: str, target: str, relation: str | None) -> tuple[str, str, str | None]:
    """The (source, target, relation) a relation delete names; ``relation`` None is any."""
    if relation is not None:
        try:
            relation = msgspec.convert(relation, RelationName)
        except msgspec.ValidationError:
            raise InputError(f"relation {relation!r} is not a valid relation name (1-100 characters, no NUL)") from None
    return entity_name(source, "source"), entity_name(target, "target"), relation


def reindex(body: ReindexIn, cfg: BraidConfig) -> None:
    if body.tier is not None and body.tier not in cfg.tiers:
        raise InputError(f"tier: unknown tier {body.tier!r}; tiers are {list(cfg.tiers)}")
    if body.tier is not None and body.target == "typesense":
        raise InputError("tier applies to pgvector indexes; Typesense is rebuilt whole")
    if body.tier is not None and body.target == "embeddings":
        raise InputError("tier applies to pgvector indexes; an embeddings job re-embeds every tier")
    if body.tier is not None and body.target == "graph":
        raise InputError("tier applies to pgvector indexes; a graph job extracts from every memory")
    if body.tier is not None and body.target == "placement":
        raise InputError("tier applies to pgvector indexes; a placement job moves tenants in Typesense")
    if body.tier is not None and body.target == "import":
        raise InputError("tier applies to pgvector indexes; an import job prepares every tier of its tenant")
    if body.target == "import" and body.tenant is None:
        raise InputError("target import needs `tenant`: the tenant about to be bulk loaded")
    if body.target != "import" and body.tenant is not None:
        raise InputError(f"tenant applies to target import only, not {body.target}")
    if body.target == "import" and cfg.postgres.own_index_above is None:
        raise InputError(
            "target import reserves HNSW indexes of the tenant's own, built by the next placement job,"
            " which builds none while postgres.ownIndexAbove is null; set it"
        )
    if body.target == "graph" and cfg.graph.extract == "none":
        raise InputError("target graph extracts with graph.extract, which is `none`; set an extractor (`spacy`)")


def tenant(value: str | None) -> str | None:
    """A tenant name from the query, by the rule of the tenants keys name
    (``config.NAME_PATTERN``); ``None``: every tenant."""
    if value is not None and not is_safe_name(value):
        raise InputError(
            f"tenant {value!r} is not a valid tenant name (1-63 letters, digits, _ and -, not starting with -)"
        )
    return value
