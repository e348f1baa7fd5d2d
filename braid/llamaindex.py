"""Braid as a LlamaIndex retriever (``pip install 'braid[llamaindex]'``).

    from braid.llamaindex import BraidRetriever

    retriever = BraidRetriever(url="http://127.0.0.1:8080", api_key="...", top_k=5)
    for hit in retriever.retrieve("what car does the user drive?"):
        print(hit.score, hit.node.get_content())

Each recalled memory is a ``NodeWithScore``: a ``TextNode`` whose id is the
memory's, whose text is its content and whose metadata holds its fields and
Braid's score breakdown (see :func:`braid._adapters.item_metadata`), with
Braid's fused score, best first. The breakdown keys are left out of the text
LlamaIndex shows an LLM or an embedding model (``excluded_llm_metadata_keys``,
``excluded_embed_metadata_keys``); the memory's own fields stay in.
``retrieve`` runs on a :class:`braid.Client`, ``aretrieve`` on a
:class:`braid.AsyncClient`. Errors are the client's (:class:`braid.BraidError`).

llama-index-core ships the NLTK data and tiktoken files it uses, and this
retriever uses neither, so nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

try:
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("braid.llamaindex needs llama-index-core: pip install 'braid[llamaindex]'") from exc

import httpx

from ._adapters import BREAKDOWN_KEYS, Connection, item_metadata, recall_kwargs
from .client import DEFAULT_RETRY, DEFAULT_TIMEOUT, AsyncClient, Client, Strategy
from .models import Recall
from .retry import Retry

__all__ = ["BraidRetriever"]


class BraidRetriever(BaseRetriever):
    """Recalls memories from Braid (``POST /v1/recall``) as LlamaIndex nodes.

    Connection: ``url`` and ``api_key`` (default ``$BRAID_URL``, else
    ``http://127.0.0.1:8080``, and ``$BRAID_API_KEY``; the key's tenant is
    the one recalled from), ``timeout`` (seconds or an ``httpx.Timeout``),
    ``retry``; or ``client`` / ``async_client`` to use (and own) clients of
    your own.

    Recall options: the recall API's fields, sent when set (``None``: the
    service's default); ``filter_tags`` and ``filter_metadata`` are the API's
    ``tags`` and ``metadata`` filters (named as in :mod:`braid.langchain`).
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
        strategy: Strategy | None = None,
        top_k: int | None = None,
        budget_tokens: int | None = None,
        min_confidence: float | None = None,
        session_id: str | None = None,
        filter_tags: Sequence[str] | None = None,
        kinds: Sequence[str] | None = None,
        tiers: Sequence[str] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        filter_metadata: dict[str, Any] | None = None,
        min_importance: float | None = None,
        sources: Sequence[str] | None = None,
        hops: int | None = None,
        reference_time: datetime | None = None,
        track: bool | None = None,
        as_of: datetime | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        self._connection = Connection(
            url, api_key, timeout=timeout, retry=retry, client=client, async_client=async_client
        )
        self.options: dict[str, Any] = recall_kwargs(
            {
                "strategy": strategy,
                "top_k": top_k,
                "budget_tokens": budget_tokens,
                "min_confidence": min_confidence,
                "session_id": session_id,
                "filter_tags": None if filter_tags is None else list(filter_tags),
                "kinds": None if kinds is None else list(kinds),
                "tiers": None if tiers is None else list(tiers),
                "created_after": created_after,
                "created_before": created_before,
                "filter_metadata": filter_metadata,
                "min_importance": min_importance,
                "sources": None if sources is None else list(sources),
                "hops": hops,
                "reference_time": reference_time,
                "track": track,
                "as_of": as_of,
            }
        )
        """The :meth:`braid.Client.recall` keywords every call sends."""

    def _nodes(self, answer: Recall) -> list[NodeWithScore]:
        session = self.options.get("session_id")
        return [
            NodeWithScore(
                node=TextNode(
                    id_=item.id,
                    text=item.content,
                    metadata=item_metadata(item, answer, session),
                    excluded_llm_metadata_keys=list(BREAKDOWN_KEYS),
                    excluded_embed_metadata_keys=list(BREAKDOWN_KEYS),
                ),
                score=item.score,
            )
            for item in answer.items
        ]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._nodes(self._connection.client().recall(query_bundle.query_str, **self.options))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        answer = await self._connection.async_client().recall(query_bundle.query_str, **self.options)
        return self._nodes(answer)

    def close(self) -> None:
        """Close the sync client this retriever made (not one it was given)."""
        self._connection.close()

    async def aclose(self) -> None:
        """Close the clients this retriever made for sync calls and for the running loop."""
        await self._connection.aclose()
