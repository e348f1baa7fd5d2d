"""Many small tenants: does a small tenant's recall stay as fast as the tenant count grows?

``python -m benchmarks.tenants [--tenants 50,1000] [--per 100] [--big 10000]
[--clients 8] [--seconds 15] [--top-k 10] [--groups N] [--active 50] [--per-active 8]
[--profile] [--set dotted.key=value ...] [--name NAME]``

One service on the embedded stack (shipped config, one agent key per tenant
in ``auth.keys``, so the keyring grows with the tenants too; ``--groups``
sets ``typesense.groups``, ``--set`` any other setting over the shipped
config, e.g. ``graph.extract=none``: no extraction on write, which spends
less CPU a memory) is filled in
stages: the big tenant of the load corpus (``benchmarks/load/corpus.py``,
``--big`` memories) and the first stage's small tenants, then more small
tenants up to each next count. Every memory goes through ``POST
/v1/memories`` (embeddings supplied, Braid's own extraction on, as shipped)
and each tenant's relations through ``POST /v1/graph``; the outbox is
drained (waited for as long as it keeps draining: a stage is never measured
while Typesense still imports a backlog), Postgres settled (autovacuum
waited for, then ``VACUUM (ANALYZE)``, :func:`benchmarks.load.run.settle`)
and the stack left to go idle
(:func:`benchmarks.load.run.quiet`) before a stage is measured, and the
machine's speed is probed (:func:`benchmarks.common.speed_probe`), so stages
hours apart can be told apart from a machine that changed between them.

At each stage: fused recalls of small tenants only (``--clients`` clients for
``--seconds`` s, closed loop), each by that tenant's key, a query made from
one of its own memories (the memory's first 8 words and its vector perturbed
by noise norm ~0.3, as the load benchmark's queries). The measured rows ask
the same number of tenants at every stage (``--active`` sampled, each with
``--per-active`` distinct queries, round robin), so a tenant is asked as
often at 10,000 tenants as at 50 and the stages differ only in what is
stored; a ``spread`` row then asks up to 400 tenants one query each (as
this benchmark did before: at larger stages each tenant is asked rarely, so
its per-tenant caches are colder). Reported: p50/p99, CPU
ms per recall by process, recalls that returned fewer than ``top_k`` items
(every tenant has ``--per`` memories, but the sources' relevance floors may
leave fewer) and, per source, answers under ``top_k`` hits; the pgvector
answers with fewer hits than an exact search over the tenant's vectors with
the source's floors gives; and, with pgvector's floors off (a config reload),
each spread tenant once by pgvector alone, counting answers under
min(candidates, ``--per``) hits (what a filtered index that starves small
tenants would show); Postgres' index count, table sizes
and the planning time of a tenant-scoped vector query (``EXPLAIN (SUMMARY)``,
median of 50); the keyring's lookup time at that many keys.

With ``--profile``, py-spy samples the service during each stage's measured
recalls (raw stacks: ``tenants[-<name>]-<count>.txt``) and the report splits
the service's CPU a recall by stage of the recall.

Report: ``benchmarks/results/tenants[-<name>].{md,json,png}``. Last line:
``tenants: <count>:p50_ms=<x>,short=<n> ... ratio=<last p50 / first p50> spread_ratio=<the same, spread rows>``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import secrets
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
import psycopg

from benchmarks.common import (
    RESULTS,
    CpuMeter,
    Service,
    cpu_per_call,
    cpu_used,
    pct,
    pyplot,
    speed_probe,
    write_results,
)
from benchmarks.load.client import LeanClient
from benchmarks.load.corpus import BIG_TENANT, Corpus, build_corpus, describe
from benchmarks.load.run import bulk_load, config_text, graph_load, quiet, settle, wait_drained
from benchmarks.quality.tuning import Override, parse_set
from benchmarks.recall_profile import py_spy, summarise
from config.loader import parse_config
from config.sources import PgvectorSourceConfig
from service.auth import Keyring

#: Relations per tenant (the load corpus' 300 would make 10,000 tenants' graph
#: load alone take longer than their memories).
RELATIONS = 30
QUERY_NOISE = 0.3
#: Tenants recalled once each in a stage's spread row (most of them cold).
SPREAD = 400
#: How long the outbox may go without draining a row before a stage gives up
#: (no fixed wait fits: after the last write of a 10,000-tenant stage some
#: 700,000 documents were still to go into Typesense, at about 260 a second).
DRAIN_STALL_S = 300.0


def _queries(
    corpus: Corpus,
    tenants: list[str],
    rng: random.Random,
    top_k: int,
    floors: tuple[float, float, int],
    per_tenant: int = 1,
) -> list[tuple[str, bytes, int]]:
    """``per_tenant`` recalls per tenant, round robin over ``tenants``: (tenant,
    encoded body, pgvector hits an exact search gives), each from one of its
    memories (distinct ones: ``per_tenant`` is at most its memory count). ``floors``: the pgvector source's
    ``minSimilarity``, ``relativeFloor`` and ``candidates``; the exact count is
    of the tenant's memories above both floors (by a margin of 1e-4, so a
    rounding difference does not count as a miss), at most ``candidates``."""
    min_similarity, relative, candidates = floors
    by_name = {t.name: t for t in corpus.tenants}
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    picks = {name: rng.sample(range(len(by_name[name].memories)), per_tenant) for name in tenants}
    out = []
    for round_ in range(per_tenant):
        for name in tenants:
            t = by_name[name]
            i = picks[name][round_]
            noise = nrng.standard_normal(t.vectors.shape[1]) * QUERY_NOISE / np.sqrt(t.vectors.shape[1])
            v = t.vectors[i] + noise
            v = v / np.linalg.norm(v)
            text = " ".join(t.memories[i]["content"].split()[:8])
            sims = t.vectors @ v.astype(np.float32)
            floor = max(min_similarity, relative * float(sims.max())) + 1e-4
            exact = min(candidates, int((sims >= floor).sum()))
            body = msgspec.json.encode({"query": text, "embedding": v.tolist(), "top_k": top_k})
            out.append((name, body, exact))
    return out


def _only_pgvector(body: bytes) -> bytes:
    return msgspec.json.encode({**msgspec.json.decode(body), "sources": ["pgvector"]})


async def _recalls(
    svc: Service,
    keys: dict[str, str],
    queries: list[tuple[str, bytes, int]],
    clients: int,
    seconds: float,
    top_k: int,
    meter: CpuMeter,
    *,
    once: bool = False,
) -> dict[str, Any]:
    """Closed loop over ``queries`` for ``seconds`` (``once``: one pass, no time limit)."""
    lat: list[float] = []
    short = 0
    short_by_source: dict[str, int] = {}
    under_exact = 0
    source_ms: dict[str, list[float]] = {}
    errors: list[str] = []
    degraded = 0
    it = iter(queries) if once else itertools.cycle(queries)
    deadline = float("inf") if once else time.perf_counter() + seconds

    async def worker(lean: LeanClient) -> None:
        nonlocal short, degraded, under_exact
        for tenant, body, exact in it:
            if time.perf_counter() > deadline:
                return
            headers = {"Authorization": f"Bearer {keys[tenant]}", "content-type": "application/json"}
            t0 = time.perf_counter()
            code, raw = await lean.post("/v1/recall", body, headers)
            ms = (time.perf_counter() - t0) * 1000
            if code != 200:
                errors.append(f"{code} {raw[:160]!r}")
                continue
            lat.append(ms)
            data = msgspec.json.decode(raw)
            degraded += bool(data["degraded"])
            short += len(data["items"]) < top_k
            for name, s in data["sources"].items():
                if s["status"] != "ok":
                    continue
                source_ms.setdefault(name, []).append(s["ms"])
                if s["hits"] < top_k:
                    short_by_source[name] = short_by_source.get(name, 0) + 1
            pg = data["sources"].get("pgvector")
            under_exact += pg is not None and pg["status"] == "ok" and pg["hits"] < exact

    async with LeanClient(svc.url, max_connections=clients * 2) as lean:
        before = meter()
        start = time.perf_counter()
        await asyncio.gather(*(worker(lean) for _ in range(clients)))
        elapsed = time.perf_counter() - start
        cpu = cpu_per_call(before, meter(), len(lat))
    return {
        "n": len(lat),
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
        "per_s": len(lat) / elapsed,
        "cpu_ms": cpu,
        "short": short,
        "short_by_source": short_by_source,
        "source_ms_p50": {name: pct(v, 50) for name, v in sorted(source_ms.items())},
        "pgvector_under_exact": under_exact,
        "degraded": degraded,
        "errors": errors[:10],
        "error_count": len(errors),
    }


def _postgres_facts(dsn: str, tenant: str, vector: np.ndarray) -> dict[str, Any]:
    """Index count, table sizes and a tenant-scoped vector query's planning time."""
    literal = "[" + ",".join(f"{x:.6f}" for x in vector) + "]"
    with psycopg.connect(dsn, autocommit=True) as conn:
        (indexes,) = conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchone() or (0,)
        sizes = {
            name: int(size)
            for name, size in conn.execute(
                """SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
                   ORDER BY 2 DESC LIMIT 6"""
            ).fetchall()
        }
        plans = []
        for _ in range(50):
            rows = conn.execute(
                # As the pgvector source walks for a tenant without an index of its own.
                "EXPLAIN (SUMMARY ON) SELECT id FROM memories WHERE tenant = %s AND tier = 'session' AND NOT own"
                " ORDER BY embedding <=> %s::vector LIMIT 10",
                (tenant, literal),
            ).fetchall()
            line = next(r[0] for r in rows if r[0].startswith("Planning Time"))
            plans.append(float(line.split(":")[1].split()[0]))
    return {"indexes": int(indexes), "table_bytes": sizes, "planning_ms": statistics.median(plans)}


