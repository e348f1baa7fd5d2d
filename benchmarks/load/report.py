"""Markdown, JSON and a plot for one load run, plus the one-line summary."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, pyplot, write_results

#: The recall row whose vectors are the service model's own for the query
#: texts: the base the text-only rows are read against.
MODEL_SUPPLIED = "supplied, model's vectors"

__all__ = ["hnsw_min_recall", "summary_line", "write_report"]


def _f(x: Any, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def hnsw_min_recall(result: Any) -> float:
    """Smallest number found under a key naming ``recall`` anywhere in the hnsw result."""
    found: list[float] = []

    def walk(node: Any, recall: bool) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, recall or "recall" in str(k).lower())
        elif isinstance(node, list):
            for v in node:
                walk(v, recall)
        elif recall and isinstance(node, (int, float)) and not isinstance(node, bool):
            found.append(float(node))

    walk(result or {}, False)
    return min(found) if found else float("nan")


def _fused8(report: dict[str, Any]) -> dict[str, Any] | None:
    """The fused row at 8 clients (``None``: a run with other client counts)."""
    return next(
        (r for r in report["recall"] if r["config"] == "fused" and r["clients"] == 8 and r["embedding"] == "supplied"),
        None,
    )


def _row(rows: list[dict[str, Any]], clients: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["clients"] == clients), None)


def _sum(cpu: dict[str, float], kinds: tuple[str, ...]) -> float:
    return sum(cpu.get(k, 0.0) for k in kinds)


#: CPU counted for a fused recall (the load client is the agent runtime's side)...
FUSED_KINDS = ("service", "postgres", "typesense")
#: ...and for a direct query: the backend's and the process that sent it (it
#: does what the service does for a recall: send the query, take the answer).
DIRECT_KINDS = ("postgres", "typesense", "client")


def targets(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 16's ratios from one run (``None`` where a figure was not measured):
    CPU per fused recall at 8 clients against one direct Typesense multi_search
    plus one direct pgvector query at 8 clients; fused recalls/s at 8 clients
    against the multi_search's; fused p50 at 1 client against its p50; the
    service's CPU per fused recall; what a cold and a cached query embedding
    add to it; Typesense freshness p99 at 50 writes/s (probed, and from the
    outbox's record with nothing probing); and CPU per written memory (load +
    outbox drain) against raw import + raw COPY."""
    direct = report.get("direct", {})
    ts_rows, pg_rows = direct.get("typesense"), direct.get("pgvector")
    if not isinstance(ts_rows, list) or not isinstance(pg_rows, list):
        return {}
    fused = {(r["clients"], r["embedding"]): r for r in report["recall"] if r["config"] == "fused"}
    f8, f1 = fused.get((8, "supplied")), fused.get((1, "supplied"))
    ts8, ts1, pg8 = _row(ts_rows, 8), _row(ts_rows, 1), _row(pg_rows, 8)
    out: dict[str, Any] = {}
    if f8 and ts8 and pg8:
        direct_cpu = _sum(ts8["cpu_ms"], DIRECT_KINDS) + _sum(pg8["cpu_ms"], DIRECT_KINDS)
        out["fused_cpu_ms"] = _sum(f8["cpu_ms"], FUSED_KINDS)
        out["direct_cpu_ms"] = direct_cpu
        out["cpu_ratio"] = out["fused_cpu_ms"] / direct_cpu
        out["service_cpu_ms"] = f8["cpu_ms"].get("service", 0.0)
        out["direct_qps"] = ts8["qps"]
        out["qps_ratio"] = f8["qps"] / ts8["qps"]
    if f1 and ts1:
        out["p50_ratio"] = f1["p50"] / ts1["p50"]
        cold, cached = fused.get((1, "text only, cold")), fused.get((1, "text only, cached"))
        # The row searching with the vectors the text-only rows search with;
        # reports from before it existed fall back to the corpus' vectors.
        same = fused.get((1, MODEL_SUPPLIED))
        base = (same or f1)["cpu_ms"].get("service", 0.0)
        out["embedding_base"] = MODEL_SUPPLIED if same else "supplied"
        if cold and cached:
            out["cold_embedding_cpu_ms"] = cold["cpu_ms"].get("service", 0.0) - base
            out["cached_embedding_cpu_ms"] = cached["cpu_ms"].get("service", 0.0) - base
    fifty = report.get("freshness", {}).get("50")
    if fifty:
        out["freshness_p99_ms"] = fifty["typesense"]["p99"]
    raw_ts, raw_pg = report.get("raw_typesense", {}), report.get("raw_postgres", {})
    drained = report.get("drain", {}).get("cpu_ms_per_memory")
    if drained and raw_ts.get("cpu_ms_per_doc") and raw_pg.get("cpu_ms_per_row"):
        kinds = ("service", "postgres", "typesense", "client")
        out["write_cpu_ms"] = _sum(drained, kinds)
        out["raw_write_cpu_ms"] = _sum(raw_ts["cpu_ms_per_doc"], kinds) + _sum(raw_pg["cpu_ms_per_row"], kinds)
        out["write_cpu_ratio"] = out["write_cpu_ms"] / out["raw_write_cpu_ms"]
    steady = report.get("steady", {}).get("50")
    if steady:
        out["steady_outbox_p99_ms"] = steady["outbox_ms"]["p99"]
        if "fresh_ms" in steady:  # reports from before it was measured have none
            out["steady_fresh_p99_ms"] = steady["fresh_ms"]["p99"]
        if "raw_write_cpu_ms" in out:
            kinds = ("service", "postgres", "typesense", "client")
            out["steady_write_cpu_ms"] = _sum(steady["cpu_ms_per_write"], kinds)
            out["steady_write_cpu_ratio"] = out["steady_write_cpu_ms"] / out["raw_write_cpu_ms"]
    return out


