"""Memory rows and SQL parameters: the columns selected, rows as hits or
records, vectors as parameters, and the SQL conditions of a search's filters."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb

from config.schema import TierConfig, is_safe_name

from ..base import RECORD_FIELDS, SHOWN_FIELDS, Filters, Hit, MemoryRecord
from ..lifecycle import Forgetting

__all__ = [
    "HIT_COLUMNS",
    "RECORD_COLUMNS",
    "RECORD_COLUMNS_NO_EMBEDDING",
    "by_ids_sql",
    "filter_clause",
    "lifecycle_clause",
    "hit_from_row",
    "record_from_row",
    "tier_hnsw_ddl",
    "vector_param",
]


def tier_hnsw_ddl(tier: str, t: TierConfig, name: str, ops: str, where: str = "", *, concurrently: bool) -> str:
    """``CREATE INDEX`` of ``name``, a HNSW index on ``memories`` over the
    rows of ``tier`` (and ``where``) with the tier's m / ef_construction;
    ``ops`` is the column and its operator class (``embedding vector_cosine_ops``)."""
    if not is_safe_name(tier):
        raise ValueError(f"invalid tier name {tier!r}")
    conc = "CONCURRENTLY " if concurrently else ""
    more = f" AND {where}" if where else ""
    return (
        f"CREATE INDEX {conc}IF NOT EXISTS {name} ON memories USING hnsw ({ops})"
        f" WITH (m = {int(t.m)}, ef_construction = {int(t.ef_construction)}) WHERE tier = '{tier}'{more}"
    )


def _columns(names: Sequence[str]) -> str:
    return ", ".join(f"m.{name}" for name in names)


#: The memory columns :func:`record_from_row` reads: every stored field.
RECORD_COLUMNS = _columns(RECORD_FIELDS)

#: :data:`RECORD_COLUMNS` with the embedding left out (read as ``NULL``): a
#: vector costs more to read and convert than the rest of the row.
RECORD_COLUMNS_NO_EMBEDDING = ", ".join(
    "NULL::vector AS embedding" if name == "embedding" else f"m.{name}" for name in RECORD_FIELDS
)

#: The memory columns :func:`hit_from_row` reads: the shown fields.
HIT_COLUMNS = _columns(SHOWN_FIELDS)


@functools.cache
def by_ids_sql(columns: str, where: str) -> str:
    """``columns`` of the tenant's memories (alias ``m``) whose ids are in
    ``%(ids)s`` and that match ``where``: one primary-key look-up per id,
    whatever plan Postgres caches for the prepared statement.

    Not ``m.tenant = %(tenant)s AND m.id = ANY(%(ids)s)``: with many tenants
    and one large, that statement's generic plan scans the large tenant's
    whole range of ``memories_tenant_session_created``
    (benchmarks/results/live-check-plans.md)."""
    return f"""
        SELECT {columns} FROM unnest(%(ids)s::text[]) AS r(id)
        CROSS JOIN LATERAL (
            SELECT * FROM memories m WHERE m.tenant = %(tenant)s AND m.id = r.id AND {where}
        ) m"""


def vector_param(values: Sequence[float]) -> np.ndarray:
    """An embedding as a query parameter (a ``vector`` on a pool connection)."""
    return np.asarray(values, dtype=np.float32)


def _embedding(value: Any) -> tuple[float, ...] | None:
    if value is None:
        return None
    if hasattr(value, "to_list"):  # pgvector.Vector from a binary-format fetch
        value = value.to_list()
    return tuple(float(x) for x in value)


#: How a column's value becomes the field's; other columns are taken as read.
_READ: dict[str, Callable[[Any], Any]] = {
    "created_at": lambda v: v.astimezone(UTC),
    "superseded_at": lambda v: None if v is None else v.astimezone(UTC),
    "expires_at": lambda v: None if v is None else v.astimezone(UTC),
    "confidence": float,
    "importance": lambda v: None if v is None else float(v),
    "metadata": lambda v: dict(v or {}),
    "tags": lambda v: tuple(v or ()),
    "embedding": _embedding,
}


def _fields(row: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    return {n: _READ[n](row[n]) if n in _READ else row[n] for n in names}


def _hit_reader() -> Callable[[dict[str, Any], float], Hit]:
    """:func:`hit_from_row`, written out for :data:`SHOWN_FIELDS` once: each
    field read by name and converted as :data:`_READ` says, as
    :func:`_fields` does, with no loop or look-up of its own (a fused recall
    makes about a hundred hits from rows)."""
    args = ", ".join(f"{n}=_read_{n}(row[{n!r}])" if n in _READ else f"{n}=row[{n!r}]" for n in SHOWN_FIELDS)
    source = f"def hit_from_row(row, score):\n    return Hit({args}, score=score)\n"
    scope: dict[str, Any] = {"Hit": Hit, **{f"_read_{n}": f for n, f in _READ.items()}}
    exec(source, scope)  # noqa: S102 - the text is made of field names only
    made: Callable[[dict[str, Any], float], Hit] = scope["hit_from_row"]
    made.__doc__ = "A memory row (:data:`HIT_COLUMNS`) as a search hit."
    return made


hit_from_row = _hit_reader()


def record_from_row(row: dict[str, Any]) -> MemoryRecord:
    """A memory row (:data:`RECORD_COLUMNS`) as a record, timestamps in UTC."""
    return MemoryRecord(**_fields(row, RECORD_FIELDS))


def lifecycle_clause(as_of: datetime | None, alias: str = "m") -> tuple[str, dict[str, Any]]:
    """The SQL condition that a memory is current: never superseded, or with
    ``as_of``, created by then and not yet superseded then."""
    if as_of is None:
        return f"{alias}.superseded_at IS NULL", {}
    cond = (
        f"{alias}.created_at <= %(f_as_of)s AND ({alias}.superseded_at IS NULL OR {alias}.superseded_at > %(f_as_of)s)"
    )
    return cond, {"f_as_of": as_of}


def filter_clause(
    filters: Filters,
    *,
    min_confidence: float,
    memory_tiers: Sequence[str],
    alias: str = "m",
    tier: str | None = None,
    forgetting: Forgetting | None = None,
) -> tuple[str, dict[str, Any]]:
    """SQL conditions (joined by AND, never empty) and their named parameters.

    Only current memories pass (:func:`lifecycle_clause`; with ``as_of``,
    the ones current then), and expired memories are always left out
    (:meth:`Forgetting.sql`); only the ``expires_at`` of each memory counts
    unless ``forgetting`` brings the config's retentions and activation floor.

    Only values travel as parameters; the SQL text is fixed, so no filter
    value can change the query's shape. The tenant condition is the caller's.
    With ``tier`` the condition names that one tier as a literal, so the
    planner can use the tier's partial HNSW index (tier names are validated
    identifiers, see ``config.NAME_PATTERN``).
    """
    a = alias
    conds = [f"{a}.confidence >= %(f_min_conf)s"]
    params: dict[str, Any] = {"f_min_conf": min_confidence}
    lifecycle, when = lifecycle_clause(filters.as_of, a)
    conds.append(lifecycle)
    params.update(when)
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
    if filters.metadata:
        conds.append(f"{a}.metadata @> %(f_metadata)s")
        params["f_metadata"] = Jsonb(filters.metadata)
    if filters.min_importance is not None:
        # As stored (real): 0.7 as a double is above the real 0.7 a memory holds.
        conds.append(f"{a}.importance >= %(f_min_importance)s::real")
        params["f_min_importance"] = filters.min_importance
    live, live_params = (forgetting or Forgetting()).sql(a, tier)
    conds.append(live)
    params.update(live_params)
    return " AND ".join(conds), params


@asynccontextmanager
async def build_memory(conn: Any, mb: int) -> AsyncIterator[None]:
    """``maintenance_work_mem`` at ``mb`` MB on ``conn`` while an index is
    built in the block (reset after): an HNSW build holding its whole graph
    in memory is faster than one that outgrows it and goes on on disk
    (``postgres.indexBuildMemoryMb``)."""
    await conn.execute(f"SET maintenance_work_mem = '{int(mb)}MB'")
    try:
        yield
    finally:
        await conn.execute("RESET maintenance_work_mem")
