"""The client-side embedding cache: keys, bit-exact round trips, nothing embedded twice."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import numpy as np
import pytest

from benchmarks.quality.embed_cache import EmbeddingCache, embed_cached, text_key


class CountingEmbedder:
    """Vectors derived from the text, as float32 values; records what it was asked."""

    dim = 3

    def __init__(self, model: str = "m") -> None:
        self.model = model
        self.calls: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        self.calls.append(list(texts))
        return [tuple(float(np.float32(x)) for x in (len(t), 1 / (1 + len(t)), 0.1)) for t in texts]


def test_text_key_covers_model_and_text() -> None:
    assert text_key("m", "a") == text_key("m", "a")
    assert text_key("m", "a") != text_key("m2", "a")
    assert text_key("m", "ab") != text_key("ma", "b")  # the NUL between them keeps these apart
    assert len(text_key("m", "a")) == 32


@pytest.mark.anyio
async def test_second_pass_reads_back_bit_for_bit(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path / "c.sqlite")
    embedder = CountingEmbedder()
    texts = ["short", "a longer text", "short"]
    first, computed = await embed_cached(texts, embedder, cache)
    assert computed == 2
    assert embedder.calls == [["a longer text", "short"]]  # longest first, each text once
    assert first.dtype == np.float32 and first.shape == (3, 3)
    assert tuple(first[0].tolist()) == (await embedder.embed(["short"]))[0]
    cache.close()

    reopened = EmbeddingCache(tmp_path / "c.sqlite")
    again = CountingEmbedder()
    second, computed = await embed_cached(texts, again, reopened)
    assert (computed, again.calls) == (0, [])
    assert np.array_equal(first, second)
    # Another model's vectors are not reused.
    other = CountingEmbedder("other")
    _, computed = await embed_cached(["short"], other, reopened)
    assert computed == 1


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_empty_input(tmp_path: Path) -> None:
    vectors, computed = anyio.run(embed_cached, [], CountingEmbedder(), EmbeddingCache(tmp_path / "c.sqlite"))
    assert vectors.shape == (0, 3) and computed == 0
