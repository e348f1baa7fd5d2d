"""The Braid MCP server (``python -m braid.mcp``, ``braid mcp``) with the
official ``mcp`` SDK's own client over both of its transports, against a
Braid served over a loopback socket (the real Postgres and Typesense):

- stdio: the SDK's client spawns ``python -m braid.mcp`` and talks over its
  stdin and stdout, as an MCP host does;
- streamable HTTP: ``braid mcp --transport http`` runs on a free port and the
  SDK's client connects to ``/mcp``.

Over each: the tools and their input schemas, ``remember`` then ``recall``
finding the remembered text in the block, Braid's refusals as tool errors
carrying its message (the server keeps serving), the tenant of the key."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp
import pytest
from mcp import StdioServerParameters
from mcp.types import CallToolResult, TextContent

import braid
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense, free_port

from .conftest import AGENT_A, AGENT_B
from .live import Live
from .seeded import readme_block, seeded, settled

ROOT = Path(__file__).resolve().parents[2]
CAR_QUESTION = "what car does Alex drive to work?"

Connect = Callable[..., AbstractAsyncContextManager[mcp.Client]]


@pytest.fixture(scope="module")
def server(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> Iterator[Live]:
    with seeded(postgres, typesense, embedder) as srv:
        yield srv


def server_env(url: str, key: str) -> dict[str, str]:
    return {"BRAID_URL": url, "BRAID_API_KEY": key}


@asynccontextmanager
async def over_stdio(url: str, key: str) -> AsyncIterator[mcp.Client]:
    """The SDK's stdio client spawning ``python -m braid.mcp`` (as an MCP host's config says)."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "braid.mcp"], env=server_env(url, key), cwd=ROOT)
    async with mcp.Client(params) as client:
        yield client


