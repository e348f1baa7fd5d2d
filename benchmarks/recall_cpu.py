"""The recall path's own CPU, without HTTP: Braid's engine in this process on a load run's stack.

``python -m benchmarks.recall_cpu <home> [--size N] [--recalls R] [--profile] [--name X]``
attaches to the stack a load run started in ``home`` (``/tmp/braid-load-*``,
its writes paused as for :mod:`benchmarks.load.probe`), opens a second Braid
runtime in this process on the same Postgres and Typesense (the stack's
config; numpy's BLAS on one thread, as the service holds it), and runs
``R`` recalls one at a time per row, after a warm-up of 100: fused, then
each source alone, over the load's queries with their vectors supplied
(``--size`` and ``--seed`` rebuild the load's corpus for them). CPU per
recall by process: this one (the engine, its sources, fusion and the
block: everything a recall costs the service but the HTTP server),
Postgres and Typesense; the service the load started idles meanwhile. One
recall at a time, so there is no contention between recalls: the figures
are the recall path's floor under this code, to set against the service's
CPU per recall under load (``make bench-load``). Each row also counts the
Postgres round trips a recall makes (connections taken from the runtime's
pool: one a round trip), and a last table what one round trip costs alone
(its statements reading nothing). The fused recalls are then
sent once more, one at a time over HTTP to the service the load started:
the service's CPU per recall less this process' is what the HTTP server and
the framework add.

``--profile`` adds cProfile's top functions (by own time) over the fused row
run once more: cProfile's overhead inflates every call, so read them as
shares. Report: ``benchmarks/results/recall-cpu[-<name>].{md,json}``. Last line:
``recall-cpu: memories=<n> fused_ms=<x> typesense_ms=<x> pgvector_ms=<x> graph_ms=<x> service_http_ms=<x>``
(this process' CPU per recall; the service's through HTTP).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import io
import pstats
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import psycopg

from benchmarks.common import RESULTS, CpuMeter, cpu_per_call, write_results
from benchmarks.load.client import LeanClient
from benchmarks.load.corpus import BIG_TENANT, build_corpus
from benchmarks.load.probe import attach, big_tenant_key
from config.holder import ConfigHolder
from config.loader import parse_config
from indexers.postgres import Read, current_generation, tenant_reads
from indexers.runtime import Backends, open_runtime
from service.__main__ import one_blas_thread
from service.schemas import RecallIn
from service.validate import recall_options

__all__ = ["ROWS", "markdown", "measure", "summary_line"]

#: Each row's label and the sources its recalls ask for (None: every source, fused).
ROWS: tuple[tuple[str, list[str] | None], ...] = (
    ("fused", None),
    ("typesense", ["typesense"]),
    ("pgvector", ["pgvector"]),
    ("graph", ["graph"]),
)

#: Recalls run before each row's, not counted.
WARM_UP = 100

#: Functions listed from the profile.
TOP = 30


async def measure(home: Path, size: int, seed: int, recalls: int, profile: bool) -> dict[str, Any]:
    # As in the service: numpy's products on the calling thread (a BLAS pool's
    # threads spin after each one, and would be counted here).
    one_blas_thread()
    svc = attach(home)
    text = (home / "braid.yaml").read_text()
    cfg = parse_config(text)
    key = big_tenant_key(text)
    dsn = svc.postgres_dsn()
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM memories WHERE tenant = %s", (BIG_TENANT,)).fetchone()
    held = int(row[0]) if row else 0
    print(f"recall-cpu: {held} memories in {BIG_TENANT}; building the corpus", flush=True)
    corpus = build_corpus(size, seed=seed)
    backends = Backends(
        postgres_dsn=dsn,
        typesense_nodes=(f"http://127.0.0.1:{svc.typesense_port()}",),
        typesense_api_key=svc.ts_key,
    )
    bodies = [{"query": q["text"], "embedding": v.tolist()} for q, v in zip(corpus.queries, corpus.query_vectors)]
    meter = CpuMeter(svc.processes)
    report: dict[str, Any] = {"memories": held, "size": size, "seed": seed, "recalls": recalls, "rows": []}
    async with open_runtime(ConfigHolder(cfg), backends) as rt:
        engine = rt.engine

        async def run(sources: list[str] | None, n: int, offset: int = 0) -> None:
            for i in range(offset, offset + n):
                body = bodies[i % len(bodies)]
                opts = recall_options(msgspec.convert({**body, "sources": sources}, RecallIn), cfg)
                await engine.recall(BIG_TENANT, opts)

        checkouts = _count_checkouts(engine.store.pool)
        for label, sources in ROWS:
            await run(sources, WARM_UP)
            taken = checkouts[0]
            before, start = meter(), time.perf_counter()
            await run(sources, recalls, WARM_UP)
            wall = (time.perf_counter() - start) * 1000 / recalls
            cpu = cpu_per_call(before, meter(), recalls)
            trips = (checkouts[0] - taken) / recalls
            report["rows"].append({"config": label, "cpu_ms": cpu, "wall_ms": wall, "round_trips": trips})
            print(
                f"recall-cpu: {label}: {cpu['client']:.2f} ms of this process' CPU,"
                f" {trips:.2f} Postgres round trips a recall",
                flush=True,
            )
        # Four times as many: a round trip costs Postgres tens of microseconds, its meter ticks 10 ms.
        report["trips"] = await _round_trips(engine.store.pool, meter, 4 * recalls)
        report["http"] = await _through_service(svc.url, key, bodies, recalls, meter)
        print(f"recall-cpu: fused through the service: {report['http']['cpu_ms']['service']:.2f} ms", flush=True)
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            await run(None, recalls, WARM_UP)
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(TOP)
            report["profile"] = out.getvalue()
    return report


#: Round trips timed alone: a label and the reads each sends (statements that read nothing).
TRIPS: tuple[tuple[str, int], ...] = (("scope + 1 statement", 1), ("scope + 2 statements", 2))


async def _round_trips(pool: Any, meter: CpuMeter, n: int) -> list[dict[str, Any]]:
    """CPU per Postgres round trip by process, the statements reading
    nothing: a tenant-scoped pipeline of ``SELECT 1`` as a recall's reads go
    (:func:`~indexers.postgres.tenant_reads`), and the unscoped generation
    read (:func:`~indexers.postgres.current_generation`); ``n`` each, after
    as many not counted."""
    cases: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        (label, functools.partial(tenant_reads, pool, BIG_TENANT, [Read("SELECT 1")] * reads)) for label, reads in TRIPS
    ]
    cases.append(("generation alone (unscoped)", functools.partial(current_generation, pool, BIG_TENANT)))
    rows = []
    for label, trip in cases:
        for _ in range(n):
            await trip()
        before = meter()
        for _ in range(n):
            await trip()
        rows.append({"trip": label, "cpu_ms": cpu_per_call(before, meter(), n)})
    return rows


def _count_checkouts(pool: Any) -> list[int]:
    """A counter (its one item) of the connections taken from ``pool`` from
    now on: one per Postgres round trip of a recall, besides the runtime's
    own background work (the bookkeeper's batched writes, the outbox
    worker's polls)."""
    counter = [0]
    connection = pool.connection

    def counted(*args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return connection(*args, **kwargs)

    pool.connection = counted
    return counter


async def _through_service(
    url: str, key: str, bodies: list[dict[str, Any]], recalls: int, meter: CpuMeter
) -> dict[str, Any]:
    """The fused recalls again, one at a time over HTTP to the service the
    load started (same stack, same bodies): CPU per recall by process and
    wall ms, after the same warm-up."""
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    encoded = [msgspec.json.encode(b) for b in bodies]
    async with LeanClient(url) as client:

        async def run(n: int, offset: int = 0) -> None:
            for i in range(offset, offset + n):
                code, raw = await client.post("/v1/recall", encoded[i % len(encoded)], headers)
                if code != 200:
                    raise RuntimeError(f"recall through the service: {code} {raw[:200]!r}")

        await run(WARM_UP)
        before, start = meter(), time.perf_counter()
        await run(recalls, WARM_UP)
        wall = (time.perf_counter() - start) * 1000 / recalls
    return {"cpu_ms": cpu_per_call(before, meter(), recalls), "wall_ms": wall}


def summary_line(report: dict[str, Any]) -> str:
    by = {r["config"]: r["cpu_ms"].get("client", 0.0) for r in report["rows"]}
    figures = " ".join(f"{label}_ms={by[label]:.2f}" for label, _ in ROWS if label in by)
    http = report.get("http")
    service = "" if not http else f" service_http_ms={http['cpu_ms'].get('service', 0.0):.2f}"
    return f"recall-cpu: memories={report['memories']} {figures}{service}"


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        f"# The recall path's CPU without HTTP: {report['memories']} memories in the big tenant",
        "",
        f"Command: `{command}`  ",
        "A second Braid runtime in the benchmark's process on a load run's stack (writes paused), "
        f"{report['recalls']} recalls one at a time per row after a warm-up of {WARM_UP}, the load's queries "
        "with their vectors supplied. `this process`: the engine, its sources, fusion and the block (what a "
        "recall costs the service but the HTTP server and the contention of recalls in flight together). "
        "`Postgres round trips`: per recall, the connections this process' pool lent (one a round trip; "
        "the runtime's background work, the bookkeeper's batched writes and the outbox worker's polls, "
        "counted too).",
        "",
        "| recall | this process CPU ms | Postgres CPU ms | Typesense CPU ms | wall ms | Postgres round trips |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        cpu = r["cpu_ms"]
        # A report from before round trips were counted shows `-`.
        count = "-" if r.get("round_trips") is None else f"{r['round_trips']:.2f}"
        lines.append(
            f"| {r['config']} | {cpu.get('client', 0.0):.2f} | {cpu.get('postgres', 0.0):.2f} "
            f"| {cpu.get('typesense', 0.0):.2f} | {r['wall_ms']:.2f} | {count} |"
        )
    trips = report.get("trips")
    if trips:
        lines += [
            "",
            "One Postgres round trip alone, its statements reading nothing (the pool, the scope, the pipeline): "
            "what each of a recall's round trips costs before its rows.",
            "",
            "| round trip | this process CPU ms | Postgres CPU ms |",
            "|---|---|---|",
        ]
        for t in trips:
            cpu = t["cpu_ms"]
            lines.append(f"| {t['trip']} | {cpu.get('client', 0.0):.3f} | {cpu.get('postgres', 0.0):.3f} |")
    http = report.get("http")
    if http:
        cpu = http["cpu_ms"]
        lines += [
            "",
            "The fused recalls again, one at a time over HTTP to the service the load started (same stack, same "
            "bodies): what the HTTP server and the framework add is the service's CPU less this process' above.",
            "",
            "| recall | service CPU ms | Postgres CPU ms | Typesense CPU ms | client CPU ms | wall ms |",
            "|---|---|---|---|---|---|",
            f"| fused, through the service | {cpu.get('service', 0.0):.2f} | {cpu.get('postgres', 0.0):.2f} "
            f"| {cpu.get('typesense', 0.0):.2f} | {cpu.get('client', 0.0):.2f} | {http['wall_ms']:.2f} |",
        ]
    if report.get("profile"):
        lines += [
            "",
            f"## Fused row under cProfile (top {TOP} by own time; cProfile inflates every call: read as shares)",
            "",
            "```",
            report["profile"].strip(),
            "```",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recall_cpu", description=__doc__)
    parser.add_argument("home", type=Path, help="the load run's home (/tmp/braid-load-*)")
    parser.add_argument("--size", type=int, default=10_000, help="the load run's --size (its queries)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--recalls", type=int, default=500)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    report = asyncio.run(measure(args.home, args.size, args.seed, args.recalls, args.profile))
    command = " ".join(["python -m benchmarks.recall_cpu <home>", *sys.argv[2:]])
    stem = "recall-cpu" + (f"-{args.name}" if args.name else "")
    write_results(stem, markdown(report, command), report, results=RESULTS)
    print(summary_line(report), flush=True)


if __name__ == "__main__":
    main()
