"""Where a fused recall's (or a write's) CPU goes in the service: a py-spy profile under load.

``python -m benchmarks.recall_profile [--size N] [--seconds S] [--clients C] [--writes R]
[--sources a,b] [--set dotted.key=value ...]`` loads the load benchmark's synthetic corpus (``benchmarks/load/corpus.py``,
big tenant of ``N`` memories) into the service on the embedded stack, then
drives fused recalls (vectors supplied, as ``make bench-load``'s fused rows;
with ``--sources``, recalls restricted to those sources) from ``C`` clients for ``S`` seconds while ``py-spy record`` samples the
service process (``--idle`` off: only samples where a thread was on the CPU).
It reports CPU per recall by process (the load benchmark's meter) and the
service's profile: self and inclusive share of samples by function, and the
share under each of a few named stages. With ``--writes R`` it drives single
writes instead (the load benchmark's steady writes: one memory of the big
tenant under a new id, its vector supplied) at ``R`` a second, open loop, and
the CPU is per write, outbox drain included. Report:
``benchmarks/results/recall-profile[-<name>].{md,json}`` plus py-spy's raw
collapsed stacks beside it (``.txt``). Last line:
``recall-profile: size=<n> recalls=<n> service_ms=<x> postgres_ms=<x> typesense_ms=<x> samples=<n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import msgspec

from benchmarks.common import RESULTS, CpuMeter
from benchmarks.load.client import LeanClient
from benchmarks.load.corpus import BIG_TENANT, build_corpus
from benchmarks.load.run import loaded_service, steady_writes, timed
from benchmarks.quality.tuning import Override, parse_set

#: Stages of a recall, each named by a frame that appears under it (the first match wins).
STAGES = {
    "outbox -> typesense": "indexers/sync.py",
    "extraction (spaCy)": "indexers/spacy_extractor.py",
    "typesense source": "indexers/typesense/",
    "pgvector source": "indexers/pgvector.py",
    "graph source": "indexers/graph.py",
    "postgres store (other reads, writes)": "indexers/postgres/",
    "fusion + formatting": "fusion/",
    "psycopg": "psycopg/",
    "httpx/httpcore": "httpcore/",
    "msgspec/json": "msgspec",
    "litestar": "litestar/",
}


def _frames(stack: str) -> list[str]:
    """py-spy's raw format: ``thread;frame;frame;... count`` with frames ``func (file:line)``."""
    return [f.rsplit(":", 1)[0] if f.endswith(")") else f for f in stack.split(";")[1:]]


