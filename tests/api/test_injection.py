"""Values that try injection, through the HTTP API against the real Postgres
and Typesense.

Tenant B holds, for every hostile value, a memory carrying it (as tag,
session id and, where it is a valid label, kind) with the words tenant A
searches for; tenant A holds the same. Every hostile recall of A, on each
source alone and fused, is then either refused with a 400 naming the field,
or answered with A's rows only, and the filter still means what it says: A's
memory carrying the value is found and nothing that does not match it.

Typesense's exact filter (``:=``) compares the tokens it indexed, not the
bytes: ASCII punctuation and whitespace are dropped from the tokens, so
``tenant-b`` and ``tenant-b\\n`` match each other there, and a value made only
of ASCII symbols (``*``, ``%``, ``\\``) has no token and matches nothing.
:func:`typesense_tokens` models that, so the test tells an escaping failure
apart from Typesense's own matching. The Typesense source checks the values
exactly on its hits, so every row returned matches as Postgres compares.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import psycopg
import pytest

from benchmarks.faults.ledger import Ledger, Scenario
from config import load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from service.schemas import FREE_LABEL_PATTERN, ID_PATTERN

from .conftest import AGENT_A, AGENT_B, Braid, make_app, serve

pytestmark = [pytest.mark.anyio, pytest.mark.faults]

#: Hostile values by class; each class is one ledger scenario.
CLASSES: dict[str, list[str]] = {
    "typesense filter_by syntax": [
        "x` || tenant:=`tenant-b",
        "` && tenant:=`tenant-b` && x:=`",
        "`",
        "a && tenant:!=x",
        "x || tenant:=tenant-b",
        "x:=y",
        "tenant:=[tenant-a,tenant-b]",
        "x] || id:=[*",
        "(tenant:tenant-b)",
        "a,b",
    ],
    "SQL quoting": [
        "' OR 1=1 --",
        '"; DROP TABLE memories; --',
        "x) OR (1=1",
        "'; SET braid.tenant = 'tenant-b'; --",
        "%(tenant)s",
        "%s",
        "$1",
    ],
    "wildcards and the other tenant's name": ["tenant-b", "*", "%", "_", ".*"],
    "backslashes, unicode and control characters": [
        "\\",
        "x\\",
        "\\`",
        "Zürich 🚀",
        "\u202e",
        "\u200b",
        "tenant-b\n",
        "\t",
    ],
}
VALUES = [v for values in CLASSES.values() for v in values]
SOURCE_SETS: list[list[str] | None] = [["typesense"], ["pgvector"], ["graph"], None]
FIELDS = ("tags", "kinds", "session_id", "query")
QUERY = "falcon launch password"
FREE_LABEL = f"Expected `str` matching regex {FREE_LABEL_PATTERN!r}"
LABEL = f"Expected `str` matching regex {ID_PATTERN!r}"
PLAIN = "(bravo) The Falcon launch password is kept by Alex."


def free_label_ok(value: str) -> bool:
    return re.search(FREE_LABEL_PATTERN, value) is not None


def label_ok(value: str) -> bool:
    return len(value) <= 64 and re.search(ID_PATTERN, value) is not None


def typesense_tokens(value: str) -> tuple[str, ...]:
    """What Typesense's exact string filter compares: the words, with ASCII
    characters other than letters and digits dropped."""
    words = ("".join(c for c in w if not c.isascii() or c.isalnum()) for w in value.split())
    return tuple(w for w in words if w)


def refusal(field_: str, value: str) -> str | None:
    """The 400 detail a recall with ``value`` in ``field_`` must get, or None."""
    if field_ == "query":
        return None  # a blank query runs as the `recent` strategy
    if field_ == "kinds":
        return None if label_ok(value) else f"kinds[0]: {LABEL}"
    where = "tags[0]" if field_ == "tags" else "session_id"
    return None if free_label_ok(value) else f"{where}: {FREE_LABEL}"


@dataclass
class Tally:
    requests: int = 0
    refused: int = 0
    answered: int = 0
    server_errors: int = 0
    leaks: int = 0
    #: Rows of A returned that do not match the filter.
    wrong_rows: int = 0
    #: Accepted filters whose matching memory of A was not returned.
    missed: int = 0
    degraded: int = 0
    notes: list[str] = field(default_factory=list)

    def outcome(self) -> str:
        return (
            f"refused 400 ({self.refused}) / escaped 200 ({self.answered}), "
            f"{self.leaks} foreign rows, {self.wrong_rows} rows outside the filter, "
            f"{self.missed} filtered memories missed, {self.degraded} degraded, "
            f"{self.server_errors} 5xx"
        )


@pytest.fixture
async def patient(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> AsyncIterator[Braid]:
    """The usual app with deadlines far above what a loaded 2-core machine
    needs, so a degraded answer means a refused search, not a slow one."""
    cfg = load_config()
    for name in cfg.sources:
        cfg = cfg.with_source(name, deadline_ms=30_000)
    app, dsn, alias = make_app(postgres, typesense, embedder, cfg)
    async with serve(app) as client:
        yield Braid(client=client, app=app, dsn=dsn, alias=alias)


async def send(
    braid: Braid, tally: Tally, method: str, path: str, body: Any = None, key: str = AGENT_A
) -> httpx.Response:
    """One request, counted; a 429 (the per-key rate limit) is waited out."""
    while True:
        r = await braid.client.request(method, path, json=body, headers=braid.headers(key))
        if r.status_code != 429:
            break
        await anyio.sleep(float(r.headers.get("Retry-After", "1")))
    tally.requests += 1
    if r.status_code >= 500:
        tally.server_errors += 1
        tally.notes.append(f"{method} {path} {body!r}: {r.status_code} {r.text[:200]}")
    return r


@dataclass
class World:
    #: (tenant, memory id) -> content, for every memory written.
    contents: dict[tuple[str, str], str]
    #: Relation fact id ("rel:<n>") -> tenant.
    facts: dict[str, str]
    #: A's memory id -> the hostile value it carries.
    value_of: dict[str, str]

    def ids(self, tenant: str) -> set[str]:
        return {m for t, m in self.contents if t == tenant}


async def seed(braid: Braid, tally: Tally) -> World:
    """Both tenants: the same graph, a plain memory, and one memory per
    hostile value the API takes as a tag."""
    contents: dict[tuple[str, str], str] = {}
    value_of: dict[str, str] = {}
    for key, tenant, mark in ((AGENT_A, "tenant-a", "alpha"), (AGENT_B, "tenant-b", "bravo")):
        graph = {
            "entities": [{"name": "Falcon"}, {"name": "Alex"}],
            "relations": [{"source": "Alex", "relation": "leads", "target": "Falcon"}],
        }
        r = await send(braid, tally, "POST", "/v1/graph", graph, key)
        assert r.status_code == 201, r.text
        memories: list[dict[str, Any]] = [
            {
                "id": f"{mark}-plain",
                "content": f"({mark}) The Falcon launch password is kept by Alex.",
                "entities": ["Falcon"],
                "tags": ["plain"],
                "session_id": "plain",
                "kind": "plain",
            }
        ]
        for i, value in enumerate(VALUES):
            if free_label_ok(value):
                memories.append(
                    {
                        "id": f"{mark}-{i}",
                        "content": f"({mark}) Falcon launch password number {i}.",
                        "entities": ["Falcon"],
                        "tags": [value],
                        "session_id": value,
                        "kind": value if label_ok(value) else "note",
                    }
                )
                if tenant == "tenant-a":
                    value_of[f"{mark}-{i}"] = value
        r = await send(braid, tally, "POST", "/v1/memories", {"memories": memories}, key)
        assert r.status_code == 201, r.text
        assert r.json()["ids"] == [m["id"] for m in memories]
        contents.update({(tenant, m["id"]): m["content"] for m in memories})
    await braid.synced(timeout=60)
    async with await psycopg.AsyncConnection.connect(braid.dsn) as conn:
        rows = await (await conn.execute("SELECT id, tenant FROM relations")).fetchall()
    return World(contents=contents, facts={f"rel:{i}": t for i, t in rows}, value_of=value_of)


def matches(world: World, item_id: str, field_: str, value: str, how: str) -> bool:
    """Whether A's row ``item_id`` matches a filter on ``field_`` = ``value``:
    ``exact`` as Postgres compares, ``typesense`` as Typesense's filter does,
    ``both`` (what the Typesense source returns: its filter's matches, checked
    exactly on the hits)."""
    if item_id in world.facts:
        return field_ == "kinds" and value == "fact" and how != "typesense"
    carried = world.value_of.get(item_id, "plain")
    if field_ == "kinds" and not label_ok(carried):
        carried = "note"
    exact = carried == value
    alike = typesense_tokens(carried) == typesense_tokens(value) != ()
    return {"exact": exact, "typesense": alike, "both": exact and alike}[how]


async def hostile_recall(
    braid: Braid, tally: Tally, world: World, field_: str, value: str, sources: list[str] | None
) -> None:
    body: dict[str, Any] = {"query": QUERY, "top_k": 100}
    if sources is not None:
        body["sources"] = sources
    if field_ == "query":
        body["query"] = value
    else:
        body[field_] = [value] if field_ in ("tags", "kinds") else value
    r = await send(braid, tally, "POST", "/v1/recall", body)
    expected = refusal(field_, value)
    where = f"{field_}={value!r} sources={sources}"
    if r.status_code == 400:
        tally.refused += 1
        if r.json()["detail"] != expected:
            tally.notes.append(f"{where}: 400 {r.json()['detail']!r}, expected {expected!r}")
        return
    if r.status_code != 200:
        tally.notes.append(f"{where}: {r.status_code} {r.text[:200]}")
        return
    tally.answered += 1
    out = r.json()
    if expected is not None:
        tally.notes.append(f"{where}: answered 200, expected 400 {expected!r}")
    if out["degraded"]:
        tally.degraded += 1
        tally.notes.append(f"{where}: degraded {[out['sources'][s]['error'] for s in out['degraded']]}")
    mine = world.ids("tenant-a")
    for item in out["items"]:
        if world.facts.get(item["id"], "tenant-a" if item["id"] in mine else "?") != "tenant-a" or (
            "bravo" in item["content"]
        ):
            tally.leaks += 1
            tally.notes.append(f"{where}: LEAK {item['id']} {item['content']!r}")
        elif field_ != "query" and not matches(world, item["id"], field_, value, "exact"):
            tally.wrong_rows += 1
            tally.notes.append(f"{where}: row outside the filter {item['id']}")
    if "bravo" in out["block"]:
        tally.leaks += 1
        tally.notes.append(f"{where}: LEAK in the block")
    if field_ == "query":
        return
    # The filter still works: A's memories matching it are all returned.
    returned = {item["id"] for item in out["items"]}
    # Typesense alone finds what its filter compares equal and is equal; with a
    # Postgres source, every exact one.
    how = "both" if sources == ["typesense"] else "exact"
    for memory_id in sorted(mine):
        if matches(world, memory_id, field_, value, how) and memory_id not in returned:
            tally.missed += 1
            tally.notes.append(f"{where}: {memory_id} not returned, got {sorted(returned)}")


async def check_intact(braid: Braid, world: World, tenant_a_rows: int | None = None) -> None:
    """Every table is there, B's rows are untouched in Postgres and in Typesense."""
    async with await psycopg.AsyncConnection.connect(braid.dsn) as conn:
        for table in ("memories", "entities", "relations", "mentions", "outbox"):
            cur = await conn.execute("SELECT to_regclass(%s)::text", (table,))
            assert await cur.fetchone() == (table,)
        cur = await conn.execute("SELECT tenant, count(*) FROM memories GROUP BY tenant ORDER BY tenant")
        a_rows = len(world.ids("tenant-a")) if tenant_a_rows is None else tenant_a_rows
        assert await cur.fetchall() == [
            ("tenant-a", a_rows),
            ("tenant-b", len(world.ids("tenant-b"))),
        ]
        cur = await conn.execute("SELECT id, content FROM memories WHERE tenant = 'tenant-b'")
        assert dict(await cur.fetchall()) == {m: c for (t, m), c in world.contents.items() if t == "tenant-b"}
    out = await braid.recall(QUERY, key=AGENT_B, top_k=100, sources=["typesense"])
    assert out["degraded"] == []
    got = {i["id"]: i["content"] for i in out["items"]}
    assert got == {m: c for (t, m), c in world.contents.items() if t == "tenant-b"}


