"""The Braid HTTP client: :class:`Client` (sync) and :class:`AsyncClient`, with
the same methods, one per endpoint of the service.

Both read ``BRAID_URL`` (default ``http://127.0.0.1:8080``) and
``BRAID_API_KEY`` when not given them, send and decode JSON with msgspec,
retry what is safe to retry (:mod:`braid.retry`), and raise only
:class:`~braid.errors.BraidError` subclasses.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

import anyio
import httpx
import tenacity

from . import _calls as calls
from . import models as m
from ._calls import EntityLike, MemoryLike, RelationLike
from .errors import ReindexFailed, WaitTimeout
from .retry import OnRetry, Retry, retrying_kwargs

__all__ = ["DEFAULT_RETRY", "DEFAULT_TIMEOUT", "DEFAULT_URL", "AsyncClient", "Client", "ReindexTarget", "Strategy"]

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8080"
#: 5 s to connect, 30 s for everything else (a 512-memory write the service
#: embeds itself takes about 11 s on a busy 2-core machine).
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
USER_AGENT = "braid-client/0.1.0"
#: 4 sends within 30 s (braid.retry says what is retried).
DEFAULT_RETRY = Retry()

Strategy = Literal["auto", "semantic", "keyword", "recent"]
ReindexTarget = Literal["typesense", "pgvector", "all", "embeddings", "graph", "placement", "import"]


def _settings(url: str | None, api_key: str | None, timeout: float | httpx.Timeout) -> dict[str, Any]:
    key = api_key if api_key is not None else os.environ.get("BRAID_API_KEY")
    headers = {"user-agent": USER_AGENT, "accept": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    base = (url or os.environ.get("BRAID_URL") or DEFAULT_URL).rstrip("/")
    return {"base_url": base, "headers": headers, "timeout": timeout}


def _done(job: m.Job) -> m.Job:
    if job.status != "done":
        raise ReindexFailed(job)
    return job


class Client:
    """Synchronous client. ``url`` and ``api_key`` default to ``$BRAID_URL`` and
    ``$BRAID_API_KEY``; ``timeout`` is seconds (or an ``httpx.Timeout``) per
    request; ``retry`` says how often to retry (``Retry(attempts=1)``: never);
    ``on_retry(error, attempt, wait_s)`` is called before each wait;
    ``transport`` replaces httpx's (tests). Use it as a context manager, or
    call :meth:`close`."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry: Retry = DEFAULT_RETRY,
        on_retry: OnRetry | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        settings = _settings(url, api_key, timeout)
        self.url: str = settings["base_url"]
        self.retry = retry
        self.on_retry = on_retry
        self._http = httpx.Client(transport=transport, **settings)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: calls.Call[T]) -> T:
        response: httpx.Response | None = None
        for attempt in tenacity.Retrying(**retrying_kwargs(self.retry, call.idempotent, self.on_retry)):
            with attempt:
                try:
                    response = self._http.send(call.request(self._http))
                except httpx.TransportError as exc:
                    raise calls.transport_error(call, exc, self._http.timeout) from exc
                if not response.is_success and response.status_code not in call.answers:
                    raise calls.http_error(call, response)
        assert response is not None
        return calls.result(call, response)

    # --- memories -------------------------------------------------------------

    def remember(self, memories: MemoryLike | Iterable[MemoryLike]) -> m.Written:
        """Write one memory or a batch (``POST /v1/memories``): each a
        :class:`~braid.Memory`, a dict of the API's fields, or just its content.
        Memories without an id get a fresh UUID, so a retry cannot store one
        twice; the batch is written in one transaction."""
        return self._send(calls.remember(memories))

    def memory(self, memory_id: str) -> m.StoredMemory:
        """One memory with its lifecycle (:class:`~braid.errors.NotFound` if the tenant has none)."""
        return self._send(calls.memory(memory_id))

    def versions(self, mem_key: str, *, limit: int | None = None) -> m.Versions:
        """The versions of ``mem_key``, newest first."""
        return self._send(calls.versions(mem_key, limit))

    def delete_memory(self, memory_id: str, *, restore_previous: bool = False) -> m.Deleted:
        """Delete a memory from every store; ``restore_previous`` makes its key's
        newest retired version current again. Not retried after a lost answer."""
        return self._send(calls.delete_memory(memory_id, restore_previous))

    # --- graph ----------------------------------------------------------------

    def write_graph(
        self, entities: Iterable[EntityLike] = (), relations: Iterable[RelationLike] = ()
    ) -> m.GraphWritten:
        """Upsert entities and relations (``POST /v1/graph``)."""
        return self._send(calls.write_graph(entities, relations))

    def delete_relations(self, source: str, target: str, relation: str | None = None) -> m.RelationsDeleted:
        """Delete the relations from ``source`` to ``target`` (one name, or all)."""
        return self._send(calls.delete_relations(source, target, relation))

    def delete_entity(self, name: str) -> m.EntityDeleted:
        """Delete an entity with its relations and mentions (memories stay)."""
        return self._send(calls.delete_entity(name))

    # --- recall ---------------------------------------------------------------

    def recall(
        self,
        query: str = "",
        *,
        strategy: Strategy | None = None,
        top_k: int | None = None,
        budget_tokens: int | None = None,
        min_confidence: float | None = None,
        session_id: str | None = None,
        tags: Sequence[str] | None = None,
        kinds: Sequence[str] | None = None,
        tiers: Sequence[str] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        sources: Sequence[str] | None = None,
        embedding: Sequence[float] | None = None,
        embedding_model: str | None = None,
        hops: int | None = None,
        reference_time: datetime | None = None,
        track: bool | None = None,
        metadata: Mapping[str, Any] | None = None,
        min_importance: float | None = None,
        as_of: datetime | None = None,
    ) -> m.Recall:
        """The memory block for ``query`` (``POST /v1/recall``); every option is
        the API's field of that name, and one left ``None`` is not sent."""
        # Every keyword argument is an API field of the same name (None: not sent).
        options = {k: v for k, v in locals().items() if k not in ("self", "query")}
        return self._send(calls.recall(query, options))

    # --- admin ----------------------------------------------------------------

    def start_reindex(
        self, target: ReindexTarget = "all", *, tier: str | None = None, tenant: str | None = None
    ) -> m.JobStarted:
        """Start a reindex job (admin key; ``tenant``: the tenant an ``import``
        job prepares for a bulk load); :class:`~braid.errors.Conflict` names
        the running one (``job_id``) if one is queued or running."""
        return self._send(calls.start_reindex(target, tier, tenant))

    def reindex_job(self, job_id: str) -> m.Job:
        """A reindex job's status and progress (admin key)."""
        return self._send(calls.reindex_job(job_id))

    def follow_reindex(self, job_id: str, *, poll_s: float = 0.5) -> Iterator[m.Job]:
        """Yield the job each time it changes, every ``poll_s`` seconds at most,
        until it has finished (the last one yielded has ``finished``)."""
        last: m.Job | None = None
        while True:
            job = self.reindex_job(job_id)
            if job != last:
                yield job
                last = job
            if job.finished:
                return
            time.sleep(poll_s)

    def wait_reindex(self, job_id: str, *, poll_s: float = 0.5, timeout_s: float | None = None) -> m.Job:
        """The job once ``done``; :class:`~braid.errors.ReindexFailed` if it ended
        ``failed`` or ``interrupted``, :class:`~braid.errors.WaitTimeout` if it
        has not finished after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not (job := self.reindex_job(job_id)).finished:
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"reindex job {job_id} still {job.status} after {timeout_s:g} s")
            time.sleep(poll_s)
        return _done(job)

    def reload_config(self) -> m.Reloaded:
        """Re-read the service's YAML config (admin key)."""
        return self._send(calls.reload_config())

    def stats(self, *, tenant: str | None = None) -> m.Stats:
        """Stored counts per tenant (admin key)."""
        return self._send(calls.stats(tenant))

    def health(self) -> m.Health:
        """Each backend's status; answered (not raised) when degraded. Needs no key."""
        return self._send(calls.health())

    def openapi(self) -> dict[str, Any]:
        """The service's OpenAPI schema."""
        return self._send(calls.openapi())


