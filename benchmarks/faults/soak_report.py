"""The soak's figures: the memory verdict, the per-minute table, and
``soak.json`` / ``soak.md`` / ``soak.png``."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from benchmarks.common import pct, pyplot, write_results

_KINDS = ("service", "postgres", "typesense", "client")

__all__ = ["RATE_NOTE", "memory_verdict", "per_minute", "write_outputs"]

#: How the default rate (``soak.DEFAULT_RATE``) was chosen.
RATE_NOTE = (
    "20 requests/s, chosen from CPU per request rather than latency (other test runs shared these "
    "2 cores while it was measured, load average 4-8). On a quiet machine a fused recall at 10k "
    "memories costs about 43 ms of CPU over all processes, a Typesense-only one 25 ms, pgvector or "
    "graph 6-9 ms, a cold query embedding 12 ms more (load-10000.md); this mix then needs about 30 ms "
    "a request once its 400 query texts are cached, about 0.6 core at 20 requests/s: under a third of "
    "the machine, room for the corpus to grow (about 9,000 memories in 10 minutes) without p99 "
    "drifting. Measured for 1 minute each on the shared machine: with the service's torch on one "
    "thread (`--service-env OMP_NUM_THREADS=1`) 20, 30 and 40 requests/s were all sent on time "
    "(stack CPU 0.56, 0.83, 1.11 cores; p99 462, 554, 509 ms, inflated by the other runs); with "
    "torch's 2 intra-op threads (the service's setting then) 20 requests/s saturated (14.9 sent a "
    "second, p99 2.6 s, 0.95 core): under CPU contention one query embedding took about 140 ms of "
    "CPU with 2 torch threads against 12 ms with one. The service now runs torch on one thread "
    "(`embedding.threads: 1`)."
)


def _median_rss(samples: list[dict[str, Any]]) -> float:
    return statistics.median(s["rss_mb"] for s in samples)


def memory_verdict(samples: list[dict[str, Any]], warmup: float, bound_mb: float) -> dict[str, Any]:
    """RSS after warm-up (median of the 3 samples from the end of the first
    ``warmup`` share of the run) against the end (median of the last 3
    samples), and the least-squares slope over the second half in MB/min.
    Flat when the growth is below ``bound_mb``."""
    if len(samples) < 6:
        return {
            "flat": False,
            "warm_mb": None,
            "end_mb": None,
            "growth_mb": None,
            "growth_pct": None,
            "slope_mb_min": None,
            "peak_mb": None,
            "bound_mb": bound_mb,
            "summary": f"too few samples ({len(samples)}) for a verdict",
        }
    span = samples[-1]["t"]
    after = [s for s in samples if s["t"] >= warmup * span]
    warm = _median_rss(after[:3])
    end = _median_rss(samples[-3:])
    half = [s for s in samples if s["t"] >= span / 2]
    slope = _slope([s["t"] / 60 for s in half], [s["rss_mb"] for s in half])
    growth = end - warm
    flat = growth < bound_mb
    return {
        "flat": flat,
        "warm_mb": warm,
        "end_mb": end,
        "growth_mb": growth,
        "growth_pct": growth / warm,
        "slope_mb_min": slope,
        "peak_mb": max(s["rss_mb"] for s in after),
        "bound_mb": bound_mb,
        "summary": (
            f"{warm:.0f} MB after warm-up, {end:.0f} MB at the end (growth {growth:+.1f} MB, "
            f"{growth / warm:+.1%}; second-half slope {slope:+.2f} MB/min): "
            f"{'flat' if flat else 'NOT flat'} (bound {bound_mb:g} MB)"
        ),
    }


def _slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of y over x."""
    if len(x) < 2:
        return float("nan")
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxx = sum((a - mx) ** 2 for a in x)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx if sxx else float("nan")


