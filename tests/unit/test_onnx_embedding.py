"""``embedding.runtime: onnx`` against sentence-transformers on torch, the real
model both ways (no backend needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from indexers.embedding import MiniLMEmbedder
from indexers.onnx_minilm import CHECK_TEXTS, MIN_COSINE, OnnxMiniLM, default_path

pytestmark = pytest.mark.anyio

TEXTS = [
    *CHECK_TEXTS,
    "",
    "Caroline",
    "When did Melanie paint a sunrise?",
    "I'm off to the café — ça va? 東京に行きます。",
    "x" * 3000,
]


@pytest.fixture(scope="module")
def torch_vectors() -> np.ndarray:
    model = MiniLMEmbedder(runtime="torch", cache_size=0)
    model.load()
    return np.asarray(model._encode(list(TEXTS)), dtype=np.float32)


def test_make_install_exported_the_model() -> None:
    assert default_path().is_file(), "make install exports the ONNX model (python -m indexers.onnx_minilm)"


def test_onnx_gives_the_torch_vectors_one_at_a_time_and_in_batches(torch_vectors: np.ndarray) -> None:
    onnx = OnnxMiniLM(default_path())
    single = np.vstack([onnx.encode([t]) for t in TEXTS])
    batched = onnx.encode(TEXTS, batch_size=4)  # padded to each batch's longest
    for got in (single, batched):
        assert got.shape == (len(TEXTS), 384)
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        cosines = (got * torch_vectors).sum(axis=1)
        assert cosines.min() >= MIN_COSINE, dict(zip(TEXTS, cosines.round(6), strict=True))
    assert np.abs(single - batched).max() < 1e-4


async def test_an_embedder_with_no_export_at_its_path_makes_one(tmp_path: Path, torch_vectors: np.ndarray) -> None:
    path = tmp_path / "models" / "minilm.onnx"
    model = MiniLMEmbedder(runtime="onnx", onnx_path=str(path), cache_size=8)
    model.load()
    assert path.is_file()
    assert sorted(p.name for p in path.parent.iterdir()) == ["minilm.onnx"], "a temporary file was left"
    vectors = np.asarray(await model.embed(list(TEXTS)), dtype=np.float32)
    query = np.asarray(await model.embed_query(TEXTS[2]), dtype=np.float32)
    assert (vectors * torch_vectors).sum(axis=1).min() >= MIN_COSINE
    assert float(query @ torch_vectors[2]) >= MIN_COSINE
    await model.queries.run(lambda: None)  # the lanes' threads stop below
    model.close()


def test_an_export_it_cannot_write_is_named_with_the_way_out(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    model = MiniLMEmbedder(runtime="onnx", onnx_path=str(blocker / "minilm.onnx"))
    with pytest.raises(RuntimeError, match=r"cannot write the ONNX export of all-MiniLM-L6-v2 to .*/file/minilm\.onnx"):
        model.load()
