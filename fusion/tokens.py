"""Token encodings used to budget the memory block.

:func:`get_encoding` wraps a bpe-openai (tiktoken-compatible) encoding, one
instance per name for the life of the process. Anything with the
:class:`Encoding` shape can stand in for it, e.g. a toy encoder in tests.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Sequence
from typing import Protocol

__all__ = ["Encoding", "get_encoding"]


class Encoding(Protocol):
    """What the block formatter needs from a tokenizer."""

    def encode(self, text: str, /) -> list[int]: ...

    def decode(self, tokens: Sequence[int], /) -> str: ...


class _Tiktoken(Protocol):
    def encode_ordinary(self, text: str, /) -> list[int]: ...

    def decode(self, tokens: Sequence[int], /) -> str: ...


class _OrdinaryEncoding:
    """A bpe-openai encoding that treats special-token text as plain text.

    Memory content is user text: a stored ``<|endoftext|>`` must count as the
    tokens it spells, not make ``encode`` raise (tiktoken's default).
    """

    def __init__(self, inner: _Tiktoken) -> None:
        self._inner = inner

    def encode(self, text: str, /) -> list[int]:
        return self._inner.encode_ordinary(text)

    def decode(self, tokens: Sequence[int], /) -> str:
        return self._inner.decode(tokens)


@functools.cache
def get_encoding(name: str) -> Encoding:
    """The encoding ``name`` (e.g. ``cl100k_base``), built once and cached.

    An unknown name raises ``bpe_openai.UnsupportedModelError`` (a ``KeyError``).
    """
    with warnings.catch_warnings():
        # bpe-openai 0.1.4 reads its tables (on import and on first use) with
        # the deprecated importlib.resources.open_binary: keep that warning
        # out of a warnings-as-errors run.
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"bpe_openai\.")
        bpe_openai = importlib.import_module("bpe_openai")
        inner: _Tiktoken = bpe_openai.get_encoding(name)
    return _OrdinaryEncoding(inner)
