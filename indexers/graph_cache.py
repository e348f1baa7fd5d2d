"""A tenant's graph in the service's memory, kept current by reading what changed.

The graph source (:mod:`indexers.graph`) reads the same relations and
mentions for most recalls of a tenant: walking the relations, then passing
the reached entities' PageRank on to the memories that mention them, was
nearly all of a graph recall's Postgres CPU, and finding the seeds (an exact
vector search over the tenant's entities) most of what was left. With
``graph.cacheRows`` above 0 each service process keeps the relations,
mentions and entities of the tenants it recalls and does all three itself,
by the statements' rules (:meth:`TenantGraph.seeds`: the seeds of
``indexers.graph._walk_sql``, compared with every entity as the statement
does below the entity tier's ``exactBelow``; :meth:`TenantGraph.walk`: the
relations it reads, in its order; :meth:`TenantGraph.shares`: the memories
and scores of ``indexers.graph._memories_sql`` without request filters).
Postgres still finds the candidates' rows that pass the lifecycle rules.

**Kept current.** Every walk first reads, in one round trip, what changed
in the tenant's relations, mentions and entities since the copy's cursor
(migrations 21 and 23: ``changed``, the id of the transaction that last
wrote a row, and the tombstones deleted rows leave), after reading a new
cursor: a snapshot taken before those reads, kept as its xmax and the
transactions it saw running. The next read asks for the rows written by
those transactions or from that xmax on: exactly what the snapshot did not
see, so a transaction still open then is read once it commits, and nothing
written before a recall began is missed by it (read-your-writes, across
processes). (The snapshot's xmin alone would also be safe, but it re-reads
everything written since the oldest transaction still open: under steady
writes, whose transactions last, every recall read thousands of rows again,
benchmarks/results/load-10000-s31.md.)
Deletions are read before rows, and merged first: a row read is the newest
word on its key.

**Nothing changed, no round trip of its own.** The cursor's statement also reads the
tenant's write generation in its snapshot (``tenant_generations``, which
every transaction that changes a tenant's graph bumps as it commits). The
same number, read later, means no change has committed since the copy's
snapshot, so the copy is current as it is, and the six reads of changes are
not needed. A recall without request filters walks a copy of a known
generation at once (:meth:`Refresh.assumed`) and reads the generation first
in its memory read's round trip: the same number, and the walk stands; any
other, and the changes are read and the copy walked again (the graph
source). It does so only while the copy's last read of the generation found
it unmoved (:meth:`Refresh.assumable`): a tenant written between recalls
would have every copy walked twice. Otherwise, and for a recall with request
filters, the generation is read first, alone (:meth:`Refresh.check`, one
statement without a scope: the counter says nothing of the tenant's data),
then the changes if it moved.

**Concurrent recalls.** A read is merged into the shared copy only when no
other read changed the copy while it was out (it was sent after every such
read came back, so its snapshot is newer than theirs); a recall whose read
raced another's walks the shared copy with its own changes laid over it
(:class:`Overlay`) and leaves the copy as it is, so an older read never
overwrites a newer one. A read that found nothing changed needs neither.

**Loaded off the recall path.** A tenant not kept yet is walked by
Postgres while one background read (:meth:`GraphCache.load`) brings its
relations and mentions whole; the recalls after it walk the copy. The first
read of a large tenant takes longer than a recall may (seconds for ~170k
rows on a busy machine): made inside a recall under its deadline it was
cancelled with the recall, every time, so no copy was ever kept and every
recall paid for the read again (benchmarks/results/load-10000-s31*.md).

**Bounded.** A tenant with more than ``graph.cacheRows`` relations +
mentions + entities (or a change bigger than that) is not kept: it is walked by
Postgres, and tried again after :data:`RETRY_S`. ``graph.cacheTotalRows``
bounds all tenants together, the least recently recalled dropped first, but
never one walked within :data:`EVICT_IDLE_S` (the tenant that would push it
out is walked by Postgres instead: :meth:`GraphCache.refresh`). A
tenant not read for :data:`STALE_S` is read whole again: tombstones are kept
twice as long (``indexers.postgres.store.TOMBSTONE_KEEP``, dropped by the
sweeper).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final

import numpy as np

from .postgres import Read
from .postgres.generations import GENERATION

__all__ = [
    "CHANGED_SQL",
    "CURSOR_SQL",
    "DROPPED_SQL",
    "ENTITIES_SQL",
    "FAILED_RETRY_S",
    "MENTIONED_SQL",
    "RETRY_S",
    "STALE_S",
    "UNENTITIED_SQL",
    "UNMENTIONED_SQL",
    "Delta",
    "Edge",
    "GraphCache",
    "Overlay",
    "Refresh",
    "Shares",
    "TenantGraph",
    "Walked",
    "best",
]

#: The cursor, a snapshot taken now: the first transaction id not yet
#: completed, and the transactions still running below it; and the tenant's
#: write generation in that snapshot (:mod:`.postgres.generations`).
CURSOR_SQL = (
    "SELECT pg_snapshot_xmax(s)::text, ARRAY(SELECT x::text FROM pg_snapshot_xip(s) AS x),"
    f" {GENERATION} FROM pg_current_snapshot() AS s"
)


def _unseen(columns: str, table: str) -> str:
    """The tenant's rows of ``table`` the cursor's snapshot did not see:
    written from ``%(since)s`` (its xmax) on, or by a transaction it saw
    running (``%(running)s``). Two index ranges joined, not one ``OR``:
    the generic plan of ``changed >= x OR changed = ANY(y)`` filters every
    row of the tenant (``EXPLAIN (GENERIC_PLAN)`` on relations), a read of
    the whole tenant on each recall once the statement is prepared."""
    return f"""
    SELECT {columns} FROM {table} WHERE tenant = %(tenant)s AND changed >= %(since)s::xid8
    UNION ALL
    SELECT {columns} FROM {table}
    WHERE tenant = %(tenant)s AND changed = ANY(%(running)s::xid8[]) AND changed < %(since)s::xid8
