"""The service CPU a recall cannot go under in this stack: a lean app's floor beside Braid's fused recall.

``python -m benchmarks.service_floor [--size N] [--seconds S] [--clients C] [--name X]``
loads the load benchmark's corpus (big tenant of ``N`` memories, then the
``placement`` job) into Braid on the embedded stack, then starts a second
app beside it, in a process of its own, built from the parts Braid's
service is built from and nothing else: Litestar under embedded Granian on
uvloop with the heap frozen after start-up (as ``python -m service``),
msgspec for the request and the answer, Braid's own Typesense client
(:class:`indexers.typesense.TypesenseClient`, its lean transport) and a
psycopg pool made as Braid's (``indexers.postgres.pool``). Its routes do
progressively more of what any recall of the same request has to do:

* ``http``: take the request (query text and a 384-d vector), check the
  bearer key, answer an empty block;
* ``typesense``: and one ``multi_search`` holding one keyword search (the
  query text over content and context, 150 hits, as Braid's candidate page
  and the load benchmark's direct baseline), its answer parsed, the best 10
  formatted into the block;
* ``pgvector``: and, instead, one prepared HNSW query of the tier (10 rows
  with their content), on a pooled connection;
* ``both``: the two at once (an anyio task group), fused by
  :func:`fusion.rrf` (k 60) and the best 10 formatted.

Each route, Braid's fused recall (vectors supplied, the same queries) and
Braid's recall restricted to each of its sources (``sources``) run closed loop from ``C`` clients for ``S`` seconds, the stack left to go
idle before each; CPU per request by process (the load benchmark's meter; the
serving process, Braid's or the lean app's, is ``service``). Report:
``benchmarks/results/service-floor[-<name>].{md,json}``. Last line:
``service-floor: size=<n> http_ms=<x> both_ms=<x> braid_ms=<x>`` (the
serving process' CPU per request).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psutil

from benchmarks.common import CpuMeter, wait_healthy, write_results
from benchmarks.load.client import LeanClient
from benchmarks.load.corpus import BIG_TENANT, build_corpus
from benchmarks.load.run import _closed_loop, loaded_service, quiet, search_aliases
from deploy.embedded import free_port

ROUTES = ("http", "typesense", "pgvector", "both")

#: Braid's sources, each also recalled alone.
BRAID_SOURCES = ("typesense", "pgvector", "graph")

#: Hits of the keyword search: Braid's candidate page (``sources.typesense.bm25Candidates``).
PAGE = 150


class RecallIn(msgspec.Struct, forbid_unknown_fields=True):
    query: str
    embedding: list[float]
    top_k: int = 10


class Item(msgspec.Struct):
    id: str
    score: float


class RecallOut(msgspec.Struct):
    block: str
    items: list[Item]


def _block(rows: list[tuple[str, str, float]]) -> RecallOut:
    """Braid's block shape (header, content, confidence) for ``rows`` (id, content, score)."""
    parts = [f"[Memory: memory | {i}]\n{content}\nconfidence: 1.0" for i, content, _ in rows]
    return RecallOut(block="\n\n".join(parts), items=[Item(id=i, score=s) for i, _, s in rows])


