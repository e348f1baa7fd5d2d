"""``typesense.stems`` through the HTTP API against the real Postgres,
Typesense and model: a keyword recall finds other forms of the query's
words, in Typesense and in a memory still waiting in the outbox alike; off
(the default), the words only."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from config import load_config

from .test_relevance_floors import app_with, lagging, until_refused

pytestmark = pytest.mark.anyio


def keyword_ids(out: dict[str, Any]) -> list[str]:
    return [i["id"] for i in out["items"]]


@pytest.mark.parametrize("stems", [True, False])
async def test_a_keyword_recall_finds_other_forms_of_its_words_with_stems(
    postgres: Any, typesense: Any, embedder: Any, stems: bool
) -> None:
    cfg = load_config()
    cfg = msgspec.structs.replace(cfg, typesense=msgspec.structs.replace(cfg.typesense, stems=stems))
    async with app_with(postgres, typesense, embedder, cfg) as braid:
        await braid.remember(
            {"id": "researched", "content": "She researched adoption agencies"},
            {"id": "weather", "content": "The weather was fine all week"},
        )
        await braid.synced()
        out = await braid.recall("what is she researching?", sources=["typesense"], strategy="keyword")
        assert keyword_ids(out) == (["researched"] if stems else [])
        # A memory Typesense has not indexed yet is scored as its document will be.
        async with lagging(braid):
            await braid.remember({"id": "painted", "content": "He painted the fence"})
            await until_refused(braid)
            out = await braid.recall("paint", sources=["typesense"], strategy="keyword")
            assert keyword_ids(out) == (["painted"] if stems else [])
        out = await braid.recall("paint", sources=["typesense"], strategy="keyword")
        assert keyword_ids(out) == (["painted"] if stems else [])
