"""Memory rows and SQL parameters: the columns selected, rows as hits or
records, vectors as parameters, and the SQL conditions of a search's filters."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timezone
from typing import Any

import numpy as np

from config.schema import is_safe_name

from ..base import Filters, Hit, MemoryRecord

__all__ = [
    "HIT_COLUMNS",
    "RECORD_COLUMNS",
    "filter_clause",
    "hit_from_row",
    "record_from_row",
    "vector_param",
]

#: The memory columns :func:`record_from_row` reads.
RECORD_COLUMNS = (
    "m.tenant, m.id, m.content, m.kind, m.tier, m.session_id, m.tags, m.importance, "
    "m.confidence, m.speaker, m.context, m.created_at, m.embedding, m.model"
)

#: The memory columns :func:`hit_from_row` reads.
HIT_COLUMNS = "m.id, m.content, m.kind, m.tier, m.created_at, m.confidence, m.speaker"


def vector_param(values: Sequence[float]) -> np.ndarray:
    """An embedding as a query parameter (a ``vector`` on a pool connection)."""
    return np.asarray(values, dtype=np.float32)


def hit_from_row(row: dict[str, Any], score: float) -> Hit:
    """A memory row (:data:`HIT_COLUMNS`) as a search hit."""
    return Hit(
        id=row["id"],
        content=row["content"],
        kind=row["kind"],
        tier=row["tier"],
        created_at=row["created_at"].astimezone(timezone.utc),
        confidence=float(row["confidence"]),
        score=score,
        speaker=row["speaker"],
    )


def record_from_row(row: dict[str, Any]) -> MemoryRecord:
    """A memory row (:data:`RECORD_COLUMNS`) as a record, timestamps in UTC."""
    emb = row["embedding"]
    if hasattr(emb, "to_list"):  # pgvector.Vector from a binary-format fetch
        emb = emb.to_list()
    return MemoryRecord(
        id=row["id"],
        tenant=row["tenant"],
        content=row["content"],
        kind=row["kind"],
        tier=row["tier"],
        created_at=row["created_at"].astimezone(timezone.utc),
        confidence=float(row["confidence"]),
        importance=None if row["importance"] is None else float(row["importance"]),
        session_id=row["session_id"],
        tags=tuple(row["tags"] or ()),
        speaker=row["speaker"],
        context=row["context"],
        embedding=None if emb is None else tuple(float(x) for x in emb),
        model=row["model"],
    )


def filter_clause(
    filters: Filters,
    *,
    min_confidence: float,
    memory_tiers: Sequence[str],
    alias: str = "m",
    tier: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """SQL conditions (joined by AND, never empty) and their named parameters.

    Only values travel as parameters; the SQL text is fixed, so no filter
    value can change the query's shape. The tenant condition is the caller's.
    With ``tier`` the condition names that one tier as a literal, so the
    planner can use the tier's partial HNSW index (tier names are validated
    identifiers, see ``config.NAME_PATTERN``).
    """
    a = alias
    conds = [f"{a}.confidence >= %(f_min_conf)s"]
    params: dict[str, Any] = {"f_min_conf": min_confidence}
    if tier is not None:
        if not is_safe_name(tier):
            raise ValueError(f"invalid tier name {tier!r}")
        conds.append(f"{a}.tier = '{tier}'")
    else:
        conds.append(f"{a}.tier = ANY(%(f_tiers)s)")
        params["f_tiers"] = [t for t in memory_tiers if filters.tiers is None or t in filters.tiers]
    if filters.session_id is not None:
        conds.append(f"{a}.session_id = %(f_session)s")
        params["f_session"] = filters.session_id
    if filters.tags:
        conds.append(f"{a}.tags && %(f_tags)s::text[]")
        params["f_tags"] = list(filters.tags)
    if filters.kinds:
        conds.append(f"{a}.kind = ANY(%(f_kinds)s)")
        params["f_kinds"] = list(filters.kinds)
    if filters.created_after is not None:
        conds.append(f"{a}.created_at >= %(f_after)s")
        params["f_after"] = filters.created_after
    if filters.created_before is not None:
        conds.append(f"{a}.created_at <= %(f_before)s")
        params["f_before"] = filters.created_before
    return " AND ".join(conds), params
