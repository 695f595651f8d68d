"""Sampling distributions: what `probabilities` promises is what `Sampler` draws."""

from __future__ import annotations

import numpy as np
import pytest

from edge.sampling import Sampler, SamplingParams, draw, nucleus, probabilities, top_k

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


def reference(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution written plainly: the whole vocabulary gathered, sorted and scattered (edge before
    session 43, with the top-k ties going to the lower indices)."""
    logits = np.asarray(logits, dtype=np.float64)
    probs = np.zeros_like(logits)
    candidates = np.arange(logits.size)
    if 0 < params.top_k < logits.size:
        candidates = np.sort(np.argsort(-logits, kind="stable")[:params.top_k])
    scaled = logits[candidates] / params.temperature
    weights = np.exp(scaled - scaled.max())
    weights /= weights.sum()
    if params.top_p < 1.0:
        order = np.argsort(-weights, kind="stable")
        keep = order[:int(np.searchsorted(np.cumsum(weights[order]), params.top_p)) + 1]
        candidates, weights = candidates[keep], weights[keep] / weights[keep].sum()
    probs[candidates] = weights
    return probs


def vocabulary_rows():
    """Rows shaped like a model's: peaked, flat, dense near the top, and with ties at the top."""
    rng = np.random.default_rng(3)
    peaked = (rng.standard_normal(49152) * 2.5).astype(np.float32)
    peaked[[7, 900, 31000]] += [14.0, 12.5, 12.5]
    flat = (rng.standard_normal(49152) * 0.01).astype(np.float32)
    tied = np.round(rng.standard_normal(5000) * 2).astype(np.float32)  # many equal logits at every value
    return [peaked, flat, tied, (rng.standard_normal(100) * 8).astype(np.float32)]


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9),
                                    dict(temperature=0.5, top_p=0.3), dict(temperature=1.2, top_p=0.999),
                                    dict(temperature=0.8, top_k=40), dict(temperature=0.8, top_k=40, top_p=0.95),
                                    dict(temperature=1.0, top_k=1)])
def test_probabilities_match_the_plain_computation(params):
    params = SamplingParams(**params)
    for row in vocabulary_rows():
        expected, got = reference(row, params), probabilities(row, params)
        assert np.array_equal(expected > 0, got > 0)  # the same tokens kept, ties included
        if params.top_k:  # the k kept are softmaxed in index order: rounding may differ
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)
        else:
            assert np.array_equal(got, expected)  # the same float64 operations, bit for bit


def test_nucleus_is_the_prefix_of_the_full_stable_order():
    rng = np.random.default_rng(5)
    long_tail = np.concatenate([[1.0], np.full(5000, 1e-4)])  # the top alone, then a tail far below it
    for weights in (rng.random(3000) ** 20, np.full(3000, 1 / 3000), np.repeat([0.5, 0.3, 0.2], [1, 10, 40]),
                    long_tail):
        weights = weights / weights.sum()
        order = np.argsort(-weights, kind="stable")
        for top_p in (0.1, 0.5, 0.9, 0.99):
            needed = int(np.searchsorted(np.cumsum(weights[order]), top_p)) + 1
            assert list(nucleus(weights, top_p)) == list(order[:needed])


def test_top_k_breaks_ties_towards_lower_indices():
    x = np.array([1.0, 5.0, 3.0, 5.0, 5.0, 0.0])
    assert list(top_k(x, 2)) == [1, 3] and list(top_k(x, 4)) == [1, 2, 3, 4]
    assert list(top_k(np.array([0.0, 100.0, -1e30, 50.0]), 3)) == [0, 1, 3]  # beyond every spread tried
    assert sorted(top_k(np.array([np.nan, 1.0, 2.0]), 2)) in ([0, 1], [0, 2], [1, 2])  # returns, whatever it picks


def test_draw_is_generator_choice():
    rng = np.random.default_rng(9)
    for size in (2, 50, 1024, 1025, 49152):
        p = rng.random(size) ** 8
        p[rng.integers(0, size, size // 2)] = 0.0
        p /= p.sum()
        a, b = np.random.default_rng(size), np.random.default_rng(size)
        assert [draw(p, a) for _ in range(500)] == [int(b.choice(size, p=p)) for _ in range(500)]
        assert a.random() == b.random()  # the generators are at the same point afterwards
    with pytest.raises(ValueError, match="non-finite"):
        draw(np.array([0.5, np.nan]), np.random.default_rng(0))


def test_draw_never_picks_a_zero_probability():
    rng = np.random.default_rng(4)
    p = np.zeros(5000)
    p[[0, 1023, 1024, 3071]] = [1e-300, 0.5, 0.25, 0.25]  # at blocks' edges; the last block has no mass at all
    counts = np.bincount([draw(p, rng) for _ in range(4000)], minlength=p.size)
    assert set(np.flatnonzero(counts)) <= {0, 1023, 1024, 3071}
    np.testing.assert_allclose(counts[[1023, 1024, 3071]] / 4000, [0.5, 0.25, 0.25], atol=0.03)

    class Top:  # a generator at the very top of its range: the running sums' rounding decides
        def random(self):
            return np.nextafter(1.0, 0.0)
    assert draw(p, Top()) == 3071 and draw(np.array([0.3, 0.7, 0.0]), Top()) == 1


def test_a_sampler_reuses_its_workspace():
    sampler = Sampler(SamplingParams(temperature=1.0))
    first = sampler.probabilities(LOGITS)
    assert sampler.probabilities(LOGITS[::-1].copy()) is first  # no vocabulary-sized array per token
    np.testing.assert_allclose(first, probabilities(LOGITS[::-1], SamplingParams(temperature=1.0)))
