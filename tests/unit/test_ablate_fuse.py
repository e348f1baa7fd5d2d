"""benchmarks.quality.ablate.fuse re-fuses stored per-source lists as the
engine does: RRF, then the speaker and time factors (it broke silently once
when fusion's factor API changed; this keeps it running)."""

from __future__ import annotations

from datetime import date

from benchmarks.quality.ablate import fuse
from fusion.query import QueryPlan


def _row(plan: QueryPlan) -> dict[str, object]:
    day1, day2 = "2023-05-01T10:00:00Z", "2023-06-01T10:00:00Z"
    return {
        "typesense": [("D1:1", "Caroline", day1), ("D1:2", "Melanie", day2)],
        "pgvector": [("D1:2", "Melanie", day2), ("D1:3", "Caroline", day1)],
        "graph": [],
        "plan": plan,
    }


def test_without_factors_it_is_rrf_of_the_lists() -> None:
    row = _row(QueryPlan(text="q"))
    assert fuse(row, {"typesense": 1.0, "pgvector": 1.0, "graph": 0.3}, 60, 0.0, 0.0) == ["D1:2", "D1:1", "D1:3"]


def test_the_speaker_factor_lifts_the_named_speakers_memories() -> None:
    row = _row(QueryPlan(text="q", speakers=("Caroline",)))
    assert fuse(row, {"typesense": 1.0, "pgvector": 1.0}, 60, 1.0, 0.0)[0] == "D1:1"


def test_the_time_factor_lifts_the_memories_of_the_named_days() -> None:
    row = _row(QueryPlan(text="q", dates=((date(2023, 5, 1), date(2023, 5, 1)),)))
    # x4 for the day named: 4 / 61 and 4 / 62 pass 1 / 62 + 1 / 61.
    assert fuse(row, {"typesense": 1.0, "pgvector": 1.0}, 60, 0.0, 3.0) == ["D1:1", "D1:3", "D1:2"]
