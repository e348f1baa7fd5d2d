"""The load run: bulk load, raw Typesense import, freshness, recall latency, baselines.

One ``python -m service`` on the embedded stack (``Service`` from
``benchmarks.common``) serves every phase; the numbers end up in one
dict that ``report.py`` turns into Markdown, JSON and a plot.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import secrets
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import msgspec
import numpy as np
import psycopg
import yaml
from pgvector.psycopg import register_vector_async
from psycopg import sql

from benchmarks.common import ROOT, CpuMeter, Service, cpu_per_call, cpu_used, pct
from benchmarks.quality.tuning import Override, apply_sets
from config.loader import parse_config
from config.schema import BraidConfig, EmbeddingConfig
from indexers.typesense.client import TypesenseClient
from indexers.typesense.documents import vectors_alias as paired_vectors_alias

from .client import LeanClient, Requester, Spread
from .corpus import BIG_TENANT, Corpus, Tenant
from .hnsw import measure_hnsw
from .report import MODEL_SUPPLIED

__all__ = ["run"]

CONFIG = ROOT / "config" / "braid.yaml"
SOURCES = ("typesense", "pgvector", "graph")
#: Braid's Typesense aliases (the shipped ``typesense.collection`` and its
#: vectors alias; a Braid from before the vectors collection has only the first).
KEYWORD_ALIAS = "braid_memories"
VECTORS_ALIAS = "braid_memories_vectors"


async def vectors_alias(ts: httpx.AsyncClient) -> str:
    """Where the service keeps its vectors: the vectors alias, or the keyword
    alias on a Braid from before the vectors collection (the same run
    measures both)."""
    return VECTORS_ALIAS if (await ts.get(f"/aliases/{VECTORS_ALIAS}")).status_code == 200 else KEYWORD_ALIAS


async def search_aliases(ts: httpx.AsyncClient, dsn: str, tenant: str) -> tuple[str, str]:
    """The keyword and vectors aliases ``tenant``'s searches read: its own
    pair's once the placement job has moved it (``typesense_placements``,
    state ``live``), else Braid's shared ones (:func:`vectors_alias`: the
    keyword alias twice on a Braid from before the vectors collection)."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT alias FROM typesense_placements WHERE tenant = %s AND state = 'live'", (tenant,)
        )
        row = await cur.fetchone()
    shared = await vectors_alias(ts)
    if row is None:
        return KEYWORD_ALIAS, shared
    own: str = row[0]
    return own, own if shared == KEYWORD_ALIAS else paired_vectors_alias(own)


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def config_text(keys: dict[str, str], sets: Sequence[Override] = (), admin: str | None = None) -> str:
    """The shipped config with one agent key per corpus tenant (and ``admin``,
    an admin key of the big tenant), and ``sets`` (dotted key, value) over it
    (the rest untouched)."""
    text = CONFIG.read_text()
    entries = "".join(f"\n    - {{tenant: {t}, role: agent, key: {k}}}" for t, k in keys.items())
    if admin is not None:
        entries += f"\n    - {{tenant: {BIG_TENANT}, role: admin, key: {admin}}}"
    assert "  keys: []" in text, "config/braid.yaml changed: no `keys: []` to replace"
    # Throughput is what is measured here: no per-key rate limit.
    assert "  ratePerSecond: 100\n" in text, "config/braid.yaml changed: no `ratePerSecond: 100`"
    text = text.replace("  ratePerSecond: 100\n", "  ratePerSecond: 0\n")
    text = text.replace("  keys: []", "  keys:" + entries)
    return yaml.safe_dump(apply_sets(yaml.safe_load(text), sets)) if sets else text


