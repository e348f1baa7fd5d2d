"""HNSW build time against ``maintenance_work_mem`` (``postgres.indexBuildMemoryMb``).

``python -m benchmarks.build_memory [--rows N] [--memory-mb 64,1024] [--settings 24/128]``
puts ``N`` vectors made as the load benchmark makes the big tenant's (384-d
unit vectors around 200 Gaussian centres: :func:`benchmarks.halfvec.corpus`)
in one table of an embedded Postgres and builds the same cosine HNSW index on
it once for each ``maintenance_work_mem``, one build at a time, each
dropped before the next. Per build: wall seconds, Postgres' own CPU (the
build's backend, from ``/proc``: no parallel workers, 2 cores) and whether
pgvector reported that the graph outgrew the memory (its ``NOTICE``: the
rest of the build then goes on on disk).

Report: ``benchmarks/results/build-memory[-NAME].{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.common import write_results
from benchmarks.halfvec import corpus, fill_table
from deploy.embedded import EmbeddedPostgres


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(rows: int, memory_mb: list[int], m: int, efc: int, seed: int) -> dict[str, Any]:
    vectors, _, _ = corpus(rows, 1, seed)
    report: dict[str, Any] = {"rows": rows, "m": m, "ef_construction": efc, "seed": seed, "builds": []}
    pg = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="braid-build-memory-")) / "pg")
    dsn = pg.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            fill_table(conn, vectors)
            conn.execute("SET max_parallel_maintenance_workers = 0")  # one backend: its CPU is the build's
            pid = conn.info.backend_pid
            notices: list[str] = []
            conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
            for mb in memory_mb:
                notices.clear()
                conn.execute(f"SET maintenance_work_mem = '{mb}MB'")
                cpu, start = _cpu_s(pid), time.perf_counter()
                conn.execute(
                    f"CREATE INDEX vecs_hnsw ON vecs USING hnsw (embedding vector_cosine_ops) WITH (m = {m}, ef_construction = {efc})"
                )
                wall, cpu = time.perf_counter() - start, _cpu_s(pid) - cpu
                cur = conn.execute("SELECT pg_relation_size('vecs_hnsw')")
                size = int(cur.fetchone()[0])  # type: ignore[index]
                outgrew = [n for n in notices if "no longer fits" in n]
                row = {
                    "memory_mb": mb,
                    "build_s": wall,
                    "cpu_s": cpu,
                    "index_bytes": size,
                    "outgrew": bool(outgrew),
                    "notice": outgrew[0] if outgrew else None,
                }
                report["builds"].append(row)
                print(
                    f"build-memory: {mb} MB: {wall:.1f} s wall, {cpu:.1f} s CPU, {size / 2**20:.0f} MiB,"
                    f" {'outgrew it' if outgrew else 'fit'}",
                    flush=True,
                )
                conn.execute("DROP INDEX vecs_hnsw")
    finally:
        pg.stop()
    return report


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        "# HNSW build time against `maintenance_work_mem`",
        "",
        f"Command: `{command}`  ",
        f"{report['rows']} rows of 384-d unit vectors around 200 Gaussian centres (the load benchmark's);"
        f" cosine HNSW, m {report['m']} / efConstruction {report['ef_construction']}; one backend"
        " (`max_parallel_maintenance_workers` 0), the same index built once per setting.",
        "",
        "| maintenance_work_mem | build s (wall) | Postgres CPU s | ms a row (wall) | index MiB | graph outgrew it |",
        "|---|---|---|---|---|---|",
    ]
    for b in report["builds"]:
        lines.append(
            f"| {b['memory_mb']} MB | {b['build_s']:.1f} | {b['cpu_s']:.1f} | {b['build_s'] / report['rows'] * 1000:.2f}"
            f" | {b['index_bytes'] / 2**20:.0f} | {'yes: ' + b['notice'] if b['outgrew'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--memory-mb", default="64,1024")
    parser.add_argument("--settings", default="24/128", help="m/efConstruction")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    m, efc = (int(x) for x in args.settings.split("/"))
    report = run(args.rows, [int(x) for x in args.memory_mb.split(",")], m, efc, args.seed)
    command = (
        f"python -m benchmarks.build_memory --rows {args.rows} --memory-mb {args.memory_mb} --settings {args.settings}"
    )
    path = write_results("build-memory" + (f"-{args.name}" if args.name else ""), markdown(report, command), report)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
