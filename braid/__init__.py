"""Braid's Python client and command line.

    from braid import Client

    with Client("http://127.0.0.1:8080", api_key="...") as braid:
        braid.remember("User drives a Honda Civic")
        print(braid.recall("what car does the user have").block)

:class:`Client` and :class:`AsyncClient` cover every endpoint of the service
with typed answers (:mod:`braid.models`), retries (:mod:`braid.retry`) and one
exception tree (:mod:`braid.errors`). ``braid`` on the command line is
:mod:`braid.cli`. Framework adapters, each an optional extra:
:mod:`braid.langchain` and :mod:`braid.llamaindex` (retrievers) and
:mod:`braid.mcp` (an MCP server).
"""

from .client import DEFAULT_TIMEOUT, DEFAULT_URL, AsyncClient, Client, ReindexTarget, Strategy
from .errors import (
    BadRequest,
    BraidError,
    Conflict,
    ConnectError,
    Forbidden,
    HTTPError,
    NotFound,
    PayloadTooLarge,
    ProtocolError,
    RateLimited,
    ReindexFailed,
    ServerError,
    Timeout,
    TransportError,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    WaitTimeout,
)
from .models import (
    BookkeepingStats,
    CacheStats,
    Deleted,
    Entity,
    EntityDeleted,
    ExtractionStats,
    GraphWritten,
    Health,
    Job,
    JobStarted,
    Memory,
    QueryInfo,
    Recall,
    RecallItem,
    Relation,
    RelationsDeleted,
    Reloaded,
    SourceReport,
    Stats,
    StatsCounts,
    StoredMemory,
    SweepStats,
    TenantStats,
    Versions,
    Written,
)
from .retry import OnRetry, Retry, retry_after_seconds

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEFAULT_URL",
    "AsyncClient",
    "BadRequest",
    "BookkeepingStats",
    "BraidError",
    "CacheStats",
    "Client",
    "Conflict",
    "ConnectError",
    "Deleted",
    "Entity",
    "EntityDeleted",
    "ExtractionStats",
    "Forbidden",
    "GraphWritten",
    "HTTPError",
    "Health",
    "Job",
    "JobStarted",
    "Memory",
    "NotFound",
    "OnRetry",
    "PayloadTooLarge",
    "ProtocolError",
    "QueryInfo",
    "RateLimited",
    "Recall",
    "RecallItem",
    "ReindexFailed",
    "ReindexTarget",
    "Relation",
    "RelationsDeleted",
    "Reloaded",
    "Retry",
    "ServerError",
    "SourceReport",
    "Stats",
    "StatsCounts",
    "Strategy",
    "StoredMemory",
    "SweepStats",
    "TenantStats",
    "Timeout",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "Versions",
    "WaitTimeout",
    "Written",
    "retry_after_seconds",
]