def stats(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": pct(values, 50), "p95": pct(values, 95), "p99": pct(values, 99)}


def _body(memories: list[dict[str, Any]], vectors: np.ndarray) -> bytes:
    return msgspec.json.encode({"memories": [{**m, "embedding": v.tolist()} for m, v in zip(memories, vectors)]})


def load_jobs(corpus: Corpus, batch: int) -> list[tuple[Tenant, int]]:
    """The bulk load's batches in the order they are sent: ``(tenant, first
    index)``, every tenant's in turn, the big tenant's first."""
    return [(t, i) for t in corpus.tenants for i in range(0, len(t.memories), batch)]


def split_at(jobs: list[tuple[Tenant, int]], memories: int) -> int:
    """How many of ``jobs`` (the big tenant's first) write the big tenant's
    first ``memories`` or more: where a load pauses for the placement job."""
    for n, (t, i) in enumerate(jobs):
        if t.name != BIG_TENANT or i >= memories:
            return n
    return len(jobs)


def merge_loads(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One :func:`bulk_load` record of the parts of a load paused between
    them: counts, seconds and batch latencies added up, the pauses left out."""
    lat = [ms for p in parts for ms in p["batch_lat"]]
    seconds = sum(p["seconds"] for p in parts)
    memories = sum(p["memories"] for p in parts)
    errors = [e for p in parts for e in p["errors"]]
    return {
        **parts[0],
        "memories": memories,
        "batches": sum(p["batches"] for p in parts),
        "body_bytes_max": max(p["body_bytes_max"] for p in parts),
        "seconds": seconds,
        "per_s": memories / seconds,
        "batch_ms": stats(lat),
        "batch_lat": lat,
        "errors": errors[:10],
        "error_count": sum(p["error_count"] for p in parts),
    }


async def bulk_load(
    client: httpx.AsyncClient,
    corpus: Corpus,
    headers: dict[str, dict[str, str]],
    batch: int,
    writers: int,
    max_body: int,
    jobs: list[tuple[Tenant, int]] | None = None,
) -> dict[str, Any]:
    """Write ``jobs`` (default: the whole corpus, :func:`load_jobs`) with
    ``writers`` concurrent writers of ``batch`` memories a request."""
    # Bodies are encoded by the writers as they go (all of them at once would
    # take ~9 GB at 1M memories); the client's CPU for it is in the CPU table.
    if jobs is None:
        jobs = load_jobs(corpus, batch)
    sizes: list[int] = []
    errors: list[str] = []
    lat: list[float] = []
    queue = iter(jobs)
    done = 0
    step = max(len(jobs) // 20, 1)

    async def writer() -> None:
        nonlocal done
        for t, i in queue:
            tenant = t.name
            body = _body(t.memories[i : i + batch], t.vectors[i : i + batch])
            assert len(body) < max_body, f"batch body {len(body)} B over server.maxBodyBytes {max_body}"
            sizes.append(len(body))
            start = time.perf_counter()
            r = await client.post(
                "/v1/memories", content=body, headers={**headers[tenant], "content-type": "application/json"}
            )
            lat.append((time.perf_counter() - start) * 1000)
            if r.status_code != 201:
                errors.append(f"{r.status_code} {r.text[:200]}")
            done += 1
            if done % step == 0:
                print(f"load: {done}/{len(jobs)} batches", flush=True)

    start = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    elapsed = time.perf_counter() - start
    memories = sum(min(batch, len(t.memories) - i) for t, i in jobs)
    return {
        "memories": memories,
        "batches": len(jobs),
        "batch": batch,
        "writers": writers,
        "body_bytes_max": max(sizes),
        "seconds": elapsed,
        "per_s": memories / elapsed,
        "batch_ms": stats(lat),
        "batch_lat": lat,
        "errors": errors[:10],
        "error_count": len(errors),
    }


async def graph_load(
    client: httpx.AsyncClient, corpus: Corpus, headers: dict[str, dict[str, str]], writers: int = 3
) -> dict[str, Any]:
    """Each tenant's entities and relations, one request a tenant, ``writers``
    requests at a time (10,000 small tenants one at a time took ~30 min)."""
    start, errors = time.perf_counter(), []
    queue = iter(corpus.tenants)
    done = 0
    step = max(len(corpus.tenants) // 20, 1)

    async def writer() -> None:
        nonlocal done
        for t in queue:
            r = await client.post(
                "/v1/graph", json={"entities": t.entities, "relations": t.relations}, headers=headers[t.name]
            )
            if r.status_code != 201:
                errors.append(f"{r.status_code} {r.text[:200]}")
            done += 1
            if len(corpus.tenants) > 100 and done % step == 0:
                print(f"graph: {done}/{len(corpus.tenants)} tenants", flush=True)

    await asyncio.gather(*(writer() for _ in range(writers)))
    n = sum(len(t.relations) for t in corpus.tenants)
    return {"relations": n, "seconds": time.perf_counter() - start, "errors": errors}


@asynccontextmanager
async def loaded_service(
    corpus: Corpus, prefix: str, *, graph: bool = True, sets: Sequence[Override] = ()
) -> AsyncIterator[tuple[Service, dict[str, dict[str, str]]]]:
    """The service on the embedded stack (shipped config with ``sets`` over
    it, one agent key per tenant) with ``corpus`` written through it (its
    graph too, with ``graph``) and the outbox drained; yields it and each
    tenant's auth headers, and stops it on exit."""
    keys = {t.name: secrets.token_urlsafe(24) for t in corpus.tenants}
    headers = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
    admin = secrets.token_urlsafe(24)
    svc = Service(config_text=config_text(keys, sets, admin), prefix=prefix)
    try:
        async with httpx.AsyncClient(base_url=svc.url, timeout=300) as client:
            if graph:
                await graph_load(client, corpus, headers)
            await bulk_load(client, corpus, headers, 200, 3, 4 << 20)
            await wait_drained(client)
            await place(client, {"Authorization": f"Bearer {admin}"})
        yield svc, headers
    finally:
        svc.stop()


async def place(client: httpx.AsyncClient, admin: dict[str, str]) -> dict[str, Any]:
    """Run the ``placement`` admin job, as an operator would once a tenant
    has grown (own HNSW indexes past ``postgres.ownIndexAbove``, Typesense
    pairs past ``typesense.ownCollectionAbove``); its seconds and progress."""
    job = await admin_job(client, admin, {"target": "placement"})
    own = job["progress"].get("pgvector", {})
    moved = job["progress"].get("placement", {})
    print(
        f"load: placement in {job['seconds']:.1f} s: own HNSW indexes {own.get('indexes', [])},"
        f" Typesense pairs {moved.get('tenants', [])}",
        flush=True,
    )
    return job


async def prepare_import(client: httpx.AsyncClient, admin: dict[str, str], tenant: str) -> dict[str, Any]:
    """Run the ``import`` admin job for ``tenant``, as an operator would
    before bulk loading it: its own HNSW indexes reserved (built by the
    placement job after the load) and its own Typesense pair; its seconds
    and progress."""
    job = await admin_job(client, admin, {"target": "import", "tenant": tenant})
    done = job["progress"]["import"]
    print(
        f"load: import of {tenant} prepared in {job['seconds']:.1f} s: own HNSW indexes reserved in"
        f" {done['reserved']}, Typesense pair {done.get('typesense', {}).get('alias')}",
        flush=True,
    )
    return job


async def admin_job(client: httpx.AsyncClient, admin: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """Start the admin job ``body`` names and wait for it: its seconds and
    progress; raises if it did not end ``done``."""
    start = time.perf_counter()
    r = await client.post("/admin/reindex", json=body, headers=admin)
    r.raise_for_status()
    job_id = r.json()["job_id"]
    while True:
        job = (await client.get(f"/admin/reindex/{job_id}", headers=admin)).json()
        if job["status"] not in ("queued", "running"):
            break
        await asyncio.sleep(0.25)
    if job["status"] != "done":
        raise RuntimeError(f"{body['target']} job {job['status']}: {job.get('error')}")
    return {"seconds": time.perf_counter() - start, "progress": job["progress"]}


async def wait_drained(
    client: httpx.AsyncClient, timeout: float = 1800, *, stall_s: float | None = 300.0, label: str = "load: "
) -> dict[str, Any]:
    """Wait until the service's outbox has nothing pending: the seconds
    waited and the rows still pending (0: drained). As long as the pending
    count keeps going down: the wait ends undrained only after ``stall_s``
    seconds without a lower count (a backlog of hundreds of thousands of
    rows takes longer than any fixed timeout: 350,000 were left after
    1,800 s in ``tenants-s51-10k.md``), and says how far it got every
    minute, after ``label``. ``stall_s`` None: at most ``timeout`` seconds."""
    start = last_drop = last_said = time.perf_counter()
    pending = None
    lowest = None
    while True:
        now = time.perf_counter()
        if stall_s is None and now - start >= timeout:
            break
        if stall_s is not None and now - last_drop >= stall_s:
            break
        r = await client.get("/health")
        pending = r.json()["backends"]["sync"]["pending"]
        if pending == 0:
            break
        if lowest is None or pending < lowest:
            lowest, last_drop = pending, now
        if stall_s is not None and now - last_said >= 60:
            print(f"{label}outbox: {pending} pending after {now - start:.0f} s", flush=True)
            last_said = now
        await asyncio.sleep(0.25)
    return {"seconds": time.perf_counter() - start, "pending_left": pending}


async def settle(dsn: str, timeout: float = 300) -> dict[str, Any]:
    """Leave Postgres with no maintenance pending before a raw baseline is
    metered: wait for running autovacuum workers, then ``VACUUM (ANALYZE)``
    the database, so the dead rows of the load and of the placement job's
    flag update (and their HNSW entries) are not cleaned up, at Postgres'
    expense, inside a raw phase. Its seconds, and the autovacuum workers
    seen when it began."""
    start = time.perf_counter()
    seen = 0
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while time.perf_counter() - start < timeout:
            cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'")
            row = await cur.fetchone()
            busy = int(row[0]) if row else 0
            seen = seen or busy
            if not busy:
                break
            await asyncio.sleep(0.5)
        await conn.execute("VACUUM (ANALYZE)")
    return {"seconds": time.perf_counter() - start, "autovacuum_workers": seen}


#: A server process counts as idle below this share of one core.
IDLE_SHARE = 0.05


async def quiet(
    meter: CpuMeter,
    *,
    window: float = 1.0,
    windows: int = 3,
    idle_share: float = IDLE_SHARE,
    timeout: float = 180,
) -> dict[str, Any]:
    """Wait until the stack is idle on its own before a metered phase: until
    every server process kind (all but ``client``) used under ``idle_share`` of
    one core in each of ``windows`` consecutive ``window``-second readings, or
    ``timeout`` s. So what the phases before left running (Typesense's
    compaction after writes, a late autovacuum) is not counted against the
    next phase's operations; it is returned instead: seconds waited, whether
    the stack went idle, and the CPU ms by kind spent meanwhile."""
    start = time.perf_counter()
    first = prev = meter()
    calm = 0
    while calm < windows and time.perf_counter() - start < timeout:
        await asyncio.sleep(window)
        now = meter()
        busy = any(now[k] - prev.get(k, 0.0) >= idle_share * window for k in now if k != "client")
        calm = 0 if busy else calm + 1
        prev = now
    return {
        "seconds": time.perf_counter() - start,
        "idle": calm >= windows,
        "cpu_ms": {k: v * 1e3 for k, v in cpu_used(first, prev).items()},
        "idle_share": idle_share,
        "idle_for_s": window * windows,
    }


async def flush_typesense(url: str, api_key: str) -> dict[str, Any]:
    """Have the Typesense node at ``url`` compact its store
    (:meth:`TypesenseClient.compact`, which flushes the memtable first)
    before a metered read phase, and how long it took; a node that does not
    raises. Until a flush, the write requests since the last one tax every
    document a search reads (0.24.1's range tombstones: docs/design.md,
    "Write requests tax every hit until a flush"), and the node flushes on
    its own only about once a minute. So the recall rows, which follow the
    load's writes, and the direct baselines, minutes later, read the store
    in the same state, not one with a minute of writes and one without;
    what unflushed writes add to a search is measured apart
    (:mod:`benchmarks.load.tombstones`)."""
    start = time.perf_counter()
    client = TypesenseClient([url], api_key)
    try:
        answers = await client.compact()
    finally:
        await client.aclose()
    if answers != {url: "ok"}:
        raise RuntimeError(f"Typesense did not compact its store: {answers}")
    return {"seconds": time.perf_counter() - start}


def _quiet_text(q: dict[str, Any], flush: dict[str, Any] | None = None) -> str:
    spent = ", ".join(f"{k} {v:.0f}" for k, v in q["cpu_ms"].items())
    compacted = "" if flush is None else f"(Typesense compacted in {flush['seconds']:.1f} s) "
    return f"{compacted}(after {q['seconds']:.0f} s {'idle' if q['idle'] else 'still busy'}; CPU ms spent waiting: {spent})"


async def raw_typesense_import(
    ts: httpx.AsyncClient, corpus: Corpus, batch: int, writers: int, sample: int
) -> dict[str, Any]:
    """The same documents, with their vectors, straight into one scratch
    collection with the fields of Braid's collections (the keyword one's and
    the vectors one's), one document a memory."""
    fields: dict[str, dict[str, Any]] = {}
    for alias in ("braid_memories", "braid_memories_vectors"):
        r = await ts.get(f"/aliases/{alias}")
        if r.status_code == 404:  # a Braid from before the vectors collection
            continue
        schema = (await ts.get(f"/collections/{r.json()['collection_name']}")).json()
        for f in schema["fields"]:
            keep = ("name", "type", "facet", "optional", "index", "sort", "num_dim")
            fields.setdefault(f["name"], {k: v for k, v in f.items() if k in keep})
    name = f"scratch_{secrets.token_hex(4)}"
    r = await ts.post("/collections", json={"name": name, "fields": list(fields.values())})
    r.raise_for_status()
    docs = []
    for t in corpus.tenants:
        for m, v in zip(t.memories, t.vectors):
            doc = {
                "id": f"{t.name}:{m['id']}",
                "memory_id": m["id"],
                "tenant": t.name,
                "content": m["content"],
                "kind": m["kind"],
                "tier": m["tier"],
                "created_at": 1_700_000_000,
                "confidence": 1.0,
                "tags": [],
                "model": "client",
                "embedding": v.tolist(),
            }
            if "speaker" in m:
                doc["speaker"], doc["session_id"] = m["speaker"], m["session_id"]
            docs.append(doc)
            if len(docs) >= sample:
                break
        if len(docs) >= sample:
            break
    enc = msgspec.json.Encoder()
    bodies = [b"\n".join(enc.encode(d) for d in docs[i : i + batch]) for i in range(0, len(docs), batch)]
    failures = 0
    queue = iter(bodies)

    async def writer() -> None:
        nonlocal failures
        for body in queue:
            r = await ts.post(f"/collections/{name}/documents/import?action=upsert", content=body, timeout=600)
            r.raise_for_status()
            failures += sum(1 for line in r.text.splitlines() if '"success":true' not in line)

    start = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    elapsed = time.perf_counter() - start
    await ts.delete(f"/collections/{name}")
    return {"docs": len(docs), "seconds": elapsed, "per_s": len(docs) / elapsed, "failures": failures}


async def raw_postgres_copy(
    dsn: str, corpus: Corpus, sample: int, batch: int, cpu: Callable[[], dict[str, float]]
) -> dict[str, Any]:
    """The same rows (content, tier, time, vector) straight into a scratch copy
    of ``memories`` with all its indexes (the tiers' partial HNSW indexes
    included) by ``COPY``, ``batch`` rows per statement; CPU per row by
    process, read while the connection's backend still lives."""
    rows = []
    for t in corpus.tenants:
        for m, v in zip(t.memories, t.vectors, strict=True):
            rows.append((t.name, m["id"], m["content"], m["kind"], m["tier"], m.get("session_id"), v, "client"))
            if len(rows) >= sample:
                break
        if len(rows) >= sample:
            break
    name = f"scratch_{secrets.token_hex(4)}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await register_vector_async(conn)
        await conn.execute(f"CREATE TABLE {name} (LIKE memories INCLUDING ALL)")
        try:
            columns = "tenant, id, content, kind, tier, session_id, embedding, model, created_at"
            before = cpu()
            start = time.perf_counter()
            for i in range(0, len(rows), batch):
                async with conn.cursor() as cur:
                    async with cur.copy(f"COPY {name} ({columns}) FROM STDIN") as copy:
                        for row in rows[i : i + batch]:
                            await copy.write_row((*row, "2023-11-14T22:13:20Z"))
            elapsed = time.perf_counter() - start
            used = cpu_per_call(before, cpu(), len(rows))
        finally:
            await conn.execute(f"DROP TABLE {name}")
    return {"rows": len(rows), "seconds": elapsed, "per_s": len(rows) / elapsed, "cpu_ms_per_row": used}


async def paced(rate: float, n: int, job: Callable[[int], Coroutine[Any, Any, None]]) -> list[asyncio.Task[None]]:
    """``job(k)`` started for each k in ``range(n)``, ``rate`` a second from
    now (open loop: on schedule whatever the earlier ones are doing); the
    tasks, not awaited."""
    start = time.perf_counter()
    tasks = []
    for k in range(n):
        delay = start + k / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(job(k)))
    return tasks


async def steady_writes(
    client: LeanClient,
    health: httpx.AsyncClient,
    headers: dict[str, str],
    corpus: Corpus,
    rates: tuple[int, ...],
    seconds: float,
    meter: CpuMeter,
    dsn: str,
) -> dict[str, Any]:
    """Single writes at a steady (open-loop) rate with nothing probing them:
    what a written memory costs. Each write is one memory of the big tenant's
    corpus (its fields, entities and vector) under a new id. CPU per write by
    process is read from before the first write until the outbox has applied
    them all (``/health`` polled every 0.25 s meanwhile); the Typesense lag is
    the outbox's own record (row inserted in the write's transaction ->
    Typesense import acknowledged).

    Freshness without a probe: from the moment the client had the write's
    ack to the outbox row's ``processed_at`` (set after Typesense
    acknowledged the import, when the memory is searchable there), each read
    from the machine's one wall clock (client and Postgres share it). An
    import acknowledged before the ack reached the client counts 0. Polling
    Typesense for each write instead (:func:`freshness`) costs more than the
    write and, on 2 cores, measures the polling."""
    big = corpus.tenants[0]
    out: dict[str, Any] = {}
    counter = itertools.count()
    for rate in rates:
        ack: list[float] = []
        acked_at: list[float] = []
        acked_wall: dict[str, float] = {}
        errors: list[str] = []

        async def write() -> None:
            i = next(counter)
            j = i % len(big.memories)
            memory = {**big.memories[j], "id": f"steady-{i:06d}", "embedding": big.vectors[j].tolist()}
            t0 = time.perf_counter()
            code, raw = await client.post("/v1/memories", _encode({"memories": [memory]}), headers)
            if code != 201:
                errors.append(f"write {code} {raw[:120]!r}")
                return
            acked_wall[memory["id"]] = time.time()
            acked_at.append(time.perf_counter())
            ack.append((acked_at[-1] - t0) * 1000)

        n = int(rate * seconds)
        cpu_before = meter()
        start = time.perf_counter()
        tasks = await paced(rate, n, lambda _: write())
        results = await asyncio.gather(*tasks, return_exceptions=True)
        drained = await wait_drained(health)
        cpu = cpu_per_call(cpu_before, meter(), n)
        errors += [repr(e) for e in results if isinstance(e, BaseException)]
        lag = await asyncio.to_thread(_outbox_lag_ms, dsn, n, "steady-")
        fresh = await asyncio.to_thread(_applied_after_ack_ms, dsn, acked_wall)
        out[str(rate)] = {
            "writes": n,
            "acked_per_s": len(acked_at) / (max(acked_at) - start) if acked_at else float("nan"),
            "ack_ms": stats(ack),
            "outbox_ms": stats(lag),
            "fresh_ms": stats(fresh),
            "drain_s": drained["seconds"],
            "cpu_ms_per_write": cpu,
            "errors": errors[:10],
            "error_count": len(errors),
        }
    return out


async def freshness(
    client: LeanClient,
    ts: LeanClient,
    headers: dict[str, str],
    ts_headers: dict[str, str],
    rates: tuple[int, ...],
    seconds: float,
    poll_s: float,
    check_every: int,
    meter: CpuMeter,
    dsn: str,
    vectors: str = "braid_memories_vectors",
) -> dict[str, Any]:
    """Single writes at a steady (open-loop) rate; ack -> visible per source.

    One write in ``check_every`` is polled for: on Typesense directly (GET by
    id every ``poll_s``), and with one recall per Postgres-backed source
    (pgvector, graph). The probes cost more than the write itself (a GET
    parses the whole document, 384 floats included, about 15 times a write),
    and probing every write would measure the probes. Each
    probe links to an entity created beforehand, so the write does not embed
    a new entity name on the request path.

    The outbox's own record gives a second Typesense figure that no probe
    load can inflate: from the outbox row's insert (inside the write's
    transaction) to the moment Typesense acknowledged the import
    (``processed_at``). The CPU of every process is read around each rate.
    """
    rng = np.random.default_rng(99)
    total = sum(int(r * seconds) for r in rates)
    ents = [{"name": f"Probe Entity {i:06d}", "type": "probe"} for i in range(total)]
    for i in range(0, total, 500):
        code, raw = await client.post("/v1/graph", _encode({"entities": ents[i : i + 500]}), headers)
        assert code == 201, raw[:200]
    out: dict[str, Any] = {}
    counter = itertools.count()
    for rate in rates:
        times: dict[str, list[float]] = {s: [] for s in SOURCES}
        ack: list[float] = []
        acked_at: list[float] = []
        errors: list[str] = []

        async def probe() -> None:
            i = next(counter)
            mid, ent = f"fresh-{i:06d}", f"Probe Entity {i:06d}"
            v = rng.standard_normal(384)
            vec = (v / np.linalg.norm(v)).tolist()
            body = {
                "memories": [
                    {
                        "id": mid,
                        "content": f"freshness probe {i} mentions {ent}",
                        "session_id": mid,
                        "entities": [ent],
                        "embedding": vec,
                    }
                ]
            }
            payload = _encode(body)
            t0 = time.perf_counter()
            code, raw = await client.post("/v1/memories", payload, headers)
            acked = time.perf_counter()
            if code != 201:
                errors.append(f"write {code} {raw[:120]!r}")
                return
            ack.append((acked - t0) * 1000)
            acked_at.append(acked)

            async def typesense() -> None:
                # The vector document (``vectors``): the outbox marks a write applied once both are in.
                path = f"/collections/{vectors}/documents/{BIG_TENANT}:{mid}"
                while (await ts.get(path, ts_headers))[0] != 200:
                    await asyncio.sleep(poll_s)
                times["typesense"].append((time.perf_counter() - acked) * 1000)

            async def via_recall(source: str, req: dict[str, Any]) -> None:
                payload = _encode({**req, "sources": [source]})
                for _ in range(100):
                    code, raw = await client.post("/v1/recall", payload, headers)
                    if code != 200:
                        errors.append(f"recall {source} {code} {raw[:120]!r}")
                    elif any(it["id"] == mid for it in _decode(raw)["items"]):
                        times[source].append((time.perf_counter() - acked) * 1000)
                        return
                    await asyncio.sleep(poll_s)
                errors.append(f"{source}: {mid} not visible after 100 recalls")

            if i % check_every:
                return
            checks = [
                asyncio.wait_for(typesense(), 30),
                via_recall("pgvector", {"query": "freshness probe", "embedding": vec, "session_id": mid}),
                via_recall("graph", {"query": ent, "embedding": vec}),
            ]
            await asyncio.gather(*checks)

        cpu_before = meter()
        start = time.perf_counter()
        n = int(rate * seconds)
        tasks = await paced(rate, n, lambda _: probe())
        offered = n / (time.perf_counter() - start)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        cpu = cpu_per_call(cpu_before, meter(), n)
        errors += [repr(e) for e in results if isinstance(e, BaseException)]
        lag = await asyncio.to_thread(_outbox_lag_ms, dsn, n)
        out[str(rate)] = {
            "writes": n,
            "offered_per_s": offered,
            "acked_per_s": len(acked_at) / (max(acked_at) - start) if acked_at else float("nan"),
            "check_every": check_every,
            "ack_ms": stats(ack),
            **{s: stats(v) for s, v in times.items()},
            "outbox_ms": stats(lag),
            "cpu_ms_per_write": cpu,
            "errors": errors[:10],
            "error_count": len(errors),
        }
    return out


def _applied_after_ack_ms(dsn: str, acked: dict[str, float]) -> list[float]:
    """For each memory id of ``acked`` (id -> wall-clock seconds when the
    client had the write's ack): ms from then until its newest outbox row was
    processed (Typesense had acknowledged the import), 0 when that came first;
    none for a row still pending."""
    if not acked:
        return []
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT memory_id, extract(epoch FROM max(processed_at)) FROM outbox"
            " WHERE memory_id = ANY(%s) AND processed_at IS NOT NULL GROUP BY memory_id",
            (list(acked),),
        ).fetchall()
    return [max(0.0, (float(at) - acked[mid]) * 1000) for mid, at in rows]


def _outbox_lag_ms(dsn: str, n: int, prefix: str = "fresh-") -> list[float]:
    """Outbox insert -> Typesense import acknowledged, for the last ``n`` writes
    whose memory id starts with ``prefix``."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM processed_at - created_at) * 1000 FROM outbox"
            " WHERE memory_id LIKE %s AND processed_at IS NOT NULL ORDER BY id DESC LIMIT %s",
            (prefix + "%", n),
        ).fetchall()
    return [float(r[0]) for r in rows]


async def timed(
    client: Requester,
    headers: dict[str, str],
    bodies: list[bytes],
    clients: int,
    seconds: float,
    cpu: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Closed loop: ``clients`` workers cycling over ``bodies`` (encoded recall
    requests) for ``seconds`` (or one pass if 0); with ``cpu`` (a
    :class:`CpuMeter`), also the CPU each process kind spent per recall."""
    lat: list[float] = []
    per_source: dict[str, list[float]] = {}
    overhead: list[float] = []
    ratio: list[float] = []
    embed: list[float] = []
    status: dict[str, int] = {}
    degraded = 0
    cached = 0
    it = itertools.cycle(bodies) if seconds else iter(bodies)
    deadline = time.perf_counter() + seconds if seconds else float("inf")

    async def worker() -> None:
        nonlocal degraded, cached
        for body in it:
            if time.perf_counter() > deadline:
                return
            t0 = time.perf_counter()
            code, raw = await client.post("/v1/recall", body, headers)
            ms = (time.perf_counter() - t0) * 1000
            status[str(code)] = status.get(str(code), 0) + 1
            if code != 200:
                continue
            lat.append(ms)
            data = _decode(raw)
            degraded += bool(data["degraded"])
            cached += bool(data.get("cached"))
            src = [s["ms"] for s in data["sources"].values() if s["status"] == "ok"]
            for name, s in data["sources"].items():
                if s["status"] == "ok":
                    per_source.setdefault(name, []).append(s["ms"])
            if src and max(src) > 0:
                overhead.append(ms - max(src))
                ratio.append(ms / max(src))
            if data.get("embedding_ms") is not None:
                embed.append(data["embedding_ms"])

    cpu_before = cpu() if cpu else {}
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    return {
        **stats(lat),
        "cpu_ms": cpu_per_call(cpu_before, cpu(), len(lat)) if cpu else {},
        "qps": len(lat) / elapsed,
        "status": status,
        "degraded": degraded,
        "cached": cached,
        "sources_p50": {k: pct(v, 50) for k, v in per_source.items()},
        "overhead_p50": pct(overhead, 50),
        "ratio_p50": pct(ratio, 50),
        "embedding_ms_p50": pct(embed, 50),
        "latencies": lat,
    }


def postgres_sessions(conn: psycopg.Connection[Any]) -> int:
    """Sessions the server has opened so far in ``conn``'s database (read
    on ``conn``, which stays open, so it counts none of its own)."""
    row = conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


async def model_vectors(embedding: EmbeddingConfig, texts: Sequence[str]) -> list[tuple[float, ...]]:
    """The vectors the service's query embedder (``embedding``, a local
    model) makes for ``texts``, made here by the same code, a text at a
    time on its query lane; none for a hosted provider."""
    if embedding.provider != "local":
        return []
    from indexers.embedding import open_local  # loads the model: only when a run gets here

    async with open_local(embedding) as model:
        return [await model.embed_query(t) for t in texts]


async def recall_latency(
    client: LeanClient,
    headers: dict[str, str],
    corpus: Corpus,
    clients: tuple[int, ...],
    seconds: float,
    cpu: Callable[[], dict[str, float]],
    text_vectors: Sequence[Sequence[float]] = (),
    settle: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    sessions: Callable[[], int] | None = None,
    spread: Requester | None = None,
) -> list[dict[str, Any]]:
    """The recall rows (the caller warms the pools first and waits for an
    idle stack before the first; ``settle``, when given, is awaited before
    each later row and kept as its ``quiet_before``, so what a row left
    running, such as searches its timed-out recalls abandoned, is not
    charged to the next one): each source and
    the fused recall with the corpus' vectors supplied, at each client
    count; then, at 1 client over the distinct query texts, the fused
    recall with the vectors the service's model makes for them supplied
    (``text_vectors``, one per distinct text, when given), then text only,
    cold (the service embeds each) and cached (each again). The cold and
    cached rows search with the model's vectors, not the corpus' synthetic
    ones, so only the row beside them, searching with the same vectors,
    tells what embedding adds. ``sessions``, when given, reads how many
    sessions Postgres has opened so far: each row keeps how many it opened
    (``pg_sessions``; once warm, the service's pool opens one only to
    replace a connection it closed (or one past its hour's lifetime), and
    the CPU meter misses a backend that lived between two readings).
    ``spread``, when given, sends the rows with vectors supplied instead
    (to several service processes: :class:`~.client.Spread`); the rows
    that embed stay on ``client``, whose process holds the embedding cache
    the cached row reads."""
    rows: list[dict[str, Any]] = []

    async def row(
        config: str, embedding: str, bodies: list[bytes], clients: int, seconds: float, via: Requester = client
    ) -> None:
        waited = await settle() if settle is not None and rows else None
        opened = sessions() if sessions is not None else None
        res = await timed(via, headers, bodies, clients, seconds, cpu)
        if sessions is not None and opened is not None:
            res["pg_sessions"] = sessions() - opened
        rows.append({"config": config, "clients": clients, "embedding": embedding, **res, "quiet_before": waited})

    base = [{"query": q["text"], "embedding": v.tolist()} for q, v in zip(corpus.queries, corpus.query_vectors)]
    for label, sources in (("fused", None), *((s, [s]) for s in SOURCES)):
        bodies = [_encode({**b, "sources": sources} if sources else b) for b in base]
        for c in clients:
            await row(label, "supplied", bodies, c, seconds, spread or client)
    texts = list(dict.fromkeys(q["text"] for q in corpus.queries))
    if text_vectors:
        bodies = [_encode({"query": t, "embedding": list(v)}) for t, v in zip(texts, text_vectors, strict=True)]
        await row("fused", MODEL_SUPPLIED, bodies, 1, 0)
    for label in ("cold", "cached"):
        await row("fused", f"text only, {label}", [_encode({"query": t}) for t in texts], 1, 0)
    return rows


async def result_cache(
    client: LeanClient,
    headers: dict[str, str],
    corpus: Corpus,
    seconds: float,
    cpu: Callable[[], dict[str, float]],
    reload: Callable[[], None],
) -> list[dict[str, Any]]:
    """The same 20 recalls repeated at 1 client, with nothing written between
    them: computed every time (the shipped ``cache.ttlMs: 0``), then served
    from the result cache once ``reload`` has turned it on."""
    bodies = [
        _encode({"query": q["text"], "embedding": v.tolist()})
        for q, v in zip(corpus.queries[:20], corpus.query_vectors[:20])
    ]
    rows = [{"cache": "off", **await timed(client, headers, bodies, 1, seconds, cpu)}]
    reload()
    for _ in range(100):  # until the reload is in force (SIGHUP is asynchronous)
        await timed(client, headers, bodies, 1, 0)
        status, body = await client.post("/v1/recall", bodies[0], headers)
        if status == 200 and _decode(body).get("cached"):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the result cache did not come on after the reload")
    rows.append({"cache": "on", **await timed(client, headers, bodies, 1, seconds, cpu)})
    return rows


async def _closed_loop(
    call: Callable[[int, int], Awaitable[None]],
    n_items: int,
    clients: int,
    seconds: float,
    cpu: Callable[[], dict[str, float]],
) -> dict[str, Any]:
    """``clients`` workers calling ``call(worker, item)`` over the items in
    turn for ``seconds``: latency, calls/s and CPU per call by process."""
    lat: list[float] = []
    it = itertools.cycle(range(n_items))
    deadline = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        for i in it:
            if time.perf_counter() > deadline:
                return
            t0 = time.perf_counter()
            await call(w, i)
            lat.append((time.perf_counter() - t0) * 1000)

    before = cpu()
    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(clients)))
    elapsed = time.perf_counter() - start
    return {
        **stats(lat),
        "qps": len(lat) / elapsed,
        "clients": clients,
        "cpu_ms": cpu_per_call(before, cpu(), len(lat)),
    }


