"""benchmarks.load.run: a bulk load paused for the placement job
(``--place-at``) writes every batch once, and its figures leave the pause out."""

from __future__ import annotations

from benchmarks.load.corpus import BIG_TENANT, build_corpus
from benchmarks.load.run import load_jobs, merge_loads, split_at


def test_the_split_falls_on_the_big_tenant_s_first_memories_and_loses_no_batch() -> None:
    corpus = build_corpus(1000, seed=7, small_tenants=3)
    jobs = load_jobs(corpus, 200)
    cut = split_at(jobs, 500)
    first, rest = jobs[:cut], jobs[cut:]
    assert [(t.name, i) for t, i in first] == [(BIG_TENANT, 0), (BIG_TENANT, 200), (BIG_TENANT, 400)]
    assert rest[0][0].name == BIG_TENANT and rest[0][1] == 600
    assert first + rest == jobs
    # Past the big tenant's size, the load is not split.
    assert split_at(jobs, 5000) == 5


def _part(memories: int, seconds: float, lat: list[float], errors: int = 0) -> dict:
    return {
        "memories": memories,
        "batches": len(lat),
        "batch": 200,
        "writers": 3,
        "body_bytes_max": memories * 10,
        "seconds": seconds,
        "per_s": memories / seconds,
        "batch_ms": {},
        "batch_lat": lat,
        "errors": [f"e{i}" for i in range(errors)],
        "error_count": errors,
    }


def test_merged_parts_add_up_without_the_pause() -> None:
    merged = merge_loads([_part(400, 2.0, [10.0, 30.0]), _part(600, 4.0, [20.0, 40.0, 50.0], errors=1)])
    assert merged["memories"] == 1000
    assert merged["batches"] == 5
    assert merged["seconds"] == 6.0
    assert merged["per_s"] == 1000 / 6.0
    assert merged["batch_ms"]["n"] == 5
    assert merged["batch_ms"]["p50"] == 30.0
    assert merged["body_bytes_max"] == 6000
    assert merged["error_count"] == 1 and merged["errors"] == ["e0"]
