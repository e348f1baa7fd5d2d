"""Recall strategies: ``recent`` (no query), ``auto`` with an empty query,
``keyword`` (no query embedding), ``semantic`` (vector lists only)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from .conftest import AGENT_B, Braid, record_searches
from .test_recall import UNRELATED

pytestmark = pytest.mark.anyio

START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def turn(session: str, i: int, minutes: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"{session}-{i}",
        "content": f"{session} turn {i}",
        "session_id": session,
        "created_at": (START + timedelta(minutes=minutes)).isoformat(),
        **extra,
    }


@pytest.fixture
async def sessions(braid: Braid) -> Braid:
    """Sessions s1 and s2 interleaved in time (written out of order), and
    tenant B with a session s1 of its own, newer than all of A's."""
    a = [turn("s1", i, 2 * i) for i in range(8)] + [turn("s2", i, 2 * i + 1) for i in range(8)]
    await braid.remember(*reversed(a))
    await braid.remember(*(turn("s1", 100 + i, 60 + i) for i in range(5)), key=AGENT_B)
    return braid


async def test_recent_without_a_query_returns_a_sessions_newest_in_order(sessions: Braid) -> None:
    r = await sessions.post("/v1/recall", {"strategy": "recent", "session_id": "s1", "top_k": 5})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [i["id"] for i in out["items"]] == ["s1-7", "s1-6", "s1-5", "s1-4", "s1-3"]
    assert out["strategy"] == "recent"
    assert out["embedding_status"] == "none" and out["degraded"] == []
    assert {s["status"] for s in out["sources"].values()} == {"skipped"}
    # Formatted and budgeted as any recall's block.
    assert out["block"].startswith("[Memory: note | 2026-03-01]\ns1 turn 7\nconfidence: 1.00\n\n")
    half = out["tokens"] // 2
    small = await sessions.recall("", strategy="recent", session_id="s1", top_k=5, budget_tokens=half)
    assert 0 < small["tokens"] <= half
    assert small["items"][0]["in_block"] and not small["items"][-1]["in_block"]


@pytest.mark.parametrize("body", [{"query": ""}, {"query": "  "}, {}], ids=["empty", "blank", "missing"])
async def test_auto_with_no_query_runs_recent_and_says_so(sessions: Braid, body: dict[str, Any]) -> None:
    r = await sessions.post("/v1/recall", {**body, "session_id": "s2", "top_k": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["strategy"] == "recent"
    assert [i["id"] for i in out["items"]] == ["s2-7", "s2-6", "s2-5"]


async def test_recent_across_sessions_and_never_another_tenants(sessions: Braid) -> None:
    out = await sessions.recall("", strategy="recent", top_k=4)
    assert [i["id"] for i in out["items"]] == ["s2-7", "s1-7", "s2-6", "s1-6"]
    theirs = await sessions.recall("", key=AGENT_B, strategy="recent", session_id="s1", top_k=50)
    assert [i["id"] for i in theirs["items"]] == [f"s1-{100 + i}" for i in reversed(range(5))]
    # A query given to `recent` changes nothing: it is not searched.
    out = await sessions.recall("s2 turn 3", strategy="recent", session_id="s1", top_k=2)
    assert [i["id"] for i in out["items"]] == ["s1-7", "s1-6"]


async def test_recent_honours_the_filters(braid: Braid) -> None:
    await braid.remember(
        turn("s1", 0, 0, importance=0.9, metadata={"role": "user"}),
        turn("s1", 1, 1, importance=0.1, metadata={"role": "user"}),
        turn("s1", 2, 2, importance=0.9, metadata={"role": "assistant"}),
        turn("s1", 3, 3, metadata={"role": "user"}),
        turn("s1", 4, 4, kind="fact", confidence=0.4),
    )
    out = await braid.recall("", session_id="s1", metadata={"role": "user"}, min_importance=0.5)
    assert [i["id"] for i in out["items"]] == ["s1-0"]
    out = await braid.recall("", session_id="s1", metadata={"role": "user"})
    assert [i["id"] for i in out["items"]] == ["s1-3", "s1-1", "s1-0"]
    out = await braid.recall("", session_id="s1")  # the 0.4 confidence one is under minConfidence
    assert [i["id"] for i in out["items"]] == ["s1-3", "s1-2", "s1-1", "s1-0"]


async def test_a_sessions_newest_are_one_backward_index_scan(sessions: Braid) -> None:
    with psycopg.connect(sessions.dsn) as conn:
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_sort = off")
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                "EXPLAIN SELECT m.content FROM memories m WHERE m.tenant = 'tenant-a' AND m.session_id = 's1'"
                " ORDER BY m.created_at DESC, m.id DESC LIMIT 5"
            ).fetchall()
        )
    assert "Scan Backward using memories_tenant_session_created" in plan, plan
    assert "Sort" not in plan, plan


