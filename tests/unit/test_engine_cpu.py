"""benchmarks.engine_cpu: its report and last line say which tree cost what,
turn by turn, and whether the two answered alike; benchmarks.common.tree_worker
runs a script against another tree and reads its answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import tree_worker
from benchmarks.engine_cpu import markdown, summary_line


def _report(digests: tuple[str, str]) -> dict[str, Any]:
    turns = [
        {"turn": 0, "tree": "/new", "engine": 8.0, "postgres": 5.0, "typesense": 4.0},
        {"turn": 0, "tree": "/old", "engine": 9.0, "postgres": 5.1, "typesense": 4.2},
        {"turn": 1, "tree": "/old", "engine": 9.5, "postgres": 5.2, "typesense": 4.3},
        {"turn": 1, "tree": "/new", "engine": 8.5, "postgres": 5.0, "typesense": 4.1},
    ]
    return {
        "command": "python -m benchmarks.engine_cpu <home> --against /old",
        "size": 10000,
        "recalls": 100,
        "tree": "/new",
        "medians": {"engine": 8.25, "postgres": 5.0, "typesense": 4.05},
        "against": "/old",
        "against_medians": {"engine": 9.25, "postgres": 5.15, "typesense": 4.25},
        "ratio": 0.892,
        "same_answers": digests[0] == digests[1],
        "digests": {"/new": digests[0], "/old": digests[1]},
        "turns": turns,
    }


def test_the_last_line_names_both_trees_medians_their_ratio_and_the_answers() -> None:
    assert summary_line(_report(("a" * 64, "a" * 64))) == (
        "engine-cpu: recalls=100 ms=8.25 postgres_ms=5.00 typesense_ms=4.05"
        " against_ms=9.25 against_postgres_ms=5.15 against_typesense_ms=4.25 ratio=0.892 same_answers=true"
    )
    alone = {**_report(("a" * 64, "a" * 64)), "against": None, "against_medians": None, "ratio": None}
    assert summary_line(alone) == "engine-cpu: recalls=100 ms=8.25 postgres_ms=5.00 typesense_ms=4.05 same_answers=true"


def test_the_report_lists_each_turn_and_says_when_the_answers_differ() -> None:
    same = markdown(_report(("a" * 64, "a" * 64)))
    assert "| 0 | `/new` | 8.00 | 5.00 | 4.00 |" in same
    assert "| 1 | `/old` | 9.50 | 5.20 | 4.30 |" in same
    assert "Median of the turns' ratios (this process, this tree / that one): **0.892**." in same
    assert "The same answers: yes." in same
    assert "The same answers: **no**." in markdown(_report(("a" * 64, "b" * 64)))


def test_the_report_says_how_many_recalls_were_in_flight() -> None:
    assert "`track` off, one at a time." in markdown(_report(("a" * 64, "a" * 64)))
    assert "`track` off, 8 in flight." in markdown({**_report(("a" * 64, "a" * 64)), "concurrency": 8})


def test_a_tree_worker_imports_that_tree_and_its_last_line_is_the_answer(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("WHO = 'other tree'\n")
    script = tmp_path / "script.py"
    script.write_text(
        "import json, sys\nimport pkg\nprint('progress')\nprint(json.dumps({'who': pkg.WHO, 'args': sys.argv[1:]}))\n"
    )
    result = tree_worker(tree, script, ["a", "--b", "1"])
    assert result == {"who": "other tree", "args": ["a", "--b", "1", "--worker"], "tree": str(tree)}


def test_the_ratio_compares_the_two_sides_of_each_turn_whatever_order_they_ran_in() -> None:
    from benchmarks.engine_cpu import _turn_ratio

    turns = _report(("a" * 64, "a" * 64))["turns"]
    # Turn 0: 8.0 / 9.0; turn 1 (the other side first): 8.5 / 9.5.
    assert _turn_ratio(turns, "/new", "/old") == (8.0 / 9.0 + 8.5 / 9.5) / 2