"""


#: A :data:`Rel` as read: id, then its fields.
_RELATION = """id, source_id, target_id, relation, weight, derived,
           extract(epoch FROM valid_from)::float8, extract(epoch FROM valid_to)::float8,
           extract(epoch FROM coalesce(valid_from, created_at))::float8"""
#: A mention as read: entity id, memory id, the memory's time (epoch seconds).
_MENTION = "entity_id, memory_id, extract(epoch FROM created_at)::float8"

#: The tenant's relations written since the cursor, at most ``%(limit)s``.
CHANGED_SQL = _unseen(_RELATION, "relations") + "    LIMIT %(limit)s\n"

#: The ids of the tenant's relations deleted since the cursor.
DROPPED_SQL = _unseen("relation_id", "relation_tombstones")

#: The tenant's mentions made since the cursor, at most ``%(limit)s``.
MENTIONED_SQL = _unseen(_MENTION, "mentions") + "    LIMIT %(limit)s\n"

#: The tenant's mentions deleted since the cursor: entity id, memory id.
UNMENTIONED_SQL = _unseen("entity_id, memory_id", "mention_tombstones")

#: An entity as read: id, normalised name, the model that embedded its name, the vector.
_ENTITY = "id, name_norm, model, embedding"

#: The tenant's entities written since the cursor, at most ``%(limit)s``.
ENTITIES_SQL = _unseen(_ENTITY, "entities") + "    LIMIT %(limit)s\n"

#: The ids of the tenant's entities deleted since the cursor.
UNENTITIED_SQL = _unseen("entity_id", "entity_tombstones")

#: Whether the tenant's relations, mentions and entities together are at
#: most ``%(limit)s`` (each counted up to one past it, from its index alone).
_FITS = """(
    (SELECT count(*) FROM (SELECT 1 FROM relations WHERE tenant = %(tenant)s LIMIT %(limit)s + 1) r)
    + (SELECT count(*) FROM (SELECT 1 FROM mentions WHERE tenant = %(tenant)s LIMIT %(limit)s + 1) m)
    + (SELECT count(*) FROM (SELECT 1 FROM entities WHERE tenant = %(tenant)s LIMIT %(limit)s + 1) e)
    <= %(limit)s)"""


def _whole(columns: str, table: str, nulls: int) -> str:
    """For a tenant's first read: every row of ``table`` when the tenant fits
    (:data:`_FITS`), else one row of ``nulls`` NULLs."""
    return f"""
    SELECT {columns} FROM {table} WHERE tenant = %(tenant)s AND {_FITS}
    UNION ALL SELECT {", ".join(["NULL"] * nulls)} WHERE NOT {_FITS}