@pytest.mark.parametrize("klass", list(CLASSES))
async def test_hostile_filters_stay_in_the_tenant(patient: Braid, ledger: Ledger, klass: str) -> None:
    braid = patient
    world = await seed(braid, Tally())
    tally = Tally()
    for value in CLASSES[klass]:
        for field_ in FIELDS:
            for sources in SOURCE_SETS:
                await hostile_recall(braid, tally, world, field_, value, sources)
    ledger.record(
        Scenario(
            name=f"filter injection: {klass}",
            kind="bad input",
            injected=len(CLASSES[klass]) * len(FIELDS) * len(SOURCE_SETS),
            load="tenant A recalls with each value in tags, kinds, session_id and as the query, "
            "per source and fused; tenant B holds a memory carrying every value",
            requests=tally.requests,
            errors=tally.refused,
            server_errors=tally.server_errors,
            leaks=tally.leaks,
            outcome=tally.outcome(),
        )
    )
    assert tally.notes == []
    assert tally.requests == tally.refused + tally.answered == len(CLASSES[klass]) * 16
    assert tally.refused > 0 and tally.answered > 0
    assert tally.server_errors == tally.leaks == tally.wrong_rows == tally.missed == tally.degraded == 0
    await check_intact(braid, world)


async def test_hostile_ids_on_write_and_delete(patient: Braid, ledger: Ledger) -> None:
    """Memory ids: refused unless made of label characters; an accepted id,
    even one of B's, names A's own memory on write and on delete."""
    braid = patient
    world = await seed(braid, Tally())
    tally = Tally()
    ids = [*VALUES, "bravo-plain", "bravo-3"]
    written: list[str] = []
    for i, value in enumerate(ids):
        memory = {"id": value, "content": f"(alpha) hostile id number {i}"}
        r = await send(braid, tally, "POST", "/v1/memories", {"memories": [memory]})
        if r.status_code == 201:
            tally.answered += 1
            written.append(value)
            if r.json()["ids"] != [value] or not label_ok(value):
                tally.notes.append(f"id {value!r}: 201 {r.json()}")
        else:
            tally.refused += 1
            refused_as_expected = r.status_code == 400 and not label_ok(value)
            if not refused_as_expected or r.json()["detail"] != f"memories[0].id: {LABEL}":
                tally.notes.append(f"id {value!r}: {r.status_code} {r.text[:200]}")
    await braid.synced(timeout=60)
    await check_intact(braid, world, tenant_a_rows=len(world.ids("tenant-a")) + len(written))
    out = await braid.recall("hostile id number", top_k=100, sources=["typesense"])
    for item in out["items"]:
        if "(alpha)" not in item["content"]:
            tally.leaks += 1
            tally.notes.append(f"LEAK {item}")
    found = {i["id"] for i in out["items"] if i["content"].startswith("(alpha) hostile id")}
    if found != set(written):
        tally.notes.append(f"hostile-id memories in Typesense: {sorted(found)}, written {written}")
    # Deleting by a hostile id (as a path segment): refused if it cannot be an
    # id, else it deletes A's memory of that id or nothing.
    not_found = refused_deletes = 0
    for value in ids:
        r = await send(braid, tally, "DELETE", f"/v1/memories/{quote(value, safe='')}")
        not_found += r.status_code == 404
        refused_deletes += r.status_code == 400
        if value in written:
            expected: tuple[int, Any] = (200, {"deleted": value})
        elif not label_ok(value):
            expected = (400, f"memory id {value!r} is not a valid id (letters, digits, _.:- up to 128)")
        else:
            expected = (404, f"no memory {value!r}")
        got = (r.status_code, r.json() if r.status_code == 200 else r.json()["detail"])
        if got != expected:
            tally.notes.append(f"DELETE {value!r}: {got}, expected {expected}")
    await braid.synced(timeout=60)
    ledger.record(
        Scenario(
            name="id injection: write and delete path",
            kind="bad input",
            injected=2 * len(ids),
            load="tenant A writes then deletes a memory under each hostile id and under two of B's ids",
            requests=tally.requests,
            errors=tally.refused + not_found + refused_deletes,
            server_errors=tally.server_errors,
            leaks=tally.leaks,
            outcome=f"write refused 400 ({tally.refused}) / accepted 201 ({tally.answered}), "
            f"delete 400 ({refused_deletes}) / 404 ({not_found}) / 200 ({len(ids) - not_found - refused_deletes}), "
            "B's rows untouched, "
            f"{tally.leaks} foreign rows, {tally.server_errors} 5xx",
        )
    )
    assert tally.notes == []
    assert set(written) == {v for v in ids if label_ok(v)} >= {"tenant-b", "bravo-plain", "bravo-3"}
    assert tally.server_errors == tally.leaks == 0
    await check_intact(braid, world)


