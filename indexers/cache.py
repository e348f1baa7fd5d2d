"""The recall result cache: an identical recall of a tenant answered again.

Per service process, in memory, least recently used out first. An answer is
stored with the tenant's write generation read *before* it was computed
(:func:`indexers.postgres.read_generation`) and served only while a fresh
read still gives that generation, so never older than the tenant's last
acknowledged write, delete, graph edit or sweep, whichever process made it.
It is also served only until ``cache.ttlMs`` after it was computed and until
the first expiry among the memories it holds (:mod:`indexers.lifecycle`).

The key is the tenant and the recall's options encoded as canonical JSON
(object keys sorted, so a metadata filter's key order does not matter),
``track`` left out: it changes what is recorded, not the answer.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict

import msgspec

from .results import RecallOptions, RecallResult

__all__ = ["CacheStats", "RecallCache", "cache_key"]


def cache_key(tenant: str, opts: RecallOptions) -> bytes:
    """The cache key of a recall: a digest of the tenant and the canonical options."""
    body = msgspec.json.encode(msgspec.structs.replace(opts, track=True), order="sorted")
    return hashlib.sha256(tenant.encode() + b"\0" + body).digest()


class CacheStats(msgspec.Struct):
    #: Answers held now.
    entries: int
    #: Recalls answered from the cache since start.
    hits: int
    #: Recalls that looked and computed their answer (not stored, expired, or
    #: older than the tenant's generation).
    misses: int


class _Entry(msgspec.Struct):
    generation: int
    #: time.monotonic() past which the entry is not served (cache.ttlMs).
    fresh_until: float
    #: Epoch second of the first expiry among the answer's memories.
    dies_at: float
    result: RecallResult


class RecallCache:
    def __init__(self) -> None:
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def stats(self) -> CacheStats:
        return CacheStats(entries=len(self._entries), hits=self.hits, misses=self.misses)

    def clear(self) -> None:
        self._entries.clear()

    def get(self, key: bytes, generation: int) -> RecallResult | None:
        """The answer stored under ``key`` at ``generation``, still fresh, else None."""
        entry = self._entries.get(key)
        if (
            entry is None
            or entry.generation != generation
            or time.monotonic() >= entry.fresh_until
            or time.time() >= entry.dies_at
        ):
            if entry is not None:
                del self._entries[key]
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry.result

    def put(
        self, key: bytes, generation: int, result: RecallResult, *, ttl_ms: int, dies_at: float, max_entries: int
    ) -> None:
        self._entries[key] = _Entry(
            generation=generation, fresh_until=time.monotonic() + ttl_ms / 1000.0, dies_at=dies_at, result=result
        )
        self._entries.move_to_end(key)
        while len(self._entries) > max_entries:
            self._entries.popitem(last=False)
