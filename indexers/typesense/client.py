"""The async REST client of a Typesense cluster, and its errors.

:class:`TypesenseClient` talks to Typesense over one ``httpx.AsyncClient``
and fails over between nodes. Unreachable nodes and 5xx become
:class:`SourceUnavailable`; 4xx become :class:`TypesenseError`, carrying the
server's message.

An import sends each document with a vector in a request with no other such
document (:func:`import_groups`): Typesense 0.24.1 can crash when one import
hands several vectors to its indexing threads at once (see the Typesense
section of ``docs/design.md``). Writes to one collection name are applied
one request after the other, so those requests can be in flight together.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import msgspec

from ..base import BackendError, SourceUnavailable
from .documents import quoted_list
from .transport import LeanTransport

__all__ = ["SOURCE", "TypesenseClient", "TypesenseError", "import_groups"]

#: The source name under which the client reports an unavailable cluster.
SOURCE = "typesense"

#: Ids per ``DELETE ...?filter_by=id:=[...]`` request, to keep URLs short.
_DELETE_CHUNK = 100

#: How long a node may take to compact its store (:meth:`TypesenseClient.compact`).
COMPACT_TIMEOUT_S = 600.0

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class TypesenseError(BackendError):
    """Typesense refused a request (a 4xx): the request, not the server, is wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"typesense refused the request ({status}): {message}")
        self.status = status
        self.message = message


def import_groups(
    documents: Sequence[Mapping[str, Any]], vector_field: str | None = None
) -> list[list[Mapping[str, Any]]]:
    """``documents`` split into import requests, in order: all in one without
    ``vector_field``; else no request holds two documents with that field
    (each starts a new request, and documents without it join the request
    before them)."""
    if vector_field is None:
        return [list(documents)] if documents else []
    groups: list[list[Mapping[str, Any]]] = []
    current: list[Mapping[str, Any]] = []
    holds = False
    for doc in documents:
        if vector_field in doc:
            if holds:
                groups.append(current)
                current = []
            holds = True
        current.append(doc)
    if current:
        groups.append(current)
    return groups


def _message(response: httpx.Response) -> str:
    """The server's message in an error answer, else the start of its body."""
    try:
        body = _decode(response.content)
    except msgspec.DecodeError:
        return response.text.strip()[:200] or response.reason_phrase
    message = body.get("message") if isinstance(body, dict) else None
    if isinstance(message, str):
        return message
    return response.text.strip()[:200]