#: The shipped pgvector floors, and the same with no floor (the starvation check).
_PG_FLOORS = "    minSimilarity: 0.15\n    relativeFloor: 0.3\n"
_PG_NO_FLOORS = "    minSimilarity: null\n    relativeFloor: 0.0\n"


async def _reload(svc: Service, text: str) -> None:
    """The service's config file replaced by ``text`` and reloaded (SIGHUP)."""
    (svc.home / "braid.yaml").write_text(text)
    svc.proc.send_signal(signal.SIGHUP)
    await asyncio.sleep(2.0)


def _keyring_lookup_us(keys: dict[str, str]) -> float:
    """Microseconds of one :meth:`Keyring.lookup` among ``keys`` (median of 5 runs of 500)."""
    ring = Keyring()
    for tenant, key in keys.items():
        ring.add(key, tenant=tenant, role="agent")
    presented = list(keys.values())
    runs = []
    for _ in range(5):
        t0 = time.process_time()
        for i in range(500):
            ring.lookup(presented[i % len(presented)])
        runs.append((time.process_time() - t0) / 500 * 1e6)
    return statistics.median(runs)


def with_groups(text: str, groups: int) -> str:
    """The config ``text`` with ``typesense.groups`` set to ``groups``."""
    assert text.count("\n  groups: 1\n") == 1, "config/braid.yaml changed: no `groups: 1` found once"
    return text.replace("\n  groups: 1\n", f"\n  groups: {groups}\n")


