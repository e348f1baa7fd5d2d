"""The Braid MCP server: ``recall`` and ``remember`` as tools, on the official
``mcp`` SDK's :class:`~mcp.server.mcpserver.MCPServer`.

Every tool call goes to Braid through one :class:`braid.AsyncClient`, opened
when the server starts and closed when it stops, with the API key the server
was started with: the key's tenant is the only one its tools can read or
write (no tool takes a tenant). Braid's answers to a bad call (a 4xx naming
the field), its outages and an unreachable Braid are tool errors carrying
the service's message (``isError``), never a crash of the server.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any, Literal

import httpx
import msgspec
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from .. import __version__
from ..client import DEFAULT_RETRY, DEFAULT_TIMEOUT, AsyncClient
from ..errors import BraidError, ConnectError, HTTPError, Unauthorized
from ..models import Memory, Recall
from ..retry import Retry

__all__ = ["INSTRUCTIONS", "RecallOutput", "RecalledMemory", "RememberOutput", "create_server"]

INSTRUCTIONS = (
    "Braid is your long-term memory. Before answering, call `recall` with the user's message (or "
    "what you need to know) and use the memory block it returns. When you learn something worth "
    "keeping (a fact about the user, a decision, a preference), call `remember` with it."
)

#: What the block reads when no memory matched.
NO_MEMORIES = "(no memories)"

BraidContext = Context[AsyncClient, Any]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class RecalledMemory(BaseModel):
    """One recalled memory, with how its score came about
    (``score = rrf_score × Π factors``, ``rrf_score = Σ contributions``)."""

    id: str
    content: str
    kind: str
    tier: str
    created_at: datetime
    confidence: float
    speaker: str | None = None
    importance: float | None = None
    mem_key: str | None = None
    expires_at: datetime | None = None
    score: float
    rrf_score: float
    ranks: dict[str, int | None] = Field(description="Source -> the memory's rank in its list (null: not in it).")
    contributions: dict[str, float] = Field(description="Source -> its RRF contribution.")
    factors: dict[str, float] = Field(description="Factor (recency, speaker, ...) -> multiplier.")
    in_block: bool = Field(description="Whether the memory is in the block (the token budget may leave it out).")
    truncated: bool = Field(description="Whether the block holds it cut short.")


class RecallOutput(BaseModel):
    """``recall``'s structured result; its text content is ``block``."""

    block: str = Field(description="The token-budgeted memory block, ready to paste into a prompt.")
    tokens: int = Field(description="The block's length in tokens.")
    strategy: str = Field(description="The strategy that ran (auto, semantic, keyword or recent).")
    degraded: list[str] = Field(description="Sources that timed out or failed; the answer came from the others.")
    items: list[RecalledMemory] = Field(description="The recalled memories, best first.")


class RememberOutput(BaseModel):
    """``remember``'s structured result."""

    ids: list[str] = Field(description="The id of the memory written.")
    superseded: list[str] = Field(description="Memories this one retired (the same mem_key).")


def tool_error(error: BraidError, url: str) -> ToolError:
    """The tool error a failed Braid call becomes: the service's own message,
    with its status, and for a bad key or an unreachable Braid what to fix."""
    if isinstance(error, Unauthorized):
        return ToolError(f"Braid answered 401: {error.detail} (the MCP server's BRAID_API_KEY or --key)")
    if isinstance(error, HTTPError):
        return ToolError(f"Braid answered {error.status}: {error.detail}")
    if isinstance(error, ConnectError):
        return ToolError(f"cannot reach Braid at {url}: {error}")
    return ToolError(f"Braid: {error}")


def block_text(answer: Recall) -> str:
    """``recall``'s text: the block; when it is empty, why."""
    if answer.block:
        return answer.block
    if answer.items:
        n = len(answer.items)
        return f"(none of the {n} memories found fits in the token budget: raise budget_tokens)"
    return NO_MEMORIES


def _text(text: str, structured: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)