class TypesenseClient:
    """Async REST client for one Typesense cluster.

    Requests go to the last node that answered and, on a connect error, a
    timeout or a 5xx, to the next one. When every node failed the request
    raises :class:`SourceUnavailable` naming each node's failure.

    A node that failed is tried after the others for ``retry_after``
    seconds, and one that timed out or was still silent when the caller gave
    up (a recall source's deadline is shorter than the client's timeout)
    after those that failed fast: a hung node, whose connections hang instead
    of being refused, would otherwise take every recall's deadline and the
    client would never reach the next node.

    While a cluster elects a new leader or a restarted node catches up,
    nodes answer writes with the status line ``HTTP/1.1 0`` or a 5xx (what
    0.24.1 answers is in the Typesense section of ``docs/design.md``): these
    fail over to the next node too, and a write that no node takes raises
    :class:`SourceUnavailable`, for the outbox to retry.
    """

    #: In httpx's error for the status line ``HTTP/1.1 0`` (a RemoteProtocolError).
    _NO_STATUS = "HTTP/1.1 0 "

    def __init__(
        self,
        nodes: Sequence[str],
        api_key: str,
        *,
        timeout: float = 2.0,
        retry_after: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not nodes:
            raise ValueError("at least one Typesense node is required")
        self.nodes: tuple[str, ...] = tuple(node.rstrip("/") for node in nodes)
        self.retry_after = retry_after
        self._good = 0
        #: Per node, the monotonic time until which it is tried after the
        #: others, and whether it failed by not answering.
        self._failed_until = [0.0] * len(self.nodes)
        self._silent = [False] * len(self.nodes)
        # Uncompressed answers: on a local network gzip costs both ends CPU
        # (Typesense compressing a search's hits, this process inflating them).
        self._headers = {"X-TYPESENSE-API-KEY": api_key, "Accept-Encoding": "identity"}
        # LeanTransport: a transport that costs less CPU a request than
        # httpcore (indexers/typesense/transport.py). Requests are handed to
        # it directly, as httpx.Request objects with the timeouts it reads:
        # httpx's client adds nothing a Typesense request uses (no auth
        # flow, redirects, cookies or hooks) and cost about as much CPU as
        # the transport itself.
        self._transport = transport or LeanTransport()
        self._timeouts = httpx.Timeout(timeout).as_dict()
        #: The URLs of requests without parameters, parsed once (a search's, an import's).
        self._urls: dict[str, httpx.URL] = {}

    @property
    def active_node(self) -> str:
        """The node the next request goes to first."""
        return self.nodes[self._good]

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        headers = self._headers
        if json is not None:
            content = _encode(json)
            headers = {**headers, "Content-Type": "application/json"}
        elif content is not None:
            headers = {**headers, "Content-Type": "text/plain"}
        failures: list[str] = []
        for index in self._order():
            node = self.nodes[index]
            try:
                response = await self._send(method, self._url(node + path, params), headers, content, self._timeouts)
            except httpx.TimeoutException as exc:
                failures.append(f"{node}: timed out ({type(exc).__name__})")
                self._failed(index, silent=True)
                continue
            except httpx.TransportError as exc:
                if self._NO_STATUS in str(exc):
                    failures.append(f"{node}: HTTP 0 (a follower that could not reach its leader)")
                else:
                    detail = f": {exc}" if str(exc) else ""
                    failures.append(f"{node}: {type(exc).__name__}{detail}")
                self._failed(index)
                continue
            except anyio.get_cancelled_exc_class():
                self._failed(index, silent=True)
                raise
            if response.status_code >= 500:
                failures.append(f"{node}: HTTP {response.status_code}: {_message(response)}")
                self._failed(index)
                continue
            self._good = index
            self._failed_until[index] = 0.0
            if response.status_code >= 400:
                raise TypesenseError(response.status_code, _message(response))
            return response
        raise SourceUnavailable(SOURCE, "; ".join(failures))

    async def _send(
        self,
        method: str,
        url: httpx.URL,
        headers: Mapping[str, str],
        content: bytes | None,
        timeouts: Mapping[str, float | None],
    ) -> httpx.Response:
        """One request to one node, its body read and the response closed
        (transport errors raised as they are)."""
        request = httpx.Request(method, url, headers=headers, content=content, extensions={"timeout": timeouts})
        response = await self._transport.handle_async_request(request)
        try:
            await response.aread()
        finally:
            await response.aclose()
        return response

    def _url(self, url: str, params: Mapping[str, str | int] | None) -> httpx.URL:
        if params:
            return httpx.URL(url, params=params)
        parsed = self._urls.get(url)
        if parsed is None:
            if len(self._urls) >= 1024:  # document paths name ids: keep the cache bounded
                self._urls.clear()
            parsed = self._urls[url] = httpx.URL(url)
        return parsed

    def _order(self) -> list[int]:
        """The nodes in the order to try: round the ring from the last one
        that answered, then those that failed lately, then those that
        lately did not answer."""
        now = time.monotonic()
        ring = [(self._good + step) % len(self.nodes) for step in range(len(self.nodes))]
        return sorted(ring, key=lambda i: 0 if self._failed_until[i] <= now else 1 + self._silent[i])

    def _failed(self, index: int, *, silent: bool = False) -> None:
        """Node ``index`` failed (``silent``: by not answering in time): try
        it after the others for a while, and start the next request at the
        node after it."""
        self._failed_until[index] = time.monotonic() + self.retry_after
        self._silent[index] = silent
        if self._good == index:
            self._good = (index + 1) % len(self.nodes)

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return _decode((await self._request(method, path, **kwargs)).content)

    # Server

    async def health(self) -> bool:
        """Whether some node says it is ready. Note that a restarted node
        says so before it has loaded its documents."""
        try:
            body = await self._json("GET", "/health")
        except BackendError:
            return False
        return isinstance(body, dict) and body.get("ok") is True

    async def compact(self, timeout: float = COMPACT_TIMEOUT_S) -> dict[str, str]:
        """Ask every node to compact its on-disk store (``POST
        /operations/db/compact``, node-local: each node is asked itself, none
        failed over to): node -> ``ok``, or why not. Never raises for a node
        that fails or does not answer within ``timeout`` seconds.

        After bulk writes and deletes (a job that copies, moves or drops
        collections), 0.24.1 reads each hit's document up to five times
        dearer until its store is compacted: a keyword search of 150 hits on
        a 12,000-document pair cost Typesense 21.3 ms of CPU before and 4.2 ms
        after (``benchmarks/results/keyword-cost-s63-imp-*.md``)."""
        timeouts = httpx.Timeout(timeout).as_dict()
        answers: dict[str, str] = {}
        for node in self.nodes:
            try:
                url = self._url(node + "/operations/db/compact", None)
                response = await self._send("POST", url, self._headers, None, timeouts)
            except httpx.TransportError as exc:
                answers[node] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            if response.status_code != 200:
                answers[node] = f"HTTP {response.status_code}: {_message(response)}"
            else:
                answers[node] = "ok"
        return answers

    # Collections and aliases

    async def list_collections(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._json("GET", "/collections")
        return result

    async def create_collection(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._json("POST", "/collections", json=schema)
        return result

    async def update_collection(self, name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._json("PATCH", f"/collections/{name}", json=schema)
        return result

    async def get_collection(self, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._json("GET", f"/collections/{quote(name, safe='')}")
        except TypesenseError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def delete_collection(self, name: str) -> bool:
        """Drop a collection; ``False`` if there was none by that name."""
        try:
            await self._request("DELETE", f"/collections/{quote(name, safe='')}")
        except TypesenseError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def get_alias(self, name: str) -> str | None:
        """The collection an alias points at, or ``None``."""
        try:
            body = await self._json("GET", f"/aliases/{quote(name, safe='')}")
        except TypesenseError as exc:
            if exc.status == 404:
                return None
            raise
        target: str = body["collection_name"]
        return target

    async def list_aliases(self) -> dict[str, str]:
        """Every alias and the collection it points at, in one request."""
        body = await self._json("GET", "/aliases")
        return {a["name"]: a["collection_name"] for a in body.get("aliases", [])}

    async def upsert_alias(self, name: str, collection: str) -> None:
        await self._request("PUT", f"/aliases/{quote(name, safe='')}", json={"collection_name": collection})

    async def delete_alias(self, name: str) -> bool:
        """Remove an alias (not its collection); ``False`` if there was none by that name."""
        try:
            await self._request("DELETE", f"/aliases/{quote(name, safe='')}")
        except TypesenseError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # Documents

    async def import_documents(
        self,
        collection: str,
        documents: Sequence[Mapping[str, Any]],
        *,
        vector_field: str | None = None,
        concurrency: int = 1,
    ) -> int:
        """Upsert documents (JSONL import); raise naming the first rejected one.

        With ``vector_field``, a document holding that field goes in an
        import request with no other such document (:func:`import_groups`;
        see the module docstring), and up to
        ``concurrency`` requests are in flight at once. Every document is
        tried and the rejected ones are reported together, as for one
        request; a request that fails (unreachable, 5xx) stops the ones not
        yet sent and its error is raised.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
        if not documents:
            return 0
        groups = import_groups(documents, vector_field)
        answers: list[list[dict[str, Any]]] = [[] for _ in groups]
        errors: list[BackendError] = []
        limiter = anyio.CapacityLimiter(concurrency)

        async def send(i: int) -> None:
            async with limiter:
                if errors:
                    return
                try:
                    answers[i] = await self._import(collection, groups[i])
                except BackendError as exc:
                    errors.append(exc)

        if len(groups) == 1:
            # The usual write of one memory: no tasks to schedule on a busy loop.
            answers[0] = await self._import(collection, groups[0])
        else:
            async with anyio.create_task_group() as tg:
                for i in range(len(groups)):
                    tg.start_soon(send, i)
        if errors:
            raise errors[0]
        docs = [doc for group in groups for doc in group]
        lines = [line for answer in answers for line in answer]
        failed = [(doc, line) for doc, line in zip(docs, lines) if line.get("success") is not True]
        if failed:
            doc, line = failed[0]
            raise TypesenseError(
                int(line.get("code", 400)),
                f"{len(failed)} of {len(documents)} documents rejected; "
                f"first: {doc.get('id')!r}: {line.get('error', 'no error given')}",
            )
        return len(documents)

    async def _import(self, collection: str, documents: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """One import request; its answer line for each document, in order."""
        body = b"\n".join(_encode(doc) for doc in documents)
        response = await self._request(
            "POST",
            f"/collections/{quote(collection, safe='')}/documents/import",
            params={"action": "upsert"},
            content=body,
        )
        lines: list[dict[str, Any]] = [_decode(line) for line in response.content.splitlines() if line.strip()]
        if len(lines) != len(documents):
            raise TypesenseError(
                response.status_code,
                f"import answered {len(lines)} lines for {len(documents)} documents",
            )
        return lines

    async def delete_documents(self, collection: str, ids: Sequence[str]) -> int:
        """Delete documents by id; absent ids are ignored. Returns how many went."""
        deleted = 0
        path = f"/collections/{quote(collection, safe='')}/documents"
        for start in range(0, len(ids), _DELETE_CHUNK):
            chunk = ids[start : start + _DELETE_CHUNK]
            body = await self._json("DELETE", path, params={"filter_by": f"id:={quoted_list(chunk)}"})
            deleted += int(body["num_deleted"])
        return deleted

    async def delete_where(self, collection: str, filter_by: str) -> int:
        """Delete every document ``filter_by`` matches (in batches of 1,000 on
        the server); returns how many went."""
        path = f"/collections/{quote(collection, safe='')}/documents"
        body = await self._json("DELETE", path, params={"filter_by": filter_by, "batch_size": 1000})
        return int(body["num_deleted"])

    async def get_document(self, collection: str, id: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._json(
                "GET", f"/collections/{quote(collection, safe='')}/documents/{quote(id, safe='')}"
            )
        except TypesenseError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def count(self, collection: str, filter_by: str | None = None) -> int:
        params: dict[str, str | int] = {"q": "*", "per_page": 0}
        if filter_by:
            params["filter_by"] = filter_by
        body = await self._json("GET", f"/collections/{quote(collection, safe='')}/documents/search", params=params)
        return int(body["found"])

    async def multi_search(self, searches: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Run searches in one request; a failed search fails the whole call
        (5xx as :class:`SourceUnavailable`, 4xx as :class:`TypesenseError`)."""
        body = await self._json("POST", "/multi_search", json={"searches": list(searches)})
        results: list[dict[str, Any]] = body["results"]
        for result in results:
            if "error" in result or "code" in result:
                code = int(result.get("code", 500))
                message = str(result.get("error", "unknown error"))
                if code >= 500:
                    raise SourceUnavailable(SOURCE, f"search failed ({code}): {message}")
                raise TypesenseError(code, message)
        return results
