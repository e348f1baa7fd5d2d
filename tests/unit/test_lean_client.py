"""``benchmarks.load.client.LeanClient`` against a real loopback server.

The server is a handwritten HTTP/1.1 responder on ``asyncio.start_server``. It
records every request it reads (and on which connection), and the request path
picks the response: Content-Length echo, chunked echo, ``Connection: close``,
a stall, a malformed response, or a connection dropped on the next request.
Where the server's behaviour could mask a client bug (a ``Connection: close``
it does not act on), the test checks what the client did, not the socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from benchmarks.load.client import LeanClient, LeanClientError, Spread

pytestmark = pytest.mark.anyio


@dataclass
class Request:
    conn: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    port: int = 0
    connections: int = 0
    inflight: int = 0
    max_inflight: int = 0
    requests: list[Request] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn, next_request = self.connections, "answer"
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                line, *rest = head.decode("latin-1").split("\r\n")
                method, path, _ = line.split(" ")
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in rest if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append(Request(conn, method, path, headers, body))
                if next_request == "partial":
                    writer.write(b"HTTP/1.1 200 OK\r\n")
                    await writer.drain()
                if next_request != "answer":
                    return
                self.inflight += 1
                self.max_inflight = max(self.max_inflight, self.inflight)
                try:
                    keep, next_request = await self.respond(path, body or path.encode(), writer)
                finally:
                    self.inflight -= 1
                if not keep:
                    return
        finally:
            writer.close()

    async def respond(self, path: str, body: bytes, writer: asyncio.StreamWriter) -> tuple[bool, str]:
        if path == "/hangup":
            return False, ""
        if path == "/bad":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")
            return False, ""
        if path == "/slow":
            await asyncio.sleep(5)
        if path == "/concurrent":
            await asyncio.sleep(0.01)
        if path == "/chunked":
            # Head and first chunk in one write, the rest later: the parser must wait for it.
            chunks = [body[i : i + 3] for i in range(0, len(body), 3)]
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"%x;ext=1\r\n%s\r\n" % (len(chunks[0]), chunks[0]))
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(b"".join(b"%X\r\n%s\r\n" % (len(c), c) for c in chunks[1:]))
            writer.write(b"0\r\nX-Trailer: yes\r\n\r\n")
            return True, "answer"
        # /close says `Connection: close` but keeps serving: the client must obey the header.
        connection = b"Connection: close\r\n" if path == "/close" else b""
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), connection, body))
        await writer.drain()
        return True, {"/drop-next": "drop", "/partial-next": "partial"}.get(path, "answer")


@asynccontextmanager
async def serve() -> AsyncIterator[Server]:
    server = Server()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    async with listener:
        yield server


async def test_content_length_round_trip() -> None:
    async with serve() as srv, LeanClient(f"http://127.0.0.1:{srv.port}") as c:
        big = b'{"x": "%s"}' % (b"a" * 300_000)  # several reads on the client side
        assert await c.post("/echo", b'{"a": 1}', {"X-Key": "k1"}) == (201, b'{"a": 1}')
        assert await c.post("/echo", big) == (201, big)
        assert await c.get("/echo?q=1") == (201, b"/echo?q=1")
    first = srv.requests[0]
    assert (first.method, first.path, first.body) == ("POST", "/echo", b'{"a": 1}')
    assert first.headers == {
        "host": f"127.0.0.1:{srv.port}",
        "content-type": "application/json",
        "content-length": "8",
        "x-key": "k1",
    }
    assert srv.requests[2].headers == {"host": f"127.0.0.1:{srv.port}"}


async def test_chunked_round_trip() -> None:
    async with serve() as srv, LeanClient(f"http://127.0.0.1:{srv.port}") as c:
        assert await c.post("/chunked", b"0123456789abcdef") == (200, b"0123456789abcdef")
        assert await c.post("/chunked", b"x") == (200, b"x")
        assert await c.post("/echo", b"after") == (201, b"after")
    assert srv.connections == 1  # the trailer was consumed: the connection stayed usable


async def test_connection_close_drops_the_connection() -> None:
    async with serve() as srv, LeanClient(f"http://127.0.0.1:{srv.port}") as c:
        assert await c.post("/close", b"one") == (201, b"one")
        assert await c.post("/close", b"two") == (201, b"two")
        assert await c.post("/echo", b"three") == (201, b"three")
    assert [r.conn for r in srv.requests] == [1, 2, 3]


async def test_keep_alive_reuses_one_connection() -> None:
    async with serve() as srv, LeanClient(f"http://127.0.0.1:{srv.port}") as c:
        for i in range(20):
            assert await c.post("/echo", b"%d" % i) == (201, b"%d" % i)
    assert len(srv.requests) == 20
    assert srv.connections == 1


async def test_concurrent_posts_stay_within_max_connections() -> None:
    async with serve() as srv, LeanClient(f"http://127.0.0.1:{srv.port}", max_connections=8) as c:
        bodies = [b'{"i": %d}' % i for i in range(50)]
        results = await asyncio.gather(*(c.post("/concurrent", b) for b in bodies))
    assert results == [(201, b) for b in bodies]
    assert len(srv.requests) == 50
    assert srv.connections == 8
    assert srv.max_inflight == 8


async def test_kept_alive_connection_closed_by_server_is_retried() -> None:
    async with serve() as srv, LeanClient(f"http://127.0.0.1:{srv.port}") as c:
        assert await c.post("/drop-next", b"one") == (201, b"one")
        # The server reads the next request on connection 1 and closes it unanswered.
        assert await c.post("/echo", b"two") == (201, b"two")
    assert [(r.conn, r.body) for r in srv.requests] == [(1, b"one"), (1, b"two"), (2, b"two")]


async def test_no_retry_once_response_bytes_arrived() -> None:
    async with serve() as srv, LeanClient(f"http://127.0.0.1:{srv.port}") as c:
        assert await c.post("/partial-next", b"one") == (201, b"one")
        with pytest.raises(LeanClientError) as err:
            await c.post("/echo", b"two")
    assert str(err.value) == "connection closed after 17 response bytes"
    assert [(r.conn, r.body) for r in srv.requests] == [(1, b"one"), (1, b"two")]


async def test_fresh_connection_closed_unanswered_is_an_error() -> None:
    async with serve() as srv, LeanClient(f"http://127.0.0.1:{srv.port}") as c:
        with pytest.raises(LeanClientError) as err:
            await c.post("/hangup", b"x")
    assert str(err.value) == "connection closed after 0 response bytes"
    assert len(srv.requests) == 1


async def test_malformed_response_is_an_error() -> None:
    async with serve() as srv, LeanClient(f"http://127.0.0.1:{srv.port}") as c:
        with pytest.raises(LeanClientError) as err:
            await c.get("/bad")
    assert str(err.value) == "malformed Content-Length b'x'"


async def test_timeout_raises_and_the_connection_is_not_reused() -> None:
    async with serve() as srv, LeanClient(f"http://127.0.0.1:{srv.port}") as c:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            await c.post("/slow", b"x", timeout=0.2)
        assert loop.time() - start < 1
        assert await c.post("/echo", b"y") == (201, b"y")
    assert [r.conn for r in srv.requests] == [1, 2]


async def test_spread_sends_each_request_to_the_next_server() -> None:
    async with serve() as one, serve() as two:
        urls = [f"http://127.0.0.1:{one.port}", f"http://127.0.0.1:{two.port}"]
        async with Spread(urls, max_connections=4) as spread:
            answers = [await spread.post("/echo", b"%d" % i, {"X-I": str(i)}) for i in range(7)]
            # Concurrent posts keep alternating too.
            answers += await asyncio.gather(*(spread.post("/concurrent", b"c%d" % i) for i in range(6)))
    assert answers[:7] == [(201, b"%d" % i) for i in range(7)]
    assert answers[7:] == [(201, b"c%d" % i) for i in range(6)]
    assert [r.body for r in one.requests[:4]] == [b"0", b"2", b"4", b"6"]
    assert [r.body for r in two.requests[:3]] == [b"1", b"3", b"5"]
    assert (len(one.requests), len(two.requests)) == (7, 6)
    assert one.requests[1].headers["x-i"] == "2"


def test_spread_needs_a_url() -> None:
    with pytest.raises(ValueError, match="at least one URL"):
        Spread([])
