"""Checks that depend on the running config; each failure names what is wrong."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timezone

from config import BraidConfig
from indexers.base import Filters
from indexers.engine import MemoryWrite, RecallOptions

from .schemas import MemoriesIn, RecallIn

__all__ = ["InputError", "memory_writes", "recall_options"]


class InputError(Exception):
    """A request that is well-formed JSON but cannot be served as asked."""


def _vector(values: Sequence[float] | None, dim: int, where: str) -> tuple[float, ...] | None:
    if values is None:
        return None
    if len(values) != dim:
        raise InputError(f"{where} has {len(values)} dimensions; expected {dim}")
    if not all(math.isfinite(v) for v in values):
        raise InputError(f"{where} contains NaN or infinite values")
    norm = math.sqrt(sum(v * v for v in values))
    if norm == 0.0:
        raise InputError(f"{where} is the zero vector")
    return tuple(v / norm for v in values)


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
        raise InputError(
            f"memories has {len(body.memories)} items; the limit is {cfg.limits.max_batch} per request"
        )
    tiers = cfg.memory_tiers
    now = datetime.now(timezone.utc)
    seen: set[str] = set()
    out = []
    for i, m in enumerate(body.memories):
        where = f"memories[{i}]"
        if m.tier not in tiers:
            raise InputError(f"{where}.tier: unknown tier {m.tier!r}; memory tiers are {tiers}")
        if m.id is not None:
            if m.id in seen:
                raise InputError(f"{where}.id: {m.id!r} appears twice in this request")
            seen.add(m.id)
        out.append(
            MemoryWrite(
                content=_text(m.content, f"{where}.content", cfg.limits.max_content_chars),
                kind=m.kind,
                tier=m.tier,
                created_at=(m.created_at or now).astimezone(timezone.utc),
                id=m.id,
                session_id=m.session_id,
                tags=tuple(dict.fromkeys(m.tags)),
                importance=m.importance,
                confidence=m.confidence,
                speaker=None if m.speaker is None else _text(m.speaker, f"{where}.speaker", 200).strip(),
                context=None
                if m.context is None or not m.context.strip()
                else _text(m.context, f"{where}.context", cfg.limits.max_content_chars),
                metadata=m.metadata,
                entities=tuple(m.entities),
                embedding=_vector(m.embedding, cfg.embedding.dim, f"{where}.embedding"),
            )
        )
    return out


def recall_options(body: RecallIn, cfg: BraidConfig) -> RecallOptions:
    query = _text(body.query, "query", cfg.limits.max_content_chars)
    lim = cfg.limits
    if body.top_k is not None and not 1 <= body.top_k <= lim.max_top_k:
        raise InputError(f"top_k must be between 1 and {lim.max_top_k}, got {body.top_k}")
    if body.budget_tokens is not None and not 1 <= body.budget_tokens <= lim.max_budget_tokens:
        raise InputError(
            f"budget_tokens must be between 1 and {lim.max_budget_tokens}, got {body.budget_tokens}"
        )
    if body.hops is not None and not 0 <= body.hops <= lim.max_hops:
        raise InputError(f"hops must be between 0 and {lim.max_hops}, got {body.hops}")
    if body.tiers is not None:
        unknown = [t for t in body.tiers if t not in cfg.tiers]
        if unknown:
            raise InputError(f"tiers: unknown tier(s) {unknown}; tiers are {list(cfg.tiers)}")
    if body.created_after and body.created_before and body.created_after > body.created_before:
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
            created_after=body.created_after,
            created_before=body.created_before,
        ),
        sources=None if body.sources is None else tuple(body.sources),
        embedding=_vector(body.embedding, cfg.embedding.dim, "embedding"),
        hops=body.hops,
    )
