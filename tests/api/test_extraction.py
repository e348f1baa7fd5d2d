"""Entity and relation extraction on write (``graph.extract``), through the API,
on the real Postgres and Typesense and spaCy's real model."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
import psycopg
import pytest

from config import BraidConfig, ConfigError, parse_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.extraction import Extraction, Extractors

from .conftest import ADMIN_A, Braid, FileConfigured, make_app, patient, serve
from .conftest import test_config as config_for
from .test_admin import wait_job

pytestmark = pytest.mark.anyio

LISBON = "Alex moved to Lisbon in May 2023 and joined Google."
OTHERS = ["The weather was grey all week.", "We ordered pizza for dinner.", "The train was late again."]


def extracting(cfg: BraidConfig, extract: str) -> BraidConfig:
    return msgspec.structs.replace(cfg, graph=msgspec.structs.replace(cfg.graph, extract=extract))


@pytest.fixture
async def plain(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> AsyncIterator[Braid]:
    """A Braid with the shipped defaults (``graph.extract: spacy``), patient deadlines."""
    app, dsn, alias = make_app(postgres, typesense, embedder, patient(config_for("unused")))
    async with serve(app) as client:
        yield Braid(client=client, app=app, dsn=dsn, alias=alias)


def rows(braid: Braid, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(braid.dsn) as conn:
        return conn.execute(sql, params).fetchall()


def entity_types(braid: Braid) -> dict[str, str | None]:
    return dict(rows(braid, "SELECT name, type FROM entities WHERE tenant = 'tenant-a'"))  # type: ignore[arg-type]


def derived(braid: Braid) -> dict[tuple[str, str, str], float]:
    found = rows(
        braid,
        "SELECT s.name, r.relation, t.name, r.weight FROM relations r"
        " JOIN entities s ON s.id = r.source_id JOIN entities t ON t.id = r.target_id"
        " WHERE r.tenant = 'tenant-a' AND r.derived",
    )
    return {(s, rel, t): w for s, rel, t, w in found}


async def test_a_plain_write_feeds_the_graph(plain: Braid) -> None:
    """No `entities` sent: the graph still finds the memory by what it names."""
    ids = await plain.remember({"content": LISBON, "id": "lisbon"}, *({"content": c} for c in OTHERS))
    assert ids[0] == "lisbon"
    types = entity_types(plain)
    assert {n: types[n] for n in ("Alex", "Lisbon", "May 2023", "Google")} == {
        "Alex": "person",
        "Lisbon": "place",
        "May 2023": "date",
        "Google": "organisation",
    }
    result = await plain.recall("Who works at Google?", sources=["graph"], top_k=5)
    assert result["degraded"] == []
    assert [i["id"] for i in result["items"]][:1] == ["lisbon"]
    # Extracted relations are walked, never shown as facts.
    assert [i for i in result["items"] if i["kind"] == "fact"] == []
    health = (await plain.client.get("/health")).json()["extraction"]
    assert (health["extractor"], health["memories"], health["failed"]) == ("spacy", 4, 0)


async def test_relation_weights_count_the_memories_that_state_them(plain: Braid) -> None:
    await plain.remember(
        {"content": "Sam flew from Porto to Berlin.", "id": "a"},
        {"content": "Sam says Porto is warmer than Berlin.", "id": "b"},
    )
    assert derived(plain)[("Berlin", "mentioned_with", "Porto")] == 2.0
    # Rewritten without Berlin: it no longer supports the relation.
    await plain.remember({"content": "Sam flew from Porto to Madrid.", "id": "a"})
    assert derived(plain)[("Berlin", "mentioned_with", "Porto")] == 1.0
    r = await plain.client.delete("/v1/memories/b", headers=plain.headers("agent-key-tenant-a-0123456789"))
    assert r.status_code == 200
    relations = derived(plain)
    assert relations[("Berlin", "mentioned_with", "Porto")] == 0.0
    assert relations[("Madrid", "mentioned_with", "Porto")] == 1.0
    # Nothing supports it any more: the walk from Berlin reaches only Berlin's own memories.
    assert rows(plain, "SELECT count(*) FROM relation_support WHERE memory_id = 'b'") == [(0,)]


async def test_a_swept_memory_takes_its_support_back(plain: Braid) -> None:
    await plain.remember(
        {"content": "Sam flew from Porto to Berlin.", "id": "kept"},
        {"content": "Sam flew from Porto to Berlin again.", "id": "gone", "expires_at": "2020-01-01T00:00:00Z"},
    )
    assert derived(plain)[("Berlin", "mentioned_with", "Porto")] == 2.0
    assert await plain.runtime.sweeper.sweep() == 1
    assert derived(plain)[("Berlin", "mentioned_with", "Porto")] == 1.0
    assert rows(plain, "SELECT memory_id FROM relation_support GROUP BY memory_id") == [("kept",)]


async def test_client_entities_merge_with_extracted_ones(plain: Braid) -> None:
    assert (await plain.post("/v1/graph", {"entities": [{"name": "Lisbon", "type": "city"}]})).status_code == 201
    await plain.remember({"content": LISBON, "id": "m", "entities": ["google", "Project Atlas", "ALEX"]})
    types = entity_types(plain)
    # The client's spelling is kept; a type the client gave stays; extracted types fill the rest.
    assert types["Lisbon"] == "city"
    assert types["google"] == "organisation"
    assert types["ALEX"] == "person"
    assert types["Project Atlas"] is None
    assert "Google" not in types and "Alex" not in types
    linked = rows(
        plain,
        "SELECT e.name FROM mentions mn JOIN entities e ON e.id = mn.entity_id WHERE mn.memory_id = 'm'",
    )
    assert sorted(n for (n,) in linked) == ["ALEX", "Lisbon", "May 2023", "Project Atlas", "google"]


async def test_speakers_are_not_extracted(plain: Braid) -> None:
    await plain.remember({"content": "Hi Caroline!", "speaker": "Melanie"})
    await plain.remember({"content": "Thanks, Melanie! I met Caroline in Paris.", "speaker": "Caroline"})
    names = set(entity_types(plain))
    assert "Paris" in names
    assert not names & {"Melanie", "Caroline"}


async def test_extract_none_extracts_nothing(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    cfg = extracting(patient(config_for("unused")), "none")
    app, dsn, alias = make_app(postgres, typesense, embedder, cfg)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        await braid.remember({"content": LISBON, "entities": ["Alex"]})
        assert entity_types(braid) == {"Alex": None}
        assert rows(braid, "SELECT count(*) FROM relations") == [(0,)]
        health = (await client.get("/health")).json()["extraction"]
        assert (health["extractor"], health["memories"]) == ("none", 0)
        # A graph reindex needs an extractor.
        r = await braid.post("/admin/reindex", {"target": "graph"}, key=ADMIN_A)
        assert (r.status_code, r.json()["detail"]) == (
            400,
            "target graph extracts with graph.extract, which is `none`; set an extractor (`spacy`)",
        )


class Failing:
    name = "failing"

    def __init__(self) -> None:
        self.calls = 0

    async def extract(
        self, texts: Sequence[str], *, skip: frozenset[str] = frozenset(), max_entities: int = 16
    ) -> list[Extraction]:
        self.calls += 1
        raise RuntimeError("model exploded")

    def load(self) -> None:
        pass

    def close(self) -> None:
        pass


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def test_a_failing_extractor_does_not_lose_the_write(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    """The write lands with the client's entities; the failure is logged and
    counted; a graph reindex can extract later."""
    failing = Failing()
    kept = Kept()
    app, dsn, alias = make_app(postgres, typesense, embedder, patient(config_for("unused")))
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        braid.runtime.engine.extractors = Extractors({"spacy": lambda: failing})
        logging.getLogger("braid").addHandler(kept)
        try:
            ids = await braid.remember({"content": LISBON, "id": "kept", "entities": ["Alex"]}, {"content": OTHERS[0]})
        finally:
            logging.getLogger("braid").removeHandler(kept)
        assert ids[0] == "kept" and failing.calls == 1
        assert rows(braid, "SELECT content FROM memories WHERE id = 'kept'") == [(LISBON,)]
        assert entity_types(braid) == {"Alex": None}
        assert (
            "entity extraction (spacy) failed, 2 memories stored with the client's entities only: model exploded"
            in kept.messages
        )
        health = (await client.get("/health")).json()["extraction"]
        assert (health["memories"], health["failed"]) == (0, 2)
        result = await braid.recall("Alex", sources=["graph"])
        assert [i["id"] for i in result["items"]] == ["kept"]


async def test_reindex_graph_extracts_stored_memories_again(configured: FileConfigured) -> None:
    braid = configured.braid
    configured.write("graph: {extract: none}\n")
    assert (await configured.reload()).status_code == 200
    await braid.remember({"content": LISBON, "id": "m", "entities": ["Project Atlas"]}, {"content": OTHERS[1]})
    assert set(entity_types(braid)) == {"Project Atlas"}

    configured.write("graph: {extract: spacy}\n")
    assert (await configured.reload()).status_code == 200
    r = await braid.post("/admin/reindex", {"target": "graph"}, key=ADMIN_A)
    assert r.status_code == 202, r.text
    job = await wait_job(braid, r.json()["job_id"])
    assert job["status"] == "done", job
    progress = job["progress"]["graph"]
    assert (progress["extractor"], progress["done"], progress["total"]) == ("spacy", 2, 2)
    types = entity_types(braid)
    # The client's link stays; the extracted entities are added.
    assert types["Project Atlas"] is None and types["Google"] == "organisation"
    assert derived(braid)[("Alex", "move_to", "Lisbon")] == 1.0
    # Re-extracting again changes no weight: a memory supports a relation once.
    r = await braid.post("/admin/reindex", {"target": "graph"}, key=ADMIN_A)
    assert (await wait_job(braid, r.json()["job_id"]))["status"] == "done"
    assert derived(braid)[("Alex", "move_to", "Lisbon")] == 1.0
    r = await braid.post("/admin/reindex", {"target": "graph", "tier": "session"}, key=ADMIN_A)
    assert (r.status_code, r.json()["detail"]) == (
        400,
        "tier applies to pgvector indexes; a graph job extracts from every memory",
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("graph: {extract: spacey}", "Invalid enum value 'spacey' - at `$.graph.extract`"),
        ("graph: {extractMaxEntities: 0}", "Expected `int` >= 1 - at `$.graph.extractMaxEntities`"),
        ("graph: {extractMaxEntities: 65}", "Expected `int` <= 64 - at `$.graph.extractMaxEntities`"),
    ],
)
def test_config_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="braid.yaml")
    assert str(info.value) == f"braid.yaml: {message}"


async def test_a_name_another_tenant_used_is_not_embedded_again(plain: Braid) -> None:
    """Entity vectors are cached by text across tenants: tenant B's "Lisbon"
    costs no embedding, and is stored with the vector A's "Lisbon" got."""
    from .conftest import AGENT_B

    names = plain.runtime.engine.names
    await plain.remember({"content": LISBON})
    hits, misses = names.hits, names.misses
    assert misses >= 3  # Alex, Lisbon, Google, ... embedded for tenant A
    await plain.remember({"content": LISBON}, key=AGENT_B)
    assert names.misses == misses  # every name of B's write was cached
    assert names.hits >= hits + 3
    vectors = dict(
        rows(plain, "SELECT tenant, embedding::text FROM entities WHERE name = 'Lisbon' ORDER BY tenant")  # type: ignore[arg-type]
    )
    assert set(vectors) == {"tenant-a", "tenant-b"}
    assert vectors["tenant-a"] == vectors["tenant-b"]
    # What the cache gives is the model's vector of the text.
    embedder = plain.runtime.embedder
    (direct,) = await embedder.embed(["Lisbon"])
    (cached,) = await names.embed(embedder, ["Lisbon"])
    assert names.misses == misses
    assert cached == pytest.approx(direct, abs=1e-6)
