"""The requests of the HTTP API as data, shared by :class:`~braid.Client` and
:class:`~braid.AsyncClient`: each endpoint is a function returning a
:class:`Call` (method, path, body, the type its answer decodes into, whether
it is safe to send twice). Sending is the clients' business; turning an
answer into a value or an exception is :func:`result`'s."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from . import models as m
from .errors import BY_STATUS, ConnectError, HTTPError, ProtocolError, ServerError, Timeout, TransportError
from .retry import retry_after_seconds

T = TypeVar("T")

MemoryLike = m.Memory | str | Mapping[str, Any]
EntityLike = m.Entity | Mapping[str, Any]
RelationLike = m.Relation | Mapping[str, Any]


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    type: type[T]
    body: bytes | None = None
    params: dict[str, str] = field(default_factory=dict)
    #: Safe to send again when the answer was lost (see :mod:`braid.retry`).
    idempotent: bool = True
    #: Error statuses whose body is still this call's answer (``/health``'s 503).
    answers: frozenset[int] = frozenset()

    def request(self, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        headers = {"content-type": "application/json"} if self.body is not None else {}
        return client.build_request(self.method, self.path, content=self.body, params=self.params, headers=headers)


def _segment(value: str) -> str:
    """A path segment, percent-encoded (a slash in an id or name included)."""
    return quote(value, safe="")


# --- the endpoints ------------------------------------------------------------


def remember(memories: MemoryLike | Iterable[MemoryLike]) -> Call[m.Written]:
    items: list[Any] = []
    for item in [memories] if isinstance(memories, m.Memory | str | Mapping) else memories:
        if isinstance(item, str):
            items.append(m.Memory(content=item, id=str(uuid.uuid4())))
        elif isinstance(item, m.Memory):
            items.append(item if item.id is not None else msgspec.structs.replace(item, id=str(uuid.uuid4())))
        elif isinstance(item, Mapping):
            obj = dict(item)
            if obj.get("id") is None:
                obj["id"] = str(uuid.uuid4())
            items.append(obj)
        else:
            raise TypeError(f"a memory is a braid.Memory, a dict or a str, not {type(item).__name__}")
    return Call("POST", "/v1/memories", m.Written, _encode({"memories": items}))


def memory(memory_id: str) -> Call[m.StoredMemory]:
    return Call("GET", f"/v1/memories/{_segment(memory_id)}", m.StoredMemory)


def versions(mem_key: str, limit: int | None) -> Call[m.Versions]:
    params = {"mem_key": mem_key} | ({} if limit is None else {"limit": str(limit)})
    return Call("GET", "/v1/memories", m.Versions, params=params)


def delete_memory(memory_id: str, restore_previous: bool) -> Call[m.Deleted]:
    params = {"restore_previous": "true"} if restore_previous else {}
    return Call("DELETE", f"/v1/memories/{_segment(memory_id)}", m.Deleted, params=params, idempotent=False)


def write_graph(entities: Iterable[EntityLike], relations: Iterable[RelationLike]) -> Call[m.GraphWritten]:
    body = {"entities": list(entities), "relations": list(relations)}
    return Call("POST", "/v1/graph", m.GraphWritten, _encode(body))


def delete_relations(source: str, target: str, relation: str | None) -> Call[m.RelationsDeleted]:
    params = {"source": source, "target": target} | ({} if relation is None else {"relation": relation})
    return Call("DELETE", "/v1/graph/relations", m.RelationsDeleted, params=params, idempotent=False)


def delete_entity(name: str) -> Call[m.EntityDeleted]:
    return Call("DELETE", f"/v1/graph/entities/{_segment(name)}", m.EntityDeleted, idempotent=False)


def recall(query: str, options: Mapping[str, Any]) -> Call[m.Recall]:
    body: dict[str, Any] = {"query": query}
    body.update((k, v) for k, v in options.items() if v is not None)
    return Call("POST", "/v1/recall", m.Recall, _encode(body))


def start_reindex(target: str, tier: str | None, tenant: str | None = None) -> Call[m.JobStarted]:
    body: dict[str, Any] = {"target": target} | ({} if tier is None else {"tier": tier})
    body |= {} if tenant is None else {"tenant": tenant}
    return Call("POST", "/admin/reindex", m.JobStarted, _encode(body), idempotent=False)


def reindex_job(job_id: str) -> Call[m.Job]:
    return Call("GET", f"/admin/reindex/{_segment(job_id)}", m.Job)


def reload_config() -> Call[m.Reloaded]:
    return Call("POST", "/admin/config/reload", m.Reloaded)


def stats(tenant: str | None) -> Call[m.Stats]:
    return Call("GET", "/admin/stats", m.Stats, params={} if tenant is None else {"tenant": tenant})


def health() -> Call[m.Health]:
    return Call("GET", "/health", m.Health, answers=frozenset({503}))


def openapi() -> Call[dict[str, Any]]:
    return Call("GET", "/schema/openapi.json", dict)


# --- answers ------------------------------------------------------------------


def _encode(body: Any) -> bytes:
    try:
        return msgspec.json.encode(body)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"cannot send this as JSON: {exc}") from None


def result(call: Call[T], response: httpx.Response) -> T:
    """The decoded answer, or the :class:`~braid.errors.HTTPError` its status means."""
    if response.is_success or response.status_code in call.answers:
        try:
            return msgspec.json.decode(response.content, type=call.type)
        except msgspec.DecodeError as exc:
            raise ProtocolError(
                f"{call.method} {call.path}: unexpected answer ({response.status_code}): {exc}"
            ) from None
    raise http_error(call, response)


def http_error(call: Call[Any], response: httpx.Response) -> HTTPError:
    status = response.status_code
    body: Any
    try:
        body = msgspec.json.decode(response.content)
    except msgspec.DecodeError:
        body = response.text
    detail = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(detail, str):
        detail = response.reason_phrase or f"HTTP {status}"
        if isinstance(body, str) and body.strip():
            detail = body.strip()[:500]
    kind = BY_STATUS.get(status, ServerError if status >= 500 else HTTPError)
    extra: dict[str, Any] = {}
    if status in (429, 503):
        extra["retry_after"] = retry_after_seconds(response.headers.get("retry-after"), _date(response))
    return kind(status, detail, body, method=call.method, path=call.path, **extra)


def _date(response: httpx.Response) -> datetime | None:
    """The answer's own ``Date``: an HTTP-date Retry-After is read against the
    server's clock when it sent one, so a skewed client clock does not matter."""
    value = response.headers.get("date")
    if not value:
        return None
    from email.utils import parsedate_to_datetime

    try:
        return parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None


def transport_error(call: Call[Any], exc: httpx.TransportError, timeout: httpx.Timeout) -> TransportError:
    where = f"{call.method} {call.path}"
    if isinstance(exc, httpx.ConnectTimeout):
        return ConnectError(f"{where}: no connection within {timeout.connect:g} s", method=call.method, path=call.path)
    if isinstance(exc, httpx.ConnectError):
        return ConnectError(f"{where}: cannot connect: {exc}", method=call.method, path=call.path)
    if isinstance(exc, httpx.ReadTimeout):
        return Timeout(f"{where}: no answer within {timeout.read:g} s", method=call.method, path=call.path)
    if isinstance(exc, httpx.TimeoutException):
        return Timeout(f"{where}: timed out ({type(exc).__name__})", method=call.method, path=call.path)
    return TransportError(f"{where}: {exc or type(exc).__name__}", method=call.method, path=call.path)