async def direct_pgvector(
    dsn: str,
    tier: str,
    ef_search: int,
    corpus: Corpus,
    clients: tuple[int, ...],
    seconds: float,
    cpu: Callable[[], dict[str, float]],
) -> list[dict[str, Any]]:
    """What a user would run by hand: one prepared ``ORDER BY embedding <=> q
    LIMIT 10`` per query on the big tenant's ``tier`` (its HNSW index, with
    the tier's ef_search and pgvector's iterative scan set once per
    connection), from ``clients`` connections at once.

    The tier is written into the statement (the tier's HNSW index is partial
    on it) and each execution is planned for its values (``plan_cache_mode =
    force_custom_plan``). Before s37 the tier was a parameter and Postgres
    settled on a generic plan after five executions: an exact scan of the
    tenant's rows by ``memories_tenant_tier`` and a sort, so this baseline
    was not the HNSW query it names (benchmarks/results/direct-pgvector-plan.md)."""
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(max(clients))]
    statement = sql.SQL(
        "SELECT id FROM memories WHERE tenant = %s AND tier = {tier} ORDER BY embedding <=> %s LIMIT 10"
    ).format(tier=sql.Literal(tier))
    vectors = [np.asarray(v, dtype=np.float32) for v in corpus.query_vectors]
    try:
        for conn in conns:
            await register_vector_async(conn)
            await conn.execute(f"SET hnsw.ef_search = {int(ef_search)}")
            await conn.execute("SET hnsw.iterative_scan = relaxed_order")
            await conn.execute("SET plan_cache_mode = force_custom_plan")

        async def call(w: int, i: int) -> None:
            cur = await conns[w].execute(statement, (BIG_TENANT, vectors[i]), prepare=True)
            await cur.fetchall()

        for w in range(len(conns)):  # prepared and warm on every connection
            for i in range(5):
                await call(w, i)
        return [await _closed_loop(call, len(vectors), c, seconds, cpu) for c in clients]
    finally:
        for conn in conns:
            await conn.close()


