"""indexers.pagerank against networkx's pagerank, the oracle it replaces.

The graph source scored neighbourhoods with ``networkx.pagerank`` on an
undirected ``networkx.Graph`` until the numpy power iteration took over; the
numbers must stay networkx's (same iteration, same stopping rule). Closed
forms on small graphs are in tests/integration/test_graph.py.
"""

from __future__ import annotations

import random

import networkx as nx
import pytest

from indexers.pagerank import PageRankDidNotConverge, personalized_pagerank

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
