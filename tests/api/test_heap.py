"""A serving process freezes its start-up heap out of garbage collection
and collects its youngest generation less often (``AppSettings.settle_heap``,
set by ``python -m service``)."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from service.app import GEN0_THRESHOLD

from .conftest import make_app, serve

pytestmark = pytest.mark.anyio


def _collected(obj: object) -> bool:
    """Whether the collector still scans ``obj`` (frozen objects are not among ``gc.get_objects()``)."""
    return any(o is obj for o in gc.get_objects())


@pytest.mark.parametrize("settle", [True, False])
async def test_what_lives_at_start_up_is_frozen_only_when_asked(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, settle: bool
) -> None:
    app, _, _ = make_app(postgres, typesense, embedder, settle_heap=settle)
    start_up = [object()]  # a container the collector tracks, alive when the app starts
    assert gc.is_tracked(start_up) and _collected(start_up)
    frozen = gc.get_freeze_count()
    before = gc.get_threshold()
    async with serve(app) as client:
        assert (await client.get("/health")).status_code == 200
        assert _collected(start_up) is not settle
        assert (gc.get_freeze_count() > frozen) is settle
        served = [object()]  # made while serving: scanned as usual
        assert _collected(served)
        # The youngest generation waits for more garbage in a serving process only.
        assert gc.get_threshold() == ((GEN0_THRESHOLD, *before[1:]) if settle else before)
    assert gc.get_threshold() == before
