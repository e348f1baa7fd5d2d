"""A fault-injecting TCP proxy: forwards bytes both ways until it is told to
stall, then keeps accepting connections but forwards nothing, on old and new
connections alike, as a hung server (or a dead network path) would look to a
client: connected, never answered. Resumed, it delivers what it held.

It runs its own event loop in a daemon thread, so stalling it never depends
on the loop of the code under test. The upstream is a TCP address or a Unix
socket (the embedded Postgres listens on a Unix socket only).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

__all__ = ["StallProxy"]

_CHUNK = 65536


class StallProxy:
    def __init__(self, upstream: tuple[str, int] | Path) -> None:
        self.upstream = upstream
        self.port = 0
        #: Connections accepted since start.
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stall-proxy", daemon=True)
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # --- control (from any thread) ------------------------------------------------

    def start(self) -> int:
        self._thread.start()
        self._call(self._start())
        return self.port

    def stall(self) -> None:
        self._call(self._set_flowing(False))

    def resume(self) -> None:
        self._call(self._set_flowing(True))

    @property
    def stalled(self) -> bool:
        return self._flowing is not None and not self._flowing.is_set()

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    # --- the loop's side ----------------------------------------------------------

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None and self._flowing is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self.accepted += 1
        upstream_w: asyncio.StreamWriter | None = None
        try:
            await self._flowing.wait()  # a new connection is held before it reaches the server
            if isinstance(self.upstream, Path):
                upstream_r, upstream_w = await asyncio.open_unix_connection(str(self.upstream))
            else:
                upstream_r, upstream_w = await asyncio.open_connection(*self.upstream)
            await asyncio.gather(self._pump(client_r, upstream_w), self._pump(upstream_r, client_w))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (client_w, upstream_w):
                if w is not None:
                    w.close()
                    with contextlib.suppress(OSError, asyncio.CancelledError):
                        await w.wait_closed()
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        try:
            while data := await src.read(_CHUNK):
                await self._flowing.wait()  # stalled: hold the bytes, forward nothing
                dst.write(data)
                await dst.drain()
            await self._flowing.wait()
            if dst.can_write_eof():
                dst.write_eof()
        except OSError:
            dst.close()
