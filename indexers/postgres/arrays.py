"""Strings sent as one ``text[]`` parameter, for the id lists a recall sends.

psycopg's list dumper finds a dumper and quotes every element in Python
(51 us for the 58 ids of a graph read here); :class:`TextArrayDumper` writes
the array literal in one join, for a :class:`TextArray` only: every other
list keeps psycopg's dumper.
"""

from __future__ import annotations

import psycopg
from psycopg.adapt import Dumper
from psycopg.postgres import types

__all__ = ["TextArray", "TextArrayDumper"]


class TextArray(tuple[str, ...]):
    """Strings sent as a ``text[]`` (none may be ``None`` or hold a NUL)."""

    __slots__ = ()


class TextArrayDumper(Dumper):
    """A :class:`TextArray` as a ``text[]`` literal: each element quoted, its
    ``"`` and ``\\`` escaped (Postgres' array input syntax)."""

    oid = types["text"].array_oid

    def dump(self, obj: TextArray) -> bytes:
        return ("{" + ",".join(['"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"' for s in obj]) + "}").encode()


psycopg.adapters.register_dumper(TextArray, TextArrayDumper)