def create_server(
    url: str | None = None,
    api_key: str | None = None,
    *,
    timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
    retry: Retry = DEFAULT_RETRY,
    client_factory: Callable[[], AsyncClient] | None = None,
    log_level: LogLevel = "INFO",
) -> MCPServer[AsyncClient]:
    """An MCP server named ``braid`` whose tools talk to the Braid at ``url``
    with ``api_key`` (default ``$BRAID_URL`` and ``$BRAID_API_KEY``).
    ``client_factory`` replaces the :class:`~braid.AsyncClient` it opens.
    ``log_level`` is the SDK's (it sets up logging to stderr when the server
    is made); httpx's line per request is logged at ``DEBUG`` only."""

    def open_client() -> AsyncClient:
        if client_factory is not None:
            return client_factory()
        return AsyncClient(url, api_key, timeout=timeout, retry=retry)

    @asynccontextmanager
    async def lifespan(_: MCPServer[AsyncClient]) -> AsyncIterator[AsyncClient]:
        async with open_client() as client:
            yield client

    server: MCPServer[AsyncClient] = MCPServer(
        "braid",
        title="Braid memory",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        log_level=log_level,
    )
    if log_level != "DEBUG":
        logging.getLogger("httpx").setLevel(logging.WARNING)

    @server.tool(
        annotations=ToolAnnotations(title="Recall memories", read_only_hint=True, open_world_hint=False),
    )
    async def recall(
        query: Annotated[str, Field(description="What to recall: the user's message, or what you need to know.")],
        ctx: BraidContext,
        top_k: Annotated[int | None, Field(ge=1, description="Most memories to return (default: Braid's).")] = None,
        budget_tokens: Annotated[
            int | None, Field(ge=1, description="Longest block, in tokens (default: Braid's).")
        ] = None,
        strategy: Annotated[
            Literal["auto", "semantic", "keyword", "recent"] | None,
            Field(
                description="auto: every source, fused (default); semantic: by meaning; keyword: by words; "
                "recent: the newest memories passing the filters (query not needed)."
            ),
        ] = None,
        session_id: Annotated[str | None, Field(description="Only memories of this session.")] = None,
        tags: Annotated[list[str] | None, Field(description="Only memories with any of these tags.")] = None,
        kinds: Annotated[list[str] | None, Field(description="Only memories of these kinds (fact, note, ...).")] = None,
        tiers: Annotated[list[str] | None, Field(description="Only memories of these tiers.")] = None,
        created_after: Annotated[datetime | None, Field(description="Only memories created after (RFC 3339).")] = None,
        created_before: Annotated[
            datetime | None, Field(description="Only memories created before (RFC 3339).")
        ] = None,
        min_confidence: Annotated[float | None, Field(ge=0, le=1, description="Lowest confidence, 0-1.")] = None,
        min_importance: Annotated[float | None, Field(ge=0, le=1, description="Lowest importance, 0-1.")] = None,
        metadata: Annotated[
            dict[str, Any] | None, Field(description="Only memories whose metadata contains this object.")
        ] = None,
        as_of: Annotated[
            datetime | None, Field(description="Answer as Braid would have at this time (RFC 3339).")
        ] = None,
    ) -> Annotated[CallToolResult, RecallOutput]:
        """Recall what Braid remembers for a query: returns the memory block to read
        before answering (the memories that matter most, each with its kind and date)."""
        client = ctx.request_context.lifespan_context
        try:
            answer = await client.recall(
                query,
                top_k=top_k,
                budget_tokens=budget_tokens,
                strategy=strategy,
                session_id=session_id,
                tags=tags,
                kinds=kinds,
                tiers=tiers,
                created_after=created_after,
                created_before=created_before,
                min_confidence=min_confidence,
                min_importance=min_importance,
                metadata=metadata,
                as_of=as_of,
            )
        except BraidError as error:
            raise tool_error(error, client.url) from error
        structured = {
            "block": answer.block,
            "tokens": answer.tokens,
            "strategy": answer.strategy,
            "degraded": answer.degraded,
            "items": msgspec.to_builtins(answer.items),
        }
        return _text(block_text(answer), structured)

    @server.tool(
        annotations=ToolAnnotations(
            title="Remember", read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
        ),
    )
    async def remember(
        content: Annotated[str, Field(description="What to remember, as a self-contained statement.")],
        ctx: BraidContext,
        kind: Annotated[
            str | None, Field(description="fact, decision, preference, event, note (default) or your own.")
        ] = None,
        tags: Annotated[list[str] | None, Field(description="Labels to filter recalls by.")] = None,
        importance: Annotated[float | None, Field(ge=0, le=1, description="How much it matters, 0-1.")] = None,
        confidence: Annotated[float | None, Field(ge=0, le=1, description="How sure it is, 0-1 (default 1).")] = None,
        session_id: Annotated[str | None, Field(description="The conversation it comes from.")] = None,
        speaker: Annotated[str | None, Field(description="Who said it: a person's name, user or assistant.")] = None,
        mem_key: Annotated[
            str | None,
            Field(description="The fact it states, e.g. user.home_city: replaces the key's current memory."),
        ] = None,
        entities: Annotated[list[str] | None, Field(description="Names of people and things it is about.")] = None,
        metadata: Annotated[dict[str, Any] | None, Field(description="Any JSON object to keep with it.")] = None,
        tier: Annotated[str | None, Field(description="Memory tier (default: Braid's defaultTier).")] = None,
        ttl_seconds: Annotated[int | None, Field(ge=1, description="Forget it this many seconds from now.")] = None,
        id: Annotated[
            str | None, Field(description="Its id: writing an existing id replaces that memory (default: new).")
        ] = None,
    ) -> Annotated[CallToolResult, RememberOutput]:
        """Store a memory in Braid so later recalls find it; returns its id."""
        client = ctx.request_context.lifespan_context
        memory = Memory(
            content=content,
            id=id,
            kind=kind,
            tier=tier,
            session_id=session_id,
            tags=tuple(tags or ()),
            importance=importance,
            confidence=confidence,
            speaker=speaker,
            metadata=metadata,
            entities=tuple(entities or ()),
            mem_key=mem_key,
            ttl_seconds=ttl_seconds,
        )
        try:
            written = await client.remember(memory)
        except BraidError as error:
            raise tool_error(error, client.url) from error
        text = f"Remembered as {written.ids[0]}."
        if written.superseded:
            text += f" It replaces {', '.join(written.superseded)} (the same mem_key)."
        return _text(text, {"ids": written.ids, "superseded": written.superseded})

    return server
