"""Postgres CPU per statement of a fused recall, under load (``log_statement_stats``).

``python -m benchmarks.statement_cpu [--size N] [--seconds S] [--clients C]
[--writes RATE] [--set dotted.key=value ...] [--name X]`` loads the load benchmark's corpus
(big tenant of ``N`` memories beside its small tenants, then the
``placement`` job) into the service on the embedded stack, warms up, and turns
on Postgres' ``log_statement_stats`` (``ALTER SYSTEM`` and a reload: every
backend, no restart) for ``S`` seconds of fused recalls (vectors supplied)
from ``C`` clients; with ``--writes``, single writes of the big tenant's
memories (fields, entities, vector; Braid's own extraction as configured)
under new ids at ``RATE`` a second, open loop, for ``S`` seconds, and the
logging lasts until the outbox has applied them all. Each parse, bind and execute message then logs the
backend's ``getrusage`` CPU for it; this sums them by statement, per recall (or per write).
What no message covers (reading the socket, the protocol's sync) shows as
the gap between the backends' total CPU over the logged span and the sum.
Logging costs CPU of its own: read the figures as shares, and compare runs of
this benchmark only. The server's log is read from the postmaster's standard
error (``/proc/<pid>/fd/2``: Linux). Report:
``benchmarks/results/statement-cpu[-<name>].{md,json}``. Last line:
``statement-cpu: size=<n> recalls=<n> backends_ms=<x> attributed_ms=<x> top=<x> ms <statement head>``
(``writes=<n>`` in writes mode; the figures are then per write).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from collections import defaultdict
from typing import Any

import httpx
import msgspec
import psycopg

from benchmarks.common import RESULTS
from benchmarks.load.client import LeanClient
from benchmarks.load.corpus import BIG_TENANT, Corpus, build_corpus
from benchmarks.load.run import loaded_service, paced, timed, wait_drained
from benchmarks.quality.tuning import Override, parse_set

_LINE = re.compile(r"^\S+ \S+ \S+ \[(\d+)\] (LOG|DETAIL|STATEMENT):\s+(.*)$")
_USAGE = re.compile(r"([\d.]+) s user, ([\d.]+) s system, [\d.]+ s elapsed")
_TOTAL = re.compile(r"\[([\d.]+) s user, ([\d.]+) s system total\]")
_KIND = re.compile(r"(\w+(?: \w+)*) STATISTICS")


def parse_log(text: str) -> dict[str, Any]:
    """From a server log with ``log_statement_stats`` on (and
    ``log_min_error_statement`` at ``log``, so each entry names its
    statement): CPU seconds by statement and message kind, the messages by
    statement, and each backend's total CPU at its first and last entry."""
    pending: dict[str, list[Any]] = {}
    by_statement: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    executes: dict[str, int] = defaultdict(int)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _LINE.match(lines[i])
        i += 1
        if not m:
            continue
        pid, tag, rest = m.groups()
        if tag == "LOG" and (kind := _KIND.match(rest)):
            pending[pid] = [kind.group(1), 0.0]
        elif tag == "DETAIL" and pid in pending:
            while i < len(lines) and lines[i].startswith("\t"):
                if u := _USAGE.search(lines[i]):
                    pending[pid][1] = float(u.group(1)) + float(u.group(2))
                if t := _TOTAL.search(lines[i]):
                    total = float(t.group(1)) + float(t.group(2))
                    first.setdefault(pid, total)
                    last[pid] = total
                i += 1
        elif tag == "STATEMENT" and pid in pending:
            statement = rest
            while i < len(lines) and lines[i].startswith("\t"):
                statement += " " + lines[i].strip()
                i += 1
            kind, cpu = pending.pop(pid)
            key = re.sub(r"\s+", " ", statement).strip()[:160]
            by_statement[key][kind] += cpu
            if kind in ("EXECUTE MESSAGE", "QUERY"):
                executes[key] += 1
    return {
        "by_statement": {k: dict(v) for k, v in by_statement.items()},
        "executes": dict(executes),
        "backends_s": sum(last[p] - first[p] for p in last),
    }


async def _writes(
    lean: LeanClient, svc_url: str, headers: dict[str, str], corpus: Corpus, rate: float, seconds: float
) -> dict[str, Any]:
    """Single writes at ``rate`` a second for ``seconds`` (open loop), then
    wait until the outbox has applied them all; the count and errors."""
    big = corpus.tenants[0]
    n = int(rate * seconds)
    errors: list[str] = []

    async def write(i: int) -> None:
        j = i % len(big.memories)
        memory = {**big.memories[j], "id": f"stmt-{i:06d}", "embedding": big.vectors[j].tolist()}
        code, raw = await lean.post("/v1/memories", msgspec.json.encode({"memories": [memory]}), headers)
        if code != 201:
            errors.append(f"write {code} {raw[:120]!r}")

    start = time.perf_counter()
    await asyncio.gather(*await paced(rate, n, write))
    async with httpx.AsyncClient(base_url=svc_url, timeout=300) as health:
        await wait_drained(health)
    return {"n": n, "qps": n / (time.perf_counter() - start), "errors": errors}


