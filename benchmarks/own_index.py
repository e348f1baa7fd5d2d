"""A large tenant's own HNSW index against the shared one: fused recalls, one service, alternating.

``python -m benchmarks.own_index [--size N] [--seconds S] [--rounds R]
[--clients C] [--set dotted.key=value ...] [--name X]`` loads the load benchmark's corpus (big tenant of
``N`` memories beside its small tenants) into the service on the embedded
stack and runs the ``placement`` admin job, which gives the big tenant's
tiers past ``postgres.ownIndexAbove`` an index of their own. Then, ``R``
times each, alternating, it drives fused recalls (vectors supplied, as
``make bench-load``'s fused rows) from ``C`` clients for ``S`` seconds:

* **own**: the indexes recorded in ``pgvector_own_indexes`` (as the job left it);
* **shared**: the same rows taken out of ``pgvector_own_indexes`` (the indexes
  stay): the service's pgvector source walks the tiers' shared indexes, as
  before the job.

After each switch it waits for the source's refresh
(:data:`indexers.own_index.REFRESH_S`) and a margin. Same service, same data,
same queries: the rounds differ only in the index walked. It reports CPU per
recall by process (the load benchmark's meter), p50 and recalls/s, per round
and their mean. Report: ``benchmarks/results/own-index[-<name>].{md,json}``.
Last line: ``own-index: size=<n> own_cpu_ms=<x> shared_cpu_ms=<x> own_postgres_ms=<x> shared_postgres_ms=<x>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import psycopg

from benchmarks.common import RESULTS, CpuMeter
from benchmarks.load.client import LeanClient
from benchmarks.load.corpus import BIG_TENANT, build_corpus
from benchmarks.load.run import loaded_service, timed
from benchmarks.quality.tuning import Override, parse_set
from indexers.own_index import REFRESH_S

#: Seconds waited after a switch beyond the source's refresh.
SETTLE_MARGIN_S = 3.0
MODES = ("own", "shared")


async def _switch(dsn: str, rows: list[tuple[Any, ...]], mode: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("DELETE FROM pgvector_own_indexes")
        if mode == "own":
            async with conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO pgvector_own_indexes (tenant, tier, name, built_at) VALUES (%s, %s, %s, %s)", rows
                )


async def measure(
    size: int, seconds: float, rounds: int, clients: int, sets: Sequence[Override] = ()
) -> dict[str, Any]:
    corpus = build_corpus(size)
    async with loaded_service(corpus, "braid-own-index-", sets=sets) as (svc, headers):
        dsn = svc.postgres_dsn()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT tenant, tier, name, built_at FROM pgvector_own_indexes ORDER BY 1, 2")
            rows = list(await cur.fetchall())
        if not rows:
            raise SystemExit("the placement job built no own index: raise --size past postgres.ownIndexAbove")
        bodies = [
            msgspec.json.encode({"query": q["text"], "embedding": v.tolist()})
            for q, v in zip(corpus.queries, corpus.query_vectors, strict=True)
        ]
        recall_headers = {**headers[BIG_TENANT], "content-type": "application/json"}
        meter = CpuMeter(svc.processes)
        results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        async with LeanClient(svc.url, max_connections=64) as lean:
            await timed(lean, recall_headers, bodies, 4, 0)  # warm up
            for r in range(rounds):
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    await _switch(dsn, rows, mode)
                    await asyncio.sleep(REFRESH_S + SETTLE_MARGIN_S)
                    row = await timed(lean, recall_headers, bodies, clients, seconds, meter)
                    print(
                        f"own-index: round {r + 1} {mode}: {row['qps']:.0f}/s p50 {row['p50']:.1f} ms"
                        f" cpu {row['cpu_ms']}",
                        flush=True,
                    )
                    results[mode].append(
                        {k: row[k] for k in ("n", "p50", "p99", "qps", "cpu_ms", "status", "degraded")}
                    )
            await _switch(dsn, rows, "own")
    mean = {
        mode: {
            "cpu_ms": {k: float(np.mean([x["cpu_ms"][k] for x in rs])) for k in rs[0]["cpu_ms"]},
            "p50": float(np.mean([x["p50"] for x in rs])),
            "qps": float(np.mean([x["qps"] for x in rs])),
        }
        for mode, rs in results.items()
    }
    return {
        "size": size,
        "seconds": seconds,
        "rounds": rounds,
        "clients": clients,
        "sets": [list(x) for x in sets],
        "own_indexes": [{"tenant": t, "tier": tier, "index": name} for t, tier, name, _ in rows],
        "rounds_detail": results,
        "mean": mean,
    }


def _cpu(c: dict[str, float]) -> str:
    kinds = ("service", "postgres", "typesense")
    return " / ".join(f"{c.get(k, 0.0):.2f}" for k in kinds) + f" ({sum(c.get(k, 0.0) for k in kinds):.2f})"


def markdown(report: dict[str, Any], command: str) -> str:
    own = ", ".join(f"{i['tenant']}/{i['tier']}" for i in report["own_indexes"])
    lines = [
        "# A large tenant's own HNSW index against the shared one (fused recalls, one service)",
        "",
        f"Command: `{command}`  ",
        f"Load corpus, big tenant of {report['size']} memories beside its small tenants; the placement job "
        f"built own indexes for: {own}. Fused recalls, vectors supplied, {report['clients']} clients, "
        f"{report['seconds']:.0f} s a round, {report['rounds']} rounds of each, alternating: `own` with the "
        "indexes recorded, `shared` with the records taken out (the source walks the shared indexes).",
        "",
        "| mode | round | recalls | recalls/s | p50 ms | CPU ms per recall: service / Postgres / Typesense (sum) |",
        "|---|---|---|---|---|---|",
    ]
    for mode, rs in report["rounds_detail"].items():
        for i, x in enumerate(rs):
            lines.append(f"| {mode} | {i + 1} | {x['n']} | {x['qps']:.0f} | {x['p50']:.1f} | {_cpu(x['cpu_ms'])} |")
    for mode, m in report["mean"].items():
        lines.append(f"| **{mode}** | mean | | {m['qps']:.0f} | {m['p50']:.1f} | **{_cpu(m['cpu_ms'])}** |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--set", dest="sets", action="append", default=[], type=parse_set, metavar="KEY=VALUE")
    parser.add_argument("--name", default="", help="report name suffix")
    args = parser.parse_args()
    report = asyncio.run(measure(args.size, args.seconds, args.rounds, args.clients, args.sets))
    command = "python -m benchmarks.own_index " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("own-index" + (f"-{args.name}" if args.name else "") + ".md")
    out.write_text(markdown(report, command))
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    kinds = ("service", "postgres", "typesense")
    m = report["mean"]
    print(
        f"own-index: size={args.size} own_cpu_ms={sum(m['own']['cpu_ms'].get(k, 0.0) for k in kinds):.2f}"
        f" shared_cpu_ms={sum(m['shared']['cpu_ms'].get(k, 0.0) for k in kinds):.2f}"
        f" own_postgres_ms={m['own']['cpu_ms'].get('postgres', 0.0):.2f}"
        f" shared_postgres_ms={m['shared']['cpu_ms'].get('postgres', 0.0):.2f}"
    )


if __name__ == "__main__":
    main()