class HTTPServer:
    """``braid mcp --transport http`` as a subprocess on a free port."""

    def __init__(self, url: str, key: str, log: Path) -> None:
        self.port = free_port()
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")} | server_env(url, key)
        with log.open("wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "braid", "mcp", "--transport", "http", "--port", str(self.port)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=f,
            )
        deadline = time.monotonic() + 120
        while not self._listening():
            assert self.proc.poll() is None, f"braid mcp exited {self.proc.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, f"braid mcp not listening after 120 s: {log.read_text()}"
            time.sleep(0.05)

    def _listening(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        """Ctrl-C, as a person stops it: a clean shutdown, exit status 130 (interrupted)."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=60)
        log = self.log.read_text()
        assert code == 130, log
        assert "Application shutdown complete." in log and "Traceback" not in log, log


@pytest.fixture(params=["stdio", "http"])
def connect(request: pytest.FixtureRequest, server: Live, tmp_path: Path) -> Iterator[Connect]:
    """``connect(key=..., url=...)``: an SDK client session with a Braid MCP
    server started with that key (default tenant A's) and Braid URL, over
    the transport of the test's parameter."""
    started: list[HTTPServer] = []

    @asynccontextmanager
    async def over_http(url: str, key: str) -> AsyncIterator[mcp.Client]:
        srv = HTTPServer(url, key, tmp_path / f"mcp-{len(started)}.log")
        started.append(srv)
        async with mcp.Client(srv.endpoint) as client:
            yield client

    transport = over_stdio if request.param == "stdio" else over_http

    def connect(key: str = AGENT_A, url: str | None = None) -> AbstractAsyncContextManager[mcp.Client]:
        return transport(url or server.url, key)

    yield connect
    for srv in started:
        srv.stop()


def forget(url: str, *ids: str) -> None:
    """Delete memories a test wrote, and wait until Typesense has dropped them too
    (the next test's recalls rank the seeded memories alone)."""
    with braid.Client(url, AGENT_A) as client:
        for memory_id in ids:
            client.delete_memory(memory_id)
    settled(url)


def text_of(result: CallToolResult) -> str:
    assert len(result.content) == 1 and isinstance(result.content[0], TextContent)
    return result.content[0].text


@pytest.mark.anyio
async def test_the_tools_and_their_input_schemas(connect: Connect) -> None:
    async with connect() as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert sorted(tools) == ["recall", "remember"]

    recall = tools["recall"]
    assert recall.input_schema["required"] == ["query"]
    assert set(recall.input_schema["properties"]) == {
        "query",
        "top_k",
        "budget_tokens",
        "strategy",
        "session_id",
        "tags",
        "kinds",
        "tiers",
        "created_after",
        "created_before",
        "min_confidence",
        "min_importance",
        "metadata",
        "as_of",
    }
    top_k = recall.input_schema["properties"]["top_k"]
    assert top_k["anyOf"][0] == {"type": "integer", "minimum": 1}
    assert recall.output_schema is not None
    assert {"block", "tokens", "strategy", "degraded", "items"} <= set(recall.output_schema["properties"])
    assert recall.annotations is not None and recall.annotations.read_only_hint is True

    remember = tools["remember"]
    assert remember.input_schema["required"] == ["content"]
    assert set(remember.input_schema["properties"]) == {
        "content",
        "kind",
        "tags",
        "importance",
        "confidence",
        "session_id",
        "speaker",
        "mem_key",
        "entities",
        "metadata",
        "tier",
        "ttl_seconds",
        "id",
    }
    assert remember.annotations is not None and remember.annotations.read_only_hint is False
    # The tenant is the key's: no tool takes one, nor the SDK's context.
    for tool in tools.values():
        assert not {"tenant", "ctx", "api_key"} & set(tool.input_schema["properties"])


@pytest.mark.anyio
async def test_remember_then_recall_finds_it_in_the_block(connect: Connect, server: Live) -> None:
    async with connect() as client:
        written = await client.call_tool(
            "remember",
            {
                "content": "Alex keeps a bonsai juniper named Kiko on the balcony",
                "kind": "fact",
                "tags": ["plants"],
                "speaker": "Alex",
                "session_id": "s-plants",
                "importance": 0.7,
                "metadata": {"room": "balcony"},
            },
        )
        assert not written.is_error, text_of(written)
        ids = written.structured_content["ids"]
        try:
            assert len(ids) == 1 and written.structured_content["superseded"] == []
            assert text_of(written) == f"Remembered as {ids[0]}."
            # Found at once by pgvector (Postgres is written before the answer);
            # once the outbox has brought it to Typesense too, it is first.
            recalled = await client.call_tool("recall", {"query": "what is the name of Alex's bonsai?"})
            assert "Alex keeps a bonsai juniper named Kiko on the balcony" in text_of(recalled)
            await anyio.to_thread.run_sync(settled, server.url)
            recalled = await client.call_tool("recall", {"query": "what is the name of Alex's bonsai?", "top_k": 3})
            assert not recalled.is_error, text_of(recalled)
            block = text_of(recalled)
            assert block.startswith("[Memory: fact | ")
            assert block.splitlines()[1] == "Alex keeps a bonsai juniper named Kiko on the balcony"
            structured = recalled.structured_content
            assert structured["block"] == block
            assert structured["items"][0]["id"] == ids[0]
            assert structured["items"][0]["ranks"]["pgvector"] == 1
            assert structured["items"][0]["ranks"]["typesense"] == 1
            assert structured["strategy"] == "auto" and structured["degraded"] == []

            # Written to the key's tenant with every field given.
            with braid.Client(server.url, AGENT_A) as braid_client:
                stored = braid_client.memory(ids[0])
                assert (stored.kind, stored.tags, stored.speaker) == ("fact", ["plants"], "Alex")
                assert (stored.session_id, stored.importance, stored.metadata) == ("s-plants", 0.7, {"room": "balcony"})
        finally:
            forget(server.url, *ids)


@pytest.mark.anyio
async def test_recall_filters_and_strategies_pass_through(connect: Connect) -> None:
    async with connect() as client:
        recent = await client.call_tool("recall", {"query": "", "strategy": "recent", "tags": ["music", "cars"]})
        assert [i["id"] for i in recent.structured_content["items"]] == ["cello", "car"]
        filtered = await client.call_tool(
            "recall",
            {"query": "which database do we trust?", "kinds": ["decision"], "metadata": {"team": "platform"}},
        )
        assert [i["id"] for i in filtered.structured_content["items"]] == ["database"]
        assert text_of(filtered).startswith("[Memory: decision | 2026-01-15]\nWe chose Postgres")
        nothing = await client.call_tool("recall", {"query": CAR_QUESTION, "session_id": "no-such-session"})
        tight = await client.call_tool(
            "recall", {"query": "What does Alex do every week?", "top_k": 2, "budget_tokens": 1}
        )
    assert not nothing.is_error
    assert text_of(nothing) == "(no memories)"
    assert nothing.structured_content["items"] == []
    assert text_of(tight) == "(none of the 2 memories found fits in the token budget: raise budget_tokens)"
    assert tight.structured_content["block"] == "" and tight.structured_content["tokens"] == 0


@pytest.mark.anyio
async def test_a_new_version_of_a_fact_says_what_it_replaces(connect: Connect, server: Live) -> None:
    key = f"user.home_city.{time.monotonic_ns()}"
    async with connect() as client:
        first = await client.call_tool("remember", {"content": "Sam lives in Lisbon", "mem_key": key})
        second = await client.call_tool("remember", {"content": "Sam lives in Porto", "mem_key": key})
    old, new = first.structured_content["ids"][0], second.structured_content["ids"][0]
    try:
        assert second.structured_content["superseded"] == [old]
        assert text_of(second) == f"Remembered as {new}. It replaces {old} (the same mem_key)."
        with braid.Client(server.url, AGENT_A) as braid_client:
            assert [m.id for m in braid_client.versions(key).memories] == [new, old]
    finally:
        forget(server.url, new, old)


@pytest.mark.anyio
async def test_braids_refusals_are_tool_errors_with_its_message(connect: Connect) -> None:
    async with connect() as client:
        too_many = await client.call_tool("recall", {"query": CAR_QUESTION, "top_k": 101})
        assert too_many.is_error
        assert text_of(too_many) == (
            "Error executing tool recall: Braid answered 400: top_k must be between 1 and 100, got 101"
        )
        bad_tier = await client.call_tool("remember", {"content": "Filed in the archive", "tier": "archive"})
        assert bad_tier.is_error
        assert text_of(bad_tier) == (
            "Error executing tool remember: Braid answered 400: "
            "memories[0].tier: unknown tier 'archive'; memory tiers are ['session', 'rag']"
        )
        # Arguments the input schema refuses never reach Braid: the SDK says which.
        below = await client.call_tool("recall", {"query": CAR_QUESTION, "top_k": 0})
        assert below.is_error
        assert text_of(below).startswith("Error executing tool recall: 1 validation error for recallArguments\ntop_k\n")
        # The server is still serving.
        fine = await client.call_tool("recall", {"query": CAR_QUESTION, "top_k": 1})
    assert not fine.is_error
    assert fine.structured_content["items"][0]["id"] == "car", fine.structured_content


@pytest.mark.anyio
async def test_the_tenant_is_the_keys(connect: Connect) -> None:
    async with connect(key=AGENT_B) as client:
        answer = await client.call_tool("recall", {"query": CAR_QUESTION})
    assert not answer.is_error
    assert text_of(answer) == "(no memories)"


@pytest.mark.anyio
async def test_a_bad_key_is_a_tool_error_naming_what_to_fix(connect: Connect) -> None:
    async with connect(key="not-a-key-0123456789") as client:
        answer = await client.call_tool("remember", {"content": "Nobody will keep this"})
    assert answer.is_error
    assert text_of(answer) == (
        "Error executing tool remember: Braid answered 401: invalid API key (the MCP server's BRAID_API_KEY or --key)"
    )


@pytest.mark.anyio
async def test_an_unreachable_braid_is_a_tool_error(connect: Connect) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}"
    async with connect(url=url) as client:
        answer = await client.call_tool("recall", {"query": CAR_QUESTION})
    assert answer.is_error
    assert text_of(answer).startswith(
        f"Error executing tool recall: cannot reach Braid at {url}: POST /v1/recall: cannot connect: "
    )


def test_the_server_needs_a_key() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
    for args in (["-m", "braid.mcp"], ["-m", "braid", "mcp", "--transport", "http"]):
        done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2
        assert done.stdout == ""
        assert done.stderr == (
            "braid: error: no API key: pass --key or set BRAID_API_KEY (the MCP tools act in that key's tenant)\n"
        )


@pytest.mark.anyio
async def test_the_readme_examples_run(server: Live, tmp_path: Path) -> None:
    """The README's host config (its args and env, ``braid`` run as ``python
    -m braid``) spawned over stdio as a host would, and its SDK client
    example against ``braid mcp --transport http``."""
    host = json.loads(readme_block("MCP", "json"))["mcpServers"]["braid"]
    assert (host["command"], host["args"], sorted(host["env"])) == ("braid", ["mcp"], ["BRAID_API_KEY", "BRAID_URL"])
    env = host["env"] | {"BRAID_URL": server.url, "BRAID_API_KEY": AGENT_A}
    params = StdioServerParameters(command=sys.executable, args=["-m", "braid", *host["args"]], env=env, cwd=ROOT)
    async with mcp.Client(params) as client:
        answer = await client.call_tool("recall", {"query": CAR_QUESTION, "top_k": 1})
    assert text_of(answer).startswith("[Memory: fact | 2026-05-02]\nAlex drives a red Mazda MX-5 to work every day")

    srv = HTTPServer(server.url, AGENT_A, tmp_path / "mcp.log")
    try:
        example = readme_block("MCP", "python").replace("http://127.0.0.1:8081/mcp", srv.endpoint)
        done = subprocess.run([sys.executable, "-c", example], cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        srv.stop()
    assert done.returncode == 0, done.stderr
    assert "Alex drives a red Mazda MX-5" in done.stdout
    with braid.Client(server.url, AGENT_A) as braid_client:  # the example's memory is the newest: remove it
        newest = braid_client.recall(strategy="recent", top_k=1).items[0]
    assert newest.content == "Alex drives a red Mazda MX-5"
    forget(server.url, newest.id)
