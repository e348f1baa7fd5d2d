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
        (
            "/v1/recall",
            {"query": "", "strategy": "semantic"},
            400,
            "query must not be empty with strategy 'semantic' (strategies 'auto' and 'recent' take none)",
        ),
        (
            "/v1/recall",
            {"query": "   ", "strategy": "keyword"},
            400,
            "query must not be empty with strategy 'keyword' (strategies 'auto' and 'recent' take none)",
        ),
        (
            "/v1/recall",
            {"strategy": "keyword"},
            400,
            "query must not be empty with strategy 'keyword' (strategies 'auto' and 'recent' take none)",
        ),
        ("/v1/recall", {"strategy": "newest"}, 400, "strategy: Invalid enum value 'newest'"),
        ("/v1/recall", {"query": "x", "strategy": None}, 400, "strategy: Expected `str`, got `null`"),
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
            "embedding[0]: Number out of range",
        ),
        ("/v1/recall", b'{"query": "x", "embedding": [NaN]}', 400, None),
        (
            "/v1/recall",
            {"query": "x", "sources": ["nope"]},
            400,
            "sources[0]: unknown source 'nope'; sources are ['typesense', 'pgvector', 'graph']",
        ),
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
            "/v1/recall",
            {"query": "x", "metadata": {"a": [{"b": 1}]}},
            400,
            "metadata.a[0]: an array in a metadata filter may hold only strings, numbers, booleans and null",
        ),
        ("/v1/recall", {"query": "x", "metadata": "red"}, 400, "metadata: Expected `object | null`, got `str`"),
        (
            "/v1/recall",
            {"query": "x", "metadata": {"a": ["b\x00"]}},
            400,
            "metadata contains a NUL character (Postgres cannot compare it)",
        ),
        (
            "/v1/recall",
            {"strategy": "recent", "metadata": {"a\x00": 1}},
            400,
            "metadata contains a NUL character (Postgres cannot compare it)",
        ),
        (
            "/v1/recall",
            {"query": "x", "metadata": {f"k{i}": i for i in range(65)}},
            400,
            "metadata has 65 values to match; the limit is 64",
        ),
        ("/v1/recall", {"query": "x", "min_importance": 1.5}, 400, "min_importance: Expected `float` <= 1.0"),
        ("/v1/recall", {"query": "x", "min_importance": -0.1}, 400, "min_importance: Expected `float` >= 0.0"),
        (
            "/v1/recall",
            {"query": "x", "min_importance": "high"},
            400,
            "min_importance: Expected `float | null`, got `str`",
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


# --- found by the hands-on probe (issue 12) -------------------------------------

DEEP = 5000


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    ("path", "key", "body", "detail"),
    [
        (
            "/v1/memories",
            AGENT_A,
            b'{"memories": [{"content": "x", "metadata": {"a": ' + nested(DEEP) + b"}}]}",
            "request body nests objects and arrays too deeply to decode; metadata may nest at most 32 levels",
        ),
        ("/v1/recall", AGENT_A, b'{"query": ' + nested(DEEP) + b"}", "query: Expected `str`, got `array`"),
        ("/v1/graph", AGENT_A, b'{"entities": ' + nested(DEEP) + b"}", "entities[0]: Expected `object`, got `array`"),
        ("/admin/reindex", ADMIN_A, b'{"target": ' + nested(DEEP) + b"}", "target: Expected `str`, got `array`"),
    ],
)
async def test_deeply_nested_json_is_400(braid: Braid, path: str, key: str, body: bytes, detail: str) -> None:
    r = await send(braid, path, body, key=key)
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == detail


