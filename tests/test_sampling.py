"""Sampling distributions: what `probabilities` promises is what `Sampler` draws."""

from __future__ import annotations

import numpy as np
import pytest

from edge.sampling import Sampler, SamplingParams, probabilities

LOGITS = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])


def test_greedy_is_the_argmax():
    assert Sampler(SamplingParams())(LOGITS) == 5
    assert probabilities(LOGITS, SamplingParams())[5] == 1.0


def test_temperature_softmax():
    p = probabilities(LOGITS, SamplingParams(temperature=0.5))
    expected = np.exp(LOGITS / 0.5) / np.exp(LOGITS / 0.5).sum()
    np.testing.assert_allclose(p, expected)


def test_top_k_keeps_the_k_largest():
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert set(np.flatnonzero(p)) == {0, 5}
    assert p.sum() == pytest.approx(1.0)


def test_top_p_keeps_the_smallest_set_reaching_p():
    full = probabilities(LOGITS, SamplingParams(temperature=1.0))
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=0.8))
    order = np.argsort(-full)
    needed = int(np.searchsorted(np.cumsum(full[order]), 0.8)) + 1
    assert set(np.flatnonzero(p)) == set(order[:needed])
    np.testing.assert_allclose(p[order[:needed]], full[order[:needed]] / full[order[:needed]].sum())


def test_draws_follow_the_distribution():
    params = SamplingParams(temperature=1.0, top_k=4, seed=0)
    sampler, expected = Sampler(params), probabilities(LOGITS, params)
    counts = np.bincount([sampler(LOGITS) for _ in range(20000)], minlength=LOGITS.size)
    assert np.abs(counts / counts.sum() - expected).max() < 0.015


def test_seed_reproduces_and_bad_params_are_refused():
    params = SamplingParams(temperature=0.9, seed=42)
    assert [Sampler(params)(LOGITS) for _ in range(1)] == [Sampler(params)(LOGITS)]
    a, b = Sampler(params), Sampler(params)
    assert [a(LOGITS) for _ in range(50)] == [b(LOGITS) for _ in range(50)]
    for bad in (dict(temperature=-1), dict(temperature=float("nan")), dict(top_p=0.0), dict(top_p=float("nan")),
                dict(top_k=-2), dict(seed=-1)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
