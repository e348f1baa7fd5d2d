"""What a tenant's graph kept in the service costs in memory and build time.

``python -m benchmarks.graph_cache_memory [--shapes 30000:500000:600000,...] [--name X]``
builds, in a fresh child process per shape, a tenant's copy
(:class:`indexers.graph_cache.TenantGraph`) from one whole read of
``E`` entities (384-d float32 vectors), ``R`` relations and ``M``
mentions, with hubs as extraction makes them (Zipf-distributed ends and
mentioned entities, five mentions a memory, ids like the service's), then
drops the rows it was built from. Reported per shape: the child's resident
memory the copy holds once its inputs are gone (``/proc/self/statm``,
against the process before the rows were made), per row of relations +
mentions + entities; and the CPU seconds :meth:`TenantGraph.of` took. This
sizes ``graph.cacheRows`` and ``graph.cacheTotalRows``: a process holding
``cacheTotalRows`` rows of such tenants holds about that many times the
per-row figure. Report: ``benchmarks/results/graph-cache-memory[-<name>].{md,json}``.
Last line: ``graph-cache-memory: <E>:<R>:<M>:kb_per_row=<x>,build_s=<x> ...``.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from typing import Any

import numpy as np

from benchmarks.common import write_results

DIM = 384


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def measure(entities: int, relations: int, mentions: int, seed: int = 1) -> dict[str, Any]:
    """One shape, in this process (call it in a fresh one: freed memory is not given back)."""
    from indexers.graph_cache import Delta, TenantGraph

    rng = np.random.default_rng(seed)

    def ends(size: int) -> np.ndarray:
        return (rng.zipf(1.3, size) - 1) % entities + 1

    start = _rss_mb()
    ents = [(i, f"entity {i}", "local", rng.standard_normal(DIM).astype(np.float32)) for i in range(1, entities + 1)]
    rels = [
        (i + 1, int(s), int(d), "mentioned_with", 1.0, True, None, None, 1.7e9 + i)
        for i, (s, d) in enumerate(zip(ends(relations), ends(relations), strict=True))
    ]
    ments = [
        (int(e), f"{i // 5:08x}-0000-4000-8000-{i // 5:012x}", 1.7e9 + i // 5) for i, e in enumerate(ends(mentions))
    ]
    cpu = time.process_time()
    graph = TenantGraph.of(Delta(("1", ()), rels, ments, entities=ents))
    build_s = time.process_time() - cpu
    del rels, ments, ents
    gc.collect()
    held = _rss_mb() - start
    rows = entities + relations + mentions
    assert len(graph.rels) == relations
    return {
        "entities": entities,
        "relations": relations,
        "mentions": mentions,
        "rows": rows,
        "held_mb": held,
        "kb_per_row": held * 1024 / rows,
        "build_s": build_s,
    }


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# A tenant's graph kept in the service: memory and build time",
        "",
        f"Command: `{command}`  ",
        "One fresh process per shape; resident memory held by the copy once the rows it was built from are dropped.",
        "",
        "| entities | relations | mentions | rows | held MB | KB per row | build CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['entities']} | {r['relations']} | {r['mentions']} | {r['rows']} | {r['held_mb']:.0f} |"
        f" {r['kb_per_row']:.3f} | {r['build_s']:.2f} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="3000:60000:70000,30000:500000:600000,60000:1000000:1200000")
    parser.add_argument("--name", default="")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # E:R:M, measured in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*(int(x) for x in args.one.split(":")))))
        return
    rows = []
    for shape in args.shapes.split(","):
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.graph_cache_memory", "--one", shape],
            check=True,
            capture_output=True,
            text=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"graph-cache-memory: {shape} {rows[-1]['held_mb']:.0f} MB", file=sys.stderr, flush=True)
    command = "python -m benchmarks.graph_cache_memory " + " ".join(sys.argv[1:])
    write_results("graph-cache-memory" + (f"-{args.name}" if args.name else ""), markdown(rows, command), rows)
    print(
        "graph-cache-memory: "
        + " ".join(
            f"{r['entities']}:{r['relations']}:{r['mentions']}:kb_per_row={r['kb_per_row']:.3f},build_s={r['build_s']:.2f}"
            for r in rows
        )
    )


if __name__ == "__main__":
    main()
