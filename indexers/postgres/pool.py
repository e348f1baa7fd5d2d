"""The connection pool, and transactions scoped to one tenant by row-level security."""

from __future__ import annotations

import asyncio
import functools
import re
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import psycopg
from pgvector.psycopg import register_vector_async
from psycopg.rows import RowFactory, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from config import BraidConfig, source_defaults

from ..base import Hit, SearchQuery, SourceUnavailable
from ..migrations import SCHEMA_LOCK, TENANT_ROLE, migrate
from ..registry import BOTH, Match, SourceSpec

__all__ = [
    "GIVEN_UP_GRACE_S",
    "NOTIFY_CHANNEL",
    "PING_TIMEOUT_S",
    "PoolSource",
    "end_given_up",
    "on_connection",
    "open_pool",
    "open_replica_pool",
    "Read",
    "scope_to_tenant",
    "settings_read",
    "tenant_reads",
    "tenant_transaction",
]

#: Notified on commit of every write that adds outbox rows; the sync worker listens.
NOTIFY_CHANNEL = "braid_outbox"

#: How long a health check waits on Postgres.
PING_TIMEOUT_S = 2.0


async def _configure(conn: psycopg.AsyncConnection) -> None:
    await register_vector_async(conn)
    # Timestamps are read back in UTC whatever the server's TimeZone: in another
    # zone, a valid instant near year 1 or 9999 would be out of Python's range.
    await conn.execute("SET TIME ZONE 'UTC'")


async def open_pool(dsn: str, *, dim: int, min_size: int, max_size: int) -> AsyncConnectionPool:
    """Migrate the schema, then open a pool whose connections know `vector`."""
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await migrate(conn, dim=dim)
    except psycopg.OperationalError as exc:
        raise SourceUnavailable("postgres", str(exc).strip()) from exc
    pool = _pool(dsn, "braid", min_size, max_size)
    await pool.open(wait=True, timeout=30)
    return pool


async def open_replica_pool(dsn: str, *, min_size: int, max_size: int) -> AsyncConnectionPool:
    """A pool on a read-only streaming replica (``postgres.replicaDsn``): no
    migration (the replica replays the primary's), and no wait for its first
    connections: a replica that is down must not stop the service starting
    (:class:`indexers.postgres.replica.ReplicaRouter` keeps recalls off it)."""
    pool = _pool(dsn, "braid-replica", min_size, max_size)
    await pool.open(wait=False)
    return pool


def _pool(dsn: str, name: str, min_size: int, max_size: int) -> AsyncConnectionPool:
    """An unopened pool of autocommit connections that know `vector`."""
    return AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        open=False,
        configure=_configure,
        reset=_check_returned,
        kwargs={"autocommit": True},
        name=name,
        # How long a request waits for a connection before it fails with 503.
        timeout=5.0,
    )


async def _check_returned(conn: psycopg.AsyncConnection) -> None:
    """Called by the pool on every connection given back: one still in
    pipeline mode (a pipeline whose exit failed) is refused, so the pool
    closes it and opens another instead of lending out a connection whose
    next statements would join what the failed pipeline left."""
    if conn.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF:
        raise psycopg.ProgrammingError("connection given back in pipeline mode")


T = TypeVar("T")

#: How long a statement whose caller stopped waiting for it may still run
#: before it is cut (:func:`_cut`), in seconds: as long as a request waits
#: for a connection.
GIVEN_UP_GRACE_S = 5.0

#: Each pool's work whose caller stopped waiting while it ran on a connection.
_given_up: weakref.WeakKeyDictionary[AsyncConnectionPool, set[asyncio.Task[Any]]] = weakref.WeakKeyDictionary()

#: How often a cut is delivered again until the work ends, in seconds.
_CUT_AGAIN_S = 0.05


class _Work:
    """Whether :func:`on_connection`'s work holds a connection yet."""

    __slots__ = ("running",)

    def __init__(self) -> None:
        self.running = False


