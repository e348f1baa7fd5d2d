"""Tenants spread over collection groups: one :class:`~.index.TypesenseIndex`
(a keyword and a vectors collection pair behind their aliases) a group.

With ``typesense.groups: 1`` there is one group, behind ``typesense.collection``
itself, as before groups existed. With ``n`` groups a tenant's memories live
in the pair behind ``<collection>_g<i>``, ``i`` from a hash of the tenant's name
(:func:`~.documents.group_alias`). A search reads one tenant's group only, so
what it pays for the documents that hold its terms grows with the group, not
with every tenant's memories (``benchmarks/results/tenants-*.md``).

A write is sent to each of its tenants' groups; a rebuild (``indexers.reindex``)
fills a new pair for every group and switches them, then drops the aliases a
different group count left (:meth:`TypesenseGroups.strays`). Collections are
always passed as a mapping from a group's alias to one of its keyword
collections.
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

__all__ = ["TypesenseGroups"]


class TypesenseGroups:
    """The ``groups`` collection pairs tenants are spread over (see the module)."""

    def __init__(self, client: TypesenseClient, alias: str, dim: int, *, groups: int = 1, vectors: bool = True) -> None:
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups!r}")
        self.client = client
        self.alias = alias
        self.groups = groups
        self.dim = dim
        self.vectors = vectors
        names = [alias] if groups == 1 else [f"{alias}_g{i}" for i in range(groups)]
        self.indexes: dict[str, TypesenseIndex] = {
            name: TypesenseIndex(client, name, dim, vectors=vectors) for name in names
        }

    def alias_of(self, tenant: str) -> str:
        """The alias of the group holding ``tenant``."""
        return group_alias(self.alias, tenant, self.groups)

    def of(self, tenant: str) -> TypesenseIndex:
        """The index of the group holding ``tenant``."""
        return self.indexes[self.alias_of(tenant)]

    def index(self, alias: str) -> TypesenseIndex:
        """The index behind ``alias``, one of this layout's groups or not (a
        job of an earlier layout is cleared through it)."""
        return self.indexes.get(alias) or TypesenseIndex(self.client, alias, self.dim, vectors=self.vectors)

    async def ensure(self) -> list[str]:
        """Make sure every group's aliases point at collections; returns the
        aliases that had none (their new collections are empty)."""
        present = await self.client.list_aliases()
        made = [alias for alias in self.indexes if alias not in present]
        for index in self.indexes.values():
            await index.ensure()
        return made

    async def ready(self) -> bool:
        """Whether every group can serve searches (:meth:`TypesenseIndex.ready`)."""
        for index in self.indexes.values():
            if not await index.ready():
                return False
        return True

    def _by_group(self, tenants: Sequence[str]) -> dict[str, list[int]]:
        positions: dict[str, list[int]] = defaultdict(list)
        for i, tenant in enumerate(tenants):
            positions[self.alias_of(tenant)].append(i)
        return positions

    def _target(self, alias: str, collections: Mapping[str, str] | None) -> str | None:
        if collections is None:
            return None
        try:
            return collections[alias]
        except KeyError:
            raise ValueError(f"no collection named for group {alias!r}") from None

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
        """:meth:`TypesenseIndex.upsert` of each group's records, the groups
        at once; ``collections`` names each group's target (default: the
        collections behind the aliases; required with ``fresh``)."""
        if fresh and collections is None:
            raise ValueError("fresh needs the collections named: the live ones have had deletes")
        groups = self._by_group([r.tenant for r in records])
        await self._each(
            [
                self.index(alias).upsert(
                    [records[i] for i in at], collection=self._target(alias, collections), fresh=fresh
                )
                for alias, at in groups.items()
            ]
        )

    async def delete(self, keys: Sequence[tuple[str, str]], collections: Mapping[str, str] | None = None) -> None:
        """:meth:`TypesenseIndex.delete` of each group's ``(tenant, memory id)`` keys."""
        groups = self._by_group([tenant for tenant, _ in keys])
        await self._each(
            [
                self.index(alias).delete([keys[i] for i in at], collection=self._target(alias, collections))
                for alias, at in groups.items()
            ]
        )

    async def count(self, tenant: str | None = None) -> int:
        """How many documents ``tenant``'s group holds of it, or all groups together."""
        if tenant is not None:
            return await self.of(tenant).count(tenant)
        return sum([await index.count() for index in self.indexes.values()])

    async def fetch(self, id: str, *, tenant: str) -> dict[str, Any] | None:
        """The tenant's stored keyword document for memory ``id``, or ``None``."""
        return await self.of(tenant).fetch(id, tenant=tenant)

    async def fetch_vector(self, id: str, *, tenant: str) -> dict[str, Any] | None:
        """The tenant's stored vector document for memory ``id``, or ``None``."""
        return await self.of(tenant).fetch_vector(id, tenant=tenant)

    async def current_collections(self) -> dict[str, str | None]:
        """Each group's keyword collection behind its alias (``None``: none)."""
        present = await self.client.list_aliases()
        return {alias: present.get(alias) for alias in self.indexes}

    async def new_collections(self) -> dict[str, str]:
        """A new empty collection pair for every group, not behind the aliases yet."""
        return {alias: await index.new_collection() for alias, index in self.indexes.items()}

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
