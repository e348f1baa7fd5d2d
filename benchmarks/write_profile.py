"""Where a write's Postgres time goes: ``pg_stat_statements`` over plain-turn writes.

``python -m benchmarks.write_profile [--turns N] [--batch B] [--extract spacy|none]``
starts an embedded Postgres with ``pg_stat_statements`` preloaded, the service
on it (``postgres.dsn``; Typesense embedded as usual), and writes the first
``N`` turns of the first LongMemEval haystacks as plain turns (content,
speaker role, session, date; the service embeds them and, with ``spacy``,
extracts entities and relations), ``B`` a request. It then reports the
statements by total execution time with calls and rows, and the write's CPU
per memory in the service and in Postgres (all its processes).

With ``--recalls N`` it then profiles recalls the same way: after the
outbox has drained, ``N`` recalls (the dataset's questions in turn, text
only, as an agent runtime sends them) one at a time, with their statements
and CPU per recall reported beside the write's.

Report: ``benchmarks/results/write-profile[-<name>].{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import yaml

from benchmarks.common import ROOT, CpuMeter, Service, cpu_per_call, write_results
from benchmarks.quality.tuning import apply_sets, parse_set
from deploy import embedded
from deploy.embedded import EmbeddedPostgres

DATA = ROOT.parent / "shared" / "data" / "longmemeval" / "longmemeval_s_dev.json"


def _turns(path: Path, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for q in json.loads(path.read_text()):
        for sid, date, session in zip(
            q["haystack_session_ids"], q["haystack_dates"], q["haystack_sessions"], strict=True
        ):
            for i, turn in enumerate(session):
                out.append(
                    {
                        "id": f"{sid}-{i}",
                        "content": turn["content"][:32768],
                        "speaker": turn["role"],
                        "session_id": sid,
                        "metadata": {"date": date},
                    }
                )
                if len(out) == n:
                    return out
    return out


def _processes(svc: Service, pg: EmbeddedPostgres) -> Callable[[], dict[str, list[psutil.Process]]]:
    """The service's and Postgres' processes, listed afresh at each reading
    (Postgres forks a backend per connection)."""

    def listed() -> dict[str, list[psutil.Process]]:
        out = {}
        for kind, pid in (("service", svc.proc.pid), ("postgres", pg.pid or 0)):
            try:
                root = psutil.Process(pid)
                out[kind] = [root, *root.children(recursive=True)]
            except psutil.Error:
                out[kind] = []
        return out

    return listed


_TOP = """SELECT total_exec_time, calls, rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 160)
           FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 15"""


def _statements(dsn: str) -> tuple[list[tuple[Any, ...]], float]:
    """The 15 statements with the most execution time, and all statements' total (ms)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(_TOP).fetchall()
        (total,) = conn.execute("SELECT sum(total_exec_time) FROM pg_stat_statements").fetchone() or (0.0,)
    return rows, float(total or 0.0)


def _statement_lines(rows: list[tuple[Any, ...]], total: float, n: int, unit: str) -> list[str]:
    return [
        f"| share | ms a {unit} | calls | rows | statement |",
        "|---|---|---|---|---|",
        *(f"| {t / total:.1%} | {t / n:.2f} | {c} | {r} | `{q.replace('|', '/')}` |" for t, c, r, q in rows),
    ]


def _questions(path: Path) -> list[str]:
    return [q["question"] for q in json.loads(path.read_text())]


