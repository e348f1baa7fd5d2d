"""The embedding-contention benchmark's summary of one run (pure)."""

from __future__ import annotations

import pytest

from benchmarks.embed_contention import query_texts, summarize


def recall(ms: float, degraded: list[str], status: int = 200, embedding_ms: float | None = 10.0) -> dict:
    return {
        "t": 0.0,
        "ms": ms,
        "status": status,
        "embedding_ms": embedding_ms,
        "embedding_status": None,
        "degraded": degraded,
    }


def test_summary_counts_degraded_and_embedding_timeouts_and_throughput() -> None:
    run = {
        "recalls": [
            recall(10.0, []),
            recall(20.0, ["embedding", "pgvector"], embedding_ms=250.0),
            recall(30.0, ["graph"]),
            recall(40.0, [], status=429, embedding_ms=None),
        ],
        "idle": [recall(5.0, []), recall(7.0, [])],
        "writes": [{"start": 0.0, "end": 4.0}, {"start": 4.0, "end": 8.0}],
        "write_seconds": 8.0,
    }
    s = summarize(run)
    assert (s["recalls"], s["non_200"], s["degraded"], s["embedding_timeouts"]) == (4, 1, 2, 1)
    assert s["degraded_by"] == {"embedding": 1, "graph": 1, "pgvector": 1}
    assert s["p50"] == 20.0 and s["max"] == 30.0
    assert s["p99"] == pytest.approx(29.8)
    assert s["embedding_p50"] == 10.0
    assert s["idle_p50"] == 6.0
    assert (s["memories"], s["memories_per_s"]) == (1024, 128.0)


def test_query_texts_are_distinct() -> None:
    import random

    texts = list(query_texts(500, random.Random(1)))
    assert len(set(texts)) == 500