async def direct_typesense(
    url: str,
    api_key: str,
    corpus: Corpus,
    candidates: int,
    clients: tuple[int, ...],
    seconds: float,
    cpu: Callable[[], dict[str, float]],
    vectors: str | None = VECTORS_ALIAS,
    keywords: str = KEYWORD_ALIAS,
    tenant_filter: bool = True,
) -> list[dict[str, Any]]:
    """What a user would run by hand against Braid's collections: one ``POST
    /multi_search`` per query holding a keyword search (``q`` = the query
    text over content and context) in the keyword collection and a vector
    search in the vectors collection (``keywords`` and ``vectors``, the
    aliases the big tenant's searches read: :func:`search_aliases`; one
    collection before Braid had two; ``None`` when Typesense holds no vectors,
    ``typesense.vectors: none``: the keyword search alone), ``candidates`` hits each, behind the
    big tenant's filter (``tenant_filter``; left out in a pair that holds
    only the big tenant's documents, where it would match them all and a
    user would not send it), the embedding not sent back; bodies encoded
    beforehand, answers not parsed."""
    bodies = []
    flt: dict[str, str] = {"exclude_fields": "embedding"}
    if tenant_filter:
        flt["filter_by"] = f"tenant:=`{BIG_TENANT}`"
    for q, v in zip(corpus.queries, corpus.query_vectors, strict=True):
        keyword = {
            "collection": keywords,
            "q": q["text"],
            "query_by": "content,context",
            "per_page": candidates,
            "highlight_fields": "none",
        }
        searches = [{**keyword, **flt}]
        if vectors is not None:
            vector = ",".join(repr(float(x)) for x in v)
            nearest = {
                "collection": vectors,
                "q": "*",
                "vector_query": f"embedding:([{vector}], k:{candidates})",
                "per_page": candidates,
            }
            searches.append({**nearest, **flt})
        bodies.append(_encode({"searches": searches}))
    headers = {"X-TYPESENSE-API-KEY": api_key, "content-type": "application/json"}
    async with LeanClient(url, max_connections=64) as ts:

        async def call(w: int, i: int) -> None:
            status, body = await ts.post("/multi_search", bodies[i], headers)
            if status != 200:
                raise AssertionError(f"multi_search answered {status}: {body[:300]!r}")

        for i in range(20):
            await call(0, i)
        return [await _closed_loop(call, len(bodies), c, seconds, cpu) for c in clients]


