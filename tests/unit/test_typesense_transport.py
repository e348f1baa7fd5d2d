"""indexers.typesense.transport against a scripted HTTP/1.1 server on loopback.

Each test's server answers each request it reads with the next scripted
action, so the transport meets what a Typesense node can do: keep-alive,
chunked answers, the ``HTTP/1.1 0`` status line, a connection closed while
idle or reset before the answer, and silence.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from indexers.typesense.client import TypesenseClient
from indexers.typesense.transport import LeanTransport

pytestmark = pytest.mark.anyio

Action = Callable[[bytes], bytes | None]


def ok(body: bytes = b'{"ok":true}', *, close: bool = False) -> Action:
    extra = b"Connection: close\r\n" if close else b""
    return lambda _: (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n"
        + extra
        + b"\r\n"
        + body
    )


class Server:
    """Reads requests (head + Content-Length body) and answers each with the
    next action's bytes; an action answering None closes the connection."""

    def __init__(self, actions: list[Action]) -> None:
        self.actions = actions
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = self.actions.pop(0)(request)
                if answer is None:
                    writer.close()
                    return
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@asynccontextmanager
async def serving(actions: list[Action]) -> AsyncIterator[Server]:
    server = Server(actions)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        listener.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_requests_share_one_kept_alive_connection_and_send_what_httpx_built() -> None:
    async with serving([ok(b'{"n":1}'), ok(b'{"n":2}'), ok(b'{"n":3}')]) as server:
        async with httpx.AsyncClient(transport=LeanTransport(), headers={"X-Key": "k"}) as client:
            answers = [
                (await client.post(f"{server.url}/multi_search?x=1", json={"searches": [i]})).json() for i in range(3)
            ]
    assert answers == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /multi_search?x=1 HTTP/1.1\r\n")
    assert b"\r\nx-key: k\r\n" in first.lower() and first.endswith(b'{"searches":[0]}')


async def test_a_chunked_answer_is_read_whole() -> None:
    chunked = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"a":\r\n3\r\n[1]\r\n1\r\n}\r\n0\r\n\r\n'
    async with serving([lambda _: chunked, ok()]) as server:
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            assert (await client.get(f"{server.url}/health")).json() == {"a": [1]}
            # The connection stays usable after it.
            assert (await client.get(f"{server.url}/health")).json() == {"ok": True}
    assert server.connections == 1


async def test_a_connection_the_server_closes_is_not_used_again() -> None:
    async with serving([ok(close=True), ok(), lambda _: None, ok()]) as server:
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            assert (await client.get(f"{server.url}/a")).status_code == 200
            assert (await client.get(f"{server.url}/b")).status_code == 200
            # Closed by the server without an answer on a reused connection: sent once more, on a new one.
            assert (await client.get(f"{server.url}/c")).status_code == 200
    assert server.connections == 3
    assert [r.split(b" ")[1] for r in server.requests] == [b"/a", b"/b", b"/c", b"/c"]


async def test_the_no_leader_status_line_is_the_error_the_client_fails_over_on() -> None:
    async with serving([lambda _: b"HTTP/1.1 0 \r\nContent-Length: 0\r\n\r\n"]) as server:
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            with pytest.raises(httpx.RemoteProtocolError) as info:
                await client.post(f"{server.url}/collections/x/documents/import", content=b"{}")
    assert TypesenseClient._NO_STATUS in str(info.value)


async def test_silence_is_a_read_timeout_and_the_connection_is_dropped() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        await asyncio.sleep(5)
        writer.close()

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    transport = LeanTransport()
    try:
        async with httpx.AsyncClient(transport=transport, timeout=0.2) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.get(f"http://127.0.0.1:{port}/health")
            assert not any(transport._idle.values())
    finally:
        listener.close()


async def test_a_refused_connection_is_a_connect_error() -> None:
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    async with httpx.AsyncClient(transport=LeanTransport()) as client:
        with pytest.raises(httpx.ConnectError, match="Connection refused"):
            await client.get(f"http://127.0.0.1:{port}/health")


async def test_an_answer_cut_short_is_a_protocol_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(cut, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            with pytest.raises(httpx.RemoteProtocolError, match="before the answer was whole"):
                await client.get(f"http://127.0.0.1:{port}/x")
    finally:
        listener.close()
