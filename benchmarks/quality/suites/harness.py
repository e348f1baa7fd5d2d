"""Run a :class:`~benchmarks.quality.suites.common.Suite` through Braid's HTTP API.

Phases, each timed (``phases`` in the report): map the turns to memories;
embed their contents client-side (cached, see
:mod:`benchmarks.quality.embed_cache`; before the service starts, so the
embedding has both cores); the naive references (no service); start the
service (one agent key per tenant, an admin key, the ``--set`` overrides);
check the client vectors against the service's own on a few texts; write
every tenant's memories (``POST /v1/memories``, vectors attached) and wait
for the Typesense outbox to drain, with the CPU each process spent; a
warm-up recall per question (graph alone, ``top_k`` 1: the query embeddings
are computed once, so every configuration below meets a warm cache); then
each configuration of :data:`CONFIGS`, and the ``--sweep`` sets.

Every recall sends the question's time as ``reference_time`` and
``track: false``, except the fused one, ``track: true``: one fused recall per
question is what an agent runtime makes, and only those count as usage.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
import yaml

from benchmarks.common import ROOT, CpuMeter, cpu_used, pct

from ..api import ApiError, ConfigRun, Progress, post_retrying, recall_many
from ..ceilings import SINGLE, suite_ceilings
from ..embed_cache import CACHE_PATH, EmbeddingCache, embed_cached
from ..locomo import MappingOptions
from ..metrics import mean
from ..run import BUDGET, CONFIGS
from ..service import TenantService
from ..tuning import apply_sets, load_sweep, run_sweep
from .common import Query, Suite, rfc3339

__all__ = ["add_suite_arguments", "run_suite"]

PROBE_TENANT = "bench-probe"
MAX_BODY = 3 << 20  # bytes of one write; the service's server.maxBodyBytes is 4 MiB


class Phases:
    """Wall seconds per named phase, in order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        print(f"{name} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - start
            print(f"{name}: {self.seconds[name]:.1f} s", file=sys.stderr, flush=True)


#: The packages the service runs.
SERVICE_CODE = ("service/", "fusion/", "indexers/", "config/", "deploy/")


def tree_state() -> dict[str, Any]:
    """The commit the service runs from and its files changed on top of it
    (the working tree is shared: the service runs whatever is there)."""

    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True).stdout

    changed = [line[3:] for line in git("status", "--porcelain").splitlines()]
    return {
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "changed": [p for p in changed if p.startswith(SERVICE_CODE)],
    }


def _embedder(threads: int) -> Any:
    from indexers.embedding import MiniLMEmbedder  # loads torch: only when a run embeds

    return MiniLMEmbedder(threads=threads)


def _batches(
    memories: list[dict[str, Any]], batch: int, vectors: dict[str, np.ndarray] | None
) -> Iterator[list[dict[str, Any]]]:
    """At most ``batch`` memories and about :data:`MAX_BODY` bytes per write, each
    with its ``embedding`` from ``vectors`` (made here: 384 floats as Python
    objects cost ~12 KB a memory, too much to hold for 49k memories at once)."""
    current: list[dict[str, Any]] = []
    size = 0
    for m in memories:
        if vectors is not None:
            m = {**m, "embedding": vectors[m["id"]].tolist()}
        m_size = len(m["content"]) + len(m.get("context", "")) + 24 * len(m.get("embedding", ())) + 1024
        if current and (len(current) >= batch or size + m_size > MAX_BODY):
            yield current
            current, size = [], 0
        current.append(m)
        size += m_size
    if current:
        yield current