def per_minute(done: list[Any], samples: list[dict[str, Any]], seconds: float) -> list[dict[str, Any]]:
    """One row a minute of load (requests finishing after the load's end
    count in the last minute); RSS is the last sample of the minute."""
    minutes = max(1, math.ceil(seconds / 60 - 1e-9))
    rows = []
    for m in range(minutes):
        lo, hi = m * 60, (m + 1) * 60
        last = m == minutes - 1
        part = [d for d in done if lo <= d.t and (d.t < hi or last)]
        lat = [d.ms for d in part]
        errors = sum(1 for d in part if d.status not in (200, 201))
        in_minute = [s for s in samples if lo < s["t"] <= hi + (1 if last else 0)]
        rows.append(
            {
                "minute": m + 1,
                "requests": len(part),
                "errors": errors,
                "error_rate": errors / len(part) if part else float("nan"),
                "p50_ms": pct(lat, 50),
                "p99_ms": pct(lat, 99),
                "recall_p99_ms": pct([d.ms for d in part if d.op == "recall"], 99),
                "rss_mb": in_minute[-1]["rss_mb"] if in_minute else float("nan"),
                "outbox_max": max((s["outbox_pending"] or 0 for s in in_minute), default=None),
                # Mean CPU cores by process kind over the minute's samples.
                "cpu": {k: sum(s["cpu"][k] for s in in_minute) / len(in_minute) for k in in_minute[0].get("cpu", {})}
                if in_minute
                else {},
            }
        )
    return rows


