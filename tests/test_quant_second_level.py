import numpy as np

from edge.export.quant.second_level import quantize_stat


def test_error_within_half_a_step_and_16_bit_stats():
    values = np.abs(np.random.default_rng(0).normal(size=(40, 6))).astype(np.float32) + 0.01
    q = quantize_stat(values, bits=3, group_size=16)
    assert q.codes.shape == (40, 6) and q.codes.max() <= 7
    assert q.base.shape == (3, 6) and q.base.dtype == np.float16 and q.step.dtype == np.float16
    step = np.repeat(q.step.astype(np.float32), 16, axis=0)[:40]
    assert np.all(np.abs(q.dequantize() - values) <= step * 0.5 + 1e-3 * values)
    assert q.storage_bits() == 40 * 6 * 3 + 2 * 3 * 6 * 16


def test_integers_in_a_small_range_are_exact():
    zeros = np.random.default_rng(1).integers(2, 6, size=(32, 4)).astype(np.float32)
    q = quantize_stat(zeros, bits=3, group_size=16)
    np.testing.assert_array_equal(np.round(q.dequantize()), zeros)


def test_stacked_and_reordered_statistics_keep_each_rows_values():
    """q/k/v stacking and edge's gated row order move rows between groups: each row keeps its own (base, step)."""
    from edge.export.quant.second_level import concat_stats

    rng = np.random.default_rng(3)
    parts = [quantize_stat(rng.uniform(0.01, 0.1, (n, 5)).astype(np.float32), 8, 16) for n in (32, 16, 24)]
    stacked = concat_stats(parts)
    expected = np.concatenate([p.dequantize() for p in parts])
    np.testing.assert_array_equal(stacked.dequantize(), expected)
    order = rng.permutation(72)
    np.testing.assert_array_equal(stacked.take_rows(order).dequantize(), expected[order])
