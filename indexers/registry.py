"""The source registry and the fan-out: every source at once, each under its deadline.

A source is a plugin: its module registers a :class:`SourceSpec` (how to build
it from the runtime's parts, its config section's defaults, its capabilities)
with :func:`register`. Nothing else names a source: the runtime builds what is
registered, the engine asks the specs' capabilities, the config takes a
``sources.<name>`` section for each. A source that raises or misses its
deadline contributes nothing and is reported as degraded; the recall still
answers from the others.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio
import msgspec

from config import (
    BraidConfig,
    SourceConfig,
    register_source_config,
    source_defaults,
    unregister_source_config,
)

from .base import BackendError, Hit, SearchQuery, Source

if TYPE_CHECKING:
    from .tracing import Tracing

__all__ = [
    "BOTH",
    "DEGRADED",
    "Match",
    "SourceDeps",
    "SourceResult",
    "SourceSpec",
    "SourceStatus",
    "build_sources",
    "register",
    "registered",
    "search_all",
    "unregister",
]

log = logging.getLogger("braid.recall")


#: ``ok``: answered in time. ``timeout``: no answer within its deadline.
#: ``error``: failed. ``no_vector``: needs the query vector and the recall had
#: none (the query embedding missed its deadline). ``skipped``: not asked for.
SourceStatus = Literal["ok", "timeout", "error", "no_vector", "skipped"]

#: The statuses that name a source in a recall's ``degraded`` list.
DEGRADED: frozenset[str] = frozenset({"timeout", "error", "no_vector"})

NO_VECTOR = "needs the query vector, and the recall has none"

#: What a source matches a query by: its words (``keyword``: terms, names the
#: query mentions) or its embedding (``vector``). A recall's strategy says
#: which of them it allows (:data:`indexers.results.STRATEGY_MATCHES`).
Match = Literal["keyword", "vector"]
BOTH: frozenset[Match] = frozenset(("keyword", "vector"))


class SourceResult(msgspec.Struct):
    status: SourceStatus
    ms: float
    hits: list[Hit] = msgspec.field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class SourceDeps:
    """What the runtime hands a source's factory."""

    #: The Postgres connection pool (``psycopg_pool.AsyncConnectionPool``).
    pool: Any
    #: The Typesense REST client (``indexers.typesense.TypesenseClient``).
    typesense: Any
    #: The config in force, read at every search so a reload applies at once.
    get_config: Callable[[], BraidConfig]
    #: Where a tenant's Typesense searches go: the client of the cluster and
    #: the alias (its group's, or its own pair's once moved:
    #: ``indexers.typesense.TypesenseGroups.route``); ``None``: ``typesense``
    #: and its group's alias, from the config.
    typesense_route: Callable[[str], tuple[Any, str]] | None = None
    #: Whether Typesense may still hold keyword documents with their terms
    #: behind the tenant's whole key (``indexers.sync.TermKeyRewrite``);
    #: ``None``: it holds none.
    term_key_rewrite: Callable[[], bool] | None = None


@dataclass(frozen=True)
class SourceSpec:
    """A registered source."""

    name: str
    build: Callable[[SourceDeps], Source]
    #: Its ``sources.<name>`` section's defaults (a :class:`config.SourceConfig`,
    #: or a subclass with the source's own keys).
    defaults: SourceConfig = SourceConfig()
    #: The backend it reads, as ``/health`` reports it: ``postgres``, ``typesense``
    #: or ``none`` (always up).
    store: str = "postgres"
    #: Its list covers the query vector's nearest memories, so another source
    #: may leave vector search to it (:attr:`SearchQuery.vectors_covered`).
    covers_vectors: bool = False
    #: What it matches a query by; a strategy that allows none of them
    #: leaves it out (``semantic``: vector only, ``keyword``: keyword only).
    matches: frozenset[Match] = BOTH
    #: It searches a copy of Postgres that may lag it (Typesense, fed by the
    #: outbox): the engine checks its memory hits against Postgres (one round
    #: trip) and drops any that is not current, or not current at ``as_of``.
    derived: bool = False


#: Modules whose import registers the built-in sources, in report order.
_BUILTIN = ("indexers.typesense", "indexers.pgvector", "indexers.graph")
_SPECS: dict[str, SourceSpec] = {}


def register(spec: SourceSpec) -> None:
    """Add a source; its config section becomes known as ``sources.<name>``."""
    register_source_config(spec.name, spec.defaults)
    _SPECS[spec.name] = spec


def unregister(name: str) -> None:
    _SPECS.pop(name, None)
    unregister_source_config(name)


def registered() -> dict[str, SourceSpec]:
    """Every registered source, built-ins first, in the order recalls report them."""
    for module in _BUILTIN:
        importlib.import_module(module)
    order = {name: i for i, name in enumerate(source_defaults())}
    return {name: _SPECS[name] for name in sorted(_SPECS, key=lambda n: order.get(n, len(order)))}


def build_sources(deps: SourceDeps, names: Sequence[str] | None = None) -> dict[str, Source]:
    """Build the sources named in ``names`` (default: every registered one)."""
    specs = registered()
    wanted = list(specs) if names is None else list(names)
    unknown = [n for n in wanted if n not in specs]
    if unknown:
        raise ValueError(f"unknown source(s) {unknown}; known: {list(specs)}")
    return {name: specs[name].build(deps) for name in wanted}


async def search_all(
    sources: Mapping[str, Source],
    queries: Mapping[str, SearchQuery],
    cfg: BraidConfig,
    tracing: Tracing | None = None,
) -> dict[str, SourceResult]:
    """Run ``sources[name].search(queries[name])`` concurrently under deadlines.

    A source with no query is reported as skipped; one that needs a vector
    (``Source.needs_vector``, or a query it may match by vector only) and has
    a query without one, as ``no_vector``. With ``tracing``, each source that
    searches does so inside a span of its own (:mod:`indexers.tracing`).
    """
    results: dict[str, SourceResult] = {
        name: SourceResult(status="skipped", ms=0.0) for name in sources if name not in queries
    }

    async def one(name: str, source: Source, query: SearchQuery) -> None:
        if tracing is None:
            results[name] = await searched(name, source, query)
        else:
            with tracing.source(name) as span:
                results[name] = result = await searched(name, source, query)
                tracing.searched(span, result)

    async def searched(name: str, source: Source, query: SearchQuery) -> SourceResult:
        deadline = cfg.source(name).deadline_ms / 1000.0
        start = time.perf_counter()
        result = SourceResult(status="timeout", ms=0.0, error=f"no answer within {deadline * 1000:.0f} ms")
        # anyio's cancellation, not asyncio.timeout (a third of the CPU): on a
        # stalled Postgres, psycopg answers one cancellation by cancelling the
        # query on the server, which stalls too; only a cancellation that goes
        # on being delivered (anyio's) ends it at the deadline.
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
        return result

    async with anyio.create_task_group() as tg:
        for name, source in sources.items():
            if name not in queries:
                continue
            query = queries[name]
            if query.vector is None and (source.needs_vector or "keyword" not in query.matches):
                results[name] = SourceResult(status="no_vector", ms=0.0, error=NO_VECTOR)
            else:
                tg.start_soon(one, name, source, query)
    return {name: results[name] for name in sources}
