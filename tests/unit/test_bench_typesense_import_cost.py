"""benchmarks.typesense_import_cost: the two documents it compares, and its report."""

from __future__ import annotations

from datetime import UTC, datetime

from benchmarks.typesense_import_cost import markdown, with_terms
from indexers.base import MemoryRecord
from indexers.typesense.documents import record_document, term_key


def test_the_older_document_is_the_one_sent_plus_the_bare_terms() -> None:
    rec = MemoryRecord(
        id="m",
        tenant="t",
        content="Blue password",
        context="the password before",
        kind="note",
        tier="session",
        created_at=datetime(2024, 1, 1, tzinfo=UTC),
        confidence=1.0,
    )
    sent, older = record_document(rec), with_terms(rec)
    assert "terms" not in sent
    assert older == {**sent, "terms": ["blue", "password"]}
    assert sent["tenant_terms"] == [term_key("t") + "blue", term_key("t") + "password"]


def test_the_report_gives_the_medians_and_the_saving() -> None:
    report = {
        "docs": 10,
        "rounds": 3,
        "batch": 100,
        "cpu_ms_per_doc": {"sent": [0.2, 0.3, 0.25], "with_terms": [0.4, 0.35, 0.3]},
        "median": {"sent": 0.25, "with_terms": 0.35},
    }
    text = markdown(report, "cmd")
    assert "| as Braid sends it | 0.250 | 0.200, 0.300, 0.250 |" in text
    assert "| with the bare `terms` (before) | 0.350 |" in text
    assert "Saving: 0.100 ms a document (29% of the import)." in text
