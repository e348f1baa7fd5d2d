"""What entity extraction costs a write: ``graph.extract: spacy`` against ``none``.

``python -m benchmarks.extract_cost [--conversations 2] [--rounds 2]`` starts
the service on the embedded stack, then writes the turns of the first LoCoMo
conversations as an agent runtime would (plain turns: text, speaker, date,
session, neighbouring turns as context; no entities, no vectors: the service
embeds), ``--batch`` memories a request, one request at a time, into a fresh
tenant per phase. The phases alternate ``none`` and ``spacy`` (the config is
reloaded between them: extraction is read at every write), ``--rounds``
times, so a drift of the shared machine falls on both.

Per phase: write throughput (memories/s, the outbox drain not included), the
CPU each process spent per written memory (service, Postgres, Typesense, this
client; the drain's CPU after it, separately), and what the graph got
(entities, mentions, derived relations). Writes
``benchmarks/results/extract-cost.{md,json}`` and prints one line::

    extract-cost: none <n>/s <ms> ms CPU/memory, spacy <n>/s <ms> ms CPU/memory
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from benchmarks.common import LOCOMO_DATA, CpuMeter, cpu_used, write_results
from benchmarks.quality.api import post_retrying
from benchmarks.quality.locomo import MappingOptions, conversation_memories, load_conversations
from benchmarks.quality.service import TenantService
from benchmarks.quality.tuning import parse_set

MODES = ("none", "spacy")


def graph_counts(dsn: str, tenant: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM entities WHERE tenant = %(t)s),"
            " (SELECT count(*) FROM mentions WHERE tenant = %(t)s),"
            " (SELECT count(*) FROM relations WHERE tenant = %(t)s AND derived),"
            " (SELECT count(*) FROM relation_support WHERE tenant = %(t)s)",
            {"t": tenant},
        ).fetchone()
    assert row is not None
    return dict(zip(("entities", "mentions", "derived_relations", "support"), (int(v) for v in row), strict=True))


async def phase(
    client: httpx.AsyncClient, svc: TenantService, tenant: str, mode: str, memories: list[dict[str, Any]], batch: int
) -> dict[str, Any]:
    config = {**svc.config, "graph": {**svc.config.get("graph", {}), "extract": mode}}
    svc.write_config(config)
    r = await client.post("/admin/config/reload", headers=svc.admin_headers)
    r.raise_for_status()
    meter = CpuMeter(svc.processes)
    before = meter()
    start = time.perf_counter()
    for i in range(0, len(memories), batch):
        await post_retrying(
            client, "/v1/memories", {"memories": memories[i : i + batch]}, svc.headers_by_tenant[tenant]
        )
    seconds = time.perf_counter() - start
    written = meter()
    drain = await asyncio.to_thread(svc.wait_synced, 600)
    cpu = cpu_used(before, written)
    out = {
        "mode": mode,
        "tenant": tenant,
        "memories": len(memories),
        "seconds": seconds,
        "per_s": len(memories) / seconds,
        "cpu_ms_per_memory": {k: v * 1000 / len(memories) for k, v in cpu.items()},
        "cpu_ms_per_memory_total": sum(cpu.values()) * 1000 / len(memories),
        "drain_s": drain,
        "drain_cpu_ms_per_memory": {k: v * 1000 / len(memories) for k, v in cpu_used(written, meter()).items()},
        "graph": graph_counts(svc.postgres_dsn(), tenant),
    }
    print(
        f"{tenant}: {out['per_s']:.1f} memories/s, {out['cpu_ms_per_memory_total']:.1f} ms CPU a memory",
        file=sys.stderr,
        flush=True,
    )
    return out


def summary(phases: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per mode: the median throughput and CPU over its phases."""
    out = {}
    for mode in MODES:
        mine = [p for p in phases if p["mode"] == mode]
        kinds = mine[0]["cpu_ms_per_memory"]
        out[mode] = {
            "per_s": statistics.median(p["per_s"] for p in mine),
            "cpu_ms_per_memory_total": statistics.median(p["cpu_ms_per_memory_total"] for p in mine),
            **{f"cpu_ms_{k}": statistics.median(p["cpu_ms_per_memory"][k] for p in mine) for k in kinds},
        }
    return out


def markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    kinds = [k for k in report["phases"][0]["cpu_ms_per_memory"]]
    lines = [
        "# Entity extraction on write: what it costs",
        "",
        f"`{report['command']}`: {report['memories']} LoCoMo turns a phase (conversations "
        f"{', '.join(report['conversations'])}), plain turns, writes of {report['batch']} one at a time, the "
        "service embedding them; a fresh tenant per phase; phases alternate `graph.extract: none` and `spacy` "
        f"(reloaded between them), {report['rounds']} rounds. Machine: 2 shared cores (other work ran beside it).",
        "",
        "## Medians per mode",
        "",
        "| graph.extract | memories/s | CPU ms a memory (all) | " + " | ".join(kinds) + " |",
        "|---|---|---|" + "---|" * len(kinds),
    ]
    for mode in MODES:
        m = s[mode]
        cells = " | ".join(f"{m[f'cpu_ms_{k}']:.2f}" for k in kinds)
        lines.append(f"| {mode} | {m['per_s']:.1f} | {m['cpu_ms_per_memory_total']:.2f} | {cells} |")
    extra = s["spacy"]["cpu_ms_per_memory_total"] - s["none"]["cpu_ms_per_memory_total"]
    lines += [
        "",
        f"Extraction adds {extra:.1f} ms of CPU a written memory (all processes) and takes write throughput from "
        f"{s['none']['per_s']:.1f} to {s['spacy']['per_s']:.1f} memories/s.",
        "",
        "## Every phase",
        "",
        "| phase | memories/s | CPU ms a memory | drain s | entities | mentions | derived relations | support rows |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in report["phases"]:
        g = p["graph"]
        lines.append(
            f"| {p['tenant']} | {p['per_s']:.1f} | {p['cpu_ms_per_memory_total']:.2f} | {p['drain_s']:.1f} | "
            f"{g['entities']} | {g['mentions']} | {g['derived_relations']} | {g['support']} |"
        )
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    convs = load_conversations(args.data)[: args.conversations]
    memories = [m for c in convs for m in conversation_memories(c, MappingOptions())][: args.max_memories or None]
    tenants = [f"cost-{mode}-{r}" for r in range(args.rounds) for mode in MODES]
    svc = await asyncio.to_thread(TenantService, tenants, args.config, args.set)
    phases = []
    try:
        async with httpx.AsyncClient(base_url=svc.url, timeout=300) as client:
            for tenant in tenants:
                mode = tenant.split("-")[1]
                phases.append(await phase(client, svc, tenant, mode, memories, args.batch))
    finally:
        await asyncio.to_thread(svc.stop)
    return {
        "conversations": [c.id for c in convs],
        "memories": len(memories),
        "batch": args.batch,
        "rounds": args.rounds,
        "phases": phases,
        "summary": summary(phases),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.extract_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=LOCOMO_DATA, help="folder of LoCoMo *.json files")
    parser.add_argument("--conversations", type=int, default=2, help="first N conversations a phase (default 2)")
    parser.add_argument("--rounds", type=int, default=2, help="none/spacy pairs of phases (default 2)")
    parser.add_argument("--max-memories", type=int, default=0, help="at most N turns a phase (0: all)")
    parser.add_argument("--batch", type=int, default=32, help="memories a write (default 32)")
    parser.add_argument("--config", type=Path, default=Path(__file__).resolve().parents[1] / "config" / "braid.yaml")
    parser.add_argument("--set", type=parse_set, action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--name", default="extract-cost", help="output stem under benchmarks/results/")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    report["command"] = " ".join(["python -m benchmarks.extract_cost", *sys.argv[1:]])
    path = write_results(args.name, markdown(report), report)
    print(f"wrote {path}", file=sys.stderr)
    s = report["summary"]
    print(
        "extract-cost: "
        + ", ".join(f"{m} {s[m]['per_s']:.1f}/s {s[m]['cpu_ms_per_memory_total']:.1f} ms CPU/memory" for m in MODES)
    )


if __name__ == "__main__":
    main()
