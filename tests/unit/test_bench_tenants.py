"""benchmarks.tenants: the exact pgvector count a small tenant's query is held
to, and the report's rows, with values worked out by hand."""

from __future__ import annotations

import random

import msgspec
import numpy as np

from benchmarks.load.corpus import Corpus, Tenant
from benchmarks.load.run import CONFIG
from benchmarks.tenants import _PG_FLOORS, _PG_NO_FLOORS, _only_pgvector, _queries, markdown


def _tenant(name: str, vectors: np.ndarray) -> Tenant:
    memories = [
        {"id": f"{name}-{i}", "content": f"memory number {i} of {name} says little"} for i in range(len(vectors))
    ]
    return Tenant(name, memories, vectors.astype(np.float32), [], [])


def test_the_exact_count_is_the_tenants_memories_above_both_floors_at_most_candidates() -> None:
    # Four unit vectors at known angles to the first axis: cosines 1.0, 0.6, 0.2 and -1.0.
    vectors = np.array([[1.0, 0.0], [0.6, 0.8], [0.2, np.sqrt(1 - 0.04)], [-1.0, 0.0]])
    corpus = Corpus(7, 4, [_tenant("small", vectors)], [], np.zeros((0, 2)), 1)
    rng = random.Random(3)
    # A query near memory 0 (noise ~0.3 / sqrt(2)): its best cosine is near 1.
    ((name, body, exact),) = _queries(corpus, ["small"], rng, 10, (0.15, 0.3, 50))
    request = msgspec.json.decode(body)
    assert name == "small" and request["top_k"] == 10
    q = np.asarray(request["embedding"])
    sims = vectors @ q
    floor = max(0.15, 0.3 * sims.max()) + 1e-4
    assert exact == int((sims >= floor).sum())
    assert 1 <= exact <= 3  # never the opposite memory
    # ``candidates`` caps it; a floor above every similarity leaves none.
    ((_, _, capped),) = _queries(corpus, ["small"], random.Random(3), 10, (-1.0, 0.0, 2))
    assert capped == 2
    ((_, _, none),) = _queries(corpus, ["small"], random.Random(3), 10, (1.5, 0.0, 50))
    assert none == 0


def test_each_active_tenant_gets_distinct_queries_round_robin() -> None:
    rng = np.random.default_rng(5)
    tenants = []
    for name in ("a", "b", "c"):
        v = rng.standard_normal((6, 4))
        tenants.append(_tenant(name, v / np.linalg.norm(v, axis=1, keepdims=True)))
    corpus = Corpus(7, 6, tenants, [], np.zeros((0, 4)), 1)
    queries = _queries(corpus, ["a", "b", "c"], random.Random(1), 10, (0.15, 0.3, 50), per_tenant=4)
    # Round robin: every tenant once before any tenant twice.
    assert [q[0] for q in queries] == ["a", "b", "c"] * 4
    for name in ("a", "b", "c"):
        texts = [msgspec.json.decode(body)["query"] for t, body, _ in queries if t == name]
        assert len(set(texts)) == 4  # four different memories of the tenant


def test_the_starvation_check_asks_pgvector_alone_and_the_shipped_floors_are_where_it_looks() -> None:
    body = msgspec.json.encode({"query": "q", "embedding": [0.1], "top_k": 10})
    assert msgspec.json.decode(_only_pgvector(body)) == {
        "query": "q",
        "embedding": [0.1],
        "top_k": 10,
        "sources": ["pgvector"],
    }
    assert CONFIG.read_text().count(_PG_FLOORS) == 1
    assert _PG_NO_FLOORS != _PG_FLOORS


