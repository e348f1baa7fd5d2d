"""Typesense: the keyword + vector index of memories, fed from Postgres.

Three layers, each usable alone:

* :class:`TypesenseClient` is a thin async REST client over one
  ``httpx.AsyncClient``. It fails over between nodes and translates errors:
  unreachable nodes and 5xx become :class:`SourceUnavailable`, 4xx become
  :class:`TypesenseError` carrying the server's message.
* :class:`TypesenseIndex` is the write/admin side: a versioned collection
  (``<alias>_<unix ms>``) behind an alias, so a rebuild fills a new collection
  and switches the alias atomically.
* :class:`TypesenseSource` is the search side (the :class:`Source` protocol).

Typesense 0.24.1 refuses ``q`` together with ``vector_query``, so a search is
two searches in one ``POST /multi_search`` (keyword, vector) fused here with
:func:`fusion.rrf.rrf`. Other 0.24.1 behaviour this module relies on:

* ``field:[a]`` on a string matches any value *containing the token* ``a``;
  only ``field:=[a]`` is exact, so every string filter here uses ``:=``.
  Values are wrapped in backticks (which may hold commas, not backticks).
* Dropping tokens (``drop_tokens_threshold``) removes words from the right,
  then from the left, never around a word in the middle, and a document
  matching more query words ranks first whatever the words are. So the
  keyword query leaves out common English words (:func:`keyword_query`), or
  "what is the password" would rank "what is the plan" above "the password
  is Blue".
* ``per_page`` is at most 250.

Typesense 0.24.1 can crash (SIGSEGV in hnswlib's ``insertPoint``,
``hnswalg.h:848``) when one import carries several documents with a vector
into a collection where a document with a vector was deleted or replaced
before: it indexes one import's vectors on up to four threads, and its
hnswlib fork hands the freed slots out to them without holding one lock
across "is one free?" and "take it" (``benchmarks/typesense_race.py`` has the
source lines and reproduces it). So a document with an embedding goes in an
import request of its own (:func:`import_groups`). The requests of one write
are sent :data:`IMPORT_CONCURRENCY` at a time: Typesense queues the writes
addressed to one collection name and applies them one request after the
other (another reason writes never go through the alias, whose name would
put them in another queue).

Memory ids are unique per tenant only (Postgres' key is ``(tenant, id)``),
while a Typesense document id is unique per collection, so a document's id
is ``<tenant>:<memory id>`` (:func:`document_id`; a tenant name has no colon)
and the memory id is stored beside it in ``memory_id``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import msgspec

from config.schema import BraidConfig, is_safe_name
from fusion.rrf import rrf

from .base import BackendError, Filters, Hit, MemoryRecord, SearchQuery, SourceUnavailable

__all__ = [
    "IMPORT_CONCURRENCY",
    "MAX_PER_PAGE",
    "STOPWORDS",
    "TypesenseClient",
    "TypesenseError",
    "TypesenseIndex",
    "TypesenseSource",
    "build_filter",
    "document_id",
    "idf_ranking",
    "import_groups",
    "keyword_query",
    "keyword_terms",
    "narrow_filter",
    "record_document",
]

SOURCE = "typesense"

#: Typesense refuses ``per_page`` above this ("Only upto 250 hits ...").
MAX_PER_PAGE = 250
#: Query terms searched one by one (``sources.typesense.maxTerms`` in the config).
MAX_TERMS = 8

#: How long the count of documents behind a filter (the idf's N) is reused,
#: and for how many filters at most.
COUNT_TTL_S = 10.0
COUNT_CACHE_SIZE = 4096

#: Import requests of one upsert in flight at once (each carries one
#: document with a vector; see the module docstring).
IMPORT_CONCURRENCY = 4

#: Ids per ``DELETE ...?filter_by=id:=[...]`` request, to keep URLs short.
_DELETE_CHUNK = 100

#: The fields a search hit needs; the embedding is never sent back.
_HIT_FIELDS = "memory_id,content,kind,tier,created_at,confidence,speaker"

#: Function words left out of keyword queries (see the module docstring).
STOPWORDS = frozenset(
    """
    a about after again all am an and any are as at be been before being but by
    can could did do does doing done for from had has have having he her here
    hers him his how i if in into is it its me my myself no nor not of on or
    our ours out over she should so some such than that the their theirs them
    then there these they this those through to too under until up very was we
    were what when where which while who whom why will with would you your
    yours yourself whats thats im ive dont didnt doesnt isnt wasnt
    """.split()
)

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class TypesenseError(BackendError):
    """Typesense refused a request (a 4xx): the request, not the server, is wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"typesense refused the request ({status}): {message}")
        self.status = status
        self.message = message


