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

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["PageRankDidNotConverge", "columns", "pagerank_columns", "personalized_pagerank"]

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
    edges: Sequence[tuple[int, int, float]],
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
    sources, targets, weights = columns(edges, 0, 1, 2)
    return pagerank_columns(sources, targets, weights, seeds, damping=damping, max_iter=max_iter, tol=tol)


def columns(rows: Sequence[Sequence[Any]], *which: int) -> list[Sequence[Any]]:
    """The columns ``which`` of ``rows`` (each an empty one when there are no rows)."""
    if not rows:
        return [() for _ in which]
    every = list(zip(*rows, strict=True))
    return [every[i] for i in which]


def pagerank_columns(
    sources: Sequence[int] | np.ndarray,
    targets: Sequence[int] | np.ndarray,
    weights: Sequence[float] | np.ndarray,
    seeds: dict[int, float],
    *,
    damping: float,
    max_iter: int = 100,
    tol: float = 1e-6,
) -> dict[int, float]:
    """:func:`personalized_pagerank` of the edges ``sources[i] -- targets[i]``
    weighing ``weights[i]``, taken as columns or arrays (the same numbers, to
    the bit)."""
    total = sum(seeds.values())
    if total <= 0:
        return {}
    nodes, ij, w = _pairs(
        np.fromiter(seeds, dtype=np.int64, count=len(seeds)),
        np.asarray(sources, dtype=np.int64),
        np.asarray(targets, dtype=np.int64),
        np.asarray(weights, dtype=np.float64),
    )
    n = len(nodes)
    # As networkx: the personalization scaled by the seeds' total, then by its sum.
    p = np.zeros(n)
    p[: len(seeds)] = np.fromiter(seeds.values(), dtype=np.float64, count=len(seeds)) / total
    p /= p.sum()
    transition, dangling = _dense(ij, w, n) if n <= _DENSE_UP_TO else _sparse(ij, w, n)
    restart = (1.0 - damping) * p
    x = np.full(n, 1.0 / n)
    for _ in range(max_iter):
        last = x
        # networkx's step, term by term: the dangling nodes' mass (a builtin
        # sum, as networkx takes it) goes back by the personalization.
        x = damping * (transition(x) + sum(x[dangling]) * p) + restart
        if np.abs(x - last).sum() < n * tol:
            return dict(zip(nodes.tolist(), x.tolist(), strict=True))
    raise PageRankDidNotConverge(f"personalized PageRank did not converge in {max_iter} iterations")


def _pairs(
    seeds: np.ndarray, sources: np.ndarray, targets: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The nodes (the seeds, then each edge's ends as they first occur) and
    the undirected edges between their indexes, each pair once (smaller
    index first, in the order pairs first occur) with the weights of its
    parallel edges summed in edge order, the first taken as at least
    :data:`_MIN_WEIGHT`: networkx's graph, built edge by edge."""
    ends = np.empty(2 * len(sources), dtype=np.int64)
    ends[0::2] = sources
    ends[1::2] = targets
    every = np.concatenate([seeds, ends])
    unique, first, where = np.unique(every, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(unique), dtype=np.int64)
    rank[order] = np.arange(len(unique))
    index = rank[where.reshape(-1)][len(seeds) :]
    i, j = index[0::2], index[1::2]
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    keys, key_first, key_where = np.unique(lo * len(unique) + hi, return_index=True, return_inverse=True)
    start = weights.copy()
    start[key_first] = np.maximum(weights[key_first], _MIN_WEIGHT)
    # bincount adds in input order, from 0.0: the first weight, then the next ones.
    summed = np.bincount(key_where.reshape(-1), weights=start, minlength=len(keys))
    in_order = np.argsort(key_first, kind="stable")
    firsts = key_first[in_order]
    return unique[order], np.stack([lo[firsts], hi[firsts]], axis=1), summed[in_order]


def _weights(ij: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Directed (source, target, weight) arrays: both directions of an edge,
    a self-loop once (as networkx's adjacency matrix has it)."""
    loop = ij[:, 0] == ij[:, 1]
    src = np.concatenate([ij[:, 0], ij[~loop, 1]])
    dst = np.concatenate([ij[:, 1], ij[~loop, 0]])
    return src, dst, np.concatenate([w, w[~loop]])


def _dense(ij: np.ndarray, weights: np.ndarray, n: int) -> tuple[_Step, np.ndarray]:
    """x -> x A with a dense row-normalised A (a dangling node's row is
    zero), and the dangling nodes."""
    m = np.zeros((n, n))
    if len(ij):
        src, dst, w = _weights(ij, weights)
        m[src, dst] = w
    out = m.sum(axis=1)
    dangling = out == 0
    # 1 / out times the weight, as networkx scales its matrix.
    m[~dangling] *= (1.0 / out[~dangling])[:, None]
    return (lambda x: x @ m), np.flatnonzero(dangling)


def _sparse(ij: np.ndarray, weights: np.ndarray, n: int) -> tuple[_Step, np.ndarray]:
    """The same product from edge arrays, for neighbourhoods too big for a dense matrix."""
    src, dst, w = _weights(ij, weights)
    out = np.bincount(src, weights=w, minlength=n)
    dangling = out == 0
    scale = np.zeros(n)
    scale[~dangling] = 1.0 / out[~dangling]
    share = scale[src] * w

    def step(x: np.ndarray) -> np.ndarray:
        moved: np.ndarray = np.bincount(dst, weights=x[src] * share, minlength=n)
        return moved

    return step, np.flatnonzero(dangling)
