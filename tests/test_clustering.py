"""Clustering maths: exact balanced assignment, permutation output, recall on a planted structure."""

import numpy as np
import pytest

from edge_spec.model.clustering import Clustering, balanced_assign, balanced_kmeans, recall
from edge_spec.errors import ConfigError


def test_balanced_assign_hand_built():
    # 4 tokens, 2 clusters of 2: everyone prefers cluster 0; tokens 2 and 3 bid highest and win it
    scores = np.array([[0.5, 0.1], [0.6, 0.0], [0.9, 0.2], [0.8, 0.7]])
    assert balanced_assign(scores, 2).tolist() == [1, 1, 0, 0]


def test_balanced_assign_equal_sizes_random():
    scores = np.random.default_rng(0).normal(size=(600, 12))
    assign = balanced_assign(scores, 50)
    assert np.bincount(assign, minlength=12).tolist() == [50] * 12


def test_kmeans_recovers_planted_clusters_and_recall_is_exact():
    rng = np.random.default_rng(1)
    centers = rng.normal(size=(8, 16)) * 5
    emb = np.repeat(centers, 32, axis=0) + rng.normal(size=(256, 16)) * 0.1  # 8 tight groups of 32
    result = balanced_kmeans(emb, 8, iters=5)
    assert sorted(result.token_ordering.tolist()) == list(range(256))
    groups = result.token_ordering.reshape(8, 32) // 32  # planted group of every member of each cluster
    assert all(len(set(row)) == 1 for row in groups.tolist())
    hidden = centers[rng.integers(0, 8, 100)]  # states pointing at one group each
    assert recall(hidden, emb, result, top_k=1) == 1.0
    wrong = Clustering(result.token_ordering, -result.centroids)  # inverted scores pick the worst cluster
    assert recall(hidden, emb, wrong, top_k=1) == 0.0


def test_vocab_not_divisible_is_refused():
    with pytest.raises(ConfigError, match="not a multiple"):
        balanced_kmeans(np.ones((10, 4)), 3)
