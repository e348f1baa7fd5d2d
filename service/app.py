"""The Litestar application: routes, auth, dependency injection, lifespan.

``create_app(settings)`` builds the app; its lifespan opens the runtime
(pools, clients, model, outbox worker) and closes it on shutdown. Handlers
are thin: decode a Struct, call one engine method, return a Struct.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Annotated, Any

import anyio
import msgspec
from litestar import Litestar, Request, Response, delete, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import ResponseHeader, State
from litestar.di import NamedDependency, Provide
from litestar.enums import RequestEncodingType
from litestar.exceptions import (
    NotAuthorizedException,
    NotFoundException,
    PermissionDeniedException,
    TooManyRequestsException,
)
from litestar.handlers import BaseRouteHandler, HTTPRouteHandler
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.spec import Components, Example, SecurityScheme
from litestar.params import Body, FromPath, FromQuery, HeaderParameter, JSONBody
from litestar.status_codes import HTTP_201_CREATED, HTTP_202_ACCEPTED

from config import ConfigError, ConfigHolder, MetricsConfig, TracesConfig
from indexers.base import postgres_errors
from indexers.engine import Engine
from indexers.lifecycle import Forgetting
from indexers.postgres import PING_TIMEOUT_S, format_lsn, parse_lsn, tenant_counts
from indexers.runtime import Backends, Runtime, open_runtime

from . import validate
from .auth import Keyring, Principal, RateLimiter, retry_after_header
from .decode import BraidRequest
from .errors import exception_handlers, problem_responses
from .metrics import Metrics
from .schemas import (
    GRAPH_EXAMPLE,
    RECALL_EXAMPLE,
    WRITE_EXAMPLE,
    BodySchemaPlugin,
    DeletedOut,
    EntityDeletedOut,
    GraphIn,
    GraphOut,
    HealthOut,
    IdsOut,
    JobOut,
    JobStartedOut,
    MemoriesIn,
    MemoryOut,
    RecallIn,
    RecallOut,
    ReindexIn,
    RelationsDeletedOut,
    ReloadOut,
    StatsOut,
    VersionsOut,
)
from .validate import InputError, memory_writes, recall_options

__all__ = ["AppSettings", "create_app"]

log = logging.getLogger("braid")


class AppSettings(msgspec.Struct):
    config: ConfigHolder
    backends: Backends
    keyring: Keyring
    #: An already loaded embedder to share (tests); None loads the model.
    embedder: Any = None
    #: Once the runtime is open, collect and then freeze (``gc.freeze``)
    #: everything alive: the imports, the model and the spaCy pipeline stay
    #: for the process's life, and without this every full collection scans
    #: them again while requests wait. For a process that serves one app
    #: (``python -m service``); objects alive then are never freed. The
    #: youngest generation is then collected every :data:`GEN0_THRESHOLD`
    #: new containers instead of 700.
    settle_heap: bool = False
    #: Called after the admin route reloaded the config (not after SIGHUP):
    #: in a child of a service with ``server.workers`` above 1, it has the
    #: other children reload too (``service.__main__.reload_siblings``).
    on_reload: Callable[[], None] | None = None


#: The youngest generation's threshold in a serving process (CPython's is
#: 700 containers allocated net of those freed). A fused recall makes about
#: that many, so at 700 a collection ran about once a recall and scanned what
#: the recalls in flight still held, promoting it to be scanned again
#: (docs/design.md, "Where the service's CPU goes").
GEN0_THRESHOLD = 10_000


# --- dependencies -------------------------------------------------------------


def _runtime(state: State) -> Runtime:
    return state.runtime  # type: ignore[no-any-return]


async def provide_engine(state: State) -> Engine:
    return _runtime(state).engine


async def authenticate(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard: the key, then the key's rate limit. A guard runs before the body is
    read, so a request without a valid key gets its 401 whatever its body."""
    header = connection.headers.get("authorization", "")
    scheme, _sep, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise NotAuthorizedException("missing API key: send `Authorization: Bearer <key>`")
    keyring: Keyring = connection.app.state.keyring
    who = keyring.lookup(key.strip())
    if who is None:
        raise NotAuthorizedException("invalid API key")
    limits = _runtime(connection.app.state).engine.config.current.limits
    wait = connection.app.state.rate_limiter.take(who.key_id, limits.rate_per_second, limits.rate_burst)
    if wait > 0:
        raise TooManyRequestsException(
            f"rate limit: this key may send {limits.rate_per_second:g} requests a second "
            f"(bursts of {limits.rate_burst}); retry after the time in Retry-After",
            headers={"Retry-After": retry_after_header(wait)},
        )
    connection.state.principal = who


