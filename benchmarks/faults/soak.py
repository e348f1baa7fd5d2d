"""The soak: steady mixed traffic for N minutes against one service, then a
check that nothing acknowledged was lost.

``python -m benchmarks.faults.soak [--minutes 10] [--clients 8] [--rate R]``
(also run by ``make bench-faults``). Loopback only: embedded Postgres and
Typesense in a temp dir, ``python -m service`` as a subprocess
(:mod:`benchmarks.faults.stack`), ``--clients`` httpx clients sharing one
fixed request rate (:mod:`benchmarks.faults.workload`).

The query texts (400) are embedded once before the clock starts, so the
rate loads the steady state rather than the query-embedding cache filling.
Every ``--sample`` seconds: the service's RSS, CPU by process, requests,
errors by status and p50/p99 latency in the window, the outbox backlog. The
run is *saturated* when the clients could not keep the rate (fewer than 95 %
of the requests sent, or starts over 1 s late at p99). At the end the
outbox is drained and every acknowledged, not deleted memory is read back
from Postgres and from Typesense (directly, not through the service) with
the content last acknowledged; every acknowledged delete must be gone from
both. Memory is *flat* when the RSS grew by less than ``--flat-mb`` from the
end of warm-up (the first 20 % of the run) to the end.

Bounded: the load stops at ``--minutes``; the whole run (start, drain,
check) is cut at ``--minutes`` + 15 min; the service gets SIGINT, then
Typesense and Postgres are stopped, the temp dir removed, and any process
still using it is killed and reported.

Writes ``benchmarks/results/soak.json``, ``soak.md`` and ``soak.png``, and
appends one ``kind="soak"`` Scenario to the fault ledger
(``BRAID_FAULT_LEDGER``, or ``--ledger``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

import httpx
import psutil
import psycopg

from benchmarks.common import RESULTS, CpuMeter, cpu_used, pct

from .ledger import Ledger, Scenario
from .soak_report import memory_verdict, per_minute, write_outputs
from .stack import SoakStack
from .workload import Book, Mix, SchemaCheck, queries, run_clients

__all__ = ["SoakSettings", "main", "run_soak"]

TENANTS = ["soak-a", "soak-b"]

#: How the default rate was chosen: see RATE_NOTE in soak_report.py.
DEFAULT_RATE = 20.0


@dataclass(frozen=True)
class SoakSettings:
    minutes: float = 10.0
    clients: int = 8
    rate: float = DEFAULT_RATE
    sample_s: float = 5.0
    warmup: float = 0.2
    flat_mb: float = 20.0
    queries: int = 400
    seed: int = 11
    #: Extra wall-clock allowance beyond the load for start, drain and check.
    slack_s: float = 900.0
    #: Shares of recalls, writes and deletes.
    mix: tuple[float, float, float] = (Mix.recall, Mix.write, Mix.delete)
    #: Extra environment for the service process (experiments; empty: as shipped).
    service_env: tuple[tuple[str, str], ...] = ()

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    @property
    def cap_s(self) -> float:
        return self.seconds + self.slack_s


async def _sampler(
    stack: SoakStack, book: Book, t0: float, end: float, every: float, samples: list[dict[str, Any]]
) -> None:
    service = stack.service_process()

    def processes() -> dict[str, list[psutil.Process]]:
        return {"service": [service], **stack.server_processes()}

    meter = CpuMeter(processes)
    cpu0, at0, seen = meter(), time.monotonic(), 0
    async with await psycopg.AsyncConnection.connect(stack.dsn, autocommit=True) as conn:
        k = 1
        while True:
            target = t0 + k * every
            if target > end + every / 2:
                return
            await asyncio.sleep(max(0.0, target - time.monotonic()))
            k += 1
            now = time.monotonic()
            window, seen = book.done[seen:], len(book.done)
            cpu1 = meter()
            cpu = {kind: round(used / (now - at0), 3) for kind, used in cpu_used(cpu0, cpu1).items()}
            row = await (await conn.execute("SELECT count(*) FROM outbox WHERE processed_at IS NULL")).fetchone()
            lat = [d.ms for d in window]
            statuses: dict[str, int] = {}
            for d in window:
                statuses[str(d.status)] = statuses.get(str(d.status), 0) + 1
            samples.append(
                {
                    "t": round(now - t0, 2),
                    "requests": len(window),
                    "errors": sum(1 for d in window if d.status not in (200, 201)),
                    "statuses": statuses,
                    "p50_ms": pct(lat, 50),
                    "p99_ms": pct(lat, 99),
                    "recall_p99_ms": pct([d.ms for d in window if d.op == "recall"], 99),
                    "write_p99_ms": pct([d.ms for d in window if d.op == "write"], 99),
                    "rss_mb": service.memory_info().rss / 2**20,
                    # CPU cores used in the window, by process kind.
                    "cpu": cpu,
                    "typesense_rss_mb": sum(p.memory_info().rss for p in stack.server_processes()["typesense"]) / 2**20,
                    "outbox_pending": int(row[0]) if row else None,
                }
            )
            cpu0, at0 = cpu1, now


async def _progress(t0: float, seconds: float, book: Book, samples: list[dict[str, Any]]) -> None:
    """A line a minute on stdout."""
    minute = 1
    while t0 + minute * 60 <= t0 + seconds + 1:
        await asyncio.sleep(max(0.0, t0 + minute * 60 - time.monotonic()))
        recent = [d for d in book.done if d.t > (minute - 1) * 60]
        errors = sum(1 for d in recent if d.status not in (200, 201))
        rss = samples[-1]["rss_mb"] if samples else float("nan")
        print(
            f"soak: minute {minute}/{seconds / 60:g}: {len(recent)} requests, {errors} errors, "
            f"p99 {pct([d.ms for d in recent], 99):.0f} ms, service RSS {rss:.0f} MB, "
            f"{len(book.live)} live memories",
            flush=True,
        )
        minute += 1


async def _read_typesense(stack: SoakStack) -> dict[tuple[str, str], str]:
    """Every soak tenant's document, straight from Typesense's export."""
    params = {
        "filter_by": "tenant:=[" + ",".join(f"`{t}`" for t in TENANTS) + "]",
        "include_fields": "tenant,memory_id,content",
    }
    headers = {"X-TYPESENSE-API-KEY": stack.typesense.api_key}
    async with httpx.AsyncClient(base_url=stack.typesense.url, headers=headers, timeout=120) as ts:
        r = await ts.get(f"/collections/{stack.collection}/documents/export", params=params)
        r.raise_for_status()
    docs: dict[tuple[str, str], str] = {}
    for line in r.text.splitlines():
        if line.strip():
            d = httpx.Response(200, content=line).json()
            docs[(d["tenant"], d["memory_id"])] = d["content"]
    return docs


async def verify(stack: SoakStack, book: Book, drain_timeout: float = 300.0) -> dict[str, Any]:
    """Drain the outbox, then compare what clients were told with both stores."""
    start = time.monotonic()
    async with await psycopg.AsyncConnection.connect(stack.dsn, autocommit=True) as conn:
        while True:
            row = await (await conn.execute("SELECT count(*) FROM outbox WHERE processed_at IS NULL")).fetchone()
            pending = int(row[0]) if row else -1
            if pending == 0 or time.monotonic() - start > drain_timeout:
                break
            await asyncio.sleep(0.2)
        drain_s = time.monotonic() - start
        cur = await conn.execute("SELECT tenant, id, content FROM memories WHERE tenant = ANY(%s)", (TENANTS,))
        pg = {(t, i): c for t, i, c in await cur.fetchall()}
        # Freshness: each outbox row from its write to its application in Typesense.
        cur = await conn.execute(
            "SELECT extract(epoch FROM processed_at - created_at) * 1000 FROM outbox"
            " WHERE tenant = ANY(%s) AND processed_at IS NOT NULL",
            (TENANTS,),
        )
        lag = [float(r[0]) for r in await cur.fetchall()]
    ts = await _read_typesense(stack)
    missing_pg = [k for k, c in book.live.items() if k not in pg]
    missing_ts = [k for k, c in book.live.items() if k not in ts]
    stale_pg = [k for k, c in book.live.items() if k in pg and pg[k] != c]
    stale_ts = [k for k, c in book.live.items() if k in ts and ts[k] != c]
    found = sum(1 for k, c in book.live.items() if pg.get(k) == c and ts.get(k) == c)
    undeleted = [k for k in book.deleted if k in pg or k in ts]
    return {
        "drain_s": drain_s,
        "pending_left": pending,
        "acked_live": len(book.live),
        "acked_deletes": len(book.deleted),
        "uncertain": len(book.uncertain),
        "found": found,
        "deletes_applied": len(book.deleted) - len(undeleted),
        "missing_postgres": len(missing_pg),
        "missing_typesense": len(missing_ts),
        "stale_postgres": len(stale_pg),
        "stale_typesense": len(stale_ts),
        "undeleted": len(undeleted),
        # Documents in Typesense with no row in Postgres (after the drain).
        "orphans_typesense": len(set(ts) - set(pg)),
        "postgres_rows": len(pg),
        "typesense_docs": len(ts),
        "lost": (len(book.live) - found) + len(undeleted),
        "outbox_lag_ms": {"rows": len(lag), "p50": pct(lag, 50), "p99": pct(lag, 99), "max": max(lag, default=None)},
        "lost_examples": [f"{t}/{i}" for t, i in (missing_pg + missing_ts + stale_pg + stale_ts + undeleted)[:10]],
    }


async def _prewarm(stack: SoakStack, pool: list[str]) -> float:
    """One uncounted recall per query text, so the service's query-embedding
    cache holds them all before the clock starts: the rate then loads the
    steady state, not the cache filling (a cold text costs an embedding)."""
    start = time.monotonic()
    tenant = TENANTS[0]
    texts = iter(pool)
    async with httpx.AsyncClient(base_url=stack.url, headers=stack.headers[tenant], timeout=60) as http:

        async def one() -> None:
            for text in texts:
                r = await http.post("/v1/recall", json={"query": text, "sources": ["pgvector"], "top_k": 1})
                r.raise_for_status()

        await asyncio.gather(one(), one())
    return time.monotonic() - start


async def _soak(
    stack: SoakStack, s: SoakSettings, book: Book, samples: list[dict[str, Any]], result: dict[str, Any]
) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        openapi = (await http.get(f"{stack.url}/schema/openapi.json")).raise_for_status().json()
    schema = SchemaCheck(openapi)
    pool = queries(s.queries, s.seed)
    result["prewarm_s"] = await _prewarm(stack, pool)
    print(f"soak: {len(pool)} query texts embedded once in {result['prewarm_s']:.0f} s (not counted)", flush=True)
    t0 = time.monotonic() + 0.5
    end = t0 + s.seconds
    mix = Mix(*s.mix)
    await asyncio.gather(
        run_clients(
            url=stack.url,
            headers=stack.headers,
            clients=s.clients,
            rate=s.rate,
            seconds=s.seconds,
            mix=mix,
            schema=schema,
            pool=pool,
            seed=s.seed,
            book=book,
            t0=t0,
        ),
        _sampler(stack, book, t0, end, s.sample_s, samples),
        _progress(t0, s.seconds, book, samples),
    )
    result.update(load_s=time.monotonic() - t0, mix=mix.describe())
    print(
        f"soak: load done after {result['load_s']:.0f} s; draining the outbox and reading both stores back", flush=True
    )
    result["verify"] = await verify(stack, book)


class _Cap(Exception):
    pass


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise _Cap("soak: hard wall-clock cap reached")


def run_soak(s: SoakSettings, ledger: Ledger, command: str = "") -> dict[str, Any]:
    started = time.monotonic()
    # The cap: asyncio's timeout for the run, and SIGALRM should the loop itself hang.
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(int(s.cap_s) + 60)
    book, samples = Book(), []
    stack = SoakStack(TENANTS, dict(s.service_env))
    result: dict[str, Any] = {}
    error = None
    try:
        print(f"soak: starting Postgres, Typesense and the service under {stack.home}", flush=True)
        stack.start()
        setup_s = time.monotonic() - started
        print(
            f"soak: service up on {stack.url} after {setup_s:.0f} s; {s.minutes:g} min of load, "
            f"{s.clients} clients at {s.rate:g} req/s",
            flush=True,
        )
        result["setup_s"] = setup_s
        asyncio.run(asyncio.wait_for(_soak(stack, s, book, samples, result), timeout=s.cap_s - setup_s))
    except (_Cap, TimeoutError, RuntimeError, OSError, httpx.HTTPError, psycopg.Error) as exc:
        error = f"{type(exc).__name__}: {exc}"
        print(f"soak: aborted: {error}", flush=True)
    finally:
        signal.alarm(0)
        killed = stack.close()
        signal.signal(signal.SIGALRM, previous)
    result.update(
        settings=s.__dict__ | {"cap_s": s.cap_s},
        error=error,
        samples=samples,
        wall_s=time.monotonic() - started,
        leftover_processes=killed,
        service_exit=stack.service_exit,
        service_log_problems=stack.log_problems[:20],
        service_log_problem_count=len(stack.log_problems),
        servers_died=stack.died,
        typesense_restarts=stack.typesense_exits,
        machine=f"{os.cpu_count()} cores, shared by the clients, the service, Postgres and Typesense",
        command=command or "python -m benchmarks.faults.soak " + " ".join(sys.argv[1:]),
    )
    result.update(_counts(book, samples, s, result))
    ledger.record(result["scenario"])
    result["scenario"] = _as_dict(result["scenario"])
    return result


def _as_dict(scenario: Scenario) -> dict[str, Any]:
    return {f: getattr(scenario, f) for f in scenario.__struct_fields__}


def _counts(book: Book, samples: list[dict[str, Any]], s: SoakSettings, result: dict[str, Any]) -> dict[str, Any]:
    done = book.done
    lat = [d.ms for d in done]
    errors = sum(1 for d in done if d.status not in (200, 201))
    server_errors = sum(1 for d in done if d.status >= 500)
    by_status: dict[str, int] = {}
    for d in done:
        by_status[str(d.status)] = by_status.get(str(d.status), 0) + 1
    by_op: dict[str, int] = {}
    for d in done:
        by_op[d.op] = by_op.get(d.op, 0) + 1
    memory = memory_verdict(samples, s.warmup, s.flat_mb)
    checked = result.get("verify") or {}
    acked = checked.get("acked_live", 0) + checked.get("acked_deletes", 0)
    found = checked.get("found", 0) + checked.get("deletes_applied", 0)
    lost = checked.get("lost", 0) if checked else 0
    left = len(result.get("leftover_processes", []))
    p99 = pct(lat, 99)
    steady = [d.ms for d in done if d.t >= s.warmup * s.seconds]
    # Requests started over the load's length; saturated when the clients
    # could not keep the rate (fewer than 95 % sent, or starts over 1 s late).
    achieved = len(book.lag) / s.seconds if result.get("load_s") else float("nan")
    lag_p99 = pct(book.lag, 99) * 1000 if book.lag else float("nan")
    saturated = bool(achieved < 0.95 * s.rate or lag_p99 > 1000) if result.get("load_s") else None
    outcome = (
        f"{'ABORTED: ' + result['error'] + '; ' if result.get('error') else ''}"
        f"{'SATURATED (' + format(achieved, '.1f') + ' of ' + format(s.rate, 'g') + ' req/s sent); ' if saturated else ''}"
        f"p50 {pct(lat, 50):.0f} ms, p99 {p99:.0f} ms (after warm-up {pct(steady, 99):.0f} ms), "
        f"error rate {errors / max(len(done), 1):.2%}; "
        f"RSS {memory['summary']}; "
        f"outbox drained in {checked.get('drain_s', float('nan')):.1f} s; "
        f"{checked.get('uncertain', 0)} ids uncertain (no answer), {book.wrong_ids} wrong-id acks, "
        f"{left} processes left"
        f"{'; died: ' + ', '.join(result['servers_died']) if result.get('servers_died') else ''}"
        f"{'; Typesense crashed and was restarted ' + str(len(result['typesense_restarts'])) + ' time(s): ' + ' | '.join(result['typesense_restarts']) if result.get('typesense_restarts') else ''}"
    )
    scenario = Scenario(
        name=f"soak {s.minutes:g} min, {s.clients} clients at {s.rate:g} req/s",
        kind="soak",
        injected=0,
        load=result.get("mix", ""),
        requests=len(done),
        errors=errors,
        server_errors=server_errors,
        writes_acked=acked,
        writes_found=found,
        lost_writes=lost,
        duplicates=book.duplicates,
        leaks=book.leaks,
        schema_failures=book.schema_failures,
        recovery_s=None,
        outcome=outcome,
    )
    return {
        "scenario": scenario,
        "requests": len(done),
        "by_op": by_op,
        "by_status": by_status,
        "errors": errors,
        "server_errors": server_errors,
        "p50_ms": pct(lat, 50),
        "p99_ms": p99,
        "p99_after_warmup_ms": pct(steady, 99),
        "achieved_rate": achieved,
        "start_lag_p99_ms": lag_p99,
        "saturated": saturated,
        "wrong_ids": book.wrong_ids,
        "memory": memory,
        "per_minute": per_minute(done, samples, s.seconds),
        "examples": book.examples,
    }


def _shares(text: str) -> tuple[float, float, float]:
    parts = [float(x) for x in text.split(",")]
    if len(parts) != 3 or min(parts) < 0 or abs(sum(parts) - 1) > 1e-6:
        raise SystemExit(f"--mix: three shares summing to 1, got {text!r}")
    return parts[0], parts[1], parts[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.faults.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = SoakSettings()
    parser.add_argument("--minutes", type=float, default=d.minutes)
    parser.add_argument("--clients", type=int, default=d.clients)
    parser.add_argument("--rate", type=float, default=d.rate, help="total requests per second")
    parser.add_argument("--sample", type=float, default=d.sample_s, help="seconds between samples")
    parser.add_argument("--flat-mb", type=float, default=d.flat_mb)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--mix",
        default=",".join(f"{x:g}" for x in d.mix),
        metavar="RECALL,WRITE,DELETE",
        help="shares of the operations (default %(default)s)",
    )
    parser.add_argument(
        "--service-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the service (experiments), repeatable",
    )
    parser.add_argument("--ledger", default=os.environ.get("BRAID_FAULT_LEDGER"))
    parser.add_argument("--out", default=str(RESULTS), help="directory for soak.json/.md/.png")
    args = parser.parse_args(argv)
    s = replace(
        d,
        minutes=args.minutes,
        clients=args.clients,
        rate=args.rate,
        sample_s=args.sample,
        flat_mb=args.flat_mb,
        seed=args.seed,
        mix=_shares(args.mix),
        service_env=tuple(tuple(e.split("=", 1)) for e in args.service_env),
    )  # type: ignore[misc]
    result = run_soak(s, Ledger(args.ledger))
    paths = write_outputs(result, args.out)
    sc = result["scenario"]
    print(f"soak: report at {paths[1]}")
    print(
        f"soak: requests={sc['requests']} errors={sc['errors']} server_errors={sc['server_errors']} "
        f"lost_writes={sc['lost_writes']} leaks={sc['leaks']} schema_failures={sc['schema_failures']} "
        f"memory={'flat' if result['memory']['flat'] else 'NOT flat'}"
    )
    bad = result["error"] or sc["lost_writes"] or sc["server_errors"] or sc["leaks"] or sc["schema_failures"]
    return 1 if bad or not result["memory"]["flat"] or result["leftover_processes"] or result["servers_died"] else 0


if __name__ == "__main__":
    sys.exit(main())
