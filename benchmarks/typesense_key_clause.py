"""What the tenant clause costs a bm25 candidate search as a tenant's own collection grows.

``python -m benchmarks.typesense_key_clause [--sizes 100000,200000,400000] [--queries Q] [--rounds R]``
starts an embedded Typesense and writes the load benchmark's big tenant
(``benchmarks/load/corpus.py``, built for the largest size) as Braid's keyword
documents (:func:`~indexers.typesense.documents.record_document`) into one
collection holding that tenant alone: what a tenant's own pair holds once the
placement job has moved it. At each size, in turn, it sends ``Q`` of the
corpus' queries as the candidate search of a warm recall (terms chosen
rarest first within the budget, as :func:`~indexers.typesense.bm25.select_terms`
does; ``per_page`` 150, ``sort_by length:asc``, the source's fields), in
these variants:

* ``shipped``: ``current_key:=<key> && tenant_terms:=[...]``, as the source sends it;
* ``terms``: ``tenant_terms:=[...]`` alone (in an own collection every
  document is the tenant's; currency would be checked on the hits);
* ``shipped/0`` and ``terms/0``: the same with ``per_page`` 0 (the filter and
  the count, no hit read);
* ``source/<route>/<caches>``: a recall of Braid's own ``typesense`` source
  (:class:`~indexers.typesense.source.TypesenseSource`, the default config,
  its vectors covered by pgvector as in a fused recall) for the same query,
  routed to the collection through a group's alias (``group``: the filter
  names ``current_key``) and through the tenant's own alias (``own``: the
  source leaves the clause out and checks the hits), with its count caches
  warm (``warm``: one candidate search) or cold (``cold``: each term's
  document count and the corpus statistics asked for too); every variant
  must return the same memories.

Every document of the corpus is current, so both filters find the same
documents (checked). The variants take turns in each round, in alternating
order; the figure is the Typesense process' CPU per search (median over
rounds). Writes ``benchmarks/results/typesense-key-clause.{md,json}`` and prints::

    typesense-key-clause: <size>: shipped=<ms> terms=<ms> shipped/0=<ms> terms/0=<ms> ms CPU/search ...
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec

from benchmarks.common import write_results
from benchmarks.load.corpus import build_corpus
from benchmarks.typesense_import_cost import import_batches, server_process
from benchmarks.typesense_term_key import alternating_rounds
from config import BraidConfig, TypesenseSourceConfig
from config.loader import load_config
from deploy.embedded import EmbeddedTypesense
from indexers.base import MemoryRecord, SearchQuery
from indexers.typesense.bm25 import select_terms
from indexers.typesense.client import TypesenseClient
from indexers.typesense.documents import collection_schema, quoted_list, record_document, tenant_key, tenant_terms
from indexers.typesense.keywords import keyword_terms
from indexers.typesense.placement import own_alias
from indexers.typesense.source import _BM25_FIELDS, TypesenseSource

VARIANTS = ("shipped", "terms", "shipped/0", "terms/0")
STREAM_VARIANTS = ("stream/ttl", "stream/drift")
SOURCE_VARIANTS = ("source/group/warm", "source/own/warm", "source/group/cold", "source/own/cold")
#: The group alias the ``source/*`` variants route through (and beside which the tenant's own alias is).
GROUP = "mem"
#: The corpus' queries, all of which the streams cycle through.
STREAM_QUERIES = 500
BUDGET = 150
MAX_TERMS = 16
COLLECTION = "own"


def _record(m: dict[str, Any]) -> MemoryRecord:
    return MemoryRecord(
        id=m["id"],
        tenant="big",
        content=m["content"],
        kind=m.get("kind", "note"),
        tier=m["tier"],
        created_at=datetime.fromisoformat(m["created_at"].replace("Z", "+00:00")).astimezone(UTC),
        confidence=0.9,
        speaker=m.get("speaker"),
        session_id=m.get("session_id"),
    )


def _filter(variant: str, key: str, keyed: list[str]) -> str:
    terms = f"tenant_terms:={quoted_list(keyed)}"
    return f"current_key:={key} && {terms}" if variant.startswith("shipped") else terms


async def _measure(
    c: httpx.AsyncClient, server: Any, chosen: list[list[str]], key: str, rounds: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    enc = msgspec.json.Encoder()
    sent: dict[str, list[bytes]] = {}
    for variant in VARIANTS:
        sent[variant] = [
            enc.encode(
                {
                    "searches": [
                        {
                            "collection": COLLECTION,
                            "q": "*",
                            "filter_by": _filter(variant, key, tenant_terms("big", terms)),
                            "per_page": 0 if variant.endswith("/0") else BUDGET,
                            "sort_by": "length:asc",
                            "include_fields": _BM25_FIELDS,
                        }
                    ]
                }
            )
            for terms in chosen
        ]
    return await alternating_rounds(c, server, sent, rounds)


def _routed_source(client: TypesenseClient, config: BraidConfig, alias: str) -> TypesenseSource:
    """Braid's ``typesense`` source with ``config``, every tenant's searches routed to ``alias``."""
    return TypesenseSource(client, GROUP, lambda: config, route=lambda _tenant: (client, alias))


async def _measure_source(
    url: str, api_key: str, server: Any, texts: list[str], rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Braid's ``typesense`` source, routed through the group alias and the
    tenant's own, with warm count caches (``countTtlMs`` an hour, filled by
    a warm-up round) and cold ones (``countTtlMs`` 0: each recall counts its
    terms' documents again, as a recall of terms not asked for in the last
    ``countTtlMs`` does), the variants in turn, in alternating order,
    ``rounds`` times after the warm-up round: the Typesense process' CPU ms
    and the wall ms of a recall per round. Raises if the two routes return
    different memories for a query."""
    base = load_config()
    configs = {
        "warm": base.with_source("typesense", count_ttl_ms=3_600_000),
        "cold": base.with_source("typesense", count_ttl_ms=0),
    }
    routes = {"group": GROUP, "own": own_alias(GROUP, "big")}
    client = TypesenseClient([url], api_key, timeout=600)
    cpu: dict[str, list[float]] = {v: [] for v in SOURCE_VARIANTS}
    wall: dict[str, list[float]] = {v: [] for v in SOURCE_VARIANTS}
    try:
        for alias in routes.values():
            await client.upsert_alias(alias, COLLECTION)

        sources = {
            v: _routed_source(client, configs[v.split("/")[2]], routes[v.split("/")[1]]) for v in SOURCE_VARIANTS
        }
        limit = base.source("typesense").candidates
        asked = [SearchQuery("big", text, None, limit, vectors_covered=True) for text in texts]
        answers: dict[str, list[list[str]]] = {}
        for n in range(rounds + 1):  # round 0 warms the caches up
            for variant in SOURCE_VARIANTS if n % 2 == 0 else SOURCE_VARIANTS[::-1]:
                before, started = sum(server.cpu_times()[:2]), time.perf_counter()
                answers[variant] = [[h.id for h in await sources[variant].search(q)] for q in asked]
                spent = (sum(server.cpu_times()[:2]) - before) / len(asked) * 1000
                took = (time.perf_counter() - started) / len(asked) * 1000
                if n:
                    cpu[variant].append(spent)
                    wall[variant].append(took)
                    print(f"round {n}/{rounds}: {variant} {spent:.3f} ms CPU, {took:.3f} ms a recall", flush=True)
        if len({tuple(map(tuple, a)) for a in answers.values()}) != 1:
            raise AssertionError("the source found different memories through the group and its own alias")
    finally:
        await client.aclose()
    return cpu, wall


