"""benchmarks.common: percentiles and the results writer, with exact values."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.common import pct, write_results


def test_pct_of_nothing_is_nan() -> None:
    assert math.isnan(pct([], 50))
    assert pct([1.0, 2.0, 3.0], 50) == 2.0


def test_write_results_writes_markdown_and_json(tmp_path: Path) -> None:
    out = tmp_path / "results"
    md = write_results("run", "# Run\n", {"p50": 1.5, "path": Path("/x")}, results=out)
    assert md == out / "run.md"
    assert md.read_text() == "# Run\n"
    assert (out / "run.json").read_text() == '{\n "p50": 1.5,\n "path": "/x"\n}\n'
    assert json.loads((out / "run.json").read_text()) == {"p50": 1.5, "path": "/x"}
    write_results("only", "text\n", results=out)
    assert not (out / "only.json").exists()
