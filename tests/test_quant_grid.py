import numpy as np

from edge.export.quant.grid import dequantize, lattice_params, minmax_params, quantize


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


def lattice_blocks(rng, n: int, k: int, levels: int, through_zero: bool, unused_extremes: bool = False):
    """Weights made the way GGUF formats make them: per block of 32, min + step * q (Q4_1/Q4_K) or step * q (Q8_0)."""
    blocks = k // 32
    step = rng.uniform(0.005, 0.05, size=(n, blocks, 1)).astype(np.float32)
    if through_zero:
        q = rng.integers(-(levels // 2) + 1, levels // 2, size=(n, blocks, 32))
        return (step * q).reshape(n, k).astype(np.float32)
    q = rng.integers(1 if unused_extremes else 0, levels - 1 if unused_extremes else levels, size=(n, blocks, 32))
    if not unused_extremes:  # Q4_1: both extremes are used in every block
        q[..., 0], q[..., 1] = 0, levels - 1
    lo = -rng.uniform(0.0, 0.5, size=(n, blocks, 1)).astype(np.float32)
    return (lo + step * q).reshape(n, k).astype(np.float32)


def on_grid_distance(w, scale, zero, bits):
    """Largest |w - deq(q(w))| in steps."""
    codes = quantize(w, scale[..., None], zero[..., None], bits)
    return float(np.max(np.abs(dequantize(codes, scale[..., None], zero[..., None]) - w) / scale[..., None]))


def test_lattice_recovers_q4_1_and_q4_k_grids_exactly():
    rng = np.random.default_rng(3)
    for unused in (False, True):  # Q4_K-like blocks often leave q=0 or q=15 unused: min/max then misses the grid
        w = lattice_blocks(rng, 8, 128, 16, through_zero=False, unused_extremes=unused).reshape(8, 4, 32)
        scale, zero, exact = lattice_params(w, 4)
        assert exact.all()
        assert on_grid_distance(w, scale, zero, 4) < 1e-4
    scale_mm, zero_mm = minmax_params(w, 4, float_zero=True)
    assert on_grid_distance(w, scale_mm, zero_mm, 4) > 0.05  # the unused-extremes case is what min/max gets wrong


def test_lattice_through_zero_recovers_q8_0_grids_with_integer_zeros():
    w = lattice_blocks(np.random.default_rng(4), 6, 96, 255, through_zero=True).reshape(6, 3, 32)
    scale, zero, exact = lattice_params(w, 8, through_zero=True)
    assert exact.all() and np.all(zero == np.round(zero)) and zero.max() <= 255
    assert on_grid_distance(w, scale, zero, 8) < 1e-4


def test_off_lattice_groups_fall_back_to_min_max():
    w = np.random.default_rng(5).normal(size=(16, 32))
    scale, zero, exact = lattice_params(w, 4)
    assert not exact.any()
    ref_scale, ref_zero = minmax_params(w, 4, float_zero=True)
    np.testing.assert_allclose(scale, ref_scale)
    np.testing.assert_allclose(zero, ref_zero)
    const = np.full((2, 32), 0.7)
    scale, zero, exact = lattice_params(const, 4)
    assert exact.all() and on_grid_distance(const, scale, zero, 4) < 1e-9
