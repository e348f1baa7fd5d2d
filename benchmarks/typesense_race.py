"""Typesense 0.24.1's vector-slot race, reproduced: ``python -m benchmarks.typesense_race``.

Typesense 0.24.1 builds its vector index with a fork of hnswlib (commit
21de18ff, with ``replace_deleted``: slots of deleted vectors are reused).
Its ``insertPoint`` (``hnswalg.h`` 833-867) checks for a free slot under
``deleted_elements_lock`` and lets the lock go (838-840), then takes the lock
again and reads ``*deleted_elements.begin()`` (847-848) without checking
again. A slot is freed when a document with a vector is deleted or replaced
by one with another vector (``Index::remove``, ``index.cpp`` 726 and 5378:
under the index's write lock, before the batch's inserts).
``Index::index_field_in_memory`` (``index.cpp`` 972-995) splits one import
batch over ``min(4, documents)`` tasks on the server's thread pool, each
calling ``insertPoint`` (1014/1016). Two of them can both see the last free
slot; the first takes it and the second dereferences ``begin()`` of an empty
set: SIGSEGV at ``hnswalg.h:848``, the frame of every crash seen. (The same
threads also erase from the set without the lock, in
``unmarkDeletedInternal``.) One import request is one batch, whatever its
``batch_size`` parameter (checked with gdb: 8 documents with
``batch_size=1`` reach ``Index::batch_memory_index`` as one batch of 8), and
the writes to one collection name are queued and applied one request after
the other (``batched_indexer.cpp`` 57-58). So inserts run on one thread when
each import request carries one document with a vector. (Line numbers are
from the binary's debug information: ``addr2line`` on the crash address
0x6241fb gives ``hnswalg.h:848``, its caller
``Index::index_field_in_memory``'s sixth lambda ``index.cpp:1016``.)

This script writes like the outbox worker does (one writer, one request at a
time) against an embedded Typesense 0.24.1 with Braid's collection schema:
imports mixing new documents and rewrites of existing ones (a new 384-d
vector each), and deletes. A crashed server is restarted on its data (the
:class:`deploy.embedded.Supervisor`) and counted. ``--per-import N`` caps the
documents in one import request (0: all of a write in one request, as Braid
sent them before); ``--via-braid`` writes through
:class:`indexers.typesense.TypesenseIndex` as shipped instead.

``--timing`` measures the cost instead: on one collection holding
``--preload`` documents, writes of ``--sizes`` new documents each (no
rewrites or deletes, so the old way cannot crash mid-measure), alternately
in one import request and as :meth:`TypesenseIndex.upsert` sends them now;
the median time of a write for each.

Writes ``benchmarks/results/typesense-race.md`` (one row per run, appended)
and prints one ``race:`` (or ``timing:``) line per run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deploy.embedded import EmbeddedTypesense
from deploy.supervisor import Supervisor
from indexers.base import BackendError, MemoryRecord
from indexers.typesense import TypesenseClient, TypesenseIndex
from indexers.typesense.documents import vector_document, vectors_collection

from .common import ROOT

__all__ = ["main", "run"]

RESULTS = ROOT / "benchmarks" / "results" / "typesense-race.md"
DIM = 384
TENANT = "race"


def _vector(rng: random.Random) -> tuple[float, ...]:
    return tuple(rng.uniform(-1.0, 1.0) for _ in range(DIM))


def _record(n: int, rng: random.Random, pool: list[tuple[float, ...]] | None = None) -> MemoryRecord:
    return MemoryRecord(
        tenant=TENANT,
        id=f"m{n}",
        content=f"memory {n} written at {time.monotonic():.3f}",
        kind="fact",
        tier="episodic",
        created_at=datetime.now(UTC),
        confidence=1.0,
        embedding=rng.choice(pool) if pool else _vector(rng),
    )


async def _write(
    index: TypesenseIndex, collection: str, records: list[MemoryRecord], per_import: int, via_braid: bool
) -> None:
    if via_braid:
        await index.upsert(records)
        return
    # The vector documents, into the vectors collection: the one with an HNSW index.
    docs = [vector_document(r) for r in records]
    step = per_import or len(docs)
    for start in range(0, len(docs), step):
        await index.client.import_documents(vectors_collection(collection), docs[start : start + step])


async def _load(url: str, api_key: str, args: argparse.Namespace, supervisor: Supervisor) -> dict[str, Any]:
    rng = random.Random(args.seed)
    client = TypesenseClient([url], api_key, timeout=10.0)
    index = TypesenseIndex(client, "race", DIM)
    collection = await index.ensure()
    live: list[int] = []
    next_id = 0
    counts = {"imports": 0, "documents": 0, "rewrites": 0, "deletes": 0, "failed": 0}
    end = time.monotonic() + args.minutes * 60
    try:
        while time.monotonic() < end:
            try:
                if live and rng.random() < args.delete_share:
                    gone = rng.sample(live, min(len(live), rng.randint(1, 3)))
                    await index.delete([(TENANT, f"m{n}") for n in gone])
                    live = [n for n in live if n not in set(gone)]
                    counts["deletes"] += len(gone)
                    continue
                size = rng.randint(1, args.max_docs)
                ids = []
                for _ in range(size):
                    if live and rng.random() < args.rewrite_share:
                        ids.append(rng.choice(live))
                        counts["rewrites"] += 1
                    else:
                        ids.append(next_id)
                        next_id += 1
                ids = list(dict.fromkeys(ids))
                await _write(index, collection, [_record(n, rng) for n in ids], args.per_import, args.via_braid)
                live.extend(n for n in ids if n not in set(live))
                counts["imports"] += 1
                counts["documents"] += len(ids)
            except BackendError:
                # The server died under the request: wait for the supervisor.
                counts["failed"] += 1
                await asyncio.sleep(0.2)
    finally:
        await client.aclose()
    return counts | {"live": len(live), "restarts": supervisor.restarts, "exits": list(supervisor.exits)}


async def _timing(url: str, api_key: str, args: argparse.Namespace) -> dict[int, dict[str, float]]:
    rng = random.Random(args.seed)
    pool = [_vector(rng) for _ in range(500)]
    client = TypesenseClient([url], api_key, timeout=30.0)
    index = TypesenseIndex(client, "timing", DIM)
    collection = await index.ensure()
    next_id = 0

    def batch(size: int) -> list[MemoryRecord]:
        nonlocal next_id
        next_id += size
        return [_record(n, rng, pool) for n in range(next_id - size, next_id)]

    try:
        for _start in range(0, args.preload, 200):
            await client.import_documents(vectors_collection(collection), [vector_document(r) for r in batch(200)])
        out: dict[int, dict[str, float]] = {}
        for size in args.sizes:
            times: dict[str, list[float]] = {"one request": [], "shipped": []}
            for _ in range(args.repeats):
                for way in times:
                    records = batch(size)
                    t0 = time.perf_counter()
                    if way == "shipped":
                        await index.upsert(records)
                    else:
                        await client.import_documents(
                            vectors_collection(collection), [vector_document(r) for r in records]
                        )
                    times[way].append((time.perf_counter() - t0) * 1000)
            out[size] = {way: statistics.median(t) for way, t in times.items()}
    finally:
        await client.aclose()
    return out


def _with_server(fn: Any, args: argparse.Namespace) -> Any:
    home = Path(tempfile.mkdtemp(prefix="braid-race-"))
    server = EmbeddedTypesense(home / "typesense")
    try:
        server.start()
        return asyncio.run(fn(server.url, server.api_key, args))
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="braid-race-"))
    server = EmbeddedTypesense(home / "typesense")
    started = time.monotonic()
    try:
        server.start()
        supervisor = Supervisor(server, interval=0.2).start()
        try:
            result = asyncio.run(_load(server.url, server.api_key, args, supervisor))
        finally:
            supervisor.stop()
            result_exits = list(supervisor.exits)
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
    result["exits"] = result_exits
    result["crashes"] = len(result_exits)
    result["wall_s"] = time.monotonic() - started
    return result


def _frames(exits: list[str]) -> str:
    """How many exits ended in each crash frame ("3x hnswalg.h:848 insertPoint")."""
    frames: dict[str, int] = {}
    for line in exits:
        m = re.search(r'Source "[^"]*/([^/"]+)", line (\d+), in (\w+)', line)
        key = f"{m.group(1)}:{m.group(2)} {m.group(3)}" if m else line.split(";")[0]
        frames[key] = frames.get(key, 0) + 1
    return ", ".join(f"{n}x {k}" for k, n in frames.items()) or "–"


def _mode(args: argparse.Namespace) -> str:
    if args.via_braid:
        return "TypesenseIndex.upsert/delete as shipped"
    return "whole write in one import" if args.per_import == 0 else f"at most {args.per_import} per import"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.typesense_race",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--max-docs", type=int, default=8, help="documents per write, 1 to this")
    parser.add_argument("--per-import", type=int, default=0, help="documents per import request (0: all)")
    parser.add_argument("--via-braid", action="store_true", help="write through TypesenseIndex as shipped")
    parser.add_argument("--rewrite-share", type=float, default=0.5, help="share of a write's ids that rewrite")
    parser.add_argument("--delete-share", type=float, default=0.2, help="share of operations that delete")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timing", action="store_true", help="time writes, old way against shipped")
    parser.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")], default=[1, 5, 32, 256])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--preload", type=int, default=2000)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.timing:
        return _report_timing(args, _with_server(_timing, args))
    r = run(args)
    rate = r["documents"] / max(r["wall_s"], 1e-9)
    line = (
        f"race: {_mode(args)}, {args.minutes:g} min: crashes={r['crashes']} imports={r['imports']} "
        f"documents={r['documents']} ({rate:.0f}/s) rewrites={r['rewrites']} deletes={r['deletes']} "
        f"failed_requests={r['failed']}"
    )
    print(line)
    for exit_line in r["exits"][:3]:
        print(f"race:   {exit_line}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        out.write_text(
            "# Typesense 0.24.1 vector-slot race\n\n"
            "`python -m benchmarks.typesense_race` (see its docstring): one writer, one request at a\n"
            "time, against an embedded Typesense 0.24.1; imports of 1 to `--max-docs` documents with\n"
            "384-d vectors, half of them rewrites, and a fifth of the operations deletes of 1-3.\n"
            "A crash is a server exit the supervisor restarted from.\n\n"
            "| how imports were sent | minutes | crashes | imports | documents | rewrites | deletes | "
            "requests failed | first exit |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n"
        )
    first = _frames(r["exits"])
    with out.open("a") as f:
        f.write(
            f"| {_mode(args)}, max {args.max_docs} per write | {args.minutes:g} | {r['crashes']} | "
            f"{r['imports']} | {r['documents']} | {r['rewrites']} | {r['deletes']} | {r['failed']} | {first} |\n"
        )
    return 0


def _report_timing(args: argparse.Namespace, out: dict[int, dict[str, float]]) -> int:
    lines = []
    for size, t in out.items():
        lines.append(
            f"| {size} | {t['one request']:.1f} | {t['shipped']:.1f} | {t['shipped'] - t['one request']:+.1f} "
            f"| {size / t['shipped'] * 1000:.0f} |"
        )
        print(
            f"timing: {size} new documents a write: one request {t['one request']:.1f} ms, "
            f"shipped {t['shipped']:.1f} ms (median of {args.repeats})"
        )
    with Path(args.out).open("a") as f:
        f.write(
            f"\nTiming (`--timing`, {args.preload} documents preloaded, median of {args.repeats} writes each, "
            f"new documents only):\n\n| documents a write | one import request ms | as shipped ms | "
            "difference ms | shipped docs/s |\n|---:|---:|---:|---:|---:|\n" + "\n".join(lines) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
