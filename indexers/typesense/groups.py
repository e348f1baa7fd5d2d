"""Tenants spread over collection groups: one :class:`~.index.TypesenseIndex`
(a keyword and a vectors collection pair behind their aliases) a group.

With ``typesense.groups: 1`` there is one group, behind ``typesense.collection``
itself, as before groups existed. With ``n`` groups a tenant's memories live
in the pair behind ``<collection>_g<i>``, ``i`` from a hash of the tenant's name
(:func:`~.documents.group_alias`). A search reads one tenant's group only, so
what it pays for the documents that hold its terms grows with the group, not
with every tenant's memories (``benchmarks/results/tenants-*.md``).

A tenant moved to a pair of its own (:mod:`.placement`) is searched there
once the move is ``live``; while it is ``copying`` its writes go to both.

A write is sent to each of its tenants' groups; a rebuild (``indexers.reindex``)
fills a new pair for every group and moved tenant and switches them, then
drops the aliases a different group count left (:meth:`TypesenseGroups.strays`).
Collections are always passed as a mapping from an alias (a group's or a
moved tenant's) to one of its keyword collections.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from ..base import BackendError, MemoryRecord
from .client import TypesenseClient
from .documents import group_alias, vectors_alias
from .index import TypesenseIndex
from .placement import Placements, own_alias

__all__ = ["TypesenseGroups"]


class TypesenseGroups:
    """The ``groups`` collection pairs tenants are spread over (see the module)."""

    def __init__(
        self,
        client: TypesenseClient,
        alias: str,
        dim: int,
        *,
        groups: int = 1,
        vectors: bool = True,
        stems: bool = False,
        placements: Placements | None = None,
        clusters: Sequence[TypesenseClient] = (),
    ) -> None:
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups!r}")
        self.client = client
        #: Cluster 0 (``client``) and the further ones (``typesense.clusters``).
        self.clients = [client, *clusters]
        self.alias = alias
        self.groups = groups
        self.dim = dim
        self.vectors = vectors
        self.stems = stems
        self.placements = placements if placements is not None else Placements()
        names = [alias] if groups == 1 else [f"{alias}_g{i}" for i in range(groups)]
        self._group_pattern = re.compile(re.escape(alias) + r"(?:_g(\d+))?")
        self.indexes: dict[str, TypesenseIndex] = {name: self._index_on(self.client_of(name), name) for name in names}

    def _index_on(self, client: TypesenseClient, alias: str) -> TypesenseIndex:
        """An index of ``alias`` on ``client`` with this layout's dimension, vectors and stems."""
        return TypesenseIndex(client, alias, self.dim, vectors=self.vectors, stems=self.stems)

    async def compact(self) -> dict[str, str]:
        """Every node of every cluster asked to compact its store
        (:meth:`TypesenseClient.compact`): node -> ``ok``, or why not."""
        answers: dict[str, str] = {}
        for client in self.clients:
            answers.update(await client.compact())
        return answers

    def cluster_of(self, alias: str) -> int:
        """The cluster (an index into :attr:`clients`) that holds ``alias``:
        group ``i``'s is ``i % len(clients)``; a moved tenant's pair is on
        its group's cluster; any other alias on cluster 0."""
        match = self._group_pattern.fullmatch(alias)
        if match is not None:
            return 0 if match.group(1) is None else int(match.group(1)) % len(self.clients)
        for tenant, placed in self.placements.all().items():
            if placed.alias == alias:
                return self.cluster_of(self.group_of(tenant))
        return 0

    def client_of(self, alias: str) -> TypesenseClient:
        """The client of the cluster that holds ``alias``."""
        return self.clients[self.cluster_of(alias)]

    def route(self, tenant: str) -> tuple[TypesenseClient, str]:
        """Where ``tenant``'s searches go: the cluster's client and the alias
        (:meth:`alias_of`). Its own pair, once moved, is on its group's
        cluster, so the group decides either way."""
        return self.client_of(self.group_of(tenant)), self.alias_of(tenant)

    def group_of(self, tenant: str) -> str:
        """The alias of ``tenant``'s group (moved or not)."""
        return group_alias(self.alias, tenant, self.groups)

    def alias_of(self, tenant: str) -> str:
        """The alias ``tenant``'s searches read: its own pair's once its move
        is ``live``, else its group's."""
        placed = self.placements.get(tenant)
        return placed.alias if placed is not None and placed.state == "live" else self.group_of(tenant)

    def write_aliases(self, tenant: str) -> list[str]:
        """The aliases ``tenant``'s writes go to: its group, its own pair, or
        both while it is being moved."""
        placed = self.placements.get(tenant)
        if placed is None:
            return [self.group_of(tenant)]
        return [placed.alias] if placed.state == "live" else [self.group_of(tenant), placed.alias]

    def aliases(self) -> list[str]:
        """Every group's alias and every moved tenant's, in that order."""
        return [*self.indexes, *sorted({p.alias for p in self.placements.all().values()})]

    def of(self, tenant: str) -> TypesenseIndex:
        """The index ``tenant``'s searches read (:meth:`alias_of`)."""
        return self.index(self.alias_of(tenant))

    def own_index(self, tenant: str) -> TypesenseIndex:
        """The index of ``tenant``'s own pair (:func:`~.placement.own_alias`),
        on its group's cluster, placed yet or not."""
        return self._index_on(self.client_of(self.group_of(tenant)), own_alias(self.alias, tenant))

    def index(self, alias: str) -> TypesenseIndex:
        """The index behind ``alias``: a group's, a moved tenant's, or one
        of an earlier layout (a job of which is cleared through it)."""
        return self.indexes.get(alias) or self._index_on(self.client_of(alias), alias)

    async def ensure(self) -> list[str]:
        """Make sure the aliases of every group and moved tenant point at
        collections; returns the aliases that had none (their new collections
        are empty)."""
        present = await self._present()
        made = [alias for alias in self.aliases() if alias not in present]
        for alias in self.aliases():
            await self.index(alias).ensure()
        return made

    async def ready(self) -> bool:
        """Whether every group and moved tenant can serve searches: each
        cluster is healthy *and* each alias resolves to a collection that
        answers (as :meth:`TypesenseIndex.ready`, with one health check and
        one alias listing a cluster)."""
        try:
            for client in self.clients:
                if not await client.health():
                    return False
            present = await self._present()
            for alias in self.aliases():
                if alias not in present:
                    return False
                await self.client_of(alias).count(alias)
        except BackendError:
            return False
        return True

    def _routes(self, tenants: Sequence[str], collections: Mapping[str, str] | None) -> dict[str, list[int]]:
        """Positions in ``tenants`` by the alias each is written to
        (:meth:`write_aliases`; with ``collections``, those it names only)."""
        positions: dict[str, list[int]] = defaultdict(list)
        for i, tenant in enumerate(tenants):
            for alias in self.write_aliases(tenant):
                if collections is None or alias in collections:
                    positions[alias].append(i)
        return positions

    @staticmethod
    def _target(alias: str, collections: Mapping[str, str] | None) -> str | None:
        return None if collections is None else collections[alias]

    async def _each(self, calls: list[Any]) -> None:
        """Await ``calls`` at once; the first backend error, after all ended."""
        errors: list[BackendError] = []

        async def run(call: Any) -> None:
            try:
                await call
            except BackendError as exc:
                errors.append(exc)

        if len(calls) == 1:
            await calls[0]
            return
        async with anyio.create_task_group() as tg:
            for call in calls:
                tg.start_soon(run, call)
        if errors:
            raise errors[0]

    async def upsert(
        self, records: Sequence[MemoryRecord], collections: Mapping[str, str] | None = None, *, fresh: bool = False
    ) -> None:
        """:meth:`TypesenseIndex.upsert` of the records to each alias their
        tenants are written to (:meth:`write_aliases`), the aliases at once.
        ``collections`` names each alias' target collection, and a record
        goes to the named ones only (default: the collections behind the
        aliases; required with ``fresh``)."""
        if fresh and collections is None:
            raise ValueError("fresh needs the collections named: the live ones have had deletes")
        groups = self._routes([r.tenant for r in records], collections)
        await self._each(
            [
                self.index(alias).upsert(
                    [records[i] for i in at], collection=self._target(alias, collections), fresh=fresh
                )
                for alias, at in groups.items()
            ]
        )

    async def delete(self, keys: Sequence[tuple[str, str]], collections: Mapping[str, str] | None = None) -> None:
        """:meth:`TypesenseIndex.delete` of ``(tenant, memory id)`` keys, routed as :meth:`upsert` routes."""
        groups = self._routes([tenant for tenant, _ in keys], collections)
        await self._each(
            [
                self.index(alias).delete([keys[i] for i in at], collection=self._target(alias, collections))
                for alias, at in groups.items()
            ]
        )

    async def count(self, tenant: str | None = None) -> int:
        """How many documents of ``tenant`` the pair its searches read holds,
        or all groups and moved tenants' pairs together."""
        if tenant is not None:
            return await self.of(tenant).count(tenant)
        return sum([await self.index(alias).count() for alias in self.aliases()])

    async def fetch(self, id: str, *, tenant: str) -> dict[str, Any] | None:
        """The tenant's stored keyword document for memory ``id``, or ``None``."""
        return await self.of(tenant).fetch(id, tenant=tenant)

    async def fetch_vector(self, id: str, *, tenant: str) -> dict[str, Any] | None:
        """The tenant's stored vector document for memory ``id``, or ``None``."""
        return await self.of(tenant).fetch_vector(id, tenant=tenant)

    async def current_collections(self) -> dict[str, str | None]:
        """The keyword collection behind each of :meth:`aliases` (``None``: none)."""
        present = await self._present()
        return {alias: present.get(alias) for alias in self.aliases()}

    async def _present(self) -> dict[str, str]:
        """The aliases of :meth:`aliases` that exist on their own cluster, with their collections."""
        listed = [await client.list_aliases() for client in self.clients]
        return {
            alias: listed[self.cluster_of(alias)][alias]
            for alias in self.aliases()
            if alias in listed[self.cluster_of(alias)]
        }

    async def new_collections(self) -> dict[str, str]:
        """A new empty collection pair for each of :meth:`aliases`, not behind them yet."""
        return {alias: await self.index(alias).new_collection() for alias in self.aliases()}

    async def switch(self, collections: Mapping[str, str]) -> dict[str, str | None]:
        """Point each named group's aliases at its new pair; returns what they pointed at."""
        return {alias: await self.index(alias).switch_alias(name) for alias, name in collections.items()}

    async def drop(self, collections: Mapping[str, str | None]) -> None:
        """Drop each named pair (none of them behind an alias; absent is fine)."""
        for alias, name in collections.items():
            if name is not None:
                await self.index(alias).drop_collection(name)

    async def strays(self) -> list[tuple[int, str, str]]:
        """The keyword aliases of ``alias``'s groups left by another layout
        (``<alias>`` or ``<alias>_g<i>`` not among :attr:`indexes`, or on
        another cluster than the one that holds it now), as (cluster, alias,
        collection)."""
        found = []
        for i, client in enumerate(self.clients):
            for alias, name in (await client.list_aliases()).items():
                if self._group_pattern.fullmatch(alias) and (alias not in self.indexes or self.cluster_of(alias) != i):
                    found.append((i, alias, name))
        return found

    async def drop_strays(self) -> list[str]:
        """Remove :meth:`strays`: both aliases of each and the pair behind
        them; returns the aliases removed (with their cluster when there are several)."""
        dropped = []
        for i, alias, name in await self.strays():
            stray = self._index_on(self.clients[i], alias)
            await self.clients[i].delete_alias(vectors_alias(alias))
            await self.clients[i].delete_alias(alias)
            await stray.drop_collection(name)
            dropped.append(alias if len(self.clients) == 1 else f"{alias}@{i}")
        return sorted(dropped)
