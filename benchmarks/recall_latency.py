"""Recall latency, write throughput and Typesense freshness, measured over HTTP.

Starts ``python -m service`` on the embedded stack in a fresh data directory,
loads the LoCoMo turns from ``../shared/data/locomo`` as memories, then
measures:

* write throughput (memories/s, embeddings computed by the service);
* write-to-searchable freshness in Typesense (single writes, polled);
* recall latency p50/p95/p99 per source alone and fused, with the query
  embedding supplied and computed by the service, at 1 and 8 clients.

Writes ``benchmarks/results/recall_latency.md`` and ``.png`` and prints one
summary line. Usage: ``make bench`` or ``python -m benchmarks.recall_latency``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import LOCOMO_DATA, RESULTS, Service, pct, pyplot, write_results

__all__ = ["load_turns", "main", "run", "timed_recalls", "write_report"]


def load_turns(data: Path) -> tuple[list[str], list[str]]:
    turns, questions = [], []
    for file in sorted(data.glob("*.json")):
        conv = json.loads(file.read_text())
        body = conv.get("conversation", conv)
        for key, value in body.items():
            if key.startswith("session_") and isinstance(value, list):
                turns += [f"{t['speaker']}: {t['text']}" for t in value]
        questions += [q["question"] for q in conv.get("qa", []) if q.get("category") in (1, 2, 3, 4)]
    return turns, questions


async def timed_recalls(
    client: httpx.AsyncClient, headers: dict[str, str], bodies: list[dict[str, Any]], clients: int
) -> tuple[list[float], float, dict[str, list[float]]]:
    latencies: list[float] = []
    per_source: dict[str, list[float]] = {}
    queue = list(bodies)

    async def worker() -> None:
        while queue:
            body = queue.pop()
            start = time.perf_counter()
            r = await client.post("/v1/recall", json=body, headers=headers)
            latencies.append((time.perf_counter() - start) * 1000)
            r.raise_for_status()
            for name, src in r.json()["sources"].items():
                if src["status"] == "ok":
                    per_source.setdefault(name, []).append(src["ms"])

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    return latencies, len(bodies) / elapsed, per_source


async def run(args: argparse.Namespace) -> dict[str, Any]:
    turns, questions = load_turns(args.data)
    turns = turns[: args.limit] if args.limit else turns
    questions = questions[: args.queries]
    svc = Service()
    report: dict[str, Any] = {"memories": len(turns), "queries": len(questions)}
    try:
        async with httpx.AsyncClient(base_url=svc.url, timeout=60) as client:
            start = time.perf_counter()
            for i in range(0, len(turns), 128):
                batch = [{"content": t} for t in turns[i : i + 128]]
                r = await client.post("/v1/memories", json={"memories": batch}, headers=svc.headers)
                r.raise_for_status()
            report["write_per_s"] = len(turns) / (time.perf_counter() - start)

            # Freshness: acknowledged write -> document readable in Typesense.
            fresh = []
            ts = httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{svc.typesense_port()}",
                headers={"X-TYPESENSE-API-KEY": svc.ts_key},
            )
            for i in range(args.fresh):
                r = await client.post(
                    "/v1/memories",
                    json={"memories": [{"content": f"freshness probe {i}", "embedding": _unit(i)}]},
                    headers=svc.headers,
                )
                acked = time.perf_counter()
                mid = r.json()["ids"][0]
                while (await ts.get(f"/collections/braid_memories/documents/default:{mid}")).status_code != 200:
                    await asyncio.sleep(0.0005)
                fresh.append((time.perf_counter() - acked) * 1000)
            await ts.aclose()
            report["fresh_p50"], report["fresh_p99"] = pct(fresh, 50), pct(fresh, 99)

            # Query vectors computed once by the service's model (cached path measured separately).
            warm = [{"query": q} for q in questions]
            await timed_recalls(client, svc.headers, warm, 4)
            rows = []
            for label, sources in (
                ("typesense", ["typesense"]),
                ("pgvector", ["pgvector"]),
                ("graph", ["graph"]),
                ("fused", None),
            ):
                for clients in (1, 8):
                    bodies = [{"query": q, **({"sources": sources} if sources else {})} for q in questions]
                    lat, qps, per_source = await timed_recalls(client, svc.headers, bodies, clients)
                    rows.append(
                        {
                            "config": label,
                            "clients": clients,
                            "p50": pct(lat, 50),
                            "p95": pct(lat, 95),
                            "p99": pct(lat, 99),
                            "qps": qps,
                            "sources": {k: pct(v, 50) for k, v in per_source.items()},
                            "latencies": lat,
                        }
                    )
            # Query embedding computed by the service, never seen before (cold cache).
            cold = [{"query": f"{q} (variant {i})"} for i, q in enumerate(questions)]
            lat, qps, _ = await timed_recalls(client, svc.headers, cold, 1)
            rows.append(
                {
                    "config": "fused, cold embedding",
                    "clients": 1,
                    "p50": pct(lat, 50),
                    "p95": pct(lat, 95),
                    "p99": pct(lat, 99),
                    "qps": qps,
                    "sources": {},
                    "latencies": lat,
                }
            )
            report["rows"] = rows
    finally:
        svc.stop()
    return report


def _unit(seed: int) -> list[float]:
    v = np.random.default_rng(seed).standard_normal(384)
    return (v / np.linalg.norm(v)).tolist()


def write_report(report: dict[str, Any], command: str) -> str:
    lines = [
        "# Recall latency (embedded stack, one machine)",
        "",
        f"Command: `{command}`  ",
        f"Corpus: {report['memories']} LoCoMo turns as memories; {report['queries']} LoCoMo questions as queries.  ",
        f"Write throughput (server-side embeddings, batches of 128): **{report['write_per_s']:.0f} memories/s**  ",
        f"Freshness, acknowledged write -> readable in Typesense: p50 **{report['fresh_p50']:.1f} ms**, p99 **{report['fresh_p99']:.1f} ms**",
        "",
        "| config | clients | p50 ms | p95 ms | p99 ms | recalls/s | per-source p50 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        src = ", ".join(f"{k} {v:.1f}" for k, v in r["sources"].items())
        lines.append(
            f"| {r['config']} | {r['clients']} | {r['p50']:.1f} | {r['p95']:.1f} | {r['p99']:.1f} | {r['qps']:.0f} | {src} |"
        )
    write_results("recall_latency", "\n".join(lines) + "\n")
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for r in report["rows"]:
            data = np.sort(np.asarray(r["latencies"]))
            ax.plot(data, np.linspace(0, 1, len(data)), label=f"{r['config']} ({r['clients']} clients)")
        ax.set_xscale("log")
        ax.set_xlabel("recall latency, ms (log)")
        ax.set_ylabel("fraction of recalls")
        ax.set_title("Braid recall latency CDF")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(RESULTS / "recall_latency.png", dpi=120)
    fused8 = next(r for r in report["rows"] if r["config"] == "fused" and r["clients"] == 8)
    return (
        f"bench: memories={report['memories']} fused_p50_ms={fused8['p50']:.1f} "
        f"fused_p99_ms={fused8['p99']:.1f} qps={fused8['qps']:.0f} "
        f"fresh_p99_ms={report['fresh_p99']:.1f} write_per_s={report['write_per_s']:.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=LOCOMO_DATA)
    parser.add_argument("--limit", type=int, default=0, help="use only the first N turns")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--fresh", type=int, default=100, help="single writes timed for freshness")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    print(write_report(report, "python -m benchmarks.recall_latency " + " ".join(sys.argv[1:])))


if __name__ == "__main__":
    main()
