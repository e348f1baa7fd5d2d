"""Recall latency and HNSW recall on a load run's live stack, its writes paused.

A 1M load (``python -m benchmarks.load --size 1000000``) writes for hours on
2 shared cores. When a session cannot wait for its end, this measures what
the stack holds so far: the load is paused (``kill -STOP <its pid>``), this
runs against the service, Postgres and Typesense it started (found from its
home, ``/tmp/braid-load-*``), and the load is then stopped or resumed.

    python -m benchmarks.load.probe /tmp/braid-load-XXXX --size 1000000

writes ``benchmarks/results/load-probe-<memories in the big tenant>.{md,json}``:
the recall rows with the corpus' vectors supplied (fused and each source, at
each client count), the direct Typesense and pgvector baselines, and each
tier's HNSW recall@10 against exact search (``hnsw.measure_hnsw``), measured
as ``python -m benchmarks.load`` measures them, on the rows written so far.
The corpus is rebuilt from ``--size`` and ``--seed`` (the load's), for its
queries. The figures are of a partial load: not a ``load-<n>`` report, and
``growth`` does not read them.

``--services 1,2 --configs fused --rounds 3`` measures the fused rows sent to
one service process and round robin to two (the load's and a replica of it on
the same backends), alternated three times: on a shared machine whose speed
drifts, only rows measured in turn compare. For the same reason each round
measures the direct baselines too, right after its recall rows, and issue
16's ratios (:func:`.report.targets`: CPU per fused recall against the two
direct queries, fused recalls/s and p50 against the multi_search's) are
computed per round from that round's rows with one service process; the
last line gives their medians and ranges:

    probe: rounds=<r> qps_ratio=<median> (<min>-<max>) p50_ratio=... cpu_ratio=... service_cpu_ms=...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import yaml

from benchmarks.common import RESULTS, ROOT, CpuMeter, Service
from config.loader import parse_config

from .client import LeanClient, Spread
from .corpus import BIG_TENANT, build_corpus
from .hnsw import measure_hnsw
from .report import _direct_table, _f, _hnsw_table, targets
from .run import SOURCES, _encode, _quiet_text, direct_baselines, quiet, search_aliases, timed

__all__ = ["RATIOS", "attach", "big_tenant_key", "probe", "round_ratios", "summary_line"]

#: Issue 16's figures computed per round, as :func:`.report.targets` names them.
RATIOS = ("qps_ratio", "p50_ratio", "cpu_ratio", "service_cpu_ms")


def attach(home: Path) -> Service:
    """A :class:`~benchmarks.common.Service` for the stack a load run started
    in ``home``, without starting or owning it (never ``stop()`` it)."""
    svc = Service.__new__(Service)
    svc.home = home
    svc.root = ROOT
    svc.replicas = []
    # What a replica (Service.add_replica) starts from: the run's config; the
    # agent key is the replica's own (the probe sends the big tenant's key).
    svc.config_text = (home / "braid.yaml").read_text()
    svc.agent_key = ""
    svc.ts_key = (home / "typesense" / "api-key").read_text().strip()
    postmaster = psutil.Process(svc.postmaster_pid())
    typesense = int((home / "typesense" / "typesense.pid").read_text())
    # The service is the Typesense process' parent (it supervises it).
    svc.proc = psutil.Process(typesense).parent()  # type: ignore[assignment]
    assert svc.proc is not None and postmaster.is_running()
    log = (home / "service.log").read_text(errors="replace")
    svc.url = log.split("Braid listening on ", 1)[1].split()[0]
    return svc


def big_tenant_key(cfg_text: str) -> str:
    """The big tenant's API key in a load run's ``braid.yaml``."""
    return str(next(k["key"] for k in yaml.safe_load(cfg_text)["auth"]["keys"] if k.get("tenant") == BIG_TENANT))


async def probe(
    home: Path,
    size: int,
    seed: int,
    clients: tuple[int, ...],
    seconds: float,
    services: tuple[int, ...] = (1,),
    configs: tuple[str, ...] = ("fused", *SOURCES),
    rounds: int = 1,
) -> dict[str, Any]:
    """The probe's report. Each of ``rounds`` measures the recall rows of
    ``configs`` at each client count once per entry of ``services``, in
    turn: the row is sent round robin to that many service processes, the
    load's own and replicas on its backends (:meth:`Service.add_replica`,
    started for the largest entry and stopped at the end)."""
    if not services or min(services) < 1:
        raise ValueError(f"services must be counts of 1 or more, got {services}")
    started = time.perf_counter()
    svc = attach(home)
    try:
        for _ in range(max(services) - 1):
            svc.add_replica()
        return await _probe(svc, size, seed, clients, seconds, services, configs, rounds, started)
    finally:
        svc.stop_replicas()


async def _probe(
    svc: Service,
    size: int,
    seed: int,
    clients: tuple[int, ...],
    seconds: float,
    services: tuple[int, ...],
    configs: tuple[str, ...],
    rounds: int,
    started: float,
) -> dict[str, Any]:
    home = svc.home
    cfg_text = (home / "braid.yaml").read_text()
    cfg = parse_config(cfg_text)
    key = big_tenant_key(cfg_text)
    dsn = svc.postgres_dsn()
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE tier = 'session') FROM memories WHERE tenant = %s",
            (BIG_TENANT,),
        ).fetchone()
        assert row is not None
        held, session = int(row[0]), int(row[1])
    print(f"probe: {held} memories in {BIG_TENANT} ({session} session); building the corpus", flush=True)
    corpus = build_corpus(size, seed=seed)
    meter = CpuMeter(svc.processes)
    report: dict[str, Any] = {"memories": held, "session_rows": session, "size": size, "seed": seed}
    report["quiet_before_recalls"] = await quiet(meter)
    print(f"probe: recall rows {_quiet_text(report['quiet_before_recalls'])}", flush=True)
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    base = [{"query": q["text"], "embedding": v.tolist()} for q, v in zip(corpus.queries, corpus.query_vectors)]
    rows = []
    for url in svc.urls:
        async with LeanClient(url, max_connections=64) as lean:
            await timed(lean, headers, [_encode(b) for b in base[:50]], 4, 0)  # warm the pools
    ts_url = f"http://127.0.0.1:{svc.typesense_port()}"
    async with httpx.AsyncClient(base_url=ts_url, headers={"X-TYPESENSE-API-KEY": svc.ts_key}) as ts:
        keyword, vectors = await search_aliases(ts, dsn, BIG_TENANT)
    report["direct_rounds"] = []
    for turn in range(rounds):
        for label in configs:
            sources = None if label == "fused" else [label]
            bodies = [_encode({**b, "sources": sources} if sources else b) for b in base]
            for n in services:
                async with Spread(svc.urls[:n]) as spread:
                    for c in clients:
                        res = await timed(spread, headers, bodies, c, seconds, meter)
                        rows.append(
                            {
                                "config": label,
                                "clients": c,
                                "services": n,
                                "round": turn,
                                "embedding": "supplied",
                                **res,
                            }
                        )
                        print(
                            f"probe: {label} at {c}, {n} service(s): p50 {res['p50']:.1f} ms, {res['qps']:.0f}/s",
                            flush=True,
                        )
        # The round's baselines right after its recall rows: the ratios compare rows measured together.
        report.setdefault("quiet_before_direct_rounds", []).append(await quiet(meter))
        report["direct_rounds"].append(
            await direct_baselines(dsn, ts_url, svc.ts_key, cfg, corpus, clients, seconds, meter, keyword, vectors)
        )
        print(f"probe: round {turn} direct baselines", flush=True)
    report["recall"] = rows
    report["direct"] = report["direct_rounds"][-1]
    report["ratios"] = round_ratios(report)
    print("probe: hnsw", flush=True)
    report["hnsw"] = await measure_hnsw(dsn, cfg, BIG_TENANT, corpus.query_vectors)
    report["seconds"] = time.perf_counter() - started
    return report


def round_ratios(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 16's figures (:data:`RATIOS`) of each round, from that round's
    fused rows sent to one service process and its direct baselines (``None``
    where the round lacks a row they need: 1 and 8 clients, fused)."""
    out = []
    for turn, direct in enumerate(report.get("direct_rounds", [])):
        recall = [r for r in report["recall"] if r.get("round", 0) == turn and r.get("services", 1) == 1]
        t = targets({"recall": recall, "direct": direct})
        out.append({"round": turn, **{k: t.get(k) for k in RATIOS}})
    return out


