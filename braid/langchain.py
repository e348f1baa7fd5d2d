"""Braid as a LangChain retriever (``pip install 'braid[langchain]'``).

    from braid.langchain import BraidRetriever

    retriever = BraidRetriever(url="http://127.0.0.1:8080", api_key="...", top_k=5)
    for doc in retriever.invoke("what car does the user drive?"):
        print(doc.metadata["score"], doc.page_content)

Each recalled memory is a ``Document``: ``page_content`` is the memory's
content, ``metadata`` its fields and Braid's score breakdown (see
:func:`braid._adapters.item_metadata`), best first. ``invoke`` runs on a
:class:`braid.Client`, ``ainvoke`` on a :class:`braid.AsyncClient` (no
thread). Errors are the client's (:class:`braid.BraidError` subclasses,
carrying the service's message).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("braid.langchain needs langchain-core: pip install 'braid[langchain]'") from exc

from pydantic import Field, PrivateAttr, SecretStr

from ._adapters import RECALL_OPTIONS, Connection, item_metadata, recall_kwargs
from .client import DEFAULT_RETRY, AsyncClient, Client
from .models import Recall
from .retry import Retry

__all__ = ["BraidRetriever"]


class BraidRetriever(BaseRetriever):
    """Recalls memories from Braid (``POST /v1/recall``) as LangChain ``Document``\\ s.

    Connection: ``url`` and ``api_key`` (default ``$BRAID_URL``, else
    ``http://127.0.0.1:8080``, and ``$BRAID_API_KEY``; the key's tenant is
    the one recalled from), ``timeout`` in seconds per request, ``retry``;
    or ``client`` / ``async_client`` to use (and own) clients of your own.

    Recall options: the recall API's fields, sent when set (``None``: the
    service's default). ``filter_tags`` and ``filter_metadata`` are the API's
    ``tags`` and ``metadata`` filters (``tags`` and ``metadata`` here are
    LangChain's, given to callbacks). ``invoke(query, top_k=3, ...)`` and
    ``ainvoke`` take any of them for one call.
    """

    url: str | None = None
    api_key: SecretStr | None = None
    timeout: float = Field(default=30.0, gt=0)
    retry: Retry = DEFAULT_RETRY
    client: Client | None = None
    async_client: AsyncClient | None = None

    strategy: Literal["auto", "semantic", "keyword", "recent"] | None = None
    top_k: int | None = None
    budget_tokens: int | None = None
    min_confidence: float | None = None
    session_id: str | None = None
    filter_tags: list[str] | None = None
    kinds: list[str] | None = None
    tiers: list[str] | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    filter_metadata: dict[str, Any] | None = None
    min_importance: float | None = None
    sources: list[str] | None = None
    hops: int | None = None
    reference_time: datetime | None = None
    track: bool | None = None
    as_of: datetime | None = None

    _connection: Connection = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        key = self.api_key.get_secret_value() if self.api_key is not None else None
        self._connection = Connection(
            self.url,
            key,
            timeout=self.timeout,
            retry=self.retry,
            client=self.client,
            async_client=self.async_client,
        )

    def _options(self, overrides: dict[str, Any]) -> dict[str, Any]:
        overrides.pop("verbose", None)  # LangChain's own, passed along with the call's keywords
        options = {name: getattr(self, name) for name in RECALL_OPTIONS} | overrides
        return recall_kwargs(options)

    def _documents(self, answer: Recall, options: dict[str, Any]) -> list[Document]:
        session = options.get("session_id")
        return [
            Document(page_content=item.content, metadata=item_metadata(item, answer, session), id=item.id)
            for item in answer.items
        ]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **overrides: Any
    ) -> list[Document]:
        options = self._options(overrides)
        return self._documents(self._connection.client().recall(query, **options), options)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **overrides: Any
    ) -> list[Document]:
        options = self._options(overrides)
        answer = await self._connection.async_client().recall(query, **options)
        return self._documents(answer, options)

    def close(self) -> None:
        """Close the sync client this retriever made (not one it was given)."""
        self._connection.close()

    async def aclose(self) -> None:
        """Close the clients this retriever made for sync calls and for the running loop."""
        await self._connection.aclose()
