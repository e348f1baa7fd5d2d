"""The pre-inference recall end to end: real Postgres, Typesense and model."""

from __future__ import annotations

import anyio
import pytest

from fusion import get_encoding

from .conftest import Braid, FileConfigured, record_searches

pytestmark = pytest.mark.anyio

UNRELATED = [
    "The quarterly report is due on Friday.",
    "Maria's favourite colour is green.",
    "We moved the standup to 10am.",
    "The cat knocked the plant off the shelf.",
    "Bananas are cheaper at the corner market.",
]


async def test_car_question_finds_civic_without_shared_words(braid: Braid) -> None:
    await braid.remember(
        {"content": "User drives a Honda Civic", "kind": "fact"},
        *({"content": c} for c in UNRELATED),
    )
    await braid.synced()
    out = await braid.recall("what car does this person have")
    assert out["items"][0]["content"] == "User drives a Honda Civic"
    assert out["degraded"] == []


async def test_keyword_recall_finds_password(braid: Braid) -> None:
    await braid.remember(
        {"content": "The password is Blue", "kind": "secret"},
        *({"content": c} for c in UNRELATED),
    )
    await braid.synced()
    out = await braid.recall("password Blue", sources=["typesense"])
    assert out["items"][0]["content"] == "The password is Blue"
    assert out["items"][0]["ranks"]["typesense"] == 1
    fused = await braid.recall("password Blue")
    assert fused["items"][0]["content"] == "The password is Blue"


async def test_graph_reaches_memory_about_related_entity(braid: Braid) -> None:
    r = await braid.post(
        "/v1/graph",
        {
            "entities": [
                {"name": "Alex", "type": "person"},
                {"name": "TypeScript", "type": "language"},
            ],
            "relations": [{"source": "Alex", "relation": "prefers", "target": "TypeScript"}],
        },
    )
    assert r.status_code == 201, r.text
    (ts_id,) = await braid.remember(
        {"content": "TypeScript 5.4 added the NoInfer utility type", "entities": ["TypeScript"]}
    )
    await braid.remember(*({"content": c} for c in UNRELATED))
    cache = await _graph_cache(braid)
    out = await braid.recall("What should I know about Alex?", sources=["graph"])
    contents = [i["content"] for i in out["items"]]
    assert "Alex prefers TypeScript." in contents
    by_id = {i["id"]: i for i in out["items"]}
    assert ts_id in by_id and by_id[ts_id]["ranks"]["graph"] is not None
    # The tenant's first recall is walked by Postgres while its relations and
    # mentions are read into the service (graph.cacheRows, on as shipped) ...
    loaded = await _graph_cache(braid)
    assert loaded["postgres"] == cache["postgres"] + 1 and loaded["here"] == cache["here"]
    for _ in range(200):
        if loaded["tenants"] == cache["tenants"] + 1:
            break
        await anyio.sleep(0.05)
        loaded = await _graph_cache(braid)
    assert loaded["tenants"] == cache["tenants"] + 1 and loaded["rows"] > cache["rows"]
    # ... and the recalls after it walk that copy, to the same list (the
    # scores move with the recency factor's "now").
    again = await braid.recall("What should I know about Alex?", sources=["graph"])
    assert [(i["id"], i["ranks"]) for i in again["items"]] == [(i["id"], i["ranks"]) for i in out["items"]]
    fused = await braid.recall("What should I know about Alex?")
    assert ts_id in [i["id"] for i in fused["items"]]
    assert fused["sources"]["graph"]["hits"] >= 2
    after = await _graph_cache(braid)
    assert after["here"] == loaded["here"] + 2 and after["postgres"] == loaded["postgres"]


async def _graph_cache(braid: Braid) -> dict[str, int]:
    """The graph cache's figures in ``/health``."""
    cache: dict[str, int] = (await braid.client.get("/health")).json()["backends"]["graph"]["cache"]
    return cache