NUL_CASES: list[tuple[str, str, str, Any]] = [
    ("recall tags", "POST", "/v1/recall", {"query": QUERY, "tags": ["a\x00b"]}),
    ("recall session_id", "POST", "/v1/recall", {"query": QUERY, "session_id": "\x00"}),
    ("write tags", "POST", "/v1/memories", {"memories": [{"content": "x", "tags": ["a\x00b"]}]}),
    (
        "write session_id",
        "POST",
        "/v1/memories",
        {"memories": [{"content": "x", "session_id": "\x00"}]},
    ),
    (
        "write entities",
        "POST",
        "/v1/memories",
        {"memories": [{"content": "x", "entities": ["a\x00"]}]},
    ),
    (
        "write metadata",
        "POST",
        "/v1/memories",
        {"memories": [{"content": "x", "metadata": {"k": "\x00"}}]},
    ),
    ("delete id", "DELETE", "/v1/memories/a%00b", None),
]


@pytest.mark.parametrize(
    ("what", "method", "path", "body"),
    [pytest.param(*case, id=case[0]) for case in NUL_CASES],
)
async def test_nul_is_refused_with_400(
    patient: Braid, ledger: Ledger, what: str, method: str, path: str, body: Any
) -> None:
    """Postgres text cannot hold a NUL: a request carrying one is the
    client's fault and gets a 400, never a 500 or a degraded answer."""
    braid = patient
    tally = Tally()
    r = await send(braid, tally, method, path, body)
    shown = r.json()["degraded"] if r.status_code == 200 else r.json()["detail"]
    ledger.record(
        Scenario(
            name=f"NUL character: {what}",
            kind="bad input",
            injected=1,
            requests=tally.requests,
            errors=int(r.status_code >= 400),
            server_errors=tally.server_errors,
            outcome=f"{r.status_code} {shown}",
        )
    )
    assert r.status_code == 400, (r.status_code, shown)
    assert tally.server_errors == 0