def _quoted(value: str) -> str:
    """A filter value in backticks. Defence in depth: the HTTP layer already
    refuses such values, and a backtick cannot be escaped in Typesense."""
    if "`" in value:
        raise ValueError(f"filter value {value!r} contains a backtick")
    return f"`{value}`"


def _quoted_list(values: Iterable[str]) -> str:
    return "[" + ",".join(_quoted(v) for v in values) + "]"


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


def _epoch(dt: datetime) -> int:
    """Whole epoch seconds; a naive datetime is taken to be UTC."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return math.floor(dt.timestamp())


def _message(response: httpx.Response) -> str:
    try:
        body = _decode(response.content)
    except msgspec.DecodeError:
        return response.text.strip()[:200] or response.reason_phrase
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
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

    What Typesense 0.24.1 answers while its Raft cluster elects a new leader
    (``tests/faults/test_cluster.py``): followers keep serving reads; a write
    sent to a follower, which forwards it to the leader, is answered with the
    status line ``HTTP/1.1 0`` while the dead leader is still the one it
    knows, then ``500 Could not find a leader.``; a restarted node answers
    ``503 Not Ready or Lagging`` until it has caught up. All of these fail
    over to the next node; a write that no node takes raises
    :class:`SourceUnavailable`, and the outbox retries it.
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
        self._http = httpx.AsyncClient(
            headers={"X-TYPESENSE-API-KEY": api_key}, timeout=timeout, transport=transport
        )

    @property
    def active_node(self) -> str:
        """The node the next request goes to first."""
        return self.nodes[self._good]

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        headers: dict[str, str] = {}
        if json is not None:
            content = _encode(json)
            headers["Content-Type"] = "application/json"
        elif content is not None:
            headers["Content-Type"] = "text/plain"
        failures: list[str] = []
        for index in self._order():
            node = self.nodes[index]
            try:
                response = await self._http.request(
                    method, node + path, params=params, content=content, headers=headers
                )
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

    async def upsert_alias(self, name: str, collection: str) -> None:
        await self._request(
            "PUT", f"/aliases/{quote(name, safe='')}", json={"collection_name": collection}
        )

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
        the 0.24.1 vector-slot race in the module docstring), and up to
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
            body = await self._json(
                "DELETE", path, params={"filter_by": f"id:={_quoted_list(chunk)}"}
            )
            deleted += int(body["num_deleted"])
        return deleted

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
        body = await self._json(
            "GET", f"/collections/{quote(collection, safe='')}/documents/search", params=params
        )
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


#: Below the smallest normal float32 Typesense cannot parse a vector component
#: ("one of the vector values is not a float"); it stores float32 anyway.
_FLOAT32_TINY = 1.1754944e-38


def vector_literal(values: Iterable[float]) -> str:
    """A query vector as ``vector_query`` takes it: components too small for a
    normal float32 are written as 0."""
    return ",".join("0.0" if abs(x) < _FLOAT32_TINY else repr(float(x)) for x in values)


def document_id(tenant: str, memory_id: str) -> str:
    """The Typesense id of a tenant's memory: ``<tenant>:<memory id>``."""
    if not is_safe_name(tenant):
        raise ValueError(f"invalid tenant name {tenant!r}")
    return f"{tenant}:{memory_id}"