async def test_budget_caps_block_tokens(braid: Braid) -> None:
    await braid.remember(*({"content": c * 3} for c in UNRELATED))
    await braid.synced()
    out = await braid.recall("what is going on", budget_tokens=50)
    assert out["tokens"] <= 50
    assert len(get_encoding("cl100k_base").encode(out["block"])) == out["tokens"]
    assert out["block"].startswith("[Memory: note | ")


async def test_block_format(braid: Braid) -> None:
    await braid.remember(
        {
            "content": "We chose Postgres as the source of truth",
            "kind": "decision",
            "created_at": "2026-01-15T09:30:00Z",
            "confidence": 0.95,
        }
    )
    await braid.synced()
    out = await braid.recall("which database did we choose", top_k=1)
    assert out["block"] == (
        "[Memory: decision | 2026-01-15]\nWe chose Postgres as the source of truth\nconfidence: 0.95"
    )
    item = out["items"][0]
    assert set(item["ranks"]) == {"typesense", "pgvector", "graph"}


async def test_context_is_searched_but_never_shown(braid: Braid) -> None:
    (mid,) = await braid.remember(
        {
            "content": "Melanie: Sure, here it is!",
            "speaker": "Melanie",
            "context": "Caroline: Can you show me the sunflower watercolour you painted?",
        }
    )
    await braid.remember(*({"content": c} for c in UNRELATED))
    await braid.synced()
    out = await braid.recall("sunflower watercolour", sources=["typesense"])
    assert out["items"][0]["id"] == mid
    assert "sunflower" not in out["block"]
    assert out["items"][0]["content"] == "Melanie: Sure, here it is!"


async def test_score_breakdown_with_speaker_and_date_factors(braid: Braid) -> None:
    said = [
        ("Caroline", "2023-07-14T10:00:00Z", "I painted a lake at sunrise."),
        ("Melanie", "2023-07-14T10:00:00Z", "I painted a lake at sunset."),
        ("Caroline", "2023-03-02T10:00:00Z", "I painted a lake in the rain."),
        ("Melanie", "2023-03-02T10:00:00Z", "I painted a lake under snow."),
    ]
    ids = await braid.remember(*({"content": t, "speaker": s, "created_at": d} for s, d, t in said))
    await braid.synced()
    out = await braid.recall("What did Caroline paint in July 2023?", top_k=4)
    assert out["query"] == {
        "text": "What did paint in ?",
        "speakers": ["Caroline"],
        "dates": [["2023-07-01", "2023-07-31"]],
        "current": False,
        "addressed": [],
        "others": [],
        "selves": [],
    }
    items = {i["id"]: i for i in out["items"]}
    assert set(items) == set(ids)
    assert out["items"][0]["id"] == ids[0]
    expected = [{"speaker": 1.5, "time": 1.6}, {"time": 1.6}, {"speaker": 1.5}, {}]
    # The memory factors (recency by default) apply to every item; the query's are these.
    assert [{k: v for k, v in items[i]["factors"].items() if k in ("speaker", "time")} for i in ids] == expected
    for item in out["items"]:
        assert item["rrf_score"] == pytest.approx(sum(item["contributions"].values()))
        product = 1.0
        for f in item["factors"].values():
            product *= f
        assert item["score"] == pytest.approx(item["rrf_score"] * product)
    assert [i["score"] for i in out["items"]] == sorted((i["score"] for i in out["items"]), reverse=True)


async def test_a_date_named_relative_to_the_reference_time_boosts_and_searches_that_window(braid: Braid) -> None:
    """ "a month ago", asked on 18 April, names 11-27 March: the memory from
    then gets the time factor and comes first, though three others share
    more words with the query; asked a year later it names no memory."""
    said = [
        ("2023-03-19T10:00:00Z", "We ran the charity 5K for the animal shelter."),
        ("2023-04-10T10:00:00Z", "I joined a charity event, the charity gala, a month ago? No, last night."),
        ("2023-02-01T10:00:00Z", "The charity event I joined in February was the charity bake sale."),
        ("2023-04-17T10:00:00Z", "Another charity event is coming up, the charity auction."),
    ]
    ids = await braid.remember(*({"content": t, "created_at": d} for d, t in said))
    await braid.synced()
    query = "Which charity event did I join a month ago?"
    out = await braid.recall(query, top_k=4, reference_time="2023-04-18T12:00:00Z")
    assert out["query"]["dates"] == [["2023-03-11", "2023-03-27"]]
    assert out["query"]["text"] == query  # the words stay searched
    timed = {i["id"] for i in out["items"] if "time" in i["factors"]}
    assert timed == {ids[0]}
    assert out["items"][0]["id"] == ids[0]
    later = await braid.recall(query, top_k=4, reference_time="2024-04-18T12:00:00Z")
    assert later["query"]["dates"] == [["2024-03-11", "2024-03-27"]]
    assert [i for i in later["items"] if "time" in i["factors"]] == []
    assert later["items"][0]["id"] != ids[0]


