"""``python -m benchmarks.load.client_cost``: client CPU per request, LeanClient vs httpx.

httpx is measured twice: with its default transport (httpcore) and over the
service's Typesense transport (``indexers.typesense.transport.LeanTransport``).
Every client POSTs the same ~4 KB JSON body, from 8 concurrent workers, to an
asyncio echo server in a separate process (so the server's CPU is not counted),
and ``time.process_time()`` of this process is the client's cost. One line per
client: requests, client CPU ms per request, requests/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import httpx

from indexers.typesense.transport import LeanTransport

from .client import LeanClient

__all__ = ["main"]

# A minimal keep-alive HTTP/1.1 server: answers each request with its body.
SERVER = r"""
import asyncio, sys

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buf = transport, b""

    def data_received(self, data):
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            length = 0
            for line in self.buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4 : end + 4 + length], self.buf[end + 4 + length :]
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            self.transport.write(head % len(body) + body)

async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main())
"""

Post = Callable[[bytes], Awaitable[None]]


async def drive(post: Post, body: bytes, requests: int, workers: int) -> tuple[float, float]:
    """(client CPU seconds, wall seconds) for ``requests`` POSTs from ``workers`` closed loops."""
    await asyncio.gather(*(post(body) for _ in range(workers * 10)))  # warm up: connections, caches
    todo = iter(range(requests))

    async def worker() -> None:
        for _ in todo:
            await post(body)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return time.process_time() - cpu, time.perf_counter() - wall


async def measure(url: str, requests: int, workers: int, body: bytes) -> dict[str, tuple[float, float]]:
    headers = {"Authorization": "Bearer bench-key", "Content-Type": "application/json"}
    results = {}

    async with LeanClient(url, max_connections=64) as lean:

        async def lean_post(b: bytes) -> None:
            status, data = await lean.post("/v1/search", b, headers, timeout=120)
            assert status == 200 and data == b, status

        results["LeanClient"] = await drive(lean_post, body, requests, workers)

    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def httpx_post(b: bytes) -> None:
            r = await client.post("/v1/search", content=b, headers=headers)
            assert r.status_code == 200 and r.content == b, r.status_code

        results["httpx.AsyncClient"] = await drive(httpx_post, body, requests, workers)

    async with httpx.AsyncClient(base_url=url, timeout=120, transport=LeanTransport(keep_alive=64)) as client:

        async def transport_post(b: bytes) -> None:
            r = await client.post("/v1/search", content=b, headers=headers)
            assert r.status_code == 200 and r.content == b, r.status_code

        results["httpx+LeanTransport"] = await drive(transport_post, body, requests, workers)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load.client_cost", description=__doc__)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--body-bytes", type=int, default=4096)
    args = parser.parse_args()
    body = json.dumps({"query": "x" * (args.body_bytes - 13)}).encode()
    assert len(body) == args.body_bytes, len(body)
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        results = asyncio.run(measure(f"http://127.0.0.1:{port}", args.requests, args.workers, body))
    finally:
        server.terminate()
        server.wait()
    for name, (cpu, wall) in results.items():
        print(
            f"{name:20} requests={args.requests} workers={args.workers} body={len(body)} B"
            f"  client CPU {cpu / args.requests * 1000:.3f} ms/request  {args.requests / wall:,.0f} requests/s"
        )


if __name__ == "__main__":
    main()
