"""The Typesense tombstone benchmark's report and its wait for a snapshot."""

from __future__ import annotations

from pathlib import Path

from benchmarks.load.tombstones import _snapshots, markdown


def _report() -> dict[str, object]:
    def row(n: int, sent: float, ten: float) -> dict[str, object]:
        return {"state": f"{n} import requests after a flush", "requests": n, "cpu_ms_as sent": sent, "cpu_ms_10": ten}

    return {
        "collection": "braid_memories_1",
        "documents": 21999,
        "queries": 120,
        "searches": 118,
        "rows": [row(0, 4.1, 0.9), row(400, 11.46, 1.52)],
    }


def test_each_count_of_requests_is_a_row_with_both_pages() -> None:
    text = markdown(_report(), "python -m benchmarks.load.tombstones <home>", None)
    assert text.startswith("# Typesense's CPU a search against the write requests since its last flush: 21999")
    assert "| 0 import requests after a flush | 0 | 4.10 | 0.90 |" in text
    assert "| 400 import requests after a flush | 400 | 11.46 | 1.52 |" in text
    assert "118 bm25 candidate searches from 120" in text
    assert "snapshot" not in text.split("|---|")[-1] and "![" not in text


def test_the_snapshot_row_and_the_plot_are_shown_when_there() -> None:
    report = {**_report(), "snapshot": "timed snapshot after 41 s"}
    report["rows"] = [
        *report["rows"],
        {**report["rows"][-1], "state": "then the node's timed snapshot", "cpu_ms_as sent": 4.3},
    ]  # type: ignore[list-item, dict-item]
    text = markdown(report, "x", "tombstones-x.png")
    assert "| then the node's timed snapshot | 400 | 4.30 | 1.52 |" in text
    assert "Waiting for the node's own snapshot: timed snapshot after 41 s." in text
    assert "![Typesense CPU a search against import requests](tombstones-x.png)" in text


def test_a_new_snapshot_directory_is_seen(tmp_path: Path) -> None:
    assert _snapshots(tmp_path) == set()  # no Typesense data yet
    snapshots = tmp_path / "typesense" / "data" / "state" / "snapshot"
    (snapshots / "snapshot_00000000000000000100").mkdir(parents=True)
    seen = _snapshots(tmp_path)
    (snapshots / "snapshot_00000000000000000100").rename(snapshots / "snapshot_00000000000000000180")
    assert seen == {"snapshot_00000000000000000100"}
    assert not _snapshots(tmp_path) <= seen
