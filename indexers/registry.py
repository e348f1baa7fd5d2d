"""The source registry and the fan-out: every source at once, each under its deadline.

This is the only place that knows the sources by name. A source that raises
or misses its deadline contributes nothing and is reported as degraded; the
recall still answers from the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import anyio
import msgspec

from config import BraidConfig

from .base import BackendError, Hit, SearchQuery, Source

__all__ = ["DEGRADED", "SourceResult", "SourceStatus", "build_sources", "search_all"]

log = logging.getLogger("braid.recall")


#: ``ok``: answered in time. ``timeout``: no answer within its deadline.
#: ``error``: failed. ``no_vector``: needs the query vector and the recall had
#: none (the query embedding missed its deadline). ``skipped``: not asked for.
SourceStatus = Literal["ok", "timeout", "error", "no_vector", "skipped"]

#: The statuses that name a source in a recall's ``degraded`` list.
DEGRADED: frozenset[str] = frozenset({"timeout", "error", "no_vector"})

NO_VECTOR = "needs the query vector, and the recall has none"


class SourceResult(msgspec.Struct):
    status: SourceStatus
    ms: float
    hits: list[Hit] = msgspec.field(default_factory=list)
    error: str | None = None


def build_sources(
    factories: Mapping[str, Callable[[], Source]], names: Sequence[str]
) -> dict[str, Source]:
    """Instantiate the sources named in ``names`` from their factories."""
    unknown = [n for n in names if n not in factories]
    if unknown:
        raise ValueError(f"unknown source(s) {unknown}; known: {sorted(factories)}")
    return {name: factories[name]() for name in names}


async def search_all(
    sources: Mapping[str, Source],
    queries: Mapping[str, SearchQuery],
    cfg: BraidConfig,
) -> dict[str, SourceResult]:
    """Run ``sources[name].search(queries[name])`` concurrently under deadlines.

    A source with no query is reported as skipped; one that needs a vector
    (``Source.needs_vector``) and has a query without one, as ``no_vector``.
    """
    results: dict[str, SourceResult] = {
        name: SourceResult(status="skipped", ms=0.0) for name in sources if name not in queries
    }

    async def one(name: str, source: Source, query: SearchQuery) -> None:
        deadline = getattr(cfg.sources, name).deadline_ms / 1000.0
        start = time.perf_counter()
        result = SourceResult(status="timeout", ms=0.0, error=f"no answer within {deadline * 1000:.0f} ms")
        with anyio.move_on_after(deadline):
            try:
                hits = await source.search(query)
                result = SourceResult(status="ok", ms=0.0, hits=hits)
            except BackendError as exc:
                log.warning("source %s failed: %s", name, exc)
                result = SourceResult(status="error", ms=0.0, error=str(exc))
            except Exception as exc:  # a bug in one source must not fail the recall
                log.exception("source %s raised unexpectedly", name)
                result = SourceResult(status="error", ms=0.0, error=f"{type(exc).__name__}: {exc}")
        result.ms = round((time.perf_counter() - start) * 1000.0, 3)
        results[name] = result

    async with anyio.create_task_group() as tg:
        for name, source in sources.items():
            if name not in queries:
                continue
            if queries[name].vector is None and source.needs_vector:
                results[name] = SourceResult(status="no_vector", ms=0.0, error=NO_VECTOR)
            else:
                tg.start_soon(one, name, source, queries[name])
    return {name: results[name] for name in sources}
