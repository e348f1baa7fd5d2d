"""Single writes at a steady rate, alone and beside closed-loop recalls.

``python -m benchmarks.write_mix [--size N] [--rate R] [--clients C] [--name X]``

Loads the load benchmark's corpus (``benchmarks.load``, big tenant of ``N``
memories) through the service with the shipped config, runs the placement
job, lets Postgres settle (autovacuum, then ``VACUUM (ANALYZE)``), then, ``reps``
times each: ``R`` single writes a second for ``S`` seconds with nothing else
(what a write costs), and the same writes beside ``C`` clients recalling
(fused, vectors supplied) in a closed loop (what writes and recalls do to
each other in one service process). Per rep: write ack and outbox lag (row
inserted -> Typesense import acknowledged) p50 / p99, CPU ms a write by
process, and the recalls' p50 / p99 and rate.

Writes ``benchmarks/results/write-mix-<name>.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import httpx

from benchmarks.common import ROOT, CpuMeter
from benchmarks.load.client import LeanClient
from benchmarks.load.corpus import BIG_TENANT, build_corpus
from benchmarks.load.run import _encode, loaded_service, settle, steady_writes, timed


async def measure(size: int, rate: int, seconds: float, reps: int, clients: int) -> dict[str, Any]:
    corpus = build_corpus(size, seed=7)
    rows: list[dict[str, Any]] = []
    async with loaded_service(corpus, "braid-write-mix-") as (svc, headers):
        settled = await settle(svc.postgres_dsn())
        print(f"write_mix: Postgres settled in {settled['seconds']:.1f} s", flush=True)
        meter = CpuMeter(svc.processes)
        h = {**headers[BIG_TENANT], "content-type": "application/json"}
        bodies = [
            _encode({"query": q["text"], "embedding": v.tolist()})
            for q, v in zip(corpus.queries, corpus.query_vectors, strict=True)
        ]
        dsn = svc.postgres_dsn()
        async with (
            httpx.AsyncClient(base_url=svc.url, timeout=60) as health,
            LeanClient(svc.url) as writes,
            LeanClient(svc.url, max_connections=64) as recalls,
        ):
            await timed(recalls, h, bodies[:50], 4, 0)  # warm the pools
            for rep in range(reps):
                for mix in ("alone", f"beside {clients} recalling clients"):
                    print(f"write_mix: rep {rep + 1}/{reps}, writes {mix}", flush=True)
                    jobs = [steady_writes(writes, health, h, corpus, (rate,), seconds, meter, dsn)]
                    if mix != "alone":
                        jobs.append(timed(recalls, h, bodies, clients, seconds))
                    done = await asyncio.gather(*jobs)
                    w = done[0][str(rate)]
                    row = {
                        "rep": rep,
                        "mix": mix,
                        "ack_ms": w["ack_ms"],
                        "outbox_ms": w["outbox_ms"],
                        "cpu_ms_per_write": w["cpu_ms_per_write"],
                        "errors": w["error_count"],
                    }
                    if len(done) > 1:
                        r = done[1]
                        row["recall"] = {"p50": r["p50"], "p99": r["p99"], "qps": r["qps"], "n": r["n"]}
                    rows.append(row)
    return {"size": size, "rate": rate, "seconds": seconds, "clients": clients, "settle": settled, "rows": rows}


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Single writes at {report['rate']}/s, alone and beside {report['clients']} recalling clients",
        "",
        f"Command: `{report['command']}`  ",
        f"Corpus: the load benchmark's, big tenant of {report['size']} memories; shipped config; placement run;"
        f" Postgres settled ({report['settle']['seconds']:.1f} s) before the first rep; {report['seconds']:.0f} s a row.",
        "",
        "| rep | writes | ack p50 / p99 ms | outbox p50 / p99 ms | CPU ms a write (service / Postgres / Typesense / client) "
        "| recall p50 / p99 ms | recalls/s | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        cpu = r["cpu_ms_per_write"]
        rec = r.get("recall")
        latency = f"{rec['p50']:.1f} / {rec['p99']:.1f}" if rec else "–"
        rate = f"{rec['qps']:.1f}" if rec else "–"
        lines.append(
            f"| {r['rep'] + 1} | {r['mix']} | {r['ack_ms']['p50']:.1f} / {r['ack_ms']['p99']:.1f}"
            f" | {r['outbox_ms']['p50']:.1f} / {r['outbox_ms']['p99']:.1f}"
            f" | {cpu['service']:.2f} / {cpu['postgres']:.2f} / {cpu['typesense']:.2f} / {cpu['client']:.2f}"
            f" | {latency} | {rate}"
            f" | {r['errors']} |"
        )
    lines += [
        "",
        "CPU a write beside recalls counts the recalls' CPU too (every process, over the row), so only the rows"
        " of writes alone give a write's cost.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.write_mix", description=__doc__)
    parser.add_argument("--size", type=int, default=5000)
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--name", required=True)
    args = parser.parse_args()
    report = asyncio.run(measure(args.size, args.rate, args.seconds, args.reps, args.clients))
    report["command"] = "python -m benchmarks.write_mix " + " ".join(sys.argv[1:])
    out = ROOT / "benchmarks" / "results" / f"write-mix-{args.name}"
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(_markdown(report))
    print(f"write_mix: report at {out}.md")


if __name__ == "__main__":
    main()