def summary_line(report: dict[str, Any]) -> str:
    """The last line: each figure's median over the rounds and its range."""
    rounds = report.get("ratios", [])
    parts = [f"probe: rounds={len(rounds)}"]
    for k in RATIOS:
        values = sorted(r[k] for r in rounds if r.get(k) is not None)
        if not values:
            parts.append(f"{k}=n/a")
            continue
        parts.append(f"{k}={statistics.median(values):.2f} ({values[0]:.2f}-{values[-1]:.2f})")
    return " ".join(parts)


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        f"# Load probe: {report['memories']} memories in the big tenant, writes paused",
        "",
        f"Command: `{command}` on the live stack of `python -m benchmarks.load --size {report['size']}`"
        f" (seed {report['seed']}), paused with `kill -STOP` at {report['memories']} of its"
        f" {report['size']} big-tenant memories ({report['session_rows']} in tier session).  ",
        "A partial load: the recall rows and baselines are measured as `benchmarks.load` measures them,"
        " on the rows written so far. 2 shared cores (client, service, Postgres, Typesense).",
        "",
        "## Recall latency (big tenant, closed loop, corpus vectors supplied)",
        "",
        "Rows with more than one service process were sent round robin to the load's service and replicas of it"
        " on the same backends (`--services`); `service` CPU is theirs together. Rounds alternate the counts.",
        "",
        "| config | service processes | round | clients | n | p50 ms | p99 ms | recalls/s | per-source p50 ms | degraded |"
        " CPU ms per recall (service / Postgres / Typesense / client) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["recall"]:
        src = ", ".join(f"{k} {_f(v)}" for k, v in r["sources_p50"].items())
        cpu = " / ".join(_f(r["cpu_ms"].get(k), 2) for k in ("service", "postgres", "typesense", "client"))
        lines.append(
            f"| {r['config']} | {r.get('services', 1)} | {r.get('round', 0)} | {r['clients']} | {r['n']}"
            f" | {_f(r['p50'])} | {_f(r['p99'])} | {_f(r['qps'], 0)} | {src} | {r['degraded']} | {cpu} |"
        )
    lines += ["", *_direct_table(report["direct"])]
    if len(report.get("direct_rounds", [])) > 1:
        lines += ["", "The table is the last round's; each round measured its own (the JSON report holds them)."]
    ratios = report.get("ratios", [])
    if ratios:
        lines += [
            "",
            "## Issue 16's ratios, round by round",
            "",
            "Each round's fused rows with one service process against that round's direct baselines"
            " (`benchmarks.load.report.targets`): CPU per fused recall at 8 clients / (direct multi_search +"
            " direct pgvector), fused recalls/s at 8 clients / the multi_search's, fused p50 / its p50 at 1"
            " client, and the service's CPU ms per fused recall at 8 clients.",
            "",
            "| round | qps_ratio | p50_ratio | cpu_ratio | service CPU ms |",
            "|---|---|---|---|---|",
        ]
        for r in ratios:
            lines.append(
                f"| {r['round']} | {_f(r['qps_ratio'], 2)} | {_f(r['p50_ratio'], 2)} | {_f(r['cpu_ratio'], 2)}"
                f" | {_f(r['service_cpu_ms'], 2)} |"
            )
        lines += ["", f"`{summary_line(report)}`"]
    lines += ["", *_hnsw_table(report["hnsw"]), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load.probe", description=__doc__)
    parser.add_argument("home", type=Path, help="the load run's home (/tmp/braid-load-*)")
    parser.add_argument("--size", type=int, required=True, help="the load run's --size")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--services", default="1", help="service processes per row, in turn (e.g. 1,2): the load's and replicas of it"
    )
    parser.add_argument("--configs", default=",".join(("fused", *SOURCES)), help="recall rows: fused and/or sources")
    parser.add_argument("--rounds", type=int, default=1, help="times the rows are measured, alternating --services")
    parser.add_argument("--name", default=None, help="report as load-probe-<memories>-<name>")
    args = parser.parse_args()
    clients = tuple(int(c) for c in args.clients.split(","))
    services = tuple(int(n) for n in args.services.split(","))
    configs = tuple(args.configs.split(","))
    unknown = set(configs) - {"fused", *SOURCES}
    if unknown:
        parser.error(f"--configs: unknown {sorted(unknown)} (fused, {', '.join(SOURCES)})")
    report = asyncio.run(
        probe(args.home, args.size, args.seed, clients, args.seconds, services, configs, max(args.rounds, 1))
    )
    command = (
        "python -m benchmarks.load.probe <home> "
        + f"--size {args.size} --clients {args.clients} --services {args.services} --configs {args.configs}"
        + f" --rounds {args.rounds}"
    )
    stem = RESULTS / (f"load-probe-{report['memories']}" + (f"-{args.name}" if args.name else ""))
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    stem.with_suffix(".md").write_text(markdown(report, command))
    print(f"probe: report at {stem}.md", flush=True)
    print(summary_line(report), flush=True)


if __name__ == "__main__":
    main()