def record_document(record: MemoryRecord) -> dict[str, Any]:
    """The Typesense document of a memory: epoch seconds, no ``None`` fields."""
    doc: dict[str, Any] = {
        "id": document_id(record.tenant, record.id),
        "memory_id": record.id,
        "tenant": record.tenant,
        "content": record.content,
        "kind": record.kind,
        "tier": record.tier,
        "created_at": _epoch(record.created_at),
        "confidence": float(record.confidence),
        "tags": list(record.tags),
    }
    if record.session_id is not None:
        doc["session_id"] = record.session_id
    if record.speaker is not None:
        doc["speaker"] = record.speaker
    if record.context:
        doc["context"] = record.context
    if record.importance is not None:
        doc["importance"] = float(record.importance)
    if record.model is not None:
        doc["model"] = record.model
    if record.embedding is not None:
        doc["embedding"] = [float(x) for x in record.embedding]
    return doc


class TypesenseIndex:
    """The write/admin side: versioned collections behind ``alias``."""

    def __init__(self, client: TypesenseClient, alias: str, dim: int) -> None:
        if not is_safe_name(alias):
            raise ValueError(f"invalid Typesense alias {alias!r}")
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim!r}")
        self.client = client
        self.alias = alias
        self.dim = dim
        self._last_ms = 0

    def schema(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "fields": [
                {"name": "id", "type": "string"},
                # Stored, not indexed (so it has to be optional in 0.24.1).
                {"name": "memory_id", "type": "string", "index": False, "optional": True},
                {"name": "tenant", "type": "string", "facet": True},
                {"name": "content", "type": "string"},
                # Indexed-only text (neighbouring turns): keyword-searched, never shown.
                {"name": "context", "type": "string", "optional": True},
                {"name": "speaker", "type": "string", "index": False, "optional": True},
                {"name": "kind", "type": "string", "facet": True},
                {"name": "tier", "type": "string", "facet": True},
                {"name": "session_id", "type": "string", "facet": True, "optional": True},
                {"name": "tags", "type": "string[]", "facet": True, "optional": True},
                {"name": "created_at", "type": "int64", "sort": True},
                {"name": "confidence", "type": "float"},
                {"name": "importance", "type": "float", "optional": True},
                {"name": "model", "type": "string", "optional": True},
                {"name": "embedding", "type": "float[]", "num_dim": self.dim, "optional": True},
            ],
        }

    async def ensure(self) -> str:
        """Make sure the alias points at a collection; returns that collection."""
        current = await self.client.get_alias(self.alias)
        if current is not None:
            await self.add_missing_fields(current)
            return current
        name = await self.new_collection()
        await self.switch_alias(name)
        return name

    async def add_missing_fields(self, name: str) -> list[str]:
        """Add the schema's fields a collection made by an older Braid lacks
        (their values arrive with the next write or reindex); returns them."""
        collection = await self.client.get_collection(name)
        have = {f["name"] for f in (collection or {}).get("fields", [])}
        missing = [f for f in self.schema(name)["fields"] if f["name"] not in have | {"id"}]
        if collection is not None and missing:
            await self.client.update_collection(name, {"fields": missing})
        return [f["name"] for f in missing]

    async def new_collection(self) -> str:
        """Create an empty versioned collection (not yet behind the alias)."""
        self._last_ms = max(time.time_ns() // 1_000_000, self._last_ms + 1)
        name = f"{self.alias}_{self._last_ms}"
        await self.client.create_collection(self.schema(name))
        return name

    async def switch_alias(self, name: str) -> str | None:
        """Point the alias at ``name``; returns the collection it pointed at."""
        previous = await self.client.get_alias(self.alias)
        await self.client.upsert_alias(self.alias, name)
        return previous

    async def drop_collection(self, name: str) -> None:
        """Drop a collection that is not behind the alias (absent is fine)."""
        if name == await self.current_collection():
            raise ValueError(f"refusing to drop {name!r}: alias {self.alias!r} points at it")
        await self.client.delete_collection(name)

    async def current_collection(self) -> str | None:
        return await self.client.get_alias(self.alias)

    async def ready(self) -> bool:
        """Whether searches can be served: a node is healthy *and* the alias
        resolves to a collection that answers. (``/health`` alone says ok
        after a restart before the documents are loaded.)"""
        try:
            if not await self.client.health() or await self.current_collection() is None:
                return False
            await self.count()
        except BackendError:
            return False
        return True

    async def _write_target(self, collection: str | None) -> str:
        """The collection a write goes to: ``collection``, else the one behind
        the alias, resolved now (a reindex in any process may just have
        switched it). Never the alias itself: Typesense 0.24.1, replaying its
        log after a restart, loses document writes and deletes that were
        addressed to an alias (tests/faults/test_backends.py)."""
        if collection is not None:
            return collection
        current = await self.client.get_alias(self.alias)
        return current if current is not None else await self.ensure()

    async def upsert(
        self, records: Sequence[MemoryRecord], collection: str | None = None, *, fresh: bool = False
    ) -> None:
        """Insert or replace whole documents (a field left out is removed).

        A document with an embedding is sent in an import request of its own
        (the 0.24.1 vector-slot race in the module docstring), unless
        ``fresh``: ``collection`` never had a document with a vector deleted
        or replaced, and nothing else writes to it meanwhile (a reindex
        filling the collection it just created, each memory once), so it has
        no freed slot to race for and ``records`` go in one request."""
        if fresh and collection is None:
            raise ValueError("fresh needs the collection named: the live one has had deletes")
        docs = [record_document(record) for record in records]
        await self.client.import_documents(
            await self._write_target(collection),
            docs,
            vector_field=None if fresh else "embedding",
            concurrency=IMPORT_CONCURRENCY,
        )

    async def delete(
        self, keys: Sequence[tuple[str, str]], collection: str | None = None
    ) -> None:
        """Delete memories by ``(tenant, memory id)``; absent ones are ignored."""
        ids = [document_id(tenant, memory_id) for tenant, memory_id in keys]
        await self.client.delete_documents(await self._write_target(collection), ids)

    async def count(self, tenant: str | None = None, collection: str | None = None) -> int:
        filter_by = None if tenant is None else f"tenant:={_quoted(tenant)}"
        return await self.client.count(collection or self.alias, filter_by)

    async def fetch(
        self, id: str, *, tenant: str, collection: str | None = None
    ) -> dict[str, Any] | None:
        """The tenant's stored document for memory ``id``, or ``None``."""
        return await self.client.get_document(collection or self.alias, document_id(tenant, id))


def keyword_query(text: str) -> str:
    """The ``q`` of the keyword search for a natural-language query.

    Words are kept as typed except that ``"`` and a leading ``-`` (Typesense's
    phrase and exclusion operators) are removed, and so are :data:`STOPWORDS`
    unless nothing else is left. Empty means "no keyword search".
    """
    words = [w.lstrip("-").replace('"', "") for w in text.split()]
    words = [w for w in words if any(c.isalnum() for c in w)]
    content = [w for w in words if "".join(c for c in w if c.isalnum()).lower() not in STOPWORDS]
    return " ".join(content or words)


def keyword_terms(text: str, cap: int = MAX_TERMS) -> list[str]:
    """The distinct terms of :func:`keyword_query`, normalised as Typesense
    indexes them (alphanumerics only, lower case), at most ``cap``."""
    terms: list[str] = []
    for word in keyword_query(text).split():
        term = "".join(c for c in word if c.isalnum()).lower()
        if term and term not in terms:
            terms.append(term)
    return terms[:cap]


def idf_ranking(term_results: Sequence[Mapping[str, Any]], total: int) -> list[str]:
    """Memory ids ranked by the summed idf of the term searches that found them.

    ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` with ``df`` each search's
    ``found``; ties go to the document that ranked best in any term search.
    """
    scores: dict[str, float] = {}
    first: dict[str, tuple[int, int]] = {}
    for ti, result in enumerate(term_results):
        df = int(result.get("found", 0))
        idf = math.log(1.0 + (total - df + 0.5) / (df + 0.5))
        for pos, hit in enumerate(result.get("hits", [])):
            mid = hit["document"]["memory_id"]
            scores[mid] = scores.get(mid, 0.0) + idf
            first.setdefault(mid, (pos, ti))
    return sorted(scores, key=lambda m: (-scores[m], first[m], m))


def build_filter(tenant: str, filters: Filters, min_confidence: float, tiers: Sequence[str]) -> str:
    """The full ``filter_by`` of a search. ``tiers`` must not be empty.

    ``created_after``/``created_before`` compare whole seconds, as stored.
    Empty ``tags``/``kinds`` do not restrict (as in Postgres).
    """
    if not tiers:
        raise ValueError("tiers must not be empty")
    return f"{narrow_filter(tenant, filters, tiers)} && confidence:>={float(min_confidence)!r}"


def narrow_filter(tenant: str, filters: Filters, tiers: Sequence[str] | None = None) -> str:
    """The part of :func:`build_filter` that narrows a tenant's documents: the
    tenant, the request's filters and ``tiers`` if given; not the confidence
    floor.

    Typesense 0.24 builds the id list of every filter clause on each search,
    so a clause that matches most of the collection costs as much as a
    selective one (at 100k documents, ``tier`` and ``confidence`` clauses
    added 2-6 ms to each search; ``benchmarks/results/load-tuning.md``). The
    source leaves out such clauses and checks them on the hits instead.
    """
    parts = [f"tenant:={_quoted(tenant)}"]
    if tiers is not None:
        parts.append(f"tier:={_quoted_list(tiers)}")
    if filters.kinds:
        parts.append(f"kind:={_quoted_list(filters.kinds)}")
    if filters.tags:
        parts.append(f"tags:={_quoted_list(filters.tags)}")
    if filters.session_id is not None:
        parts.append(f"session_id:={_quoted(filters.session_id)}")
    if filters.created_after is not None:
        parts.append(f"created_at:>={_epoch(filters.created_after)}")
    if filters.created_before is not None:
        parts.append(f"created_at:<={_epoch(filters.created_before)}")
    return " && ".join(parts)


class TtlCache:
    """A small dict whose entries expire ``ttl`` seconds after they were put;
    when full it starts over (no LRU bookkeeping on the request path)."""

    def __init__(self, ttl: float, size: int) -> None:
        self.ttl = ttl
        self.size = size
        self._items: dict[str, tuple[float, int]] = {}

    def get(self, key: str) -> int | None:
        item = self._items.get(key)
        if item is None or item[0] < time.monotonic():
            return None
        return item[1]

    def put(self, key: str, value: int) -> None:
        if len(self._items) >= self.size:
            self._items.clear()
        self._items[key] = (time.monotonic() + self.ttl, value)


class TypesenseSource:
    """Keyword and vector search over ``alias``, fused with RRF.

    The configuration is read at every search, so a reload applies at once.
    The client belongs to whoever created it: :meth:`aclose` leaves it open.
    """

    name = SOURCE
    #: Without a vector it still answers with its keyword list.
    needs_vector = False

    def __init__(
        self, client: TypesenseClient, alias: str, get_config: Callable[[], BraidConfig]
    ) -> None:
        self.client = client
        self.alias = alias
        self._get_config = get_config
        self._totals = TtlCache(COUNT_TTL_S, COUNT_CACHE_SIZE)

    async def search(self, query: SearchQuery) -> list[Hit]:
        config = self._get_config()
        wanted = query.filters.tiers
        tiers = [t for t in config.memory_tiers if wanted is None or t in wanted]
        if query.limit < 1 or not tiers:
            return []
        # Typesense narrows to the tenant and the request's filters; the tier
        # list (unless the request restricts tiers) and the confidence floor,
        # which match nearly every document, are checked on the hits.
        filter_by = narrow_filter(query.tenant, query.filters, None if wanted is None else tiers)
        allowed = frozenset(tiers)
        floor = query.min_confidence

        def allowed_doc(doc: Mapping[str, Any]) -> bool:
            return doc["tier"] in allowed and doc["confidence"] >= floor

        candidates = min(config.sources.typesense.candidates, MAX_PER_PAGE)
        # Keyword: one search per query term, each document scored by the summed
        # idf of the terms that found it (Typesense 0.24 ranks a multi-word query
        # by how many words match, not by their rarity). The idf's N, the number
        # of documents the filter allows, is counted by one more search and
        # reused for a few seconds. Vector: one k-NN search. All in a single
        # multi_search.
        ts = config.sources.typesense
        terms = keyword_terms(query.text, ts.max_terms)
        single = ts.keyword_mode == "single"
        searches: list[dict[str, Any]] = [
            {
                "q": term,
                "query_by": "content,context",
                "prefix": True,
                "num_typos": 1,
                "drop_tokens_threshold": 0,
                "typo_tokens_threshold": 1,
                "per_page": ts.term_hits,
                "highlight_fields": "none",
            }
            for term in ([" ".join(terms)] if single and terms else terms)
        ]
        if single and searches:
            # Drop words (right to left) until `candidates` documents match.
            searches[0].update(drop_tokens_threshold=candidates, per_page=candidates)
        total = self._totals.get(filter_by) if terms and not single else None
        count_at = -1
        if terms and not single and total is None:
            count_at = len(searches)
            searches.append({"q": "*", "per_page": 0})
        if query.vector is not None:
            vector = vector_literal(query.vector)
            searches.append(
                {
                    "q": "*",
                    "vector_query": f"embedding:([{vector}], k:{candidates})",
                    "per_page": candidates,
                }
            )
        if not searches:
            return []
        common = {"collection": self.alias, "filter_by": filter_by, "include_fields": _HIT_FIELDS}
        results = await self.client.multi_search([{**common, **s} for s in searches])

        # Hits outside the allowed tiers or under the confidence floor go first.
        docs: dict[str, dict[str, Any]] = {}
        for result in results:
            result["hits"] = [h for h in result.get("hits", []) if allowed_doc(h["document"])]
            for h in result["hits"]:
                docs.setdefault(h["document"]["memory_id"], h["document"])
        rankings: dict[str, list[str]] = {}
        if single and terms:
            rankings["keyword"] = [h["document"]["memory_id"] for h in results[0]["hits"]]
        elif terms:
            if total is None:
                total = int(results[count_at].get("found", 0))
                self._totals.put(filter_by, total)
            rankings["keyword"] = idf_ranking(results[: len(terms)], total)[:candidates]
        if query.vector is not None:
            rankings["vector"] = [h["document"]["memory_id"] for h in results[-1]["hits"]]
        weight = config.rrf.vector_weight
        fused = rrf(rankings, k=config.rrf.k, weights={"vector": weight, "keyword": 1.0 - weight})
        return [
            Hit(
                id=f.id,
                content=docs[f.id]["content"],
                kind=docs[f.id]["kind"],
                tier=docs[f.id]["tier"],
                created_at=datetime.fromtimestamp(docs[f.id]["created_at"], tz=timezone.utc),
                confidence=float(docs[f.id]["confidence"]),
                score=f.score,
                speaker=docs[f.id].get("speaker"),
            )
            for f in fused[: query.limit]
        ]

    async def aclose(self) -> None:
        """Nothing to release: the client is closed by its owner."""
