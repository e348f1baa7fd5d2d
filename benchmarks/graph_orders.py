"""What a write that mentions a well-known entity costs the next recall's graph walk and shares.

``python -m benchmarks.graph_orders [--hubs 1000:200,5000:1000,50000:2000] [--rounds 200] [--name X]``
builds a tenant's copy (:class:`indexers.graph_cache.TenantGraph`) with one
hub entity of ``M`` mentions and ``D`` relations (``M:D``; each relation to
an entity of its own, weights with ties), then repeats, in one process: a
write's change merged (one new mention of the hub, one of its relations
re-weighed), then the hub's shares (``graph.mentionsPerEntity`` 100) and a
two-hop walk from it (fanout 16), as the next recall reaching it computes
them. Two ways, alternated round by round:

* ``in place``: the hub's mentions and relations kept in order by
  :meth:`TenantGraph.apply`;
* ``sorted again``: those orders dropped after each merge, so they are
  sorted again when read (what the copy did before they were kept in step).

Reported: CPU ms (``time.process_time``) of merge + shares + walk, median
and mean, by way and hub size; and that both ways gave the same shares and
walk. Report: ``benchmarks/results/graph-orders[-<name>].{md,json}``. Last
line: ``graph-orders: <M>:<D>:in_place_ms=<x>,sorted_again_ms=<x> ...``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import numpy as np

from benchmarks.common import write_results
from indexers.graph_cache import Delta, TenantGraph

HUB = 1
PER_ENTITY = 100
FANOUT = 16


def _relation(rid: int, weight: float) -> tuple[Any, ...]:
    # id, source, target, relation, weight, derived, valid_from, valid_to, time
    return (rid, HUB, 1000 + rid, "co", weight, True, None, None, 0.0)


def measure(mentions: int, relations: int, rounds: int, seed: int = 5) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    times = rng.integers(0, mentions // 4 + 1, size=mentions).astype(float)
    base = Delta(
        ("0", ()),
        [_relation(r, float(1 + r % 7)) for r in range(relations)],
        [(HUB, f"m{i:07d}", times[i]) for i in range(mentions)],
    )
    graphs = {way: TenantGraph.of(base) for way in ("in place", "sorted again")}
    cpu: dict[str, list[float]] = {way: [] for way in graphs}
    same = True
    for r in range(rounds):
        change = Delta(
            (str(r + 1), ()),
            [_relation(int(rng.integers(0, relations)), float(rng.integers(1, 9)))],
            [(HUB, f"w{r:07d}", float(mentions + r))],
        )
        found = []
        for way in sorted(graphs) if r % 2 else sorted(graphs, reverse=True):
            graph = graphs[way]
            t0 = time.process_time()
            graph.apply(change)
            if way == "sorted again":
                graph.ordered.pop(HUB, None)
                graph.order.pop(HUB, None)
            shares = graph.shares({HUB: 1.0}, PER_ENTITY).as_dict()
            walk = graph.walk({HUB}, hops=2, fanout=FANOUT, max_edges=2000, now=1.0)
            cpu[way].append((time.process_time() - t0) * 1000)
            found.append((shares, walk))
        same = same and found[0] == found[1]
    return {
        "mentions": mentions,
        "relations": relations,
        "rounds": rounds,
        "same": same,
        "ms": {way: {"p50": statistics.median(v), "mean": statistics.fmean(v)} for way, v in cpu.items()},
    }


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# A write that mentions a well-known entity, then the next recall's shares and walk",
        "",
        f"Command: `{command}`  ",
        f"One tenant's copy with a hub entity of M mentions and D relations; each round merges a write's change "
        f"(a new mention of the hub, one of its relations re-weighed), then computes the hub's shares "
        f"({PER_ENTITY} newest mentions) and a two-hop walk from it (fanout {FANOUT}). `in place`: the hub's "
        "mentions and relations kept in order by the merge; `sorted again`: those orders dropped after each "
        "merge (the copy before this change). One process, the ways alternated round by round. CPU ms of "
        "merge + shares + walk (`time.process_time`).",
        "",
        "| mentions | relations | rounds | in place p50 / mean ms | sorted again p50 / mean ms "
        "| sorted again / in place (p50) | same results |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        a, b = row["ms"]["in place"], row["ms"]["sorted again"]
        lines.append(
            f"| {row['mentions']} | {row['relations']} | {row['rounds']} | {a['p50']:.3f} / {a['mean']:.3f}"
            f" | {b['p50']:.3f} / {b['mean']:.3f} | {b['p50'] / a['p50']:.1f} | {'yes' if row['same'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hubs", default="1000:200,5000:1000,50000:2000", help="M:D pairs, comma-separated")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    rows = []
    for pair in args.hubs.split(","):
        m, d = (int(x) for x in pair.split(":"))
        rows.append(measure(m, d, args.rounds))
    command = "python -m benchmarks.graph_orders " + " ".join(sys.argv[1:])
    write_results("graph-orders" + (f"-{args.name}" if args.name else ""), markdown(rows, command), rows)
    print(
        "graph-orders: "
        + " ".join(
            f"{r['mentions']}:{r['relations']}:in_place_ms={r['ms']['in place']['p50']:.3f},"
            f"sorted_again_ms={r['ms']['sorted again']['p50']:.3f}"
            for r in rows
        )
    )


if __name__ == "__main__":
    main()