async def _measure_stream(
    url: str, api_key: str, server: Any, texts: list[str], seconds: float, rate: float, first: str
) -> dict[str, dict[str, float]]:
    """Braid's ``typesense`` source through the tenant's own alias, with the
    default config and ``countDrift`` 0 (``stream/ttl``: counts reused for
    ``countTtlMs`` only) and with its default (``stream/drift``), each from
    empty caches: ``texts`` in turn, over and over, ``rate`` recalls a second
    for ``seconds``, ``first`` of the two first. Per variant: recalls, the
    Typesense process' CPU ms a recall and the median wall ms."""
    base = load_config()
    drift = base.source("typesense")
    assert isinstance(drift, TypesenseSourceConfig)
    configs = {"stream/drift": base, "stream/ttl": base.with_source("typesense", count_drift=0.0)}
    client = TypesenseClient([url], api_key, timeout=600)
    limit = drift.candidates
    out: dict[str, dict[str, float]] = {}
    try:
        await client.upsert_alias(own_alias(GROUP, "big"), COLLECTION)
        for variant in sorted(configs, key=lambda v: v != first):
            config = configs[variant]
            source = _routed_source(client, config, own_alias(GROUP, "big"))
            walls: list[float] = []
            before, started = sum(server.cpu_times()[:2]), time.perf_counter()
            n = 0
            while (now := time.perf_counter()) - started < seconds:
                due = started + n / rate
                if now < due:
                    await asyncio.sleep(due - now)
                t0 = time.perf_counter()
                await source.search(SearchQuery("big", texts[n % len(texts)], None, limit, vectors_covered=True))
                walls.append((time.perf_counter() - t0) * 1000)
                n += 1
            cpu = (sum(server.cpu_times()[:2]) - before) / n * 1000
            out[variant] = {"recalls": n, "cpu_ms": cpu, "wall_p50_ms": statistics.median(walls)}
            print(
                f"{variant}: {n} recalls, {cpu:.3f} ms CPU a recall, p50 {statistics.median(walls):.2f} ms", flush=True
            )
    finally:
        await client.aclose()
    return out


