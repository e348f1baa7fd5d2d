"""A Braid app served over a real loopback socket, for clients that speak HTTP
(the Python client, the CLI, framework adapters).

:func:`live` runs the app from ``make_app`` under granian (the server
``python -m service`` uses) on an event loop of its own, in a thread of the
test process, on a free port; the app's lifespan opens and closes the
runtime there. The session's embedder is shared, so nothing loads the model
again. Tests then talk to ``url`` with any client, sync or async, and may run
the CLI as a subprocess against it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from litestar import Litestar

from deploy.embedded import free_port

__all__ = ["Live", "live"]


@dataclass
class Live:
    url: str
    app: Litestar
    dsn: str
    alias: str


@contextmanager
def live(app: Litestar, dsn: str = "", alias: str = "", startup_s: float = 60) -> Iterator[Live]:
    from granian.constants import Interfaces
    from granian.server.embed import Server

    port = free_port()
    ready: dict[str, Any] = {}
    failed: list[BaseException] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            server = Server(app, address="127.0.0.1", port=port, interface=Interfaces.ASGI, log_access=False)
            ready.update(server=server, loop=loop)
            loop.run_until_complete(server.serve())
        except BaseException as exc:  # reported to the test below
            failed.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, name=f"braid-live-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_s
    while True:
        assert not failed, f"the server did not start: {failed[0]!r}"
        try:
            httpx.get(f"{url}/health", timeout=5)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise AssertionError(f"no answer from {url} after {startup_s} s") from None
            time.sleep(0.05)
    try:
        yield Live(url=url, app=app, dsn=dsn, alias=alias)
    finally:
        ready["loop"].call_soon_threadsafe(ready["server"].stop)
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server thread did not stop"
