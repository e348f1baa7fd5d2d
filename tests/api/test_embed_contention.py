"""Query embeddings and write embeddings on separate lanes, and the query
embedding's deadline, end to end: real Postgres, Typesense and model.

Nothing here is timed: the assertions are about order (a recall answers while
a bulk write is still being embedded) and about what a recall did when its
query could not be embedded in time."""

from __future__ import annotations

import time
from typing import Any

import anyio
import msgspec
import pytest

from .conftest import Braid
from .test_recall import UNRELATED

pytestmark = pytest.mark.anyio


def set_query_deadline(braid: Braid, ms: int) -> None:
    holder = braid.runtime.engine.config
    cfg = holder.current
    holder.current = msgspec.structs.replace(
        cfg, embedding=msgspec.structs.replace(cfg.embedding, query_deadline_ms=ms)
    )


def slow_inference(braid: Braid, monkeypatch: pytest.MonkeyPatch, seconds: float = 0.05) -> None:
    """Fault: every inference of the service's model takes ``seconds`` longer,
    so none finishes within a 1 ms deadline (onnxruntime can embed a short
    query in less); a late one still finishes and fills the cache."""
    embedder = braid.runtime.embedder
    encode = embedder._encode

    def slow(texts: list[str]) -> list[tuple[float, ...]]:
        time.sleep(seconds)
        return encode(texts)

    monkeypatch.setattr(embedder, "_encode", slow)


def bulk(n: int) -> list[dict[str, Any]]:
    """``n`` memories of about 30 words each, no embeddings: the service embeds them."""
    words = "meeting budget review launch roadmap customer invoice design sprint backlog".split()
    return [{"content": f"Note {i}: " + " ".join(words[(i + j) % len(words)] for j in range(30))} for i in range(n)]


async def test_recall_answers_while_a_bulk_write_is_being_embedded(braid: Braid) -> None:
    # The deadline out of the way: this is about queueing, not about the deadline.
    set_query_deadline(braid, 60_000)
    await braid.remember({"content": "User drives a Honda Civic"}, *({"content": c} for c in UNRELATED))
    await braid.synced()
    writes = braid.runtime.embedder.writes  # type: ignore[attr-defined]
    chunks = 512 // braid.runtime.embedder._write_batch  # type: ignore[attr-defined]
    before = writes.ran
    order: list[str] = []

    async def write() -> None:
        r = await braid.post("/v1/memories", {"memories": bulk(512)})
        assert r.status_code == 201, r.text
        order.append("write")

    async with anyio.create_task_group() as tg:
        tg.start_soon(write)
        with anyio.fail_after(60):
            while writes.ran == before:  # the write's first job is done: it is embedding
                await anyio.sleep(0.005)
        out = await braid.recall("which vehicle does the user own")
        order.append("recall")
        jobs_done_at_recall = writes.ran - before
    assert order == ["recall", "write"]
    assert jobs_done_at_recall < chunks  # the write still had inferences to run
    assert out["embedding_status"] == "ok" and out["degraded"] == []
    assert out["items"][0]["content"] == "User drives a Honda Civic"


async def test_query_embedding_past_its_deadline_falls_back_to_keywords(
    braid: Braid, monkeypatch: pytest.MonkeyPatch
) -> None:
    await braid.remember(
        {"content": "We chose Postgres as the source of truth", "entities": ["Postgres"]},
        *({"content": c} for c in UNRELATED),
    )
    await braid.synced()
    slow_inference(braid, monkeypatch)
    set_query_deadline(braid, 1)
    query = "why did we pick Postgres for the truth"
    out = await braid.recall(query)
    assert out["embedding_status"] == "timeout"
    assert out["strategy"] == "keyword"  # auto without its vector
    assert out["degraded"] == ["embedding", "pgvector"]
    assert out["sources"]["pgvector"] == {
        "status": "no_vector",
        "ms": 0.0,
        "hits": 0,
        "error": "needs the query vector, and the recall has none",
    }
    assert out["sources"]["typesense"]["status"] == "ok"  # its keyword list
    assert out["sources"]["graph"]["status"] == "ok"  # seeded by the name "Postgres"
    top = out["items"][0]
    assert top["content"] == "We chose Postgres as the source of truth"
    assert top["ranks"]["typesense"] == 1 and top["ranks"]["graph"] is not None
    assert top["ranks"]["pgvector"] is None

    # The late inference finished in its thread and filled the cache: the same
    # query is then embedded at once, within even a 1 ms deadline.
    with anyio.fail_after(30):
        while (again := await braid.recall(query))["embedding_status"] != "ok":
            await anyio.sleep(0.05)
    assert again["degraded"] == [] and again["sources"]["pgvector"]["status"] == "ok"
    assert again["strategy"] == "auto"


async def test_recall_with_client_embedding_never_waits_for_the_model(braid: Braid) -> None:
    await braid.remember({"content": "User drives a Honda Civic"}, *({"content": c} for c in UNRELATED))
    await braid.synced()
    vector = list(await braid.runtime.embedder.embed_query("what car does this person have"))
    set_query_deadline(braid, 1)
    out = await braid.recall("an unrelated query text that was never embedded", embedding=vector)
    assert out["embedding_status"] == "client" and out["embedding_ms"] == 0.0
    assert out["degraded"] == [] and out["sources"]["pgvector"]["status"] == "ok"
    assert out["items"][0]["content"] == "User drives a Honda Civic"