def serve(port: int, dsn: str, ts_url: str, ts_key: str, keyword: str, key: str, tier: str, ef: int) -> None:
    """The lean app, until SIGINT or SIGTERM."""
    import gc

    import anyio
    import numpy as np
    import uvloop
    from granian.constants import Interfaces
    from granian.server.embed import Server
    from litestar import Litestar, Request, get, post
    from litestar.exceptions import NotAuthorizedException
    from psycopg import sql
    from psycopg_pool import AsyncConnectionPool

    from fusion import rrf
    from indexers.postgres.pool import _configure
    from indexers.typesense import TypesenseClient

    bearer = f"Bearer {key}"
    state: dict[str, Any] = {}
    statement = sql.SQL(
        "SELECT id, content FROM memories WHERE tenant = %s AND tier = {tier} ORDER BY embedding <=> %s LIMIT 10"
    ).format(tier=sql.Literal(tier))
    shared = keyword == "braid_memories"

    async def configure(conn: Any) -> None:
        await _configure(conn)
        await conn.execute(f"SET hnsw.ef_search = {int(ef)}")
        await conn.execute("SET hnsw.iterative_scan = relaxed_order")
        await conn.execute("SET plan_cache_mode = force_custom_plan")

    def check(request: Request[Any, Any, Any]) -> None:
        if request.headers.get("authorization") != bearer:
            raise NotAuthorizedException("bad key")

    async def typesense(data: RecallIn) -> list[tuple[str, str]]:
        search: dict[str, Any] = {
            "collection": keyword,
            "q": data.query,
            "query_by": "content,context",
            "per_page": PAGE,
            "highlight_fields": "none",
            "include_fields": "memory_id,content",
        }
        if shared:
            search["filter_by"] = f"tenant:=`{BIG_TENANT}`"
        (answer,) = await state["ts"].multi_search([search])
        return [(h["document"]["memory_id"], h["document"]["content"]) for h in answer.get("hits", [])]

    async def pgvector(data: RecallIn) -> list[tuple[str, str]]:
        async with state["pool"].connection() as conn:
            cur = await conn.execute(
                statement, (BIG_TENANT, np.asarray(data.embedding, dtype=np.float32)), prepare=True
            )
            return [(r[0], r[1]) for r in await cur.fetchall()]

    def best(lists: dict[str, list[tuple[str, str]]], top_k: int) -> RecallOut:
        content = {i: c for hits in lists.values() for i, c in hits}
        fused = rrf({name: [i for i, _ in hits] for name, hits in lists.items()}, k=60)
        return _block([(f.id, content[f.id], f.score) for f in fused[:top_k]])

    @get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    @post("/floor/http", status_code=200)
    async def http_route(request: Request[Any, Any, Any], data: RecallIn) -> RecallOut:
        check(request)
        return RecallOut(block="", items=[])

    @post("/floor/typesense", status_code=200)
    async def typesense_route(request: Request[Any, Any, Any], data: RecallIn) -> RecallOut:
        check(request)
        return best({"typesense": await typesense(data)}, data.top_k)

    @post("/floor/pgvector", status_code=200)
    async def pgvector_route(request: Request[Any, Any, Any], data: RecallIn) -> RecallOut:
        check(request)
        return best({"pgvector": await pgvector(data)}, data.top_k)

    @post("/floor/both", status_code=200)
    async def both_route(request: Request[Any, Any, Any], data: RecallIn) -> RecallOut:
        check(request)
        lists: dict[str, list[tuple[str, str]]] = {}

        async def one(name: str, search: Any) -> None:
            lists[name] = await search(data)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "typesense", typesense)
            tg.start_soon(one, "pgvector", pgvector)
        return best({n: lists[n] for n in ("typesense", "pgvector")}, data.top_k)

    async def lifespan_start() -> None:
        state["ts"] = TypesenseClient([ts_url], ts_key)
        pool = AsyncConnectionPool(
            dsn, min_size=4, max_size=16, open=False, configure=configure, kwargs={"autocommit": True}
        )
        await pool.open(wait=True, timeout=30)
        state["pool"] = pool
        gc.collect()
        gc.freeze()

    async def lifespan_stop() -> None:
        await state["ts"].aclose()
        await state["pool"].close()

    app = Litestar(
        route_handlers=[health, http_route, typesense_route, pgvector_route, both_route],
        on_startup=[lifespan_start],
        on_shutdown=[lifespan_stop],
        openapi_config=None,
    )

    async def main() -> None:
        server = Server(app, address="127.0.0.1", port=port, interface=Interfaces.ASGI, log_access=False)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, server.stop)
        await server.serve()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


