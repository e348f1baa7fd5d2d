"""What the graph source costs against a setting of its walk.

``python -m benchmarks.graph_cost [--size N] [--key maxEdges] [--values 2000,1000,500,250] [--seconds S]``
writes the load benchmark's corpus (``benchmarks/load/corpus.py``, big
tenant of ``N`` memories, its entities and relations) through the service
on the embedded stack, with the shipped config: Braid's own extraction runs
on every write, so the graph holds what a plain-turns client would get plus
the corpus' entities. Then, for each value of ``graph.<key>`` (or of any
other integer setting named once in the config, e.g. ``countTtlMs``; set in the
service's config file and reloaded with SIGHUP), it drives recalls of the big
tenant at one client for ``S`` seconds, graph alone and fused (vectors
supplied), and reports p50 latency, the graph's own ``ms`` as the server
reports it, and CPU per recall by process (the load benchmark's meter).
Report: ``benchmarks/results/graph-cost[-<name>].{md,json}``. Last line:
``graph-cost: size=<n> key=<key> <value>:graph_cpu_ms=<x>,fused_cpu_ms=<x> ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
from typing import Any

import msgspec

from benchmarks.common import RESULTS, CpuMeter
from benchmarks.load.client import LeanClient
from benchmarks.load.corpus import BIG_TENANT, build_corpus, describe
from benchmarks.load.run import loaded_service, timed


def _reload(svc: Any, key: str, value: int) -> None:
    """Reload the service with ``key`` = ``value`` in its config file (a
    ``graph`` setting, or any integer setting whose name occurs once)."""
    path = svc.home / "braid.yaml"
    line = re.compile(rf"^(  |    ){re.escape(key)}: \d+$", re.MULTILINE)
    text, n = line.subn(rf"\g<1>{key}: {value}", path.read_text())
    assert n == 1, f"the service's config has no single `{key}` line"
    path.write_text(text)
    svc.proc.send_signal(signal.SIGHUP)


async def measure(size: int, key: str, values: list[int], seconds: float) -> dict[str, Any]:
    corpus = build_corpus(size)
    report: dict[str, Any] = {"size": size, "key": key, "seconds": seconds, "corpus": describe(corpus), "rows": []}
    print("graph-cost: loading", flush=True)
    async with loaded_service(corpus, "braid-graph-cost-") as (svc, headers):
        meter = CpuMeter(svc.processes)
        recall_headers = {**headers[BIG_TENANT], "content-type": "application/json"}
        base = [
            {"query": q["text"], "embedding": v.tolist()}
            for q, v in zip(corpus.queries, corpus.query_vectors, strict=True)
        ]
        bodies = {
            "graph": [msgspec.json.encode({**b, "sources": ["graph"]}) for b in base],
            "fused": [msgspec.json.encode(b) for b in base],
        }
        async with LeanClient(svc.url, max_connections=4) as lean:
            for n in values:
                _reload(svc, key, n)
                await asyncio.sleep(3.0)  # SIGHUP is asynchronous; the warm-up follows
                for label, encoded in bodies.items():
                    await timed(lean, recall_headers, encoded[:20], 1, 0)  # warm-up
                    row = await timed(lean, recall_headers, encoded, 1, seconds, meter)
                    report["rows"].append(
                        {
                            "value": n,
                            "config": label,
                            "n": len(row["latencies"]),
                            "p50_ms": row["p50"],
                            "graph_ms_p50": row["sources_p50"].get("graph"),
                            "cpu_ms": row["cpu_ms"],
                            "degraded": row["degraded"],
                        }
                    )
                    print(f"graph-cost: {key} {n} {label}: {report['rows'][-1]}", flush=True)
    return report


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        f"# Recall cost against `{report['key']}` (graph alone and fused)",
        "",
        f"Command: `{command}`  ",
        f"Corpus: {report['corpus']}  ",
        "Written through the service with the shipped config (Braid's extraction on every write). "
        f"Each row: recalls of the big tenant at 1 client for {report['seconds']:.0f} s, vectors supplied; "
        "`graph ms` is the server's own `sources.graph.ms`; CPU ms per recall by process.",
        "",
        f"| {report['key']} | recall | n | p50 ms | graph ms p50 | CPU service | CPU postgres | CPU typesense | CPU sum |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        cpu = r["cpu_ms"]
        total = sum(v for k, v in cpu.items() if k != "client")
        graph_ms = f"{r['graph_ms_p50']:.1f}" if r["graph_ms_p50"] is not None else "–"
        lines.append(
            f"| {r['value']} | {r['config']} | {r['n']} | {r['p50_ms']:.1f} | {graph_ms} | "
            f"{cpu.get('service', 0):.2f} | {cpu.get('postgres', 0):.2f} | {cpu.get('typesense', 0):.2f} | {total:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument(
        "--key", default="maxEdges", help="the setting varied: a graph one, or an integer one named once in the config"
    )
    parser.add_argument("--values", default="2000,1000,500,250", help="its values, comma-separated")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--name", default="", help="report name suffix")
    args = parser.parse_args()
    values = [int(v) for v in args.values.split(",")]
    report = asyncio.run(measure(args.size, args.key, values, args.seconds))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("graph-cost" + (f"-{args.name}" if args.name else "") + ".md")
    out.write_text(markdown(report, "python -m benchmarks.graph_cost " + " ".join(sys.argv[1:])))
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
    parts = []
    for n in values:
        cpu = {
            r["config"]: sum(v for k, v in r["cpu_ms"].items() if k != "client")
            for r in report["rows"]
            if r["value"] == n
        }
        parts.append(f"{n}:graph_cpu_ms={cpu['graph']:.2f},fused_cpu_ms={cpu['fused']:.2f}")
    print(f"graph-cost: size={report['size']} key={args.key} " + " ".join(parts))


if __name__ == "__main__":
    main()
