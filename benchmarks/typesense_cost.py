"""Where the Typesense source's time goes: ``python -m benchmarks.typesense_cost``.

Starts the embedded stack, writes the LoCoMo turns (all five conversations
in one tenant, with the benchmark mapping), then sends the Typesense source's
``multi_search`` straight to Typesense in variants (fewer hits per term, no
prefix or typos, no vector search, ...) for the same questions, one at a
time. Reports per variant the client wall time and the summed
``search_time_ms`` Typesense reports, p50, to
``benchmarks/results/typesense_cost.md``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

import httpx
import msgspec

from benchmarks.common import LOCOMO_DATA, Service, write_results
from config import load_config
from fusion import analyze_query
from indexers.base import Filters
from indexers.embedding import create_embedder
from indexers.typesense import build_filter, keyword_terms

from .quality.locomo import MappingOptions, conversation_memories, load_conversations

__all__ = ["main", "measure", "searches"]

HIT_FIELDS = "memory_id,content,kind,tier,created_at,confidence,speaker"
QUESTIONS = 150

VARIANTS: dict[str, dict[str, Any]] = {
    "as shipped (8 terms x 100 hits, count, vector 50)": {},
    "no vector search": {"vector": False},
    "keyword only, no count": {"vector": False, "count": False},
    "vector search only": {"terms": 0, "count": False},
    "termHits 50": {"per_page": 50},
    "termHits 20": {"per_page": 20},
    "prefix false": {"prefix": False},
    "num_typos 0": {"typos": 0},
    "memory_id only from term searches": {"fields": "memory_id"},
    "query_by content only": {"query_by": "content"},
}


def searches(
    text: str,
    vector: tuple[float, ...],
    filter_by: str,
    *,
    per_page: int = 100,
    prefix: bool = True,
    typos: int = 1,
    count: bool = True,
    vector_search: bool = True,
    fields: str = HIT_FIELDS,
    terms: int = 8,
    query_by: str = "content,context",
) -> list[dict[str, Any]]:
    """The source's searches (see ``TypesenseSource.search``), with knobs."""
    out: list[dict[str, Any]] = (
        [
            {
                "q": t,
                "query_by": query_by,
                "prefix": prefix,
                "num_typos": typos,
                "drop_tokens_threshold": 0,
                "typo_tokens_threshold": 1,
                "per_page": per_page,
                "highlight_fields": "none",
                "include_fields": fields,
            }
            for t in keyword_terms(text, terms)
        ]
        if terms
        else []
    )
    if count:
        out.append({"q": "*", "per_page": 0})
    if vector_search:
        literal = ",".join(repr(float(x)) for x in vector)
        out.append(
            {"q": "*", "vector_query": f"embedding:([{literal}], k:50)", "per_page": 50, "include_fields": HIT_FIELDS}
        )
    return [{"collection": "braid_memories", "filter_by": filter_by, **s} for s in out]


async def measure() -> list[tuple[str, float, float, int]]:
    convs = load_conversations(LOCOMO_DATA)
    svc = Service(prefix="braid-tscost-")
    try:
        async with httpx.AsyncClient(base_url=svc.url, timeout=120, headers=svc.headers) as client:
            for conv in convs:
                memories = conversation_memories(conv, MappingOptions())
                for i in range(0, len(memories), 256):
                    r = await client.post("/v1/memories", json={"memories": memories[i : i + 256]})
                    r.raise_for_status()
            while (await client.get("/health")).json()["backends"]["sync"]["pending"]:
                await asyncio.sleep(0.1)
        speakers = sorted({t["speaker"] for c in convs for t in conversation_memories(c, MappingOptions())})
        questions = [analyze_query(q.text, speakers).text for c in convs for q in c.questions][:QUESTIONS]
        embedder = create_embedder(load_config().embedding.model, cache_size=0)
        vectors = [await embedder.embed_query(q) for q in questions]
        filter_by = build_filter("default", Filters(), 0.0, ["session", "rag"])
        port = svc.typesense_port()
        rows = []
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"X-TYPESENSE-API-KEY": svc.ts_key}, timeout=60
        ) as ts:
            for name, knobs in VARIANTS.items():
                knobs = {("vector_search" if k == "vector" else k): v for k, v in knobs.items()}
                wall, server, size = [], [], 0
                for text, vector in zip(questions, vectors, strict=True):
                    body = msgspec.json.encode({"searches": searches(text, vector, filter_by, **knobs)})
                    start = time.perf_counter()
                    r = await ts.post("/multi_search", content=body, headers={"content-type": "application/json"})
                    results = msgspec.json.decode(r.content)["results"]
                    wall.append((time.perf_counter() - start) * 1000)
                    server.append(sum(x.get("search_time_ms", 0) for x in results))
                    size = len(r.content)
                rows.append((name, statistics.median(wall), statistics.median(server), size))
                print(
                    f"{name:50s} wall p50 {rows[-1][1]:6.1f} ms, search_time_ms p50 {rows[-1][2]:6.1f}", file=sys.stderr
                )
        return rows
    finally:
        svc.stop()


def main() -> None:
    rows = asyncio.run(measure())
    lines = [
        "# Typesense source: where the time goes",
        "",
        "Command: `python -m benchmarks.typesense_cost`  ",
        f"2,760 LoCoMo turns in one tenant (mapping with context); {QUESTIONS} questions, one multi_search "
        "at a time, straight to Typesense 0.24.1 on loopback.",
        "",
        "| variant | wall p50 ms | summed search_time_ms p50 | response bytes (last) |",
        "|---|---|---|---|",
        *(f"| {n} | {w:.1f} | {s:.1f} | {b} |" for n, w, s, b in rows),
    ]
    path = write_results("typesense_cost", "\n".join(lines) + "\n")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