async def run(
    counts: list[int],
    per: int,
    big: int,
    clients: int,
    seconds: float,
    top_k: int,
    seed: int,
    groups: int = 1,
    on_stage: Callable[[dict[str, Any]], None] = lambda report: None,
    sets: Sequence[Override] = (),
    active: int = 50,
    per_active: int = 8,
    profile: Path | None = None,
) -> dict[str, Any]:
    """The stages measured; ``on_stage`` is handed the report after each one
    (so a run stopped during a long load keeps the stages it finished).
    ``profile``: py-spy samples the service during each stage's measured
    recalls, its raw stacks written to ``<profile>-<tenants>.txt``."""
    corpus = build_corpus(big, small_tenants=max(counts), small_size=per, relations=RELATIONS)
    keys = {t.name: secrets.token_urlsafe(24) for t in corpus.tenants}
    headers = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
    cfg_text = with_groups(config_text(keys, sets), groups)
    assert cfg_text.count(_PG_FLOORS) == 1, "config/braid.yaml changed: pgvector's floors not found once"
    cfg = parse_config(cfg_text)
    max_body = cfg.server.max_body_bytes
    pg_section = cfg.source("pgvector")
    assert isinstance(pg_section, PgvectorSourceConfig)
    floors = (
        pg_section.min_similarity if pg_section.min_similarity is not None else -1.0,
        pg_section.relative_floor,
        pg_section.candidates,
    )
    report: dict[str, Any] = {
        "corpus": describe(corpus),
        "per": per,
        "big": big,
        "groups": groups,
        "active": active,
        "per_active": per_active,
        "sets": [list(x) for x in sets],
        "stages": [],
    }
    rng = random.Random(seed)
    svc = Service(config_text=cfg_text, prefix="braid-tenants-")
    try:
        meter = CpuMeter(svc.processes)
        dsn = svc.postgres_dsn()
        loaded = 0  # small tenants written so far; tenants[0] is the big one
        async with httpx.AsyncClient(base_url=svc.url, timeout=600) as client:
            for count in counts:
                stage = corpus.tenants[0:1] if loaded == 0 else []
                stage += corpus.tenants[1 + loaded : 1 + count]
                sub = replace(corpus, tenants=stage)
                print(f"tenants: loading {len(stage)} tenants ({sub.total} memories) up to {count}", flush=True)
                t0 = time.perf_counter()
                cpu0 = meter()
                graph = await graph_load(client, sub, headers)
                cpu1 = meter()
                write = await bulk_load(client, sub, headers, 200, 3, max_body)
                # Measured only once Typesense holds every memory: a backlog
                # would be imported during the recalls and share their CPU.
                drained = await wait_drained(client, stall_s=DRAIN_STALL_S, label="tenants: ")
                if drained["pending_left"]:
                    raise RuntimeError(
                        f"the outbox still held {drained['pending_left']} rows after {drained['seconds']:.0f} s"
                        f" ({DRAIN_STALL_S:.0f} s without progress): the stage is not measured"
                    )
                cpu2 = meter()
                load_s = time.perf_counter() - t0
                # Recalls measured on a Postgres with no maintenance left from
                # the load (a stage that loads faster would otherwise share its
                # recalls with more of it).
                settled = await settle(dsn)
                # ... nor with what Typesense (or anything else) still does
                # after it; and the machine's own speed, which can drift
                # between stages hours apart.
                idle = await quiet(meter)
                probe_ms = speed_probe()
                loaded = count
                small = [t.name for t in corpus.tenants[1 : 1 + count]]
                # The measured recalls: the same number of active tenants at
                # every stage, each asked the same number of distinct queries,
                # so each tenant's recall rate (and what its caches keep) is the
                # stage's to compare, not the sampling's.
                chosen = rng.sample(small, min(len(small), active))
                queries = _queries(corpus, chosen, rng, top_k, floors, per_active)
                # The spread: up to 400 tenants once each (most of them cold).
                sample = rng.sample(small, min(len(small), SPREAD))
                spread_queries = _queries(corpus, sample, rng, top_k, floors)
                print(f"tenants: {count} tenants loaded in {load_s:.0f} s; recalls", flush=True)
                # Warm-up: each query once (connections, caches), not measured.
                await _recalls(svc, keys, queries, clients, 0.0, top_k, meter, once=True)
                spy = None
                if profile is not None:
                    raw = profile.with_name(f"{profile.name}-{count}.txt")
                    spy = py_spy(svc.proc.pid, raw, seconds=int(seconds) + 2)
                    await asyncio.sleep(1.0)  # attached before the measured recalls start
                recalls = await _recalls(svc, keys, queries, clients, seconds, top_k, meter)
                if spy is not None:
                    _, err = await asyncio.to_thread(spy.communicate, timeout=120)
                    if spy.returncode != 0:
                        raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')[-2000:]}")
                    recalls["profile"] = summarise(raw.read_text())
                await _recalls(svc, keys, spread_queries, clients, 0.0, top_k, meter, once=True)
                spread = await _recalls(svc, keys, spread_queries, clients, seconds, top_k, meter)
                # The starvation check: pgvector alone without its floors, so
                # every answer should hold min(candidates, per) memories.
                await _reload(svc, cfg_text.replace(_PG_FLOORS, _PG_NO_FLOORS))
                unfloored = [(name, _only_pgvector(body), min(floors[2], per)) for name, body, _ in spread_queries]
                starved = await _recalls(svc, keys, unfloored, clients, 0.0, top_k, meter, once=True)
                await _reload(svc, cfg_text)
                vec = corpus.tenants[1].vectors[0]
                facts = await asyncio.to_thread(_postgres_facts, dsn, corpus.tenants[1].name, vec)
                stage_report = {
                    "tenants": count,
                    "memories": big + count * per,
                    "loaded": sub.total,
                    "load_s": load_s,
                    # CPU of the graph load (s by process), and a memory's
                    # through the write path and the outbox (ms by process).
                    "graph_cpu_s": cpu_used(cpu0, cpu1),
                    "load_cpu_ms": cpu_per_call(cpu1, cpu2, sub.total),
                    "write_per_s": write["per_s"],
                    "write_errors": write["error_count"] + len(graph["errors"]),
                    "drain_s": drained["seconds"],
                    "settle_s": settled["seconds"],
                    "quiet": idle,
                    "probe_ms": probe_ms,
                    "recall": recalls,
                    "active_tenants": len(chosen),
                    "spread": spread,
                    "spread_tenants": len(sample),
                    "unfloored": {k: starved[k] for k in ("n", "pgvector_under_exact", "error_count", "errors")},
                    "pgvector_exact_mean": statistics.mean(q[2] for q in queries),
                    "postgres": facts,
                    "keyring_lookup_us": _keyring_lookup_us({k: keys[k] for k in [BIG_TENANT, *small]}),
                }
                report["stages"].append(stage_report)
                on_stage(report)
                print(
                    f"tenants: {count}: p50 {recalls['p50']:.1f} ms, short {recalls['short']}/{recalls['n']}, "
                    f"indexes {facts['indexes']}, planning {facts['planning_ms']:.3f} ms",
                    flush=True,
                )
    finally:
        svc.stop()
    return report