async def test_a_speaker_the_query_addresses_is_not_boosted(braid: Braid) -> None:
    """ "Thanks, Melanie!" talks to Melanie: her memories get no speaker
    factor (the block used to fill with her generic "Thanks, Caroline!"
    lines); "What did Melanie paint?" is about her: they do."""
    said = [
        ("Melanie", "Thanks, Caroline!"),
        ("Melanie", "I painted a lake at sunset."),
        ("Caroline", "Thanks, Melanie! That means a lot."),
        ("Caroline", "I painted a sunflower."),
    ]
    ids = await braid.remember(*({"content": t, "speaker": s} for s, t in said))
    await braid.synced()
    thanks = await braid.recall("Thanks, Melanie!", top_k=4)
    assert (thanks["query"]["text"], thanks["query"]["speakers"], thanks["query"]["addressed"]) == (
        "Thanks, !",
        [],
        ["Melanie"],
    )
    assert [i for i in thanks["items"] if "speaker" in i["factors"]] == []
    paint = await braid.recall("What did Melanie paint?", top_k=4)
    assert (paint["query"]["speakers"], paint["query"]["addressed"]) == (["Melanie"], [])
    boosted = {i["id"]: i["factors"].get("speaker") for i in paint["items"]}
    assert boosted[ids[1]] == 1.5
    assert paint["items"][0]["id"] == ids[1]
    assert all(boosted[i] is None for i in (ids[2], ids[3]) if i in boosted)


async def test_a_speaker_named_only_as_the_other_party_is_not_boosted(braid: Braid) -> None:
    """ "What book did Caroline recommend to Melanie?" asks what Caroline
    did: her memories get the speaker factor, Melanie's none (before, both
    were boosted, which boosted every memory of the chat)."""
    said = [
        ("Caroline", "You should read Becoming Nicole, it changed my life."),
        ("Melanie", "I read a great book about painting last week."),
    ]
    ids = await braid.remember(*({"content": t, "speaker": s} for s, t in said))
    await braid.synced()
    out = await braid.recall("What book did Caroline recommend to Melanie?", top_k=2)
    query = out["query"]
    assert (query["text"], query["speakers"], query["others"], query["addressed"]) == (
        "What book did recommend to ?",
        ["Caroline"],
        ["Melanie"],
        [],
    )
    boosted = {i["id"]: i["factors"].get("speaker") for i in out["items"]}
    assert boosted == {ids[0]: 1.5, ids[1]: None}
    # Both named as who acts: both boosted.
    both = await braid.recall("What books did Caroline and Melanie read?", top_k=2)
    assert (both["query"]["speakers"], both["query"]["others"]) == (["Caroline", "Melanie"], [])
    assert {i["factors"].get("speaker") for i in both["items"]} == {1.5}