async def on_connection(pool: AsyncConnectionPool, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
    """``work`` run on a connection of ``pool``: its result, or its error.

    A caller that stops waiting (its deadline passed, its request was
    cancelled) is answered at once, as by any cancelled await, but work
    already running goes on without it: a statement is not cut in the
    middle. Cutting one costs psycopg a second connection to the server to
    send the cancel request, then the connection it ran on, which psycopg
    closes when the cancellation is delivered again (anyio does that until a
    deadline holds), so the pool opens another: a fork and a login on the
    server for each deadline missed, which under overload misses more.
    Work still waiting for a connection is cut (nothing ran); work running
    when its caller left has :data:`GIVEN_UP_GRACE_S` more, then is cut as
    before.
    """
    state = _Work()
    task = asyncio.ensure_future(_run(pool, work, state))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        handle: asyncio.TimerHandle | None = None
        if task.done():
            pass  # ended as its caller left: its outcome is still taken below
        elif state.running:
            handle = task.get_loop().call_later(GIVEN_UP_GRACE_S, _cut, task)
            _given_up.setdefault(pool, set()).add(task)
        else:
            handle = _cut(task)
        task.add_done_callback(functools.partial(_settled, pool, handle))
        raise


async def _run(pool: AsyncConnectionPool, work: Callable[[psycopg.AsyncConnection], Awaitable[T]], state: _Work) -> T:
    async with pool.connection() as conn:
        state.running = True
        return await work(conn)


def _cut(task: asyncio.Task[Any]) -> asyncio.TimerHandle | None:
    """Cancel ``task``, again every :data:`_CUT_AGAIN_S` until it ends: psycopg,
    cancelled once, asks the server to cancel the statement and waits for it
    to confirm (the connection is kept), which a stalled server never does;
    cancelled again, it closes the connection."""
    if task.done():
        return None
    task.cancel()
    return task.get_loop().call_later(_CUT_AGAIN_S, _cut, task)


def _settled(pool: AsyncConnectionPool, handle: asyncio.TimerHandle | None, task: asyncio.Task[Any]) -> None:
    """Forget given-up work that ended, and take its outcome (no one else will)."""
    if handle is not None:
        handle.cancel()
    tasks = _given_up.get(pool)
    if tasks is not None:
        tasks.discard(task)
    if not task.cancelled():
        task.exception()


async def end_given_up(pool: AsyncConnectionPool) -> None:
    """Cut the work on ``pool`` whose callers stopped waiting, and wait until
    it ended: before the pool closes, which would otherwise wait for their
    connections."""
    tasks = _given_up.pop(pool, set())
    for task in tasks:
        _cut(task)
    if tasks:
        await asyncio.wait(tasks)


#: A run-time setting's name (``hnsw.ef_search``), as ``set_config`` takes it.
_SETTING_RE = re.compile(r"[a-z_]+(\.[a-z_]+)?")

#: The scope statement of each tuple of extra settings (a handful of tuples exist).
_SCOPE_SQL: dict[tuple[str, ...], str] = {}


def _scope_sql(settings: tuple[str, ...]) -> str:
    sql = _SCOPE_SQL.get(settings)
    if sql is None:
        calls = ["set_config('role', %s, true)", "set_config('braid.tenant', %s, true)", *_set_configs(settings)]
        sql = _SCOPE_SQL[settings] = "SELECT " + ", ".join(calls)
    return sql


def _set_configs(names: tuple[str, ...]) -> list[str]:
    """A transaction-local ``set_config`` call of each setting in ``names``, its value a parameter."""
    if not all(_SETTING_RE.fullmatch(name) for name in names):
        raise ValueError(f"invalid setting name in {names!r}")
    return [f"set_config('{name}', %s, true)" for name in names]


#: :func:`settings_read`'s statement for each tuple of setting names.
_SETTINGS_SQL: dict[tuple[str, ...], str] = {}


def settings_read(settings: Mapping[str, str]) -> Read:
    """One statement of a :func:`tenant_reads` batch that sets ``settings``
    (name -> value) for the rest of the transaction: the statements after
    it run under them, those before it do not."""
    names = tuple(settings)
    sql = _SETTINGS_SQL.get(names)
    if sql is None:
        sql = _SETTINGS_SQL[names] = "SELECT " + ", ".join(_set_configs(names))
    return Read(sql, [settings[n] for n in names])


async def scope_to_tenant(
    conn: psycopg.AsyncConnection, tenant: str, settings: Mapping[str, str] | None = None
) -> None:
    """Run the rest of the current transaction as :data:`TENANT_ROLE` for ``tenant``.

    Row-level security (migration v5) then lets the transaction see and write
    ``tenant``'s rows only: a statement that forgot ``tenant = %s`` still sees
    one tenant. The connecting role is not restricted; the outbox worker and
    reindex, which work across tenants, run as it. Both settings are
    transaction-local: they end with the transaction, so a connection goes
    back to the pool unscoped even after an error. ``settings`` (name ->
    value, e.g. ``hnsw.ef_search``) are set for the transaction too, in the
    same statement.
    """
    names = tuple(settings or ())
    values = [settings[n] for n in names] if settings else []
    await conn.execute(_scope_sql(names), (TENANT_ROLE, tenant, *values))


@asynccontextmanager
async def schema_lock(pool: AsyncConnectionPool) -> AsyncIterator[psycopg.AsyncConnection]:
    """A connection of ``pool`` holding :data:`~indexers.migrations.SCHEMA_LOCK`
    (a session advisory lock) for the block: the start-up steps that make
    what is missing, so processes starting at once take turns."""
    async with pool.connection() as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (SCHEMA_LOCK,))
        try:
            yield conn
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (SCHEMA_LOCK,))


