"""``braid.langchain.BraidRetriever`` with the real langchain-core package
against a Braid served over a loopback socket (the real Postgres and
Typesense): ``invoke`` and ``ainvoke`` return the right memory first as a
``Document`` carrying Braid's score breakdown exactly as the recall answer
has it; the recall options pass through; the async path runs on the async
client; it composes in an LCEL chain; Braid's errors surface as the
client's exceptions with the service's message."""

from __future__ import annotations

import ast
import asyncio
import inspect
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda

import braid
from braid.langchain import BraidRetriever
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense

from .conftest import AGENT_A, AGENT_B
from .live import Live
from .seeded import NOW, expected_metadata, readme_block, seeded

CAR_QUESTION = "what car does Alex drive to work?"


@pytest.fixture(scope="module")
def server(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> Iterator[Live]:
    with seeded(postgres, typesense, embedder) as srv:
        yield srv


@pytest.fixture
def retriever(server: Live) -> Iterator[BraidRetriever]:
    r = BraidRetriever(url=server.url, api_key=AGENT_A, top_k=3, reference_time=NOW, track=False)
    yield r
    r.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def test_invoke_returns_the_right_memory_first_with_braids_breakdown(server: Live, retriever: BraidRetriever) -> None:
    docs = retriever.invoke(CAR_QUESTION)

    assert all(isinstance(d, Document) for d in docs)
    # top_k is 3, but the other memories do not match the question: the sources' floors leave them out.
    assert [d.id for d in docs] == ["car"]
    first = docs[0]
    assert first.page_content == "Alex drives a red Mazda MX-5 to work every day"
    assert first.id == "car"
    with braid.Client(server.url, AGENT_A) as client:
        answer = client.recall(CAR_QUESTION, top_k=3, reference_time=NOW, track=False)
    assert [d.id for d in docs] == [i.id for i in answer.items]
    assert [d.page_content for d in docs] == [i.content for i in answer.items]
    assert [d.metadata for d in docs] == [expected_metadata(i, answer) for i in answer.items]
    # The breakdown of the first, as the recall answer explains a score.
    meta = first.metadata
    assert (meta["kind"], meta["speaker"], meta["importance"]) == ("fact", "Alex", 0.5)
    assert meta["created_at"] == "2026-05-02T09:00:00+00:00"
    assert set(meta["ranks"]) == {"typesense", "pgvector", "graph"}
    assert meta["ranks"]["pgvector"] == 1 and meta["ranks"]["typesense"] == 1
    assert meta["rrf_score"] == pytest.approx(sum(meta["contributions"].values()))
    product = 1.0
    for factor in meta["factors"].values():
        product *= factor
    assert meta["score"] == pytest.approx(meta["rrf_score"] * product)
    assert meta["factors"]["speaker"] > 1  # the query names Alex, its speaker
    assert meta["in_block"] is True and meta["strategy"] == "auto" and meta["degraded"] == []


@pytest.mark.anyio
async def test_ainvoke_returns_the_same_documents(retriever: BraidRetriever) -> None:
    sync_docs = retriever.invoke(CAR_QUESTION)
    async_docs = await retriever.ainvoke(CAR_QUESTION)
    assert async_docs[0].id == "car"
    assert async_docs == sync_docs
    await retriever.aclose()


def test_one_retriever_serves_one_event_loop_after_another(retriever: BraidRetriever) -> None:
    """An async client belongs to the loop it was made in: a new loop gets its own."""
    first = asyncio.run(retriever.ainvoke(CAR_QUESTION))
    second = asyncio.run(retriever.ainvoke(CAR_QUESTION))
    assert first[0].id == "car" and second == first


@pytest.mark.anyio
async def test_the_async_path_runs_on_the_async_client_not_a_thread(server: Live) -> None:
    """The sync client points at a port nothing listens on: ``ainvoke`` works
    only because it never touches it, and ``invoke`` shows it would fail."""
    dead = braid.Client(f"http://127.0.0.1:{closed_port()}", AGENT_A, retry=braid.Retry(attempts=1))
    async with braid.AsyncClient(server.url, AGENT_A) as async_client:
        r = BraidRetriever(client=dead, async_client=async_client, top_k=1)
        assert BraidRetriever._aget_relevant_documents is not BaseRetriever._aget_relevant_documents
        assert [d.id for d in await r.ainvoke(CAR_QUESTION)] == ["car"]
        with pytest.raises(braid.ConnectError):
            r.invoke(CAR_QUESTION)
    dead.close()


def test_recall_options_pass_through(server: Live) -> None:
    recent = BraidRetriever(url=server.url, api_key=AGENT_A, strategy="recent", filter_tags=["music", "cars"])
    assert [d.id for d in recent.invoke("")] == ["cello", "car"]  # newest first
    assert recent.invoke("")[0].metadata["strategy"] == "recent"

    filtered = BraidRetriever(
        url=server.url,
        api_key=AGENT_A,
        kinds=["decision"],
        filter_metadata={"team": "platform"},
        min_importance=0.5,
        min_confidence=0.9,
    )
    docs = filtered.invoke("which database is the source of truth?")
    assert [d.id for d in docs] == ["database"]
    assert docs[0].metadata["mem_key"] == "project.database"
    assert docs[0].metadata["confidence"] == 0.95

    # A session filter: every memory returned has it, so the metadata says it.
    session = BraidRetriever(url=server.url, api_key=AGENT_A, session_id="s-music", sources=["pgvector"])
    docs = session.invoke("what instrument does Alex play?")
    assert [(d.id, d.metadata["session_id"]) for d in docs] == [("cello", "s-music")]
    assert docs[0].metadata["ranks"] == {"typesense": None, "pgvector": 1, "graph": None}

    # One call's options, given to invoke, win over the retriever's.
    docs = session.invoke("what car does Alex drive?", session_id="s-cars", top_k=1)
    assert [(d.id, d.metadata["session_id"]) for d in docs] == [("car", "s-cars")]
    for r in (recent, filtered, session):
        r.close()


def test_the_key_decides_the_tenant(server: Live) -> None:
    other = BraidRetriever(url=server.url, api_key=AGENT_B)
    assert other.invoke(CAR_QUESTION) == []
    other.close()


def test_the_url_and_key_come_from_the_environment(server: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRAID_URL", server.url)
    monkeypatch.setenv("BRAID_API_KEY", AGENT_A)
    r = BraidRetriever(top_k=1)
    assert [d.id for d in r.invoke(CAR_QUESTION)] == ["car"]
    r.close()


@pytest.mark.anyio
async def test_it_composes_in_an_lcel_chain(retriever: BraidRetriever) -> None:
    def as_context(docs: list[Document]) -> str:
        return "\n".join(f"[{d.metadata['kind']}] {d.page_content}" for d in docs)

    chain = retriever | RunnableLambda(as_context)
    text = chain.invoke(CAR_QUESTION)
    assert text.splitlines()[0] == "[fact] Alex drives a red Mazda MX-5 to work every day"
    assert await chain.ainvoke(CAR_QUESTION) == text
    # batch runs the sync path on threads, sharing one client.
    music, database = retriever.batch(["what instrument does Alex play?", "which database do we trust for writes?"])
    assert (music[0].id, database[0].id) == ("cello", "database")


def test_braids_errors_surface_as_the_clients_exceptions(server: Live) -> None:
    bad_key = BraidRetriever(url=server.url, api_key="not-a-key-0123456789")
    with pytest.raises(braid.Unauthorized) as unauthorized:
        bad_key.invoke(CAR_QUESTION)
    assert (unauthorized.value.status, unauthorized.value.detail) == (401, "invalid API key")

    too_many = BraidRetriever(url=server.url, api_key=AGENT_A, top_k=101)
    with pytest.raises(braid.BadRequest) as bad:
        too_many.invoke(CAR_QUESTION)
    assert bad.value.detail == "top_k must be between 1 and 100, got 101"

    class Seen(BaseCallbackHandler):
        def __init__(self) -> None:
            self.errors: list[BaseException] = []

        def on_retriever_error(self, error: BaseException, **kwargs: Any) -> None:
            self.errors.append(error)

    seen = Seen()
    with pytest.raises(braid.BadRequest):
        too_many.invoke(CAR_QUESTION, config={"callbacks": [seen]})
    assert [type(e) for e in seen.errors] == [braid.BadRequest]  # LangChain's callbacks saw it too

    with pytest.raises(TypeError) as unknown:
        too_many.invoke(CAR_QUESTION, tags=["x"])
    assert str(unknown.value) == (
        "unknown recall option(s) ['tags']; the options are ['as_of', 'budget_tokens', 'created_after', "
        "'created_before', 'filter_metadata', 'filter_tags', 'hops', 'kinds', 'min_confidence', "
        "'min_importance', 'reference_time', 'session_id', 'sources', 'strategy', 'tiers', 'top_k', 'track']"
    )
    for r in (bad_key, too_many):
        r.close()


@pytest.mark.anyio
async def test_async_errors_carry_the_services_message(server: Live) -> None:
    r = BraidRetriever(url=server.url, api_key=AGENT_A, tiers=["archive"])
    with pytest.raises(braid.BadRequest) as bad:
        await r.ainvoke(CAR_QUESTION)
    assert bad.value.detail == "tiers: unknown tier(s) ['archive']; tiers are ['session', 'entities', 'rag']"
    await r.aclose()


def test_the_options_are_every_recall_field_but_the_callers_own_embedding() -> None:
    recall = set(inspect.signature(braid.Client.recall).parameters) - {"self", "query"}
    fields = set(BraidRetriever.model_fields) - set(BaseRetriever.model_fields)  # LangChain's: name, tags, metadata
    options = fields - {"url", "api_key", "timeout", "retry", "client", "async_client"}
    renamed = {"filter_tags": "tags", "filter_metadata": "metadata"}
    assert {renamed.get(name, name) for name in options} == recall - {"embedding", "embedding_model"}


def test_the_key_is_not_shown() -> None:
    r = BraidRetriever(url="http://127.0.0.1:1", api_key="secret-key-0123456789")
    assert "secret-key" not in repr(r)
    assert "secret-key" not in str(r.model_dump())


def test_the_readme_example_runs(
    server: Live, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BRAID_URL", server.url)
    monkeypatch.setenv("BRAID_API_KEY", AGENT_A)
    exec(compile(readme_block("LangChain", "python"), "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Alex drives a red Mazda MX-5 to work every day"
    assert ast.literal_eval(lines[-1])["pgvector"] == 1
