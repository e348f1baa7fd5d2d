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
from .placement import Placements

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
        placements: Placements | None = None,
    ) -> None:
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups!r}")
        self.client = client
        self.alias = alias
        self.groups = groups
        self.dim = dim
        self.vectors = vectors
        self.placements = placements if placements is not None else Placements()
        names = [alias] if groups == 1 else [f"{alias}_g{i}" for i in range(groups)]
        self.indexes: dict[str, TypesenseIndex] = {
            name: TypesenseIndex(client, name, dim, vectors=vectors) for name in names
        }

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

    def index(self, alias: str) -> TypesenseIndex:
        """The index behind ``alias``: a group's, a moved tenant's, or one
        of an earlier layout (a job of which is cleared through it)."""
        return self.indexes.get(alias) or TypesenseIndex(self.client, alias, self.dim, vectors=self.vectors)

    async def ensure(self) -> list[str]:
        """Make sure the aliases of every group and moved tenant point at
        collections; returns the aliases that had none (their new collections
        are empty)."""
        present = await self.client.list_aliases()
        made = [alias for alias in self.aliases() if alias not in present]
        for alias in self.aliases():
            await self.index(alias).ensure()
        return made

    async def ready(self) -> bool:
        """Whether every group and moved tenant can serve searches (:meth:`TypesenseIndex.ready`)."""
        for alias in self.aliases():
            if not await self.index(alias).ready():
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
        present = await self.client.list_aliases()
        return {alias: present.get(alias) for alias in self.aliases()}

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

    async def strays(self) -> dict[str, str]:
        """The keyword aliases of ``alias``'s groups under another group count
        (``<alias>`` or ``<alias>_g<i>`` not in this layout), with their collections."""
        pattern = re.compile(re.escape(self.alias) + r"(_g\d+)?")
        aliases = await self.client.list_aliases()
        return {
            alias: name for alias, name in aliases.items() if pattern.fullmatch(alias) and alias not in self.indexes
        }

    async def drop_strays(self) -> list[str]:
        """Remove :meth:`strays`: both aliases of each and the pair behind them;
        returns the aliases removed."""
        strays = await self.strays()
        for alias, name in strays.items():
            await self.client.delete_alias(vectors_alias(alias))
            await self.client.delete_alias(alias)
            await self.index(alias).drop_collection(name)
        return sorted(strays)
