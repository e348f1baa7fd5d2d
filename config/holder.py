"""The config in force in a running service."""

from __future__ import annotations

from .schema import BraidConfig

__all__ = ["ConfigHolder"]


class ConfigHolder:
    """The config in force; replaced whole on reload, never mutated. Calling
    it returns the current config, so readers see a reload at once."""

    def __init__(self, config: BraidConfig, path: str | None = None) -> None:
        self.current = config
        self.path = path

    def __call__(self) -> BraidConfig:
        return self.current