async def test_keyword_computes_no_query_embedding(braid: Braid, monkeypatch: pytest.MonkeyPatch) -> None:
    await braid.remember(
        {"content": "The password is Blue", "entities": ["Blue"]}, *({"content": c} for c in UNRELATED)
    )
    await braid.synced()
    engine = braid.runtime.engine
    calls: list[str] = []
    inner = engine.embedder.embed_query

    async def counting(text: str) -> Any:
        calls.append(text)
        return await inner(text)

    monkeypatch.setattr(engine.embedder, "embed_query", counting)
    out = await braid.recall("password Blue", strategy="keyword")
    assert calls == []
    assert out["strategy"] == "keyword" and out["embedding_status"] == "none" and out["embedding_ms"] == 0.0
    assert out["sources"]["pgvector"]["status"] == "skipped"
    assert out["sources"]["typesense"]["status"] == "ok" and out["sources"]["graph"]["status"] == "ok"
    assert out["degraded"] == []
    assert out["items"][0]["content"] == "The password is Blue"
    # A client's embedding is not used either.
    vector = [1.0] + [0.0] * 383
    out = await braid.recall("password Blue", strategy="keyword", embedding=vector)
    assert out["embedding_status"] == "none" and out["sources"]["pgvector"]["status"] == "skipped"
    await braid.recall("password Blue")
    assert calls == ["password Blue"]  # the default strategy does embed


async def test_semantic_searches_the_vector_lists_only(braid: Braid) -> None:
    await braid.remember({"content": "User drives a Honda Civic"}, *({"content": c} for c in UNRELATED))
    await braid.synced()
    sent = record_searches(braid)
    # Shipped (`vectorSearch: alone`): pgvector is part of the recall, so
    # Typesense has no list to give and sends nothing.
    out = await braid.recall("what car does this person have", strategy="semantic")
    assert sent == []
    assert out["strategy"] == "semantic" and out["embedding_status"] == "ok"
    assert out["sources"]["graph"]["status"] == "skipped"
    assert out["sources"]["pgvector"]["status"] == "ok" and out["sources"]["typesense"]["status"] == "ok"
    assert out["items"][0]["content"] == "User drives a Honda Civic"
    holder = braid.runtime.engine.config
    holder.current = holder.current.with_source("typesense", vector_search="always")
    out = await braid.recall("what car does this person have", strategy="semantic")
    assert sent == [["vector"]]
    assert out["items"][0]["content"] == "User drives a Honda Civic"
    await braid.recall("what car does this person have")
    assert "keyword" in sent[-1] and "vector" in sent[-1]  # auto: both lists


async def test_semantic_without_its_vector_is_degraded_not_keyword(
    braid: Braid, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .test_embed_contention import set_query_deadline, slow_inference

    await braid.remember({"content": "User drives a Honda Civic"})
    await braid.synced()
    slow_inference(braid, monkeypatch)
    set_query_deadline(braid, 1)
    out = await braid.recall("Honda Civic", strategy="semantic")
    assert out["strategy"] == "semantic" and out["embedding_status"] == "timeout"
    assert out["degraded"] == ["embedding", "typesense", "pgvector"]
    assert out["items"] == []
