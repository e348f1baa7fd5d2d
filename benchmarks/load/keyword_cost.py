"""Where the Typesense source's keyword searches spend Typesense's CPU, on a
load run's live stack, its client paused.

    python -m benchmarks.load.keyword_cost /tmp/braid-load-XXXX

Pause the load first (``kill -STOP <its pid>``, best once it prints
``load: hnsw``: nothing after that is timed) and resume it afterwards. This
runs the big tenant's keyword source (the ``bm25`` mode, Braid's own
:class:`~indexers.typesense.source.TypesenseSource` with the run's config,
searching the tenant's own pair once the placement job gave it one), one
recall at a time, for ``--queries`` of the load corpus' query texts: first
with cold caches, then again warm. Then it sends the warm recalls' candidate
searches alone in variants (as sent; without the sort; a page of 10; the
memory id alone), the filter's stats (the facet over the lengths), the
filter's count, a term's count, and the query text as a direct keyword
search. Per phase: Typesense's CPU per recall or search (psutil), the
client's wall time, and per role of search the ``search_time_ms`` Typesense
reports. Writes ``benchmarks/results/keyword-cost-<memories>.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import CpuMeter, Service, write_results
from config.loader import parse_config
from indexers.base import Filters, SearchQuery
from indexers.typesense.client import TypesenseClient
from indexers.typesense.source import TypesenseSource

from .corpus import BIG_TENANT, build_corpus
from .probe import attach
from .run import KEYWORD_ALIAS, search_aliases

__all__ = ["Recorder", "measure", "role_of", "typesense_cpu_ms"]


def typesense_cpu_ms(svc: Service) -> Callable[[], float]:
    """The stack's Typesense CPU so far, in ms, read by the load benchmark's meter."""
    meter = CpuMeter(svc.processes)
    return lambda: meter()["typesense"] * 1000.0


def role_of(search: Mapping[str, Any]) -> str:
    """What a bm25 search is for: ``stats`` (the facet over the lengths),
    ``count`` (a term's document frequency: no page) or ``candidates``."""
    if "facet_by" in search:
        return "stats"
    return "count" if search.get("per_page") == 0 else "candidates"


class Recorder:
    """Wraps ``client.multi_search``: each call's searches and answers."""

    def __init__(self, client: TypesenseClient) -> None:
        self.calls: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
        self._inner = client.multi_search
        client.multi_search = self  # type: ignore[method-assign]

    async def __call__(self, searches: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        answers = await self._inner(searches)
        self.calls.append(([dict(s) for s in searches], answers))
        return answers


def _roles(calls: Sequence[tuple[list[dict[str, Any]], list[dict[str, Any]]]], recalls: int) -> dict[str, Any]:
    by_role: dict[str, list[tuple[float, int]]] = {}
    for searches, answers in calls:
        for search, answer in zip(searches, answers, strict=True):
            by_role.setdefault(role_of(search), []).append(
                (float(answer.get("search_time_ms", 0)), int(answer.get("found", 0)))
            )
    return {
        role: {
            "searches": len(v),
            "search_ms_p50": statistics.median(ms for ms, _ in v),
            "search_ms_per_recall": sum(ms for ms, _ in v) / recalls,
            "found_p50": statistics.median(found for _, found in v),
        }
        for role, v in by_role.items()
    }


async def measure(home: Path, queries: int) -> dict[str, Any]:
    svc = attach(home)
    cfg = parse_config((home / "braid.yaml").read_text())
    cpu_ms = typesense_cpu_ms(svc)
    url = f"http://127.0.0.1:{svc.typesense_port()}"
    async with httpx.AsyncClient(base_url=url, headers={"X-TYPESENSE-API-KEY": svc.ts_key}) as ts:
        own, _ = await search_aliases(ts, svc.postgres_dsn(), BIG_TENANT)
        count = (await ts.get(f"/collections/{own}")).json().get("num_documents")
    # The queries' vocabulary is the corpus' (drawn before its memories), whatever its size.
    texts = [q["text"] for q in build_corpus(3000, seed=7).queries][:queries]
    report: dict[str, Any] = {
        "alias": own,
        "documents": count,
        "queries": len(texts),
        "vectors": cfg.typesense.vectors,
        "phases": {},
    }
    client = TypesenseClient([url], svc.ts_key, timeout=60.0)
    try:
        source = TypesenseSource(client, KEYWORD_ALIAS, lambda: cfg, route=lambda _: (client, own))
        recorder = Recorder(client)

        def query(text: str) -> SearchQuery:
            return SearchQuery(tenant=BIG_TENANT, text=text, vector=None, limit=10, filters=Filters())

        async def timed(name: str, n: int, run: Callable[[], Awaitable[None]]) -> dict[str, Any]:
            recorder.calls.clear()
            cpu, start = cpu_ms(), time.perf_counter()
            await run()
            row = {
                "n": n,
                "typesense_cpu_ms": (cpu_ms() - cpu) / n,
                "wall_ms": (time.perf_counter() - start) * 1000.0 / n,
                "multi_searches": len(recorder.calls),
                "roles": _roles(recorder.calls, n),
            }
            report["phases"][name] = row
            print(f"keyword_cost: {name}: {row['typesense_cpu_ms']:.1f} ms Typesense CPU each", flush=True)
            return row

        async def recalls() -> None:
            for text in texts:
                await source.search(query(text))

        await timed("recall, cold caches", len(texts), recalls)
        await timed("recall, warm caches", len(texts), recalls)
        candidates = [s for searches, _ in recorder.calls for s in searches if role_of(s) == "candidates"]
        variants: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "candidate search as sent": lambda s: s,
            "candidate search, no sort_by": lambda s: {k: v for k, v in s.items() if k != "sort_by"},
            "candidate search, per_page 10": lambda s: {**s, "per_page": 10},
            "candidate search, memory_id only": lambda s: {**s, "include_fields": "memory_id"},
            "candidate filter's count (per_page 0)": lambda s: {**s, "per_page": 0},
            "stats: facet over the lengths": lambda s: {
                "collection": s["collection"],
                "q": "*",
                "per_page": 0,
                "facet_by": "length,context_length",
                "max_facet_values": 1,
            },
            "count of every document": lambda s: {"collection": s["collection"], "q": "*", "per_page": 0},
        }
        for name, variant in variants.items():

            async def sent(variant: Callable[[dict[str, Any]], dict[str, Any]] = variant) -> None:
                for search in candidates:
                    await client.multi_search([variant(dict(search))])

            await timed(name, len(candidates), sent)

        async def direct() -> None:
            for text in texts:
                await client.multi_search(
                    [
                        {
                            "collection": own,
                            "q": text,
                            "query_by": "content,context",
                            "per_page": 150,
                            "include_fields": "memory_id",
                            "highlight_fields": "none",
                        }
                    ]
                )

        await timed("direct keyword search (q = the text, 150 hits)", len(texts), direct)
    finally:
        await client.aclose()
    return report


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        f"# Where the keyword source's Typesense CPU goes: {report['documents']} documents in one pair",
        "",
        f"Command: `{command}` on a load run's live stack, its client paused (`kill -STOP`) once it"
        " printed `load: hnsw`. One search or recall at a time; 2 shared cores.  ",
        f"Collection: `{report['alias']}` (the big tenant's own pair), {report['documents']} documents;"
        f" {report['queries']} of the load corpus' query texts, `bm25` keyword mode, the run's config."
        f" A recall here is the Typesense source's keyword part alone (no vector is sent; the run's"
        f" `typesense.vectors`: {report.get('vectors', 'not recorded')}).",
        "",
        "| phase | n | Typesense CPU ms each | wall ms each | multi_searches"
        " | per role: searches, search_time_ms p50, summed per recall, found p50 |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in report["phases"].items():
        roles = "; ".join(
            f"{role}: {r['searches']}, {r['search_ms_p50']:.1f}, {r['search_ms_per_recall']:.1f}, {r['found_p50']:.0f}"
            for role, r in row["roles"].items()
        )
        lines.append(
            f"| {name} | {row['n']} | {row['typesense_cpu_ms']:.2f} | {row['wall_ms']:.2f}"
            f" | {row['multi_searches']} | {roles} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load.keyword_cost", description=__doc__)
    parser.add_argument("home", type=Path, help="the load run's home (/tmp/braid-load-*)")
    parser.add_argument("--queries", type=int, default=120)
    parser.add_argument("--name", default=None, help="report as keyword-cost-<name> (default: the documents)")
    args = parser.parse_args()
    report = asyncio.run(measure(args.home, args.queries))
    command = f"python -m benchmarks.load.keyword_cost <home> --queries {args.queries}"
    path = write_results(f"keyword-cost-{args.name or report['documents']}", markdown(report, command), report)
    print(f"keyword_cost: report at {path}", flush=True)


if __name__ == "__main__":
    main()
