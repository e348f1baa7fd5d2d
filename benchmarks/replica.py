"""Recalls from a streaming replica with read-your-writes: ``python -m benchmarks.replica``.

An embedded Postgres (the primary) and a streaming replica of it made with
``pg_basebackup -R`` (:class:`deploy.embedded.EmbeddedReplica`, on a free
loopback port) run in a temporary directory; ``python -m service`` serves
over HTTP with ``postgres.dsn`` on the primary and ``postgres.replicaDsn`` on
the replica (and its own embedded Typesense). One client then runs
``--pairs`` (1,000) write-then-recall pairs, one after the other: write a
memory, recall it at once with its own text as the query, and count a miss
when the answer does not hold it. Then ``--reads`` (200) recalls of earlier
memories with no write between them. Reported: missed own writes, recalls
served by the replica and by the primary (from each answer's ``served_by``,
and ``/metrics``' ``braid_recalls_served_total``), p50/p95 latency of the
recalls by where they were served, and of the writes. Writes
``benchmarks/results/replica.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import Service, pct, write_results
from deploy.embedded import EmbeddedPostgres, EmbeddedReplica

DATABASE = "braid"


def quantiles(values: list[float]) -> dict[str, float | None]:
    """p50 and p95 in ms, None for no values (JSON has no NaN)."""
    return {"p50": pct(values, 50) if values else None, "p95": pct(values, 95) if values else None}


def served_metrics(service: Service) -> dict[str, float]:
    text = httpx.get(f"{service.url}/metrics", timeout=10).text
    out = {"primary": 0.0, "replica": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "braid_recalls_served_total":
                out[sample.labels["by"]] = sample.value
    return out


def wait_replica(service: Service, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replica = httpx.get(f"{service.url}/health", timeout=5).json().get("replica")
        if replica is not None and replica["status"] == "up":
            return
        time.sleep(0.2)
    raise RuntimeError(f"the replica did not come up in {timeout:.0f} s:\n{service.log_tail()}")


def _recall(client: httpx.Client, text: str, memory_id: str, ms: dict[str, list[float]]) -> bool:
    """Recall ``text``: whether ``memory_id`` came back. Its time is added to
    ``ms`` under the name of whom served it."""
    start = time.perf_counter()
    r = client.post("/v1/recall", json={"query": text})
    elapsed = (time.perf_counter() - start) * 1000
    r.raise_for_status()
    out = r.json()
    ms[out["served_by"]].append(elapsed)
    return memory_id in {item["id"] for item in out["items"]}


def run(service: Service, pairs: int, reads: int) -> dict[str, Any]:
    recall_ms: dict[str, list[float]] = {"primary": [], "replica": []}
    write_ms: list[float] = []
    missed: list[int] = []
    written: list[tuple[str, str]] = []
    with httpx.Client(base_url=service.url, headers=service.headers, timeout=60) as client:
        for i in range(pairs):
            text = f"Note {i}: the parcel for flat {i % 97} is in locker {i * 7919 % 10007}"
            start = time.perf_counter()
            r = client.post("/v1/memories", json={"memories": [{"content": text}]})
            write_ms.append((time.perf_counter() - start) * 1000)
            r.raise_for_status()
            (memory_id,) = r.json()["ids"]
            written.append((memory_id, text))
            if not _recall(client, text, memory_id, recall_ms):
                missed.append(i)
        after_pairs = {k: len(v) for k, v in recall_ms.items()}
        read_ms: dict[str, list[float]] = {"primary": [], "replica": []}
        read_missed = 0
        for j in range(reads):
            memory_id, text = written[(j * 37) % len(written)]
            read_missed += not _recall(client, text, memory_id, read_ms)
    metrics = served_metrics(service)
    return {
        "pairs": pairs,
        "missed_own_writes": len(missed),
        "missed_at": missed,
        "pairs_served": after_pairs,
        "pairs_recall_ms": {k: quantiles(v) for k, v in recall_ms.items()},
        "pairs_recall_p50_ms": pct([x for v in recall_ms.values() for x in v], 50),
        "write_ms": quantiles(write_ms),
        "reads": reads,
        "reads_missed": read_missed,
        "reads_served": {k: len(v) for k, v in read_ms.items()},
        "reads_recall_ms": {k: quantiles(v) for k, v in read_ms.items()},
        "metrics_served": metrics,
        "health_replica": httpx.get(f"{service.url}/health", timeout=5).json()["replica"],
    }


def report(r: dict[str, Any]) -> str:
    def ms(d: dict[str, float | None]) -> str:
        return " | ".join("–" if d[q] is None else f"{d[q]:.1f}" for q in ("p50", "p95"))

    pairs, reads = r["pairs_served"], r["reads_served"]
    lines = [
        "# Recalls from a streaming replica, read-your-writes (`python -m benchmarks.replica`)",
        "",
        "An embedded Postgres 18 primary and a streaming replica of it (`pg_basebackup -R`, hot standby "
        "on a loopback port), `python -m service` over HTTP with `postgres.replicaDsn` on the replica, "
        "on the shared 2-core machine. One client, one request at a time: "
        f"{r['pairs']:,} pairs of a write (one memory) and, at once, a recall with the memory's own text "
        f"as the query; then {r['reads']} recalls of earlier memories with no write between them. "
        "A recall reads the replica only once it has replayed past the tenant's last write "
        "(WAL position after the commit), the primary otherwise.",
        "",
        f"**Missed own writes: {r['missed_own_writes']} of {r['pairs']:,}.**",
        "",
        "| phase | served by replica | served by primary | recall p50 ms (replica) | p95 | "
        "recall p50 ms (primary) | p95 |",
        "|---|---|---|---|---|---|---|",
        f"| write then recall | {pairs['replica']} | {pairs['primary']} | {ms(r['pairs_recall_ms']['replica'])} | "
        f"{ms(r['pairs_recall_ms']['primary'])} |",
        f"| recalls only | {reads['replica']} | {reads['primary']} | {ms(r['reads_recall_ms']['replica'])} | "
        f"{ms(r['reads_recall_ms']['primary'])} |",
        "",
        f"Recall p50 over the {r['pairs']:,} pairs: {r['pairs_recall_p50_ms']:.1f} ms; "
        f"write p50 {r['write_ms']['p50']:.1f} ms (p95 {r['write_ms']['p95']:.1f}). "
        f"Recalls-only phase: {r['reads_missed']} of {r['reads']} did not hold the memory asked for "
        "(a ranking figure, not a consistency one: the memory was written long before).",
        "",
        "A recall right after a write reads the replica when the replica has replayed the write by the time "
        "the recall asks for its replay position (one query on the replica); else the primary. On one "
        "machine the replica adds no capacity (the query embedding dominates a recall's time, and a recall "
        "right after a write shares the CPU with that write's outbox sync): the figures are about "
        "consistency and routing, not speed.",
        "",
        f"`/metrics` `braid_recalls_served_total`: replica {r['metrics_served']['replica']:.0f}, "
        f"primary {r['metrics_served']['primary']:.0f}; `/health` replica: "
        f"{r['health_replica']['status']}, fallbacks {r['health_replica']['fallbacks']}, "
        f"replay position probes {r['health_replica']['probes']}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--reads", type=int, default=200)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="braid-replica-"))
    home.chmod(0o755)
    pg = EmbeddedPostgres(home / "postgres")
    replica = EmbeddedReplica(pg, home / "replica")
    service: Service | None = None
    try:
        pg.start()
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        replica.start()
        primary_dsn = pg.dsn().replace("/postgres?", f"/{DATABASE}?")
        config = f"postgres:\n  dsn: '{primary_dsn}'\n  replicaDsn: '{replica.dsn(DATABASE)}'\n"
        service = Service(config_text=config, prefix="braid-replica-service-")
        wait_replica(service)
        result = run(service, args.pairs, args.reads)
    finally:
        if service is not None:
            service.stop()
        replica.stop(mode="immediate")
        pg.stop(mode="immediate")
        shutil.rmtree(home, ignore_errors=True)
    md = write_results("replica", report(result), result)
    print(f"wrote {md}: missed {result['missed_own_writes']} of {result['pairs']}", file=sys.stderr)


if __name__ == "__main__":
    main()
