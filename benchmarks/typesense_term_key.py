"""What the width of the tenant's key in ``tenant_terms`` costs a bm25 candidate search.

``python -m benchmarks.typesense_term_key [--size N] [--queries Q] [--rounds R]``
starts an embedded Typesense and writes the load benchmark's corpus
(``benchmarks/load/corpus.py``: the big tenant of ``N`` memories and 50
small tenants of 200) as Braid's keyword documents into one collection per
variant, each memory's terms behind its tenant's key:

* ``key32``: the 32 hex digits of :func:`~indexers.typesense.documents.tenant_key`
  before every term (Braid from 82ec02a);
* ``key8``: its first 8 hex digits;
* ``bare``: the bare terms, without ``tenant_key`` (filtered by
  ``current_key`` as the others, so only the stored document differs);
* ``old``: as Braid sent them before 82ec02a (066721b): the bare terms in
  ``terms``, no keys, filtered by ``tenant:=`` and ``superseded_at:=``.

Typesense reads a hit's stored document whole before it keeps the fields
asked for (``benchmarks/results/typesense-doc-cost.md``), so what the
documents carry is paid per candidate. For ``Q`` of the corpus' queries on
the big tenant, the candidate search a warm recall sends
(``current_key:=<key> && tenant_terms:=[...]``, the terms chosen rarest
first within ``bm25Candidates`` as :func:`~indexers.typesense.bm25.select_terms`
does, ``per_page`` 150, ``sort_by length:asc``, the source's fields) goes
to each collection in turn; ``key8+32`` sends the ``key8`` search with the
``key32`` form of each term added to its list (what a recall sends while
older documents are rewritten). The variants take turns in each round, in
alternating order; the figure is the Typesense process' CPU per search
(median over rounds). Writes ``benchmarks/results/typesense-term-key.{md,json}``
and prints::

    typesense-term-key: docs=<n> key32=<ms> key8=<ms> key8+32=<ms> bare=<ms> old=<ms> ms CPU/search
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec

from benchmarks.common import write_results
from benchmarks.load.corpus import build_corpus
from benchmarks.typesense_import_cost import import_batches, server_process
from deploy.embedded import EmbeddedTypesense
from indexers.base import MemoryRecord
from indexers.typesense.bm25 import select_terms
from indexers.typesense.documents import (
    NEVER,
    collection_schema,
    document_terms,
    quoted_list,
    record_document,
    tenant_key,
)
from indexers.typesense.keywords import keyword_terms
from indexers.typesense.source import _BM25_FIELDS

VARIANTS = ("key32", "key8", "key8+32", "bare", "old")
BUDGET = 150
MAX_TERMS = 16


def _records(size: int) -> list[MemoryRecord]:
    corpus = build_corpus(size, small_tenants=50, small_size=200, relations=10)
    out = []
    for tenant in corpus.tenants:
        for m in tenant.memories:
            out.append(
                MemoryRecord(
                    id=m["id"],
                    tenant=tenant.name,
                    content=m["content"],
                    kind=m.get("kind", "note"),
                    tier=m["tier"],
                    created_at=datetime.fromisoformat(m["created_at"].replace("Z", "+00:00")).astimezone(UTC),
                    confidence=0.9,
                    speaker=m.get("speaker"),
                    session_id=m.get("session_id"),
                )
            )
    return out


def _document(record: MemoryRecord, variant: str) -> dict[str, Any]:
    doc = record_document(record)
    key = doc["tenant_key"]
    terms = document_terms(record.content, record.context)[0]
    if variant == "old":
        for name in ("tenant_key", "current_key", "tenant_terms"):
            del doc[name]
        doc["terms"] = terms
        return doc
    doc["tenant_terms"] = [p + t for p in _prefixes(variant, key) for t in terms]
    if variant == "bare":
        del doc["tenant_key"]
    return doc


def _prefixes(variant: str, key: str) -> list[str]:
    return {"key32": [key], "key8": [key[:8]], "key8+32": [key[:8], key], "bare": [""], "old": [""]}[variant]


async def alternating_rounds(
    c: httpx.AsyncClient, server: Any, sent: dict[str, list[bytes]], rounds: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Each variant's ``multi_search`` bodies (``sent``) in turn, in
    alternating order, ``rounds`` times after a warm-up round: the Typesense
    process' (``server``) CPU ms a search per round, and the documents found
    by each variant's searches in the last round."""
    variants = list(sent)
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    found: dict[str, int] = {}
    for n in range(rounds + 1):  # round 0 warms the collections up
        for variant in variants if n % 2 == 0 else variants[::-1]:
            hits = 0
            before = sum(server.cpu_times()[:2])
            for body in sent[variant]:
                r = await c.post("/multi_search", content=body)
                r.raise_for_status()
                hits += int(r.json()["results"][0]["found"])
            spent = (sum(server.cpu_times()[:2]) - before) / len(sent[variant]) * 1000
            found[variant] = hits
            if n:
                cpu[variant].append(spent)
                print(f"round {n}/{rounds}: {variant} {spent:.3f} ms/search", flush=True)
    return cpu, found


