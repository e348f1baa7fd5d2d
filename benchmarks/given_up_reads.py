"""Reads a recall stops waiting for: cut (as before 6406757) against left to finish.

``python -m benchmarks.given_up_reads <home> [--clients 8,32] [--recalls 600] [--pairs 2] [--name X]``
attaches to the stack a load run started in ``home`` (``/tmp/braid-load-*``,
paused at its ``load: hnsw`` stage as for :mod:`benchmarks.recall_cpu`),
opens Braid's engine in this process on the same Postgres and Typesense
(the stack's config), and runs fused recalls over the load's queries (vectors
supplied) from ``clients`` concurrent callers, alternating two ways of
ending a Postgres read whose caller stopped waiting (the recall's 200 ms
bound on its unindexed read, a source's deadline):

- ``cut``: the read is cancelled where it is, as Braid did before
  :func:`indexers.postgres.on_connection`: psycopg asks the server to cancel
  the statement over a second connection and, cancelled again, closes the
  connection, which the pool replaces;
- ``kept`` (shipped): the caller is answered at once and the read finishes
  on its connection, which goes back to the pool.

Per row: recalls/s, CPU per recall of this process (the engine), Postgres
(its backends alive at both readings: one opened and closed in between is
missed) and Typesense; connections the pool opened; sessions Postgres opened
(``pg_stat_database.sessions``, read on one connection kept open); the reads
given up (the engine's "unavailable" warnings) and the connections psycopg
closed on a cancel. Report: ``benchmarks/results/given-up-reads[-<name>].{md,json}``.
Last line: ``given-up-reads: clients=<c> cut_sessions=<n> kept_sessions=<n> cut_per_s=<x> kept_per_s=<x>``
(the highest client count, summed over the pairs).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import psycopg
from psycopg_pool import AsyncConnectionPool

from benchmarks.common import RESULTS, CpuMeter, cpu_per_call, write_results
from benchmarks.load.corpus import BIG_TENANT, build_corpus
from benchmarks.load.probe import attach
from benchmarks.load.run import postgres_sessions
from config.holder import ConfigHolder
from config.loader import parse_config
from indexers.postgres import generations as generations_module
from indexers.postgres import pool as pool_module
from indexers.runtime import Backends, open_runtime
from service.__main__ import one_blas_thread
from service.schemas import RecallIn
from service.validate import recall_options

__all__ = ["MODES", "cut_on_connection", "markdown", "measure", "summary_line", "use"]

T = TypeVar("T")

#: The two ways a given-up read ends, in the order each pair runs them.
MODES = ("cut", "kept")

WARM_UP = 100


async def cut_on_connection(pool: AsyncConnectionPool, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
    """``work`` on a pooled connection, cancelled with its caller: Braid's reads before on_connection."""
    async with pool.connection() as conn:
        return await work(conn)


#: Braid's own (shipped) way.
_KEPT = pool_module.on_connection


def use(mode: str) -> None:
    """Make every read of this process end a given-up read the ``mode`` way."""
    run = cut_on_connection if mode == "cut" else _KEPT
    pool_module.on_connection = run  # type: ignore[assignment]
    generations_module.on_connection = run  # type: ignore[assignment]