def summary_line(report: dict[str, Any]) -> str:
    f = _fused8(report)
    t = targets(report)
    ratios = " ".join(
        f"{k}={_f(t.get(k), 2 if 'ratio' in k else 0)}" for k in ("direct_qps", "qps_ratio", "p50_ratio", "cpu_ratio")
    )
    fused = (
        "p50_ms=n/a p99_ms=n/a qps=n/a"  # no 8-client row to read them from
        if f is None
        else f"p50_ms={f['p50']:.1f} p99_ms={f['p99']:.1f} qps={f['qps']:.0f}"
    )
    return f"load: size={report['size']} {fused} {ratios} hnsw_recall={hnsw_min_recall(report.get('hnsw')):.3f}"


def _direct_filter(direct: dict[str, Any]) -> str:
    """How the direct Typesense baseline named the big tenant (reports from
    before ``tenant_filter`` always sent the filter)."""
    if direct.get("tenant_filter", True):
        return "tenant filter"
    return "no tenant filter (the big tenant's own pair: every document is its own, as Braid's search sends none)"


def _cpu(by_kind: dict[str, float] | None) -> str:
    """CPU ms by process kind, in a fixed order; n/a for reports from before it was measured."""
    if not by_kind:
        return "n/a"
    kinds = ("service", "postgres", "typesense", "client")
    return (
        " / ".join(f"{by_kind.get(k, 0.0):.2f}" for k in kinds)
        + f" (sum {sum(by_kind.get(k, 0.0) for k in kinds):.2f})"
    )


def _placement_row(placement: dict[str, Any] | None) -> str:
    """The ``placement`` job, run after the load or during it (``--place-at``;
    absent from older reports)."""
    if placement is None:
        return "| placement job after the load | not run |"
    own = placement["progress"].get("pgvector", {}).get("indexes", [])
    moved = placement["progress"].get("placement", {}).get("tenants", [])
    built = ", ".join(f"{i['tenant']}/{i['tier']} ({i['memories']})" for i in own) or "none"
    at = placement.get("at_memories")
    when = "after the load" if at is None else f"once {at} memories were in (writes paused, outbox drained)"
    compact = placement["progress"].get("compact")
    if compact is None:
        compacted = ""  # a Braid from before the jobs compacted Typesense
    else:
        answers = sorted(set(compact.get("nodes", {}).values())) or ["no node"]
        compacted = f"; Typesense stores compacted: {', '.join(answers)} ({compact.get('seconds', 0):.2f} s)"
    return (
        f"| placement job {when} | {placement['seconds']:.1f} s; own HNSW indexes: {built};"
        f" Typesense pairs of their own: {', '.join(moved) or 'none'}{compacted} |"
    )


