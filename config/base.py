"""The base of every config section: frozen, camelCase keys, unknown keys refused."""

from __future__ import annotations

import msgspec

__all__ = ["Section"]


class Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    pass
