"""The decay fold: one inner-product HNSW search ranks a tier by
``cosine x w(importance) x exp(-lambda * age)``.

For any anchor ``a``, ``exp(-λ(t_ref - t)) = exp(-λ(t_ref - a)) * exp(λ(t - a))``.
A memory of a decayed tier stores ``folded = embedding * w * exp(λ(t - a))``
(``t`` its ``created_at``, ``w`` its importance, :data:`NEUTRAL_IMPORTANCE`
when it has none), so for a unit query ``q``, ``(q . folded) * exp(-λ(t_ref - a))``
is the objective exactly; the second factor is one number for the whole
search, so ``folded <#> q`` (pgvector's negative inner product) orders the rows
by the objective itself, and an HNSW index with ``vector_ip_ops`` on ``folded``
answers it in one walk.

**Epochs.** A ``(λ, a)`` pair is an epoch, a row of ``fold_epochs``, and has
its own partial HNSW index (``WHERE tier = '<t>' AND fold_epoch = <e>``).
A tier normally has one. A reindex that changes ``λ`` or moves the anchor
opens a new epoch and moves the rows into it a batch at a time
(:func:`move_rows`); until the old epochs are retired a search asks every
epoch and merges them on the objective, inside one snapshot, so each memory is
ranked once, by its own epoch's numbers. Epoch numbers come from a sequence and
are never reused.

**Float range.** pgvector stores float4 (largest ~3.4e38 = e^88.7; normal
values down to e^-87.3) and an HNSW build multiplies two stored vectors, so the
exponent ``λ(t - a)`` is clamped to :data:`MAX_EXPONENT` (a memory dated that
far past the anchor ranks as if it were dated there) and the anchor is moved
forward (re-centred, through a reindex of the tier) once the newest memories'
exponent ``λ(now - a)`` reaches :data:`RECENTRE_EXPONENT`. Nothing clamps the
other end: a memory about 80/λ older than the anchor (115 half-lives) has a
folded vector that underflows to zero, and it ranks last, tied with the others
there (by id).

**Writes and epochs.** A write takes a shared advisory lock per tier it writes
and reads the tier's newest epoch after it; opening or retiring an epoch takes
the lock exclusively. So once an epoch is open no write can still fold with an
older one, and a single pass of :func:`move_rows` moves every row.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
import numpy as np
import psycopg

from config import TierConfig, is_safe_name

from .models import MemoryInput
from .sql import tier_hnsw_ddl

__all__ = [
    "EPOCHS_SQL",
    "MAX_EXPONENT",
    "NEUTRAL_IMPORTANCE",
    "RECENTRE_EXPONENT",
    "Epoch",
    "decay_rate",
    "delete_epochs",
    "epochs_from_rows",
    "fold_index_ddl",
    "fold_index_name",
    "fold_vectors",
    "folds_for_write",
    "importance_weights",
    "lock_tier",
    "move_rows",
    "objective",
    "open_epoch",
    "read_epochs",
    "retire_older",
]

#: The weight of a memory written without importance: the middle of the 0-1
#: scale (also the ranking factors' neutral value), so a rating above 0.5
#: lifts a memory over an unrated one and a rating below lowers it.
NEUTRAL_IMPORTANCE = 0.5

#: Largest exponent ``λ(t - a)`` folded in: e^40 squared (an HNSW build
#: multiplies two stored vectors) stays inside float4's range with room.
MAX_EXPONENT = 40.0

#: The newest memories' exponent ``λ(now - a)`` at which a tier is re-centred
#: (29 half-lives after the anchor: 2.4 years at a 30-day half-life).
RECENTRE_EXPONENT = 20.0

SECONDS_PER_DAY = 86_400.0

#: Rows a reindex moves into a new epoch per transaction.
MOVE_BATCH = 500

#: Times a batch of :func:`move_rows` is tried when it deadlocks with a write.
DEADLOCK_RETRIES = 5

_LOCK_KEY = "hashtextextended('braid-fold:' || {}, 0)"


def decay_rate(half_life_days: float) -> float:
    """λ per second: ``ln 2 / half-life``."""
    return math.log(2.0) / (half_life_days * SECONDS_PER_DAY)


class Epoch(msgspec.Struct, frozen=True):
    """One ``(λ, anchor)`` of a tier's fold (a row of ``fold_epochs``)."""

    tier: str
    epoch: int
    half_life_days: float
    anchor: datetime
    #: Rows are still being moved into it (a reindex is under way or died).
    filling: bool = False

    @property
    def rate(self) -> float:
        return decay_rate(self.half_life_days)

    def exponent(self, t: datetime) -> float:
        """``λ(t - anchor)``, unclamped."""
        return self.rate * (t - self.anchor).total_seconds()

    def scale(self, reference_time: datetime) -> float:
        """``exp(-λ(t_ref - anchor))``: turns ``q . folded`` into the objective
        at ``reference_time`` (kept within float64's range)."""
        return math.exp(min(max(-self.exponent(reference_time), -745.0), 700.0))


