"""The service-floor benchmark's pure parts: the lean app's block and the report."""

from __future__ import annotations

from benchmarks.service_floor import _block, markdown


def test_the_lean_block_has_braids_shape_and_keeps_the_order() -> None:
    out = _block([("m2", "Tea at noon", 0.03), ("m1", "Coffee at nine", 0.01)])
    assert (
        out.block
        == "[Memory: memory | m2]\nTea at noon\nconfidence: 1.0\n\n[Memory: memory | m1]\nCoffee at nine\nconfidence: 1.0"
    )
    assert [(i.id, i.score) for i in out.items] == [("m2", 0.03), ("m1", 0.01)]
    assert _block([]).block == ""


def test_the_report_has_a_row_per_measured_route_with_the_serving_process_cpu() -> None:
    row = {"n": 10, "p50": 2.5, "p99": 4.0, "qps": 400.0}
    report = {
        "size": 1000,
        "seconds": 10,
        "clients": 8,
        "rows": [
            {"row": "braid fused recall", **row, "cpu_ms": {"service": 9.5, "postgres": 4.0, "typesense": 5.0}},
            {"row": "lean: both", **row, "cpu_ms": {"service": 1.25, "postgres": 1.0, "typesense": 2.5, "client": 0.1}},
        ],
    }
    text = markdown(report, "python -m benchmarks.service_floor")
    assert "| braid fused recall | 10 | 2.5 | 4.0 | 400 | **9.50** | 4.00 | 5.00 | 0.00 |" in text
    assert "| lean: both | 10 | 2.5 | 4.0 | 400 | **1.25** | 1.00 | 2.50 | 0.10 |" in text
    assert "big tenant of 1000 memories" in text