async def test_the_speaker_list_is_read_again_after_a_write_names_a_new_speaker_only(
    braid: Braid, monkeypatch: pytest.MonkeyPatch
) -> None:
    await braid.remember({"content": "Caroline painted a lake.", "speaker": "Caroline"})
    engine = braid.runtime.engine
    reads: list[str] = []
    read = engine.store.speakers

    async def counted(tenant: str) -> list[str]:
        reads.append(tenant)
        return await read(tenant)

    monkeypatch.setattr(engine.store, "speakers", counted)
    engine._speakers.clear()
    assert (await braid.recall("What did Caroline paint?"))["query"]["speakers"] == ["Caroline"]
    assert len(reads) == 1
    # A memory from a speaker the list has: the cached list is still right.
    await braid.remember({"content": "Caroline painted a boat.", "speaker": "Caroline"})
    await braid.recall("What did Caroline paint?")
    assert len(reads) == 1
    # A new speaker: the next recall reads the list and knows them.
    await braid.remember({"content": "Melanie painted a sunset.", "speaker": "Melanie"})
    assert (await braid.recall("What did Melanie paint?"))["query"]["speakers"] == ["Melanie"]
    assert len(reads) == 2


@pytest.mark.parametrize("fault", ["error", "stall"])
async def test_speaker_lookup_failure_does_not_fail_the_recall(
    braid: Braid, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """Fault injection: the speaker list read from Postgres fails or hangs."""
    import anyio
    import psycopg

    (mid,) = await braid.remember({"content": "Caroline painted a lake.", "speaker": "Caroline"})
    await braid.synced()
    engine = braid.runtime.engine
    engine._speakers.clear()

    async def broken(tenant: str) -> list[str]:
        if fault == "error":
            raise psycopg.OperationalError("connection refused")
        await anyio.sleep(3600)
        return []

    monkeypatch.setattr(engine.store, "speakers", broken)
    with anyio.fail_after(5):
        out = await braid.recall("What did Caroline paint?")
    assert out["items"][0]["id"] == mid
    assert out["query"]["speakers"] == []  # nothing known: no name taken out, no factor
    assert "speaker" not in out["items"][0]["factors"]


async def test_vector_search_alone_leaves_vectors_to_pgvector_in_fused_recalls(braid: Braid) -> None:
    await braid.remember({"content": "User drives a Honda Civic"}, *({"content": c} for c in UNRELATED))
    await braid.synced()
    holder = braid.runtime.engine.config
    holder.current = holder.current.with_source("typesense", vector_search="alone")
    sent = record_searches(braid)
    fused = await braid.recall("what car does this person have")
    assert "vector" not in sent[-1] and fused["sources"]["pgvector"]["status"] == "ok"
    assert fused["items"][0]["content"] == "User drives a Honda Civic"
    await braid.recall("what car does this person have", sources=["typesense"])
    assert "vector" in sent[-1]
    await braid.recall("what car does this person have", sources=["typesense", "graph"])
    assert "vector" in sent[-1]


async def test_a_first_person_query_boosts_its_own_speakers_memories(configured: FileConfigured) -> None:
    """ "Have I ever used WillMaker Pro?" is about the user's own words: the
    user's turn gets ``1 + query.selfBoost`` (0.5 by default) and comes
    before the assistant's reply that repeats the name at length; asking
    what the assistant said, or with the boost reloaded to 0, no memory gets
    the factor."""
    braid = configured.braid
    said = [
        ("assistant", "WillMaker Pro is a will program. WillMaker Pro guides you; WillMaker Pro saves hours."),
        ("user", "I drafted my will with WillMaker Pro last spring."),
    ]
    ids = await braid.remember(*({"content": t, "speaker": s} for s, t in said))
    await braid.synced()
    query = "Have I ever used WillMaker Pro for my will?"
    on = await braid.recall(query, top_k=2)
    assert on["query"]["selves"] == ["user"]
    assert {i["id"]: i["factors"].get("self") for i in on["items"]} == {ids[0]: None, ids[1]: 1.5}
    assert on["items"][0]["id"] == ids[1]
    theirs = await braid.recall("Which program did you recommend for my will?", top_k=2)
    assert theirs["query"]["selves"] == []
    assert [i for i in theirs["items"] if "self" in i["factors"]] == []
    configured.write("query:\n  selfBoost: 0\n")
    assert (await configured.reload()).status_code == 200
    off = await braid.recall(query, top_k=2)
    assert off["query"]["selves"] == []
    assert [i for i in off["items"] if "self" in i["factors"]] == []
