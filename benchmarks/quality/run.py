"""Load the conversations into Braid, ask every question per configuration, score.

Only the public HTTP API is used: ``POST /v1/memories``, ``GET /health`` and
``POST /v1/recall``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import LOCOMO_DATA, ROOT, pct

from .locomo import Conversation, MappingOptions, Question, conversation_memories, load_conversations
from .metrics import hit_ranks, mean
from .naive import MAX_K, naive_reference, summarize
from .service import TenantService

__all__ = ["CONFIGS", "MAX_K", "run"]

#: Configuration name -> the recall's ``sources`` (None: all of them, fused).
CONFIGS: dict[str, list[str] | None] = {
    "typesense": ["typesense"],
    "pgvector": ["pgvector"],
    "graph": ["graph"],
    "fused": None,
}
BATCH = 256
BUDGET = 65536  # limits.maxBudgetTokens: the block never limits what is scored


@dataclass
class Answer:
    """One recall: the ranked dia_ids it returned, what it cost, and the
    names of the ranking factors (``items[].factors``) applied to any item."""

    ranked: list[str]
    ms: float
    source_ms: dict[str, float]
    degraded: list[str]
    embedding_ms: float
    factors: frozenset[str] = frozenset()


@dataclass
class ConfigRun:
    answers: list[Answer] = field(default_factory=list)
    wall_s: float = 0.0


Job = tuple[Conversation, Question]


async def post_retrying(
    client: httpx.AsyncClient, path: str, body: Any, headers: dict[str, str], tries: int = 5
) -> httpx.Response:
    """POST as an agent runtime would: a 429 or 503 is retried after its
    Retry-After (a write with ids replaces, so a retry is safe); any other
    error, or the last try's, is raised with the service's detail."""
    for attempt in range(tries):
        r = await client.post(path, json=body, headers=headers)
        if r.status_code not in (429, 503) or attempt == tries - 1:
            break
        print(f"{path}: {r.status_code} {r.json().get('detail')}; retrying", flush=True)
        await asyncio.sleep(float(r.headers.get("retry-after", "1")))
    if r.is_error:
        raise RuntimeError(f"POST {path} answered {r.status_code}: {r.text}")
    return r


async def write_all(
    client: httpx.AsyncClient, svc: TenantService, convs: list[Conversation], options: MappingOptions
) -> dict[str, Any]:
    start = time.perf_counter()
    total = 0
    for conv in convs:
        memories = conversation_memories(conv, options)
        headers = svc.headers_by_tenant[conv.tenant]
        for i in range(0, len(memories), BATCH):
            await post_retrying(client, "/v1/memories", {"memories": memories[i : i + BATCH]}, headers)
        total += len(memories)
    written = time.perf_counter() - start
    synced = await asyncio.to_thread(svc.wait_synced)
    return {"memories": total, "write_s": written, "per_s": total / written, "sync_wait_s": synced}


async def recall_all(
    client: httpx.AsyncClient,
    svc: TenantService,
    jobs: list[Job],
    sources: list[str] | None,
    concurrency: int,
    top_k: int = MAX_K,
) -> ConfigRun:
    answers: list[Answer | None] = [None] * len(jobs)
    pending = iter(range(len(jobs)))

    async def worker() -> None:
        for i in pending:
            conv, q = jobs[i]
            body: dict[str, Any] = {"query": q.text, "top_k": top_k, "budget_tokens": BUDGET, "min_confidence": 0}
            if sources is not None:
                body["sources"] = sources
            start = time.perf_counter()
            r = await client.post("/v1/recall", json=body, headers=svc.headers_by_tenant[conv.tenant])
            ms = (time.perf_counter() - start) * 1000
            if r.status_code != 200:
                raise RuntimeError(f"recall {r.status_code}: {r.text[:500]}")
            out = r.json()
            ranked = [d for d in (conv.dia_id(item["id"]) for item in out["items"]) if d is not None]
            answers[i] = Answer(
                ranked=ranked,
                ms=ms,
                source_ms={n: s["ms"] for n, s in out["sources"].items() if s["status"] == "ok"},
                degraded=list(out["degraded"]),
                embedding_ms=float(out.get("embedding_ms") or 0.0),
                factors=frozenset(
                    name for item in out["items"] for name, f in (item.get("factors") or {}).items() if f != 1
                ),
            )

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    done = [a for a in answers if a is not None]
    assert len(done) == len(jobs)
    return ConfigRun(done, time.perf_counter() - start)


def score(jobs: list[Job], run: ConfigRun) -> dict[str, Any]:
    """Overall and per-category metrics, the recall@1..20 curve, latency, and how
    many recalls had each ranking factor applied."""
    source_ms: dict[str, list[float]] = {}
    for a in run.answers:
        for name, ms in a.source_ms.items():
            source_ms.setdefault(name, []).append(ms)
    lat = [a.ms for a in run.answers]
    return {
        **summarize((q, a.ranked) for (_, q), a in zip(jobs, run.answers, strict=True)),
        "latency_ms": {"p50": pct(lat, 50), "p95": pct(lat, 95)},
        "source_ms_p50": {n: pct(v, 50) for n, v in sorted(source_ms.items())},
        "recalls_per_s": len(lat) / run.wall_s if run.wall_s else 0.0,
        "empty": sum(1 for a in run.answers if not a.ranked),
        "mean_returned": mean(len(a.ranked) for a in run.answers),
        "degraded": sum(1 for a in run.answers if a.degraded),
        "factors": dict(sorted(Counter(f for a in run.answers for f in a.factors).items())),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    convs = load_conversations(args.data)
    options = MappingOptions(
        context_before=args.context_before, context_after=args.context_after, entities=args.entities
    )
    jobs: list[Job] = [(c, q) for c in convs for q in c.questions[: args.max_questions or None]]
    report: dict[str, Any] = {
        "data": str(args.data),
        "concurrency": args.concurrency,
        "scored": len(jobs),
        "options": asdict(options),
        "conversations": [
            {
                "id": c.id,
                "tenant": c.tenant,
                "turns": len(conversation_memories(c, options)),
                "questions": len(c.questions),
                "unscored": c.unscored,
                "dropped_evidence": list(c.dropped_evidence),
            }
            for c in convs
        ],
    }
    if not args.no_naive:  # first: it needs no service, and a failure here costs little
        started = time.perf_counter()
        report["naive"] = await asyncio.to_thread(naive_reference, convs, args.max_questions)
        report["naive_s"] = time.perf_counter() - started
    started = time.perf_counter()
    svc = await asyncio.to_thread(TenantService, [c.tenant for c in convs], args.config)
    report["startup_s"] = time.perf_counter() - started
    try:
        async with httpx.AsyncClient(base_url=svc.url, timeout=120) as client:
            report["write"] = await write_all(client, svc, convs, options)
            # Warm-up: every question's embedding computed once (and timed), so each
            # configuration below is measured with the same warm query-embedding cache.
            warm = await recall_all(client, svc, jobs, ["graph"], args.concurrency, top_k=1)
            report["cold_embedding_ms"] = {
                "p50": pct([a.embedding_ms for a in warm.answers], 50),
                "p95": pct([a.embedding_ms for a in warm.answers], 95),
            }
            runs = {}
            for name, sources in CONFIGS.items():
                runs[name] = await recall_all(client, svc, jobs, sources, args.concurrency)
    finally:
        await asyncio.to_thread(svc.stop)
    report["configs"] = {name: score(jobs, r) for name, r in runs.items()}
    report["questions"] = [
        {
            "conversation": c.id,
            "qa_index": q.index,
            "category": q.category,
            "evidence": sorted(q.evidence),
            "hit_ranks": {name: hit_ranks(r.answers[i].ranked, q.evidence) for name, r in runs.items()},
        }
        for i, (c, q) in enumerate(jobs)
    ]
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=LOCOMO_DATA, help="folder of LoCoMo *.json files")
    parser.add_argument("--concurrency", type=int, default=4, help="recalls in flight")
    for when, default in (("before", 2), ("after", 1)):
        parser.add_argument(
            f"--context-{when}",
            type=int,
            default=default,
            metavar="N",
            help=f"same-session turns {when} the turn in each memory's indexed-only context",
        )
    parser.add_argument(
        "--no-entities",
        dest="entities",
        action="store_false",
        help="name no entities in the memories (the graph source then finds nothing)",
    )
    parser.add_argument("--no-naive", action="store_true", help="skip the naive reference (BM25, MiniLM, RRF)")
    parser.add_argument("--max-questions", type=int, default=0, help="per conversation, for a quick look (0: all)")
    parser.add_argument(
        "--config",
        type=Path,
        default=ROOT / "config" / "braid.yaml",
        help="base service config (the tenants' keys are added to it)",
    )
    parser.add_argument("--name", default="quality", help="output file stem under benchmarks/results/")