async def run(
    sizes: list[int], queries: int, rounds: int, stream_seconds: float = 60.0, stream_rate: float = 20.0
) -> dict[str, Any]:
    corpus = build_corpus(max(sizes), small_tenants=0, small_size=0, relations=10, queries=STREAM_QUERIES)
    memories = corpus.tenants[0].memories
    texts = [q["text"] for q in corpus.queries[:queries]]
    key = tenant_key("big")
    home = Path(tempfile.mkdtemp(prefix="braid-key-clause-"))
    ts = EmbeddedTypesense(home / "typesense")
    url = ts.start()
    steps: list[dict[str, Any]] = []
    try:
        server = server_process(home)
        async with httpx.AsyncClient(base_url=url, headers={"X-TYPESENSE-API-KEY": ts.api_key}, timeout=600) as c:
            (await c.post("/collections", json=collection_schema(COLLECTION))).raise_for_status()
            written = 0
            for size in sorted(sizes):
                docs = [record_document(_record(m)) for m in memories[written:size]]
                await import_batches(c, COLLECTION, docs, 500)
                written = size
                print(f"typesense-key-clause: {size} documents in", flush=True)

                async def df(term: str) -> int:
                    params: dict[str, str | int] = {
                        "q": "*",
                        "per_page": 0,
                        "filter_by": _filter("shipped", key, tenant_terms("big", [term])),
                    }
                    r = await c.get(f"/collections/{COLLECTION}/documents/search", params=params)
                    r.raise_for_status()
                    return int(r.json()["found"])

                chosen: list[list[str]] = []
                for text in texts:
                    terms = keyword_terms(text, MAX_TERMS)
                    if terms:
                        chosen.append(select_terms(terms, {t: await df(t) for t in terms}, BUDGET))
                cpu, found = await _measure(c, server, chosen, key, rounds)
                if found["shipped"] != found["terms"]:
                    raise AssertionError(f"the filters found different documents: {found}")
                source_cpu, source_wall = await _measure_source(url, ts.api_key, server, texts, rounds)
                cpu.update(source_cpu)
                every = [q["text"] for q in corpus.queries]
                first = STREAM_VARIANTS[len(steps) % 2]
                stream = (
                    await _measure_stream(url, ts.api_key, server, every, stream_seconds, stream_rate, first)
                    if stream_seconds > 0
                    else {}
                )
                median = {v: statistics.median(cpu[v]) for v in (*VARIANTS, *SOURCE_VARIANTS)}
                wall_median = {v: statistics.median(source_wall[v]) for v in SOURCE_VARIANTS}
                print(
                    f"typesense-key-clause: {size}: " + " ".join(f"{v}={m:.2f}" for v, m in median.items()),
                    flush=True,
                )
                steps.append(
                    {
                        "size": size,
                        "queries": len(chosen),
                        "found": found,
                        "cpu_ms_per_search": cpu,
                        "median": median,
                        "wall_ms_per_recall": source_wall,
                        "wall_median": wall_median,
                        "stream": stream,
                    }
                )
    finally:
        ts.stop()
        shutil.rmtree(home, ignore_errors=True)
    return {"rounds": rounds, "stream_seconds": stream_seconds, "stream_rate": stream_rate, "steps": steps}


