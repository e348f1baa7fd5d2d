"""Bad input gets a 4xx that says what is wrong, and nothing is half-written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import ADMIN_A, AGENT_A, Braid

pytestmark = pytest.mark.anyio


async def send(braid: Braid, path: str, body: Any, key: str | None = AGENT_A, method: str = "POST") -> Any:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if key is not None:
        headers.update(braid.headers(key))
    return await braid.client.request(method, path, content=content, headers=headers)


@pytest.mark.parametrize(
    ("path", "body", "status", "detail"),
    [
        ("/v1/recall", b"{not json", 400, None),
        ("/v1/recall", {"query": ""}, 400, "query must not be empty"),
        ("/v1/recall", {"query": "   "}, 400, "query must not be empty"),
        ("/v1/recall", {"query": "x", "top_k": 0}, 400, "top_k must be between 1 and 100, got 0"),
        ("/v1/recall", {"query": "x", "top_k": 101}, 400, "top_k must be between 1 and 100, got 101"),
        (
            "/v1/recall",
            {"query": "x", "budget_tokens": 0},
            400,
            "budget_tokens must be between 1 and 65536, got 0",
        ),
        ("/v1/recall", {"query": "x", "bogus": 1}, 400, "Object contains unknown field `bogus`"),
        ("/v1/recall", {"query": "x", "hops": 4}, 400, "hops must be between 0 and 3, got 4"),
        ("/v1/recall", {"query": "x", "hops": -1}, 400, "hops must be between 0 and 3, got -1"),
        (
            "/v1/recall",
            {"query": "x" * 32769},
            400,
            "query has 32769 characters; the limit is 32768",
        ),
        (
            "/v1/memories",
            {"memories": [{"content": "y" * 32769}]},
            400,
            "memories[0].content has 32769 characters; the limit is 32768",
        ),
        (
            "/v1/recall",
            {"query": "x", "embedding": [1.0, 2.0]},
            400,
            "embedding has 2 dimensions; expected 384",
        ),
        (
            "/v1/recall",
            b'{"query": "x", "embedding": [1e400' + b", 0.1" * 383 + b"]}",
            400,
            "Number out of range - at `$[...][0]`",
        ),
        ("/v1/recall", b'{"query": "x", "embedding": [NaN]}', 400, None),
        ("/v1/recall", {"query": "x", "sources": ["nope"]}, 400, "sources[0]: Invalid enum value 'nope'"),
        (
            "/v1/recall",
            {"query": "x", "tiers": ["archive"]},
            400,
            "tiers: unknown tier(s) ['archive']; tiers are ['session', 'entities', 'rag']",
        ),
        (
            "/v1/recall",
            {"query": "x", "tags": ["a`b"]},
            400,
            "tags[0]: Expected `str` matching regex '^[^`\\\\x00]+$'",
        ),
        (
            "/v1/memories",
            {"memories": [{"content": "a", "tier": "nope"}]},
            400,
            "memories[0].tier: unknown tier 'nope'; memory tiers are ['session', 'rag']",
        ),
        (
            "/v1/memories",
            {"memories": [{"content": "a", "tier": "entities"}]},
            400,
            "memories[0].tier: unknown tier 'entities'; memory tiers are ['session', 'rag']",
        ),
        ("/v1/memories", {"memories": [{"content": " "}]}, 400, "memories[0].content must not be empty"),
        (
            "/v1/memories",
            {"memories": [{"content": "a", "confidence": 2}]},
            400,
            "memories[0].confidence: Expected `float` <= 1.0",
        ),
        (
            "/v1/memories",
            {"memories": [{"content": "a", "created_at": "2026-01-01T00:00:00"}]},
            400,
            "memories[0].created_at: Expected `datetime` with a timezone component",
        ),
        ("/v1/memories", {"memories": []}, 400, "memories: Expected `array` of length >= 1"),
        (
            "/v1/memories",
            {"memories": [{"content": "a", "embedding": [0.0] * 384}]},
            400,
            "memories[0].embedding is the zero vector",
        ),
        (
            "/v1/memories",
            {"memories": [{"content": "a", "id": "x"}, {"content": "b", "id": "x"}]},
            400,
            "memories[1].id: 'x' appears twice in this request",
        ),
        ("/v1/graph", {}, 400, "give at least one entity or relation"),
        (
            "/v1/graph",
            {"entities": [{"name": f"e{i}"} for i in range(513)]},
            400,
            "entities has 513 items; the limit is 512 per request",
        ),
        (
            "/v1/graph",
            {
                "relations": [
                    {
                        "source": "a",
                        "relation": "r",
                        "target": "b",
                        "valid_from": "2026-02-01T00:00:00Z",
                        "valid_to": "2026-01-01T00:00:00Z",
                    }
                ]
            },
            400,
            "relations[0]: valid_from must be before valid_to",
        ),
    ],
)
async def test_bad_request_is_refused_with_reason(
    braid: Braid, path: str, body: Any, status: int, detail: str | None
) -> None:
    r = await send(braid, path, body)
    assert r.status_code == status, r.text
    if detail is not None:
        assert r.json()["detail"] == detail
    else:
        assert r.json()["detail"]


async def test_oversized_body_is_413(braid: Braid) -> None:
    r = await send(braid, "/v1/memories", b"x" * (5 * 1024 * 1024))
    assert r.status_code == 413


async def test_batch_over_limit(braid: Braid) -> None:
    r = await send(braid, "/v1/memories", {"memories": [{"content": "a"}] * 513})
    assert r.status_code == 400
    assert r.json()["detail"] == "memories has 513 items; the limit is 512 per request"


async def test_bad_item_in_batch_writes_nothing(braid: Braid) -> None:
    r = await send(
        braid,
        "/v1/memories",
        {"memories": [{"content": "first is fine"}, {"content": "bad", "tier": "nope"}]},
    )
    assert r.status_code == 400
    async with braid.runtime.store.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM memories")
        assert (await cur.fetchone())[0] == 0  # type: ignore[index]
        cur = await conn.execute("SELECT count(*) FROM outbox")
        assert (await cur.fetchone())[0] == 0  # type: ignore[index]


async def test_missing_key_is_401(braid: Braid) -> None:
    r = await send(braid, "/v1/recall", {"query": "x"}, key=None)
    assert r.status_code == 401
    assert r.json()["detail"] == "missing API key: send `Authorization: Bearer <key>`"
    assert r.headers["www-authenticate"] == "Bearer"


async def test_wrong_key_is_401(braid: Braid) -> None:
    r = await send(braid, "/v1/recall", {"query": "x"}, key="not-a-key-of-ours-123456")
    assert r.status_code == 401
    assert r.json()["detail"] == "invalid API key"


async def test_admin_endpoints_refuse_agent_key(braid: Braid) -> None:
    r = await send(braid, "/admin/reindex", {"target": "all"})
    assert r.status_code == 403
    assert r.json()["detail"] == "this endpoint needs an admin key"
    r = await send(braid, "/admin/config/reload", {})
    assert r.status_code == 403


async def test_admin_bad_target_and_unknown_job(braid: Braid) -> None:
    r = await send(braid, "/admin/reindex", {"target": "everything"}, key=ADMIN_A)
    assert r.status_code == 400
    assert r.json()["detail"] == "target: Invalid enum value 'everything'"
    r = await braid.client.get("/admin/reindex/nope", headers=braid.headers(ADMIN_A))
    assert r.status_code == 404
    assert r.json()["detail"] == "no reindex job 'nope'"


async def test_delete_unknown_memory_is_404(braid: Braid) -> None:
    r = await braid.client.delete("/v1/memories/missing", headers=braid.headers(AGENT_A))
    assert r.status_code == 404
    assert r.json()["detail"] == "no memory 'missing'"


async def test_openapi_is_served(braid: Braid) -> None:
    r = await braid.client.get("/schema/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    for path in ("/v1/memories", "/v1/recall", "/v1/graph", "/admin/reindex", "/health"):
        assert path in paths