async def direct_baselines(
    dsn: str,
    ts_url: str,
    ts_key: str,
    cfg: BraidConfig,
    corpus: Corpus,
    clients: tuple[int, ...],
    seconds: float,
    cpu: Callable[[], dict[str, float]],
    keyword: str,
    vectors: str,
) -> dict[str, Any]:
    """Both direct baselines on the big tenant (:func:`direct_pgvector` on
    the session tier at its ``efSearch``, :func:`direct_typesense` on the
    ``keyword`` and ``vectors`` collections, with the tenant filter unless
    they are the big tenant's own pair; the keyword search alone when the
    config keeps no vectors in Typesense), as the report's ``direct``."""
    ef_search = cfg.tiers["session"].ef_search
    searched: str | None = None if cfg.typesense.vectors == "none" else vectors
    candidates = cfg.source("typesense").candidates
    tenant_filter = keyword == KEYWORD_ALIAS  # else the big tenant's own pair
    return {
        "pgvector": await direct_pgvector(dsn, "session", ef_search, corpus, clients, seconds, cpu),
        "typesense": await direct_typesense(
            ts_url, ts_key, corpus, candidates, clients, seconds, cpu, searched, keyword, tenant_filter
        ),
        "ef_search": ef_search,
        "tenant_filter": tenant_filter,
        "keyword_collection": keyword,
        "vector_collection": searched,
    }