def markdown(report: dict[str, Any], command: str) -> str:
    stages = report["stages"]
    first = stages[0]["recall"]["p50"]
    lines = [
        "# Many small tenants: a small tenant's fused recall as the tenant count grows",
        "",
        f"Command: `{command}`  ",
        f"Corpus: {report['corpus']} (small tenants of {report['per']} memories, added in stages).  ",
        f"Typesense collection groups (`typesense.groups`): {report.get('groups', 1)}.  ",
        "One service, embedded Postgres and Typesense, shipped config"
        + "".join(f", `{k}` {v}" for k, v in report.get("sets", []))
        + ", one agent key per tenant; before each stage's recalls the outbox drained and Postgres settled"
        " (autovacuum waited for, `VACUUM (ANALYZE)`). Recalls: small"
        " tenants only, each by its own key, a query from one of its memories (first 8 words, vector + noise"
        " ~0.3), closed loop. Measured rows: the same number of active tenants at every stage"
        f" ({report.get('active', 400)} sampled, {report.get('per_active', 1)} distinct queries each, round robin,"
        " each query once as a warm-up first), so each tenant is asked as often at every stage; `spread`: up to"
        f" {SPREAD} tenants sampled, one query each, cycled (after its own warm-up pass), so at larger stages"
        " each tenant is asked rarely and its per-tenant caches (graph copy, bm25 counts) are colder; `short` ="
        " recalls with fewer than top_k"
        " items (the sources' relevance floors can leave fewer: the tenant's memories are not all near the query);"
        " per source: `ok` answers with fewer than top_k hits; `pgvector under exact`: pgvector answers with"
        " fewer hits than an exact search of the tenant's vectors with the source's floors gives; then, with the"
        " pgvector floors off (a config reload), each spread tenant once more by pgvector alone: answers holding"
        " fewer than min(candidates, memories per tenant) hits (a filtered index starving small tenants).",
        "",
        "| tenants | memories | load s (memories/s) | active tenants | recalls | p50 ms | p99 ms | p50 / first | recalls/s"
        " | per-source p50 ms | CPU ms a recall (service / Postgres / Typesense) | short | short by source"
        " | spread: tenants, recalls, p50 ms (/ first), CPU ms a recall | Postgres indexes"
        " | pgvector under exact | pgvector without floors under min(candidates, per) | planning ms | key lookup µs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    spread_first = stages[0]["spread"]["p50"] if "spread" in stages[0] else None
    for s in stages:
        r = s["recall"]
        c = r["cpu_ms"]
        by = ", ".join(f"{k} {v}" for k, v in sorted(r["short_by_source"].items())) or "none"
        sp = s.get("spread")
        spread = "–"
        if sp is not None and spread_first:
            sc = sp["cpu_ms"]
            spread = (
                f"{s['spread_tenants']}, {sp['n']}, {sp['p50']:.1f} ({sp['p50'] / spread_first:.2f}),"
                f" {sc.get('service', 0):.2f} / {sc.get('postgres', 0):.2f} / {sc.get('typesense', 0):.2f}"
            )
        lines.append(
            f"| {s['tenants']} | {s['memories']} | {s['load_s']:.0f} ({s['write_per_s']:.0f}/s)"
            f" | {s.get('active_tenants', '–')} | {r['n']}"
            f" | {r['p50']:.1f} | {r['p99']:.1f} | {r['p50'] / first:.2f} | {r['per_s']:.0f}"
            f" | {', '.join(f'{k} {v:.1f}' for k, v in r.get('source_ms_p50', {}).items()) or '–'}"
            f" | {c.get('service', 0):.2f} / {c.get('postgres', 0):.2f} / {c.get('typesense', 0):.2f}"
            f" | {r['short']} | {by} | {spread} | {s['postgres']['indexes']}"
            f" | {r['pgvector_under_exact']} (exact: {s['pgvector_exact_mean']:.1f} hits)"
            f" | {s['unfloored']['pgvector_under_exact']} of {s['unfloored']['n']}"
            f" | {s['postgres']['planning_ms']:.3f}"
            f" | {s['keyring_lookup_us']:.1f} |"
        )
    profiled = [s for s in stages if "profile" in s["recall"]]
    if profiled:
        names = sorted(
            {k for s in profiled for k in s["recall"]["profile"]["stages"]},
            key=lambda k: -profiled[-1]["recall"]["profile"]["stages"].get(k, 0.0),
        )
        lines += [
            "",
            "Service CPU of the measured recalls by stage of the recall (py-spy's share of the samples"
            " x the service's CPU ms a recall; `benchmarks/recall_profile.py`'s stages, the raw stacks"
            " beside this report):",
            "",
            "| stage | " + " | ".join(f"{s['tenants']} tenants" for s in profiled) + " |",
            "|---|" + "---|" * len(profiled),
        ]
        for k in names:
            cells = [
                f"{s['recall']['profile']['stages'].get(k, 0.0) * s['recall']['cpu_ms'].get('service', 0.0):.2f}"
                for s in profiled
            ]
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
    metered = [s for s in stages if "load_cpu_ms" in s]
    if metered:
        lines += [
            "",
            "What each stage's load cost, by process (service / Postgres / Typesense): the CPU s of its graph"
            " load (`POST /v1/graph`, each tenant's relations), and the CPU ms a memory of its memory load"
            " (`POST /v1/memories`, until the outbox drained):",
            "",
            "| tenants | memories loaded | graph load CPU s | CPU ms a memory |",
            "|---|---|---|---|",
        ]
        for s in metered:
            g, m = s["graph_cpu_s"], s["load_cpu_ms"]
            lines.append(
                f"| {s['tenants']} | {s['loaded']} | {g.get('service', 0):.0f} / {g.get('postgres', 0):.0f}"
                f" / {g.get('typesense', 0):.0f} | {m.get('service', 0):.2f} / {m.get('postgres', 0):.2f}"
                f" / {m.get('typesense', 0):.2f} |"
            )
    waits = [s for s in stages if "quiet" in s]
    if waits:
        q0 = waits[0]["quiet"]
        lines += [
            "",
            f"Before each stage's recalls (after Postgres settled): the wait until every server process stayed under"
            f" {q0['idle_share']:.0%} of a core for {q0['idle_for_s']:.0f} s, with the CPU ms each spent meanwhile"
            " (service / Postgres / Typesense), and the machine's speed (`speed_probe`: CPU ms of one fixed"
            " workload; higher is slower):",
            "",
            "| tenants | wait s | CPU ms meanwhile | speed probe ms |",
            "|---|---|---|---|",
        ]
        for s in waits:
            q, c = s["quiet"], s["quiet"]["cpu_ms"]
            lines.append(
                f"| {s['tenants']} | {q['seconds']:.0f}{'' if q['idle'] else ' (still busy)'}"
                f" | {c.get('service', 0):.0f} / {c.get('postgres', 0):.0f} / {c.get('typesense', 0):.0f}"
                f" | {s['probe_ms']:.1f} |"
            )
    last = stages[-1]
    lines += [
        "",
        "Largest tables at the last stage: "
        + ", ".join(f"`{k}` {v / 2**20:.0f} MiB" for k, v in last["postgres"]["table_bytes"].items())
        + ".",
        "",
        "Errors: "
        + (
            "none."
            if not any(s["recall"]["error_count"] or s["write_errors"] for s in stages)
            else "; ".join(f"{s['tenants']}: {s['recall']['errors'] or s['write_errors']}" for s in stages)
        ),
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Any) -> None:
    plt = pyplot()
    if plt is None:
        return
    stages = report["stages"]
    x = [s["tenants"] for s in stages]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [s["recall"]["p50"] for s in stages], "o-", label="p50")
    ax.plot(x, [s["recall"]["p99"] for s in stages], "s--", label="p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tenants")
    ax.set_ylabel("small tenant's fused recall, ms")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", default="50,1000", help="small-tenant counts, ascending")
    parser.add_argument("--per", type=int, default=100)
    parser.add_argument("--big", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--groups", type=int, default=1, help="typesense.groups (tenants spread over n collection pairs)"
    )
    parser.add_argument("--active", type=int, default=50, help="tenants recalled in each stage's measured rows")
    parser.add_argument("--per-active", type=int, default=8, help="distinct queries per active tenant")
    parser.add_argument("--profile", action="store_true", help="py-spy on the service during the measured recalls")
    parser.add_argument("--set", dest="sets", action="append", default=[], type=parse_set, metavar="KEY=VALUE")
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    counts = [int(x) for x in args.tenants.split(",")]
    if counts != sorted(set(counts)) or counts[0] < 1:
        parser.error("--tenants: ascending positive counts, e.g. 50,1000")
    if args.groups < 1:
        parser.error("--groups: 1 or more")
    if args.active < 1 or not 1 <= args.per_active <= args.per:
        parser.error("--active: 1 or more; --per-active: 1 to --per")
    command = "python -m benchmarks.tenants " + " ".join(sys.argv[1:])
    name = "tenants" + (f"-{args.name}" if args.name else "")

    def write(report: dict[str, Any]) -> None:
        path = write_results(name, markdown(report, command), report)
        plot(report, path.with_suffix(".png"))
        print(f"wrote {path}", flush=True)

    report = asyncio.run(
        run(
            counts,
            args.per,
            args.big,
            args.clients,
            args.seconds,
            args.top_k,
            args.seed,
            args.groups,
            write,
            args.sets,
            args.active,
            args.per_active,
            RESULTS / name if args.profile else None,
        )
    )
    first = report["stages"][0]["recall"]["p50"]
    parts = " ".join(
        f"{s['tenants']}:p50_ms={s['recall']['p50']:.1f},short={s['recall']['short']},"
        f"under_exact={s['recall']['pgvector_under_exact']}"
        + f",unfloored_under={s['unfloored']['pgvector_under_exact']}"
        for s in report["stages"]
    )
    spread = report["stages"][-1]["spread"]["p50"] / report["stages"][0]["spread"]["p50"]
    print(f"tenants: {parts} ratio={report['stages'][-1]['recall']['p50'] / first:.2f} spread_ratio={spread:.2f}")


if __name__ == "__main__":
    main()