def summarise(collapsed: str, top: int = 40) -> dict[str, Any]:
    """Self and inclusive sample counts by function, and by stage, from py-spy's raw output."""
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    stage: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = _frames(stack)
        total += count
        if frames:
            self_c[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
        joined = ";".join(frames)
        stage[next((name for name, mark in STAGES.items() if mark in joined), "other")] += count
    share = lambda c: {k: round(v / max(total, 1), 4) for k, v in c.most_common(top)}  # noqa: E731
    return {"samples": total, "self": share(self_c), "inclusive": share(incl), "stages": share(stage)}


def py_spy(
    pid: int, out: Path, *, rate: int = 200, seconds: int | None = None, native: bool = False
) -> subprocess.Popen[bytes]:
    """``py-spy record`` of ``pid`` into ``out`` (raw format) at ``rate`` Hz,
    for ``seconds`` or until sent SIGINT; ``native`` adds C frames (else the
    process is sampled without being paused)."""
    return subprocess.Popen(
        [
            shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--format",
            "raw",
            *(["--duration", str(seconds)] if seconds is not None else []),
            "--output",
            str(out),
            *(["--native"] if native else ["--nonblocking"]),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def profile(
    size: int,
    seconds: float,
    clients: int,
    rate: int,
    out: Path,
    native: bool = False,
    writes: float = 0.0,
    sources: list[str] | None = None,
    sets: list[Override] | None = None,
) -> dict[str, Any]:
    corpus = build_corpus(size)
    report: dict[str, Any] = {
        "size": size,
        "seconds": seconds,
        "clients": clients,
        "rate": rate,
        "writes": writes,
        "sources": sources,
        "sets": [f"{k}={v}" for k, v in sets or ()],
    }
    print("profile: loading", flush=True)
    async with loaded_service(corpus, "braid-profile-", sets=sets or ()) as (svc, headers):
        only = {"sources": sources} if sources else {}
        bodies = [
            msgspec.json.encode({"query": q["text"], "embedding": v.tolist(), **only})
            for q, v in zip(corpus.queries, corpus.query_vectors, strict=True)
        ]
        meter = CpuMeter(svc.processes)
        recall_headers = {**headers[BIG_TENANT], "content-type": "application/json"}
        async with LeanClient(svc.url, max_connections=64) as lean:
            print("profile: warm-up", flush=True)
            await timed(lean, recall_headers, bodies, 4, 0)
            kind = "+".join(sources) if sources else "fused"
            what = f"single writes at {writes:g}/s" if writes else f"{kind} recalls at {clients} clients"
            print(f"profile: {seconds:.0f} s of {what} under py-spy", flush=True)
            raw = out.with_suffix(".txt")
            spy = py_spy(svc.proc.pid, raw, rate=rate, seconds=int(seconds), native=native)
            await asyncio.sleep(1.0)  # py-spy attaches before the measured recalls start
            if writes:
                async with httpx.AsyncClient(base_url=svc.url, timeout=300) as health:
                    done = await steady_writes(
                        lean, health, recall_headers, corpus, (int(writes),), seconds - 2, meter, svc.postgres_dsn()
                    )
                w = done[str(int(writes))]
                row = {
                    "n": w["writes"],
                    "qps": w["acked_per_s"],
                    "p50": w["ack_ms"]["p50"],
                    "cpu_ms": w["cpu_ms_per_write"],
                    "degraded": w["error_count"],
                }
            else:
                row = await timed(lean, recall_headers, bodies, clients, seconds - 2, meter)
            _, err = spy.communicate(timeout=120)
            if spy.returncode != 0:
                raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')[-2000:]}")
        report["recalls"] = row["n"]
        report["qps"] = row["qps"]
        report["p50_ms"] = row["p50"]
        report["cpu_ms"] = row["cpu_ms"]
        report["degraded"] = row["degraded"]
        report["profile"] = summarise(raw.read_text())
    return report


def markdown(report: dict[str, Any], command: str) -> str:
    cpu = report["cpu_ms"]
    prof = report["profile"]
    unit = "write" if report.get("writes") else "recall"
    kind = "+".join(report["sources"]) if report.get("sources") else "fused"
    driven = (
        f"single writes at {report['writes']:g}/s (vectors supplied), outbox drained"
        if report.get("writes")
        else f"{kind} recalls with vectors supplied, {report['clients']} clients"
    )
    if report.get("sets"):
        driven += "; config: shipped with " + ", ".join(f"`{s}`" for s in report["sets"])
    lines = [
        f"# Where a {'fused' if unit == 'write' else kind} {unit}'s CPU goes (service profile under load)",
        "",
        f"Command: `{command}`  ",
        f"Corpus: the load benchmark's, big tenant of {report['size']} memories; {driven} for "
        f"{report['seconds']:.0f} s; py-spy at {report['rate']} Hz "
        "on the service (samples only while a thread is on the CPU, GIL or not).",
        "",
        f"{unit.title()}s: {report['recalls']} ({report['qps']:.1f}/s, p50 {report['p50_ms']:.1f} ms, "
        f"{report['degraded']} {'errors' if report.get('writes') else 'degraded'}).",
        "",
        f"| CPU ms per {unit} | service | postgres | typesense | client |",
        "|---|---|---|---|---|",
        f"| | {cpu.get('service', 0):.2f} | {cpu.get('postgres', 0):.2f} | {cpu.get('typesense', 0):.2f} "
        f"| {cpu.get('client', 0):.2f} |",
        "",
        f"## Service samples by stage ({prof['samples']} samples; first matching stage of each stack)",
        "",
        f"| stage | share | ≈ ms per {unit} |",
        "|---|---|---|",
    ]
    service_ms = cpu.get("service", 0.0)
    lines += [f"| {k} | {v:.1%} | {v * service_ms:.2f} |" for k, v in prof["stages"].items()]
    for title, key in (("self", "self"), ("inclusive", "inclusive")):
        lines += ["", f"## Top functions, {title}", "", "| function | share |", "|---|---|"]
        lines += [f"| `{k}` | {v:.1%} |" for k, v in prof[key].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--name", default="", help="report name suffix")
    parser.add_argument("--writes", type=float, default=0.0, help="profile single writes at this rate a second instead")
    parser.add_argument(
        "--native", action="store_true", help="py-spy --native: C extension frames too (pauses the service to sample)"
    )
    parser.add_argument(
        "--sources", default="", help="comma list: recalls restricted to these sources (default: fused)"
    )
    parser.add_argument(
        "--set", action="append", default=[], type=parse_set, help="dotted.key=value over the shipped config"
    )
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "write-cpu-profile" if args.writes else "recall-profile"
    out = RESULTS / (stem + (f"-{args.name}" if args.name else "") + ".md")
    sources = [s for s in args.sources.split(",") if s] or None
    report = asyncio.run(
        profile(args.size, args.seconds, args.clients, args.rate, out, args.native, args.writes, sources, args.set)
    )
    command = "python -m benchmarks.recall_profile " + " ".join(sys.argv[1:])
    out.write_text(markdown(report, command))
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    cpu = report["cpu_ms"]
    print(f"wrote {out}")
    print(
        f"recall-profile: size={report['size']} recalls={report['recalls']} service_ms={cpu.get('service', 0):.2f} "
        f"postgres_ms={cpu.get('postgres', 0):.2f} typesense_ms={cpu.get('typesense', 0):.2f} "
        f"samples={report['profile']['samples']}"
    )


if __name__ == "__main__":
    main()
