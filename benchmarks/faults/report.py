"""The fault ledger as ``benchmarks/results/faults.md`` and the closing line.

``python -m benchmarks.faults.report`` rewrites the report from the ledger
(``benchmarks/results/faults-ledger.jsonl``) and the last run's pytest
status (``faults-run.json``), prints
``faults: injected=<n> requests=<n> lost_writes=<n> server_errors=<n> leaks=<n> schema_failures=<n>``
as its last line (sums over the ledger), and exits non-zero when pytest
failed or any of lost_writes, server_errors, leaks or schema_failures is
above zero.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.common import RESULTS

from .ledger import Scenario

__all__ = [
    "KIND_ORDER",
    "LEDGER",
    "RUN",
    "SUMMED",
    "Totals",
    "failed",
    "format_table",
    "main",
    "read_ledger",
    "summary_line",
    "totals",
    "write_report",
]

LEDGER = RESULTS / "faults-ledger.jsonl"
#: The pytest part of the last run: exit status, summary line, command.
RUN = RESULTS / "faults-run.json"
#: Groups in report order; other kinds follow, sorted.
KIND_ORDER = ("fault", "bad input", "isolation", "soak")
#: The counts summed over every scenario.
SUMMED = (
    "injected",
    "requests",
    "errors",
    "server_errors",
    "writes_acked",
    "writes_found",
    "lost_writes",
    "duplicates",
    "leaks",
    "schema_failures",
)
#: The counts that fail ``make bench-faults`` when above zero.
MUST_BE_ZERO = ("lost_writes", "server_errors", "leaks", "schema_failures")


class Totals(msgspec.Struct, kw_only=True):
    scenarios: int = 0
    injected: int = 0
    requests: int = 0
    errors: int = 0
    server_errors: int = 0
    writes_acked: int = 0
    writes_found: int = 0
    lost_writes: int = 0
    duplicates: int = 0
    leaks: int = 0
    schema_failures: int = 0


def read_ledger(path: Path) -> list[Scenario]:
    """Every scenario line of the ledger (none if it does not exist)."""
    if not path.exists():
        return []
    decoder = msgspec.json.Decoder(Scenario)
    return [decoder.decode(line) for line in path.read_bytes().splitlines() if line.strip()]


def totals(scenarios: Iterable[Scenario]) -> Totals:
    t = Totals()
    for s in scenarios:
        t.scenarios += 1
        for name in SUMMED:
            setattr(t, name, getattr(t, name) + getattr(s, name))
    return t


def summary_line(t: Totals) -> str:
    return (
        f"faults: injected={t.injected} requests={t.requests} lost_writes={t.lost_writes} "
        f"server_errors={t.server_errors} leaks={t.leaks} schema_failures={t.schema_failures}"
    )


def failed(t: Totals, run: dict[str, Any]) -> list[str]:
    """Why the run fails ([] when it passes): pytest's exit status (no pytest
    run counts as a failure), the counts that must be zero, and the soak's own
    verdicts when it ran (``run["soak"]``: aborted, memory not flat, servers
    that died, processes left behind)."""
    reasons = []
    status = run.get("pytest_exit")
    if status is None:
        reasons.append("no pytest run recorded")
    elif status != 0:
        reasons.append(f"pytest exited with {status}")
    reasons += [f"{name}={getattr(t, name)}" for name in MUST_BE_ZERO if getattr(t, name) > 0]
    soak = run.get("soak")
    if soak is not None:
        if soak.get("error"):
            reasons.append(f"soak aborted ({soak['error']})")
        elif not soak.get("memory_flat"):
            reasons.append("soak memory not flat")
        if soak.get("servers_died"):
            reasons.append(f"soak: {', '.join(soak['servers_died'])} died")
        if soak.get("leftover_processes"):
            reasons.append(f"soak left {soak['leftover_processes']} processes")
    return reasons


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _group(kind: str) -> tuple[int, str]:
    return (KIND_ORDER.index(kind), "") if kind in KIND_ORDER else (len(KIND_ORDER), kind)


_COLUMNS = (
    ("scenario", "name"),
    ("injected", "injected"),
    ("load", "load"),
    ("requests", "requests"),
    ("errors", "errors"),
    ("5xx", "server_errors"),
    ("acked / found", None),
    ("lost", "lost_writes"),
    ("dup", "duplicates"),
    ("leaks", "leaks"),
    ("schema", "schema_failures"),
    ("recovery s", "recovery_s"),
    ("outcome", "outcome"),
)


def format_table(scenarios: list[Scenario]) -> str:
    """Markdown: one table a kind (in :data:`KIND_ORDER`), then the totals."""
    head = "| " + " | ".join(c for c, _ in _COLUMNS) + " |"
    rule = "|" + "|".join("---" if f in ("name", "load", "outcome") else "---:" for _, f in _COLUMNS) + "|"
    out: list[str] = []
    for kind in sorted({s.kind for s in scenarios}, key=_group):
        group = [s for s in scenarios if s.kind == kind]
        out += [f"### {kind} ({len(group)})", "", head, rule]
        for s in group:
            cells = [f"{s.writes_acked} / {s.writes_found}" if f is None else _cell(getattr(s, f)) for _, f in _COLUMNS]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    t = totals(scenarios)
    out += [
        "### Totals",
        "",
        "| scenarios | injected | requests | errors | 5xx | acked / found | lost | dup | leaks | schema |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {t.scenarios} | {t.injected} | {t.requests} | {t.errors} | {t.server_errors} "
        f"| {t.writes_acked} / {t.writes_found} | {t.lost_writes} | {t.duplicates} | {t.leaks} | {t.schema_failures} |",
    ]
    return "\n".join(out) + "\n"


def _soak_section(results: Path) -> list[str]:
    path = results / "soak.json"
    if not path.exists():
        return ["No soak in this run (`--soak-minutes 0`, or it did not finish)."]
    soak = json.loads(path.read_text())
    settings = soak["settings"]
    sent = soak.get("achieved_rate")
    lines = [
        f"{settings['minutes']:g} min, {settings['clients']} clients at {settings['rate']:g} requests/s "
        f"({'–' if sent is None else format(sent, '.1f')} sent a second"
        f"{', SATURATED' if soak.get('saturated') else ''}): {soak['requests']} requests, {soak['errors']} errors, "
        f"p99 {_ms(soak.get('p99_ms'))} ms (after warm-up {_ms(soak.get('p99_after_warmup_ms'))} ms).",
        "",
        f"Memory: {soak['memory']['summary']}.",
        "",
        "Details: [soak.md](soak.md).",
        "",
    ]
    if (results / "soak.png").exists():
        lines += ["![soak: error rate, p99 latency and service RSS over time](soak.png)", ""]
    return lines


def write_report(
    scenarios: list[Scenario], run: dict[str, Any], results: Path = RESULTS, name: str = "faults.md"
) -> Path:
    t = totals(scenarios)
    reasons = failed(t, run)
    lines = [
        "# Faults and abuse",
        "",
        f"`{run.get('command', 'python -m benchmarks.faults')}`; every scenario recorded by a fault or abuse "
        'test (`-m "faults or slow_faults"`) and by the soak, from the ledger '
        "(`faults-ledger.jsonl`, one JSON line a scenario). *errors* are answers a client must handle "
        "(4xx and documented 503 included); *5xx* excludes a documented 503; *lost* are acknowledged "
        "writes missing from a store afterwards; *leaks* rows of another tenant seen by a tenant; "
        "*schema* answers that did not match the served OpenAPI schema.",
        "",
        f"pytest: `{run.get('pytest_summary', 'not run')}` (exit {run.get('pytest_exit', '–')}).",
        "",
        f"Verdict: {'pass' if not reasons else 'FAIL (' + ', '.join(reasons) + ')'}.",
        "",
        "## Scenarios",
        "",
        format_table(scenarios) if scenarios else "No scenario recorded.\n",
        "## Soak",
        "",
        *_soak_section(results),
        "```",
        summary_line(t),
        "```",
    ]
    path = results / name
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> int:
    scenarios = read_ledger(LEDGER)
    run = json.loads(RUN.read_text()) if RUN.exists() else {}
    path = write_report(scenarios, run)
    t = totals(scenarios)
    reasons = failed(t, run)
    print(f"faults: report at {path}" + (f"; FAILED: {', '.join(reasons)}" if reasons else ""))
    print(summary_line(t))
    return 1 if reasons else 0


if __name__ == "__main__":
    sys.exit(main())
