"""benchmarks.load.run.paced: jobs started on an open-loop schedule."""

from __future__ import annotations

import asyncio

from benchmarks.load.run import paced


def test_every_job_starts_in_order_and_none_waits_for_an_earlier_one() -> None:
    started: list[int] = []
    release = asyncio.Event()

    async def job(k: int) -> None:
        started.append(k)
        await release.wait()  # no job ends before the last has started

    async def main() -> list[int]:
        tasks = await paced(1000.0, 5, job)
        await asyncio.sleep(0)
        assert not any(t.done() for t in tasks)
        release.set()
        await asyncio.gather(*tasks)
        return started

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]
