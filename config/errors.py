"""The root of every error Braid raises on purpose.

Each package raises its own subclasses (``config.ConfigError``,
``indexers.base.BackendError`` and its kin, ``service.validate.InputError``);
the HTTP layer maps them to answers in one table (``service.errors``). An
exception that is not a :class:`BraidError` is a bug.
"""

from __future__ import annotations

__all__ = ["BraidError", "ConfigError"]


class BraidError(Exception):
    """Base of every error Braid raises on purpose."""


class ConfigError(BraidError):
    """The configuration file is missing, not YAML, or fails validation, or a
    reload would put the service in a state it cannot serve from."""
