"""Embeddings from an OpenAI-compatible server (``embedding.provider: openai``).

Each request is ``POST {baseUrl}/embeddings`` with the configured ``model``
and a batch of texts, on one ``httpx.AsyncClient`` that the service's
lifespan opens and closes. A failed request (connection error, timeout,
408, 429, 5xx) is retried by tenacity with exponential backoff and jitter,
or after the server's ``Retry-After``; what still fails is
:class:`~indexers.base.EmbeddingUnavailable` (a write answers 503, a recall
searches without a vector), and a server that refuses the texts themselves
(400, 413, 422) is :class:`~indexers.base.EmbeddingRefused` (a write answers 400).

At start-up one request learns the model's name as the server reports it
and checks that its vectors have ``embedding.dim`` dimensions (the pgvector
columns are typed with it): Braid does not start otherwise. Every vector is
stored under ``openai:<that name>``, which no local model's name can equal,
so switching provider is a model change (vector search keeps the two
models' vectors apart; ``POST /admin/reindex {"target": "embeddings"}``
embeds the others again).

Query embeddings behave as the local model's: cached by text, and a recall
that stops waiting (``embedding.queryDeadlineMs``) leaves the request
running in the embedder's own task group, so its answer still fills the
cache; recalls asking for the same text at once share one request, and a
query nobody waits for any more is not retried.
"""

from __future__ import annotations

import email.utils
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import httpx
import msgspec
import numpy as np
from anyio.abc import TaskGroup
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    stop_any,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from config import ConfigError, EmbeddingConfig, OpenAIEmbeddingConfig

from .base import EmbeddingRefused, EmbeddingUnavailable
from .embedding import _LRU

__all__ = ["PREFIX", "OpenAIEmbedder", "open_openai"]

log = logging.getLogger("braid.embedding")

#: Stored model names of this provider start with it: ``openai:<model>``.
PREFIX = "openai:"
#: Answers worth sending the same request again for.
RETRY_STATUSES = frozenset({408, 429})
#: Answers that say the texts themselves are refused.
REFUSED_STATUSES = frozenset({400, 413, 422})

Kind = Literal["query", "document"]


class _Item(msgspec.Struct):
    embedding: list[float]
    index: int = 0


class _Answer(msgspec.Struct):
    data: list[_Item]
    model: str | None = None


class _Retryable(Exception):
    """A failed attempt worth repeating (internal: becomes EmbeddingUnavailable)."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class _StopIf(stop_base):
    """A tenacity stop condition from a predicate on the retry state."""

    def __init__(self, predicate: Callable[[RetryCallState], bool]) -> None:
        self._predicate = predicate

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self._predicate(retry_state)


class _Pending:
    """A query's request in flight, shared by every recall waiting for that text."""

    __slots__ = ("done", "vector", "error", "waiters")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.vector: tuple[float, ...] | None = None
        self.error: EmbeddingUnavailable | EmbeddingRefused | None = None
        self.waiters = 0


def retry_after(response: httpx.Response) -> float | None:
    """The seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date), if any."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _server_message(response: httpx.Response) -> str:
    """What the server said went wrong: OpenAI's ``error.message``, or the start of its body."""
    try:
        body = msgspec.json.decode(response.content)
    except msgspec.DecodeError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:500]
        if isinstance(error, str):
            return error[:500]
        if isinstance(body.get("detail"), str):
            return str(body["detail"])[:500]
    text = response.text.strip()
    return text[:500] if text else response.reason_phrase or "no body"


