"""The quality benchmark's config overrides: --set parsing, applying, sweep files."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.quality.tuning import SweepSet, apply_sets, load_sweep, parse_set


def test_parse_set_reads_the_value_as_yaml() -> None:
    assert parse_set("sources.graph.weight=0.5") == ("sources.graph.weight", 0.5)
    assert parse_set("query.stripDates=false") == ("query.stripDates", False)
    assert parse_set("rrf.k= 30") == ("rrf.k", 30)
    assert parse_set("a.b=[1, 2]") == ("a.b", [1, 2])
    assert parse_set("tokenizer=o200k_base") == ("tokenizer", "o200k_base")
    for bad in ("sources.graph.weight", "=1", "a..b=1"):
        with pytest.raises(ValueError, match=r"^expected dotted.key=yaml_value, got "):
            parse_set(bad)


def test_apply_sets_copies_and_creates_mappings() -> None:
    base = {"sources": {"graph": {"weight": 0.3, "enabled": True}}, "rrf": {"k": 60}}
    out = apply_sets(base, [("sources.graph.weight", 0.5), ("ranking.recency.weight", 0.1), ("rrf.k", 30)])
    assert out == {
        "sources": {"graph": {"weight": 0.5, "enabled": True}},
        "rrf": {"k": 30},
        "ranking": {"recency": {"weight": 0.1}},
    }
    assert base == {"sources": {"graph": {"weight": 0.3, "enabled": True}}, "rrf": {"k": 60}}
    with pytest.raises(ValueError, match=r"^cannot set rrf.k.x: rrf.k is 60, not a mapping$"):
        apply_sets(base, [("rrf.k.x", 1)])


def test_load_sweep_named_and_plain_sets(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text("- {name: graph-half, set: {sources.graph.weight: 0.5}}\n- {rrf.k: 30, query.timeBoost: 0}\n")
    assert load_sweep(path) == [
        SweepSet("graph-half", (("sources.graph.weight", 0.5),)),
        SweepSet("rrf.k=30, query.timeBoost=0", (("rrf.k", 30), ("query.timeBoost", 0))),
    ]
    path.write_text("rrf.k: 30\n")
    with pytest.raises(ValueError, match=r"a sweep file is a non-empty YAML list of override sets$"):
        load_sweep(path)
    path.write_text("- {name: empty, set: {}}\n")
    with pytest.raises(ValueError, match=r"set 0 has no overrides$"):
        load_sweep(path)
