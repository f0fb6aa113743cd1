"""Clustered vocabulary for the drafter head: balanced k-means -> token_ordering, and its recall.

`token_ordering` ([V], a permutation) lists cluster 0's tokens, then cluster 1's, ...: viewed as
[C, V/C], row c holds the ids of cluster c. The head scores C centroids, keeps the top-k clusters and
scores only their k * V/C tokens. Recall = share of positions whose dense-head argmax falls inside
the selected clusters (the drafter can never propose a token outside them).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from edge_spec.errors import ConfigError


class Clustering(NamedTuple):
    token_ordering: np.ndarray  # [V] int64 permutation, cluster-major
    centroids: np.ndarray  # [C, d] float32 mean (unit-normalised) embedding of each cluster


def balanced_assign(scores: np.ndarray, capacity: int) -> np.ndarray:
    """scores: [V, C] (higher = better) -> cluster of each token [V], every cluster holding exactly `capacity`.

    Rounds of "every unassigned token bids for its best open cluster; an over-full cluster keeps its
    best bidders". Terminates: each round fills at least one cluster or assigns every bidder.
    """
    v, c = scores.shape
    if v != c * capacity:
        raise ConfigError(f"{v} tokens cannot fill {c} clusters of {capacity}")
    assign = np.full(v, -1, dtype=np.int64)
    load = np.zeros(c, dtype=np.int64)
    while (free := np.flatnonzero(assign < 0)).size:
        open_scores = np.where(load[None, :] < capacity, scores[free], -np.inf)  # [U, C]
        choice = open_scores.argmax(axis=1)
        bid = open_scores[np.arange(free.size), choice]
        order = np.lexsort((-bid, choice))  # by cluster, best bid first
        ranked_choice = choice[order]
        first = np.searchsorted(ranked_choice, ranked_choice, side="left")
        rank_in_cluster = np.arange(order.size) - first
        accepted = rank_in_cluster < (capacity - load[ranked_choice])
        winners = free[order[accepted]]
        assign[winners] = ranked_choice[accepted]
        np.add.at(load, ranked_choice[accepted], 1)
    return assign


def balanced_kmeans(embeddings: np.ndarray, num_clusters: int, *, iters: int = 10, seed: int = 0,
                    progress=None) -> Clustering:
    """Spherical balanced k-means over token embeddings [V, d] (cosine similarity, equal-size clusters)."""
    v = embeddings.shape[0]
    if num_clusters < 1 or v % num_clusters:
        raise ConfigError(f"vocabulary size {v} is not a multiple of {num_clusters} clusters",
                          f"choose a divisor of {v}, e.g. {_divisors_near(v, num_clusters)}")
    x = embeddings.astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True) + 1e-8
    rng = np.random.default_rng(seed)
    centroids = x[rng.choice(v, num_clusters, replace=False)]
    for _ in range(iters):
        assign = balanced_assign(x @ centroids.T, v // num_clusters)
        sums = np.zeros_like(centroids)
        np.add.at(sums, assign, x)
        centroids = sums / (np.linalg.norm(sums, axis=1, keepdims=True) + 1e-8)
        if progress:
            progress()
    order = np.argsort(assign, kind="stable").astype(np.int64)
    return Clustering(order, centroids.astype(np.float32))


def _divisors_near(v: int, n: int) -> list[int]:
    divisors = [d for d in range(2, min(v, 65536) + 1) if v % d == 0]
    return sorted(divisors, key=lambda d: abs(d - n))[:3]


def recall(hidden: np.ndarray, table: np.ndarray, clustering: Clustering, top_k: int,
           centroid_weights: np.ndarray | None = None) -> float:
    """hidden: [N, d] states that feed the head; table: [V, d] output embedding.

    Share of rows whose dense argmax token lies in the top_k clusters scored by `centroid_weights`
    ([C, d]; default: the clustering's centroids)."""
    c = clustering.centroids.shape[0]
    weights = clustering.centroids if centroid_weights is None else centroid_weights
    dense_best = (hidden @ table.T).argmax(axis=1)  # [N]
    cluster_of = np.empty(table.shape[0], dtype=np.int64)
    cluster_of[clustering.token_ordering] = np.repeat(np.arange(c), table.shape[0] // c)
    top = np.argsort(-(hidden @ weights.T), axis=1)[:, :top_k]  # [N, k]
    return float((top == cluster_of[dense_best][:, None]).any(axis=1).mean())