class OpenAIEmbedder:
    """The :class:`~indexers.embedding.Embedder` of an OpenAI-compatible server.
    Made by :func:`open_openai`, which owns its HTTP client and task group."""

    def __init__(self, cfg: EmbeddingConfig, hosted: OpenAIEmbeddingConfig, client: httpx.AsyncClient) -> None:
        self._cfg = hosted
        self._client = client
        self.dim = cfg.dim
        #: ``openai:<model as the server reports it>``, known after :meth:`start`.
        self.model = PREFIX + hosted.model
        self._reported: str | None = None
        self.url = hosted.base_url.rstrip("/") + "/embeddings"
        self._timeout_s = hosted.timeout_ms / 1000.0
        self._max_wait_s = hosted.retry_max_wait_ms / 1000.0
        self._cache: _LRU[tuple[float, ...]] = _LRU(cfg.cache_size)
        self._inflight: dict[str, _Pending] = {}
        self._tg: TaskGroup | None = None
        self._failing = False
        #: Requests sent, and retries among them, since start.
        self.requests = 0
        self.retried = 0

    # --- start-up -----------------------------------------------------------

    async def start(self) -> None:
        """Learn the model's name from one answer and check its dimension."""
        vectors, reported = await self._request(["Braid start-up check"], "document")
        if len(vectors[0]) != self.dim:
            raise ConfigError(
                f"embedding.dim is {self.dim} but {self.url} answered {len(vectors[0])}-d vectors "
                f"(model {reported!r}); set embedding.dim to {len(vectors[0])} on a new database"
                + ("" if self._cfg.dimensions else ", or ask for shorter vectors with embedding.openai.dimensions")
            )
        self._reported = reported
        self.model = PREFIX + reported
        log.info("embedding with %s at %s (%d-d)", reported, self.url, self.dim)

    # --- the Embedder protocol -----------------------------------------------

    async def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        """Texts of a write (memories, entity names), ``openai.batch`` per request, in order."""
        out: list[tuple[float, ...]] = []
        prefix = self._cfg.document_prefix
        for start in range(0, len(texts), self._cfg.batch):
            chunk = [prefix + t for t in texts[start : start + self._cfg.batch]]
            out.extend(self._checked(*await self._request(chunk, "document")))
        return out

    async def embed_query(self, text: str) -> tuple[float, ...]:
        """A recall's query: from the cache, or from the server. A caller that
        stops waiting leaves the request running; its answer fills the cache."""
        cached = self._cache.get(text)
        if cached is not None:
            return cached
        pending = self._inflight.get(text)
        if pending is None:
            if self._tg is None:
                raise RuntimeError("the embedder is not open (use open_openai)")
            pending = self._inflight[text] = _Pending()
            self._tg.start_soon(self._fetch_query, text, pending)
        pending.waiters += 1
        try:
            await pending.done.wait()
        finally:
            pending.waiters -= 1
        if pending.error is not None:
            # A new exception per waiter: one object raised in several tasks would share a traceback.
            raise type(pending.error)(pending.error.reason)
        assert pending.vector is not None
        return pending.vector

    @property
    def cache_stats(self) -> dict[str, int]:
        """Query-cache hits and misses since start."""
        return {"hits": self._cache.hits, "misses": self._cache.misses}

    # --- requests -----------------------------------------------------------

    async def _fetch_query(self, text: str, pending: _Pending) -> None:
        try:
            answer = await self._request([self._cfg.query_prefix + text], "query", wanted=lambda: pending.waiters > 0)
            (pending.vector,) = self._checked(*answer)
            self._cache.put(text, pending.vector)
        except (EmbeddingUnavailable, EmbeddingRefused) as exc:
            pending.error = exc
        except Exception as exc:  # a bug: told to the waiters, never left to end the task group
            log.exception("query embedding failed")
            pending.error = EmbeddingUnavailable(f"{type(exc).__name__}: {exc}")
        finally:
            del self._inflight[text]
            pending.done.set()

    async def _request(
        self, texts: list[str], kind: Kind, wanted: Callable[[], bool] | None = None
    ) -> tuple[list[list[float]], str]:
        """One batch's vectors (in order) and the model the server named, retried.
        ``wanted``: false once nobody waits for the answer (no retry then)."""
        retrying = AsyncRetrying(
            stop=stop_any(
                stop_after_attempt(self._cfg.retries + 1),
                _StopIf(self._asks_too_long),
                _StopIf(lambda _: wanted is not None and not wanted()),
            ),
            wait=self._wait,
            retry=retry_if_exception_type(_Retryable),
            before_sleep=self._count_retry,
            sleep=anyio.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    answer = await self._post(texts, kind)
        except _Retryable as exc:
            self._failed(exc.reason)
            raise EmbeddingUnavailable(exc.reason) from None
        except EmbeddingUnavailable as exc:
            self._failed(exc.reason)
            raise
        if self._failing:
            self._failing = False
            log.info("embedding server %s answers again", self.url)
        return answer

    async def _post(self, texts: list[str], kind: Kind) -> tuple[list[list[float]], str]:
        body: dict[str, Any] = {"model": self._cfg.model, "input": texts, "encoding_format": "float"}
        input_type = self._cfg.query_input_type if kind == "query" else self._cfg.document_input_type
        if input_type is not None:
            body["input_type"] = input_type
        if self._cfg.dimensions is not None:
            body["dimensions"] = self._cfg.dimensions
        self.requests += 1
        try:
            # httpx's timeout bounds each phase; this bounds the whole request.
            with anyio.fail_after(self._timeout_s):
                response = await self._client.post(
                    self.url, content=msgspec.json.encode(body), headers={"Content-Type": "application/json"}
                )
        except (TimeoutError, httpx.TimeoutException):
            raise _Retryable(f"no answer from {self.url} within {self._cfg.timeout_ms} ms") from None
        except httpx.TransportError as exc:
            raise _Retryable(f"cannot reach {self.url}: {exc or type(exc).__name__}") from None
        status = response.status_code
        if status != 200:
            message = _server_message(response)
            if status in RETRY_STATUSES or status >= 500:
                wait = retry_after(response)
                asked = "" if wait is None else f" (Retry-After {wait:g} s)"
                raise _Retryable(f"{self.url} answered {status}: {message}{asked}", wait)
            if status in REFUSED_STATUSES:
                raise EmbeddingRefused(f"{self.url} answered {status}: {message}")
            raise EmbeddingUnavailable(f"{self.url} answered {status}: {message}")
        try:
            answer = msgspec.json.decode(response.content, type=_Answer)
        except msgspec.DecodeError as exc:
            raise EmbeddingUnavailable(f"{self.url} answered with no embeddings list: {exc}") from None
        if len(answer.data) != len(texts):
            raise EmbeddingUnavailable(f"{self.url} answered {len(answer.data)} embeddings for {len(texts)} texts")
        items = sorted(answer.data, key=lambda item: item.index)
        return [item.embedding for item in items], answer.model or self._cfg.model

    def _checked(self, vectors: list[list[float]], reported: str) -> list[tuple[float, ...]]:
        """The vectors scaled to unit length, once they are ``dim``-d, finite,
        not zero, and of the model the service stores them under."""
        if self._reported is not None and reported != self._reported:
            raise EmbeddingUnavailable(
                f"{self.url} answered with model {reported!r}, but this service embeds with "
                f"{self._reported!r} (restart Braid to change models)"
            )
        dims = {len(v) for v in vectors}
        if dims != {self.dim}:
            raise EmbeddingUnavailable(
                f"{self.url} answered {'/'.join(map(str, sorted(dims)))}-d vectors; embedding.dim is {self.dim}"
            )
        arr = np.asarray(vectors, dtype=np.float64)
        norms = np.linalg.norm(arr, axis=1)
        if not np.all(np.isfinite(norms)) or np.any(norms == 0.0):
            raise EmbeddingUnavailable(f"{self.url} answered a zero or non-finite vector")
        arr = (arr / norms[:, None]).astype(np.float32)
        return [tuple(float(x) for x in row) for row in arr]

    # --- retry policy (tenacity) -------------------------------------------

    def _wait(self, state: RetryCallState) -> float:
        """The server's ``Retry-After`` if it sent one, else exponential backoff with jitter."""
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, _Retryable) and exc.retry_after is not None:
            return exc.retry_after
        return float(wait_random_exponential(multiplier=0.25, max=max(self._max_wait_s, 0.0))(state))

    def _asks_too_long(self, state: RetryCallState) -> bool:
        """Stop: the server asks for a longer wait than ``retryMaxWaitMs``."""
        exc = state.outcome.exception() if state.outcome is not None else None
        return isinstance(exc, _Retryable) and exc.retry_after is not None and exc.retry_after > self._max_wait_s

    def _count_retry(self, state: RetryCallState) -> None:
        self.retried += 1
        exc = state.outcome.exception() if state.outcome is not None else None
        log.debug("embedding request failed (%s); retry %d", exc, state.attempt_number)

    def _failed(self, reason: str) -> None:
        """Log the first failure of a streak (and the recovery, in :meth:`_request`)."""
        if not self._failing:
            self._failing = True
            log.warning("embedding server unavailable: %s", reason)