def _import_row(prepared: dict[str, Any] | None) -> str | None:
    """The ``import`` job run for the big tenant before the load (``--import``)."""
    if prepared is None:
        return None
    done = prepared["progress"]["import"]
    alias = done.get("typesense", {}).get("alias", "none")
    reserved = ", ".join(f"{done['tenant']}/{tier}" for tier in done["reserved"]) or "none"
    return (
        f"| import job before the load (`--import`) | {prepared['seconds']:.1f} s; own HNSW indexes reserved:"
        f" {reserved}; Typesense pair of its own: {alias} |"
    )


def _settle_row(settle: dict[str, Any] | None) -> str:
    """Postgres left with no maintenance pending before the raw baselines
    (absent from older reports, whose raw phases could absorb autovacuum)."""
    if settle is None:
        return "| Postgres settled before the raw baselines | no (older run) |"
    return (
        f"| Postgres settled before the raw baselines (autovacuum waited for, then `VACUUM (ANALYZE)`) |"
        f" {settle['seconds']:.1f} s; autovacuum workers running when it began: {settle['autovacuum_workers']} |"
    )


def _row_waits(rows: list[dict[str, Any]]) -> list[str]:
    """The waits for an idle stack between the recall rows (none in reports
    from before them, whose rows could absorb what the one before left running)."""
    waits = [(r, q) for r in rows if (q := r.get("quiet_before")) is not None]
    if not waits:
        return []
    cells = ", ".join(
        f"{r['config']} {r['embedding']} {r['clients']}: {q['seconds']:.0f} s{'' if q['idle'] else ' (still busy)'}"
        for r, q in waits
    )
    return [
        "",
        "Before each row after the first the stack was left to go idle (every server process under 5% of a core"
        f" for 3 s), so a row is not charged for what the one before left running: {cells}.",
    ]


def _flush_row(report: dict[str, Any]) -> str | None:
    """How long Typesense took to compact its store before the recall rows
    and before the direct baselines (:func:`~.run.flush_typesense`; absent
    from older reports, whose rows read a store with however many write
    requests it held then)."""
    flushes = (
        ("before the recall rows", report.get("flush_before_recalls")),
        ("before the direct baselines", report.get("flush_before_direct")),
    )
    seen = [f"{label}: {f['seconds']:.1f} s" for label, f in flushes if f is not None]
    if not seen:
        return None
    return (
        "| Typesense store compacted (memtable flushed), so both read phases read it in the same state"
        f' (docs/design.md, "Write requests tax every hit until a flush") | {"; ".join(seen)} |'
    )


def _quiet_row(report: dict[str, Any]) -> str:
    """What the stack spent on its own after the load's drain, before the
    recall rows and before the direct baselines, waited out so no row is
    charged for it (absent from older reports, whose rows could absorb it)."""
    waits = (
        ("after the drain", report.get("drain", {}).get("quiet")),
        ("before the recall rows", report.get("quiet_before_recalls")),
        ("before the direct baselines", report.get("quiet_before_direct")),
    )
    seen = [(label, q) for label, q in waits if q is not None]
    if not seen:
        return "| waited for an idle stack before metered phases | no (older run) |"
    q0 = seen[0][1]
    cells = "; ".join(
        f"{label}: {q['seconds']:.0f} s{'' if q['idle'] else ' (still busy)'}, CPU ms {_cpu(q['cpu_ms'])}"
        for label, q in seen
    )
    return (
        f"| waited for an idle stack (every server process under {q0['idle_share']:.0%} of a core"
        f" for {q0['idle_for_s']:.0f} s; CPU ms spent waiting, service / Postgres / Typesense / client) | {cells} |"
    )


