"""CPU the ranking factors and the bookkeeping queue add to one recall, in process.

``python -m benchmarks.factor_cost``: three source lists of 50 hits each
(overlapping as fused lists do), ranked and packed the way
:meth:`indexers.engine.Engine.recall` does, with every factor off and then
with recency, importance, order (a present-tense query) and usage (counts
given) on, plus one :meth:`indexers.bookkeeping.Bookkeeper.record` per
recall. CPU is the process's own (``time.process_time``), so other load on
the machine changes it little; the usage factor's Postgres read is not part
of it (it runs only when ``ranking.usageWeight`` > 0).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from fusion import FactorWeights, QueryPlan, get_encoding, rank
from indexers.base import Hit
from indexers.bookkeeping import Bookkeeper

NOW = datetime(2026, 11, 23, tzinfo=UTC)
ENC = get_encoding("cl100k_base")


def lists(seed: int) -> dict[str, list[Hit]]:
    rnd = random.Random(seed)
    pool = [
        Hit(
            id=f"m{i}",
            content=f"memory {i} " + "words " * rnd.randint(5, 40),
            kind="turn",
            tier="session",
            created_at=NOW - timedelta(days=rnd.uniform(0, 400)),
            confidence=1.0,
            speaker=rnd.choice(["user", "assistant"]),
            importance=rnd.choice([None, rnd.random()]),
            score=1.0,
        )
        for i in range(120)
    ]
    return {name: rnd.sample(pool, 50) for name in ("typesense", "pgvector", "graph")}


def one(found: dict[str, list[Hit]], plan: QueryPlan, weights: FactorWeights, keeper: Bookkeeper | None) -> None:
    ranking = rank(found, plan, k=60, weights={"graph": 0.3}, factors=weights, reference_time=NOW, min_confidence=0.0)
    usage = {i: 3 for i in ranking.usage_ids(10)}
    answer = ranking.finish(usage=usage, top_k=10, budget=8192, encoding=ENC)
    if keeper is not None:
        # Never flushed here: a full queue drops, which costs less than a queued record.
        keeper.record("tenant", [r.hit.id for r in answer.items])


def measure(rounds: int, weights: FactorWeights, keeper: Bookkeeper | None) -> list[float]:
    inputs = [lists(s) for s in range(50)]
    plan = QueryPlan(text="what is my budget", current=True)
    per_round = []
    for _ in range(rounds):
        start = time.process_time()
        for found in inputs:
            one(found, plan, weights, keeper)
        per_round.append((time.process_time() - start) / len(inputs) * 1000.0)
    return per_round


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.factor_cost", description=__doc__)
    parser.add_argument("--rounds", type=int, default=40, help="rounds of 50 recalls each, alternated")
    args = parser.parse_args()
    off = FactorWeights(speaker_boost=0.5, time_boost=0.6)
    on = FactorWeights(
        speaker_boost=0.5, time_boost=0.6, recency=0.1, importance=0.2, usage=0.05, order=0.5, order_window=10
    )
    # No pool: record() only queues; the queue holds every round's ids (40 x 50 x 10).
    keeper = Bookkeeper(None, queue_size=1_000_000, batch_size=1_000_000, flush_ms=1000)  # type: ignore[arg-type]
    results: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.rounds):  # alternated, so drift in the machine's load hits both alike
        results["off"] += measure(1, off, None)
        results["on"] += measure(1, on, keeper)
    for name, ms in results.items():
        print(f"{name}: p50 {statistics.median(ms):.3f} ms CPU per recall (rank + finish + block), {len(ms)} rounds")
    print(
        f"factor_cost: added p50 {statistics.median(results['on']) - statistics.median(results['off']):.3f} ms "
        "CPU per recall"
    )


if __name__ == "__main__":
    main()
