import numpy as np
import pytest

from edge.export.quant.gptq import quantize_gptq
from edge.export.quant.hessian import weighted_error
from edge.export.quant.rtn import quantize_rtn
from quant_util import correlated_hessian


def test_identity_hessian_is_round_to_nearest():
    w = (np.random.default_rng(0).normal(size=(32, 128)) * 0.05).astype(np.float32)
    g = quantize_gptq(w, np.eye(128), 4, 32)
    np.testing.assert_allclose(g.dequantize(), quantize_rtn(w, 4, 32).dequantize(), atol=1e-7)


@pytest.mark.parametrize("bits,block_size", [(3, 32), (4, 32), (4, 16), (3, 10_000)])
def test_error_feedback_beats_rtn(bits, block_size):
    w = (np.random.default_rng(1).normal(size=(64, 256)) * 0.05).astype(np.float32)
    h = correlated_hessian(256, 2)
    g = quantize_gptq(w, h, bits, block_size)
    r = quantize_rtn(w, bits, block_size)
    assert weighted_error(w, g.dequantize(), h).sum() < 0.8 * weighted_error(w, r.dequantize(), h).sum()


def test_dead_inputs_are_zeroed():
    w = np.ones((4, 32), np.float32)
    h = np.eye(32)
    h[5, 5] = 0.0
    g = quantize_gptq(w, h, 4, 16)
    assert np.all(g.dequantize()[:, 5] == 0) and np.allclose(np.delete(g.dequantize(), 5, axis=1), 1)


def test_float_zero_recovers_weights_already_on_a_minmax_grid():
    """A dequantized Q4_1 model sits on per-block min..max grids; fractional zeros reproduce it exactly."""
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, size=(16, 4, 32))
    codes[..., 0], codes[..., 1] = 0, 15  # every block spans its full range
    step = rng.uniform(0.01, 0.02, size=(16, 4, 1))
    low = rng.uniform(-0.2, -0.05, size=(16, 4, 1))
    w = (low + step * codes).reshape(16, 128).astype(np.float32)
    h = correlated_hessian(128, 4)
    exact = quantize_gptq(w, h, 4, 32, float_zero=True)
    np.testing.assert_allclose(exact.dequantize(), w, atol=1e-6)
    assert exact.offsets is not None and exact.zeros.max() <= 15
    assert np.abs(quantize_gptq(w, h, 4, 32).dequantize() - w).max() > 1e-3
