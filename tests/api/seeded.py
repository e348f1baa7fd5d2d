"""A Braid served over a loopback socket (:mod:`tests.api.live`) holding a few
known memories of tenant A, every write applied to Typesense: what the
framework adapters' tests (LangChain, LlamaIndex, MCP) recall from."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import braid
from config import load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense

from .conftest import ADMIN_A, AGENT_A, make_app, patient
from .live import Live, live

__all__ = ["MEMORIES", "NOW", "expected_metadata", "readme_block", "seeded", "settled"]

README = Path(__file__).resolve().parents[2] / "README.md"

#: The reference time the tests recall at, so the recency factor is the same in every call.
NOW = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)

MEMORIES = [
    braid.Memory(
        id="car",
        content="Alex drives a red Mazda MX-5 to work every day",
        kind="fact",
        speaker="Alex",
        session_id="s-cars",
        tags=("cars",),
        # Neutral (factor 1): with four memories the RRF scores are close, and a
        # larger importance would lift it above the answer of other questions.
        importance=0.5,
        created_at=datetime(2026, 5, 2, 9, 0, tzinfo=UTC),
    ),
    braid.Memory(
        id="cello",
        content="Alex plays the cello in a community orchestra on Thursdays",
        kind="fact",
        speaker="Alex",
        session_id="s-music",
        tags=("music",),
        created_at=datetime(2026, 5, 20, 18, 0, tzinfo=UTC),
    ),
    braid.Memory(
        id="database",
        content="We chose Postgres as the source of truth for every write",
        kind="decision",
        session_id="s-arch",
        tags=("architecture",),
        metadata={"team": "platform"},
        mem_key="project.database",
        importance=0.8,
        confidence=0.95,
        created_at=datetime(2026, 1, 15, 9, 30, tzinfo=UTC),
    ),
    braid.Memory(
        id="lunch",
        content="The team had tacos for lunch on Friday",
        kind="note",
        session_id="s-misc",
        created_at=datetime(2026, 6, 12, 12, 0, tzinfo=UTC),
    ),
]


def settled(url: str, timeout: float = 60) -> None:
    """Wait until tenant A's writes have all reached Typesense (no outbox row
    pending), so two recalls of one query rank alike."""
    deadline = time.monotonic() + timeout
    with braid.Client(url, ADMIN_A) as admin:
        while (pending := admin.stats(tenant="tenant-a").tenants[0].outbox_pending) > 0:
            assert time.monotonic() < deadline, f"{pending} outbox rows still pending after {timeout} s"
            time.sleep(0.05)


@contextmanager
def seeded(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> Iterator[Live]:
    """A served Braid (deadlines a loaded machine cannot miss) with :data:`MEMORIES` written and settled."""
    app, dsn, alias = make_app(postgres, typesense, embedder, patient(load_config()))
    with live(app, dsn, alias) as server:
        with braid.Client(server.url, AGENT_A) as client:
            assert client.remember(MEMORIES).ids == [m.id for m in MEMORIES]
        settled(server.url)
        yield server


def expected_metadata(item: braid.RecallItem, answer: braid.Recall, session_id: str | None = None) -> dict[str, Any]:
    """What an adapter's metadata for ``item`` must be, written out from the
    client's answer field by field (not through the adapters' own helper)."""
    meta: dict[str, Any] = {
        "id": item.id,
        "kind": item.kind,
        "tier": item.tier,
        "created_at": item.created_at.isoformat(),
        "confidence": item.confidence,
    }
    if item.speaker is not None:
        meta["speaker"] = item.speaker
    if session_id is not None:
        meta["session_id"] = session_id
    if item.importance is not None:
        meta["importance"] = item.importance
    if item.mem_key is not None:
        meta["mem_key"] = item.mem_key
    if item.expires_at is not None:
        meta["expires_at"] = item.expires_at.isoformat()
    meta |= {
        "score": item.score,
        "rrf_score": item.rrf_score,
        "ranks": item.ranks,
        "contributions": item.contributions,
        "factors": item.factors,
        "in_block": item.in_block,
        "truncated": item.truncated,
        "strategy": answer.strategy,
        "degraded": answer.degraded,
    }
    return meta


def readme_block(section: str, lang: str) -> str:
    """The first ``lang`` code block of the README's ``## section``."""
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    found = re.search(rf"```{lang}\n(.*?)```", text[start : end if end > 0 else None], re.S)
    assert found, f"no {lang} block in the README's {section} section"
    return found.group(1)
