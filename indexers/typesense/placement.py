"""Tenants with a collection pair of their own, as this process last read them.

A tenant over ``typesense.ownCollectionAbove`` memories is moved out of its
group (:mod:`.groups`) into the pair behind :func:`own_alias` by the
``placement`` admin job (:mod:`indexers.placement`), which records each move
in Postgres (``typesense_placements``) in two steps:

* ``copying``: the pair is being filled; the tenant's writes go to its group
  *and* its own pair, its searches still read the group.
* ``live``: searches and writes use its own pair only; the job then deletes
  the tenant's documents from the group.

:class:`Placements` holds the rows; every process refreshes it from Postgres
every :data:`REFRESH_S` seconds, and the job waits long enough after each
step for every process to have seen it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["REFRESH_S", "Placed", "Placements", "own_alias"]

#: How often each process reads ``typesense_placements`` again.
REFRESH_S = 2.0


def own_alias(alias: str, tenant: str) -> str:
    """The alias of ``tenant``'s own collection pair beside the groups of
    ``alias``: ``<alias>_t<12 hex digits of a BLAKE2b hash of the tenant>``
    (a tenant's name may be 63 characters; the hash keeps the alias short)."""
    return f"{alias}_t{hashlib.blake2b(tenant.encode(), digest_size=6).hexdigest()}"


@dataclass(frozen=True)
class Placed:
    """Where one tenant is moved to, and how far the move is."""

    alias: str
    state: Literal["copying", "live"]


class Placements:
    """The tenants with a pair of their own (see the module); everyone else
    is in their group."""

    def __init__(self, placed: Mapping[str, Placed] | None = None) -> None:
        self._placed: dict[str, Placed] = dict(placed or {})

    def replace(self, placed: Mapping[str, Placed]) -> None:
        """Take ``placed`` as the whole truth (one assignment: a reader sees
        the old map or the new one)."""
        self._placed = dict(placed)

    def get(self, tenant: str) -> Placed | None:
        return self._placed.get(tenant)

    def all(self) -> dict[str, Placed]:
        return dict(self._placed)
