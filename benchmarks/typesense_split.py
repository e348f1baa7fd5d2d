"""What the keyword/vector split costs and saves in Typesense (issue 16).

``python -m benchmarks.typesense_split [--size N] [--searches N] [--writes N]``
starts an embedded Typesense alone and loads the big tenant of the load
benchmark's corpus (``benchmarks.load.corpus``) twice: as an older Braid kept
it (one collection, each document with its embedding, both aliases on it)
and as the split keeps it (keyword and vectors collections). For each it
measures CPU per operation by process (this process, which does the
service's part, and Typesense):

* the Typesense source's search (``TypesenseSource.search``) for the corpus
  queries, as in a fused recall (keyword only: ``vectorSearch: alone`` with
  pgvector covering the vectors) and as a recall of Typesense alone (keyword
  and vector searches);
* single-memory writes (``TypesenseIndex.upsert`` of one record, as the
  outbox sends one write at a steady rate), and the same writes with
  ``typesense.vectors: none`` (keyword document only).

Writes ``benchmarks/results/typesense-split.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

import msgspec
import psutil

from benchmarks.common import write_results
from benchmarks.load.corpus import BIG_TENANT, build_corpus
from config import BraidConfig
from config.schema import EmbeddingConfig
from deploy.embedded import EmbeddedTypesense
from indexers.base import Filters, MemoryRecord, SearchQuery
from indexers.typesense import TypesenseClient, TypesenseIndex, TypesenseSource
from indexers.typesense.documents import combined_document

__all__ = ["main"]


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


async def _layout(ts: EmbeddedTypesense, proc: psutil.Process, layout: str, args: argparse.Namespace) -> dict[str, Any]:
    corpus = build_corpus(args.size, seed=7)
    big = corpus.tenants[0]
    assert big.name == BIG_TENANT
    client = TypesenseClient([ts.url], ts.api_key, timeout=30)
    alias = f"m_{layout}"
    idx = TypesenseIndex(client, alias, 384, vectors=layout != "keyword-only")
    records = [
        MemoryRecord(
            id=m["id"],
            tenant=BIG_TENANT,
            content=m["content"],
            kind=m["kind"],
            tier=m["tier"],
            created_at=datetime(2024, 1, 1, tzinfo=UTC),
            confidence=1.0,
            speaker=m.get("speaker"),
            session_id=m.get("session_id"),
            embedding=tuple(float(x) for x in v),
            model="client",
        )
        for m, v in zip(big.memories, big.vectors, strict=True)
    ]
    if layout == "combined":
        schema = idx.schema(f"{alias}_old")
        schema["fields"].append({"name": "embedding", "type": "float[]", "num_dim": 384, "optional": True})
        await client.create_collection(schema)
        await client.upsert_alias(alias, schema["name"])
        for i in range(0, len(records), 500):
            await client.import_documents(schema["name"], [combined_document(r) for r in records[i : i + 500]])
        await idx.ensure()
    else:
        new = await idx.new_collection()
        for i in range(0, len(records), 500):
            await idx.upsert(records[i : i + 500], collection=new, fresh=True)
        await idx.switch_alias(new)
    cfg = BraidConfig(embedding=EmbeddingConfig(dim=384))
    if layout == "keyword-only":
        cfg = msgspec.structs.replace(cfg, typesense=msgspec.structs.replace(cfg.typesense, vectors="none"))
    source = TypesenseSource(client, alias, lambda: cfg)
    queries = [
        SearchQuery(
            tenant=BIG_TENANT,
            text=q["text"],
            vector=tuple(float(x) for x in v),
            limit=50,
            filters=Filters(),
            min_confidence=0.0,
            model="client",
            vectors_covered=True,
        )
        for q, v in zip(corpus.queries, corpus.query_vectors, strict=True)
    ]
    me = psutil.Process()
    out: dict[str, Any] = {"layout": layout}
    for q in queries[:50]:  # the caches warm, as in a running service
        await source.search(q)
    rows = [("fused (keyword list)", queries)]
    if layout != "keyword-only":
        rows.append(
            ("alone (keyword + vector lists)", [msgspec.structs.replace(q, vectors_covered=False) for q in queries])
        )
    for label, qs in rows:
        m0, t0, w0 = _cpu(me), _cpu(proc), time.perf_counter()
        for i in range(args.searches):
            await source.search(qs[i % len(qs)])
        n = args.searches
        out[label] = {
            "client_ms": (_cpu(me) - m0) * 1000 / n,
            "typesense_ms": (_cpu(proc) - t0) * 1000 / n,
            "wall_ms": (time.perf_counter() - w0) * 1000 / n,
        }
    rewrites = [msgspec.structs.replace(r, id=f"w-{i}") for i, r in enumerate(records[: args.writes])]
    m0, t0 = _cpu(me), _cpu(proc)
    for r in rewrites:
        await idx.upsert([r])
    out["single writes"] = {
        "client_ms": (_cpu(me) - m0) * 1000 / len(rewrites),
        "typesense_ms": (_cpu(proc) - t0) * 1000 / len(rewrites),
    }
    await client.aclose()
    return out


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    home = pathlib.Path(tempfile.mkdtemp(prefix="braid-ts-split-"))
    ts = EmbeddedTypesense(home / "typesense")
    ts.start()
    try:
        proc = next(
            p
            for p in psutil.process_iter(["name", "cmdline"])
            if "typesense" in (p.info["name"] or "") and str(home) in " ".join(p.info["cmdline"] or [])
        )
        return [await _layout(ts, proc, layout, args) for layout in ("combined", "split", "keyword-only")]
    finally:
        ts.stop()
        shutil.rmtree(home, ignore_errors=True)


def _markdown(rows: list[dict[str, Any]], command: str) -> str:
    names = {
        "combined": "one collection, embeddings in the documents (an older Braid's)",
        "split": "keyword + vectors collections (`typesense.vectors: separate`)",
        "keyword-only": "keyword collection only (`typesense.vectors: none`)",
    }
    lines = [
        "# Typesense: keyword documents without embeddings (issue 16)",
        "",
        f"Command: `{command}` (embedded Typesense 0.24.1 alone; this process does the service's part). "
        "The load benchmark's big tenant, its 500 queries cycled; CPU ms per operation by process.",
        "",
        "| layout | operation | this process ms | Typesense ms | wall ms |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        for op, v in row.items():
            if op == "layout":
                continue
            wall = f"{v['wall_ms']:.2f}" if "wall_ms" in v else "–"
            lines.append(f"| {names[row['layout']]} | {op} | {v['client_ms']:.2f} | {v['typesense_ms']:.2f} | {wall} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.typesense_split", description=__doc__)
    parser.add_argument("--size", type=int, default=10000)
    parser.add_argument("--searches", type=int, default=500)
    parser.add_argument("--writes", type=int, default=400)
    args = parser.parse_args()
    rows = asyncio.run(run(args))
    command = "python -m benchmarks.typesense_split " + " ".join(sys.argv[1:])
    print(write_results("typesense-split", _markdown(rows, command), {"command": command, "rows": rows}))


if __name__ == "__main__":
    main()
