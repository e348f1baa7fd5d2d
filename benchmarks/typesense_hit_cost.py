"""What Typesense's CPU in a fused recall pays for: the bm25 candidate search, by its parts.

``python -m benchmarks.typesense_hit_cost [--size N] [--queries Q] [--name NAME]``
writes the load benchmark's corpus (``benchmarks/load/corpus.py``, big
tenant of ``N`` memories) through the service on the embedded stack, then
calls the ``typesense`` source in process, as a fused recall does (keyword
list only: pgvector covers the vectors), for ``Q`` of the corpus' queries
on the big tenant, recording the ``multi_search`` bodies it sends. Those
bodies are then sent again to Typesense as they were and with one change
to each candidate search (fewer fields, smaller pages, no sort,
highlighting off; the count searches a cold cache adds are sent as they
were), and the
Typesense process' CPU is read around each pass (psutil). Report:
``benchmarks/results/typesense-hit-cost[-<name>].{md,json}``. Last line:
``typesense-hit-cost: size=<n> source_ms=<x> as_sent_ms=<x> per_page0_ms=<x> ms_per_hit=<x>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

from benchmarks.common import RESULTS
from benchmarks.load.corpus import BIG_TENANT, build_corpus, describe
from benchmarks.load.run import loaded_service
from config import load_config
from config.loader import DEFAULT_CONFIG_PATH
from indexers.base import SearchQuery
from indexers.typesense import source as typesense_source
from indexers.typesense.client import TypesenseClient

Change = Callable[[dict[str, Any]], dict[str, Any]]

#: What the bm25 ranking and the checks on the hits read of a candidate (its
#: tier, confidence, age and expiry, the counts and lengths): a candidate
#: search whose hits would show what Postgres holds could ask for these only.
RANK_FIELDS = "memory_id,tier,confidence,created_at,importance,expires_at,term_counts,length,context_length"

#: Each pass: a label and the change made to every search sent.
PASSES: list[tuple[str, Change]] = [
    ("as sent", lambda s: s),
    ("include_fields: memory_id only", lambda s: {**s, "include_fields": "memory_id"}),
    (
        "include_fields: what ranking reads (a fused recall's, the hits read from Postgres)",
        lambda s: {**s, "include_fields": RANK_FIELDS},
    ),
    ("per_page 100", lambda s: {**s, "per_page": 100}),
    ("per_page 50", lambda s: {**s, "per_page": 50}),
    ("per_page 0 (the filter and count only)", lambda s: {**s, "per_page": 0}),
    ("no sort_by", lambda s: {k: v for k, v in s.items() if k != "sort_by"}),
    (
        "highlight_fields none, enable_highlight_v1 false",
        lambda s: {**s, "highlight_fields": "none", "enable_highlight_v1": False},
    ),
    ("as sent, again", lambda s: s),
]


async def measure(size: int, queries: int) -> dict[str, Any]:
    corpus = build_corpus(size)
    report: dict[str, Any] = {"size": size, "queries": queries, "corpus": describe(corpus), "passes": []}
    print("typesense-hit-cost: loading", flush=True)
    async with loaded_service(corpus, "braid-ts-hit-cost-") as (svc, _):
        procs = svc.processes()["typesense"]

        def cpu() -> float:
            return sum(p.cpu_times().user + p.cpu_times().system for p in procs)

        cfg = load_config(DEFAULT_CONFIG_PATH)
        client = TypesenseClient([f"http://127.0.0.1:{svc.typesense_port()}"], svc.ts_key)
        sent: list[list[dict[str, Any]]] = []
        multi_search = client.multi_search

        async def recording(searches: list[dict[str, Any]]) -> list[dict[str, Any]]:
            sent.append(searches)
            return await multi_search(searches)

        client.multi_search = recording  # type: ignore[method-assign]
        source = typesense_source.TypesenseSource(client, cfg.typesense.collection, lambda: cfg)
        texts = [q["text"] for q in corpus.queries][:queries]

        def query(text: str) -> SearchQuery:
            return SearchQuery(
                tenant=BIG_TENANT,
                text=text,
                vector=None,
                limit=cfg.source("typesense").candidates,
                vectors_covered=True,
                matches=frozenset({"keyword"}),
            )

        try:
            print("typesense-hit-cost: the source, warm-up then measured", flush=True)
            for text in texts:
                await source.search(query(text))
            sent.clear()
            before, start = cpu(), time.perf_counter()
            for text in texts:
                await source.search(query(text))
            report["source"] = {
                "typesense_cpu_ms": 1000 * (cpu() - before) / len(texts),
                "wall_ms": 1000 * (time.perf_counter() - start) / len(texts),
                "searches_per_recall": sum(len(b) for b in sent) / len(texts),
            }
            bodies = list(sent)
            report["example"] = bodies[0]
            for label, change in PASSES:
                # The candidate searches only: a count search asks for no page.
                changed = [[change(dict(s)) if s.get("per_page") else s for s in body] for body in bodies]
                for body in changed[:20]:
                    await multi_search(body)
                found = hits = 0
                before = cpu()
                for body in changed:
                    for search, answer in zip(body, await multi_search(body), strict=True):
                        if "sort_by" in search or search.get("per_page"):  # a candidate search
                            found += answer.get("found", 0)
                            hits += len(answer.get("hits", []))
                row = {
                    "pass": label,
                    "typesense_cpu_ms": 1000 * (cpu() - before) / len(changed),
                    "found": found / len(changed),
                    "hits": hits / len(changed),
                }
                report["passes"].append(row)
                print(f"typesense-hit-cost: {row}", flush=True)
        finally:
            await client.aclose()
    return report


def _per_hit(report: dict[str, Any]) -> float:
    """Typesense CPU per returned hit: the as-sent passes against the page-0 pass."""
    rows = {r["pass"]: r for r in report["passes"]}
    sent = [r for r in report["passes"] if r["pass"].startswith("as sent")]
    full = sum(r["typesense_cpu_ms"] for r in sent) / len(sent)
    hits = sum(r["hits"] for r in sent) / len(sent)
    empty = rows["per_page 0 (the filter and count only)"]["typesense_cpu_ms"]
    return (full - empty) / hits if hits else float("nan")


def markdown(report: dict[str, Any], command: str) -> str:
    src = report["source"]
    lines = [
        "# What the bm25 candidate search costs Typesense, by its parts",
        "",
        f"Command: `{command}`  ",
        f"Corpus: {report['corpus']}  ",
        f"The `typesense` source called in process as in a fused recall (keyword list only), "
        f"{report['queries']} queries on the big tenant, after one warm-up pass over them: Typesense "
        f"{src['typesense_cpu_ms']:.2f} ms of CPU a recall, {src['searches_per_recall']:.2f} searches a recall, "
        f"{src['wall_ms']:.1f} ms a recall (one at a time).",
        "",
        "Its `multi_search` bodies sent again, each pass with one change to every candidate search "
        "(the count searches sent as they were):",
        "",
        "| pass | Typesense CPU ms a multi_search | candidates found | hits returned |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['pass']} | {r['typesense_cpu_ms']:.2f} | {r['found']:.0f} | {r['hits']:.0f} |" for r in report["passes"]
    ]
    lines += [
        "",
        f"Typesense CPU per hit returned (as sent against per_page 0): {_per_hit(report):.3f} ms.",
        "",
        "An example body: `" + msgspec.json.encode(report["example"]).decode() + "`",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(measure(args.size, args.queries))
    out = RESULTS / ("typesense-hit-cost" + (f"-{args.name}" if args.name else "") + ".md")
    out.write_text(markdown(report, "python -m benchmarks.typesense_hit_cost " + " ".join(sys.argv[1:])))
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    rows = {r["pass"]: r for r in report["passes"]}
    print(f"wrote {out}")
    print(
        f"typesense-hit-cost: size={args.size} source_ms={report['source']['typesense_cpu_ms']:.2f} "
        f"as_sent_ms={rows['as sent']['typesense_cpu_ms']:.2f} "
        f"per_page0_ms={rows['per_page 0 (the filter and count only)']['typesense_cpu_ms']:.2f} "
        f"ms_per_hit={_per_hit(report):.3f}"
    )


if __name__ == "__main__":
    main()
