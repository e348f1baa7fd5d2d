"""The quality suites' HTTP side: writes retried as an agent runtime would,
recalls in flight at a fixed concurrency, and progress lines for long steps.

Only the public API is used: ``POST /v1/memories`` and ``POST /v1/recall``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

__all__ = ["Answer", "ApiError", "ConfigRun", "Progress", "post_retrying", "recall_many"]


class ApiError(RuntimeError):
    """The service answered an error status (``status``) after the retries."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Progress:
    """``label: done/total unit (rate/s, ETA)`` on stderr, at most every ``every`` seconds, and at the end."""

    def __init__(self, label: str, total: int, unit: str, every: float = 10.0) -> None:
        self.label, self.total, self.unit, self.every = label, total, unit, every
        self.done = 0
        self.start = self._last = time.perf_counter()

    def update(self, n: int = 1, note: str = "") -> None:
        """``n`` more done; ``note`` is appended to the line (e.g. tenants done)."""
        self.done += n
        now = time.perf_counter()
        if now - self._last >= self.every or self.done >= self.total:
            self._last = now
            elapsed = now - self.start
            rate = self.done / elapsed if elapsed else 0.0
            eta = f", ETA {(self.total - self.done) / rate:.0f} s" if rate and self.done < self.total else ""
            print(
                f"{self.label}: {self.done}/{self.total} {self.unit}{note} ({rate:.1f}/s, {elapsed:.0f} s{eta})",
                file=sys.stderr,
                flush=True,
            )


@dataclass
class Answer:
    """One recall: the ranked ids it returned (memory ids, or whatever the caller
    maps them to), what it cost, and the names of the ranking factors
    (``items[].factors``) applied to any item."""

    ranked: list[str]
    ms: float
    source_ms: dict[str, float]
    degraded: list[str]
    embedding_ms: float
    factors: frozenset[str] = frozenset()


@dataclass
class ConfigRun:
    answers: list[Answer] = field(default_factory=list)
    wall_s: float = 0.0


async def post_retrying(
    client: httpx.AsyncClient, path: str, body: Any, headers: Mapping[str, str], tries: int = 5
) -> httpx.Response:
    """POST as an agent runtime would: a 429 or 503 is retried after its
    Retry-After (a write with ids replaces, so a retry is safe); any other
    error, or the last try's, is raised with the service's detail."""
    content = msgspec.json.encode(body)
    sent = {**headers, "content-type": "application/json"}
    for attempt in range(tries):
        r = await client.post(path, content=content, headers=sent)
        if r.status_code not in (429, 503) or attempt == tries - 1:
            break
        print(f"{path}: {r.status_code} {r.json().get('detail')}; retrying", flush=True)
        await asyncio.sleep(float(r.headers.get("retry-after", "1")))
    if r.is_error:
        raise ApiError(f"POST {path} answered {r.status_code}: {r.text[:2000]}", r.status_code)
    return r


async def recall_many(
    client: httpx.AsyncClient,
    requests: Sequence[tuple[Mapping[str, str], dict[str, Any]]],
    concurrency: int,
    progress: str | None = None,
) -> ConfigRun:
    """``POST /v1/recall`` for each ``(headers, body)``, ``concurrency`` in flight;
    the answers keep the requests' order and rank the returned memory ids."""
    answers: list[Answer | None] = [None] * len(requests)
    pending = iter(range(len(requests)))
    meter = Progress(progress, len(requests), "recalls") if progress else None

    async def worker() -> None:
        for i in pending:
            headers, body = requests[i]
            start = time.perf_counter()
            r = await client.post("/v1/recall", json=body, headers=headers)
            ms = (time.perf_counter() - start) * 1000
            if r.status_code != 200:
                raise RuntimeError(f"recall {r.status_code}: {r.text[:500]}")
            out = r.json()
            answers[i] = Answer(
                ranked=[item["id"] for item in out["items"]],
                ms=ms,
                source_ms={n: s["ms"] for n, s in out["sources"].items() if s["status"] == "ok"},
                degraded=list(out["degraded"]),
                embedding_ms=float(out.get("embedding_ms") or 0.0),
                factors=frozenset(
                    name for item in out["items"] for name, f in (item.get("factors") or {}).items() if f != 1
                ),
            )
            if meter is not None:
                meter.update()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    done = [a for a in answers if a is not None]
    assert len(done) == len(requests)
    return ConfigRun(done, time.perf_counter() - start)
