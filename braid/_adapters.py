"""What the framework retrievers (:mod:`braid.langchain`, :mod:`braid.llamaindex`)
share, free of any framework import: the recall options they pass through,
the metadata each retrieved memory carries, and their connection to Braid.

A retriever's options are :meth:`braid.Client.recall`'s keyword arguments
(the recall API's fields), except two renamed because LangChain's
``BaseRetriever`` already has fields of those names (its callbacks' tags and
metadata): ``filter_tags`` is the API's ``tags`` and ``filter_metadata`` its
``metadata``. ``embedding`` and ``embedding_model`` are left out: a retriever
asks Braid to embed each query itself.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx

from .client import DEFAULT_RETRY, DEFAULT_TIMEOUT, AsyncClient, Client
from .models import Recall, RecallItem
from .retry import Retry

__all__ = ["BREAKDOWN_KEYS", "RECALL_OPTIONS", "Connection", "item_metadata", "recall_kwargs"]

#: A retriever's option name -> the :meth:`braid.Client.recall` keyword it sets.
RECALL_OPTIONS: dict[str, str] = {
    name: name
    for name in (
        "strategy",
        "top_k",
        "budget_tokens",
        "min_confidence",
        "session_id",
        "kinds",
        "tiers",
        "created_after",
        "created_before",
        "sources",
        "hops",
        "reference_time",
        "track",
        "min_importance",
        "as_of",
    )
} | {"filter_tags": "tags", "filter_metadata": "metadata"}

#: The metadata keys that explain a memory's place in the answer rather than
#: describe the memory (LlamaIndex leaves them out of the text an LLM or an
#: embedding model is shown).
BREAKDOWN_KEYS = (
    "score",
    "rrf_score",
    "ranks",
    "contributions",
    "factors",
    "in_block",
    "truncated",
    "strategy",
    "degraded",
)


def recall_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` (retriever option names) as :meth:`braid.Client.recall`
    keywords, the ones left ``None`` dropped. An unknown name is a
    ``TypeError`` naming it and the known ones."""
    unknown = sorted(set(options) - RECALL_OPTIONS.keys())
    if unknown:
        raise TypeError(f"unknown recall option(s) {unknown}; the options are {sorted(RECALL_OPTIONS)}")
    return {RECALL_OPTIONS[name]: value for name, value in options.items() if value is not None}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def item_metadata(item: RecallItem, answer: Recall, session_id: str | None = None) -> dict[str, Any]:
    """A recalled memory's metadata, JSON values only (times as ISO 8601 strings).

    The memory: ``id``, ``kind``, ``tier``, ``created_at``, ``confidence``, and
    when it has them ``speaker``, ``importance``, ``mem_key``, ``expires_at``;
    ``session_id`` when the recall was filtered by it (so every memory
    returned has it; the recall answer does not carry each memory's session).
    Its score as the recall answer explains it (:data:`BREAKDOWN_KEYS`):
    ``score`` (fused, after the factors), ``rrf_score``, ``ranks`` and
    ``contributions`` per source, ``factors``, ``in_block``, ``truncated``;
    and of the answer, the ``strategy`` that ran and the ``degraded`` sources.
    """
    meta: dict[str, Any] = {
        "id": item.id,
        "kind": item.kind,
        "tier": item.tier,
        "created_at": _iso(item.created_at),
        "confidence": item.confidence,
    }
    optional = {
        "speaker": item.speaker,
        "session_id": session_id,
        "importance": item.importance,
        "mem_key": item.mem_key,
        "expires_at": _iso(item.expires_at),
    }
    meta.update((key, value) for key, value in optional.items() if value is not None)
    meta.update(
        score=item.score,
        rrf_score=item.rrf_score,
        ranks=dict(item.ranks),
        contributions=dict(item.contributions),
        factors=dict(item.factors),
        in_block=item.in_block,
        truncated=item.truncated,
        strategy=answer.strategy,
        degraded=list(answer.degraded),
    )
    return meta


class Connection:
    """A retriever's way to Braid.

    ``client`` / ``async_client``, when given, are used as they are (and never
    closed here). Otherwise a :class:`~braid.Client` is made on the first sync
    call and kept, and an :class:`~braid.AsyncClient` on the first async call
    in an event loop and kept for that loop (an httpx async client cannot be
    shared between loops; one made for a loop that is no longer the current
    one is dropped). ``url`` and ``api_key`` default to ``$BRAID_URL`` and
    ``$BRAID_API_KEY``.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry: Retry = DEFAULT_RETRY,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
    ) -> None:
        self.url = url
        self.api_key = api_key
        self.timeout = timeout
        self.retry = retry
        self._given = client
        self._given_async = async_client
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._async: tuple[asyncio.AbstractEventLoop, AsyncClient] | None = None

    def client(self) -> Client:
        if self._given is not None:
            return self._given
        with self._lock:
            if self._client is None:
                self._client = Client(self.url, self.api_key, timeout=self.timeout, retry=self.retry)
            return self._client

    def async_client(self) -> AsyncClient:
        if self._given_async is not None:
            return self._given_async
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._async is None or self._async[0] is not loop:
                self._async = (loop, AsyncClient(self.url, self.api_key, timeout=self.timeout, retry=self.retry))
            return self._async[1]

    def close(self) -> None:
        """Close the sync client made here (a given one is its owner's to close)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        """Close the clients made here: the sync one, and the async one if it
        belongs to the running loop (one of another loop is dropped)."""
        self.close()
        with self._lock:
            made, self._async = self._async, None
        if made is not None and made[0] is asyncio.get_running_loop():
            await made[1].aclose()
