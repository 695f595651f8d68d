"""Adaptive draft length: the cost curve decides, acceptance is tracked, a losing drafter is switched off."""

from __future__ import annotations

import numpy as np
import pytest

from edge.export.pipeline import export_model
from edge.model import Decoder
from edge.package import load_package
from edge.speculative import AdaptiveDepth, CostCurve
from tiny_models import tiny_llama

FLAT = CostCurve((1, 2, 4, 8, 16), (1.0, 1.02, 1.10, 1.31, 1.78))  # float32 weights on this CPU
STEEP = CostCurve((1, 2, 4, 8, 16), (1.0, 1.64, 2.89, 3.06, 4.16))  # int4 MatMulNBits


def chain(depth):
    return depth


def test_curve_interpolates_and_extrapolates():
    assert FLAT(3) == pytest.approx(1.06) and FLAT(32) == pytest.approx(3.56)
    assert STEEP.relative()[4] == pytest.approx(2.89)


def test_cheap_verification_and_good_acceptance_draft_deep():
    policy = AdaptiveDepth(FLAT, chain, max_depth=8, successes=9, trials=10)
    assert policy.depth() >= 6 and policy.best()[1] > 2


def test_expensive_verification_and_poor_acceptance_switch_off_then_probe_less_and_less():
    policy = AdaptiveDepth(STEEP, chain, max_depth=8, probe_every=4)
    for _ in range(20):
        policy.update(4, 0, 0.0)  # nothing accepted
    assert policy.acceptance < 0.1
    probe = policy.best()[0]
    # probes that keep losing back off: after 4 steps, then 8, then 16
    assert [policy.depth() for _ in range(28)] == ([0] * 3 + [probe]) + ([0] * 7 + [probe]) + ([0] * 15 + [probe])
    for _ in range(30):
        policy.update(4, 4, 0.0)  # the text changed: drafts land again
    assert policy.depth() > 0 and policy.probe_interval == 0  # drafting again; a later loss probes every 4 again


def test_acceptance_estimate_follows_recent_outcomes():
    policy = AdaptiveDepth(STEEP, chain)
    for _ in range(30):
        policy.update(4, 4, 0.0)
    assert (policy.rates()[:4] > 0.9).all() and policy.depth() >= 4
    for _ in range(30):
        policy.update(4, 1, 0.0)  # the first token always lands, the second never: draft exactly one
    rates = policy.rates()
    assert rates[0] > 0.9 and rates[1] < 0.25 and policy.best()[0] == 1
    flat = AdaptiveDepth(FLAT, chain)
    for _ in range(30):
        flat.update(4, 1, 0.0)
    assert flat.best()[0] <= 2  # cheap verification: a second token is worth a try


def test_bursty_acceptance_drafts_deeper_than_one_rate_would():
    """A copying drafter: half the drafts miss at once, the other half copy the whole span. Per-level rates see
    0.5 then ~1.0 and pay for a deep draft even on a steep (int4) cost curve; one shared rate (~0.67) would not."""
    policy = AdaptiveDepth(STEEP, chain)
    for i in range(40):
        policy.update(8, 0 if i % 2 else 8, 0.0)
    rates = policy.rates()
    assert rates[0] == pytest.approx(0.5, abs=0.1) and (rates[1:] > 0.8).all()
    depth, gain = policy.best()
    assert depth >= 6 and gain > 1.05
    shared = 1.0 + sum(0.67 ** i for i in range(1, depth + 1))
    assert shared * STEEP(1) / STEEP(1 + depth) < policy.min_gain


def test_draft_time_counts_against_depth():
    free = AdaptiveDepth(FLAT, chain, successes=7, trials=10)
    costly = AdaptiveDepth(FLAT, chain, successes=7, trials=10, draft_seconds_per_level=0.5)
    assert costly.best()[0] < free.best()[0] and costly.best()[1] < free.best()[1]


def test_measuring_leaves_the_cache_as_it_was_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_CACHE", str(tmp_path / "cache"))
    _, imported = tiny_llama(seed=2)
    decoder = Decoder(load_package(export_model("tiny", tmp_path / "p", quant="fp32", model=imported)),
                      context_length=40, threads=1)
    decoder.prefill(list(range(1, 31)))  # 30 tokens: the 16-token probes must overwrite part of them
    before = [a[:, :, :30].copy() for a in decoder.cache.arrays]
    curve = CostCurve.cached(decoder, threads=1)
    assert decoder.cache.length == 30
    for a, b in zip(decoder.cache.arrays, before):
        np.testing.assert_array_equal(a[:, :, :30], b)
    assert curve.sizes == (1, 2, 4, 8, 16) and all(np.diff(curve.seconds) >= 0)
    assert 0 <= curve.deviation < 1e-3 and curve.margin == 2 * curve.deviation
    assert CostCurve(curve.sizes, curve.seconds, 0.5).margin == 0.0  # a different kernel path: no guard
    files = list((tmp_path / "cache" / "speculative").glob("cost-*-t1-r16.json"))  # keyed by package, threads and rows
    assert len(files) == 1
    assert CostCurve.cached(decoder, threads=1) == curve  # read back, not measured again