async def require_admin(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard, after :func:`authenticate`: only admin keys go on."""
    if connection.state.principal.role != "admin":
        raise PermissionDeniedException("this endpoint needs an admin key")


async def provide_principal(request: Request[Any, Any, State]) -> Principal:
    return request.state.principal  # type: ignore[no-any-return]


AGENT = [authenticate]
ADMIN = [authenticate, require_admin]


#: A write's answer carries the primary's WAL position after it (with
#: ``postgres.replicaDsn``); a recall that brings it back reads a replica only
#: once it has replayed that far, whichever process serves it.
LSN_HEADER = "Braid-Lsn"

_LSN_DOC = ResponseHeader(
    name=LSN_HEADER,
    documentation_only=True,
    description="With a read replica (`postgres.replicaDsn`): the primary's WAL position after this write; "
    "a recall sending it back sees the write through any Braid process",
)


def v1(
    kind: Callable[..., HTTPRouteHandler],
    path: str,
    summary: str,
    *errors: int,
    status_code: int = 200,
    writes: bool = False,
) -> HTTPRouteHandler:
    """An agent route: the key's guard, its status, and the error answers it
    documents; ``writes``: its answer carries ``Braid-Lsn`` (with a replica)."""
    headers = [_LSN_DOC] if writes else None
    return kind(
        path,
        guards=AGENT,
        status_code=status_code,
        summary=summary,
        responses=problem_responses(*errors),
        response_headers=headers,
    )


def _json(summary: str, example: dict[str, Any]) -> Any:
    """A JSON request body documented with one example (schemathesis sends it too)."""
    return Body(media_type=RequestEncodingType.JSON, examples=[Example(summary=summary, value=example)])


WriteBody = Annotated[MemoriesIn, _json("A fact said in a conversation", WRITE_EXAMPLE)]
GraphBody = Annotated[GraphIn, _json("Two entities and their relation", GRAPH_EXAMPLE)]
RecallBody = Annotated[RecallIn, _json("What to remember for this turn", RECALL_EXAMPLE)]


#: A recall's ``Braid-Lsn`` request header (optional).
LsnHeader = Annotated[
    str | None,
    HeaderParameter(name=LSN_HEADER, description="A write's `Braid-Lsn`: the recall sees that write", required=False),
]


def _lsn(engine: Engine, tenant: str) -> dict[str, str]:
    """The ``Braid-Lsn`` header of a write's answer (none without a replica)."""
    lsn = engine.last_write(tenant)
    return {} if lsn is None else {LSN_HEADER: format_lsn(lsn)}


# --- handlers -----------------------------------------------------------------


@v1(post, "/v1/memories", "Write memories", 400, 401, 413, 415, 429, 503, status_code=HTTP_201_CREATED, writes=True)
async def write_memories(
    data: WriteBody, principal: NamedDependency[Principal], engine: NamedDependency[Engine]
) -> Response[IdsOut]:
    writes = memory_writes(data, engine.config.current)
    written = await engine.write_memories(principal.tenant, writes)
    body = IdsOut(ids=written.ids, superseded=written.superseded)
    return Response(body, status_code=HTTP_201_CREATED, headers=_lsn(engine, principal.tenant))


@v1(delete, "/v1/memories/{memory_id:path}", "Delete a memory from every store", 400, 401, 404, 429, 503, writes=True)
async def delete_memory(
    memory_id: FromPath[str],
    principal: NamedDependency[Principal],
    engine: NamedDependency[Engine],
    restore_previous: FromQuery[bool] = False,
) -> Response[DeletedOut]:
    mid = validate.memory_id(memory_id)
    deleted = await engine.delete_memory(principal.tenant, mid, restore_previous=restore_previous)
    if deleted is None:
        raise NotFoundException(f"no memory {mid!r}")
    body = DeletedOut(deleted=deleted.deleted, restored=deleted.restored)
    return Response(body, headers=_lsn(engine, principal.tenant))


@v1(get, "/v1/memories/{memory_id:path}", "One memory with its lifecycle", 400, 401, 404, 429, 503)
async def get_memory(
    memory_id: FromPath[str], principal: NamedDependency[Principal], engine: NamedDependency[Engine]
) -> MemoryOut:
    mid = validate.memory_id(memory_id)
    record = await engine.memory(principal.tenant, mid)
    if record is None:
        raise NotFoundException(f"no memory {mid!r}")
    return MemoryOut.of(record)


@v1(get, "/v1/memories", "The versions of one mem_key, newest first", 400, 401, 429, 503)
async def list_versions(
    principal: NamedDependency[Principal],
    engine: NamedDependency[Engine],
    mem_key: FromQuery[str | None] = None,
    limit: FromQuery[int] = 100,
) -> VersionsOut:
    key = validate.mem_key(mem_key)
    records = await engine.versions(principal.tenant, key, validate.versions_limit(limit))
    return VersionsOut(mem_key=key, memories=[MemoryOut.of(r) for r in records])


@v1(
    post,
    "/v1/graph",
    "Write entities and relations",
    400,
    401,
    413,
    415,
    429,
    503,
    status_code=HTTP_201_CREATED,
    writes=True,
)
async def write_graph(
    data: GraphBody, principal: NamedDependency[Principal], engine: NamedDependency[Engine]
) -> Response[GraphOut]:
    graph = validate.graph_write(data, engine.config.current)
    body = GraphOut(**await engine.write_graph(principal.tenant, graph))
    return Response(body, status_code=HTTP_201_CREATED, headers=_lsn(engine, principal.tenant))


@v1(
    delete,
    "/v1/graph/relations",
    "Delete the relations from one entity to another (one relation name, or all)",
    400,
    401,
    404,
    429,
    503,
    writes=True,
)
async def delete_relations(
    source: FromQuery[str],
    target: FromQuery[str],
    principal: NamedDependency[Principal],
    engine: NamedDependency[Engine],
    relation: FromQuery[str | None] = None,
) -> Response[RelationsDeletedOut]:
    src, dst, rel = validate.relation_key(source, target, relation)
    count = await engine.delete_relations(principal.tenant, src, dst, rel)
    if count == 0:
        named = f"{rel!r} relation" if rel is not None else "relation"
        raise NotFoundException(f"no {named} from {src!r} to {dst!r}")
    return Response(RelationsDeletedOut(deleted=count), headers=_lsn(engine, principal.tenant))


@v1(
    delete,
    "/v1/graph/entities/{name:path}",
    "Delete an entity with its relations and mentions (memories stay)",
    400,
    401,
    404,
    429,
    503,
    writes=True,
)
async def delete_entity(
    name: FromPath[str], principal: NamedDependency[Principal], engine: NamedDependency[Engine]
) -> Response[EntityDeletedOut]:
    entity = validate.entity_name(name)
    relations = await engine.delete_entity(principal.tenant, entity)
    if relations is None:
        raise NotFoundException(f"no entity {entity!r}")
    return Response(EntityDeletedOut(deleted=entity, relations=relations), headers=_lsn(engine, principal.tenant))


@v1(post, "/v1/recall", "Recall: the pre-inference memory block", 400, 401, 413, 415, 429, 503)
async def recall(
    data: RecallBody, principal: NamedDependency[Principal], engine: NamedDependency[Engine], lsn: LsnHeader = None
) -> RecallOut:
    opts = recall_options(data, engine.config.current)
    return await engine.recall(principal.tenant, opts, at_least=_at_least(lsn))


def _at_least(header: str | None) -> int:
    if header is None:
        return 0
    try:
        return parse_lsn(header)
    except ValueError as exc:
        raise validate.InputError(f"{LSN_HEADER}: {exc}") from None


@post(
    "/admin/reindex",
    status_code=HTTP_202_ACCEPTED,
    guards=ADMIN,
    summary="Rebuild Typesense and/or pgvector indexes online (one job at a time)",
    responses=problem_responses(400, 401, 403, 409, 413, 415, 429, 503),
)
async def start_reindex(data: JSONBody[ReindexIn], state: State) -> JobStartedOut:
    validate.reindex(data, _runtime(state).engine.config.current)
    job_id = await _runtime(state).jobs.start(data.target, data.tier, tenant=data.tenant)
    return JobStartedOut(job_id=job_id)


@get(
    "/admin/reindex/{job_id:str}",
    guards=ADMIN,
    summary="Status and progress of a reindex job",
    responses=problem_responses(400, 401, 403, 404, 429, 503),
)
async def reindex_status(job_id: FromPath[str], state: State) -> JobOut:
    job = await _runtime(state).jobs.get(job_id)
    if job is None:
        raise NotFoundException(f"no reindex job {job_id!r}")
    return JobOut(job_id=job.pop("id"), **job)


@post(
    "/admin/config/reload",
    status_code=200,
    guards=ADMIN,
    summary="Re-read the YAML config without a restart",
    responses=problem_responses(400, 401, 403, 429),
)
async def reload_config(engine: NamedDependency[Engine], state: State) -> ReloadOut:
    try:
        report = await engine.reload_config()
    except ConfigError as exc:
        raise InputError(f"config not reloaded, the running config stays: {exc}") from None
    if (siblings := state.get("on_reload")) is not None:
        siblings()
    return ReloadOut(
        reloaded=True,
        path=str(engine.config.path),
        restart_required=report.restart_required,
        reindex_required=report.reindex_required,
    )


@get(
    "/admin/stats",
    guards=ADMIN,
    summary="Per tenant: memories by tier and embedding model, superseded, expired, outbox pending",
    responses=problem_responses(400, 401, 403, 429, 503),
)
async def stats(engine: NamedDependency[Engine], tenant: FromQuery[str | None] = None) -> StatsOut:
    name = validate.tenant(tenant)
    with postgres_errors("read"):
        counts = await tenant_counts(engine.store.pool, Forgetting.from_config(engine.config.current), name)
    return StatsOut.of(engine.embedder.model, counts)


@get(
    "/health",
    summary="Each backend's status: 200 when all are up, 503 otherwise",
    # No key needed: an empty requirement lifts the schema-wide bearer requirement.
    security=[{}],
    responses={
        503: ResponseSpec(
            data_container=HealthOut,
            generate_examples=False,
            description="A backend is down; `backends` says which",
        )
    },
)
async def health(state: State) -> Response[HealthOut]:
    rt = _runtime(state)
    backends: dict[str, dict[str, Any]] = {}
    pg_up = await rt.store.ping()
    ts_up = await rt.index.ready()
    pending = None
    if pg_up:
        # Bounded like the ping: a Postgres that stalls now must not hang /health.
        with anyio.move_on_after(PING_TIMEOUT_S):
            pending = await rt.sync.pending()
    stores = {"postgres": pg_up, "typesense": ts_up}
    for name in rt.engine.sources:
        store = rt.specs[name].store if name in rt.specs else "none"
        backends[name] = {"status": "up" if stores.get(store, True) else "down", "store": store}
        if store == "typesense":
            backends[name]["node"] = rt.typesense.active_node
        # A source with a cache of its own says how it goes (the graph's walk in the service).
        stats = getattr(rt.engine.sources[name], "stats", None)
        if callable(stats):
            backends[name]["cache"] = stats()
    backends["sync"] = {
        "status": "up" if pg_up and rt.sync.last_error is None else "lagging",
        "pending": pending,
        "error": rt.sync.last_error,
    }
    ok = pg_up and ts_up
    body = HealthOut(
        status="ok" if ok else "degraded",
        backends=backends,
        bookkeeping=rt.bookkeeper.stats(),
        lifecycle=rt.sweeper.stats(),
        cache=rt.engine.cache.stats(),
        extraction=rt.engine.extraction,
        # Never a 503 for the replica: recalls read the primary while it is down.
        replica=None if rt.engine.replica is None else rt.engine.replica.router.stats(),
    )
    return Response(body, status_code=200 if ok else 503)


def metrics_route(metrics: Metrics, cfg: MetricsConfig) -> HTTPRouteHandler:
    """``GET <metrics.path>``: this process's metrics for Prometheus, with the
    key ``metrics.auth`` asks for. Not in the OpenAPI schema: it is not JSON,
    and its path is the config's."""

    async def scrape(request: Request[Any, Any, State]) -> Response[bytes]:
        body, content_type = await metrics.exposition(request.headers.get("accept", ""))
        # As prometheus-client names it (Litestar would add a second charset).
        return Response(body, media_type="text/plain", headers={"content-type": content_type})

    guards = ADMIN if cfg.auth == "admin" else []
    return get(cfg.path, guards=guards, include_in_schema=False, name="metrics")(scrape)


@asynccontextmanager
async def tracing(cfg: TracesConfig) -> AsyncIterator[Any]:
    """The recall spans' :class:`indexers.tracing.Tracing` when ``traces.enabled``,
    else None (and OpenTelemetry is not imported)."""
    if not cfg.enabled:
        yield None
        return
    async with AsyncExitStack() as stack:
        try:
            from indexers.tracing import open_tracing

            opened = await stack.enter_async_context(open_tracing(cfg))
        except ImportError as exc:
            raise ConfigError(
                f"traces.enabled needs OpenTelemetry ({exc.name} is not installed): pip install 'braid[traces]'"
            ) from None
        yield opened


# --- the app ------------------------------------------------------------------


def create_app(settings: AppSettings) -> Litestar:
    cfg = settings.config.current
    # Both are read at start-up only (a reload names changes to them as needing a restart).
    metrics = Metrics() if cfg.metrics.enabled else None

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            spans = await stack.enter_async_context(tracing(cfg.traces))
            rt = await stack.enter_async_context(
                open_runtime(settings.config, settings.backends, embedder=settings.embedder)
            )
            rt.engine.tracing = spans
            if metrics is not None:
                metrics.runtime = rt
                rt.engine.observer = metrics
                if metrics.shared:
                    # One of several processes: its runtime's counts go to the shared directory.
                    publishers = await stack.enter_async_context(anyio.create_task_group())
                    publishers.start_soon(metrics.publishing)
                    stack.callback(publishers.cancel_scope.cancel)
            app.state.runtime = rt
            if settings.settle_heap:
                gc.collect()
                gc.freeze()
                thresholds = gc.get_threshold()
                gc.set_threshold(GEN0_THRESHOLD, *thresholds[1:])
                stack.callback(gc.set_threshold, *thresholds)
            yield

    extra_routes = [] if metrics is None else [metrics_route(metrics, cfg.metrics)]
    return Litestar(
        route_handlers=[
            write_memories,
            delete_memory,
            get_memory,
            list_versions,
            write_graph,
            delete_relations,
            delete_entity,
            recall,
            start_reindex,
            reindex_status,
            reload_config,
            stats,
            health,
            *extra_routes,
        ],
        middleware=[] if metrics is None else [metrics.middleware],
        dependencies={
            "engine": Provide(provide_engine),
            "principal": Provide(provide_principal),
        },
        lifespan=[lifespan],
        state=State({"keyring": settings.keyring, "rate_limiter": RateLimiter(), "on_reload": settings.on_reload}),
        exception_handlers=exception_handlers(),
        request_class=BraidRequest,
        request_max_body_size=cfg.server.max_body_bytes,
        plugins=[BodySchemaPlugin()],
        openapi_config=OpenAPIConfig(
            title="Braid",
            version="0.1.0",
            description="Hybrid retrieval for AI-agent memory.",
            components=Components(security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")}),
            security=[{"bearer": []}],
        ),
        debug=False,
    )
