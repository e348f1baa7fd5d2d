"""Load the conversations into Braid, ask every question per configuration, score.

Only the public HTTP API is used: ``POST /v1/memories``, ``GET /health`` and
``POST /v1/recall``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import LOCOMO_DATA, ROOT, pct

from .api import ConfigRun, post_retrying, recall_many
from .ceilings import SINGLE, locomo_ceilings
from .locomo import Conversation, MappingOptions, Question, conversation_memories, load_conversations
from .metrics import hit_ranks, mean
from .naive import MAX_K, naive_reference, summarize
from .service import TenantService
from .tuning import load_sweep, parse_set, run_sweep

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

Job = tuple[Conversation, Question]


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
    track: bool | None = None,
) -> ConfigRun:
    """Every job's question, ranked as dia_ids. ``track`` is sent as the recall's
    ``track`` field (None: not sent, for a service without it)."""
    requests = []
    for conv, q in jobs:
        body: dict[str, Any] = {"query": q.text, "top_k": top_k, "budget_tokens": BUDGET, "min_confidence": 0}
        if sources is not None:
            body["sources"] = sources
        if track is not None:
            body["track"] = track
        requests.append((svc.headers_by_tenant[conv.tenant], body))
    run = await recall_many(client, requests, concurrency)
    for (conv, _), answer in zip(jobs, run.answers, strict=True):
        answer.ranked = [d for d in (conv.dia_id(m) for m in answer.ranked) if d is not None]
    return run


def ceilings(jobs: list[Job], runs: dict[str, ConfigRun]) -> dict[str, float]:
    """The oracle's and the union's R@10 over the single-source runs (:mod:`.ceilings`)."""
    per_source = {name: [a.ranked for a in r.answers] for name, r in runs.items() if name in SINGLE}
    return locomo_ceilings([q.evidence for _, q in jobs], per_source)


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
    svc = await asyncio.to_thread(TenantService, [c.tenant for c in convs], args.config, args.set)
    report["startup_s"] = time.perf_counter() - started

    def track(value: bool) -> bool | None:
        """Only the fused recall counts as usage (``--no-track``: the field is not sent)."""
        return None if args.no_track else value

    try:
        # 600 s: a write batch waits for the service's embedder (a hosted one on this
        # shared machine took over 120 s for a batch of turns and their entity names).
        async with httpx.AsyncClient(base_url=svc.url, timeout=600) as client:
            report["write"] = await write_all(client, svc, convs, options)
            # Warm-up: every question's embedding computed once (and timed), so each
            # configuration below is measured with the same warm query-embedding cache.
            warm = await recall_all(client, svc, jobs, ["graph"], args.concurrency, top_k=1, track=track(False))
            report["cold_embedding_ms"] = {
                "p50": pct([a.embedding_ms for a in warm.answers], 50),
                "p95": pct([a.embedding_ms for a in warm.answers], 95),
            }
            runs = {}
            for name, sources in CONFIGS.items():
                runs[name] = await recall_all(
                    client, svc, jobs, sources, args.concurrency, track=track(sources is None)
                )
            if args.sweep:

                async def fused() -> dict[str, Any]:
                    again = await recall_all(client, svc, jobs, None, args.concurrency, track=track(False))
                    if not args.sweep_sources:
                        return score(jobs, again)
                    # Every source alone too: what a setting does to each list, and to the ceilings.
                    alone = {
                        name: await recall_all(client, svc, jobs, sources, args.concurrency, track=track(False))
                        for name, sources in CONFIGS.items()
                        if sources is not None
                    }
                    return {
                        **score(jobs, again),
                        "configs": {name: score(jobs, r)["overall"] for name, r in alone.items()},
                        "ceilings": ceilings(jobs, alone),
                    }

                report["sweep"] = await run_sweep(client, svc, load_sweep(args.sweep), fused)
    finally:
        await asyncio.to_thread(svc.stop)
    report["configs"] = {name: score(jobs, r) for name, r in runs.items()}
    report["ceilings"] = ceilings(jobs, runs)
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
    """The arguments every suite takes (LoCoMo's own: ``--max-questions``)."""
    parser.add_argument(
        "--suite",
        choices=("locomo", "longmemeval", "beam"),
        default="locomo",
        help="dataset (default locomo; see benchmarks.quality.suites for the others)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        help=f"locomo: folder of LoCoMo *.json files (default {LOCOMO_DATA}); longmemeval: a JSON array in "
        "the official layout; beam: a folder holding 100K/<n>/ (defaults under ../shared/data)",
    )
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
        "--derived-entities",
        dest="entities",
        action="store_true",
        default=False,
        help="name entities the benchmark derives from each turn (proper names and content words: "
        "the mapping before Braid extracted its own), for comparison; default: plain turns, as an "
        "agent runtime sends them (text, speaker, date, session, neighbouring turns as context)",
    )
    parser.add_argument(
        "--no-entities",
        dest="entities",
        action="store_false",
        help="plain turns (the default; kept for older command lines)",
    )
    parser.add_argument("--no-naive", action="store_true", help="skip the naive reference (BM25, MiniLM, RRF)")
    parser.add_argument("--max-questions", type=int, default=0, help="per conversation, for a quick look (0: all)")
    parser.add_argument(
        "--config",
        type=Path,
        default=ROOT / "config" / "braid.yaml",
        help="base service config (the tenants' keys are added to it)",
    )
    parser.add_argument(
        "--name", help="output file stem under benchmarks/results/ (default quality, quality-<suite> for the others)"
    )
    parser.add_argument(
        "--set",
        type=parse_set,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key before the service starts, e.g. sources.graph.weight=0.5 (repeatable)",
    )
    parser.add_argument(
        "--sweep",
        type=Path,
        metavar="FILE.yaml",
        help="after the run, reload each override set of FILE and ask the fused recalls again (tuning.py)",
    )
    parser.add_argument(
        "--sweep-sources",
        action="store_true",
        help="with --sweep: ask each source alone again under every set too, and report the ceilings per set",
    )
    parser.add_argument("--no-track", action="store_true", help="send no `track` field (a service without it)")
