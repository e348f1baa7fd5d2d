"""``braid.llamaindex.BraidRetriever`` with the real llama-index-core package
against a Braid served over a loopback socket (the real Postgres and
Typesense), without an LLM: ``retrieve`` and ``aretrieve`` return the right
memory first as a ``NodeWithScore`` whose score is Braid's and whose node
carries Braid's score breakdown exactly as the recall answer has it; the
recall options pass through; errors are the client's; and neither importing
llama-index-core nor retrieving fetches anything from the network."""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

import braid
from braid.llamaindex import BraidRetriever
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense

from .conftest import AGENT_A, AGENT_B
from .live import Live
from .seeded import NOW, expected_metadata, readme_block, seeded

ROOT = Path(__file__).resolve().parents[2]
CAR_QUESTION = "what car does Alex drive to work?"


@pytest.fixture(scope="module")
def server(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> Iterator[Live]:
    with seeded(postgres, typesense, embedder) as srv:
        yield srv


@pytest.fixture
def retriever(server: Live) -> Iterator[BraidRetriever]:
    r = BraidRetriever(server.url, AGENT_A, top_k=3, reference_time=NOW, track=False)
    yield r
    r.close()


def test_retrieve_returns_the_right_memory_first_with_braids_score_and_breakdown(
    server: Live, retriever: BraidRetriever
) -> None:
    hits = retriever.retrieve(CAR_QUESTION)

    assert all(isinstance(h, NodeWithScore) and isinstance(h.node, TextNode) for h in hits)
    # top_k is 3, but the other memories do not match the question: the sources' floors leave them out.
    assert [h.node.node_id for h in hits] == ["car"]
    first = hits[0]
    assert first.node.node_id == "car"
    assert first.node.get_content() == "Alex drives a red Mazda MX-5 to work every day"
    with braid.Client(server.url, AGENT_A) as client:
        answer = client.recall(CAR_QUESTION, top_k=3, reference_time=NOW, track=False)
    assert [(h.node.node_id, h.score) for h in hits] == [(i.id, i.score) for i in answer.items]
    assert [h.node.metadata for h in hits] == [expected_metadata(i, answer) for i in answer.items]
    meta = first.node.metadata
    assert set(meta["ranks"]) == {"typesense", "pgvector", "graph"}
    assert meta["rrf_score"] == pytest.approx(sum(meta["contributions"].values()))
    assert meta["factors"]["speaker"] > 1


def test_an_llm_is_shown_the_memory_not_the_breakdown(retriever: BraidRetriever) -> None:
    node = retriever.retrieve(CAR_QUESTION)[0].node
    for mode in (MetadataMode.LLM, MetadataMode.EMBED):
        text = node.get_content(metadata_mode=mode)
        assert text.endswith("\n\nAlex drives a red Mazda MX-5 to work every day")
        assert "kind: fact" in text and "speaker: Alex" in text and "created_at: 2026-05-02T09:00:00+00:00" in text
        for key in ("score", "ranks", "contributions", "factors", "in_block", "degraded"):
            assert f"{key}: " not in text


@pytest.mark.anyio
async def test_aretrieve_returns_the_same_nodes(retriever: BraidRetriever) -> None:
    sync_hits = retriever.retrieve(CAR_QUESTION)
    async_hits = await retriever.aretrieve(QueryBundle(CAR_QUESTION))
    assert async_hits[0].node.node_id == "car"
    assert [(h.node.node_id, h.score, h.node.metadata) for h in async_hits] == [
        (h.node.node_id, h.score, h.node.metadata) for h in sync_hits
    ]
    await retriever.aclose()


def test_one_retriever_serves_one_event_loop_after_another(retriever: BraidRetriever) -> None:
    """An async client belongs to the loop it was made in: a new loop gets its own."""
    first = asyncio.run(retriever.aretrieve(CAR_QUESTION))
    second = asyncio.run(retriever.aretrieve(CAR_QUESTION))
    assert first[0].node.node_id == "car"
    assert [(h.node.node_id, h.score) for h in second] == [(h.node.node_id, h.score) for h in first]


@pytest.mark.anyio
async def test_the_async_path_runs_on_the_async_client(server: Live) -> None:
    """The sync client points at a port nothing listens on: ``aretrieve``
    works only because it never touches it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = braid.Client(f"http://127.0.0.1:{port}", AGENT_A, retry=braid.Retry(attempts=1))
    async with braid.AsyncClient(server.url, AGENT_A) as async_client:
        r = BraidRetriever(client=dead, async_client=async_client, top_k=1)
        assert [h.node.node_id for h in await r.aretrieve(CAR_QUESTION)] == ["car"]
        with pytest.raises(braid.ConnectError):
            r.retrieve(CAR_QUESTION)
    dead.close()


def test_recall_options_pass_through(server: Live) -> None:
    recent = BraidRetriever(server.url, AGENT_A, strategy="recent", filter_tags=("music", "cars"))
    assert [h.node.node_id for h in recent.retrieve("")] == ["cello", "car"]  # newest first

    filtered = BraidRetriever(
        server.url, AGENT_A, kinds=["decision"], filter_metadata={"team": "platform"}, min_importance=0.5
    )
    hits = filtered.retrieve("which database is the source of truth?")
    assert [(h.node.node_id, h.node.metadata["mem_key"]) for h in hits] == [("database", "project.database")]

    session = BraidRetriever(server.url, AGENT_A, session_id="s-music", sources=["pgvector"], hops=0)
    hits = session.retrieve("what instrument does Alex play?")
    assert [(h.node.node_id, h.node.metadata["session_id"]) for h in hits] == [("cello", "s-music")]
    assert hits[0].node.metadata["ranks"] == {"typesense": None, "pgvector": 1, "graph": None}

    # Time travel: before the car memory was written, the car question finds something else.
    before = BraidRetriever(server.url, AGENT_A, as_of=NOW.replace(month=4), top_k=5)
    assert "car" not in [h.node.node_id for h in before.retrieve(CAR_QUESTION)]
    for r in (recent, filtered, session, before):
        r.close()


def test_the_key_decides_the_tenant(server: Live) -> None:
    other = BraidRetriever(server.url, AGENT_B)
    assert other.retrieve(CAR_QUESTION) == []
    other.close()


def test_braids_errors_are_the_clients_exceptions(server: Live) -> None:
    bad_key = BraidRetriever(server.url, "not-a-key-0123456789")
    with pytest.raises(braid.Unauthorized) as unauthorized:
        bad_key.retrieve(CAR_QUESTION)
    assert (unauthorized.value.status, unauthorized.value.detail) == (401, "invalid API key")

    too_many = BraidRetriever(server.url, AGENT_A, top_k=101)
    with pytest.raises(braid.BadRequest) as bad:
        too_many.retrieve(CAR_QUESTION)
    assert bad.value.detail == "top_k must be between 1 and 100, got 101"
    for r in (bad_key, too_many):
        r.close()


@pytest.mark.anyio
async def test_async_errors_carry_the_services_message(server: Live) -> None:
    r = BraidRetriever(server.url, AGENT_A, budget_tokens=0)
    with pytest.raises(braid.BadRequest) as bad:
        await r.aretrieve(CAR_QUESTION)
    assert bad.value.detail == "budget_tokens must be between 1 and 65536, got 0"
    await r.aclose()


def test_the_options_are_the_langchain_retrievers() -> None:
    from braid.langchain import BraidRetriever as LangChainRetriever

    params = set(inspect.signature(BraidRetriever.__init__).parameters) - {"self", "callback_manager", "verbose"}
    assert params == set(LangChainRetriever.model_fields) - {"name", "tags", "metadata"}


NETWORK_PROBE = """
import json, sys

connects, lookups = [], []

def audit(event, args):
    if event == "socket.connect":
        connects.append(list(args[1]) if isinstance(args[1], tuple) else [str(args[1])])
    elif event == "socket.getaddrinfo":
        lookups.append(str(args[0]))

sys.addaudithook(audit)

import llama_index.core
from llama_index.core.utils import get_tokenizer, globals_helper

from braid.llamaindex import BraidRetriever

hits = BraidRetriever(sys.argv[1], sys.argv[2], top_k=1).retrieve("what car does Alex drive to work?")
# What llama-index-core would otherwise download: NLTK data and tiktoken's encoding.
stopwords = len(globals_helper.stopwords)
tokens = len(get_tokenizer()("Alex drives a red Mazda"))
print(json.dumps({"hits": [h.node.node_id for h in hits], "stopwords": stopwords, "tokens": tokens,
                  "connects": connects, "lookups": lookups}))
"""


def test_nothing_is_fetched_from_the_network(server: Live, tmp_path: Path) -> None:
    """Importing llama-index-core, retrieving, and reading the NLTK stopwords
    and tiktoken encoding it uses elsewhere connect to nothing but Braid:
    llama-index-core ships those files in its wheel (and finds them even
    with an empty cache directory)."""
    port = int(server.url.rsplit(":", 1)[1])
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", NETWORK_PROBE, server.url, AGENT_A],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["hits"] == ["car"]
    assert seen["stopwords"] > 100 and seen["tokens"] > 0
    assert seen["connects"] and all(c == ["127.0.0.1", port] for c in seen["connects"])
    assert set(seen["lookups"]) <= {"127.0.0.1"}
    assert not (tmp_path / "cache").exists()  # nothing downloaded into a user cache either


def test_the_readme_example_runs(
    server: Live, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BRAID_URL", server.url)
    monkeypatch.setenv("BRAID_API_KEY", AGENT_A)
    exec(compile(readme_block("LlamaIndex", "python"), "README.md", "exec"), {})
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith(" Alex drives a red Mazda MX-5 to work every day")
    assert "'pgvector': 1" in first