@asynccontextmanager
async def tenant_transaction(pool: AsyncConnectionPool, tenant: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """A pooled connection inside a transaction scoped to ``tenant``."""
    async with pool.connection() as conn, conn.transaction():
        await scope_to_tenant(conn, tenant)
        yield conn


#: A statement's parameters, by position or by name.
Params = Sequence[Any] | Mapping[str, Any]


class Read:
    """One statement of :func:`tenant_reads`, with the row factory its rows are made by."""

    __slots__ = ("params", "row_factory", "sql")

    def __init__(self, sql: str, params: Params | None = None, row_factory: RowFactory[Any] = tuple_row) -> None:
        self.sql = sql
        self.params = params
        self.row_factory = row_factory


async def tenant_reads(
    pool: AsyncConnectionPool,
    tenant: str,
    reads: Sequence[Read],
    *,
    settings: Mapping[str, str] | None = None,
    repeatable_read: bool = False,
) -> list[list[Any]]:
    """The rows of each of ``reads``, run in order in one transaction scoped
    to ``tenant`` (:func:`scope_to_tenant`, with ``settings``), in one round
    trip (:func:`_reads_in_one`), which other reads of ``tenant`` on ``pool``
    asked for in the same turn of the event loop may share.

    A recall's sources and its own reads start together: the read of the
    memories not yet indexed, the pgvector search and the graph's read are
    asked for in one turn, and went to Postgres as transactions of their
    own before. Reads that share a round trip run in one transaction, under
    the strongest isolation any of them asked for, in the order they were
    asked for except that those without ``settings`` come first, before any
    settings are set. A shared transaction holds at most one set of
    ``settings`` (a read with others starts the next batch), set by one
    statement right before the reads that asked for it, so a read never
    runs under settings it did not ask for. When the shared transaction
    fails on a statement, each read is sent again alone, so an error reaches
    the caller whose statement it is and no other. A caller that stops
    waiting leaves the others their rows: the round trip goes on for them
    (:func:`on_connection`); when the first caller, who sends it, leaves
    before it went out, each of the others sends its reads alone.
    """
    key = (pool, tenant)
    batch = _open_batches.get(key)
    if batch is not None and batch.admits(settings):
        return await batch.join(_Asked(reads, settings, repeatable_read))
    batch = _open_batches[key] = _Batch(key, _Asked(reads, settings, repeatable_read))
    try:
        await asyncio.sleep(0)  # the reads asked for in this turn join
    except BaseException:
        batch.close()
        batch.alone()
        raise
    batch.close()
    if not batch.joined:
        return await _reads_in_one(pool, tenant, reads, settings=settings, repeatable_read=repeatable_read)
    return await batch.send()


async def _reads_in_one(
    pool: AsyncConnectionPool,
    tenant: str,
    reads: Sequence[Read],
    *,
    settings: Mapping[str, str] | None = None,
    repeatable_read: bool = False,
) -> list[list[Any]]:
    """The rows of each of ``reads``, run in order in one transaction scoped
    to ``tenant`` (:func:`scope_to_tenant`, with ``settings``), in one round trip.

    The scope and the statements go out together in pipeline mode and their
    results come back together; no statement runs outside the scope. They
    form the implicit transaction that the pipeline's Sync ends (the pool's
    connections are in autocommit), so no BEGIN or COMMIT is sent: the
    scope's transaction-local settings end at the Sync. ``repeatable_read``:
    one snapshot for every statement, in an explicit transaction opened by one
    ``BEGIN ISOLATION LEVEL REPEATABLE READ`` (Postgres refuses the level in
    an implicit one). An error in any statement rolls the transaction back
    and is raised, and the connection is closed (the pool opens another):
    whatever state the aborted pipeline left it in, no later read inherits
    it. (Seen under load before this: a connection whose every repeatable-read
    pipeline then failed with "SET TRANSACTION ISOLATION LEVEL must be called
    before any query", four recalls in a row.) A caller that stops waiting
    leaves the round trip to finish (:func:`on_connection`).
    """
    return await on_connection(pool, functools.partial(_pipelined, tenant, reads, settings, repeatable_read))


async def _pipelined(
    tenant: str,
    reads: Sequence[Read],
    settings: Mapping[str, str] | None,
    repeatable_read: bool,
    conn: psycopg.AsyncConnection,
) -> list[list[Any]]:
    """:func:`_reads_in_one`'s work on its connection."""
    try:
        async with conn.pipeline():
            if repeatable_read:
                await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cursors = await _scoped(conn, tenant, reads, settings)
            if repeatable_read:
                await conn.execute("COMMIT")
    except psycopg.Error:
        with anyio.CancelScope(shield=True):
            await conn.close()
        raise
    return [await cur.fetchall() for cur in cursors]


async def _scoped(
    conn: psycopg.AsyncConnection, tenant: str, reads: Sequence[Read], settings: Mapping[str, str] | None
) -> list[psycopg.AsyncCursor[Any]]:
    """The scope, then ``reads``, queued on ``conn``'s pipeline: their cursors, in order."""
    await scope_to_tenant(conn, tenant, settings)
    return [await conn.cursor(row_factory=r.row_factory).execute(r.sql, r.params) for r in reads]


class _Asked:
    """One caller's part of a :class:`_Batch`."""

    __slots__ = ("reads", "repeatable_read", "settings")

    def __init__(self, reads: Sequence[Read], settings: Mapping[str, str] | None, repeatable_read: bool) -> None:
        self.reads = reads
        self.settings = settings
        self.repeatable_read = repeatable_read


#: The batch of each (pool, tenant) that still takes reads: until the turn of
#: the event loop its first read was asked for in ends (:func:`tenant_reads`).
_open_batches: dict[tuple[AsyncConnectionPool, str], _Batch] = {}

#: A joined read's answer when its batch was not sent or failed: ask alone.
_ALONE: list[list[Any]] = []


class _Batch:
    """The reads of one tenant asked for in one turn of the event loop. Its
    first caller sends them in one round trip (:meth:`send`) and the others
    wait for their part (:meth:`join`)."""

    __slots__ = ("first", "joined", "key", "started")

    def __init__(self, key: tuple[AsyncConnectionPool, str], first: _Asked) -> None:
        self.key = key
        self.first = first
        self.joined: list[tuple[_Asked, asyncio.Future[list[list[Any]]]]] = []
        self.started = False

    def admits(self, settings: Mapping[str, str] | None) -> bool:
        """Whether a read with ``settings`` may join: at most one set of settings a batch."""
        if not settings:
            return True
        return all(not a.settings or a.settings == settings for a in self._asked())

    def _asked(self) -> list[_Asked]:
        return [self.first, *(a for a, _ in self.joined)]

    async def join(self, asked: _Asked) -> list[list[Any]]:
        """``asked``'s rows, from the batch's round trip, or from its own when
        the batch is not sent or fails. Leaving cancels only its own part."""
        answer: asyncio.Future[list[list[Any]]] = asyncio.get_running_loop().create_future()
        self.joined.append((asked, answer))
        rows = await answer
        if rows is _ALONE:
            return await _reads_in_one(
                *self.key, asked.reads, settings=asked.settings, repeatable_read=asked.repeatable_read
            )
        return rows

    def close(self) -> None:
        """Take no more reads."""
        if _open_batches.get(self.key) is self:
            del _open_batches[self.key]

    def alone(self) -> None:
        """Each joined read is asked for again alone (the batch is not sent)."""
        for _, answer in self.joined:
            if not answer.done():
                answer.set_result(_ALONE)

    async def send(self) -> list[list[Any]]:
        """Every read in one round trip: the first caller's rows; the others'
        reach them even when the first caller stops waiting (the work goes on,
        :func:`on_connection`). When the shared transaction fails on a
        statement, each read is asked for again alone."""
        pool, tenant = self.key
        asked = self._asked()
        # Reads without settings first, then the settings and the reads under them.
        order = sorted(range(len(asked)), key=lambda i: bool(asked[i].settings))
        reads: list[Read] = []
        spans = [(0, 0)] * len(asked)
        for i in order:
            part = asked[i]
            if part.settings:
                reads.append(settings_read(part.settings))
            spans[i] = (len(reads), len(reads) + len(part.reads))
            reads.extend(part.reads)
        repeatable_read = any(a.repeatable_read for a in asked)

        async def work(conn: psycopg.AsyncConnection) -> list[list[Any]]:
            self.started = True
            try:
                rows = await _pipelined(tenant, reads, None, repeatable_read, conn)
            except BaseException:
                self.alone()
                raise
            for (_, answer), (a, b) in zip(self.joined, spans[1:], strict=True):
                if not answer.done():
                    answer.set_result(rows[a:b])
            return rows[spans[0][0] : spans[0][1]]

        try:
            return await on_connection(pool, work)
        except PoolTimeout as exc:
            for _, answer in self.joined:
                if not answer.done():
                    answer.set_exception(exc)  # asking alone would wait again
            raise
        except psycopg.Error:
            first = self.first
            return await _reads_in_one(
                pool, tenant, first.reads, settings=first.settings, repeatable_read=first.repeatable_read
            )
        finally:
            if not self.started:
                self.alone()  # left before the round trip began: it never will


class PoolSource:
    """Base of the sources that read Postgres: a shared pool and the live config."""

    name: str
    needs_vector: bool

    def __init__(self, pool: AsyncConnectionPool, get_config: Callable[[], BraidConfig]) -> None:
        self._pool = pool
        self._get_config = get_config

    async def search(self, query: SearchQuery) -> list[Hit]:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Nothing to release: the pool belongs to the runtime."""

    @classmethod
    def spec(cls, *, covers_vectors: bool = False, matches: frozenset[Match] = BOTH) -> SourceSpec:
        """This source's registration: built on the runtime's pool, reading Postgres."""
        return SourceSpec(
            name=cls.name,
            build=lambda deps: cls(deps.pool, deps.get_config),
            defaults=source_defaults()[cls.name],
            store="postgres",
            covers_vectors=covers_vectors,
            matches=matches,
        )