async def write_all(
    client: httpx.AsyncClient,
    svc: TenantService,
    memories: dict[str, list[dict[str, Any]]],
    vectors: dict[str, np.ndarray] | None,
    batch: int,
    concurrency: int,
) -> dict[str, Any]:
    """Every tenant's memories (with their ``vectors``, if given), ``concurrency``
    tenants at a time, in order within a tenant.

    A write the service could not finish within its Postgres deadline (503)
    is retried once, then split in two halves written one after the other
    (a write with ids replaces, so a write that did land is rewritten, never
    duplicated): ``splits`` counts those.
    """
    total = sum(len(m) for m in memories.values())
    meter = Progress("write", total, "memories")
    pending = iter(memories.items())
    requests = tenants = splits = 0

    async def write(tenant: str, chunk: list[dict[str, Any]]) -> None:
        nonlocal requests, splits
        # A batch that keeps failing is split; a single memory is retried longer
        # (a loaded machine can miss the write bound a few times in a row).
        tries = 2 if len(chunk) > 1 else 5
        try:
            await post_retrying(client, "/v1/memories", {"memories": chunk}, svc.headers_by_tenant[tenant], tries=tries)
        except ApiError as exc:
            if exc.status != 503 or len(chunk) == 1:
                raise
            splits += 1
            half = len(chunk) // 2
            print(f"write: splitting a write of {len(chunk)} memories in two", file=sys.stderr, flush=True)
            await write(tenant, chunk[:half])
            await write(tenant, chunk[half:])
            return
        requests += 1
        meter.update(len(chunk), f", {tenants}/{len(memories)} tenants done")

    async def worker() -> None:
        nonlocal tenants
        for tenant, items in pending:
            for chunk in _batches(items, batch, vectors):
                await write(tenant, chunk)
            tenants += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    written = time.perf_counter() - start
    return {"memories": total, "requests": requests, "splits": splits, "write_s": written, "per_s": total / written}


async def check_embeddings(
    client: httpx.AsyncClient, svc: TenantService, texts: Sequence[str], vectors: np.ndarray
) -> dict[str, Any]:
    """Write ``texts`` without vectors to a probe tenant, read the vectors the
    service stored from Postgres, compare with ``vectors``, delete the probes."""
    headers = svc.headers_by_tenant[PROBE_TENANT]
    ids = [f"probe-{i}" for i in range(len(texts))]
    items = [{"id": i, "content": t, "kind": "note"} for i, t in zip(ids, texts, strict=True)]
    await post_retrying(client, "/v1/memories", {"memories": items}, headers)
    with psycopg.connect(svc.postgres_dsn()) as conn:
        rows: dict[str, str] = dict(
            conn.execute(
                "SELECT id, embedding::text FROM memories WHERE tenant = %s AND id = ANY(%s)", (PROBE_TENANT, ids)
            ).fetchall()
        )
    for i in ids:
        (await client.delete(f"/v1/memories/{i}", headers=headers)).raise_for_status()
    theirs = np.stack([np.array(rows[i].strip("[]").split(","), dtype=np.float32) for i in ids])
    ours = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    cosine = np.sum(ours * theirs, axis=1) / np.linalg.norm(theirs, axis=1)
    out = {
        "texts": len(texts),
        "identical": int(sum(np.array_equal(a, b) for a, b in zip(vectors, theirs, strict=True))),
        "max_abs_diff": float(np.max(np.abs(ours - theirs))),
        "min_cosine": float(np.min(cosine)),
    }
    if out["min_cosine"] < 0.99999:
        raise SystemExit(f"client embeddings differ from the service's: {out}")
    return out


def recall_requests(
    svc: TenantService,
    queries: Sequence[Query],
    args: argparse.Namespace,
    sources: list[str] | None,
    track: bool,
    top_k: int | None = None,
) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """One recall body per question (``top_k`` default ``args.top_k``); ``reference_time``
    and ``track`` are left out under ``--no-reference-time`` / ``--no-track``."""
    out = []
    for q in queries:
        body: dict[str, Any] = {
            "query": q.text,
            "top_k": top_k or args.top_k,
            "budget_tokens": BUDGET,
            "min_confidence": 0,
        }
        if sources is not None:
            body["sources"] = sources
        if not args.no_reference_time:
            body["reference_time"] = rfc3339(q.at)
        if not args.no_track:
            body["track"] = track
        out.append((svc.headers_by_tenant[q.tenant], body))
    return out


