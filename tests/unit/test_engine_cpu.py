"""benchmarks.engine_cpu: its report and last line say which tree cost what
and whether the two answered alike; benchmarks.common.tree_worker runs a
script against another tree and reads its answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import tree_worker
from benchmarks.engine_cpu import markdown, summary_line


def _passes(engine: float) -> list[dict[str, float]]:
    return [{"engine": engine + d, "postgres": 5.0 + d, "typesense": 4.0 + d} for d in (0.0, -0.5, 0.5)]


def _report(digests: tuple[str, str]) -> dict[str, Any]:
    runs = [
        {"round": 0, "tree": "/new", "passes": _passes(8.0), "items": 2000, "digest": digests[0]},
        {"round": 0, "tree": "/old", "passes": _passes(9.0), "items": 2000, "digest": digests[1]},
    ]
    return {
        "command": "python -m benchmarks.engine_cpu <home> --against /old",
        "size": 10000,
        "recalls": 200,
        "tree": "/new",
        "medians": {"engine": 8.0, "postgres": 5.0, "typesense": 4.0},
        "against": "/old",
        "against_medians": {"engine": 9.0, "postgres": 5.1, "typesense": 4.2},
        "same_answers": digests[0] == digests[1],
        "runs": runs,
    }


def test_the_last_line_names_both_trees_medians_and_the_answers() -> None:
    assert summary_line(_report(("a" * 64, "a" * 64))) == (
        "engine-cpu: recalls=200 ms=8.00 postgres_ms=5.00 typesense_ms=4.00"
        " against_ms=9.00 against_postgres_ms=5.10 against_typesense_ms=4.20 same_answers=true"
    )
    alone = {**_report(("a" * 64, "a" * 64)), "against": None, "against_medians": None}
    assert summary_line(alone) == "engine-cpu: recalls=200 ms=8.00 postgres_ms=5.00 typesense_ms=4.00 same_answers=true"


def test_the_report_lists_each_pass_and_says_when_the_answers_differ() -> None:
    same = markdown(_report(("a" * 64, "a" * 64)))
    assert "| 0 | `/new` | 8.00 / 7.50 / 8.50 | 5.00 / 4.50 / 5.50 | 4.00 / 3.50 / 4.50 | `aaaaaaaaaaaaaaaa` |" in same
    assert "| 0 | `/old` | 9.00 / 8.50 / 9.50 |" in same
    assert "The same answers: yes." in same
    assert "The same answers: **no**." in markdown(_report(("a" * 64, "b" * 64)))


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