async def run(size: int, queries: int, rounds: int) -> dict[str, Any]:
    records = _records(size)
    corpus = build_corpus(size, small_tenants=0, small_size=0, relations=10)
    texts = [q["text"] for q in corpus.queries[:queries]]
    key = tenant_key("big")
    home = Path(tempfile.mkdtemp(prefix="braid-term-key-"))
    ts = EmbeddedTypesense(home / "typesense")
    url = ts.start()
    enc = msgspec.json.Encoder()
    sizes: dict[str, float] = {}
    try:
        server = server_process(home)
        async with httpx.AsyncClient(base_url=url, headers={"X-TYPESENSE-API-KEY": ts.api_key}, timeout=600) as c:
            for stored in ("key32", "key8", "bare", "old"):
                schema = collection_schema(stored)
                if stored == "old":  # an older Braid's field for the bare terms
                    schema["fields"].append({"name": "terms", "type": "string[]", "optional": True})
                (await c.post("/collections", json=schema)).raise_for_status()
                docs = [_document(r, stored) for r in records]
                sizes[stored] = statistics.mean(len(enc.encode(d)) for d in docs)
                await import_batches(c, stored, docs, 500)
                print(f"imported {len(docs)} documents as {stored} ({sizes[stored]:.0f} bytes each)", flush=True)

            async def count(collection: str, prefixes: list[str], terms: list[str]) -> int:
                keyed = [p + t for p in prefixes for t in terms]
                params = {
                    "q": "*",
                    "per_page": 0,
                    "filter_by": f"current_key:={key} && tenant_terms:={quoted_list(keyed)}",
                }
                r = await c.get(f"/collections/{collection}/documents/search", params=params)
                r.raise_for_status()
                return int(r.json()["found"])

            # Each query's terms chosen as a warm recall's (rarest first within the budget).
            chosen: list[list[str]] = []
            for text in texts:
                terms = keyword_terms(text, MAX_TERMS)
                if not terms:
                    continue
                dfs = {t: await count("key32", [key], [t]) for t in terms}
                chosen.append(select_terms(terms, dfs, BUDGET))

            def bodies(variant: str) -> list[bytes]:
                collection = "key8" if variant == "key8+32" else variant
                out = []
                for terms in chosen:
                    keyed = [p + t for p in _prefixes(variant, key) for t in terms]
                    if variant == "old":
                        filter_by = f"tenant:=`big` && superseded_at:={NEVER} && terms:={quoted_list(terms)}"
                    else:
                        filter_by = f"current_key:={key} && tenant_terms:={quoted_list(keyed)}"
                    search = {
                        "collection": collection,
                        "q": "*",
                        "filter_by": filter_by,
                        "per_page": BUDGET,
                        "sort_by": "length:asc",
                        "include_fields": _BM25_FIELDS,
                    }
                    out.append(enc.encode({"searches": [search]}))
                return out

            cpu, found = await alternating_rounds(c, server, {v: bodies(v) for v in VARIANTS}, rounds)
    finally:
        ts.stop()
    return {
        "docs": len(records),
        "size": size,
        "queries": len(chosen),
        "rounds": rounds,
        "bytes_per_doc": sizes,
        "found": found,
        "cpu_ms_per_search": cpu,
        "median": {v: statistics.median(cpu[v]) for v in VARIANTS},
    }


def markdown(report: dict[str, Any], command: str) -> str:
    med = report["median"]
    stored = {"key32": "key32", "key8": "key8", "key8+32": "key8", "bare": "bare", "old": "old"}
    labels = {
        "key32": "32 hex digits of the key before each term (82ec02a to now)",
        "key8": "its first 8 hex digits",
        "key8+32": "8-digit documents, both forms of each term in the filter",
        "bare": "bare terms in `tenant_terms`, no `tenant_key` (filtered on current_key)",
        "old": "as 066721b sent them (bare `terms`, no keys), with its filter (`tenant:=` and `superseded_at:=`)",
    }
    rows = [
        f"| {labels[v]} | {report['bytes_per_doc'][stored[v]]:.0f} | {med[v]:.3f} |"
        f" {', '.join(f'{x:.3f}' for x in report['cpu_ms_per_search'][v])} | {report['found'][v]} |"
        for v in VARIANTS
    ]
    return "\n".join(
        [
            "# Typesense CPU of a bm25 candidate search by the width of the key in `tenant_terms`",
            "",
            f"Command: `{command}`  ",
            f"The load benchmark's corpus (big tenant of {report['size']} memories, 50 tenants x 200;"
            f" {report['docs']} documents) as Braid's keyword documents, one collection per stored form, on an"
            f" embedded Typesense 0.24.1. {report['queries']} of the corpus' queries on the big tenant, each as the"
            f" candidate search of a warm recall (terms chosen rarest first within {BUDGET}, per_page {BUDGET},"
            " sort_by length:asc, the source's fields); the variants take turns in each of"
            f" {report['rounds']} rounds after a warm-up round. CPU: the Typesense process' user + system time"
            " per search, on the shared 2-core machine (the rows compare; absolute figures drift with the load).",
            "",
            "| documents / filter | bytes a document (JSON) | CPU ms a search (median) | each round | found (sum) |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.size < 1 or args.queries < 1 or args.rounds < 1:
        parser.error("--size, --queries and --rounds: 1 or more")
    command = "python -m benchmarks.typesense_term_key " + " ".join(sys.argv[1:])
    report = asyncio.run(run(args.size, args.queries, args.rounds))
    path = write_results("typesense-term-key", markdown(report, command.strip()), report)
    print(f"wrote {path}")
    med = report["median"]
    print(
        f"typesense-term-key: docs={report['docs']} "
        + " ".join(f"{v}={med[v]:.3f}" for v in VARIANTS)
        + " ms CPU/search"
    )


if __name__ == "__main__":
    main()
