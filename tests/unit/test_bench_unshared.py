"""The report of ``benchmarks/unshared_writes.py``: its table and last line."""

from __future__ import annotations

import pytest

from benchmarks.unshared_writes import main, markdown, summary


def report() -> dict[str, object]:
    def way(pg: float, entity: float) -> dict[str, float]:
        return {"postgres_ms": pg, "client_ms": 0.25, "per_s": 400.0, "found": 20, "entity_postgres_ms": entity}

    stage = {
        "shared_rows": 20000,
        "built_s": 7.2,
        "memories": 2000,
        "ways": {"shared": way(2.41, 1.5), "unshared": way(0.035, 0.02)},
    }
    return {"tenants": 40, "per": 100, "limits": {"session": 2000, "rag": 2000}, "stages": [stage]}


def test_the_table_has_a_row_a_way_and_size() -> None:
    text = markdown(report(), "cmd")
    assert "exactBelow: session 2000, rag 2000" in text
    assert "| 20000 | 7 | shared | 2000 | 2.410 | 0.250 | 400 | 20 of 20 | 1.500 |" in text
    assert "| 20000 | 7 | unshared | 2000 | 0.035 | 0.250 | 400 | 20 of 20 | 0.020 |" in text


def test_the_last_line_gives_the_ratio() -> None:
    assert summary(report()) == (
        "unshared-writes: 20000:shared_ms=2.41,unshared_ms=0.035,ratio=69,entity_shared_ms=1.50,entity_unshared_ms=0.020"
    )


def test_bad_arguments_are_refused() -> None:
    for argv in (["--shared", "100,10"], ["--shared", ""], ["--tenants", "1"], ["--per", "0"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2, argv