async def measure(size: int, seconds: float, clients: int) -> dict[str, Any]:
    corpus = build_corpus(size)
    base = [
        {"query": q["text"], "embedding": v.tolist()} for q, v in zip(corpus.queries, corpus.query_vectors, strict=True)
    ]
    bodies = [msgspec.json.encode(b) for b in base]
    #: Braid's recall restricted to each source in turn: what each adds over the rest.
    alone = {s: [msgspec.json.encode({**b, "sources": [s]}) for b in base] for s in BRAID_SOURCES}
    rows: list[dict[str, Any]] = []
    async with loaded_service(corpus, "braid-floor-") as (svc, headers):
        dsn = svc.postgres_dsn()
        ts_url = f"http://127.0.0.1:{svc.typesense_port()}"
        async with httpx.AsyncClient(base_url=ts_url, headers={"X-TYPESENSE-API-KEY": svc.ts_key}) as ts:
            keyword, _ = await search_aliases(ts, dsn, BIG_TENANT)
        port = free_port()
        key = "floor-key"
        lean = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.service_floor",
                "--serve",
                str(port),
                dsn,
                ts_url,
                svc.ts_key,
                keyword,
                key,
                "session",
                "48",
            ],
            cwd=Path(__file__).resolve().parent.parent,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, lean, 60, lambda: "")
            lean_proc = psutil.Process(lean.pid)

            def lean_processes() -> dict[str, list[psutil.Process]]:
                found = svc.processes()
                return {**found, "service": [lean_proc]}

            braid_hdrs = headers[BIG_TENANT]
            lean_hdrs = {"Authorization": f"Bearer {key}"}
            plan = [
                ("braid fused recall", svc.url, "/v1/recall", braid_hdrs, svc.processes, bodies),
                *(
                    (f"braid: {s} alone", svc.url, "/v1/recall", braid_hdrs, svc.processes, alone[s])
                    for s in BRAID_SOURCES
                ),
                *((f"lean: {r}", url, f"/floor/{r}", lean_hdrs, lean_processes, bodies) for r in ROUTES),
            ]
            for label, target, path, hdrs, procs, sent in plan:
                meter = CpuMeter(procs)
                async with LeanClient(target, max_connections=64) as client:

                    async def call(
                        w: int, i: int, client: LeanClient = client, path: str = path, hdrs: dict[str, str] = hdrs
                    ) -> None:
                        status, raw = await client.post(path, sent[i], hdrs)
                        if status != 200:
                            raise AssertionError(f"{path} answered {status}: {raw[:300]!r}")

                    # Warm: pools, prepared statements, caches.
                    for i in range(50):
                        await call(0, i)
                    waited = await quiet(meter)
                    res = await _closed_loop(call, len(bodies), clients, seconds, meter)
                rows.append({"row": label, "quiet_before": waited, **res})
                print(
                    f"floor: {label}: p50 {res['p50']:.1f} ms, {res['qps']:.0f}/s, CPU ms "
                    + ", ".join(f"{k} {v:.2f}" for k, v in res["cpu_ms"].items()),
                    flush=True,
                )
        finally:
            lean.send_signal(signal.SIGINT)
            try:
                lean.wait(30)
            except subprocess.TimeoutExpired:
                lean.kill()
    return {"size": size, "seconds": seconds, "clients": clients, "rows": rows}


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        "# The service CPU a recall cannot go under: a lean app beside Braid",
        "",
        f"Command: `{command}`  ",
        f"Corpus: the load benchmark's, big tenant of {report['size']} memories (placement job run); "
        f"each row {report['clients']} clients, closed loop, {report['seconds']:.0f} s, over the corpus' 500 "
        "queries (text + 384-d vector supplied), after the stack went idle. The lean app is Litestar under "
        "embedded Granian on uvloop, heap frozen, msgspec, Braid's Typesense client and a psycopg pool "
        "made as Braid's (`benchmarks/service_floor.py` says what each route does); `service` is the "
        "process serving the row (Braid's, or the lean app's). `braid: <source> alone` is Braid's recall "
        "restricted to that source (`sources`).",
        "",
        "| row | n | p50 ms | p99 ms | requests/s | CPU ms per request: service | postgres | typesense | client |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        cpu = r["cpu_ms"]
        lines.append(
            f"| {r['row']} | {r['n']} | {r['p50']:.1f} | {r['p99']:.1f} | {r['qps']:.0f} | "
            f"**{cpu.get('service', 0):.2f}** | {cpu.get('postgres', 0):.2f} | {cpu.get('typesense', 0):.2f} | "
            f"{cpu.get('client', 0):.2f} |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        port, dsn, ts_url, ts_key, keyword, key, tier, ef = sys.argv[2:10]
        serve(int(port), dsn, ts_url, ts_key, keyword, key, tier, int(ef))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    report = asyncio.run(measure(args.size, args.seconds, args.clients))
    command = "python -m benchmarks.service_floor " + " ".join(sys.argv[1:])
    name = "service-floor" + (f"-{args.name}" if args.name else "")
    print(f"wrote {write_results(name, markdown(report, command), report)}")
    by = {r["row"]: r["cpu_ms"].get("service", 0.0) for r in report["rows"]}
    print(
        f"service-floor: size={args.size} http_ms={by['lean: http']:.2f} both_ms={by['lean: both']:.2f} "
        f"braid_ms={by['braid fused recall']:.2f}"
    )


if __name__ == "__main__":
    main()
