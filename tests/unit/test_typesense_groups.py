"""Which collection group a tenant's memories live in (typesense.groups)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from indexers.typesense.documents import group_alias


def test_one_group_is_the_collection_itself() -> None:
    assert group_alias("braid_memories", "acme", 1) == "braid_memories"


def test_a_tenants_group_is_the_same_in_every_process_and_release() -> None:
    # Pinned: a changed hash would put tenants in groups that do not hold
    # their memories until a reindex.
    assert group_alias("braid_memories", "acme", 16) == "braid_memories_g1"
    assert group_alias("braid_memories", "default", 16) == "braid_memories_g2"
    assert group_alias("m", "tenant-a", 3) == "m_g1"
    assert group_alias("m", "tenant-b", 3) == "m_g2"


def test_tenants_spread_over_every_group() -> None:
    counts = Counter(group_alias("m", f"tenant-{i}", 8) for i in range(4000))
    assert sorted(counts) == [f"m_g{i}" for i in range(8)]
    assert min(counts.values()) > 400 and max(counts.values()) < 600


def test_groups_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="groups must be >= 1, got 0"):
        group_alias("m", "acme", 0)


@pytest.mark.anyio
async def test_a_moved_tenant_is_written_to_both_while_copying_and_read_from_its_own_once_live() -> None:
    from indexers.typesense import TypesenseClient, TypesenseGroups
    from indexers.typesense.placement import Placed, Placements, own_alias

    placements = Placements()
    client = TypesenseClient(["http://127.0.0.1:9"], "unused")  # never called here
    groups = TypesenseGroups(client, "m", 4, groups=3, placements=placements)
    own = own_alias("m", "tenant-a")
    assert re.fullmatch(r"m_t[0-9a-f]{12}", own) and own != own_alias("m", "tenant-b")
    assert groups.alias_of("tenant-a") == "m_g1" and groups.write_aliases("tenant-a") == ["m_g1"]
    assert groups.aliases() == ["m_g0", "m_g1", "m_g2"]

    placements.replace({"tenant-a": Placed(own, "copying")})
    assert groups.alias_of("tenant-a") == "m_g1"
    assert groups.write_aliases("tenant-a") == ["m_g1", own]
    assert groups.aliases() == ["m_g0", "m_g1", "m_g2", own]

    placements.replace({"tenant-a": Placed(own, "live")})
    assert groups.alias_of("tenant-a") == own and groups.of("tenant-a").alias == own
    assert groups.write_aliases("tenant-a") == [own]
    assert groups.group_of("tenant-a") == "m_g1"
    assert groups.alias_of("tenant-b") == "m_g2"
    await client.aclose()
