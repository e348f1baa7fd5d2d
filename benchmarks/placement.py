"""A large tenant moved to a Typesense collection pair of its own, under load.

``python -m benchmarks.placement [--big 30000] [--small 50] [--per 200]
[--clients 8] [--seconds 15] [--write-rate 5] [--name NAME]``

One service on the embedded stack (shipped config, ``typesense.groups: 1``,
one agent key per tenant, ``typesense.ownCollectionAbove`` set to ``--big``)
holds the load corpus' big tenant (``--big`` memories) and ``--small``
tenants of ``--per``, all in the one shared collection. Measured:

* **before**: fused recalls of the small tenants and of the big one, each
  ``--clients`` clients for ``--seconds`` s (p50/p99, CPU ms per recall by
  process);
* **during** ``POST /admin/reindex {"target": "placement"}``: the same recalls,
  mixed, until the job is done, and single writes to the big tenant at
  ``--write-rate`` a second; every recall is checked (a non-200, a degraded
  answer or an empty Typesense list counts), and the job's phases are timed;
* **after**: as before. The small tenants' Typesense CPU per recall should
  drop: their searches no longer pay for the big tenant's documents.

Then the counts: the big tenant's documents in its own pair against its rows
in Postgres (the writes made during the move included), and what is left of
it in the shared collection (0). Report:
``benchmarks/results/placement[-<name>].{md,json}``; last line
``placement: big=<n> move_s=<x> errors=<n> degraded=<n> empty_typesense=<n>
small_ts_cpu_before=<x> small_ts_cpu_after=<x> own=<n> postgres=<n> left=<n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import secrets
import sys
import time
from dataclasses import replace
from typing import Any

import httpx
import msgspec
import psycopg

from benchmarks.common import CpuMeter, Service, pct, write_results
from benchmarks.load.client import LeanClient
from benchmarks.load.corpus import BIG_TENANT, build_corpus, describe
from benchmarks.load.run import bulk_load, config_text, graph_load, wait_drained
from benchmarks.tenants import RELATIONS, _queries, _recalls
from config.loader import parse_config
from indexers.typesense.placement import own_alias

ALIAS = "braid_memories"


def placement_config(keys: dict[str, str], admin: str, above: int) -> str:
    """The shipped config with the corpus' agent keys, an admin key of the
    big tenant, and ``ownCollectionAbove`` at ``above``."""
    text = config_text(keys)
    assert text.count("  ownCollectionAbove: 50000\n") == 1, "config/braid.yaml changed: no ownCollectionAbove"
    text = text.replace("  ownCollectionAbove: 50000\n", f"  ownCollectionAbove: {above}\n")
    head, keys, tail = text.rpartition("\n  keys:")  # the section's, not a comment's
    assert keys, "no auth keys in the config"
    return f"{head}{keys}\n    - {{tenant: {BIG_TENANT}, role: admin, key: {admin}}}{tail}"


async def _during(
    svc: Service,
    keys: dict[str, str],
    admin: str,
    queries: list[tuple[str, bytes, int]],
    clients: int,
    write_rate: float,
    corpus: Any,
) -> dict[str, Any]:
    """Recalls and writes while a placement job runs, until it is done."""
    lat: list[float] = []
    errors: list[str] = []
    degraded = empty_ts = 0
    degraded_by: dict[str, int] = {}
    source_errors: list[str] = []
    written: list[str] = []
    write_errors: list[str] = []
    phases: list[tuple[float, str]] = []
    done = asyncio.Event()
    it = itertools.cycle(queries)

    async def recaller(lean: LeanClient) -> None:
        nonlocal degraded, empty_ts
        while not done.is_set():
            tenant, body, _ = next(it)
            headers = {"Authorization": f"Bearer {keys[tenant]}", "content-type": "application/json"}
            t0 = time.perf_counter()
            code, raw = await lean.post("/v1/recall", body, headers)
            if code != 200:
                errors.append(f"{code} {raw[:160]!r}")
                continue
            lat.append((time.perf_counter() - t0) * 1000)
            data = msgspec.json.decode(raw)
            degraded += bool(data["degraded"])
            for name in data["degraded"]:
                source = data["sources"].get(name, {})
                key = f"{name} {source.get('status', '?')}"
                degraded_by[key] = degraded_by.get(key, 0) + 1
                if source.get("error") and len(source_errors) < 10:
                    source_errors.append(f"{name}: {source['error'][:300]}")
            ts = data["sources"].get("typesense")
            empty_ts += ts is not None and ts["status"] == "ok" and ts["hits"] == 0

    big = corpus.tenants[0]
    headers = {"Authorization": f"Bearer {keys[BIG_TENANT]}", "content-type": "application/json"}

    async def writer(lean: LeanClient) -> None:
        for i in itertools.count():
            if done.is_set():
                return
            j = i % len(big.memories)
            memory = {**big.memories[j], "id": f"moving-{i:06d}", "embedding": big.vectors[j].tolist()}
            code, raw = await lean.post("/v1/memories", msgspec.json.encode({"memories": [memory]}), headers)
            if code == 201:
                written.append(memory["id"])
            else:
                write_errors.append(f"{code} {raw[:160]!r}")
            await asyncio.sleep(1.0 / write_rate)

    async with httpx.AsyncClient(base_url=svc.url, timeout=60) as client:
        auth = {"Authorization": f"Bearer {admin}"}
        start = time.perf_counter()
        async with LeanClient(svc.url, max_connections=clients * 2 + 2) as lean:
            tasks = [asyncio.create_task(recaller(lean)) for _ in range(clients)]
            tasks.append(asyncio.create_task(writer(lean)))
            r = await client.post("/admin/reindex", json={"target": "placement"}, headers=auth)
            assert r.status_code == 202, r.text
            job_id = r.json()["job_id"]
            while True:
                job = (await client.get(f"/admin/reindex/{job_id}", headers=auth)).json()
                phase = job["progress"].get("placement", {}).get("current", {}).get("phase", job["status"])
                if not phases or phases[-1][1] != phase:
                    phases.append((time.perf_counter() - start, phase))
                    print(f"placement: {phases[-1][0]:.1f} s: {phase}", flush=True)
                if job["status"] not in ("queued", "running"):
                    break
                await asyncio.sleep(0.25)
            move_s = time.perf_counter() - start
            done.set()
            await asyncio.gather(*tasks)
    return {
        "job": {k: job[k] for k in ("status", "error", "progress")},
        "move_s": move_s,
        "phases": phases,
        "n": len(lat),
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
        "errors": errors[:10],
        "error_count": len(errors),
        "degraded": degraded,
        "degraded_by": degraded_by,
        "source_errors": source_errors,
        "empty_typesense": empty_ts,
        "written": len(written),
        "write_errors": write_errors[:10],
    }


def _counts(svc: Service, dsn: str) -> dict[str, int]:
    """The big tenant's rows in Postgres, documents in its pair and in the shared collection."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM memories WHERE tenant = %s", (BIG_TENANT,)).fetchone()
    headers = {"X-TYPESENSE-API-KEY": svc.ts_key}
    base = f"http://127.0.0.1:{svc.typesense_port()}"

    def count(collection: str, filter_by: str | None = None) -> int:
        params = {"q": "*", "per_page": 0, **({"filter_by": filter_by} if filter_by else {})}
        r = httpx.get(f"{base}/collections/{collection}/documents/search", params=params, headers=headers)
        r.raise_for_status()
        return int(r.json()["found"])

    own = own_alias(ALIAS, BIG_TENANT)
    return {
        "postgres": int(row[0]) if row else 0,
        "own": count(own),
        "own_vectors": count(f"{own}_vectors"),
        "left": count(ALIAS, f"tenant:=`{BIG_TENANT}`"),
        "left_vectors": count(f"{ALIAS}_vectors", f"tenant:=`{BIG_TENANT}`"),
    }


