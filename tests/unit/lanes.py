"""A lane held busy for a block (fault injection): what is queued meanwhile is known."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from indexers.embedding import Lane


@asynccontextmanager
async def lane_held(lane: Lane) -> AsyncIterator[None]:
    """``lane`` runs a job that waits for the end of the block."""
    release, holding = threading.Event(), threading.Event()

    def held() -> None:
        holding.set()
        assert release.wait(10)

    async with anyio.create_task_group() as tg:
        tg.start_soon(lane.run, held)
        with anyio.fail_after(5):
            while not holding.is_set():
                await anyio.sleep(0.001)
        try:
            yield
        finally:
            release.set()


async def settle() -> None:
    """Let the tasks started so far run up to their first real wait."""
    for _ in range(20):
        await anyio.sleep(0)
