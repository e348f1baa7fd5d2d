"""The pure parts of the ``braid`` CLI and client: the progress of a reindex
job as bars, the id of an ingested line, line counting, the checkpoint file,
and which errors the client retries."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

import braid
from braid.cli.commands import progress_bars
from braid.cli.ingest import Checkpoint, count_lines, line_id
from braid.retry import should_retry


def test_progress_bars_of_each_reindex_target() -> None:
    progress = {
        "typesense": {"collection": "c2", "previous": "c1", "phase": "copying", "done": 256, "total": 1000},
        "pgvector": {"tier": "session", "done": 1, "total": 2},
        "embeddings": {
            "model": "all-MiniLM-L6-v2",
            "memories": {"done": 640, "total": 1200},
            "entities": {"done": 0, "total": 85},
        },
    }
    assert progress_bars(progress) == {
        "typesense": ("typesense copying", 256, 1000),
        "pgvector": ("pgvector session", 1, 2),
        "embeddings memories": ("embeddings memories", 640, 1200),
        "embeddings entities": ("embeddings entities", 0, 85),
    }
    assert progress_bars({"typesense": {"phase": "replaying", "since": "2026-01-01T00:00:00Z"}}) == {}
    assert progress_bars({"typesense": {"phase": "copying", "done": 0}}) == {
        "typesense": ("typesense copying", 0, None)
    }


def test_a_lines_id_comes_from_its_number_and_bytes() -> None:
    raw = b'{"content": "hello"}\n'
    expected = "ingest-" + hashlib.sha256(b'3\n{"content": "hello"}').hexdigest()[:32]
    assert line_id(3, raw) == expected
    assert line_id(3, raw.rstrip(b"\n")) == expected  # a last line without its newline: the same id
    assert line_id(4, raw) != expected  # the same text on another line is another memory
    assert len(expected) <= 128


def test_count_lines_with_and_without_a_final_newline(tmp_path: Path) -> None:
    f = tmp_path / "f.jsonl"
    f.write_bytes(b"a\nb\n")
    assert count_lines(f) == 2
    f.write_bytes(b"a\nb")
    assert count_lines(f) == 2
    f.write_bytes(b"")
    assert count_lines(f) == 0


def test_the_checkpoint_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl.braid-ingest"
    cp = Checkpoint(file="/data/f.jsonl", target="t", offset=10, lines=2, written=1, bad=1, bad_lines=[2])
    cp.save(path)
    assert not (tmp_path / "f.jsonl.braid-ingest.tmp").exists()
    assert msgspec.json.decode(path.read_bytes(), type=Checkpoint) == cp


def test_what_the_client_retries() -> None:
    def err(kind: type[braid.HTTPError], status: int) -> braid.HTTPError:
        return kind(status, "x")

    assert should_retry(err(braid.RateLimited, 429), idempotent=False)
    assert should_retry(braid.ConnectError("x"), idempotent=False)
    assert should_retry(err(braid.Unavailable, 503), idempotent=True)
    assert not should_retry(err(braid.Unavailable, 503), idempotent=False)
    assert should_retry(braid.Timeout("x"), idempotent=True)
    assert not should_retry(braid.Timeout("x"), idempotent=False)
    assert not should_retry(err(braid.BadRequest, 400), idempotent=True)
    assert not should_retry(err(braid.ServerError, 500), idempotent=True)