async def run(
    big: int, small: int, per: int, clients: int, seconds: float, write_rate: float, seed: int
) -> dict[str, Any]:
    corpus = build_corpus(big, small_tenants=small, small_size=per, relations=RELATIONS)
    keys = {t.name: secrets.token_urlsafe(24) for t in corpus.tenants}
    admin = secrets.token_urlsafe(24)
    cfg_text = placement_config(keys, admin, big)
    cfg = parse_config(cfg_text)
    assert cfg.typesense.groups == 1 and cfg.typesense.own_collection_above == big
    headers = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
    rng = random.Random(seed)
    svc = Service(config_text=cfg_text, prefix="braid-placement-")
    report: dict[str, Any] = {"corpus": describe(corpus), "big": big, "small": small, "per": per}
    try:
        meter = CpuMeter(svc.processes)
        async with httpx.AsyncClient(base_url=svc.url, timeout=600) as client:
            print(f"placement: loading {corpus.total} memories", flush=True)
            t0 = time.perf_counter()
            await graph_load(client, corpus, headers)
            write = await bulk_load(client, corpus, headers, 200, 3, cfg.server.max_body_bytes)
            await wait_drained(client)
            report["load"] = {"seconds": time.perf_counter() - t0, "per_s": write["per_s"]}
        floors = (0.15, 0.3, 50)
        small_names = [t.name for t in corpus.tenants[1:]]
        small_q = _queries(corpus, [rng.choice(small_names) for _ in range(200)], rng, 10, floors)
        big_q = _queries(replace(corpus, tenants=corpus.tenants[:1]), [BIG_TENANT] * 200, rng, 10, floors)

        async def measure(label: str) -> dict[str, Any]:
            await _recalls(svc, keys, small_q[:50] + big_q[:50], clients, 0.0, 10, meter, once=True)
            out = {
                "small": await _recalls(svc, keys, small_q, clients, seconds, 10, meter),
                "big": await _recalls(svc, keys, big_q, clients, seconds, 10, meter),
            }
            print(
                f"placement: {label}: small p50 {out['small']['p50']:.1f} ms, big p50 {out['big']['p50']:.1f} ms",
                flush=True,
            )
            return out

        report["before"] = await measure("before")
        mixed = [q for pair in zip(small_q, big_q, strict=True) for q in pair]
        report["during"] = await _during(svc, keys, admin, mixed, clients, write_rate, corpus)
        async with httpx.AsyncClient(base_url=svc.url, timeout=600) as client:
            await wait_drained(client)
        report["after"] = await measure("after")
        report["counts"] = _counts(svc, svc.postgres_dsn())
    finally:
        svc.stop()
    return report


