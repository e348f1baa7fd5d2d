"""The embedding providers, by ``embedding.provider``: each opens a ready
:class:`~indexers.embedding.Embedder` and closes it on exit (the service's
lifespan holds it open)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from config import ConfigError, EmbeddingConfig

from .embedding import Embedder, open_local
from .hosted_embedding import open_openai

__all__ = ["PROVIDERS", "open_embedder"]

Opener = Callable[[EmbeddingConfig], AbstractAsyncContextManager[Embedder]]

#: ``embedding.provider`` -> what opens its embedder.
PROVIDERS: dict[str, Opener] = {
    "local": open_local,
    "openai": open_openai,
}


def open_embedder(cfg: EmbeddingConfig) -> AbstractAsyncContextManager[Embedder]:
    """The embedder ``cfg.provider`` names, as an async context manager."""
    try:
        opener = PROVIDERS[cfg.provider]
    except KeyError:
        raise ConfigError(f"unknown embedding.provider {cfg.provider!r}; known: {sorted(PROVIDERS)}") from None
    return opener(cfg)
