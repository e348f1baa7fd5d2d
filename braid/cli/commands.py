"""``braid serve``, ``braid recall``, ``braid reindex``, ``braid health``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..client import DEFAULT_URL
from ..errors import Conflict
from ..models import Job, Recall
from ._common import ADMIN_KEY, AGENT_KEY, URL, app, connect, err, fail, out, reporting

__all__ = ["health", "progress_bars", "recall", "reindex", "serve"]


@app.command(rich_help_panel="Service")
def serve(
    port: Annotated[int | None, typer.Option(help="Port (else BRAID_PORT, else server.port).")] = None,
    home: Annotated[Path | None, typer.Option(help="Data directory (else BRAID_HOME, else ./.braid).")] = None,
    config: Annotated[Path | None, typer.Option(help="YAML config (else BRAID_CONFIG, else the shipped one).")] = None,
) -> None:
    """Start the service: embedded Postgres and Typesense (unless the config
    names external ones) and the HTTP API; what `python -m service` and
    `make run` do. Ctrl-C stops everything; SIGHUP reloads the config."""
    for name, value in (("BRAID_PORT", port), ("BRAID_HOME", home), ("BRAID_CONFIG", config)):
        if value is not None:
            os.environ[name] = str(value)
    from service.__main__ import main as run_service  # the server's imports (torch) only here

    raise typer.Exit(run_service())


@app.command(rich_help_panel="Memory")
def recall(
    query: Annotated[str, typer.Argument(help="What to recall.")],
    top_k: Annotated[int | None, typer.Option("--top-k", "-k", help="Items to return.")] = None,
    budget: Annotated[int | None, typer.Option(help="Token budget of the block.")] = None,
    strategy: Annotated[str | None, typer.Option(help="auto, semantic, keyword or recent.")] = None,
    session: Annotated[str | None, typer.Option(help="Only this session_id.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole answer as JSON instead.")] = False,
    url: URL = DEFAULT_URL,
    key: AGENT_KEY = None,
) -> None:
    """Recall: print the memory block, then how each item ranked in each source."""
    with reporting(url), connect(url, key) as client:
        answer = client.recall(query, top_k=top_k, budget_tokens=budget, strategy=strategy, session_id=session)  # type: ignore[arg-type]
    if as_json:
        out.print(msgspec.json.format(msgspec.json.encode(answer)).decode(), markup=False)
        return
    out.print(answer.block or "(no memories)", markup=False)
    err.print()
    err.print(items_table(answer, err.width))
    err.print(sources_table(answer))
    line = f"strategy {answer.strategy}, embedding {answer.embedding_status} ({answer.embedding_ms:.0f} ms), {answer.tokens} tokens"
    if answer.cached:
        line += ", from the cache"
    err.print(line)
    if answer.degraded:
        err.print(f"[yellow]degraded: {', '.join(answer.degraded)}[/]")


def items_table(answer: Recall, width: int = 160) -> Table:
    """One row per item: its rank in each source, the RRF score, the factors
    (and the start of its content when ``width`` leaves room for it)."""
    names = list(answer.sources)
    # Lists that are not sources (the search within the dates a query names, ``dates``) after them.
    names += sorted({s for item in answer.items for s in item.ranks} - set(names))
    table = Table(
        title="items (rank in each source's list; score = rrf × factors)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
    )
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("id", overflow="ellipsis", no_wrap=True, max_width=12)
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("rrf", justify="right", no_wrap=True)
    table.add_column("factors", no_wrap=True)
    table.add_column("score", justify="right", no_wrap=True)
    table.add_column("block", no_wrap=True)
    wide = width >= 120
    if wide:
        table.add_column("content", overflow="ellipsis", no_wrap=True, max_width=48)
    for i, item in enumerate(answer.items, 1):
        ranks = [str(item.ranks[n]) if item.ranks.get(n) is not None else "-" for n in names]
        factors = "\n".join(f"{k} ×{v:.3g}" for k, v in item.factors.items()) or "-"
        shown = "cut" if item.truncated else ("yes" if item.in_block else "no")
        table.add_row(
            str(i),
            escape(item.id),
            *ranks,
            f"{item.rrf_score:.4f}",
            escape(factors),
            f"{item.score:.4f}",
            shown,
            *([escape(item.content)] if wide else []),
        )
    return table


def sources_table(answer: Recall) -> Table:
    table = Table(title="sources", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for column, justify in (("source", "left"), ("status", "left"), ("ms", "right"), ("hits", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    table.add_column("error")
    for name, report in answer.sources.items():
        style = "" if report.status in ("ok", "skipped") else "yellow"
        table.add_row(
            name, report.status, f"{report.ms:.1f}", str(report.hits), escape(report.error or ""), style=style
        )
    return table


@app.command(rich_help_panel="Admin")
def reindex(
    target: Annotated[
        str, typer.Argument(help="typesense, pgvector, all, embeddings, graph, placement or import.")
    ] = "all",
    tier: Annotated[str | None, typer.Option(help="With pgvector or all: only this tier.")] = None,
    tenant: Annotated[str | None, typer.Option(help="With import: the tenant about to be bulk loaded.")] = None,
    job: Annotated[str | None, typer.Option(help="Follow this job instead of starting one.")] = None,
    follow: Annotated[bool, typer.Option(help="Follow the job's progress until it ends.")] = True,
    poll: Annotated[float, typer.Option(help="Seconds between progress reads.", min=0.05)] = 0.5,
    url: URL = DEFAULT_URL,
    key: ADMIN_KEY = None,
) -> None:
    """Start a reindex job (or follow --job) and show its progress until it is
    done. Exit 0 when done, 1 when it failed or was interrupted."""
    with reporting(url), connect(url, key) as client:
        if job is None:
            try:
                job = client.start_reindex(target, tier=tier, tenant=tenant).job_id  # type: ignore[arg-type]
            except Conflict as exc:
                fail(
                    f"a reindex is already queued or running: job {exc.job_id}; follow it with `braid reindex --job {exc.job_id}`"
                )
            err.print(
                f"reindex job {job} started ({target}{f', tier {tier}' if tier else ''}"
                f"{f', tenant {tenant}' if tenant else ''})"
            )
        if not follow:
            out.print(job)
            return
        final = follow_job(client.follow_reindex(job, poll_s=poll))
    if final.status != "done":
        err.print(
            f"[bold red]reindex job {final.job_id} {final.status}[/]: {escape(final.error or 'no error recorded')}"
        )
        raise typer.Exit(1)
    took = (final.finished_at - final.created_at).total_seconds() if final.finished_at else None
    err.print(f"reindex job {final.job_id} done" + (f" in {took:.1f} s" if took is not None else ""))
    out.print(final.job_id)


def progress_bars(progress: dict[str, Any], prefix: str = "") -> dict[str, tuple[str, int, int | None]]:
    """Each part of a job's progress that counts something (a ``done`` and
    maybe a ``total``), as path -> (label, done, total). The service reports
    ``{"typesense": {"phase", "done", "total"}}``, ``{"pgvector": {"tier",
    "done", "total"}}`` and ``{"embeddings": {"memories": {...}, "entities": {...}}}``."""
    bars: dict[str, tuple[str, int, int | None]] = {}
    for name, value in progress.items():
        if not isinstance(value, dict):
            continue
        path = f"{prefix}{name}"
        done = value.get("done")
        if isinstance(done, int):
            total = value.get("total")
            detail = " ".join(str(value[k]) for k in ("phase", "tier") if isinstance(value.get(k), str))
            bars[path] = (f"{path} {detail}".strip(), done, total if isinstance(total, int) else None)
        bars.update(progress_bars(value, f"{path} "))
    return bars


def follow_job(jobs: Any) -> Job:
    """Render each state of a followed job as progress bars; the last state."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    tasks: dict[str, TaskID] = {}
    last: Job | None = None
    with Progress(*columns, console=err, transient=False) as bars:
        status = bars.add_task("queued", total=None)
        for job in jobs:
            last = job
            bars.update(status, description=f"job {job.job_id}: {job.status}")
            for path, (label, done, total) in progress_bars(job.progress).items():
                if path not in tasks:
                    tasks[path] = bars.add_task(label, total=total)
                bars.update(tasks[path], description=label, completed=done, total=total)
            if job.finished:
                bars.update(status, total=1, completed=1)
    assert last is not None
    return last


def _flat(value: Any) -> str:
    """A detail as one cell: a mapping (a source's cache) as ``key=value`` pairs."""
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


@app.command(rich_help_panel="Service")
def health(url: URL = DEFAULT_URL) -> None:
    """Each backend's status; exit 0 when all are up, 1 otherwise."""
    with reporting(url), connect(url, None, needs_key=False, attempts=1) as client:
        answer = client.health()
    table = Table(title=f"Braid at {url}: {answer.status}", title_justify="left")
    table.add_column("backend")
    table.add_column("status")
    table.add_column("detail")
    for name, info in answer.backends.items():
        detail = ", ".join(f"{k} {_flat(v)}" for k, v in info.items() if k != "status" and v is not None)
        table.add_row(name, str(info.get("status")), escape(detail))
    out.print(table)
    raise typer.Exit(0 if answer.ok else 1)
