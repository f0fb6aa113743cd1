"""Sampling maths: exact values on hand-built logits."""

import math

import numpy as np
import pytest

from edge_spec.errors import ConfigError
from edge_spec.decoding.sampling import SamplingParams, sample, token_probs


def test_greedy_is_one_hot_on_first_argmax():
    probs = token_probs(np.array([1.0, 3.0, 3.0, 0.0]), SamplingParams(0.0))
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_temperature_softmax_exact():
    probs = token_probs(np.array([0.0, math.log(3.0)]), SamplingParams(1.0))
    assert probs == pytest.approx([0.25, 0.75], abs=1e-12)
    probs = token_probs(np.array([0.0, math.log(3.0)]), SamplingParams(0.5))  # logits doubled -> 1:9
    assert probs == pytest.approx([0.1, 0.9], abs=1e-12)


def test_top_k_keeps_k_largest():
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4]))
    probs = token_probs(logits, SamplingParams(1.0, top_k=2))
    assert probs == pytest.approx([0, 0, 3 / 7, 4 / 7], abs=1e-12)


def test_top_p_keeps_smallest_set_reaching_p():
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4]))
    # sorted 0.4, 0.3 | 0.2, 0.1: mass before 0.3 is 0.4 < 0.6 -> kept; before 0.2 is 0.7 -> dropped
    assert token_probs(logits, SamplingParams(1.0, top_p=0.6)) == pytest.approx([0, 0, 3 / 7, 4 / 7], abs=1e-12)
    # top_p small: only the most likely token survives
    assert token_probs(logits, SamplingParams(1.0, top_p=0.05)) == pytest.approx([0, 0, 0, 1], abs=1e-12)


def test_sample_follows_the_uniform_draw():
    probs = np.array([0.25, 0.0, 0.75])
    draws = [sample(probs, np.random.default_rng(s)) for s in range(2000)]
    assert 1 not in draws  # a zero-probability token is never drawn
    assert 0.70 < np.mean(np.array(draws) == 2) < 0.80


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=1.0, top_k=-2), "top_k"),
    (dict(temperature=1.0, top_p=0.0), "top_p"),
    (dict(temperature=1.0, top_p=1.5), "top_p"),
])
def test_bad_sampling_parameters_raise(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**kwargs)