def metadata_of_depth(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


async def test_metadata_nests_at_most_32_levels(braid: Braid) -> None:
    r = await send(braid, "/v1/memories", {"memories": [{"content": "deep", "metadata": metadata_of_depth(33)}]})
    assert r.status_code == 400
    assert r.json()["detail"] == "memories[0].metadata nests 33 levels of objects and arrays; the limit is 32"
    r = await send(braid, "/v1/memories", {"memories": [{"content": "deep", "metadata": metadata_of_depth(32)}]})
    assert r.status_code == 201, r.text
    r = await send(braid, "/v1/recall", {"query": "deep", "metadata": metadata_of_depth(33)})
    assert r.status_code == 400
    assert r.json()["detail"] == "metadata nests 33 levels of objects and arrays; the limit is 32"
    r = await send(braid, "/v1/recall", {"query": "deep", "metadata": metadata_of_depth(32)})
    assert r.status_code == 200, r.text
    assert len(r.json()["items"]) == 1


@pytest.mark.parametrize("stamp", ["0001-01-01T00:30:00+01:00", "9999-12-31T23:30:00-01:00"])
async def test_timestamps_outside_utc_range_are_400_and_nothing_is_written(braid: Braid, stamp: str) -> None:
    body = {"memories": [{"content": "fine", "id": "ok-1"}, {"content": "bad", "id": "bad-1", "created_at": stamp}]}
    r = await send(braid, "/v1/memories", body)
    assert r.status_code == 400
    assert r.json()["detail"] == (f"memories[1].created_at: {stamp} is outside the years 1-9999 once converted to UTC")
    r = await send(braid, "/v1/recall", {"query": "x", "created_after": stamp})
    assert r.status_code == 400
    assert r.json()["detail"] == f"created_after: {stamp} is outside the years 1-9999 once converted to UTC"
    relation = {"source": "Ann", "relation": "knows", "target": "Bo", "valid_from": stamp}
    r = await send(braid, "/v1/graph", {"relations": [relation]})
    assert r.status_code == 400
    assert r.json()["detail"] == (f"relations[0].valid_from: {stamp} is outside the years 1-9999 once converted to UTC")
    import psycopg

    with psycopg.connect(braid.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM relations").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM entities").fetchone() == (0,)


async def test_the_extremes_of_utc_are_accepted_and_read_back(braid: Braid) -> None:
    await braid.remember(
        {"content": "the first morning of the calendar", "id": "first", "created_at": "0001-01-01T00:00:00Z"},
        {"content": "the last evening of the calendar", "id": "last", "created_at": "9999-12-31T23:59:59Z"},
    )
    await braid.synced()
    found = {i["id"]: i["created_at"] for i in (await braid.recall("calendar"))["items"]}
    assert found == {"first": "0001-01-01T00:00:00Z", "last": "9999-12-31T23:59:59Z"}


@pytest.mark.parametrize("huge", [[1e300] * 384, [1e200] + [0.0] * 383, [5e-324] + [0.0] * 383])
async def test_extreme_embeddings_keep_their_direction(braid: Braid, huge: list[float]) -> None:
    """Scaled before squaring: 1e300 does not overflow to a zero vector, nor 5e-324 underflow."""
    import numpy as np
    import psycopg

    other = [0.0] * 384
    other[383] = 1.0
    # "a-other" sorts first: a zero vector would rank the memories in id order.
    await braid.remember(
        {"content": "other direction", "id": "a-other", "embedding": other},
        {"content": "huge direction", "id": "z-huge", "embedding": huge},
    )
    await braid.synced()
    with psycopg.connect(braid.dsn) as conn:
        (norm,) = conn.execute("SELECT vector_norm(embedding) FROM memories WHERE id = 'z-huge'").fetchone()
    assert abs(norm - 1.0) < 1e-5
    doc = await braid.runtime.typesense.get_document(f"{braid.alias}_vectors", "tenant-a:z-huge")
    assert doc is not None
    assert abs(float(np.linalg.norm(doc["embedding"])) - 1.0) < 1e-5
    for source in ("pgvector", "typesense"):
        result = await braid.recall("anything", sources=[source], embedding=huge)
        assert result["degraded"] == []
        assert [i["id"] for i in result["items"]][0] == "z-huge", (source, result["items"])


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"query": "x", "top_k": "5"}', "top_k: Expected `int | null`, got `str`"),
        (b'{"query": "x", "top_k": 5.0}', "top_k: Expected `int | null`, got `float`"),
        (b'{"query": "x", "hops": true}', "hops: Expected `int | null`, got `bool`"),
        (b'{"query": "x"', "request body is not valid JSON: it ends at byte 13 before the JSON value does"),
        (
            b'{"query": "x\\ud800"}',
            "request body is not valid JSON: \\ud800 at byte 12 is a lone UTF-16 surrogate "
            "(a high surrogate must be followed by a low one)",
        ),
        (b'{"query": "x"} trailing', "request body is not valid JSON: trailing characters (byte 16)"),
    ],
)
async def test_bodies_are_decoded_strictly_with_positions(braid: Braid, body: bytes, detail: str) -> None:
    r = await send(braid, "/v1/recall", body)
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == detail


async def test_a_valid_surrogate_pair_is_text(braid: Braid) -> None:
    r = await send(braid, "/v1/recall", b'{"query": "x\\ud83d\\ude00"}')
    assert r.status_code == 200, r.text
    assert r.json()["query"]["text"] == "x\U0001f600"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_not_sent_as_json_is_415(braid: Braid, content_type: str) -> None:
    r = await braid.client.post(
        "/v1/recall",
        content=b'{"query": "x"}',
        headers={**braid.headers(AGENT_A), "content-type": content_type},
    )
    assert r.status_code == 415
    assert r.json()["detail"] == (f"the body must be JSON sent with Content-Type: application/json, not {content_type}")
    r = await braid.client.post(
        "/v1/recall",
        content=b'{"query": "x"}',
        headers={**braid.headers(AGENT_A), "content-type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 200


@pytest.mark.parametrize(("raw", "shown"), [("a%2Fb", "a/b"), ("a%2Fb%2Fc", "a/b/c"), ("a%20b", "a b")])
async def test_delete_with_an_invalid_id_in_the_path_is_400(braid: Braid, raw: str, shown: str) -> None:
    r = await braid.client.delete(f"/v1/memories/{raw}", headers=braid.headers(AGENT_A))
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == f"memory id {shown!r} is not a valid id (letters, digits, _.:- up to 128)"
