"""What a write that makes an entity costs the next recall's graph seeds.

``python -m benchmarks.entity_matrix [--entities 2600,20000,60000] [--rounds 200] [--name X]``
builds a tenant's copy (:class:`indexers.graph_cache.TenantGraph`) holding
``N`` entities of one model (384-d random unit vectors), then repeats, in
one process with BLAS on one thread (as the service runs): one entity made
(a delta merged, as a write's change read merges it), then the seeds of one
query (as the next recall finds them). Two ways, alternated round by round
so machine drift falls on both alike:

* ``in place``: the model's matrix as :meth:`TenantGraph.apply` keeps it
  (the new entity's row appended);
* ``made again``: the matrix dropped after each merge, so the seeds stack
  every entity's vector again (what the copy did before the matrices were
  kept in step).

Reported: CPU ms (``time.process_time``) of a merge + seeds pair, median
and mean, by way and ``N``; and that both ways found the same seeds. Report:
``benchmarks/results/entity-matrix[-<name>].{md,json}``. Last line:
``entity-matrix: <N>:in_place_ms=<x>,made_again_ms=<x> ...``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from benchmarks.common import write_results
from indexers.graph_cache import Delta, TenantGraph

DIM = 384


def _entity(eid: int, rng: np.random.Generator) -> tuple[Any, ...]:
    return (eid, f"entity {eid}", "m", rng.standard_normal(DIM).astype(np.float32))


def measure(n: int, rounds: int, seed: int = 5) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    queries = rng.standard_normal((64, DIM)).astype(np.float32)
    graphs = {
        way: TenantGraph.of(Delta(("0", ()), [], [], entities=[_entity(i, np.random.default_rng(i)) for i in range(n)]))
        for way in ("in place", "made again")
    }
    cpu: dict[str, list[float]] = {way: [] for way in graphs}
    same = True
    for r in range(rounds):
        made = _entity(n + r, rng)
        query = queries[r % len(queries)]
        found = []
        for way in sorted(graphs) if r % 2 else sorted(graphs, reverse=True):
            graph = graphs[way]
            graph.seeds([], query, model="m", limit=10, min_similarity=0.0)  # the matrix exists before the write
            t0 = time.process_time()
            graph.apply(Delta((str(r + 1), ()), [], [], entities=[made]))
            if way == "made again":
                graph._models.clear()
            seeds = graph.seeds([], query, model="m", limit=10, min_similarity=0.0)
            cpu[way].append((time.process_time() - t0) * 1000)
            found.append(seeds)
        same = same and found[0] == found[1]
    return {
        "entities": n,
        "rounds": rounds,
        "same_seeds": same,
        "ms": {way: {"p50": statistics.median(v), "mean": statistics.fmean(v)} for way, v in cpu.items()},
    }


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# A write that makes an entity, then the next recall's graph seeds",
        "",
        f"Command: `{command}`  ",
        "One tenant's copy with N entities of one model (384-d random unit vectors); each round merges one new "
        "entity, then finds the seeds of one query (limit 10). `in place`: the model's matrix kept in step with "
        "the entities (the row appended); `made again`: the matrix dropped after each merge and stacked again "
        "by the seeds (the copy before this change). One process, BLAS on one thread, the ways alternated round "
        "by round. CPU ms of merge + seeds (`time.process_time`).",
        "",
        "| entities | rounds | in place p50 / mean ms | made again p50 / mean ms | made again / in place (p50) | same seeds |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        a, b = row["ms"]["in place"], row["ms"]["made again"]
        lines.append(
            f"| {row['entities']} | {row['rounds']} | {a['p50']:.3f} / {a['mean']:.3f} | {b['p50']:.3f} / {b['mean']:.3f}"
            f" | {b['p50'] / a['p50']:.1f} | {'yes' if row['same_seeds'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", default="2600,20000,60000", help="entity counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    with threadpool_limits(limits=1, user_api="blas"):
        rows = [measure(int(n), args.rounds) for n in args.entities.split(",")]
    command = "python -m benchmarks.entity_matrix " + " ".join(sys.argv[1:])
    write_results("entity-matrix" + (f"-{args.name}" if args.name else ""), markdown(rows, command), rows)
    print(
        "entity-matrix: "
        + " ".join(
            f"{r['entities']}:in_place_ms={r['ms']['in place']['p50']:.3f},made_again_ms={r['ms']['made again']['p50']:.3f}"
            for r in rows
        )
    )


if __name__ == "__main__":
    main()
