"""Personalized PageRank over a small undirected weighted graph, in numpy.

The graph source scores the neighbourhood it fetched with it
(:mod:`indexers.graph`). The numbers are networkx's ``pagerank`` on the
same :class:`networkx.Graph` (networkx 3.x, ``_pagerank_scipy``): the same
power iteration from the uniform vector, dangling nodes (isolated seeds)
restarting by the personalization, and the same stopping rule, an L1 change
below ``len(nodes) * tol`` within ``max_iter`` iterations, each step's terms
computed as networkx computes them. Only the matrix product sums in another
order: a graph without edges (every node an isolated seed) gets networkx's
numbers to the bit, one with edges within a few 1e-16. What it saves is
networkx's graph and sparse-matrix set-up, which cost more than the
iteration on the graphs a recall fetches.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["PageRankDidNotConverge", "personalized_pagerank"]

#: Up to this many nodes the transition matrix is dense (one matrix-vector
#: product an iteration); above it, edge arrays summed with ``bincount``.
_DENSE_UP_TO = 128

#: The weight a relation of weight 0 or less gets when it first joins two
#: entities (a later parallel relation adds its own weight as it is).
_MIN_WEIGHT = 1e-6


#: One power-iteration step, x -> x'.
_Step = Callable[[np.ndarray], np.ndarray]


class PageRankDidNotConverge(RuntimeError):
    """The power iteration did not meet its tolerance within ``max_iter`` iterations."""


def personalized_pagerank(
    edges: list[tuple[int, int, float]],
    seeds: dict[int, float],
    *,
    damping: float,
    max_iter: int = 100,
    tol: float = 1e-6,
) -> dict[int, float]:
    """PPR over an undirected weighted graph, restarting at ``seeds`` in
    proportion to their weights; isolated seeds keep their share.

    Nodes are the seeds and the edges' ends. Parallel edges (either
    direction) add their weights. With no positive seed weight: ``{}``.
    Raises :class:`PageRankDidNotConverge` where networkx would raise
    ``PowerIterationFailedConvergence``.
    """
    total = sum(seeds.values())
    if total <= 0:
        return {}
    index = {node: i for i, node in enumerate(seeds)}
    pairs: dict[tuple[int, int], float] = {}
    for a, b, w in edges:
        i = index.setdefault(a, len(index))
        j = index.setdefault(b, len(index))
        key = (i, j) if i <= j else (j, i)
        pairs[key] = pairs[key] + w if key in pairs else max(w, _MIN_WEIGHT)
    n = len(index)
    # As networkx: the personalization scaled by the seeds' total, then by its sum.
    p = np.array([seeds.get(node, 0.0) / total for node in index])
    p /= p.sum()
    transition, dangling = _dense(pairs, n) if n <= _DENSE_UP_TO else _sparse(pairs, n)
    restart = (1.0 - damping) * p
    x = np.full(n, 1.0 / n)
    for _ in range(max_iter):
        last = x
        # networkx's step, term by term: the dangling nodes' mass (a builtin
        # sum, as networkx takes it) goes back by the personalization.
        x = damping * (transition(x) + sum(x[dangling]) * p) + restart
        if np.abs(x - last).sum() < n * tol:
            return dict(zip(index, x.tolist(), strict=True))
    raise PageRankDidNotConverge(f"personalized PageRank did not converge in {max_iter} iterations")


def _weights(pairs: dict[tuple[int, int], float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Directed (source, target, weight) arrays: both directions of an edge,
    a self-loop once (as networkx's adjacency matrix has it)."""
    ij = np.array(list(pairs), dtype=np.intp).reshape(-1, 2)
    w = np.fromiter(pairs.values(), dtype=float, count=len(pairs))
    loop = ij[:, 0] == ij[:, 1]
    src = np.concatenate([ij[:, 0], ij[~loop, 1]])
    dst = np.concatenate([ij[:, 1], ij[~loop, 0]])
    return src, dst, np.concatenate([w, w[~loop]])


def _dense(pairs: dict[tuple[int, int], float], n: int) -> tuple[_Step, np.ndarray]:
    """x -> x A with a dense row-normalised A (a dangling node's row is
    zero), and the dangling nodes."""
    m = np.zeros((n, n))
    if pairs:
        src, dst, w = _weights(pairs)
        m[src, dst] = w
    out = m.sum(axis=1)
    dangling = out == 0
    # 1 / out times the weight, as networkx scales its matrix.
    m[~dangling] *= (1.0 / out[~dangling])[:, None]
    return (lambda x: x @ m), np.flatnonzero(dangling)


def _sparse(pairs: dict[tuple[int, int], float], n: int) -> tuple[_Step, np.ndarray]:
    """The same product from edge arrays, for neighbourhoods too big for a dense matrix."""
    src, dst, w = _weights(pairs)
    out = np.bincount(src, weights=w, minlength=n)
    dangling = out == 0
    scale = np.zeros(n)
    scale[~dangling] = 1.0 / out[~dangling]
    share = scale[src] * w

    def step(x: np.ndarray) -> np.ndarray:
        moved: np.ndarray = np.bincount(dst, weights=x[src] * share, minlength=n)
        return moved

    return step, np.flatnonzero(dangling)