def markdown(report: dict[str, Any], command: str) -> str:
    rows = [
        f"| {s['size']} | {s['queries']} | "
        + " | ".join(f"{s['median'][v]:.2f}" for v in VARIANTS)
        + f" | {s['found']['shipped'] / max(s['queries'], 1):.0f} |"
        for s in report["steps"]
    ]
    source_rows = [
        f"| {s['size']} | {v.split('/')[1]} | {v.split('/')[2]} | {s['median'][v]:.2f} | {s['wall_median'][v]:.2f} |"
        for s in report["steps"]
        if "wall_median" in s
        for v in SOURCE_VARIANTS
    ]
    stream_rows = [
        f"| {s['size']} | {v} | {s['stream'][v]['recalls']} | {s['stream'][v]['cpu_ms']:.2f}"
        f" | {s['stream'][v]['wall_p50_ms']:.2f} |"
        for s in report["steps"]
        if s.get("stream")
        for v in STREAM_VARIANTS
    ]
    stream_lines = (
        [
            f"A stream of the corpus' {STREAM_QUERIES} queries in turn, over and over, at"
            f" {report['stream_rate']:g} recalls a second for {report['stream_seconds']:g} s a variant, through the"
            " tenant's own alias with the default config, from empty caches: `stream/ttl` with `countDrift` 0 (each"
            " term's document frequency counted again once `countTtlMs`, 10 s, is over) and `stream/drift` with its"
            " default (reused while the document count stays within 1%; nothing is written meanwhile). The two"
            " take turns going first from one size to the next.",
            "",
            "| documents | variant | recalls | Typesense CPU ms a recall | wall p50 ms |",
            "|---|---|---|---|---|",
            *stream_rows,
            "",
        ]
        if stream_rows
        else []
    )
    return "\n".join(
        [
            "# Typesense CPU of a bm25 candidate search with and without the tenant clause, by collection size",
            "",
            f"Command: `{command}`  ",
            "The load benchmark's big tenant as Braid's keyword documents in one collection holding that tenant"
            " alone (a tenant's own pair), on an embedded Typesense 0.24.1, grown step by step in one run. At each"
            " size, the corpus' queries as the candidate search of a warm recall (terms chosen rarest first within"
            f" {BUDGET}, per_page {BUDGET}, sort_by length:asc, the source's fields). `shipped`:"
            " `current_key:=<key> && tenant_terms:=[...]`; `terms`: `tenant_terms:=[...]` alone; `/0`: per_page 0"
            f" (the filter and the count only). The variants take turns in each of {report['rounds']} rounds after"
            " a warm-up round. CPU: the Typesense process' user + system time per search, median over rounds, on"
            " the shared 2-core machine (the columns compare; absolute figures drift with the machine).",
            "",
            "| documents | queries | " + " | ".join(f"{v} CPU ms" for v in VARIANTS) + " | candidates a search |",
            "|---|---|" + "---|" * len(VARIANTS) + "---|",
            *rows,
            "",
            "Braid's `typesense` source, a recall of each query (its vectors covered, as in a fused recall),"
            " routed through a group's alias (`group`: the filter names `current_key`) and through the"
            " tenant's own alias (`own`: no tenant clause; each hit's `current_key` checked), with its count"
            " caches warm (one candidate search a recall) or cold (`countTtlMs` 0: each term's document count"
            " and the corpus statistics counted again, as for terms not asked for in the last 10 s). Every"
            " variant returned the same memories for every query (checked). Wall: the recall as the service"
            " awaits it, one at a time. Median over rounds.",
            "",
            "| documents | route | count caches | Typesense CPU ms a recall | wall ms a recall |",
            "|---|---|---|---|---|",
            *source_rows,
            "",
            *stream_lines,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,200000,400000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream-seconds", type=float, default=60.0, help="each stream variant's time (0: none)")
    parser.add_argument("--stream-rate", type=float, default=20.0, help="the streams' recalls a second")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if min(sizes) < 1 or args.queries < 1 or args.rounds < 1:
        parser.error("--sizes, --queries and --rounds: 1 or more")
    if args.stream_seconds < 0 or args.stream_rate <= 0:
        parser.error("--stream-seconds: 0 or more; --stream-rate: more than 0")
    command = "python -m benchmarks.typesense_key_clause " + " ".join(sys.argv[1:])
    report = asyncio.run(run(sizes, args.queries, args.rounds, args.stream_seconds, args.stream_rate))
    path = write_results("typesense-key-clause", markdown(report, command.strip()), report)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