def answer_stats(run: ConfigRun) -> dict[str, Any]:
    """Latency, degraded and empty answers, and the ranking factors applied."""
    source_ms: dict[str, list[float]] = {}
    for a in run.answers:
        for name, ms in a.source_ms.items():
            source_ms.setdefault(name, []).append(ms)
    lat = [a.ms for a in run.answers]
    return {
        "latency_ms": {"p50": pct(lat, 50), "p95": pct(lat, 95)},
        "source_ms_p50": {n: pct(v, 50) for n, v in sorted(source_ms.items())},
        "recalls_per_s": len(lat) / run.wall_s if run.wall_s else 0.0,
        "empty": sum(1 for a in run.answers if not a.ranked),
        "mean_returned": mean(len(a.ranked) for a in run.answers),
        "degraded": sum(1 for a in run.answers if a.degraded),
        "degraded_by": dict(sorted(Counter(d for a in run.answers for d in a.degraded).items())),
        "factors": dict(sorted(Counter(f for a in run.answers for f in a.factors).items())),
    }


async def run_suite(suite: Suite, args: argparse.Namespace) -> dict[str, Any]:
    phase = Phases()
    config = apply_sets(yaml.safe_load(args.config.read_text()), args.set)
    max_chars = int(config.get("limits", {}).get("maxContentChars", 32768))
    max_entities = args.max_entities or suite.max_entities
    options = MappingOptions(
        context_before=args.context_before, context_after=args.context_after, entities=args.entities
    )
    queries = suite.queries()
    report: dict[str, Any] = {
        "suite": suite.name,
        "data": str(suite.data),
        "options": asdict(options),
        "concurrency": args.concurrency,
        "top_k": args.top_k,
        "corpus": suite.describe(),
        "asked": len(queries),
        "phases": phase.seconds,
        "tree": tree_state(),
    }
    with phase("map"):
        memories: dict[str, list[dict[str, Any]]] = {}
        cut = 0
        for tenant in suite.tenants():
            memories[tenant], n = suite.memories(tenant, options, max_chars, max_entities)
            cut += n
        flat = [m for ms in memories.values() for m in ms]
        report["mapping"] = {
            "memories": len(flat),
            "cut_to_max_chars": cut,
            "max_chars": max_chars,
            "max_entities": max_entities,
            "context_chars": sum(len(m.get("context", "")) for m in flat),
            "entities": sum(len(m.get("entities", ())) for m in flat),
            "distinct_entities": sum(
                len({e.lower() for m in ms for e in m.get("entities", ())}) for ms in memories.values()
            ),
        }
    with phase("embed"):
        cache = EmbeddingCache(args.cache)
        provider = config.get("embedding", {}).get("provider", "local")
        if provider == "local":
            embedder = _embedder(args.embed_threads)
            vectors, computed = await embed_cached([m["content"] for m in flat], embedder, cache, "embed turns")
            query_vectors, _ = await embed_cached([q.text for q in queries], embedder, cache, "embed questions")
        else:
            # The service's own provider embeds the turns (as documents), so the
            # client's vectors are the ones the service would make.
            if not args.no_naive:
                raise SystemExit(f"embedding.provider {provider}: add --no-naive (the naive reference is MiniLM's)")
            from config import parse_config
            from indexers.embedders import open_embedder

            async with open_embedder(parse_config(yaml.safe_dump(config)).embedding) as hosted:
                vectors, computed = await embed_cached([m["content"] for m in flat], hosted, cache, "embed turns")
            query_vectors = np.zeros((0, vectors.shape[1]), dtype=np.float32)
        cache.close()
        report["embedding"] = {"texts": len(flat), "computed": computed, "cache": str(args.cache)}
        by_id = {m["id"]: v for m, v in zip(flat, vectors, strict=True)}
    if not args.no_naive:
        with phase("naive"):
            naive = suite.naive_rankings(by_id, list(query_vectors))
            report["naive"] = {name: suite.score(r) for name, r in naive.items()}
    with phase("service start"):
        svc = await asyncio.to_thread(TenantService, [*suite.tenants(), PROBE_TENANT], args.config, args.set)
    try:
        async with httpx.AsyncClient(base_url=svc.url, timeout=300) as client:
            with phase("embedding check"):
                probe = np.linspace(0, len(flat) - 1, 8).astype(int)
                report["embedding_check"] = await check_embeddings(
                    client, svc, [flat[i]["content"] for i in probe], vectors[probe]
                )
            meter = CpuMeter(svc.processes)
            cpu0 = meter()
            with phase("write"):
                report["write"] = await write_all(
                    client,
                    svc,
                    memories,
                    by_id if args.client_embeddings else None,
                    args.write_batch,
                    args.write_concurrency,
                )
            cpu1 = meter()
            with phase("outbox drain"):
                report["write"]["sync_wait_s"] = await asyncio.to_thread(svc.wait_synced, 3600)
            report["write"]["cpu_s"] = {"write": cpu_used(cpu0, cpu1), "drain": cpu_used(cpu1, meter())}
            with phase("warm-up"):
                requests = recall_requests(svc, queries, args, ["graph"], False, top_k=1)
                warm = await recall_many(client, requests, args.concurrency, "warm-up")
            report["cold_embedding_ms"] = {
                "p50": pct([a.embedding_ms for a in warm.answers], 50),
                "p95": pct([a.embedding_ms for a in warm.answers], 95),
            }
            runs: dict[str, ConfigRun] = {}
            for name, sources in CONFIGS.items():
                with phase(f"recall {name}"):
                    requests = recall_requests(svc, queries, args, sources, sources is None)
                    runs[name] = await recall_many(client, requests, args.concurrency, f"recall {name}")
            if args.sweep:

                async def fused() -> dict[str, Any]:
                    requests = recall_requests(svc, queries, args, None, False)
                    run = await recall_many(client, requests, args.concurrency, "recall fused")
                    out = {**suite.score([a.ranked for a in run.answers]), **answer_stats(run)}
                    if args.sweep_sources:
                        # Every source alone too: what a setting does to each list, and to the ceilings.
                        alone = {}
                        for name, sources in CONFIGS.items():
                            if sources is not None:
                                requests = recall_requests(svc, queries, args, sources, False)
                                run = await recall_many(client, requests, args.concurrency, f"recall {name}")
                                alone[name] = [a.ranked for a in run.answers]
                        scores = {name: suite.score(r) for name, r in alone.items()}
                        out["configs"] = {
                            n: {"overall": s["overall"], "by_kind": s["by_kind"]} for n, s in scores.items()
                        }
                        out["ceilings"] = suite_ceilings(suite.name, suite.score, alone)
                    return out

                with phase("sweep"):
                    report["sweep"] = await run_sweep(client, svc, load_sweep(args.sweep), fused)
                    for row in report["sweep"]:
                        row["score"].pop("per_question", None)
    finally:
        await asyncio.to_thread(svc.stop)
    report["configs"] = {
        name: {**suite.score([a.ranked for a in run.answers]), **answer_stats(run)} for name, run in runs.items()
    }
    report["ceilings"] = suite_ceilings(
        suite.name, suite.score, {name: [a.ranked for a in r.answers] for name, r in runs.items() if name in SINGLE}
    )
    return report