"""


_WHOLE_RELATIONS_SQL = _whole(_RELATION, "relations", 9)
_WHOLE_MENTIONS_SQL = _whole(_MENTION, "mentions", 3)
_WHOLE_ENTITIES_SQL = _whole(_ENTITY, "entities", 4)

#: How long a tenant too big for the cache is walked by Postgres before it is tried again.
RETRY_S = 300.0
#: How long a tenant whose first read failed is walked by Postgres before it is tried again.
FAILED_RETRY_S = 30.0
#: A tenant's copy not brought up to date for this long is read whole again.
STALE_S = 1800.0
#: A tenant not kept is read whole only if its copy fits beside the others,
#: or the copies it would push out were last walked at least this long ago
#: (seconds). When more tenants are recalled in turn than the cache holds,
#: dropping the least recently walked copy to read the next one drops every
#: copy before its next walk, and each recall pays a Postgres walk beside
#: another tenant's whole read (benchmarks/results/tenants-graph-admit-*.md).
#: A copy kept instead serves its tenant's recalls; the tenant left out is
#: walked by Postgres, as it would be anyway.
EVICT_IDLE_S = 60.0

#: A cursor: a snapshot's xmax and the transactions it saw running (as text).
Cursor = tuple[str, tuple[str, ...]]
#: Before the first read: everything unseen.
_START: Cursor = ("0", ())

#: A relation: source id, target id, relation, weight (``real`` as read),
#: derived, valid_from and valid_to (epoch seconds, or None), and its time
#: (epoch seconds of ``valid_from``, else ``created_at``).
Rel = tuple[int, int, str, float, bool, float | None, float | None, float]
_SRC: Final = 0
_DST: Final = 1
_REL: Final = 2
_W: Final = 3
_DERIVED: Final = 4
_FROM: Final = 5
_TO: Final = 6
_AT: Final = 7

#: A walked relation as :class:`indexers.graph.GraphSource` takes it: id,
#: source, target, relation, weight, time, source name, target name (None:
#: not read here), derived.
Edge = tuple[int, int, int, str, float, float, str | None, str | None, bool]


#: An entity: its normalised name, the model that embedded its name, and
#: its vector scaled to unit length (float32; None for a zero vector, which
#: no vector is similar to).
_Entity = tuple[str, str, "np.ndarray | None"]


def _entity(row: Sequence[Any]) -> _Entity:
    """An entity as :data:`ENTITIES_SQL` reads it (pgvector's loader gives a
    ``Vector``; an array is taken as it is)."""
    value = row[3]
    vec = np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)
    norm = float(np.linalg.norm(vec))
    return (row[1], row[2], vec / norm if norm > 0 else None)


def _same_vector(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is b
    return bool(np.array_equal(a, b))


def _valid(rel: Rel, now: float) -> bool:
    """As the walk statement's ``valid``: within its window now, and a derived
    relation that no memory supports any more (weight 0) is not walked."""
    return (
        (rel[_FROM] is None or rel[_FROM] <= now)
        and (rel[_TO] is None or rel[_TO] > now)
        and (rel[_W] > 0 or not rel[_DERIVED])
    )


def _newest_first(mentioned: Mapping[str, float]) -> list[str]:
    """Memory ids by time, newest first, ties by id descending (the mentions index's order)."""
    return sorted(mentioned, key=lambda m: (mentioned[m], m), reverse=True)


#: An entity of more mentions than this has them kept in order (:attr:`TenantGraph.ordered`);
#: fewer are sorted when read (a few hundred take tens of microseconds).
ORDERED_ABOVE: Final = 256


def _discard(line: list[tuple[float, str]], item: tuple[float, str]) -> None:
    """Remove ``item`` from the sorted ``line`` if it is there."""
    i = bisect.bisect_left(line, item)
    if i < len(line) and line[i] == item:
        del line[i]


class _Matrix:
    """One model's entity vectors, a row each, and their ids, kept in step
    with the copy's entities: a new entity's row is appended (the arrays
    grow by doubling), a changed vector written over its row, and a deleted
    (or re-embedded by another model) entity's row marked dead (id -1), so
    a recall after a write that made entities does not stack every vector
    again. Dead rows are left out of :meth:`similarities`."""

    __slots__ = ("dead", "ids", "rows", "size", "vectors")

    def __init__(self, entities: Iterable[tuple[int, np.ndarray]]) -> None:
        pairs = list(entities)
        self.size = len(pairs)
        self.dead = 0
        #: Entity id -> its row.
        self.rows: dict[int, int] = {eid: i for i, (eid, _) in enumerate(pairs)}
        self.ids = np.fromiter((eid for eid, _ in pairs), dtype=np.int64, count=len(pairs))
        self.vectors = np.stack([v for _, v in pairs]) if pairs else np.zeros((0, 0), dtype=np.float32)

    def similarities(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The live entities' ids and their vectors' products with ``query``."""
        if not self.size:
            return self.ids[:0], np.zeros(0, dtype=np.float32)
        ids = self.ids[: self.size]
        sims = self.vectors[: self.size] @ query
        if self.dead:
            alive = ids >= 0
            return ids[alive], sims[alive]
        return ids, sims

    def put(self, eid: int, vector: np.ndarray) -> bool:
        """Set ``eid``'s vector; ``False`` (nothing changed) if its length is not the matrix's."""
        if self.size and vector.shape != self.vectors.shape[1:]:
            return False
        row = self.rows.get(eid)
        if row is not None:
            self.vectors[row] = vector
            return True
        if self.size == len(self.ids):
            capacity = max(2 * self.size, 16)
            ids = np.full(capacity, -1, dtype=np.int64)
            vectors = np.zeros((capacity, len(vector)), dtype=np.float32)
            if self.size:
                ids[: self.size] = self.ids
                vectors[: self.size] = self.vectors
            self.ids, self.vectors = ids, vectors
        self.ids[self.size] = eid
        self.vectors[self.size] = vector
        self.rows[eid] = self.size
        self.size += 1
        return True

    def remove(self, eid: int) -> None:
        row = self.rows.pop(eid, None)
        if row is not None:
            self.ids[row] = -1
            self.dead += 1

    def stale(self) -> bool:
        """More than half the rows dead: cheaper made again."""
        return self.dead * 2 > self.size


class Delta:
    """One read's results: the relations, mentions and entities written and
    deleted since its cursor, and the cursor for the next read."""

    __slots__ = ("cursor", "dropped", "entities", "generation", "mentioned", "rows", "unentitied", "unmentioned")

    def __init__(
        self,
        cursor: Cursor,
        rows: Sequence[Sequence[Any]],
        mentioned: Sequence[Sequence[Any]],
        dropped: Sequence[int] = (),
        unmentioned: Sequence[Sequence[Any]] = (),
        entities: Sequence[Sequence[Any]] = (),
        unentitied: Sequence[int] = (),
        generation: int | None = None,
    ) -> None:
        self.cursor = cursor
        #: The tenant's write generation in the cursor's snapshot (None: not read).
        self.generation = generation
        self.rows = rows
        self.mentioned = mentioned
        self.dropped = dropped
        self.unmentioned = unmentioned
        self.entities = entities
        self.unentitied = unentitied

    def __len__(self) -> int:
        return (
            len(self.rows)
            + len(self.mentioned)
            + len(self.dropped)
            + len(self.unmentioned)
            + len(self.entities)
            + len(self.unentitied)
        )


class Overlay:
    """One read's changes laid over the shared copy, for its own walk only."""

    __slots__ = ("dropped", "entities", "incident", "mentions", "rels")

    def __init__(self, graph: TenantGraph, delta: Delta) -> None:
        #: Entity id -> its row as this read has it (None: deleted), for the entities that changed.
        self.entities: dict[int, _Entity | None] = dict.fromkeys(delta.unentitied)
        self.entities.update((row[0], _entity(row)) for row in delta.entities)
        self.dropped = set(delta.dropped)
        self.rels: dict[int, Rel] = {row[0]: tuple(row[1:]) for row in delta.rows}
        # The entities whose relations changed, with the relations the shared copy lacks.
        self.incident: dict[int, list[int]] = {}
        for rid, rel in self.rels.items():
            new = rid not in graph.rels
            for end in (rel[_SRC], rel[_DST]):
                extra = self.incident.setdefault(end, [])
                if new:
                    extra.append(rid)
        for rid in self.dropped:
            old = graph.rels.get(rid)
            if old is not None:
                self.incident.setdefault(old[_SRC], [])
                self.incident.setdefault(old[_DST], [])
        # Entity -> its mentions as this read has them, for the entities whose mentions changed.
        self.mentions: dict[int, dict[str, float]] = {}
        for eid, mid in delta.unmentioned:
            self.mentions.setdefault(eid, dict(graph.mentions.get(eid, {}))).pop(mid, None)
        for eid, mid, at in delta.mentioned:
            self.mentions.setdefault(eid, dict(graph.mentions.get(eid, {})))[mid] = at


class _Top:
    """An entity's walked relations: their ids and ends as one ``(3, n)``
    int64 array (id, source, target), their weights (float64, as read),
    whether each is derived, and the entities at their other ends."""

    __slots__ = ("derived", "ends", "others", "weights")

    def __init__(self, ends: np.ndarray, weights: np.ndarray, derived: np.ndarray, others: list[int]) -> None:
        self.ends = ends
        self.weights = weights
        self.derived = derived
        self.others = others

    @classmethod
    def of(cls, entity: int, walked: Sequence[tuple[int, Rel]]) -> _Top:
        ends = np.array(
            [[rid for rid, _ in walked], [rel[_SRC] for _, rel in walked], [rel[_DST] for _, rel in walked]],
            dtype=np.int64,
        )
        weights = np.array([rel[_W] for _, rel in walked], dtype=np.float64)
        derived = np.array([bool(rel[_DERIVED]) for _, rel in walked], dtype=bool)
        others = [rel[_DST] if rel[_SRC] == entity else rel[_SRC] for _, rel in walked]
        return cls(ends, weights, derived, others)


class Walked:
    """The relations a walk read, heaviest first: their ends and weights as
    arrays (what PageRank takes), whether each is derived, and the relations
    as :data:`Edge` rows on demand (:meth:`edges`): from ``rels`` (by id)
    when walked in this process, or the rows as the walk statement read them."""

    __slots__ = ("derived", "ids", "rels", "rows", "sources", "targets", "weights")

    def __init__(
        self,
        sources: np.ndarray,
        targets: np.ndarray,
        weights: np.ndarray,
        ids: np.ndarray,
        derived: np.ndarray,
        rels: Mapping[int, Rel],
        rows: Sequence[Edge] | None = None,
    ) -> None:
        self.sources = sources
        self.targets = targets
        self.weights = weights
        self.ids = ids
        self.derived = derived
        self.rels = rels
        self.rows = rows

    @classmethod
    def none(cls) -> Walked:
        """No relation walked."""
        return cls(_NO_INDEXES, _NO_INDEXES, _NO_SCORES, _NO_INDEXES, _NO_FLAGS, {})

    @classmethod
    def of_rows(cls, rows: Sequence[Edge]) -> Walked:
        """The relations the walk statement read, as it read them (in its order)."""
        if not rows:
            return cls.none()
        ids, sources, targets, weights, derived = (
            np.fromiter((row[i] for row in rows), dtype=dtype, count=len(rows))
            for i, dtype in ((0, np.int64), (1, np.int64), (2, np.int64), (4, np.float64), (8, bool))
        )
        return cls(sources, targets, weights, ids, derived, {}, rows)

    def __len__(self) -> int:
        return len(self.ids)

    def edges(self, *, stated: bool = False) -> list[Edge]:
        """The relations as :data:`Edge` rows in order (walked in this process:
        without names, which were not read); with ``stated``, only those a
        client wrote (not derived)."""
        which = np.flatnonzero(~self.derived).tolist() if stated else range(len(self.ids))
        if self.rows is not None:
            return [self.rows[i] for i in which]
        rels, ids = self.rels, self.ids.tolist()
        rows: list[Edge] = []
        for i in which:
            rid = ids[i]
            rel = rels[rid]
            rows.append((rid, rel[_SRC], rel[_DST], rel[_REL], rel[_W], rel[_AT], None, None, rel[_DERIVED]))
        return rows


class TenantGraph:
    """One tenant's relations, mentions and entities, each entity's incident
    relations, and the cursor they are current to."""

    __slots__ = (
        "_models",
        "applied",
        "cursor",
        "entities",
        "generation",
        "incident",
        "memory_ids",
        "memory_index",
        "mentioned",
        "mentions",
        "moved",
        "named",
        "newest",
        "order",
        "ordered",
        "refreshed",
        "rels",
        "tops",
    )

    def __init__(self) -> None:
        self.rels: dict[int, Rel] = {}
        #: Entity -> its relations' ids, both directions (a relation to itself twice, as the statement lists it).
        self.incident: dict[int, list[int]] = {}
        #: Entity -> :attr:`incident` heaviest first (ties by id), made when first walked, then kept
        #: in step by :meth:`apply` (dropped when one of its relations is deleted).
        self.order: dict[int, list[int]] = {}
        #: Entity -> memory id -> the memory's time: every memory that mentions it.
        self.mentions: dict[int, dict[str, float]] = {}
        #: Mentions held: the sum of :attr:`mentions`' sizes.
        self.mentioned = 0
        #: Entity -> (n, the n newest of :attr:`mentions` newest first as indexes into
        #: :attr:`memory_ids`, their count); made when first read after a change.
        self.newest: dict[int, tuple[int, np.ndarray, int]] = {}
        #: Entity -> its mentions as (time, memory id), oldest first, for the entities of more than
        #: :data:`ORDERED_ABOVE` mentions that :meth:`shares` has read: kept in step by :meth:`apply`,
        #: so a write that mentions such an entity does not sort all its mentions again.
        self.ordered: dict[int, list[tuple[float, str]]] = {}
        #: Entity -> (fanout, its walked relations as a :class:`_Top`), kept while no
        #: relation it looked at has a validity window (the lists cannot age).
        self.tops: dict[int, tuple[int, _Top]] = {}
        #: Every memory id met, and its index (for scoring with numpy).
        self.memory_ids: list[str] = []
        self.memory_index: dict[str, int] = {}
        #: Entity id -> its name, model and unit vector.
        self.entities: dict[int, _Entity] = {}
        #: Normalised name -> entity id (unique in a tenant).
        self.named: dict[str, int] = {}
        #: Model -> the ids and unit vectors (one row each) of the entities it embedded;
        #: made when first searched, then kept in step with :attr:`entities` by :meth:`apply`.
        self._models: dict[str, _Matrix] = {}
        self.cursor: Cursor = _START
        #: The tenant's write generation in the cursor's snapshot (None: unknown,
        #: so every walk reads what changed).
        self.generation: int | None = None
        #: Whether the last read of the generation found it moved past the
        #: copy's: a tenant written between recalls (an agent writing each
        #: turn) would find a copy walked on assumption behind every time.
        self.moved = False
        #: How many reads changed the copy: a read sent after the last of them is newer than all of them.
        self.applied = 0
        self.refreshed = 0.0

    def __len__(self) -> int:
        """Relations, mentions and entities held."""
        return len(self.rels) + self.mentioned + len(self.entities)

    @classmethod
    def of(cls, delta: Delta) -> TenantGraph:
        """A new copy holding ``delta`` (a tenant's whole read); touches nothing
        shared, so it may be built on a worker thread."""
        graph = cls()
        graph.apply(delta)
        return graph

    def apply(self, delta: Delta) -> None:
        """Merge one read. Deletions first: a row read is the newest word on its key
        (a memory rewritten in one transaction deletes its mentions and makes them again)."""
        rels, incident, order, tops = self.rels, self.incident, self.order, self.tops

        def weighed(rid: int) -> tuple[float, int]:
            return (-rels[rid][_W], rid)

        changed = False
        for rid in delta.dropped:
            old = rels.pop(rid, None)
            if old is None:
                continue
            changed = True
            for end in (old[_SRC], old[_DST]):
                ids = incident.get(end)
                if ids is not None:
                    ids.remove(rid)
                    if not ids:
                        del incident[end]
                order.pop(end, None)
                tops.pop(end, None)
        for row in delta.rows:
            rid = row[0]
            rel: Rel = tuple(row[1:])
            old = rels.get(rid)
            if old == rel:
                continue
            changed = True
            ends = (rel[_SRC], rel[_DST])
            # A relation's ends never change: an update only re-orders them, and
            # the ends' orders made are kept (moved by bisection, not sorted again).
            moved = old is None or old[_W] != rel[_W]
            if old is not None and moved:
                for end in ends:
                    line = order.get(end)
                    if line is not None:
                        del line[bisect.bisect_left(line, (-old[_W], rid), key=weighed)]
            rels[rid] = rel
            if old is None:
                incident.setdefault(rel[_SRC], []).append(rid)
                incident.setdefault(rel[_DST], []).append(rid)
            for end in ends:
                line = order.get(end)
                if line is not None and moved:
                    bisect.insort(line, rid, key=weighed)
                tops.pop(end, None)
        mentions, newest, ordered = self.mentions, self.newest, self.ordered
        for eid, mid in delta.unmentioned:
            held = mentions.get(eid)
            if held is None:
                continue
            old_at = held.pop(mid, None)
            if old_at is not None:
                changed = True
                self.mentioned -= 1
                newest.pop(eid, None)
                timeline = ordered.get(eid)
                if timeline is not None:
                    _discard(timeline, (old_at, mid))
                if not held:
                    del mentions[eid]
                    ordered.pop(eid, None)
        for eid, mid, at in delta.mentioned:
            held = mentions.setdefault(eid, {})
            old_at = held.get(mid)
            if old_at != at:
                changed = True
                self.mentioned += old_at is None
                held[mid] = at
                newest.pop(eid, None)
                timeline = ordered.get(eid)
                if timeline is not None:
                    if old_at is not None:
                        _discard(timeline, (old_at, mid))
                    bisect.insort(timeline, (at, mid))
        if self._apply_entities(delta):
            changed = True
        self.cursor = delta.cursor
        self.generation = delta.generation
        if changed:
            self.applied += 1
        self.refreshed = time.monotonic()

    def _apply_entities(self, delta: Delta) -> bool:
        """Merge one read's entities (deletions first); whether any changed.
        The models' matrices already made are changed in place (a model's
        is made again once more than half its rows are dead)."""
        entities, named, models = self.entities, self.named, self._models
        changed = False
        for eid in delta.unentitied:
            old = entities.pop(eid, None)
            if old is not None:
                changed = True
                if named.get(old[0]) == eid:
                    del named[old[0]]
                if old[1] in models:
                    models[old[1]].remove(eid)
        for row in delta.entities:
            eid, new = row[0], _entity(row)
            old = entities.get(eid)
            if old is not None and old[:2] == new[:2] and _same_vector(old[2], new[2]):
                continue
            changed = True
            if old is not None:
                if named.get(old[0]) == eid:
                    del named[old[0]]
                if old[1] in models and (old[1] != new[1] or new[2] is None):
                    models[old[1]].remove(eid)
            entities[eid] = new
            named[new[0]] = eid
            if new[2] is not None and new[1] in models and not models[new[1]].put(eid, new[2]):
                del models[new[1]]
        for model in [m for m, matrix in models.items() if matrix.stale()]:
            del models[model]
        return changed

    def _matrix(self, model: str) -> _Matrix:
        """The unit vectors of the entities ``model`` embedded, with their ids."""
        kept = self._models.get(model)
        if kept is None:
            kept = self._models[model] = _Matrix(
                (eid, e[2]) for eid, e in self.entities.items() if e[1] == model and e[2] is not None
            )
        return kept

    def seeds(
        self,
        names: Iterable[str],
        vector: Any | None,
        *,
        model: str | None,
        limit: int,
        min_similarity: float,
        overlay: Overlay | None = None,
    ) -> dict[int, float]:
        """The walk's seeds, entity id -> weight, in id order, as the seeds
        statement finds them (``indexers.graph._seeds_cte``): the entities
        named by ``names`` (normalised) weigh 1; with a ``vector``, the
        ``limit`` entities ``model`` embedded most cosine-similar to it (ties
        by id), those at least ``min_similarity`` similar weighing their
        similarity; an entity found both ways weighs the larger. Compared
        with every entity, as the statement does below the entity tier's
        ``exactBelow`` (above it the statement walks an HNSW index, which
        may miss some); similarities agree with Postgres' to float32
        rounding."""
        own = overlay.entities if overlay is not None else {}
        renamed = {e[0]: eid for eid, e in own.items() if e is not None}
        seeds: dict[int, float] = {}
        for name in names:
            eid = renamed.get(name)
            if eid is None:
                eid = self.named.get(name)
                if eid is None or eid in own:
                    continue
            seeds[eid] = 1.0
        if vector is not None and limit > 0 and model is not None:
            query = np.asarray(vector, dtype=np.float32)
            norm = float(np.linalg.norm(query))
            if norm > 0:
                query = query / norm
                ids, sims = self._matrix(model).similarities(query)
                if own:
                    keep = ~np.isin(ids, np.fromiter(own, dtype=np.int64, count=len(own)))
                    extra = [
                        (eid, e[2]) for eid, e in own.items() if e is not None and e[1] == model and e[2] is not None
                    ]
                    ids = np.concatenate([ids[keep], np.fromiter((eid for eid, _ in extra), np.int64, len(extra))])
                    sims = np.concatenate([sims[keep], np.asarray([v @ query for _, v in extra], dtype=np.float32)])
                # Within [-1, 1], as pgvector keeps a cosine similarity.
                sims = np.clip(sims, -1.0, 1.0)
                n = len(ids)
                # Every entity scoring at least the limit-th best, then the best by (-similarity, id).
                which = np.flatnonzero(sims >= np.partition(sims, n - limit)[n - limit]) if limit < n else np.arange(n)
                nearest = sorted(zip((-sims[which]).tolist(), ids[which].tolist(), strict=True))[:limit]
                for negative, eid in nearest:
                    if -negative >= min_similarity and seeds.get(eid, -1.0) < -negative:
                        seeds[eid] = -negative
        return dict(sorted(seeds.items()))

    def _sorted(self, entity: int, overlay: Overlay | None) -> list[int]:
        if overlay is None or entity not in overlay.incident:
            ids = self.order.get(entity)
            if ids is None:
                rels = self.rels
                ids = self.order[entity] = sorted(self.incident.get(entity, ()), key=lambda r: (-rels[r][_W], r))
            return ids
        ov = overlay.rels
        ids = [r for r in (*self.incident.get(entity, ()), *overlay.incident[entity]) if r not in overlay.dropped]
        ids.sort(key=lambda r: (-(ov.get(r) or self.rels[r])[_W], r))
        return ids

    def _top(self, entity: int, fanout: int, now: float, overlay: Overlay | None) -> _Top:
        """``entity``'s ``fanout`` heaviest relations valid at ``now``: their
        ids, ends and weights, and the entities at their other ends."""
        cached = overlay is None or entity not in overlay.incident
        if cached:
            kept = self.tops.get(entity)
            if kept is not None and kept[0] == fanout:
                return kept[1]
        own = overlay.rels if overlay is not None else {}
        rels = self.rels
        walked: list[tuple[int, Rel]] = []
        ageless = True
        for rid in self._sorted(entity, overlay):
            rel = own.get(rid) or rels[rid]
            if rel[_FROM] is not None or rel[_TO] is not None:
                ageless = False
            if not _valid(rel, now):
                continue
            walked.append((rid, rel))
            if len(walked) == fanout:
                break
        top = _Top.of(entity, walked)
        if cached and ageless:
            self.tops[entity] = (fanout, top)
        return top

    def walk(
        self,
        seeds: Iterable[int],
        *,
        hops: int,
        fanout: int,
        max_edges: int,
        now: float,
        overlay: Overlay | None = None,
    ) -> list[Edge]:
        """:meth:`walked`'s relations as :data:`Edge` rows, heaviest first."""
        return self.walked(seeds, hops=hops, fanout=fanout, max_edges=max_edges, now=now, overlay=overlay).edges()

    def walked(
        self,
        seeds: Iterable[int],
        *,
        hops: int,
        fanout: int,
        max_edges: int,
        now: float,
        overlay: Overlay | None = None,
    ) -> Walked:
        """The relations the walk statement reads (its bounded form,
        ``graph.fanout`` > 0), heaviest first, ties by id, at most
        ``max_edges``: from the seeds, each entity short of ``hops`` is
        walked through its ``fanout`` heaviest relations valid at ``now``
        (epoch seconds), and the relations walked are those read; with
        ``hops`` 0 the seeds' own among themselves."""
        seeds = set(seeds)
        seen = set(seeds)
        frontier: Iterable[int] = seeds
        tops: list[_Top] = []
        for _ in range(max(hops, 1)):
            # Each hop walks every entity reached first by the one before (the
            # relations walked are a union: the order entities are walked in
            # does not matter).
            reached: set[int] = set()
            for entity in frontier:
                top = self._top(entity, fanout, now, overlay)
                tops.append(top)
                reached.update(top.others)
            frontier = reached - seen
            if not frontier:
                break
            seen |= frontier
        if not tops:
            return Walked.none()
        ends = np.concatenate([t.ends for t in tops], axis=1)
        weights = np.concatenate([t.weights for t in tops])
        derived = np.concatenate([t.derived for t in tops])
        # Each relation once (walked from both its ends, it is in two tops).
        ids, first = np.unique(ends[0], return_index=True)
        ends, weights, derived = ends[:, first], weights[first], derived[first]
        if hops == 0:
            among = np.fromiter(seeds, dtype=np.int64, count=len(seeds))
            keep = np.isin(ends[1], among) & np.isin(ends[2], among)
            ids, ends, weights, derived = ids[keep], ends[:, keep], weights[keep], derived[keep]
        # Heaviest first, ties by id (ids are unique: nothing further is compared).
        order = np.lexsort((ids, -weights))[:max_edges]
        rels: Mapping[int, Rel] = self.rels
        if overlay is not None:
            own = overlay.rels
            rels = {rid: own.get(rid) or self.rels[rid] for rid in ids[order].tolist()}
        return Walked(ends[1, order], ends[2, order], weights[order], ids[order], derived[order], rels)

    def _index(self, mids: Iterable[str]) -> np.ndarray:
        index, ids = self.memory_index, self.memory_ids
        out = []
        for mid in mids:
            i = index.get(mid)
            if i is None:
                i = index[mid] = len(ids)
                ids.append(mid)
            out.append(i)
        return np.asarray(out, dtype=np.int64)

    def shares(self, ppr: Mapping[int, float], per_entity: int, overlay: Overlay | None = None) -> Shares:
        """The memories the entities ``ppr`` pass their PageRank to, with
        their scores, as the memory statement without request filters scores
        them (``indexers.graph._memories_sql``): each entity's score split
        evenly over every memory that mentions it, of which its
        ``per_entity`` newest receive their share; a memory's shares summed
        in entity id order (so ties are exact, as in the statement)."""
        own = overlay.mentions if overlay is not None else {}
        parts: list[np.ndarray] = []
        # Each entity's share of its score and how many memories take it, repeated in one call.
        shares: list[float] = []
        counts: list[int] = []
        for eid in sorted(ppr):
            mentioned = own.get(eid)
            if mentioned is not None:
                if not mentioned:
                    continue
                ids, degree = self._index(_newest_first(mentioned)[:per_entity]), len(mentioned)
            else:
                kept = self.newest.get(eid)
                if kept is None or kept[0] != per_entity:
                    held = self.mentions.get(eid)
                    if not held:
                        continue
                    if len(held) > ORDERED_ABOVE:
                        line = self.ordered.get(eid)
                        if line is None:
                            line = self.ordered[eid] = sorted((at, mid) for mid, at in held.items())
                        top = [mid for _, mid in itertools.islice(reversed(line), per_entity)]
                    else:
                        top = _newest_first(held)[:per_entity]
                    kept = self.newest[eid] = (per_entity, self._index(top), len(held))
                ids, degree = kept[1], kept[2]
            parts.append(ids)
            shares.append(ppr[eid] / degree)
            counts.append(len(ids))
        if not parts:
            return Shares(self.memory_ids, _NO_INDEXES, _NO_SCORES)
        at = np.concatenate(parts)
        # bincount adds in input order: each memory's shares in entity id order.
        sums = np.bincount(at, weights=np.repeat(np.asarray(shares, dtype=np.float64), counts))
        hit = np.zeros(len(sums), dtype=bool)
        hit[at] = True
        which = np.flatnonzero(hit)
        return Shares(self.memory_ids, which, sums[which])


_NO_INDEXES: Final = np.zeros(0, dtype=np.int64)
_NO_SCORES: Final = np.zeros(0, dtype=np.float64)
_NO_FLAGS: Final = np.zeros(0, dtype=bool)


class Shares:
    """The memories :meth:`TenantGraph.shares` scored: their indexes into
    ``names`` (the copy's memory ids, which only grow) and their scores, kept
    as arrays until :func:`best` picks the few a recall reads."""

    __slots__ = ("indexes", "names", "scores")

    def __init__(self, names: Sequence[str], indexes: np.ndarray, scores: np.ndarray) -> None:
        self.names = names
        self.indexes = indexes
        self.scores = scores

    def __len__(self) -> int:
        return len(self.indexes)

    def as_dict(self) -> dict[str, float]:
        """Memory id -> score, for every memory scored."""
        names = self.names
        return {names[i]: s for i, s in zip(self.indexes.tolist(), self.scores.tolist(), strict=True)}


def best(scores: Mapping[str, float] | Shares, k: int) -> list[tuple[str, float]]:
    """The ``k`` best of ``scores`` (more on a tie at the last place), best
    first, ties by id; all of them, sorted, when ``k`` reaches their number."""
    if isinstance(scores, Shares):
        values, n = scores.scores, len(scores)
        # The k-th largest score, as heapq.nlargest(k, ...)[-1] finds it.
        which = np.flatnonzero(values >= np.partition(values, n - k)[n - k]) if k < n else np.arange(n)
        names = scores.names
        chosen = [(names[i], v) for i, v in zip(scores.indexes[which].tolist(), values[which].tolist(), strict=True)]
    elif k < len(scores):
        floor = heapq.nlargest(k, scores.values())[-1]
        chosen = [(mid, v) for mid, v in scores.items() if v >= floor]
    else:
        chosen = list(scores.items())
    chosen.sort(key=lambda item: (-item[1], item[0]))
    return chosen


class Refresh:
    """One walk's read of what changed: for a kept copy of a known generation,
    first the generation (:meth:`check`, then :meth:`unchanged`; or
    :meth:`assumed`, the generation read later); then,
    unless that showed nothing changed, the statements to send (:meth:`reads`,
    cursor first) and, once they are back, the copy to walk (:meth:`take`)."""

    __slots__ = ("_applied", "_cache", "_checked", "_generation", "_graph", "_since", "_tenant")

    def __init__(self, cache: GraphCache, tenant: str, graph: TenantGraph | None) -> None:
        self._cache = cache
        self._tenant = tenant
        self._graph = graph
        self._since = graph.cursor if graph is not None else _START
        self._applied = graph.applied if graph is not None else 0
        self._generation = graph.generation if graph is not None else None
        self._checked = 0.0

    def check(self) -> bool:
        """Whether to read the tenant's generation first (the copy's is known);
        to be called just before it is read."""
        self._checked = time.monotonic()
        return self._generation is not None

    def unchanged(self, generation: int) -> tuple[TenantGraph, None] | None:
        """The copy to walk, as it is, when ``generation``, read after
        :meth:`check`, is the copy's: nothing committed since its snapshot (a
        copy changed meanwhile by another read is newer still). None: read
        what changed. Either way the copy records whether it moved
        (:meth:`assumable`)."""
        graph = self._graph
        if graph is None:
            return None
        graph.moved = generation != self._generation
        if graph.moved:
            return None
        # Current as of the check: its tombstones are not yet old enough to be dropped.
        graph.refreshed = max(graph.refreshed, self._checked)
        return graph, None

    def assumable(self) -> bool:
        """Whether to walk the copy before its generation is read
        (:meth:`assumed`): it is known, and its last read found it unmoved.
        A tenant written between recalls has its generation read first
        again, until a read finds it unmoved."""
        return self._generation is not None and self._graph is not None and not self._graph.moved

    def assumed(self) -> tuple[TenantGraph, None]:
        """The copy to walk, as it is, before its generation is read: to be
        confirmed by :meth:`unchanged` with a generation read after
        :meth:`check` (in the walk's later round trip), else walked again."""
        assert self._graph is not None, "assumed only after check() said the copy's generation is known"
        return self._graph, None

    def reads(self) -> list[Read]:
        """The cursor, then the deletions (a tenant not kept yet has none to
        read), then the rows: each statement's snapshot is newer than the one
        before, so the rows read are the newest word on their keys."""
        since, running = self._since
        params = {"tenant": self._tenant, "since": since, "running": list(running), "limit": self._cache.limit + 1}
        if self._graph is None:
            # The whole tenant, if it fits: counted first in each statement
            # (index entries only, up to the limit), so a tenant too big costs
            # no rows read; it answers one row of NULLs instead.
            fits = {**params, "limit": self._cache.limit}
            return [
                Read(CURSOR_SQL, {"tenant": self._tenant}),
                Read(_WHOLE_RELATIONS_SQL, fits),
                Read(_WHOLE_MENTIONS_SQL, fits),
                Read(_WHOLE_ENTITIES_SQL, fits),
            ]
        return [
            Read(CURSOR_SQL, {"tenant": self._tenant}),
            Read(DROPPED_SQL, params),
            Read(UNMENTIONED_SQL, params),
            Read(UNENTITIED_SQL, params),
            Read(CHANGED_SQL, params),
            Read(MENTIONED_SQL, params),
            Read(ENTITIES_SQL, params),
        ]

    @property
    def whole(self) -> bool:
        """Whether this is a tenant's first read (everything it has): for
        :meth:`GraphCache.load`, not a recall's round trip."""
        return self._graph is None

    def read(self, results: Sequence[Sequence[Any]]) -> Delta | None:
        """The changes the results of :meth:`reads` hold; None when the tenant
        (or this change) is too big to keep (then walked in Postgres for
        :data:`RETRY_S`)."""
        ((xmax, running, generation),), *rest = results
        cursor = (xmax, tuple(running))
        limit = self._cache.limit
        if self._graph is not None:
            dropped, unmentioned, unentitied, rows, mentioned, entities = rest
            delta = Delta(
                cursor,
                rows,
                mentioned,
                [row[0] for row in dropped],
                unmentioned,
                entities,
                [row[0] for row in unentitied],
                generation,
            )
            too_big = len(rows) > limit or len(mentioned) > limit or len(entities) > limit
        else:
            rows, mentioned, entities = rest
            delta = Delta(cursor, rows, mentioned, entities=entities, generation=generation)
            # Postgres answers a row of NULLs for a tenant that does not fit.
            sentinel = any(row[0] is None for part in rest for row in part[:1])
            too_big = sentinel or len(rows) + len(mentioned) + len(entities) > limit
        if too_big:
            self._cache.refuse(self._tenant)
            return None
        return delta

    def keep(self, graph: TenantGraph) -> None:
        """Keep ``graph``, built from this (whole) read, unless a copy is kept already."""
        if self._cache.get(self._tenant) is None:
            self._cache.put(self._tenant, graph)

    def take(self, results: Sequence[Sequence[Any]]) -> tuple[TenantGraph, Overlay | None] | None:
        """The copy to walk, with this read's changes merged into it, or laid
        over it when another read changed the copy meanwhile; None when the
        tenant (or this change) is too big to keep: walk in Postgres instead."""
        delta = self.read(results)
        if delta is None:
            return None
        cache, graph = self._cache, self._graph
        if graph is None:
            # Another read may have loaded it meanwhile: this one, the whole
            # tenant, is walked as read and the copy already kept stays.
            graph = TenantGraph.of(delta)
            self.keep(graph)
            return graph, None
        if graph.applied == self._applied and cache.get(self._tenant) is graph:
            graph.apply(delta)
            cache.resize(self._tenant, graph)
            return graph, None
        if not len(delta):
            # Nothing changed since this read's cursor as it saw it: whatever
            # was merged meanwhile is newer than its snapshot.
            return graph, None
        return graph, Overlay(graph, delta)


class GraphCache:
    """The tenants' copies in one process, least recently walked first out."""

    def __init__(self, limit: int, total: int) -> None:
        self.limit = limit
        self.total = total
        self._graphs: OrderedDict[str, TenantGraph] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._held = 0
        self._refused: dict[str, float] = {}
        #: Tenants whose first read is out (:meth:`load`).
        self._loading: set[str] = set()
        #: When each copy kept was last walked (monotonic seconds).
        self._walked: dict[str, float] = {}
        #: The size of copies dropped, to tell whether one read again would fit.
        self._last_sizes: dict[str, int] = {}
        #: A copy walked within this many seconds is not pushed out for a
        #: tenant not kept (:data:`EVICT_IDLE_S`).
        self.evict_idle = EVICT_IDLE_S
        #: Walks since start: ``here``, of which ``raced`` and ``unchanged`` (no
        #: change read: the generation alone, or read with the memories), and by
        #: ``postgres``; ``stale``: copies walked on assumption that had to be
        #: walked again (each such recall counts two walks ``here``).
        self.walks = {"here": 0, "raced": 0, "unchanged": 0, "postgres": 0, "stale": 0}
        #: Recalls of a tenant not kept that did not read it whole: its copy
        #: would have pushed out copies walked within :attr:`evict_idle`
        #: (:meth:`refresh`).
        self.declined = 0

    def configure(self, limit: int, total: int) -> None:
        """Apply reloaded limits (copies over them go at their next walk or eviction)."""
        self.limit, self.total = limit, total
        self._evict()

    @property
    def relations(self) -> int:
        """Relations held over all tenants."""
        return self._held

    def tenants(self) -> int:
        return len(self._graphs)

    def get(self, tenant: str) -> TenantGraph | None:
        return self._graphs.get(tenant)

    def refresh(self, tenant: str) -> Refresh | None:
        """How this walk reads the tenant's changes (for a tenant not kept
        yet, a whole read: :attr:`Refresh.whole`); None when the tenant is
        walked by Postgres: too big (tried again after :data:`RETRY_S`), or
        its first read is out (:meth:`load`)."""
        if self.limit <= 0 or self.total <= 0 or tenant in self._loading:
            return None
        until = self._refused.get(tenant)
        if until is not None:
            if time.monotonic() < until:
                return None
            del self._refused[tenant]
        graph = self._graphs.get(tenant)
        now = time.monotonic()
        if graph is not None:
            if now - graph.refreshed > STALE_S:
                self.drop(tenant)
                graph = None
            else:
                self._graphs.move_to_end(tenant)
                self._walked[tenant] = now
        if graph is None and not self._admits(tenant, now):
            self.declined += 1
            return None
        return Refresh(self, tenant, graph)

    def _admits(self, tenant: str, now: float) -> bool:
        """Whether ``tenant``'s copy (its last size, else the copies' mean)
        fits, or the least recently walked copies it would push out were
        all walked at least :attr:`evict_idle` ago."""
        if not self._graphs:
            return True
        size = self._last_sizes.get(tenant, self._held // len(self._graphs))
        over = self._held + size - self.total
        for other in self._graphs:
            if over <= 0:
                return True
            if now - self._walked.get(other, 0.0) < self.evict_idle:
                return False
            over -= self._sizes.get(other, 0)
        return True

    def load(self, tenant: str) -> AbstractAsyncContextManager[None]:
        """To be entered around a tenant's first read (a :attr:`Refresh.whole`
        one): from now on its recalls are walked by Postgres and start no
        other read until it ends; a read that fails is not tried again for
        :data:`FAILED_RETRY_S`."""
        self._loading.add(tenant)
        return self._loaded(tenant)

    @asynccontextmanager
    async def _loaded(self, tenant: str) -> AsyncIterator[None]:
        try:
            yield
        except BaseException:
            self.refuse(tenant, FAILED_RETRY_S)
            raise
        finally:
            self._loading.discard(tenant)

    def put(self, tenant: str, graph: TenantGraph) -> None:
        self._graphs[tenant] = graph
        self._walked[tenant] = time.monotonic()
        self.resize(tenant, graph)

    def resize(self, tenant: str, graph: TenantGraph) -> None:
        size = len(graph)
        if size > self.limit:
            self.refuse(tenant)
            return
        self._held += size - self._sizes.get(tenant, 0)
        self._sizes[tenant] = size
        self._evict(keep=tenant)

    def refuse(self, tenant: str, seconds: float = RETRY_S) -> None:
        """Walk ``tenant`` in Postgres for ``seconds``."""
        self.drop(tenant)
        self._refused[tenant] = time.monotonic() + seconds
        if len(self._refused) > 10_000:
            now = time.monotonic()
            self._refused = {t: u for t, u in self._refused.items() if u > now}

    def drop(self, tenant: str) -> None:
        if self._graphs.pop(tenant, None) is not None:
            size = self._sizes.pop(tenant, 0)
            self._held -= size
            self._walked.pop(tenant, None)
            self._last_sizes[tenant] = size
            if len(self._last_sizes) > 10_000:
                self._last_sizes.clear()

    def _evict(self, keep: str | None = None) -> None:
        while self._held > self.total and self._graphs:
            oldest = next(iter(self._graphs))
            if oldest == keep:
                if len(self._graphs) == 1:
                    self.drop(oldest)
                    return
                self._graphs.move_to_end(oldest)
                continue
            self.drop(oldest)

    def stats(self) -> dict[str, int]:
        """What this process holds (tenants, rows: relations + mentions) and
        how its walks went since start: walked here, raced another read (laid
        over), found nothing changed (no change read), walked by Postgres
        instead, and walked again for a copy assumed current that was not;
        and recalls of a tenant not kept that did not read it whole for want
        of room (:meth:`refresh`)."""
        return {"tenants": len(self._graphs), "rows": self._held, **self.walks, "declined": self.declined}
