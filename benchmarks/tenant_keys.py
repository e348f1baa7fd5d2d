"""What a Typesense filter by tenant name costs against one by tenant key, as the collection grows.

``python -m benchmarks.tenant_keys [--tenants 70,630] [--queries 300] [--name NAME]``
starts an embedded Typesense and writes, in stages, small tenants of 100
memories each (the load benchmark's corpus generator, ``benchmarks/load/corpus.py``;
5% of memories superseded) into one keyword collection, as Braid's own
documents (``record_document``). At each stage it makes, for ``--queries``
queries on sampled tenants (a memory's first 8 words), the ``bm25`` searches a
recall sends (``Bm25Keywords``): cold (the filter's stats, one count per term,
the candidate search) and warm (the candidate search alone). Each set is sent
twice more with its tenant filtered by name as Braid did before
(``tenant:=<name> && superseded_at:=<never>``, terms in ``terms``) and by key
as it does now (``current_key``, terms in ``tenant_terms``), and the Typesense
process' CPU is read around each pass (psutil). The answers' ``found`` are
compared: by key they count each tenant's own current documents, by name every
tenant whose name folds to the same (none in this corpus).
Report: ``benchmarks/results/tenant-keys[-<name>].{md,json}``. Last line:
``tenant-keys: docs=<a>,<b> by_name_warm_ms=<x>,<y> by_key_warm_ms=<x>,<y>``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from benchmarks.common import write_results
from benchmarks.load.corpus import DIM, _tenant, _unit
from deploy.embedded import EmbeddedTypesense
from indexers.base import Filters, MemoryRecord
from indexers.typesense.bm25 import Bm25Keywords
from indexers.typesense.documents import (
    NEVER,
    collection_schema,
    narrow_filter,
    quoted,
    quoted_list,
    record_document,
    tenant_key,
)
from indexers.typesense.keywords import keyword_terms

PER_TENANT = 100
COLLECTION = "keys"
#: What the source asks of a candidate (indexers/typesense/source.py's _BM25_FIELDS, near enough).
FIELDS = "memory_id,tenant,tier,confidence,created_at,term_counts,length,context_length"
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _records(name: str, rng: np.random.Generator, centres: np.ndarray) -> list[MemoryRecord]:
    tenant, _ = _tenant(name, PER_TENANT, rng, centres, 0, 1.0)
    return [
        MemoryRecord(
            id=m["id"],
            tenant=name,
            content=m["content"],
            kind="note",
            tier=m["tier"],
            created_at=T0 + timedelta(minutes=i),
            confidence=1.0,
            superseded_at=T0 + timedelta(days=1) if rng.random() < 0.05 else None,
        )
        for i, m in enumerate(tenant.memories)
    ]


def _by_name(search: dict[str, Any], tenant: str, terms: dict[str, str]) -> dict[str, Any]:
    """``search`` with its filter as Braid wrote it before tenant keys."""
    by_key = search["filter_by"]
    head = f"tenant:={quoted(tenant)} && superseded_at:={NEVER}"
    if " && tenant_terms:=" in by_key:
        sent = [terms[token.strip("`")] for token in by_key.split(" && tenant_terms:=")[1].strip("[]").split(",")]
        head += f" && terms:={quoted_list(sent)}"
    return {**search, "filter_by": head}


def _pass(client: httpx.Client, proc: psutil.Process, bodies: list[list[dict[str, Any]]]) -> dict[str, float]:
    cpu = sum(proc.cpu_times()[:2])
    start = time.perf_counter()
    found = 0
    for body in bodies:
        r = client.post("/multi_search", json={"searches": body})
        r.raise_for_status()
        for result in r.json()["results"]:
            if "error" in result:
                raise SystemExit(f"tenant-keys: Typesense refused a search: {result}")
            found += int(result.get("found", 0))
    cpu = sum(proc.cpu_times()[:2]) - cpu
    return {
        "cpu_ms_per_recall": 1000 * cpu / len(bodies),
        "wall_ms_per_recall": 1000 * (time.perf_counter() - start) / len(bodies),
        "searches": sum(len(b) for b in bodies),
        "found": found,
    }


def measure(stages: list[int], queries: int) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    centres = _unit(rng.standard_normal((200, DIM)))
    report: dict[str, Any] = {"per_tenant": PER_TENANT, "queries": queries, "stages": []}
    with tempfile.TemporaryDirectory(prefix="braid-tenant-keys-") as tmp:
        ts = EmbeddedTypesense(Path(tmp) / "typesense")
        ts.start()
        try:
            assert ts.proc is not None
            proc = psutil.Process(ts.proc.pid)
            client = httpx.Client(base_url=ts.url, headers={"X-TYPESENSE-API-KEY": ts.api_key}, timeout=300)
            client.post("/collections", json=collection_schema(COLLECTION)).raise_for_status()
            tenants: dict[str, list[MemoryRecord]] = {}
            for stage in stages:
                start = time.perf_counter()
                while len(tenants) < stage:
                    name = f"t{len(tenants):05d}"
                    tenants[name] = _records(name, rng, centres)
                    body = "\n".join(json.dumps(record_document(r)) for r in tenants[name])
                    client.post(
                        f"/collections/{COLLECTION}/documents/import", params={"action": "upsert"}, content=body
                    ).raise_for_status()
                print(f"tenant-keys: {stage} tenants written ({time.perf_counter() - start:.0f} s)", flush=True)
                time.sleep(2)  # let the import's work settle before reading CPU
                pick = random.Random(1)
                cold: list[tuple[str, dict[str, str], list[dict[str, Any]]]] = []
                for _ in range(queries):
                    name = pick.choice(sorted(tenants))
                    text = " ".join(pick.choice(tenants[name]).content.split()[:8])
                    terms = keyword_terms(text, 16)
                    key = tenant_key(name)
                    plan = Bm25Keywords().plan(narrow_filter(name, Filters()), key, terms, 150, 1.0, FIELDS)
                    searches = [
                        {"collection": COLLECTION, "filter_by": plan.filter_by, **s} for _, s in plan.searches()
                    ]
                    cold.append((name, {key + t: t for t in terms}, searches))
                row: dict[str, Any] = {"tenants": stage, "documents": stage * PER_TENANT}
                for mode in ("cold", "warm"):
                    sets = [(n, t, s if mode == "cold" else s[-1:]) for n, t, s in cold]
                    by_key = [s for _, _, s in sets]
                    by_name = [[_by_name(x, n, t) for x in s] for n, t, s in sets]
                    row[f"by name, {mode}"] = _pass(client, proc, by_name)
                    row[f"by key, {mode}"] = _pass(client, proc, by_key)
                    row[f"by name, {mode}, again"] = _pass(client, proc, by_name)
                    row[f"by key, {mode}, again"] = _pass(client, proc, by_key)
                for label, value in row.items():
                    if isinstance(value, dict):
                        print(f"tenant-keys: {stage} tenants, {label}: {value}", flush=True)
                report["stages"].append(row)
        finally:
            ts.stop()
    return report


def _mean(row: dict[str, Any], label: str, field: str = "cpu_ms_per_recall") -> float:
    return (row[label][field] + row[f"{label}, again"][field]) / 2


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        "# Typesense filters by tenant name and by tenant key, as the collection grows",
        "",
        f"Command: `{command}`  ",
        f"One keyword collection on an embedded Typesense 0.24.1; small tenants of {report['per_tenant']} "
        "memories (the load corpus' generator, 5% superseded), written as Braid's documents; "
        f"{report['queries']} queries on sampled tenants (a memory's first 8 words), their `bm25` searches "
        "as a recall sends them: cold (stats, one count per term, candidates) and warm (candidates only). "
        "By name: `tenant:=<name> && superseded_at:=<never>` and `terms:=[...]`, Braid's filter before "
        "tenant keys; by key: `current_key:=<key>` and `tenant_terms:=[<key><term>...]`. Typesense CPU "
        "read around each pass (psutil), each pass run twice (mean shown); Typesense, the client and "
        "everything else share 2 cores.",
        "",
        "| tenants | documents | cold by name (ms CPU a recall) | cold by key | warm by name | warm by key "
        "| found by name / by key (cold) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["stages"]:
        lines.append(
            f"| {row['tenants']} | {row['documents']} | {_mean(row, 'by name, cold'):.2f} "
            f"| {_mean(row, 'by key, cold'):.2f} | {_mean(row, 'by name, warm'):.2f} "
            f"| {_mean(row, 'by key, warm'):.2f} "
            f"| {row['by name, cold']['found']} / {row['by key, cold']['found']} |"
        )
    lines += [
        "",
        "By name, every search builds the id list of `superseded_at:=<never>` (nearly every document in "
        "the collection) and of each term over every tenant; by key, the lists are the tenant's own. "
        "`found` is the sum of the answers' counts (the same documents match both ways here: no two "
        "tenant names of this corpus fold together).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tenant_keys", description=__doc__)
    parser.add_argument("--tenants", default="70,630", help="tenants at each stage, ascending")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    stages = [int(x) for x in args.tenants.split(",")]
    report = measure(stages, args.queries)
    stem = "tenant-keys" + (f"-{args.name}" if args.name else "")
    command = "python -m benchmarks.tenant_keys " + " ".join(sys.argv[1:])
    path = write_results(stem, markdown(report, command.strip()), report)
    first, last = report["stages"][0], report["stages"][-1]
    print(f"tenant-keys: report at {path}")
    print(
        f"tenant-keys: docs={first['documents']},{last['documents']} "
        f"by_name_warm_ms={_mean(first, 'by name, warm'):.2f},{_mean(last, 'by name, warm'):.2f} "
        f"by_key_warm_ms={_mean(first, 'by key, warm'):.2f},{_mean(last, 'by key, warm'):.2f}"
    )


if __name__ == "__main__":
    main()
