"""indexers.pagerank against networkx's pagerank, the oracle it replaces.

The graph source scored neighbourhoods with ``networkx.pagerank`` on an
undirected ``networkx.Graph`` until the numpy power iteration took over; the
numbers must stay networkx's (same iteration, same stopping rule). Closed
forms on small graphs are in tests/integration/test_graph.py.
"""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest

from indexers.pagerank import PageRankDidNotConverge, _pairs, pagerank_columns, personalized_pagerank

D = 0.85


def networkx_ppr(edges: list[tuple[int, int, float]], seeds: dict[int, float], *, damping: float) -> dict[int, float]:
    """What the graph source computed before: the same graph built the same way."""
    graph = nx.Graph()
    graph.add_nodes_from(seeds)
    for a, b, w in edges:
        if graph.has_edge(a, b):
            graph[a][b]["weight"] += w
        else:
            graph.add_edge(a, b, weight=max(w, 1e-6))
    total = sum(seeds.values())
    personalization = {n: seeds.get(n, 0.0) / total for n in graph.nodes}
    return dict(nx.pagerank(graph, alpha=damping, personalization=personalization, weight="weight"))


def random_graph(rng: random.Random, nodes: int, edges: int) -> tuple[list[tuple[int, int, float]], dict[int, float]]:
    weights = (1.0, 0.5, 2.0, 0.0, 0.3)
    es = [(rng.randrange(nodes), rng.randrange(nodes), rng.choice(weights)) for _ in range(edges)]
    seeds = {rng.randrange(nodes + 3): rng.uniform(0.3, 1.0) for _ in range(rng.randint(1, 6))}
    return es, seeds


@pytest.mark.parametrize("nodes", [2, 5, 30, 120, 200, 900])
def test_same_numbers_as_networkx(nodes: int) -> None:
    # Dense (up to 128 nodes) and edge-array steps; self-loops, parallel edges
    # both ways, zero weights, isolated seeds all occur.
    rng = random.Random(nodes)
    for _ in range(20):
        edges, seeds = random_graph(rng, nodes, rng.randint(0, min(3 * nodes, 2000)))
        expected = networkx_ppr(edges, seeds, damping=D)
        got = personalized_pagerank(edges, seeds, damping=D)
        assert list(got) == list(expected)  # same nodes, in the same order
        assert got == pytest.approx(expected, abs=1e-12)


def test_without_edges_the_numbers_are_networkxs_to_the_bit() -> None:
    # Every node an isolated seed (the graphs of the quality suites, which
    # write no relations): the scores, and so their ties, are main's.
    rng = random.Random(11)
    for _ in range(300):
        seeds = {rng.randrange(10**6): rng.choice([1.0, rng.uniform(0.3, 0.9)]) for _ in range(rng.randint(1, 12))}
        assert personalized_pagerank([], seeds, damping=D) == networkx_ppr([], seeds, damping=D)


@pytest.mark.parametrize("damping", [0.5, 0.85, 0.95])
def test_same_numbers_at_other_dampings(damping: float) -> None:
    rng = random.Random(7)
    edges, seeds = random_graph(rng, 60, 150)
    assert personalized_pagerank(edges, seeds, damping=damping) == pytest.approx(
        networkx_ppr(edges, seeds, damping=damping), abs=1e-12
    )


def test_a_self_loop_counts_once_as_in_networkx() -> None:
    edges = [(1, 1, 2.0), (1, 2, 1.0)]
    assert personalized_pagerank(edges, {1: 1.0}, damping=D) == pytest.approx(
        networkx_ppr(edges, {1: 1.0}, damping=D), abs=1e-12
    )


def test_no_convergence_within_max_iter_raises_like_networkx() -> None:
    edges = [(1, 2, 1.0), (2, 3, 1.0)]
    with pytest.raises(nx.PowerIterationFailedConvergence):
        nx.pagerank(nx.path_graph([1, 2, 3]), alpha=D, personalization={1: 1.0}, max_iter=3)
    with pytest.raises(PageRankDidNotConverge, match="did not converge in 3 iterations"):
        personalized_pagerank(edges, {1: 1.0}, damping=D, max_iter=3)


def test_no_positive_seed_weight_gives_nothing() -> None:
    assert personalized_pagerank([(1, 2, 1.0)], {1: 0.0, 2: 0.0}, damping=D) == {}


def reference_graph(
    edges: list[tuple[int, int, float]], seeds: dict[int, float]
) -> tuple[list[int], dict[tuple[int, int], float]]:
    """The graph as the walk built it edge by edge in Python before: the
    nodes in first-seen order (seeds first), each undirected pair once
    (smaller index first) with its parallel weights added in edge order."""
    index = {node: i for i, node in enumerate(seeds)}
    pairs: dict[tuple[int, int], float] = {}
    for a, b, w in edges:
        i = index.setdefault(a, len(index))
        j = index.setdefault(b, len(index))
        key = (i, j) if i <= j else (j, i)
        pairs[key] = pairs[key] + w if key in pairs else max(w, 1e-6)
    return list(index), pairs


@pytest.mark.parametrize("nodes", [3, 40, 500, 10**15])
def test_the_columns_build_the_same_graph_as_edge_by_edge(nodes: int) -> None:
    # Ids past 2**53 too (no float round trip), weights 0 and repeated pairs both ways.
    rng = random.Random(nodes)
    for _ in range(50):
        edges, seeds = random_graph(rng, nodes, rng.randint(0, 400))
        edges = [(a, b, w if rng.random() < 0.8 else rng.random()) for a, b, w in edges]
        want_nodes, want_pairs = reference_graph(edges, seeds)
        got_nodes, ij, w = _pairs(
            np.fromiter(seeds, dtype=np.int64, count=len(seeds)),
            np.asarray([e[0] for e in edges], dtype=np.int64),
            np.asarray([e[1] for e in edges], dtype=np.int64),
            np.asarray([e[2] for e in edges], dtype=np.float64),
        )
        assert got_nodes.tolist() == want_nodes
        assert list(zip(map(tuple, ij.tolist()), w.tolist(), strict=True)) == list(want_pairs.items())
        # And the scores from either form of the edges are the same floats.
        assert pagerank_columns(
            [e[0] for e in edges], [e[1] for e in edges], [e[2] for e in edges], seeds, damping=D
        ) == personalized_pagerank(edges, seeds, damping=D)