async def hnsw_hook(dsn: str, cfg_text: str, corpus: Corpus) -> dict[str, Any]:
    """Every tier's HNSW recall curve on the big tenant (``hnsw.measure_hnsw``)."""
    return await measure_hnsw(dsn, parse_config(cfg_text), BIG_TENANT, corpus.query_vectors)


async def run(
    corpus: Corpus,
    *,
    writers: int,
    batch: int,
    seconds: float,
    clients: tuple[int, ...],
    fresh_rates: tuple[int, ...],
    fresh_seconds: float,
    fresh_check_every: int,
    raw_sample: int,
    steady_rates: tuple[int, ...] = (50,),
    sets: Sequence[Override] = (),
    place_at: int | None = None,
    bulk_import: bool = False,
    services: int = 1,
) -> dict[str, Any]:
    """The whole load benchmark (the module docstring). The placement job
    runs after the load, or with ``place_at`` once the big tenant's first
    ``place_at`` memories are in (the writes paused and the outbox drained),
    as an operator would run it when a tenant passes the thresholds; the
    rest is written after it. The write figures (seconds, batch latencies,
    CPU a memory, load + drain included) leave the pause out: the job and
    the drain of the first part's outbox before it. With ``bulk_import``
    the big tenant is prepared by an ``import`` job before the load (as an
    operator would before loading a tenant known to be large) and placed
    after it. With ``services`` above 1, that many service processes
    share the backends (the first starts them, the others are its
    replicas: :meth:`~benchmarks.common.Service.add_replica`, started once
    the stack is up) and the recall rows with vectors supplied are sent to
    them round robin; everything else goes to the first."""
    if services < 1:
        raise ValueError(f"services must be at least 1, got {services}")
    if bulk_import and place_at is not None:
        raise ValueError("bulk_import places the big tenant after the load; place_at cannot apply")
    keys = {t.name: secrets.token_urlsafe(24) for t in corpus.tenants}
    admin = secrets.token_urlsafe(24)
    cfg_text = config_text(keys, sets, admin)
    cfg = parse_config(cfg_text)
    headers = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
    report: dict[str, Any] = {}
    svc = Service(config_text=cfg_text, prefix="braid-load-")
    report["services"] = services
    try:
        for _ in range(services - 1):
            svc.add_replica()
        dsn = svc.postgres_dsn()
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        ts_url = f"http://127.0.0.1:{svc.typesense_port()}"
        async with (
            httpx.AsyncClient(base_url=svc.url, timeout=120, limits=limits) as client,
            httpx.AsyncClient(
                base_url=ts_url,
                headers={"X-TYPESENSE-API-KEY": svc.ts_key},
                timeout=60,
                limits=limits,
            ) as ts,
        ):
            print("load: graph", flush=True)
            report["graph_load"] = await graph_load(client, corpus, headers)
            if bulk_import:
                report["import"] = await prepare_import(client, {"Authorization": f"Bearer {admin}"}, BIG_TENANT)
            print("load: memories", flush=True)
            meter = CpuMeter(svc.processes)
            jobs = load_jobs(corpus, batch)
            cut = split_at(jobs, place_at) if place_at is not None else len(jobs)
            parts: list[dict[str, Any]] = []
            spent: dict[str, float] = {}  # CPU seconds of the writes, pauses left out
            for part in (jobs[:cut], jobs[cut:]):
                if not part:
                    continue
                if parts:
                    print(f"load: {parts[0]['memories']} memories in; draining, then the placement job", flush=True)
                    await wait_drained(client)
                    report["placement"] = await place(client, {"Authorization": f"Bearer {admin}"})
                    report["placement"]["at_memories"] = parts[0]["memories"]
                cpu_before = meter()
                parts.append(await bulk_load(client, corpus, headers, batch, writers, cfg.server.max_body_bytes, part))
                cpu_after = meter()
                for k, v in cpu_used(cpu_before, cpu_after).items():
                    spent[k] = spent.get(k, 0.0) + v
            report["write"] = merge_loads(parts)
            del report["write"]["batch_lat"]
            report["write"]["cpu_ms_per_memory"] = cpu_per_call({}, spent, corpus.total)
            print(f"load: {report['write']['per_s']:.0f} memories/s; draining the outbox", flush=True)
            report["drain"] = await wait_drained(client)
            for k, v in cpu_used(cpu_after, meter()).items():
                spent[k] = spent.get(k, 0.0) + v
            report["drain"]["cpu_ms_per_memory"] = cpu_per_call({}, spent, corpus.total)
            report["write"]["to_typesense_per_s"] = corpus.total / (
                report["write"]["seconds"] + report["drain"]["seconds"]
            )
            report["drain"]["quiet"] = await quiet(meter)
            print(f"load: drained {_quiet_text(report['drain']['quiet'])}", flush=True)
            if "placement" not in report:
                report["placement"] = await place(client, {"Authorization": f"Bearer {admin}"})
            print("load: settling Postgres (autovacuum, VACUUM ANALYZE)", flush=True)
            report["settle"] = await settle(dsn)
            print("load: raw Typesense import", flush=True)
            cpu_before = meter()
            report["raw_typesense"] = await raw_typesense_import(ts, corpus, batch, writers, raw_sample)
            report["raw_typesense"]["cpu_ms_per_doc"] = cpu_per_call(
                cpu_before, meter(), report["raw_typesense"]["docs"]
            )
            report["raw_typesense"]["braid_ratio"] = report["write"]["per_s"] / report["raw_typesense"]["per_s"]
            report["raw_typesense"]["braid_ratio_to_typesense"] = (
                report["write"]["to_typesense_per_s"] / report["raw_typesense"]["per_s"]
            )
            print("load: raw Postgres COPY", flush=True)
            report["raw_postgres"] = await raw_postgres_copy(dsn, corpus, raw_sample, batch, meter)
            # After the placement job: a big tenant may have a pair of its own.
            keyword, vectors = await search_aliases(ts, dsn, BIG_TENANT)
            print("load: steady writes", flush=True)
            async with LeanClient(svc.url) as lean:
                report["steady"] = await steady_writes(
                    lean,
                    client,
                    {**headers[BIG_TENANT], "content-type": "application/json"},
                    corpus,
                    steady_rates,
                    fresh_seconds,
                    meter,
                    dsn,
                )
            print("load: freshness", flush=True)
            async with LeanClient(svc.url) as lean, LeanClient(ts_url) as lean_ts:
                report["freshness"] = await freshness(
                    lean,
                    lean_ts,
                    {**headers[BIG_TENANT], "content-type": "application/json"},
                    {"X-TYPESENSE-API-KEY": svc.ts_key},
                    fresh_rates,
                    fresh_seconds,
                    0.002,
                    fresh_check_every,
                    meter,
                    dsn,
                    vectors,
                )
            await wait_drained(client)
            async with LeanClient(svc.url, max_connections=64) as lean, Spread(svc.urls) as spread:
                recall_headers = {**headers[BIG_TENANT], "content-type": "application/json"}
                # Recalls before the wait for an idle stack: they warm the pools,
                # and a tenant's first graph read (graph.cacheRows), which runs
                # in the background, is waited out here, not counted in the first row.
                warm = zip(corpus.queries[:50], corpus.query_vectors[:50])
                warm_bodies = [_encode({"query": q["text"], "embedding": v.tolist()}) for q, v in warm]
                for process in spread.clients:
                    await timed(process, recall_headers, warm_bodies, 4, 0)
                report["flush_before_recalls"] = await flush_typesense(ts_url, svc.ts_key)
                report["quiet_before_recalls"] = await quiet(meter)
                report["graph_cache_before_recalls"] = (
                    (await client.get("/health")).json()["backends"]["graph"].get("cache")
                )
                waited = _quiet_text(report["quiet_before_recalls"], report["flush_before_recalls"])
                print(f"load: recall latency {waited}", flush=True)
                texts = list(dict.fromkeys(q["text"] for q in corpus.queries))
                text_vectors = await model_vectors(cfg.embedding, texts)
                with psycopg.connect(svc.postgres_dsn(), autocommit=True) as stats_conn:
                    report["recall"] = await recall_latency(
                        lean,
                        recall_headers,
                        corpus,
                        clients,
                        seconds,
                        meter,
                        text_vectors,
                        lambda: quiet(meter),
                        functools.partial(postgres_sessions, stats_conn),
                        spread if services > 1 else None,
                    )
            print("load: result cache", flush=True)
            cfg_path = svc.home / "braid.yaml"

            def cache_on() -> None:
                cfg_path.write_text(cfg_text.replace("  ttlMs: 0\n", "  ttlMs: 600000\n"))
                svc.proc.send_signal(signal.SIGHUP)

            assert "  ttlMs: 0\n" in cfg_text, "config/braid.yaml changed: no `ttlMs: 0`"
            async with LeanClient(svc.url, max_connections=4) as lean:
                recall_headers = {**headers[BIG_TENANT], "content-type": "application/json"}
                report["cache"] = await result_cache(lean, recall_headers, corpus, seconds, meter, cache_on)
            cfg_path.write_text(cfg_text)
            svc.proc.send_signal(signal.SIGHUP)
            report["flush_before_direct"] = await flush_typesense(ts_url, svc.ts_key)
            report["quiet_before_direct"] = await quiet(meter)
            waited = _quiet_text(report["quiet_before_direct"], report["flush_before_direct"])
            print(f"load: direct baselines {waited}", flush=True)
            direct_clients = tuple(c for c in clients if c in (1, 8)) or (1,)
            report["direct"] = await direct_baselines(
                dsn, ts_url, svc.ts_key, cfg, corpus, direct_clients, seconds, meter, keyword, vectors
            )
            health = (await client.get("/health")).json()
            report["health_end"] = health
            print("load: hnsw", flush=True)
            try:
                report["hnsw"] = await hnsw_hook(dsn, cfg_text, corpus)
            except Exception as exc:  # reported, never hidden: the run's other numbers still stand
                report["hnsw"] = {"error": f"{type(exc).__name__}: {exc}"}
        report["service_log_tail"] = svc.log_tail()
    finally:
        svc.stop()
    return report
