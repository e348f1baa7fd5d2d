"""The report of ``benchmarks/graph_seeds.py``: its statements, table and last line."""

from __future__ import annotations

import pytest

from benchmarks.graph_seeds import main, markdown, statements, summary


def report() -> dict[str, object]:
    def tenant(entities: int, aside: float, walk: float) -> dict[str, object]:
        return {
            "tenant": "big" if entities > 40 else "s0",
            "entities": entities,
            "same": 399,
            "tied": 1,
            "queries": 400,
            "ways": {
                "aside": {"postgres_ms": aside, "wall_ms": 2.5, "statements": 1600},
                "walk only": {"postgres_ms": walk, "wall_ms": 2.25, "statements": 1600},
            },
        }

    return {
        "big": 2568,
        "small": 500,
        "others": 50000,
        "exact_below": 2000,
        "seed_limit": 10,
        "tenants": {"big": tenant(2568, 2.1, 1.9), "small": tenant(40, 0.31, 0.3)},
    }


def test_only_the_shipped_statement_reads_flagged_entities_beside_the_walk() -> None:
    sql = statements()
    assert "e.small" in sql["aside"] and "NOT e.small" in sql["aside"]
    assert "small" not in sql["walk only"].replace("small AS MATERIALIZED", "").replace("FROM small", "")


def test_the_table_has_a_row_a_tenant_and_way() -> None:
    text = markdown(report(), "cmd")
    assert "| big | 2568 | aside | 1600 | 2.100 | 2.500 | 399 of 400 | 1 |" in text
    assert "| small | 40 | walk only | 1600 | 0.300 | 2.250 | 399 of 400 | 1 |" in text
    assert "exactBelow is 2000, seedLimit 10" in text


def test_the_last_line_gives_both_ways() -> None:
    assert summary(report()) == (
        "graph-seeds: big:aside_ms=2.100,walk_ms=1.900 small:aside_ms=0.310,walk_ms=0.300 same=798/800 tied=2"
    )


def test_bad_arguments_are_refused() -> None:
    for argv in (["--big", "0"], ["--rounds", "3"], ["--rounds", "0"], ["--queries", "0"], ["--others", "-1"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2, argv