def add_suite_arguments(parser: argparse.ArgumentParser) -> None:
    """The LongMemEval and BEAM suites' own arguments."""
    group = parser.add_argument_group("longmemeval and beam")
    group.add_argument("--limit", type=int, default=0, help="first N questions (longmemeval) or chats (beam); 0: all")
    group.add_argument("--top-k", type=int, default=50, help="items per recall (default 50)")
    group.add_argument(
        "--max-entities",
        type=int,
        choices=range(1, 65),
        metavar="N",
        help="entities named per memory (default: longmemeval 16, beam 64 as LoCoMo)",
    )
    group.add_argument(
        "--write-batch",
        type=int,
        default=32,
        help="most memories per write (also capped by size; default 32: a LongMemEval write of 64 took 5-9 s "
        "of the service's 10 s Postgres deadline, most of it creating entities)",
    )
    group.add_argument("--write-concurrency", type=int, default=2, help="tenants written at once (default 2)")
    group.add_argument("--embed-threads", type=int, default=2, help="torch threads for the client-side embedding")
    group.add_argument("--cache", type=Path, default=CACHE_PATH, help="embedding cache file")
    group.add_argument(
        "--no-client-embeddings",
        dest="client_embeddings",
        action="store_false",
        help="let the service embed the turns (vectors are still computed here, for the naive reference)",
    )
    group.add_argument(
        "--no-reference-time", action="store_true", help="send no `reference_time` (a service without it)"
    )
