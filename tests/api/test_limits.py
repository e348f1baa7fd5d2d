"""Every request limit, one over: the answer and its reason, recorded in the
fault ledger for RELIABILITY.md (the exact messages of most are also pinned
in test_bad_input.py)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from benchmarks.faults.ledger import Ledger, Scenario
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense

from . import conftest
from .conftest import AGENT_A, Braid, make_app, serve

pytestmark = [pytest.mark.anyio, pytest.mark.faults]


async def test_each_limit_refuses_one_over(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, ledger: Ledger
) -> None:
    cfg = conftest.test_config("x")
    cfg = msgspec.structs.replace(cfg, limits=msgspec.structs.replace(cfg.limits, rate_per_second=1.0, rate_burst=40))
    lim = cfg.limits
    app, dsn, alias = make_app(postgres, typesense, embedder, cfg)
    cases: list[tuple[str, str, Any, int, str]] = [
        ("body size", "/v1/memories", b"x" * (cfg.server.max_body_bytes + 1), 413, ""),
        (
            "batch size",
            "/v1/memories",
            {"memories": [{"content": "a"}] * (lim.max_batch + 1)},
            400,
            f"memories has {lim.max_batch + 1} items; the limit is {lim.max_batch} per request",
        ),
        (
            "graph batch size",
            "/v1/graph",
            {"entities": [{"name": f"e{i}"} for i in range(lim.max_batch + 1)]},
            400,
            f"entities has {lim.max_batch + 1} items; the limit is {lim.max_batch} per request",
        ),
        (
            "content length",
            "/v1/memories",
            {"memories": [{"content": "y" * (lim.max_content_chars + 1)}]},
            400,
            f"memories[0].content has {lim.max_content_chars + 1} characters; the limit is {lim.max_content_chars}",
        ),
        (
            "query length",
            "/v1/recall",
            {"query": "q" * (lim.max_content_chars + 1)},
            400,
            f"query has {lim.max_content_chars + 1} characters; the limit is {lim.max_content_chars}",
        ),
        (
            "top_k",
            "/v1/recall",
            {"query": "x", "top_k": lim.max_top_k + 1},
            400,
            f"top_k must be between 1 and {lim.max_top_k}, got {lim.max_top_k + 1}",
        ),
        (
            "budget",
            "/v1/recall",
            {"query": "x", "budget_tokens": lim.max_budget_tokens + 1},
            400,
            f"budget_tokens must be between 1 and {lim.max_budget_tokens}, got {lim.max_budget_tokens + 1}",
        ),
        (
            "hops",
            "/v1/recall",
            {"query": "x", "hops": lim.max_hops + 1},
            400,
            f"hops must be between 0 and {lim.max_hops}, got {lim.max_hops + 1}",
        ),
    ]
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        for name, path, body, status, detail in cases:
            if isinstance(body, bytes):
                r = await client.post(path, content=body, headers=braid.headers(AGENT_A))
            else:
                r = await braid.post(path, body)
            ledger.record(
                Scenario(
                    name=f"limit: {name}",
                    kind="bad input",
                    injected=1,
                    requests=1,
                    errors=int(r.status_code >= 400),
                    server_errors=int(r.status_code >= 500),
                    outcome=f"{r.status_code}" + (f": {r.json()['detail']}" if detail else ""),
                )
            )
            assert r.status_code == status, (name, r.text)
            if detail:
                assert r.json()["detail"] == detail, name
        # Nothing of the refused writes was stored.
        out = await braid.recall("y", sources=["pgvector"], top_k=100)
        assert out["items"] == []

        # The rate limit: the burst goes through, then 429 with Retry-After.
        codes: list[int] = []
        retry_after = None
        for _ in range(lim.rate_burst * 2):
            r = await braid.post("/v1/recall", {"query": "x", "sources": ["graph"]})
            codes.append(r.status_code)
            if r.status_code == 429:
                retry_after = r.headers.get("retry-after")
                break
        ledger.record(
            Scenario(
                name="limit: requests per key",
                kind="bad input",
                injected=1,
                requests=len(codes),
                errors=codes.count(429),
                server_errors=sum(c >= 500 for c in codes),
                load=f"one key, back to back, ratePerSecond {lim.rate_per_second:g} burst {lim.rate_burst}",
                outcome=f"429 with Retry-After {retry_after} after {codes.count(200)} answered "
                f"(the {lim.rate_burst - len(cases)} left of the burst, plus what refilled)",
            )
        )
        assert codes[-1] == 429 and retry_after is not None and int(retry_after) >= 1
        assert set(codes[:-1]) == {200}