def _services_text(services: int) -> list[str]:
    """What the recall rows were sent to, when more than one service process served them."""
    if services <= 1:
        return []
    return [
        "",
        f"**{services} service processes** on the same Postgres and Typesense (`--services {services}`, the "
        "Kubernetes Deployment's shape on one machine): the rows with vectors supplied go to them round robin, "
        "the text-only rows and every write to the first (the replica's background workers, such as the outbox's, "
        "run as the first's do); `service` CPU is theirs together.",
    ]


def _markdown(report: dict[str, Any]) -> str:
    w, raw, d = report["write"], report["raw_typesense"], report["drain"]
    lines = [
        f"# Load: {report['size']} memories in the big tenant (embedded stack, one machine)",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['machine']}  ",
        f"Corpus: {report['corpus']}  ",
        f"Whole run: {report['wall_s']:.0f} s wall (corpus build {report['corpus_s']:.0f} s).",
        "",
        "## Writes",
        "",
        "| measure | value |",
        "|---|---|",
        f"| memories written (all tenants) | {w['memories']} |",
        f"| batch / concurrent writers | {w['batch']} / {w['writers']} (largest body {w['body_bytes_max'] / 1e6:.2f} MB) |",
        f"| Braid write throughput, ack (embeddings supplied) | **{w['per_s']:.0f} memories/s** ({w['seconds']:.1f} s) |",
        f"| batch latency p50 / p99 | {_f(w['batch_ms']['p50'])} / {_f(w['batch_ms']['p99'])} ms |",
        f"| outbox drain after the last ack | {d['seconds']:.1f} s (pending left {d['pending_left']}) |",
        f"| Braid end to end into Typesense (load + drain) | {w['to_typesense_per_s']:.0f} memories/s |",
        f"| raw Typesense import, same fields + 384-d vector, same batch/writers | **{raw['per_s']:.0f} docs/s** ({raw['docs']} docs, {raw['failures']} failed) |",
        f"| ratio Braid ack / raw Typesense | {raw['braid_ratio']:.2f} |",
        f"| ratio Braid into Typesense / raw Typesense | {raw['braid_ratio_to_typesense']:.2f} |",
        f"| CPU ms per memory while loading (service / Postgres / Typesense / client) | {_cpu(w.get('cpu_ms_per_memory'))} |",
        f"| CPU ms per memory, load + outbox drain | {_cpu(d.get('cpu_ms_per_memory'))} |",
        f"| CPU ms per document, raw Typesense import | {_cpu(raw.get('cpu_ms_per_doc'))} |",
        f"| CPU ms per row, raw Postgres `COPY` (into a copy of `memories` with its indexes; {report.get('raw_postgres', {}).get('rows', '–')} rows) | {_cpu(report.get('raw_postgres', {}).get('cpu_ms_per_row'))} |",
        f"| write errors | {w['error_count']} {'; '.join(w['errors'][:3])} |",
        f"| graph load | {report['graph_load']['relations']} relations in {report['graph_load']['seconds']:.1f} s, errors {len(report['graph_load']['errors'])} |",
        *filter(None, [_import_row(report.get("import"))]),
        _placement_row(report.get("placement")),
        _settle_row(report.get("settle")),
        *filter(None, [_flush_row(report)]),
        _quiet_row(report),
        "",
        "## Freshness (single writes at a steady rate; ack → visible)",
        "",
        "Open loop: writes are sent at the target rate whatever the answers; `acked/s` = acks / (last ack - start). "
        "One write in `check every` is probed: its document polled by id on Typesense every 2 ms, and "
        "(pgvector and graph share Postgres with the write) looked up with one recall restricted to each source "
        "(pgvector: the memory's own vector + its unique session id; graph: the memory's own entity, created "
        "beforehand), repeated every 2 ms until found; the time is when that recall returned it. "
        "`outbox` is the server's own record, untouched by the probes: outbox row inserted (in the write's "
        "transaction) → Typesense import acknowledged. CPU: ms per write of service / Postgres / Typesense / "
        "client, probes included.",
        "",
        "| target rate /s | acked /s | check every | ack p50 / p99 ms | Typesense p50 / p99 ms (n) | outbox p50 / p99 ms (n) | pgvector p50 / p99 ms (n) | graph p50 / p99 ms (n) | CPU ms per write | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rate, f in report["freshness"].items():
        # Reports from before the outbox figure existed show it as "–".
        f = {"outbox_ms": {"n": 0, "p50": float("nan"), "p99": float("nan")}, **f}
        cells = " | ".join(
            f"{_f(f[s]['p50'])} / {_f(f[s]['p99'])}"
            + (f" ({f[s]['n']})" if s in ("typesense", "outbox_ms", "pgvector", "graph") else "")
            for s in ("ack_ms", "typesense", "outbox_ms", "pgvector", "graph")
        )
        lines.append(
            f"| {rate} | {f['acked_per_s']:.0f} | {f['check_every']} | {cells} | {_cpu(f.get('cpu_ms_per_write'))} | {f['error_count']}: {'; '.join(f['errors'][:2])} |"
        )
    lines += _steady_table(report.get("steady"))
    lines += [
        "",
        "## Recall latency (big tenant, closed loop)",
        "",
        f"Each row: `clients` concurrent clients for {report['seconds']:.0f} s (text-only rows: one pass over the "
        "distinct query texts). Overhead = end-to-end − slowest source that answered `ok` (per request, p50); "
        "ratio = end-to-end / that source (p50 of per-request ratios). Per-source ms are the server's own "
        "`sources.<name>.ms`, over `ok` answers only. In rows with `degraded` requests a timed-out source "
        "(deadline 1000 ms) is not the slowest counted, so there overhead and ratio include the wait for it; "
        "`n`, percentiles and recalls/s count every 200 answer, degraded or not.",
        *_services_text(report.get("services", 1)),
        "",
        "| config | embedding | clients | n | p50 ms | p95 ms | p99 ms | recalls/s | per-source p50 ms | overhead p50 ms | ratio p50 | embedding_ms p50 | non-200 | degraded |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["recall"]:
        src = ", ".join(f"{k} {v:.1f}" for k, v in r["sources_p50"].items())
        bad = sum(v for k, v in r["status"].items() if k != "200")
        lines.append(
            f"| {r['config']} | {r['embedding']} | {r['clients']} | {r['n']} | {_f(r['p50'])} | {_f(r['p95'])} | {_f(r['p99'])} "
            f"| {r['qps']:.0f} | {src} | {_f(r['overhead_p50'])} | {_f(r['ratio_p50'], 2)} | {_f(r['embedding_ms_p50'], 2)} | {bad} | {r['degraded']} |"
        )
    lines += _row_waits(report["recall"])
    lines += _cpu_table(report["recall"])
    if report.get("cache"):
        lines += [
            "",
            "## Repeated recall: the result cache (big tenant, 1 client)",
            "",
            f"The same 20 fused recalls (vectors supplied) cycled for {report['seconds']:.0f} s with nothing "
            "written in between: computed every time (`cache.ttlMs: 0`, shipped), then with `cache.ttlMs` "
            "on (a config reload), where each answer costs one Postgres read of the tenant's write generation.",
            "",
            "| cache | n | served from cache | p50 ms | p95 ms | p99 ms | recalls/s | CPU ms per recall (service / postgres / typesense) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in report["cache"]:
            cpu = r.get("cpu_ms") or {}
            lines.append(
                f"| {r['cache']} | {r['n']} | {r['cached']} | {_f(r['p50'], 2)} | {_f(r['p95'], 2)} | {_f(r['p99'], 2)} "
                f"| {r['qps']:.0f} | "
                + " / ".join(_f(cpu.get(k), 2) for k in ("service", "postgres", "typesense"))
                + " |"
            )
    lines += _direct_table(report.get("direct", {}))
    lines += _targets_table(targets(report))
    lines += [
        "",
        "## HNSW recall (benchmarks/load/hnsw.py)",
        "",
    ]
    lines += _hnsw_table(report.get("hnsw"))
    lines += ["", f"Health at the end: `{json.dumps(report['health_end'])}`"]
    if report.get("graph_cache_before_recalls") is not None:  # reports from before it was read lack it
        lines += [
            "",
            f"Graph copies in the service before the recall rows: `{json.dumps(report['graph_cache_before_recalls'])}`",
        ]
    return "\n".join(lines) + "\n"


def _cpu_table(rows: list[dict[str, Any]]) -> list[str]:
    """The recall rows' CPU per recall by process, and the Postgres sessions each opened."""
    lines = [
        "",
        "## Where the CPU goes (ms of CPU per recall, by process, same rows)",
        "",
        "Read from the processes' CPU counters around each row (psutil): the service (Python), "
        "Postgres (its long-lived backends), Typesense, and the load client itself. On 2 cores, "
        "recalls/s can never exceed 2000 / (sum of the row's CPU ms). `pg sessions`: the sessions "
        "Postgres opened during the row (`pg_stat_database.sessions`): once warm, the service's pool opens one "
        "only to replace a connection it closed (or one past its hour's lifetime), and the meter misses a "
        "backend that lived between two readings.",
        "",
        "| config | embedding | clients | service | postgres | typesense | client | sum | 2000 / sum | pg sessions |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu = r.get("cpu_ms") or {}
        if not cpu:
            continue
        total = sum(cpu.values())
        lines.append(
            f"| {r['config']} | {r['embedding']} | {r['clients']} | "
            + " | ".join(_f(cpu.get(k), 2) for k in ("service", "postgres", "typesense", "client"))
            + f" | {_f(total, 2)} | {2000 / total:.0f} | {r.get('pg_sessions', '-')} |"
        )
    return lines


def _steady_table(steady: dict[str, Any] | None) -> list[str]:
    if not steady:  # reports from before it was measured
        return []
    lines = [
        "",
        "## Steady writes (single writes at a steady rate, nothing probing them)",
        "",
        "Open loop, one memory of the big tenant's corpus a write (its fields, entities and vector) under a new id. "
        "CPU: ms per write by process (service / Postgres / Typesense / client), from the first write until the "
        "outbox has applied them all. `outbox`: the server's own record, row inserted in the write's transaction → "
        "Typesense import acknowledged (keyword and vector documents). `ack → in Typesense`: from the moment the "
        "client had the write's ack to that acknowledgement (the outbox row's `processed_at`; the client and "
        "Postgres read the machine's one wall clock), 0 when the import came first: the freshness a client sees, "
        "with nothing polling for it.",
        "",
        "| target rate /s | writes | acked /s | ack p50 / p99 ms | outbox p50 / p99 ms (n) "
        "| ack → in Typesense p50 / p99 ms (n) | drained after | CPU ms per write | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rate, f in steady.items():
        lines.append(
            f"| {rate} | {f['writes']} | {f['acked_per_s']:.0f} | {_f(f['ack_ms']['p50'])} / {_f(f['ack_ms']['p99'])} "
            f"| {_p50_p99(f['outbox_ms'])} | {_p50_p99(f.get('fresh_ms'))} | {f['drain_s']:.1f} s "
            f"| {_cpu(f.get('cpu_ms_per_write'))} | {f['error_count']}: {'; '.join(f['errors'][:2])} |"
        )
    return lines


def _p50_p99(figures: dict[str, Any] | None) -> str:
    """``p50 / p99 (n)`` of a latency's stats; ``–`` when it was not measured."""
    if figures is None:
        return "–"
    return f"{_f(figures['p50'])} / {_f(figures['p99'])} ({figures['n']})"


def _keyword_only(direct: dict[str, Any]) -> bool:
    """The direct Typesense baseline searched keywords alone (``typesense.vectors: none``);
    reports from before the key was recorded searched vectors too."""
    return "vector_collection" in direct and direct["vector_collection"] is None


def _direct_vectors(direct: dict[str, Any]) -> str:
    if _keyword_only(direct):
        return "alone (`typesense.vectors: none`: Typesense holds no vectors to search) "
    return f"and a vector search in `{direct.get('vector_collection', 'braid_memories')}` "


def _direct_table(direct: dict[str, Any]) -> list[str]:
    dp, dt = direct.get("pgvector"), direct.get("typesense")
    if not isinstance(dp, list) or not isinstance(dt, list):  # reports from before they were metered
        return []
    lines = [
        "",
        "## Direct baselines (the queries a user would run by hand, same queries, same meter)",
        "",
        f"pgvector: one prepared `SELECT id FROM memories WHERE tenant = $1 AND tier = 'session' ORDER BY embedding "
        f"<=> $2 LIMIT 10` per query (HNSW, ef_search {direct.get('ef_search')}, iterative scan; each execution "
        "planned for its values, `plan_cache_mode = force_custom_plan`), one connection per "
        "client. Typesense: one `POST /multi_search` per query with a keyword search (`q` = the query text over "
        f"content and context) in `{direct.get('keyword_collection', 'braid_memories')}` {_direct_vectors(direct)}"
        "(Braid's aliases), "
        f"{_direct_filter(direct)}, the source's "
        "`candidates` hits each, the embedding not sent back, bodies encoded beforehand. CPU: ms per query by "
        "process (`client` = the process sending them).",
        "",
        "| baseline | clients | n | p50 ms | p99 ms | queries/s | CPU ms per query (service / Postgres / Typesense / client) |",
        "|---|---|---|---|---|---|---|",
    ]
    typesense = (
        "Typesense keyword multi_search (no vectors in Typesense)"
        if _keyword_only(direct)
        else "Typesense keyword + vector multi_search"
    )
    for label, rows in (("pgvector HNSW query", dp), (typesense, dt)):
        for r in rows:
            lines.append(
                f"| {label} | {r['clients']} | {r['n']} | {_f(r['p50'], 2)} | {_f(r['p99'], 2)} | {r['qps']:.0f} "
                f"| {_cpu(r['cpu_ms'])} |"
            )
    return lines


def _targets_table(t: dict[str, Any]) -> list[str]:
    if not t:
        return []

    def row(name: str, value: str, target: str, ok: bool | None) -> str:
        return f"| {name} | {value} | {target} | {'–' if ok is None else 'yes' if ok else 'no'} |"

    def get(key: str) -> float | None:
        v = t.get(key)
        return None if v is None else float(v)

    cpu, qps, p50, svc = get("cpu_ratio"), get("qps_ratio"), get("p50_ratio"), get("service_cpu_ms")
    cold, cached = get("cold_embedding_cpu_ms"), get("cached_embedding_cpu_ms")
    fresh, write = get("freshness_p99_ms"), get("write_cpu_ratio")
    lag, unprobed = get("steady_outbox_p99_ms"), get("steady_fresh_p99_ms")
    base = t.get("embedding_base", "supplied")
    return [
        "",
        "## Issue 16's targets, from this run",
        "",
        "CPU counted: for a fused recall the service, Postgres and Typesense; for a direct query its backend and "
        "the process that sent it (it does the service's part: send, take the answer).",
        "",
        "| measure | this run | target | met |",
        "|---|---|---|---|",
        row(
            "CPU per fused recall / (direct multi_search + direct pgvector), 8 clients",
            f"{_f(t.get('fused_cpu_ms'), 2)} / {_f(t.get('direct_cpu_ms'), 2)} ms = {_f(cpu, 2)}",
            "≤ 1.5",
            None if cpu is None else cpu <= 1.5,
        ),
        row(
            "fused recalls/s / direct multi_search/s, 8 clients",
            _f(qps, 2),
            "≥ 0.7",
            None if qps is None else qps >= 0.7,
        ),
        row("fused p50 / direct multi_search p50, 1 client", _f(p50, 2), "≤ 1.3", None if p50 is None else p50 <= 1.3),
        row("service CPU per fused recall, 8 clients", f"{_f(svc, 2)} ms", "≤ 3 ms", None if svc is None else svc <= 3),
        row(
            f"service CPU a cached query embedding adds, 1 client (against `{base}`)",
            f"{_f(cached, 2)} ms",
            "≈ 0",
            None,
        ),
        row(
            f"service CPU a cold query embedding adds, 1 client (against `{base}`)",
            f"{_f(cold, 2)} ms",
            "≤ 4 ms",
            None if cold is None else cold <= 4,
        ),
        row(
            "Typesense freshness p99 at 50 writes/s, nothing probing (ack → import acknowledged, outbox record)",
            f"{_f(unprobed, 1)} ms",
            "≤ 50 ms",
            None if unprobed is None else unprobed <= 50,
        ),
        row(
            "Typesense freshness p99 at 50 writes/s, probed (Typesense polled every 2 ms, pgvector and graph "
            "recalled every 2 ms beside it)",
            f"{_f(fresh, 1)} ms",
            "≤ 50 ms",
            None if fresh is None else fresh <= 50,
        ),
        row(
            "CPU per written memory (load + drain) / (raw import per doc + raw COPY per row)",
            f"{_f(t.get('write_cpu_ms'), 2)} / {_f(t.get('raw_write_cpu_ms'), 2)} ms = {_f(write, 2)}",
            "≤ 1.5",
            None if write is None else write <= 1.5,
        ),
        row(
            "Typesense lag (outbox) p99 at 50 writes/s, nothing probing",
            f"{_f(lag, 1)} ms",
            "≤ 50 ms",
            None if lag is None else lag <= 50,
        ),
        row(
            "CPU per written memory at 50 writes/s, nothing probing / (raw import per doc + raw COPY per row)",
            f"{_f(t.get('steady_write_cpu_ms'), 2)} / {_f(t.get('raw_write_cpu_ms'), 2)} ms "
            f"= {_f(t.get('steady_write_cpu_ratio'), 2)}",
            "≤ 1.5",
            None if t.get("steady_write_cpu_ratio") is None else t["steady_write_cpu_ratio"] <= 1.5,
        ),
    ]


def _hnsw_table(hnsw: dict[str, Any] | None) -> list[str]:
    if not hnsw or "tiers" not in hnsw:
        return [f"Not measured: `{json.dumps(hnsw)}`"]
    lines = [
        f"Tenant `{hnsw['tenant']}`, {hnsw['queries']} queries, recall@{hnsw['k']} against exact search "
        "(the full curves are in the JSON), at the efSearch the service uses for the index (`efSearchAt`'s step "
        "for its rows; reports before it was read show the tier's `efSearch`).",
        "",
        "| tier | rows | m / efConstruction (built) | efSearch | recall@10 | p50 ms | efSearch for 0.95 / 0.98 / 0.99 | index used |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in hnsw["tiers"].items():
        if "skipped" in t:
            lines.append(f"| {name} | {t['rows']} | | | skipped: {t['skipped']} | | | |")
            continue
        built = t.get("built_with") or {}
        need = " / ".join(str(v) if v is not None else "—" for v in t["ef_needed"].values())
        lines.append(
            f"| {name} | {t['rows']} | {built.get('m')} / {built.get('ef_construction')} | {t['ef_search']} "
            f"| {t['recall']:.3f} | {_f(t['latency_p50_ms'], 2)} | {need} | {t['index_used']} |"
        )
    lines += ["", f"Smallest recall over tiers: {hnsw_min_recall(hnsw):.3f}"]
    return lines


def _plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    rows = [r for r in report["recall"] if r["embedding"] == "supplied"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(1, len(configs), figsize=(4 * len(configs), 4), sharey=True)
    for ax, config in zip(axes, configs):
        sel = sorted((r for r in rows if r["config"] == config), key=lambda r: r["clients"])
        x = [r["clients"] for r in sel]
        for p in ("p50", "p95", "p99"):
            ax.plot(x, [r[p] for r in sel], marker="o", label=p)
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(c) for c in x])
        ax.set_yscale("log")
        ax.set_title(config)
        ax.set_xlabel("concurrent clients")
    axes[0].set_ylabel("recall latency, ms (log)")
    axes[0].legend()
    fig.suptitle(f"Braid recall latency, {report['size']} memories, embedding supplied (2 cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_report(report: dict[str, Any], suffix: str | None = None) -> Path:
    """Write ``load-<size>[-<suffix>].{md,json,png}``; returns the Markdown's path."""
    name = f"load-{report['size']}" + (f"-{suffix}" if suffix else "")
    slim = {**report, "recall": [{k: v for k, v in r.items() if k != "latencies"} for r in report["recall"]]}
    md = write_results(name, _markdown(report), slim)
    _plot(report, RESULTS / f"{name}.png")
    return md