class _Counts(logging.Handler):
    """The warnings of reads given up, and of connections psycopg closed on a cancel."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.given_up = 0
        self.closed = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        self.given_up += "unavailable" in text
        self.closed += "cancellation interrupted" in text


async def measure(home: Path, size: int, seed: int, clients: list[int], recalls: int, pairs: int) -> dict[str, Any]:
    one_blas_thread()
    svc = attach(home)
    cfg = parse_config((home / "braid.yaml").read_text())
    dsn = svc.postgres_dsn()
    print("given-up-reads: building the corpus", flush=True)
    corpus = build_corpus(size, seed=seed)
    bodies = [{"query": q["text"], "embedding": v.tolist()} for q, v in zip(corpus.queries, corpus.query_vectors)]
    backends = Backends(
        postgres_dsn=dsn,
        typesense_nodes=(f"http://127.0.0.1:{svc.typesense_port()}",),
        typesense_api_key=svc.ts_key,
    )
    meter = CpuMeter(svc.processes)
    counts = _Counts()
    for name in ("braid", "psycopg"):
        logging.getLogger(name).addHandler(counts)
    report: dict[str, Any] = {"size": size, "seed": seed, "recalls": recalls, "pairs": pairs, "rows": []}
    try:
        with psycopg.connect(dsn, autocommit=True) as stats_conn:
            async with open_runtime(ConfigHolder(cfg), backends) as rt:
                engine, pool = rt.engine, rt.store.pool
                opts = [recall_options(msgspec.convert(b, RecallIn), cfg) for b in bodies]

                async def run(c: int, n: int) -> int:
                    it = iter(range(n))
                    degraded = 0

                    async def caller() -> None:
                        nonlocal degraded
                        for i in it:
                            result = await engine.recall(BIG_TENANT, opts[i % len(opts)])
                            degraded += bool(result.degraded)

                    await asyncio.gather(*(caller() for _ in range(c)))
                    return degraded

                for c in clients:
                    for pair in range(pairs):
                        for mode in MODES:
                            use(mode)
                            await run(c, WARM_UP)
                            await asyncio.sleep(1.0)  # reads the warm-up gave up end first
                            counts.given_up = counts.closed = 0
                            sessions = postgres_sessions(stats_conn)
                            opened = int(pool.get_stats().get("connections_num", 0))
                            before, start = meter(), time.perf_counter()
                            degraded = await run(c, recalls)
                            wall = time.perf_counter() - start
                            cpu = cpu_per_call(before, meter(), recalls)
                            row = {
                                "mode": mode,
                                "clients": c,
                                "pair": pair + 1,
                                "per_s": recalls / wall,
                                "cpu_ms": cpu,
                                "pool_opened": int(pool.get_stats().get("connections_num", 0)) - opened,
                                "pg_sessions": postgres_sessions(stats_conn) - sessions,
                                "given_up": counts.given_up,
                                "closed": counts.closed,
                                "degraded": degraded,
                            }
                            report["rows"].append(row)
                            print(
                                f"given-up-reads: {mode} clients={c} pair={pair + 1} {row['per_s']:.0f}/s "
                                f"engine {cpu.get('client', 0.0):.2f} ms, sessions {row['pg_sessions']}",
                                flush=True,
                            )
    finally:
        use("kept")
        for name in ("braid", "psycopg"):
            logging.getLogger(name).removeHandler(counts)
    return report


def summary_line(report: dict[str, Any]) -> str:
    top = max(r["clients"] for r in report["rows"])
    rows = [r for r in report["rows"] if r["clients"] == top]

    def total(mode: str, key: str) -> int:
        return sum(r[key] for r in rows if r["mode"] == mode)

    def per_s(mode: str) -> float:
        mine = [r["per_s"] for r in rows if r["mode"] == mode]
        return sum(mine) / len(mine)

    return (
        f"given-up-reads: clients={top} cut_sessions={total('cut', 'pg_sessions')} "
        f"kept_sessions={total('kept', 'pg_sessions')} cut_per_s={per_s('cut'):.0f} kept_per_s={per_s('kept'):.0f}"
    )


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        "# Reads a recall stops waiting for: cut, or left to finish",
        "",
        f"Command: `{command}`  ",
        "Braid's engine in the benchmark's process on a load run's stack (writes paused), fused recalls over "
        f"the load's queries (vectors supplied), {report['recalls']} a row after a warm-up of {WARM_UP}, "
        "the two modes alternated. `cut`: a read whose caller stopped waiting is cancelled where it is (Braid "
        "before `on_connection`); `kept`: it finishes on its connection (shipped). CPU ms per recall: this "
        "process (the engine), Postgres (its backends alive at both readings), Typesense. `pool opened`: "
        "connections the pool opened; `pg sessions`: sessions Postgres opened; `given up`: reads the engine "
        "stopped waiting for (its warnings); `closed`: connections psycopg closed on a cancel; `degraded`: "
        "recalls with a source that failed or timed out.",
        "",
        "| mode | clients | pair | recalls/s | engine CPU ms | Postgres CPU ms | Typesense CPU ms | pool opened "
        "| pg sessions | given up | closed | degraded |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        cpu = r["cpu_ms"]
        lines.append(
            f"| {r['mode']} | {r['clients']} | {r['pair']} | {r['per_s']:.0f} | {cpu.get('client', 0.0):.2f} "
            f"| {cpu.get('postgres', 0.0):.2f} | {cpu.get('typesense', 0.0):.2f} | {r['pool_opened']} "
            f"| {r['pg_sessions']} | {r['given_up']} | {r['closed']} | {r['degraded']} |"
        )
    lines += ["", f"`{summary_line(report)}`"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.given_up_reads",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("home", type=Path, help="the load run's home (/tmp/braid-load-*)")
    parser.add_argument("--size", type=int, default=10_000, help="the load run's --size (its queries)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--clients", default="8,32", help="comma-separated concurrent callers")
    parser.add_argument("--recalls", type=int, default=600)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    report = asyncio.run(measure(args.home, args.size, args.seed, clients, args.recalls, args.pairs))
    command = " ".join(["python -m benchmarks.given_up_reads <home>", *sys.argv[2:]])
    stem = "given-up-reads" + (f"-{args.name}" if args.name else "")
    write_results(stem, markdown(report, command), report, results=RESULTS)
    print(summary_line(report), flush=True)


if __name__ == "__main__":
    main()
