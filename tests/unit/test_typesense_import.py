"""How an upsert is split into import requests (Typesense 0.24.1's vector-slot race)."""

from __future__ import annotations

from indexers.typesense import import_groups


def test_without_vector_field_one_request() -> None:
    docs = [{"id": "a", "embedding": [1.0]}, {"id": "b", "embedding": [2.0]}]
    assert import_groups(docs) == [docs]
    assert import_groups([]) == []
    assert import_groups([], "embedding") == []


def test_no_request_holds_two_documents_with_a_vector() -> None:
    docs = [
        {"id": "a"},
        {"id": "b", "embedding": [1.0]},
        {"id": "c"},
        {"id": "d", "embedding": [2.0]},
        {"id": "e", "embedding": [3.0]},
        {"id": "f"},
    ]
    groups = import_groups(docs, "embedding")
    assert [[d["id"] for d in g] for g in groups] == [["a", "b", "c"], ["d"], ["e", "f"]]


def test_documents_without_a_vector_stay_together() -> None:
    docs = [{"id": str(i)} for i in range(5)]
    assert import_groups(docs, "embedding") == [docs]
