"""The entity graph source against the real embedded Postgres.

One database for the module; each scenario lives in its own tenant. Entity
and memory embeddings come from the real MiniLM model (384-d). Expected
scores follow from closed forms of personalized PageRank on small graphs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from psycopg_pool import AsyncConnectionPool

from config import BraidConfig, load_config
from indexers.base import Filters, Hit, SearchQuery
from indexers.embedding import MiniLMEmbedder
from indexers.graph import GraphSource, fact_sentence, personalized_pagerank
from indexers.postgres import EntityInput, MemoryInput, PostgresStore, RelationInput

pytestmark = pytest.mark.anyio

D = 0.85  # graph.damping in braid.yaml
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
ALEX_LIKES = "What does Alex like?"


# --- closed forms of PPR (undirected, unit weights) -----------------------------


def ppr_path_from_end(d: float = D) -> tuple[float, float, float]:
    """Path a - b - c, restart at a: (p_a, p_b, p_c)."""
    c = d * d / 2
    pa = (1 - d) * (1 - c) / (1 - 2 * c)
    pb = d * pa / (1 - c)
    return pa, pb, d * pb / 2


def ppr_path_from_middle(d: float = D) -> tuple[float, float, float]:
    """Path a - b - c, restart at b: (p_a, p_b, p_c)."""
    pb = 1 / (1 + d)
    return d * pb / 2, pb, d * pb / 2


def ppr_edge(d: float = D) -> tuple[float, float]:
    """a - b, restart at a."""
    return 1 / (1 + d), d / (1 + d)


# --- pure helpers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "relation", "target", "sentence"),
    [
        ("Alex", "prefers", "TypeScript", "Alex prefers TypeScript."),
        ("TypeScript", "compiles_to", "JavaScript", "TypeScript compiles to JavaScript."),
        ("Ada", "  is__part_of ", "Team Blue", "Ada is part of Team Blue."),
    ],
)
def test_fact_sentence(source: str, relation: str, target: str, sentence: str) -> None:
    assert fact_sentence(source, relation, target) == sentence


def test_ppr_single_seed_without_edges_keeps_everything() -> None:
    assert personalized_pagerank([], {7: 1.0}, damping=D) == {7: 1.0}


def test_ppr_isolated_seeds_keep_their_share() -> None:
    ppr = personalized_pagerank([], {1: 3.0, 2: 1.0}, damping=D)
    assert ppr == pytest.approx({1: 0.75, 2: 0.25}, abs=1e-9)


def test_ppr_no_seed_weight_means_no_scores() -> None:
    assert personalized_pagerank([(1, 2, 1.0)], {1: 0.0}, damping=D) == {}


def test_ppr_one_edge() -> None:
    a, b = ppr_edge()
    assert personalized_pagerank([(1, 2, 1.0)], {1: 1.0}, damping=D) == pytest.approx({1: a, 2: b}, abs=1e-6)


def test_ppr_path_from_each_end_and_the_middle() -> None:
    edges = [(1, 2, 1.0), (2, 3, 1.0)]
    pa, pb, pc = ppr_path_from_end()
    assert personalized_pagerank(edges, {1: 1.0}, damping=D) == pytest.approx({1: pa, 2: pb, 3: pc}, abs=1e-6)
    pa, pb, pc = ppr_path_from_middle()
    assert personalized_pagerank(edges, {2: 0.4}, damping=D) == pytest.approx({1: pa, 2: pb, 3: pc}, abs=1e-6)


def test_ppr_weights_split_the_walk_and_parallel_edges_add_up() -> None:
    # Star 1 -> {2 (w 1), 3 (w 3)}, the 1-3 weight given as two relations
    # (one in each direction): p1 = 1/(1+d), the rest is split 1:3.
    ppr = personalized_pagerank([(1, 2, 1.0), (1, 3, 1.0), (3, 1, 2.0)], {1: 1.0}, damping=D)
    assert ppr == pytest.approx({1: 1 / (1 + D), 2: D / (4 * (1 + D)), 3: 3 * D / (4 * (1 + D))}, abs=1e-6)


# --- fixtures ----------------------------------------------------------------


def graph_config(**changes: Any) -> BraidConfig:
    cfg = load_config()
    return msgspec.structs.replace(cfg, graph=msgspec.structs.replace(cfg.graph, **changes))


#: Name seeding only: no entity is 0.99-similar to a question.
NAMES_ONLY = graph_config(seed_min_similarity=0.99)


class Writer:
    def __init__(self, store: PostgresStore, embedder: Any) -> None:
        self.store = store
        self.embedder = embedder

    async def graph(self, tenant: str, names: list[str], relations: list[RelationInput]) -> None:
        vectors = await self.embedder.embed(names)
        entities = [EntityInput(name=n, embedding=v, model=self.embedder.model) for n, v in zip(names, vectors)]
        await self.store.write_graph(tenant, entities, relations)

    async def memories(self, tenant: str, *rows: dict[str, Any]) -> None:
        vectors = await self.embedder.embed([r["content"] for r in rows])
        await self.store.write_memories(
            tenant,
            [
                MemoryInput(
                    **{"kind": "note", "tier": "session", "created_at": T0, **r},
                    embedding=v,
                    model=self.embedder.model,
                )
                for r, v in zip(rows, vectors)
            ],
        )


@pytest.fixture(scope="module")
async def graph(pool: AsyncConnectionPool, embedder: Any) -> dict[str, dict[str, int]]:
    """Tenants: `ga` (the main graph), `gb` (same names), `gv` (validity),
    `gp` (names with punctuation).

    Returns each tenant's relation ids by fact sentence.
    """
    w = Writer(PostgresStore(pool), embedder)
    now = datetime.now(UTC)
    await w.graph(
        "ga",
        ["Alex", "TypeScript", "JavaScript", "Bob", "Rust"],
        [
            RelationInput("Alex", "prefers", "TypeScript"),
            RelationInput("TypeScript", "compiles_to", "JavaScript"),
            RelationInput("Bob", "likes", "Rust"),
        ],
    )
    await w.memories(
        "ga",
        # Linked only by its explicit entity: the text names nothing.
        {
            "id": "ga-ts",
            "content": "The web client was rewritten last spring.",
            "entities": ("TypeScript",),
            "tags": ("frontend",),
        },
        # Linked by name: the text says JavaScript.
        {"id": "ga-js", "content": "Browsers only run JavaScript natively.", "kind": "preference", "confidence": 0.4},
        {"id": "ga-rust", "content": "Bob rewrote the parser in Rust."},
        {"id": "ga-none", "content": "Lunch is at noon."},
    )
    await w.graph(
        "gb",
        ["Alex", "TypeScript", "Haskell"],
        [
            RelationInput("Alex", "prefers", "TypeScript"),
            RelationInput("Alex", "prefers", "Haskell"),
        ],
    )
    await w.memories("gb", {"id": "gb-ts", "content": "TypeScript everywhere.", "entities": ("TypeScript",)})
    await w.graph(
        "gv",
        ["Alex", "Java", "Go", "Python"],
        [
            RelationInput("Alex", "uses", "Java", valid_to=now - timedelta(days=1)),
            RelationInput("Alex", "will_learn", "Go", valid_from=now + timedelta(days=1)),
            RelationInput(
                "Alex",
                "knows",
                "Python",
                valid_from=now - timedelta(days=10),
                valid_to=now + timedelta(days=10),
            ),
        ],
    )
    await w.memories(
        "gv",
        {"id": "gv-java", "content": "Java was the old stack."},
        {"id": "gv-python", "content": "Python scripts crunch the data."},
    )
    await w.graph("gp", ["Ada", "C++", "Node.js"], [RelationInput("Ada", "writes", "C++")])
    await w.memories("gp", {"id": "gp-node", "content": "The API server runs on Node.js."})
    out: dict[str, dict[str, int]] = {}
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT r.tenant, s.name, r.relation, t.name, r.id FROM relations r"
            " JOIN entities s ON s.id = r.source_id JOIN entities t ON t.id = r.target_id"
        )
        for tenant, s, rel, t, rid in await cur.fetchall():
            out.setdefault(tenant, {})[fact_sentence(s, rel, t)] = rid
    return out


async def search(
    pool: AsyncConnectionPool,
    cfg: BraidConfig,
    tenant: str,
    text: str,
    *,
    vector: tuple[float, ...] | None = None,
    limit: int = 20,
    **kw: Any,
) -> list[Hit]:
    kw.setdefault("model", MiniLMEmbedder.model)
    q = SearchQuery(tenant=tenant, text=text, vector=vector, limit=limit, **kw)
    return await GraphSource(pool, lambda: cfg).search(q)


def what(hit: Hit) -> str:
    """A relation rendered as a sentence has an id starting ``rel:``."""
    return "fact" if hit.id.startswith("rel:") else "memory"


def summary(hits: list[Hit]) -> list[tuple[str, str]]:
    return [(what(h), h.content) for h in hits]


# --- walking the graph -------------------------------------------------------


async def test_named_entity_seeds_a_two_hop_walk(
    pool: AsyncConnectionPool, graph: dict[str, dict[str, int]], embedder: Any
) -> None:
    vector = await embedder.embed_query(ALEX_LIKES)
    hits = await search(pool, NAMES_ONLY, "ga", ALEX_LIKES, vector=vector)
    pa, pt, pj = ppr_path_from_end()  # Alex - TypeScript - JavaScript, restart at Alex
    assert [(what(h), h.id, h.content) for h in hits] == [
        ("fact", f"rel:{graph['ga']['Alex prefers TypeScript.']}", "Alex prefers TypeScript."),
        ("fact", f"rel:{graph['ga']['TypeScript compiles to JavaScript.']}", "TypeScript compiles to JavaScript."),
        ("memory", "ga-ts", "The web client was rewritten last spring."),
        ("memory", "ga-js", "Browsers only run JavaScript natively."),
    ]
    assert [h.score for h in hits] == pytest.approx([pa + pt, pt + pj, pt, pj], abs=1e-5)
    fact = hits[0]
    assert (fact.kind, fact.tier, fact.confidence) == ("fact", "entities", 1.0)
    assert fact.created_at > T0  # a relation without valid_from dates from its insert
    memory = hits[2]
    assert (memory.kind, memory.tier, memory.created_at) == ("note", "session", T0)
    assert hits[3].confidence == pytest.approx(0.4)


async def test_limit_cuts_the_merged_list(pool: AsyncConnectionPool, graph: dict[str, dict[str, int]]) -> None:
    hits = await search(pool, NAMES_ONLY, "ga", ALEX_LIKES, limit=2)
    assert summary(hits) == [
        ("fact", "Alex prefers TypeScript."),
        ("fact", "TypeScript compiles to JavaScript."),
    ]


@pytest.mark.parametrize(
    ("hops", "expected"),
    [
        (0, []),
        (
            1,
            [("fact", "Alex prefers TypeScript."), ("memory", "The web client was rewritten last spring.")],
        ),
        (
            2,
            [
                ("fact", "Alex prefers TypeScript."),
                ("fact", "TypeScript compiles to JavaScript."),
                ("memory", "The web client was rewritten last spring."),
                ("memory", "Browsers only run JavaScript natively."),
            ],
        ),
    ],
)
async def test_max_hops_bounds_the_walk(
    pool: AsyncConnectionPool,
    graph: dict[str, dict[str, int]],
    hops: int,
    expected: list[tuple[str, str]],
) -> None:
    cfg = graph_config(seed_min_similarity=0.99, max_hops=hops)
    hits = await search(pool, cfg, "ga", ALEX_LIKES)
    assert summary(hits) == expected
    if hops == 1:
        pa, pt = ppr_edge()
        assert [h.score for h in hits] == pytest.approx([pa + pt, pt], abs=1e-5)


async def test_a_recalls_hops_override_the_configs(pool: AsyncConnectionPool, graph: dict[str, dict[str, int]]) -> None:
    cfg = graph_config(seed_min_similarity=0.99, max_hops=2)
    for hops in (0, 1, 2):
        assert summary(await search(pool, cfg, "ga", ALEX_LIKES, hops=hops)) == summary(
            await search(pool, graph_config(seed_min_similarity=0.99, max_hops=hops), "ga", ALEX_LIKES)
        )
    assert summary(await search(pool, cfg, "ga", ALEX_LIKES, hops=0)) != summary(
        await search(pool, cfg, "ga", ALEX_LIKES)
    )


async def test_max_edges_keeps_the_heaviest_relations_first(
    pool: AsyncConnectionPool, graph: dict[str, dict[str, int]]
) -> None:
    # Equal weights: the earlier relation wins; the walk still reached
    # JavaScript, but without its edge it has no score and no fact.
    cfg = graph_config(seed_min_similarity=0.99, max_edges=1)
    hits = await search(pool, cfg, "ga", ALEX_LIKES)
    assert summary(hits) == [
        ("fact", "Alex prefers TypeScript."),
        ("memory", "The web client was rewritten last spring."),
    ]


async def test_a_fanout_above_every_degree_walks_as_without_one(
    pool: AsyncConnectionPool, graph: dict[str, dict[str, int]]
) -> None:
    # On `ga` every relation between reached entities is one the walk goes
    # through, so the bounded statement reads the same relations.
    for hops in (0, 1, 2, 3):
        unbounded = await search(pool, graph_config(seed_min_similarity=0.99, max_hops=hops), "ga", ALEX_LIKES)
        bounded = await search(pool, graph_config(seed_min_similarity=0.99, max_hops=hops, fanout=50), "ga", ALEX_LIKES)
        assert summary(bounded) == summary(unbounded), hops
        assert [h.score for h in bounded] == pytest.approx([h.score for h in unbounded], abs=1e-9), hops


async def test_fanout_walks_a_hub_through_its_heaviest_relations_only(pool: AsyncConnectionPool, embedder: Any) -> None:
    # Grace is a hub: five relations of weights 1..5; Mars (behind her lightest)
    # links on to Venus, and two of her neighbours know each other.
    w = Writer(PostgresStore(pool), embedder)
    planets = ["Mercury", "Mars", "Jupiter", "Saturn", "Neptune"]
    await w.graph(
        "gh",
        ["Grace", *planets, "Venus"],
        [
            *(RelationInput("Grace", "studies", p, weight=float(i + 1)) for i, p in enumerate(planets)),
            RelationInput("Mars", "orbits_near", "Venus", weight=9.0),
            RelationInput("Saturn", "outshines", "Mercury", weight=6.0),
        ],
    )
    question = "What does Grace study?"
    unbounded = summary(await search(pool, NAMES_ONLY, "gh", question))
    assert ("fact", "Grace studies Mercury.") in unbounded
    assert ("fact", "Mars orbits near Venus.") in unbounded  # two hops, through her lightest relation
    bounded = summary(await search(pool, graph_config(seed_min_similarity=0.99, fanout=2), "gh", question))
    # Her two heaviest: Neptune (5) and Saturn (4); from them on, their own two
    # heaviest (Saturn's lead back to Grace and to Mercury): Mars, Jupiter and
    # Venus are never reached, Mercury only through Saturn.
    assert bounded[:2] == [("fact", "Grace studies Neptune."), ("fact", "Grace studies Saturn.")]
    facts = {content for kind, content in bounded if kind == "fact"}
    assert facts == {"Grace studies Neptune.", "Grace studies Saturn.", "Saturn outshines Mercury."}
    assert {"Grace studies Mars.", "Grace studies Jupiter.", "Saturn outshines Mercury."} <= set(
        c for _, c in unbounded
    )
    one_hop = summary(await search(pool, graph_config(seed_min_similarity=0.99, fanout=2, max_hops=1), "gh", question))
    assert {c for k, c in one_hop if k == "fact"} == {"Grace studies Neptune.", "Grace studies Saturn."}
    # A third hop walks on from Mercury (first reached at the second) through
    # its two heaviest: back to Saturn, and to Grace by her lightest relation.
    three = summary(await search(pool, graph_config(seed_min_similarity=0.99, fanout=2, max_hops=3), "gh", question))
    assert {c for k, c in three if k == "fact"} == facts | {"Grace studies Mercury."}
    # No hop: the relations among the seeds only, bounded or not.
    for fanout in (0, 2):
        cfg = graph_config(seed_min_similarity=0.99, fanout=fanout, max_hops=0)
        seeds_only = summary(await search(pool, cfg, "gh", "Did Grace study Saturn?"))
        assert {c for k, c in seeds_only if k == "fact"} == {"Grace studies Saturn."}, fanout


async def test_relations_outside_their_validity_window_are_skipped(
    pool: AsyncConnectionPool, graph: dict[str, dict[str, int]]
) -> None:
    hits = await search(pool, NAMES_ONLY, "gv", "What does Alex know?")
    assert summary(hits) == [
        ("fact", "Alex knows Python."),
        ("memory", "Python scripts crunch the data."),
    ]
    # The fact is dated by its valid_from.
    assert hits[0].created_at < datetime.now(UTC) - timedelta(days=9)


async def test_tenants_never_see_each_others_graph(pool: AsyncConnectionPool, graph: dict[str, dict[str, int]]) -> None:
    b_ids = {f"rel:{rid}" for rid in graph["gb"].values()} | {"gb-ts"}
    a_hits = await search(pool, NAMES_ONLY, "ga", ALEX_LIKES)
    assert a_hits and not {h.id for h in a_hits} & b_ids
    assert "Alex prefers Haskell." not in {h.content for h in a_hits}

    b_hits = await search(pool, NAMES_ONLY, "gb", ALEX_LIKES)
    assert {h.id for h in b_hits} == b_ids
    assert await search(pool, NAMES_ONLY, "nobody", ALEX_LIKES) == []


async def test_names_with_punctuation_seed_the_walk(
    pool: AsyncConnectionPool, graph: dict[str, dict[str, int]]
) -> None:
    hits = await search(pool, NAMES_ONLY, "gp", "Who writes C++?")
    assert summary(hits) == [("fact", "Ada writes C++.")]
    # A seed without relations keeps all its rank for the memories naming it.
    hits = await search(pool, NAMES_ONLY, "gp", "Does anyone use Node.js?")
    assert [(h.id, h.score) for h in hits] == [("gp-node", pytest.approx(1.0))]


# --- vector seeding ----------------------------------------------------------


async def test_vector_seeds_an_entity_the_text_does_not_name(
    pool: AsyncConnectionPool, graph: dict[str, dict[str, int]], embedder: Any
) -> None:
    typescript = await embedder.embed_query("TypeScript")
    cfg = graph_config(seed_min_similarity=0.99, seed_limit=5)
    hits = await search(pool, cfg, "ga", "tell me about it", vector=typescript)
    pa, pt, pj = ppr_path_from_middle()  # restart at TypeScript
    facts = {
        f"rel:{graph['ga']['Alex prefers TypeScript.']}": pa + pt,
        f"rel:{graph['ga']['TypeScript compiles to JavaScript.']}": pt + pj,
    }
    # The two facts tie (a and c are symmetric), so their order is not asserted.
    assert {h.id: h.score for h in hits[:2]} == pytest.approx(facts, abs=1e-5)
    assert [(h.id, h.score) for h in hits[2:]] == [
        ("ga-ts", pytest.approx(pt, abs=1e-5)),
        ("ga-js", pytest.approx(pj, abs=1e-5)),
    ]
    # Without vector seeds, nothing in that text names an entity.
    assert await search(pool, graph_config(seed_limit=0), "ga", "tell me about it", vector=typescript) == []
    assert await search(pool, cfg, "ga", "tell me about it", vector=None) == []


async def test_vector_seeds_follow_meaning_above_the_threshold(
    pool: AsyncConnectionPool, graph: dict[str, dict[str, int]], embedder: Any
) -> None:
    rust = await embedder.embed_query("the Rust programming language")
    hits = await search(pool, graph_config(seed_min_similarity=0.5), "ga", "tell me about it", vector=rust)
    assert ("fact", "Bob likes Rust.") in summary(hits)
    assert "ga-rust" in {h.id for h in hits}
    assert "ga-none" not in {h.id for h in hits}
    # The named-seed question never reaches Bob when vectors must be near-exact.
    alex = await embedder.embed_query(ALEX_LIKES)
    hits = await search(pool, NAMES_ONLY, "ga", ALEX_LIKES, vector=alex)
    assert not {"Bob likes Rust.", "Bob rewrote the parser in Rust."} & {h.content for h in hits}


# --- filters -----------------------------------------------------------------


FACTS = [("fact", "Alex prefers TypeScript."), ("fact", "TypeScript compiles to JavaScript.")]
TS_MEMORY = ("memory", "The web client was rewritten last spring.")
JS_MEMORY = ("memory", "Browsers only run JavaScript natively.")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"filters": Filters(kinds=("note",))}, [TS_MEMORY]),
        ({"filters": Filters(kinds=("note", "preference"))}, [TS_MEMORY, JS_MEMORY]),
        ({"filters": Filters(kinds=("fact",))}, FACTS),
        ({"filters": Filters(tags=("frontend",))}, [TS_MEMORY]),
        ({"filters": Filters(session_id="s1")}, []),
        ({"filters": Filters(tiers=("session",))}, [TS_MEMORY, JS_MEMORY]),
        ({"filters": Filters(tiers=("entities",))}, FACTS),
        ({"filters": Filters(created_before=T0 + timedelta(days=1))}, [TS_MEMORY, JS_MEMORY]),
        ({"filters": Filters(created_after=T0 + timedelta(days=1))}, FACTS),
        ({"min_confidence": 0.5}, [*FACTS, TS_MEMORY]),
    ],
)
async def test_filters(
    pool: AsyncConnectionPool,
    graph: dict[str, dict[str, int]],
    fields: dict[str, Any],
    expected: list[tuple[str, str]],
) -> None:
    hits = await search(pool, NAMES_ONLY, "ga", ALEX_LIKES, **fields)
    assert summary(hits) == expected


async def test_an_entity_splits_its_score_among_the_memories_naming_it(
    pool: AsyncConnectionPool, embedder: Any
) -> None:
    """No relations: each seed keeps its PPR share (1/2 each here), and hands
    it to the memories that mention it, split evenly."""
    w = Writer(PostgresStore(pool), embedder)
    await w.graph("gs", ["coffee", "espresso"], [])
    await w.memories(
        "gs",
        *({"id": f"gs-c{i}", "content": f"Coffee note {i}."} for i in range(4)),
        {"id": "gs-e", "content": "An espresso at noon."},
        {"id": "gs-both", "content": "Espresso is coffee too.", "tags": ("x",)},
    )
    hits = await search(pool, NAMES_ONLY, "gs", "coffee espresso")
    scores = {h.id: h.score for h in hits}
    assert scores == pytest.approx(
        {"gs-both": 0.5 / 5 + 0.5 / 2, "gs-e": 0.5 / 2, **{f"gs-c{i}": 0.5 / 5 for i in range(4)}}
    )
    assert [h.id for h in hits][:2] == ["gs-both", "gs-e"]


async def test_a_hub_over_the_cap_hands_its_share_to_its_newest_memories_only(
    pool: AsyncConnectionPool, embedder: Any
) -> None:
    """The share still divides by the entity's full count (5 here), but only
    ``mentionsPerEntity`` of its memories, the newest (of those matching the
    request's filters, if it has any), are read."""
    w = Writer(PostgresStore(pool), embedder)
    await w.graph("gh", ["tea", "mug"], [])
    await w.memories(
        "gh",
        *({"id": f"gh-t{i}", "content": f"Tea note {i}.", "created_at": T0 + timedelta(days=i)} for i in range(4)),
        # The oldest tea memory also names the mug.
        {"id": "gh-both", "content": "Tea in the mug.", "created_at": T0 - timedelta(days=1)},
    )
    uncapped = await search(pool, NAMES_ONLY, "gh", "tea")
    assert {h.id: h.score for h in uncapped} == pytest.approx(
        {**{f"gh-t{i}": 1 / 5 for i in range(4)}, "gh-both": 1 / 5}
    )
    capped = graph_config(seed_min_similarity=0.99, mentions_per_entity=2)
    hits = await search(pool, capped, "gh", "tea")
    assert [(h.id, h.score) for h in hits] == [  # ties go by id
        ("gh-t2", pytest.approx(1 / 5)),
        ("gh-t3", pytest.approx(1 / 5)),
    ]
    # Two seeds (1/2 each): the mug's only memory is read, but the tea's share
    # of it is not (it is not among the two newest tea memories).
    hits = await search(pool, capped, "gh", "tea mug")
    assert [(h.id, h.score) for h in hits] == [
        ("gh-both", pytest.approx(0.5 / 1)),
        ("gh-t2", pytest.approx(0.5 / 5)),
        ("gh-t3", pytest.approx(0.5 / 5)),
    ]
    # A request filter applies inside the cap: the newest *matching* tea
    # memories are read (gh-t1, gh-t0; gh-both is older), each still 1/5.
    hits = await search(pool, capped, "gh", "tea", filters=Filters(created_before=T0 + timedelta(days=1)))
    assert [(h.id, h.score) for h in hits] == [
        ("gh-t0", pytest.approx(1 / 5)),
        ("gh-t1", pytest.approx(1 / 5)),
    ]


async def test_the_best_candidates_that_fail_the_filters_leave_room_for_the_next(
    pool: AsyncConnectionPool, embedder: Any
) -> None:
    """The best ``2 x limit`` candidates are read first: enough of them pass
    (limit 3), or not (limit 1: both are under the confidence floor) and the
    rest are read, best first, until the limit is filled."""
    w = Writer(PostgresStore(pool), embedder)
    await w.graph("gl", ["lamp", "desk"], [])
    await w.memories(
        "gl",
        *({"id": f"gl-l{i}", "content": f"Lamp note {i}."} for i in range(6)),
        *({"id": f"gl-b{i}", "content": f"The lamp on the desk {i}.", "confidence": 0.3} for i in range(2)),
    )
    lamp_only = pytest.approx(0.5 / 8)
    unfiltered = await search(pool, NAMES_ONLY, "gl", "lamp desk", limit=3)
    assert [h.id for h in unfiltered] == ["gl-b0", "gl-b1", "gl-l0"]
    for limit in (1, 3):
        hits = await search(pool, NAMES_ONLY, "gl", "lamp desk", limit=limit, min_confidence=0.5)
        assert [(h.id, h.score) for h in hits] == [(f"gl-l{i}", lamp_only) for i in range(limit)]