def markdown(report: dict[str, Any], command: str) -> str:
    d = report["during"]
    c = report["counts"]
    lines = [
        "# A large tenant moved to a Typesense pair of its own, under load",
        "",
        f"Command: `{command}`  ",
        f"Corpus: {report['corpus']}.  ",
        f"Loaded in {report['load']['seconds']:.0f} s ({report['load']['per_s']:.0f} memories/s). One service,"
        " embedded Postgres and Typesense, shipped config with `typesense.groups: 1` and"
        f" `ownCollectionAbove: {report['big']}`; recalls closed loop, fused, each by its tenant's key.",
        "",
        "| phase | recalls | small tenants p50 / p99 ms | big tenant p50 / p99 ms"
        " | CPU ms a small tenant's recall (service / Postgres / Typesense)"
        " | CPU ms a big tenant's recall (service / Postgres / Typesense) |",
        "|---|---|---|---|---|---|",
    ]
    for label in ("before", "after"):
        r = report[label]
        s, b = r["small"], r["big"]
        cs, cb = s["cpu_ms"], b["cpu_ms"]
        lines.append(
            f"| {label} | {s['n'] + b['n']} | {s['p50']:.1f} / {s['p99']:.1f} | {b['p50']:.1f} / {b['p99']:.1f}"
            f" | {cs.get('service', 0):.2f} / {cs.get('postgres', 0):.2f} / {cs.get('typesense', 0):.2f}"
            f" | {cb.get('service', 0):.2f} / {cb.get('postgres', 0):.2f} / {cb.get('typesense', 0):.2f} |"
        )
    phases = ", ".join(f"{p} at {t:.1f} s" for t, p in d["phases"])
    lines += [
        "",
        f"**During the move** ({d['move_s']:.1f} s; job {d['job']['status']}; {phases}): {d['n']} recalls of both"
        f" kinds mixed, p50 {d['p50']:.1f} ms, p99 {d['p99']:.1f} ms; errors {d['error_count']}, degraded"
        f" {d['degraded']} ({', '.join(f'{k}: {v}' for k, v in sorted(d['degraded_by'].items())) or 'none'}),"
        f" Typesense lists empty {d['empty_typesense']}; {d['written']} writes to the big tenant"
        f" ({len(d['write_errors'])} failed).",
        "",
        f"**After**: the big tenant has {c['postgres']} rows in Postgres and {c['own']} / {c['own_vectors']}"
        f" documents in its own keyword / vectors collections; {c['left']} / {c['left_vectors']} are left in the"
        " shared ones.",
    ]
    if d["errors"] or d["write_errors"] or d.get("source_errors"):
        lines += ["", "Errors: " + "; ".join(d["errors"] + d["write_errors"] + d.get("source_errors", []))]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=int, default=30_000)
    parser.add_argument("--small", type=int, default=50)
    parser.add_argument("--per", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--write-rate", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    if args.big <= args.per:
        parser.error("--big must be above --per: only the big tenant is to move")
    report = asyncio.run(run(args.big, args.small, args.per, args.clients, args.seconds, args.write_rate, args.seed))
    command = "python -m benchmarks.placement " + " ".join(sys.argv[1:])
    name = "placement" + (f"-{args.name}" if args.name else "")
    path = write_results(name, markdown(report, command), report)
    print(f"wrote {path}")
    d, c = report["during"], report["counts"]
    ts = lambda label: report[label]["small"]["cpu_ms"].get("typesense", 0.0)  # noqa: E731
    print(
        f"placement: big={args.big} move_s={d['move_s']:.1f} errors={d['error_count']} degraded={d['degraded']}"
        f" empty_typesense={d['empty_typesense']} small_ts_cpu_before={ts('before'):.2f}"
        f" small_ts_cpu_after={ts('after'):.2f} own={c['own']} postgres={c['postgres']} left={c['left']}"
    )


if __name__ == "__main__":
    main()