def _profile_recalls(client: httpx.Client, dsn: str, questions: list[str], n: int, meter: CpuMeter) -> dict[str, Any]:
    """``n`` recalls one at a time after the outbox drained: CPU and statements per recall."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        health = client.get("/health").json()
        if not health["backends"]["sync"]["pending"]:
            break
        time.sleep(0.5)
    for q in questions[:5]:  # warm-up: prepared statements, caches
        client.post("/v1/recall", json={"query": q}).raise_for_status()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
    c0 = meter()
    t0 = time.perf_counter()
    for i in range(n):
        client.post("/v1/recall", json={"query": questions[i % len(questions)]}).raise_for_status()
    wall = time.perf_counter() - t0
    cpu = cpu_per_call(c0, meter(), n)
    rows, total = _statements(dsn)
    return {
        "recalls": n,
        "wall_s": wall,
        "cpu_ms": cpu,
        "statement_ms": total / n,
        "statements": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=600)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--extract", choices=["spacy", "none"], default="spacy")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--name", default="")
    parser.add_argument("--recalls", type=int, default=0, help="then profile this many recalls")
    parser.add_argument(
        "--set", action="append", default=[], type=parse_set, help="dotted.key=value over the shipped config"
    )
    args = parser.parse_args()
    turns = _turns(args.data, args.turns)
    embedded.POSTGRES_SETTINGS["shared_preload_libraries"] = "pg_stat_statements"
    tmp = Path(tempfile.mkdtemp(prefix="braid-write-profile-"))
    pg = EmbeddedPostgres(tmp / "pg")
    dsn = pg.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    config = yaml.safe_load((ROOT / "config" / "braid.yaml").read_text())
    config["postgres"]["dsn"] = dsn
    config["graph"]["extract"] = args.extract
    config = apply_sets(config, args.set)
    svc = Service(config_text=yaml.safe_dump(config), prefix="braid-write-profile-")
    try:
        with httpx.Client(base_url=svc.url, headers=svc.headers, timeout=120) as client:
            client.post("/v1/memories", json={"memories": [{**turns[0], "id": "warm-up"}]}).raise_for_status()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_stat_statements_reset()")
            meter = CpuMeter(_processes(svc, pg))
            c0 = meter()
            t0 = time.perf_counter()
            for start in range(0, len(turns), args.batch):
                r = client.post("/v1/memories", json={"memories": turns[start : start + args.batch]})
                r.raise_for_status()
                print(f"write-profile: {start + args.batch}/{len(turns)}", flush=True)
            wall = time.perf_counter() - t0
            per = cpu_per_call(c0, meter(), len(turns))
            rows, total = _statements(dsn)
            recalls = (
                _profile_recalls(client, dsn, _questions(args.data), args.recalls, meter) if args.recalls else None
            )
        with psycopg.connect(dsn, autocommit=True) as conn:
            sizes = conn.execute(
                """SELECT c.relname, pg_relation_size(c.oid), pg_total_relation_size(c.oid) FROM pg_class c
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE c.relkind = 'r' AND n.nspname = 'public' ORDER BY 3 DESC LIMIT 6"""
            ).fetchall()
            tables = conn.execute(
                """SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
                   WHERE n_tup_upd > 0 ORDER BY n_tup_upd DESC"""
            ).fetchall()
    finally:
        svc.stop()
        pg.stop()
    n = len(turns)
    chars = sum(len(t["content"]) for t in turns) / n
    name = f"write-profile-{args.name}" if args.name else "write-profile"
    lines = [
        "# Where a write's Postgres time goes",
        "",
        f"Command: `python -m benchmarks.write_profile --turns {args.turns} --batch {args.batch} --extract {args.extract}"
        + "".join(f" --set {k}={v}" for k, v in args.set)
        + (f" --recalls {args.recalls}" if args.recalls else "")
        + (f" --name {args.name}`" if args.name else "`"),
        "",
        f"{n} LongMemEval turns (mean {chars:.0f} characters), plain turns, {args.batch} a request, the service"
        f" embedding them, `graph.extract: {args.extract}`: {n / wall:.1f} memories/s; CPU ms a memory: service"
        f" {per['service']:.1f}, Postgres {per['postgres']:.1f}. Statement time (`pg_stat_statements`, all"
        f" statements) {float(total) / n:.1f} ms a memory.",
        "",
        *_statement_lines(rows, total, n, "memory"),
        "",
        "Rows updated in place (HOT: no new index entries) against all updated, since the service started:",
        "",
        "| table | inserted | updated | of which HOT |",
        "|---|---|---|---|",
        *(f"| {t} | {i} | {u} | {h} |" for t, i, u, h in tables),
        "",
        "Largest tables (heap / with indexes and TOAST): "
        + ", ".join(f"`{t}` {h / 2**20:.1f} / {a / 2**20:.1f} MiB" for t, h, a in sizes)
        + ".",
    ]
    if recalls:
        r = recalls
        lines += [
            "",
            "## Recalls",
            "",
            f"{r['recalls']} recalls one at a time (the dataset's questions in turn, text only) in the tenant just"
            f" written, after the outbox drained: {r['recalls'] / r['wall_s']:.1f} recalls/s; CPU ms a recall:"
            f" service {r['cpu_ms']['service']:.1f}, Postgres {r['cpu_ms']['postgres']:.1f}. Statement time"
            f" {r['statement_ms']:.2f} ms a recall.",
            "",
            *_statement_lines(r["statements"], r["statement_ms"] * r["recalls"], r["recalls"], "recall"),
        ]
    data = {
        "turns": n,
        "wall_s": wall,
        "cpu_ms": per,
        "statements": [list(map(str, r)) for r in rows],
        "tables": [list(map(str, r)) for r in tables],
        "sizes": [list(map(str, r)) for r in sizes],
    }
    if recalls:
        data["recalls"] = {**recalls, "statements": [list(map(str, r)) for r in recalls["statements"]]}
    path = write_results(name, "\n".join(lines) + "\n", data)
    print(f"wrote {path}")
    print(f"write-profile: turns={n} service_cpu_ms={per['service']:.1f} postgres_cpu_ms={per['postgres']:.1f}")


if __name__ == "__main__":
    main()
