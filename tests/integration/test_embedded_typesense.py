"""The embedded Typesense runs with Braid's server flags, not the binary's defaults."""

from __future__ import annotations

import psutil

from deploy.embedded import TYPESENSE_SNAPSHOT_INTERVAL_S, EmbeddedTypesense


def test_embedded_typesense_snapshots_every_minute(typesense: EmbeddedTypesense) -> None:
    assert typesense.proc is not None
    flags = psutil.Process(typesense.proc.pid).cmdline()[1:]
    # A snapshot flushes the memtable and the write requests' range tombstones in it.
    assert f"--snapshot-interval-seconds={TYPESENSE_SNAPSHOT_INTERVAL_S}" in flags
    assert TYPESENSE_SNAPSHOT_INTERVAL_S == 60  # the binary's own default is 3600