def importance_weights(importance: Sequence[float | None]) -> np.ndarray:
    """``w``: the importance as given, :data:`NEUTRAL_IMPORTANCE` where none is."""
    return np.array([NEUTRAL_IMPORTANCE if i is None else float(i) for i in importance], dtype=np.float64)


def fold_vectors(
    embeddings: np.ndarray, weights: np.ndarray, seconds_after_anchor: np.ndarray, rate: float
) -> np.ndarray:
    """``embedding * w * exp(min(λ(t - a), MAX_EXPONENT))`` row by row, as
    float4 (computed in float64: the only rounding is the final one)."""
    x = np.minimum(rate * np.asarray(seconds_after_anchor, dtype=np.float64), MAX_EXPONENT)
    scale = np.asarray(weights, dtype=np.float64) * np.exp(x)
    return (np.asarray(embeddings, dtype=np.float64) * scale[:, None]).astype(np.float32)


def objective(similarity: np.ndarray, weights: np.ndarray, age_seconds: np.ndarray, rate: float) -> np.ndarray:
    """The exact objective ``cosine x w x exp(-λ * age)`` in float64 (the
    reference the tests and the benchmark compare the index with)."""
    return (
        np.asarray(similarity, np.float64) * np.asarray(weights, np.float64) * np.exp(-rate * np.asarray(age_seconds))
    )


def fold_index_name(tier: str, epoch: int) -> str:
    """``memories_fold_<tier>_<epoch>``, cut with a digest of the tier to stay
    clear of Postgres' 63-byte limit with ``_rebuild`` appended."""
    if not is_safe_name(tier):
        raise ValueError(f"invalid tier name {tier!r}")
    base = f"memories_fold_{tier}".replace("-", "_")
    suffix = f"_{int(epoch)}"
    if len(base) + len(suffix) > 54:
        base = f"{base[:40]}_{hashlib.sha1(tier.encode()).hexdigest()[:8]}"
    return base + suffix


def fold_index_ddl(tier: str, epoch: int, t: TierConfig, name: str, *, concurrently: bool) -> str:
    """The epoch's HNSW index: inner product on ``folded``, the tier's m / ef_construction."""
    return tier_hnsw_ddl(tier, t, name, "folded vector_ip_ops", f"fold_epoch = {int(epoch)}", concurrently=concurrently)


_EPOCH_COLUMNS = "tier, epoch, half_life_days, anchor, filling"


def _epoch(row: Sequence[Any]) -> Epoch:
    tier, epoch, half_life_days, anchor, filling = row
    return Epoch(tier, int(epoch), float(half_life_days), anchor.astimezone(UTC), bool(filling))


#: Every tier's live epochs, rows for :func:`epochs_from_rows`.
EPOCHS_SQL = f"SELECT {_EPOCH_COLUMNS} FROM fold_epochs ORDER BY tier, epoch"


