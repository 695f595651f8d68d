import numpy as np

from edge.export.quant.grid import dequantize, minmax_params, quantize


def test_integer_zero_grid_contains_zero_and_covers_the_range():
    w = np.array([[0.3, 0.5, 0.9], [-1.0, -0.2, 0.4]])
    scale, zero = minmax_params(w, 2)
    assert np.all(zero == np.round(zero)) and zero.min() >= 0 and zero.max() <= 3
    deq = dequantize(quantize(w, scale[:, None], zero[:, None], 2), scale[:, None], zero[:, None])
    assert np.all(np.abs(deq - w) <= scale[:, None] / 2 + 1e-12)
    assert np.all(dequantize(zero, scale, zero) == 0)  # 0 is exactly representable


def test_float_zero_grid_spans_min_to_max_exactly():
    w = np.array([[0.3, 0.5, 0.9], [2.0, 2.0, 2.0]])
    scale, zero = minmax_params(w, 2, float_zero=True)
    codes = quantize(w, scale[:, None], zero[:, None], 2)
    deq = dequantize(codes, scale[:, None], zero[:, None])
    np.testing.assert_allclose(deq[0, [0, 2]], [0.3, 0.9])
    np.testing.assert_allclose(deq[1], 2.0)


def test_masked_entries_are_ignored():
    w = np.array([[0.1, 0.2, 50.0]])
    scale, _ = minmax_params(w, 4, mask=np.array([[True, True, False]]))
    assert scale[0] < 0.1