def _clean(node: Any) -> Any:
    """NaN to null: the JSON stays strict."""
    if isinstance(node, float) and math.isnan(node):
        return None
    if isinstance(node, dict):
        return {k: _clean(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_clean(v) for v in node]
    return node


def _f(x: Any, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _cpu(cores: dict[str, float] | None) -> str:
    if not cores:
        return "–"
    return " / ".join(f"{cores.get(k, 0.0):.2f}" for k in _KINDS) + f" (sum {sum(cores.values()):.2f})"


def _lag_line(lag: dict[str, Any] | None) -> str:
    if not lag or not lag.get("rows"):
        return "Outbox lag: not measured."
    return (
        f"Outbox lag (each outbox row from its write to its application in Typesense, {lag['rows']} rows): "
        f"p50 {_f(lag['p50'])} ms, p99 {_f(lag['p99'])} ms, max {_f(lag['max'], 0)} ms."
    )


def _markdown(r: dict[str, Any]) -> str:
    s, sc, mem = r["settings"], r["scenario"], r["memory"]
    v = r.get("verify") or {}
    lines = [
        "# Soak",
        "",
        f"`{r['command']}` — {s['minutes']:g} min of load, {s['clients']} clients sharing "
        f"{s['rate']:g} requests/s, loopback only; {r['machine']}.",
        "",
        f"Mix: {r.get('mix', '–')}.",
        "",
        "Service environment: "
        + (", ".join(f"`{k}={v}`" for k, v in s.get("service_env", [])) or "as shipped (nothing added)")
        + ".",
        "",
        f"Rate: {RATE_NOTE}",
        "",
    ]
    if r.get("error"):
        lines += [f"**Aborted:** {r['error']}", ""]
    if r.get("saturated"):
        lines += [
            f"**Saturated:** {r['achieved_rate']:.1f} of {s['rate']:g} requests/s sent, starts up to "
            f"{r['start_lag_p99_ms']:.0f} ms late (p99): latency here measures the queue, not the service at "
            "this rate. Lower `--rate`, or run on a quieter machine.",
            "",
        ]
    lines += [
        f"**Memory:** {mem['summary']}. Warm-up is the first {s['warmup']:.0%} of the run; the service "
        "process alone (Postgres and Typesense are separate processes).",
        "",
        "| requests | sent req/s | errors | 5xx | p50 ms | p99 ms | p99 after warm-up ms | start lag p99 ms "
        "| leaks | duplicates | schema failures |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {r['requests']} | {_f(r['achieved_rate'])} | {r['errors']} | {r['server_errors']} | {_f(r['p50_ms'])} "
        f"| {_f(r['p99_ms'])} | {_f(r.get('p99_after_warmup_ms'))} | {_f(r['start_lag_p99_ms'])} | {sc['leaks']} "
        f"| {sc['duplicates']} | {sc['schema_failures']} |",
        "",
        f"By operation: {', '.join(f'{k} {n}' for k, n in sorted(r['by_op'].items()))}; "
        f"by status: {', '.join(f'{k} {n}' for k, n in sorted(r['by_status'].items()))} (0 = no answer).",
        "",
        "## Acknowledged writes, read back",
        "",
        f"Outbox drained {_f(v.get('drain_s'))} s after the load ({v.get('pending_left', '–')} rows left). "
        "Each acknowledged, not deleted memory must be in Postgres and in Typesense with the content last "
        "acknowledged; each acknowledged delete must be gone from both.",
        "",
        "| acked memories | found in both | missing PG | missing TS | stale PG | stale TS | acked deletes | still present | uncertain | TS orphans | lost |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {v.get('acked_live', '–')} | {v.get('found', '–')} | {v.get('missing_postgres', '–')} "
        f"| {v.get('missing_typesense', '–')} | {v.get('stale_postgres', '–')} | {v.get('stale_typesense', '–')} "
        f"| {v.get('acked_deletes', '–')} | {v.get('undeleted', '–')} | {v.get('uncertain', '–')} "
        f"| {v.get('orphans_typesense', '–')} | {v.get('lost', '–')} |",
        "",
        _lag_line(v.get("outbox_lag_ms")),
        "",
        "## Per minute",
        "",
        "| minute | requests | error rate | p50 ms | p99 ms | recall p99 ms | RSS MB | outbox max "
        "| CPU cores service / postgres / typesense / client |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in r["per_minute"]:
        rate = row["error_rate"]
        lines.append(
            f"| {row['minute']} | {row['requests']} | {'–' if math.isnan(rate) else f'{rate:.2%}'} | {_f(row['p50_ms'])} "
            f"| {_f(row['p99_ms'])} | {_f(row['recall_p99_ms'])} | {_f(row['rss_mb'], 0)} | {_f(row['outbox_max'])} "
            f"| {_cpu(row.get('cpu'))} |"
        )
    lines += [
        "",
        "![error rate, p99 latency and service RSS over time](soak.png)",
        "",
        f"Run: setup {_f(r.get('setup_s'), 0)} s, query texts pre-embedded in {_f(r.get('prewarm_s'), 0)} s, wall {_f(r['wall_s'], 0)} s (cap {s['cap_s']:.0f} s); "
        f"service exit code {r['service_exit']}; {r['service_log_problem_count']} warning/error lines in the "
        f"service log; processes left after stop: {len(r['leftover_processes'])}.",
    ]
    for exit_line in r.get("typesense_restarts", []):
        lines += ["", f"**Typesense crashed and was restarted by the supervisor** ({exit_line})."]
    for kind, what in r.get("servers_died", {}).items():
        lines += ["", f"**{kind} died during the run** ({what.splitlines()[0]}):", "", "```", what, "```"]
    if r["examples"]:
        lines += ["", "First anomalies:", ""] + [f"- `{e}`" for e in r["examples"]]
    if r["service_log_problems"]:
        lines += ["", "Service log (first warning/error lines):", "", "```"] + r["service_log_problems"] + ["```"]
    return "\n".join(lines) + "\n"


def _plot(r: dict[str, Any], path: Path) -> bool:
    plt = pyplot()
    samples = r["samples"]
    if plt is None or not samples:
        return False
    t = [x["t"] / 60 for x in samples]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    ax1.plot(t, [100 * x["errors"] / x["requests"] if x["requests"] else 0 for x in samples], color="tab:red")
    ax1.set_ylabel("error rate %")
    ax1.set_ylim(bottom=0)
    ax2.plot(t, [x["p99_ms"] for x in samples], label="p99 all", color="tab:blue")
    ax2.plot(t, [x["recall_p99_ms"] for x in samples], label="p99 recall", color="tab:cyan", alpha=0.7)
    ax2.plot(t, [x["p50_ms"] for x in samples], label="p50 all", color="tab:gray", alpha=0.7)
    ax2.set_ylabel("latency ms")
    ax2.set_ylim(bottom=0)
    ax2.legend(loc="upper left", fontsize=8)
    ax3.plot(t, [x["rss_mb"] for x in samples], color="tab:green")
    mem = r["memory"]
    span = samples[-1]["t"] / 60
    ax3.axvspan(0, r["settings"]["warmup"] * span, color="0.9", label="warm-up")
    if mem.get("warm_mb") is not None:
        ax3.axhline(
            mem["warm_mb"] + mem["bound_mb"],
            color="tab:red",
            ls="--",
            lw=0.8,
            label=f"flat bound (+{mem['bound_mb']:g} MB)",
        )
    ax3.set_ylabel("service RSS MB")
    ax3.set_xlabel("minutes")
    ax3.legend(loc="lower right", fontsize=8)
    fig.suptitle(
        f"Soak: {r['settings']['clients']} clients, {r['settings']['rate']:g} req/s "
        f"({r['settings']['sample_s']:g} s windows)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_outputs(r: dict[str, Any], out: str | Path) -> tuple[Path, Path, Path]:
    out = Path(out)
    md = write_results("soak", _markdown(r), _clean(r), results=out)
    paths = (out / "soak.json", md, out / "soak.png")
    _plot(r, paths[2])
    return paths