class AsyncClient:
    """The asynchronous twin of :class:`Client` (same arguments, same methods,
    awaited), on ``httpx.AsyncClient``; runs under asyncio or trio."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry: Retry = DEFAULT_RETRY,
        on_retry: OnRetry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        settings = _settings(url, api_key, timeout)
        self.url: str = settings["base_url"]
        self.retry = retry
        self.on_retry = on_retry
        self._http = httpx.AsyncClient(transport=transport, **settings)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: calls.Call[T]) -> T:
        response: httpx.Response | None = None
        async for attempt in tenacity.AsyncRetrying(
            sleep=anyio.sleep, **retrying_kwargs(self.retry, call.idempotent, self.on_retry)
        ):
            with attempt:
                try:
                    response = await self._http.send(call.request(self._http))
                except httpx.TransportError as exc:
                    raise calls.transport_error(call, exc, self._http.timeout) from exc
                if not response.is_success and response.status_code not in call.answers:
                    raise calls.http_error(call, response)
        assert response is not None
        return calls.result(call, response)

    async def remember(self, memories: MemoryLike | Iterable[MemoryLike]) -> m.Written:
        """See :meth:`Client.remember`."""
        return await self._send(calls.remember(memories))

    async def memory(self, memory_id: str) -> m.StoredMemory:
        """See :meth:`Client.memory`."""
        return await self._send(calls.memory(memory_id))

    async def versions(self, mem_key: str, *, limit: int | None = None) -> m.Versions:
        """See :meth:`Client.versions`."""
        return await self._send(calls.versions(mem_key, limit))

    async def delete_memory(self, memory_id: str, *, restore_previous: bool = False) -> m.Deleted:
        """See :meth:`Client.delete_memory`."""
        return await self._send(calls.delete_memory(memory_id, restore_previous))

    async def write_graph(
        self, entities: Iterable[EntityLike] = (), relations: Iterable[RelationLike] = ()
    ) -> m.GraphWritten:
        """See :meth:`Client.write_graph`."""
        return await self._send(calls.write_graph(entities, relations))

    async def delete_relations(self, source: str, target: str, relation: str | None = None) -> m.RelationsDeleted:
        """See :meth:`Client.delete_relations`."""
        return await self._send(calls.delete_relations(source, target, relation))

    async def delete_entity(self, name: str) -> m.EntityDeleted:
        """See :meth:`Client.delete_entity`."""
        return await self._send(calls.delete_entity(name))

    async def recall(
        self,
        query: str = "",
        *,
        strategy: Strategy | None = None,
        top_k: int | None = None,
        budget_tokens: int | None = None,
        min_confidence: float | None = None,
        session_id: str | None = None,
        tags: Sequence[str] | None = None,
        kinds: Sequence[str] | None = None,
        tiers: Sequence[str] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        sources: Sequence[str] | None = None,
        embedding: Sequence[float] | None = None,
        embedding_model: str | None = None,
        hops: int | None = None,
        reference_time: datetime | None = None,
        track: bool | None = None,
        metadata: Mapping[str, Any] | None = None,
        min_importance: float | None = None,
        as_of: datetime | None = None,
    ) -> m.Recall:
        """See :meth:`Client.recall`."""
        # Every keyword argument is an API field of the same name (None: not sent).
        options = {k: v for k, v in locals().items() if k not in ("self", "query")}
        return await self._send(calls.recall(query, options))

    async def start_reindex(
        self, target: ReindexTarget = "all", *, tier: str | None = None, tenant: str | None = None
    ) -> m.JobStarted:
        """See :meth:`Client.start_reindex`."""
        return await self._send(calls.start_reindex(target, tier, tenant))

    async def reindex_job(self, job_id: str) -> m.Job:
        """See :meth:`Client.reindex_job`."""
        return await self._send(calls.reindex_job(job_id))

    async def follow_reindex(self, job_id: str, *, poll_s: float = 0.5) -> AsyncIterator[m.Job]:
        """See :meth:`Client.follow_reindex`."""
        last: m.Job | None = None
        while True:
            job = await self.reindex_job(job_id)
            if job != last:
                yield job
                last = job
            if job.finished:
                return
            await anyio.sleep(poll_s)

    async def wait_reindex(self, job_id: str, *, poll_s: float = 0.5, timeout_s: float | None = None) -> m.Job:
        """See :meth:`Client.wait_reindex`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not (job := await self.reindex_job(job_id)).finished:
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"reindex job {job_id} still {job.status} after {timeout_s:g} s")
            await anyio.sleep(poll_s)
        return _done(job)

    async def reload_config(self) -> m.Reloaded:
        """See :meth:`Client.reload_config`."""
        return await self._send(calls.reload_config())

    async def stats(self, *, tenant: str | None = None) -> m.Stats:
        """See :meth:`Client.stats`."""
        return await self._send(calls.stats(tenant))

    async def health(self) -> m.Health:
        """See :meth:`Client.health`."""
        return await self._send(calls.health())

    async def openapi(self) -> dict[str, Any]:
        """See :meth:`Client.openapi`."""
        return await self._send(calls.openapi())