@asynccontextmanager
async def open_openai(cfg: EmbeddingConfig) -> AsyncIterator[OpenAIEmbedder]:
    """A started :class:`OpenAIEmbedder` (its client open, the model checked);
    closed on exit. Raises :class:`~config.ConfigError` for a key variable that
    is not set or a dimension other than ``embedding.dim``, and
    :class:`~indexers.base.EmbeddingUnavailable` when the server cannot be
    reached (after the configured retries)."""
    hosted = cfg.openai
    if hosted is None:
        raise ConfigError("embedding.provider `openai` needs an `embedding.openai` section")
    headers = {"Accept": "application/json"}
    if hosted.api_key_env is not None:
        key = os.environ.get(hosted.api_key_env, "")
        if not key:
            raise ConfigError(f"embedding.openai.apiKeyEnv names {hosted.api_key_env}, which is not set or empty")
        headers["Authorization"] = f"Bearer {key}"
    timeout = httpx.Timeout(hosted.timeout_ms / 1000.0)
    async with httpx.AsyncClient(headers=headers, timeout=timeout) as client:
        embedder = OpenAIEmbedder(cfg, hosted, client)
        await embedder.start()
        error: BaseException | None = None
        # The task group holds queries whose recalls stopped waiting; an error
        # of the service's own is kept out of it (it would come out wrapped).
        async with anyio.create_task_group() as tg:
            embedder._tg = tg
            try:
                yield embedder
            except BaseException as exc:
                error = exc
            finally:
                embedder._tg = None
                tg.cancel_scope.cancel()
        if error is not None:
            raise error