def epochs_from_rows(rows: Sequence[Sequence[Any]]) -> dict[str, list[Epoch]]:
    """:data:`EPOCHS_SQL`'s rows as tier -> live epochs, oldest first."""
    out: dict[str, list[Epoch]] = {}
    for row in rows:
        e = _epoch(row)
        out.setdefault(e.tier, []).append(e)
    return out


async def read_epochs(conn: psycopg.AsyncConnection[Any]) -> dict[str, list[Epoch]]:
    """Every tier's live epochs, oldest first (a tier without any ranks by similarity)."""
    cur = await conn.execute(EPOCHS_SQL)
    return epochs_from_rows(await cur.fetchall())


async def lock_tier(conn: psycopg.AsyncConnection[Any], tier: str) -> None:
    """Hold the tier's fold lock exclusively until the transaction ends: no
    write of the tier is folding meanwhile, and none started before is left."""
    await conn.execute(f"SELECT pg_advisory_xact_lock({_LOCK_KEY.format('%s')})", (tier,))


async def folds_for_write(
    conn: psycopg.AsyncConnection[Any], memories: Sequence[MemoryInput]
) -> list[tuple[np.ndarray | None, int | None]]:
    """Each memory's folded vector and epoch (``(None, None)`` in a tier
    without a fold), in the caller's write transaction, which then holds the
    written tiers' fold locks shared until it ends."""
    tiers = sorted({m.tier for m in memories})
    # One row a tier, in the array's order: the locks are taken in name order.
    await conn.execute(
        f"SELECT pg_advisory_xact_lock_shared({_LOCK_KEY.format('t')}) FROM unnest(%s::text[]) AS t", (tiers,)
    )
    cur = await conn.execute(
        f"SELECT DISTINCT ON (tier) {_EPOCH_COLUMNS} FROM fold_epochs WHERE tier = ANY(%s) ORDER BY tier, epoch DESC",
        (tiers,),
    )
    newest = {e.tier: e for e in map(_epoch, await cur.fetchall())}
    out: list[tuple[np.ndarray | None, int | None]] = [(None, None)] * len(memories)
    for tier, epoch in newest.items():
        idx = [i for i, m in enumerate(memories) if m.tier == tier]
        chosen = [memories[i] for i in idx]
        folded = fold_vectors(
            np.array([m.embedding for m in chosen], dtype=np.float64),
            importance_weights([m.importance for m in chosen]),
            np.array([(m.created_at - epoch.anchor).total_seconds() for m in chosen]),
            epoch.rate,
        )
        for k, i in enumerate(idx):
            out[i] = (folded[k], epoch.epoch)
    return out


async def open_epoch(
    conn: psycopg.AsyncConnection[Any],
    tier: str,
    half_life_days: float,
    *,
    filling: bool,
    anchor: datetime | None = None,
    only_if_none: bool = False,
) -> Epoch:
    """Open a new epoch of ``tier`` anchored at ``anchor`` (default: the
    server's clock), in a transaction of its own holding the fold lock, so
    every write committed after it folds with it. ``only_if_none``: return the
    newest epoch instead if the tier has one (two processes starting at once)."""
    async with conn.transaction():
        await lock_tier(conn, tier)
        if only_if_none:
            cur = await conn.execute(
                f"SELECT {_EPOCH_COLUMNS} FROM fold_epochs WHERE tier = %s ORDER BY epoch DESC LIMIT 1", (tier,)
            )
            row = await cur.fetchone()
            if row is not None:
                return _epoch(row)
        cur = await conn.execute(
            f"INSERT INTO fold_epochs (tier, epoch, half_life_days, anchor, filling)"
            f" VALUES (%s, nextval('fold_epoch_seq'), %s, coalesce(%s, clock_timestamp()), %s)"
            f" RETURNING {_EPOCH_COLUMNS}",
            (tier, half_life_days, anchor, filling),
        )
        row = await cur.fetchone()
        assert row is not None
        return _epoch(row)


