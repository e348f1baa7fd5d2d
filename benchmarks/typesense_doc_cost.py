"""What a stored embedding costs a bm25 candidate search: ``python -m benchmarks.typesense_doc_cost``.

Loads the load benchmark's corpus (big tenant of 10,000 memories) through
the service, copies the big tenant's Typesense documents into a scratch
collection without the ``embedding`` field, then sends the ``bm25`` mode's
candidate search (``tenant_terms:=[...]`` filter, the terms behind the tenant's key, ``sort_by length:asc``, the
fields the source asks for) for 300 queries to each collection, at 100 and
250 candidates, twice in turn, and prints the Typesense process's CPU per
search. Typesense reads each hit's stored document whole before it keeps
the asked fields, so the 384 floats are read for every candidate.

It measured the Braid that kept embeddings in its keyword documents
(``benchmarks/results/typesense-doc-cost.md``). Since ``typesense.vectors``
they live in a vectors collection, so on this Braid both collections it
compares hold documents without them; ``benchmarks.typesense_split``
compares the layouts.
"""

import asyncio
import json

import httpx
import msgspec

from benchmarks.load.corpus import BIG_TENANT, build_corpus
from benchmarks.load.run import loaded_service
from indexers.typesense.documents import keyed_terms, quoted_list, tenant_key
from indexers.typesense.keywords import keyword_terms
from indexers.typesense.source import _BM25_FIELDS


async def main(size: int) -> None:
    corpus = build_corpus(size)
    async with loaded_service(corpus, "braid-tsnoemb-", graph=False) as (svc, _):
        tsproc = svc.processes()["typesense"]

        def cpu():
            return sum(p.cpu_times().user + p.cpu_times().system for p in tsproc)

        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{svc.typesense_port()}",
            headers={"X-TYPESENSE-API-KEY": svc.ts_key},
            timeout=600,
        ) as ts:
            alias = (await ts.get("/aliases/braid_memories")).json()["collection_name"]
            schema = (await ts.get(f"/collections/{alias}")).json()
            fields = [
                {k: v for k, v in f.items() if k in ("name", "type", "facet", "optional", "index", "sort", "num_dim")}
                for f in schema["fields"]
                if f["name"] != "embedding"
            ]
            r = await ts.post("/collections", json={"name": "noemb", "fields": fields})
            r.raise_for_status()
            exported = (
                await ts.get(f"/collections/{alias}/documents/export", params={"filter_by": f"tenant:=`{BIG_TENANT}`"})
            ).text.splitlines()
            docs = [json.loads(line) for line in exported]
            for d in docs:
                d.pop("embedding", None)
            body = "\n".join(json.dumps(d) for d in docs)
            r = await ts.post("/collections/noemb/documents/import?action=upsert", content=body.encode())
            r.raise_for_status()
            print("docs", len(docs), flush=True)
            qs = corpus.queries[:300]
            key = tenant_key(BIG_TENANT)
            for coll in (alias, "noemb", alias, "noemb"):
                for n in (100, 250):

                    def body_for(q):
                        t = keyword_terms(q["text"], 16)
                        return msgspec.json.encode(
                            {
                                "searches": [
                                    {
                                        "collection": coll,
                                        "q": "*",
                                        "filter_by": f"tenant_terms:={quoted_list(keyed_terms(key, t))}",
                                        "per_page": n,
                                        "sort_by": "length:asc",
                                        "include_fields": _BM25_FIELDS,
                                    }
                                ]
                            }
                        )

                    for q in qs[:20]:
                        await ts.post("/multi_search", content=body_for(q))
                    c0 = cpu()
                    for q in qs:
                        r = await ts.post("/multi_search", content=body_for(q))
                        r.raise_for_status()
                    print(
                        f"{coll:30s} per_page {n}: typesense cpu {1000 * (cpu() - c0) / len(qs):.2f} ms/search",
                        flush=True,
                    )


if __name__ == "__main__":
    asyncio.run(main(10000))