async def measure(size: int, seconds: float, clients: int, sets: list[Override], writes: float = 0.0) -> dict[str, Any]:
    corpus = build_corpus(size)
    async with loaded_service(corpus, "braid-statement-cpu-", sets=sets) as (svc, headers):
        dsn = svc.postgres_dsn()
        bodies = [
            msgspec.json.encode({"query": q["text"], "embedding": v.tolist()})
            for q, v in zip(corpus.queries, corpus.query_vectors, strict=True)
        ]
        recall_headers = {**headers[BIG_TENANT], "content-type": "application/json"}
        log_path = f"/proc/{svc.postmaster_pid()}/fd/2"
        async with LeanClient(svc.url, max_connections=64) as lean:
            await timed(lean, recall_headers, bodies, 4, 0)  # warm up
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute("ALTER SYSTEM SET log_statement_stats = on")
                await conn.execute("ALTER SYSTEM SET log_min_error_statement = log")
                await conn.execute("SELECT pg_reload_conf()")
            await asyncio.sleep(1.0)
            start = os.stat(log_path).st_size
            try:
                if writes:
                    row = await _writes(lean, svc.url, recall_headers, corpus, writes, seconds)
                else:
                    row = await timed(lean, recall_headers, bodies, clients, seconds)
            finally:
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                    await conn.execute("ALTER SYSTEM RESET log_statement_stats")
                    await conn.execute("ALTER SYSTEM RESET log_min_error_statement")
                    await conn.execute("SELECT pg_reload_conf()")
            with open(log_path, errors="replace") as f:
                f.seek(start)
                text = f.read()
    parsed = parse_log(text)
    n = row["n"]
    statements = sorted(
        (
            {
                "statement": key,
                "per_recall": parsed["executes"].get(key, 0) / n,
                "ms_per_recall": sum(kinds.values()) * 1000 / n,
                "ms_by_message": {k: v * 1000 / n for k, v in kinds.items()},
            }
            for key, kinds in parsed["by_statement"].items()
        ),
        key=lambda s: -float(s["ms_per_recall"]),
    )
    return {
        "size": size,
        "seconds": seconds,
        "clients": clients,
        "sets": [list(s) for s in sets],
        "writes": writes,
        "write_errors": row.get("errors", []),
        "recalls": n,
        "qps": row["qps"],
        "backends_ms_per_recall": parsed["backends_s"] * 1000 / n,
        "attributed_ms_per_recall": sum(s["ms_per_recall"] for s in statements),
        "statements": statements,
    }


def markdown(report: dict[str, Any], command: str) -> str:
    op = "write" if report.get("writes") else "recall"
    if report.get("writes"):
        what = (
            f"single writes of the big tenant's memories (vectors supplied) at {report['writes']:g}/s for "
            f"{report['seconds']:.0f} s with `log_statement_stats` on until the outbox had applied them: "
            f"{report['recalls']} writes, {len(report['write_errors'])} errors"
        )
    else:
        what = (
            f"fused recalls (vectors supplied) from {report['clients']} clients for {report['seconds']:.0f} s with "
            f"`log_statement_stats` on: {report['recalls']} recalls ({report['qps']:.0f}/s, logging included)"
        )
    lines = [
        f"# Postgres CPU per statement of a fused {op}, under load",
        "",
        f"Command: `{command}`  ",
        f"Load corpus, big tenant of {report['size']} memories beside its small tenants, after the placement job; "
        f"{what}. "
        "CPU is the backends' own `getrusage` per parse, bind and execute message, summed by statement.",
        "",
        f"Backends' CPU over the logged span: {report['backends_ms_per_recall']:.2f} ms a {op}; "
        f"in the messages below: {report['attributed_ms_per_recall']:.2f}.",
        "",
        f"| statement (head) | runs a {op} | CPU ms a {op} |",
        "|---|---|---|",
    ]
    for s in report["statements"][:25]:
        head = s["statement"][:110].replace("|", "\\|")
        lines.append(f"| `{head}` | {s['per_recall']:.2f} | {s['ms_per_recall']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--writes", type=float, default=0.0, help="single writes a second instead of recalls")
    parser.add_argument("--set", dest="sets", action="append", default=[], type=parse_set, metavar="KEY=VALUE")
    parser.add_argument("--name", default="", help="report name suffix")
    args = parser.parse_args()
    report = asyncio.run(measure(args.size, args.seconds, args.clients, args.sets, args.writes))
    command = "python -m benchmarks.statement_cpu " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("statement-cpu" + (f"-{args.name}" if args.name else "") + ".md")
    out.write_text(markdown(report, command))
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    top = report["statements"][0] if report["statements"] else {"ms_per_recall": 0.0, "statement": ""}
    print(
        f"statement-cpu: size={args.size} {'writes' if args.writes else 'recalls'}={report['recalls']}"
        f" backends_ms={report['backends_ms_per_recall']:.2f} attributed_ms={report['attributed_ms_per_recall']:.2f}"
        f" top={top['ms_per_recall']:.2f} ms {top['statement'][:60]}"
    )


if __name__ == "__main__":
    main()
