import numpy as np
import pytest

from edge.export.quant import QuantizationError
from edge.export.quant.decoupleq import DecoupleQConfig, run_decoupleq
from edge.export.quant.hessian import damped, weighted_error
from edge.export.quant.rtn import quantize_rtn
from quant_util import correlated_hessian


@pytest.fixture(scope="module")
def layer():
    rng = np.random.default_rng(3)
    return (rng.normal(size=(64, 192)) * 0.05).astype(np.float32), correlated_hessian(192, 4)


@pytest.mark.parametrize("integer_zeros", [False, True])
@pytest.mark.parametrize("group_size", [64, 10_000])
def test_objective_never_increases(layer, integer_zeros, group_size):
    w, h = layer
    res = run_decoupleq(w, h, DecoupleQConfig(bits=2, group_size=group_size, rounds=5, integer_zeros=integer_zeros, tol=0))
    assert len(res.history) == 11
    assert all(b <= a for a, b in zip(res.history, res.history[1:]))
    assert res.history[-1] < 0.8 * res.history[0]  # the alternation does real work beyond the GPTQ start
    # the history is the damped objective of the returned layer
    hd, _ = damped(h, 0.01)
    assert weighted_error(w, res.layer.dequantize(), hd).sum() == pytest.approx(res.history[-1], rel=1e-4)


def test_two_bit_far_below_rtn(layer):
    w, h = layer
    q = run_decoupleq(w, h, DecoupleQConfig(bits=2, group_size=64)).layer
    rtn = quantize_rtn(w, 2, 64)
    assert weighted_error(w, q.dequantize(), h).sum() < 0.5 * weighted_error(w, rtn.dequantize(), h).sum()


@pytest.mark.parametrize("bits", [3, 4])
def test_beats_rtn_at_3_and_4_bits(layer, bits):
    w, h = layer
    q = run_decoupleq(w, h, DecoupleQConfig(bits=bits, group_size=64)).layer
    rtn = quantize_rtn(w, bits, 64)
    assert weighted_error(w, q.dequantize(), h).sum() < 0.8 * weighted_error(w, rtn.dequantize(), h).sum()


def test_early_stop_and_integer_zeros_need_no_offsets(layer):
    w, h = layer
    res = run_decoupleq(w, h, DecoupleQConfig(bits=4, group_size=64, rounds=50, tol=1e-2, integer_zeros=True))
    assert len(res.history) < 101
    assert res.layer.offsets is None and res.layer.zeros.max() <= 15


def test_float_zeros_become_offsets(layer):
    w, h = layer
    q = run_decoupleq(w, h, DecoupleQConfig(bits=2, group_size=64)).layer
    assert q.offsets is not None and q.zeros.max() <= 3
    assert q.offsets.shape == q.scales.shape and np.abs(q.offsets).max() > 0


def test_rejects_bad_settings(layer):
    w, h = layer
    with pytest.raises(QuantizationError):
        run_decoupleq(w, h, DecoupleQConfig(bits=8))
    with pytest.raises(QuantizationError):
        run_decoupleq(w, h, DecoupleQConfig(rounds=-1))