def test_the_report_row_and_ratio() -> None:
    def stage(tenants: int, p50: float) -> dict[str, object]:
        return {
            "tenants": tenants,
            "memories": 100 * tenants,
            "load_s": 10.0,
            "write_per_s": 150.0,
            "write_errors": 0,
            "recall": {
                "n": 200,
                "p50": p50,
                "p99": 2 * p50,
                "per_s": 40.0,
                "cpu_ms": {"service": 5.0, "postgres": 3.0, "typesense": 2.0},
                "short": 7,
                "short_by_source": {"pgvector": 9},
                "source_ms_p50": {"graph": 4.0},
                "pgvector_under_exact": 0,
                "error_count": 0,
                "errors": [],
            },
            "unfloored": {"n": 50, "pgvector_under_exact": 1, "error_count": 0, "errors": []},
            "pgvector_exact_mean": 1.5,
            "active_tenants": 50,
            "spread_tenants": min(tenants, 400),
            "spread": {"n": 300, "p50": 2 * p50 if tenants > 50 else p50, "cpu_ms": {"service": 6.0}},
            "postgres": {"indexes": 32, "planning_ms": 0.02, "table_bytes": {"entities": 2**20}},
            "keyring_lookup_us": 0.6,
        }

    report = {"corpus": "c", "per": 100, "big": 0, "stages": [stage(50, 20.0), stage(1000, 25.0)]}
    text = markdown(report, "cmd")
    rows = [line for line in text.splitlines() if line.startswith("| 50 |") or line.startswith("| 1000 |")]
    assert len(rows) == 2
    assert "| 50 | 200 | 25.0 | 50.0 | 1.25 |" in rows[1]
    # The spread row: 400 tenants, its p50 against the first stage's spread p50 (50 / 20).
    assert "| 400, 300, 50.0 (2.50), 6.00 / 0.00 / 0.00 |" in rows[1]
    assert "| 1 of 50 |" in rows[1] and "pgvector 9" in rows[1] and "graph 4.0" in rows[1]
    assert "`entities` 1 MiB" in text
    assert "speed probe" not in text  # a report from before the waits has no such table
    quiet = {"seconds": 4.2, "idle": True, "cpu_ms": {"typesense": 310.0}, "idle_share": 0.05, "idle_for_s": 3.0}
    report["stages"][1].update(quiet={**quiet, "idle": False}, probe_ms=41.25)
    report["stages"][0].update(quiet=quiet, probe_ms=40.0)
    text = markdown(report, "cmd")
    assert "under 5% of a core for 3 s" in text
    assert "| 50 | 4 | 0 / 0 / 310 | 40.0 |" in text
    assert "| 1000 | 4 (still busy) | 0 / 0 / 310 | 41.2 |" in text
    # The load's CPU: a table only for reports that metered it.
    assert "CPU ms a memory |" not in text
    report["stages"][1].update(
        loaded=95000,
        graph_cpu_s={"service": 40.0, "postgres": 600.4, "typesense": 0.0},
        load_cpu_ms={"service": 3.125, "postgres": 0.5, "typesense": 2.0, "client": 0.1},
    )
    text = markdown(report, "cmd")
    assert "| 1000 | 95000 | 40 / 600 / 0 | 3.12 / 0.50 / 2.00 |" in text
    table = text.split("CPU ms a memory |")[1].split("\n\n")[0]
    assert table.count("\n| ") == 1  # the stage that was not metered has no row


def test_the_group_count_is_set_in_the_shipped_config() -> None:
    from benchmarks.tenants import with_groups
    from config.loader import parse_config

    text = CONFIG.read_text()
    assert parse_config(text).typesense.groups == 1
    assert parse_config(with_groups(text, 16)).typesense.groups == 16


def test_the_placement_benchmark_config_has_its_threshold_and_an_admin_key() -> None:
    from benchmarks.placement import placement_config
    from config.loader import parse_config

    cfg = parse_config(placement_config({"big": "k" * 20, "small-1": "s" * 20}, "a" * 20, 30_000))
    assert cfg.typesense.own_collection_above == 30_000 and cfg.typesense.groups == 1
    assert [(k.tenant, k.role, k.key) for k in cfg.auth.keys] == [
        ("big", "admin", "a" * 20),
        ("big", "agent", "k" * 20),
        ("small-1", "agent", "s" * 20),
    ]


def test_the_profile_table_splits_the_service_cpu_by_stage() -> None:
    from benchmarks.tenants import markdown

    def stage(tenants: int, graph_share: float) -> dict[str, object]:
        recall = {
            "n": 10,
            "p50": 20.0,
            "p99": 30.0,
            "per_s": 5.0,
            "cpu_ms": {"service": 4.0},
            "short": 0,
            "short_by_source": {},
            "pgvector_under_exact": 0,
            "error_count": 0,
            "errors": [],
            "profile": {"stages": {"graph source": graph_share, "other": 1.0 - graph_share}},
        }
        return {
            "tenants": tenants,
            "memories": 100,
            "load_s": 1.0,
            "write_per_s": 100.0,
            "write_errors": 0,
            "recall": recall,
            "unfloored": {"n": 1, "pgvector_under_exact": 0},
            "pgvector_exact_mean": 1.0,
            "postgres": {"indexes": 1, "planning_ms": 0.01, "table_bytes": {}},
            "keyring_lookup_us": 0.5,
        }

    text = markdown({"corpus": "c", "per": 100, "stages": [stage(50, 0.25), stage(1000, 0.75)]}, "cmd")
    # Ordered by the last stage's share; each cell is share x service CPU ms.
    table = text[text.index("| stage | 50 tenants | 1000 tenants |") :].splitlines()
    assert table[2] == "| graph source | 1.00 | 3.00 |"
    assert table[3] == "| other | 3.00 | 1.00 |"
