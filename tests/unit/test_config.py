"""The config schema: shipped defaults, and errors that name the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import DEFAULT_CONFIG_PATH, BraidConfig, ConfigError, load_config, parse_config


def test_shipped_yaml_holds_the_documented_defaults() -> None:
    cfg = load_config(DEFAULT_CONFIG_PATH)
    assert cfg.search_top_k == 10
    assert cfg.context_budget_tokens == 8192
    assert cfg.min_confidence == 0.5
    assert cfg.rrf.k == 60
    assert cfg.rrf.vector_weight == 0.2
    assert {n: s.weight for n, s in cfg.sources.items()} == {"typesense": 1.0, "pgvector": 1.0, "graph": 0.3}
    tiers = {n: (t.holds, t.m, t.ef_construction, t.ef_search) for n, t in cfg.tiers.items()}
    assert tiers == {
        "session": ("memories", 24, 128, 48),
        "entities": ("entities", 24, 128, 128),
        "rag": ("memories", 24, 128, 64),
    }
    steps = {n: [(s.rows, s.ef_search) for s in t.ef_search_at] for n, t in cfg.tiers.items()}
    assert steps == {
        "session": [(100_000, 128), (400_000, 200)],
        "entities": [],
        "rag": [(100_000, 128), (400_000, 256)],
    }
    assert cfg.graph.max_hops == 2
    q = cfg.query
    assert (q.strip_speakers, q.strip_dates, q.relative_dates, q.speaker_boost, q.time_boost, q.speaker_cache_ms) == (
        True,
        True,
        True,
        0.5,
        0.6,
        5000,
    )
    assert cfg == BraidConfig(), "braid.yaml and the schema defaults differ"
    assert cfg.memory_tiers == ["session", "rag"]
    assert cfg.entity_tier == "entities"
    assert (cfg.postgres.dsn, cfg.postgres.replica_dsn) == (None, None)


def test_ef_search_steps_take_the_largest_step_an_index_has_reached() -> None:
    tier = parse_config(
        "tiers: {session: {efSearch: 40, efSearchAt: [{rows: 100, efSearch: 80}, {rows: 1000, efSearch: 300}]},"
        " entities: {holds: entities}}"
    ).tiers["session"]
    assert [tier.ef_search_for(n) for n in (0, 99, 100, 999, 1000, 10**9)] == [40, 40, 80, 80, 300, 300]
    assert parse_config("").tiers["entities"].ef_search_for(10**9) == 128


def test_yaml_and_code_defaults_agree() -> None:
    # An empty file gives the same config as the shipped one.
    assert parse_config("") == load_config(DEFAULT_CONFIG_PATH) == BraidConfig()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rrf: {k: 0}", "Expected `int` >= 1 - at `$.rrf.k`"),
        ("rrf: {vectorWeight: 1.5}", "Expected `float` <= 1.0 - at `$.rrf.vectorWeight`"),
        ("rrf: {kk: 1}", "Object contains unknown field `kk` - at `$.rrf`"),
        ("searchTopK: x", "Expected `int`, got `str` - at `$.searchTopK`"),
        ("minConfidence: 2", "Expected `float` <= 1.0 - at `$.minConfidence`"),
        ("tiers: {session: {m: 0}}", "Expected `int` >= 2 - at `$.tiers.session.m`"),
        (
            "tiers: {session: {m: 40, efConstruction: 32}}",
            "efConstruction (32) must be at least 2 * m (80) - at `$.tiers.session`",
        ),
        (
            "tiers: {session: {efSearchAt: [{rows: 500, efSearch: 90}, {rows: 100, efSearch: 60}]}}",
            "efSearchAt: rows must be ascending and distinct, got [500, 100] - at `$.tiers.session`",
        ),
        (
            "tiers: {session: {efSearchAt: [{rows: 0, efSearch: 90}]}}",
            "Expected `int` >= 1 - at `$.tiers.session.efSearchAt[0].rows`",
        ),
        (
            "tiers: {entities: {holds: entities, efSearchAt: [{rows: 10, efSearch: 90}]}}",
            "efSearchAt applies to tiers holding memories only - at `$.tiers.entities`",
        ),
        (
            "tiers: {a: {holds: memories}}",
            "tiers: exactly one tier must hold `entities`",
        ),
        (
            "tiers: {a-b: {}, a_b: {}, e: {holds: entities}}",
            "tiers 'a-b' and 'a_b' would share one index name; rename one",
        ),
        ("graph: {maxHops: 9}", "Expected `int` <= 5 - at `$.graph.maxHops`"),
        ("sources: {graph: {weight: -1}}", "Expected `float` >= 0.0 - at `$.sources.graph.weight`"),
        ("sources: {typesense: {maxTerms: 0}}", "Expected `int` >= 1 - at `$.sources.typesense.maxTerms`"),
        ("sources: {graph: {maxTerms: 3}}", "Object contains unknown field `maxTerms` - at `$.sources.graph`"),
        (
            "sources: {bm25: {weight: 1}}",
            "unknown source 'bm25'; sources are ['typesense', 'pgvector', 'graph'] - at `$.sources`",
        ),
        ("rrf: {weights: {graph: -1}}", "Expected `float` >= 0.0 - at `$.rrf.weights.graph`"),
        (
            "rrf: {weights: {bm25: 1}}",
            "rrf.weights names unknown source(s) ['bm25']; known: ['typesense', 'pgvector', 'graph']",
        ),
        (
            "auth: {keys: [{tenant: a, key: short}]}",
            "`key` must be at least 16 characters - at `$.auth.keys[0]`",
        ),
        ("auth: {keys: [{tenant: 'a b', key: 0123456789abcdef}]}", None),
        (
            "postgres: {dsn: 'postgresql://db/braid', replicaDsn: 'postgresql://db/braid'}",
            "replicaDsn is the primary's dsn; name a streaming replica of it (or null) - at `$.postgres`",
        ),
        (
            "postgres: {replicaDsn: ' '}",
            "replicaDsn is empty; name a streaming replica of dsn (or null) - at `$.postgres`",
        ),
        (
            "postgres: {replicaDSN: 'postgresql://r/braid'}",
            "Object contains unknown field `replicaDSN` - at `$.postgres`",
        ),
        ("- 1", "the top level must be a mapping, got list"),
    ],
)
def test_errors_name_the_bad_key(text: str, message: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="braid.yaml")
    if message is not None:
        assert str(info.value) == f"braid.yaml: {message}"


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read: No such file or directory"):
        load_config(tmp_path / "missing.yaml")


def test_old_rrf_weights_are_read_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    cfg = parse_config("rrf: {weights: {graph: 0.7, pgvector: 2}}\nsources: {pgvector: {weight: 1.5}}")
    # The new key wins where both are given.
    assert {n: s.weight for n, s in cfg.sources.items()} == {"typesense": 1.0, "pgvector": 1.5, "graph": 0.7}
    assert [r.getMessage() for r in caplog.records] == [
        "rrf.weights is deprecated and will be removed: use sources.<name>.weight"
    ]


def test_a_source_section_keeps_the_defaults_it_does_not_name() -> None:
    cfg = parse_config("sources: {graph: {deadlineMs: 300}}")
    assert (cfg.source("graph").weight, cfg.source("graph").deadline_ms) == (0.3, 300)