def _as_array(value: Any) -> np.ndarray:
    if hasattr(value, "to_numpy"):  # pgvector.Vector
        value = value.to_numpy()
    return np.asarray(value, dtype=np.float64)


async def move_rows(
    conn: psycopg.AsyncConnection[Any],
    epoch: Epoch,
    progress: Callable[[int], None] | None = None,
    batch: int = MOVE_BATCH,
) -> int:
    """Fold every row of the epoch's tier that is in another epoch (or none)
    with this one, a batch per transaction, walking the primary key once.
    Each batch's rows leave their old epoch's index and enter this one's in
    the same commit. A batch that deadlocks with a write (which locks its rows
    in its own order) is tried again. Returns the rows moved."""
    moved = 0
    last: tuple[str, str] = ("", "")
    while True:
        for attempt in range(1, DEADLOCK_RETRIES + 1):
            try:
                rows = await _move_batch(conn, epoch, last, batch)
                break
            except psycopg.errors.DeadlockDetected:
                if attempt == DEADLOCK_RETRIES:
                    raise
        if not rows:
            return moved
        moved += len(rows)
        last = (rows[-1][0], rows[-1][1])
        if progress is not None:
            progress(moved)


async def _move_batch(
    conn: psycopg.AsyncConnection[Any], epoch: Epoch, after: tuple[str, str], batch: int
) -> list[tuple[Any, ...]]:
    async with conn.transaction():
        cur = await conn.execute(
            "SELECT tenant, id, embedding, importance, created_at FROM memories"
            " WHERE (tenant, id) > (%s, %s) AND tier = %s AND fold_epoch IS DISTINCT FROM %s"
            " ORDER BY tenant, id LIMIT %s FOR UPDATE",
            (*after, epoch.tier, epoch.epoch, batch),
        )
        rows = await cur.fetchall()
        if not rows:
            return rows
        folded = fold_vectors(
            np.stack([_as_array(r[2]) for r in rows]),
            importance_weights([None if r[3] is None else float(r[3]) for r in rows]),
            np.array([(r[4] - epoch.anchor).total_seconds() for r in rows]),
            epoch.rate,
        )
        async with conn.cursor() as write:
            await write.executemany(
                "UPDATE memories SET folded = %s, fold_epoch = %s WHERE tenant = %s AND id = %s",
                [(folded[k], epoch.epoch, r[0], r[1]) for k, r in enumerate(rows)],
            )
    return rows


async def retire_older(conn: psycopg.AsyncConnection[Any], epoch: Epoch) -> list[int]:
    """After :func:`move_rows`: the tier's other epochs are gone and this one
    is complete. Returns the retired epoch numbers (their indexes are the
    caller's to drop)."""
    async with conn.transaction():
        await lock_tier(conn, epoch.tier)
        cur = await conn.execute(
            "DELETE FROM fold_epochs WHERE tier = %s AND epoch <> %s RETURNING epoch", (epoch.tier, epoch.epoch)
        )
        retired = sorted(int(r[0]) for r in await cur.fetchall())
        await conn.execute(
            "UPDATE fold_epochs SET filling = false WHERE tier = %s AND epoch = %s", (epoch.tier, epoch.epoch)
        )
    return retired


async def delete_epochs(conn: psycopg.AsyncConnection[Any], tier: str) -> list[int]:
    """The tier ranks by similarity again (its cosine index must exist):
    its epochs are deleted; rows keep their stale folded values, which no
    search reads and the next epoch overwrites."""
    async with conn.transaction():
        await lock_tier(conn, tier)
        cur = await conn.execute("DELETE FROM fold_epochs WHERE tier = %s RETURNING epoch", (tier,))
        return sorted(int(r[0]) for r in await cur.fetchall())
