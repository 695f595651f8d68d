"""edge.QMatMul on the CUDAExecutionProvider: the CPU tests' checks, run where onnxruntime-gpu sees a GPU.

Skipped elsewhere (CI has no GPU); run on a lent GPU machine by benchmarks/gpu/run.sh. Each session refuses a CPU
fallback, so a pass means the CUDA kernel computed every output.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels_util import QMatMulRunner, assert_close_to_reference, cuda_available, make_weight

pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs onnxruntime-gpu, a GPU and the CUDA kernel build")

ROWS = (1, 2, 3, 4, 5, 8, 9, 16, 17, 64)


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("group", [16, 32, 64, 128])
@pytest.mark.parametrize("outliers", [0, 40])
def test_matches_float64_reference(bits: int, group: int, outliers: int) -> None:
    rng = np.random.default_rng(1000 * bits + group + outliers)
    k = 200 if group != 16 else 208
    packed, w = make_weight(rng, 45, k, bits, group, zeros="uint8", outliers=outliers)
    bias = rng.standard_normal(45).astype(np.float32)
    run = QMatMulRunner(packed, bias, cuda=True)
    for m in ROWS:
        x = rng.standard_normal((m, k)).astype(np.float32)
        assert_close_to_reference(run(x), x, w, bias)


@pytest.mark.parametrize("k", [45, 130, 1536, 4100])
def test_odd_and_long_k(k: int) -> None:
    """K not a multiple of 4 (scalar x loads, partial last unit) and K long enough for every warp of a block."""
    rng = np.random.default_rng(k)
    packed, w = make_weight(rng, 70, k, 4, 32)
    run = QMatMulRunner(packed, cuda=True)
    for m in (1, 8, 11):
        x = rng.standard_normal((m, k)).astype(np.float32)
        assert_close_to_reference(run(x), x, w, None, rtol=2e-5 if k > 2000 else 1e-5)


@pytest.mark.parametrize("zeros", ["none", "float32"])
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_zero_point_kinds(bits: int, zeros: str) -> None:
    rng = np.random.default_rng(bits)
    packed, w = make_weight(rng, 24, 96, bits, 32, zeros=zeros)
    run = QMatMulRunner(packed, cuda=True)
    for m in (1, 5):
        x = rng.standard_normal((m, 96)).astype(np.float32)
        assert_close_to_reference(run(x), x, w, None)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_weights_as_inputs_equal_constant_bitwise(bits: int) -> None:
    rng = np.random.default_rng(7 + bits)
    packed, _ = make_weight(rng, 40, 160, bits, 32, outliers=10)
    bias = rng.standard_normal(40).astype(np.float32)
    const, fed = QMatMulRunner(packed, bias, cuda=True), QMatMulRunner(packed, bias, weights_as_inputs=True, cuda=True)
    for m in (1, 8, 17):
        x = rng.standard_normal((m, 160)).astype(np.float32)
        np.testing.assert_array_equal(const(x), fed(x))


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("k", [192, 1536])
def test_batch_invariance(bits: int, k: int) -> None:
    """Row i of an M-row call is bitwise the M=1 result: every launch shape (8-row blocks, 1/2/4-row tails)."""
    rng = np.random.default_rng(11 + bits + k)
    packed, _ = make_weight(rng, 72, k, bits, 32, outliers=20)
    run = QMatMulRunner(packed, rng.standard_normal(72).astype(np.float32), cuda=True)
    x = rng.standard_normal((64, k)).astype(np.float32)
    singles = np.concatenate([run(x[i : i + 1]) for i in range(64)])
    for m in (2, 3, 4, 5, 7, 8, 9, 10, 13, 16, 17, 64):
        np.testing.assert_array_equal(run(x[:m]), singles[:m])
    other = rng.standard_normal((8, k)).astype(np.float32)
    other[3] = x[5]
    np.testing.assert_array_equal(run(other)[3], singles[5])


def test_deterministic_and_close_to_the_cpu_op() -> None:
    rng = np.random.default_rng(21)
    packed, w = make_weight(rng, 1000, 576, 4, 32, outliers=30)
    bias = rng.standard_normal(1000).astype(np.float32)
    gpu, cpu = QMatMulRunner(packed, bias, cuda=True), QMatMulRunner(packed, bias)
    x = rng.standard_normal((16, 576)).astype(np.float32)
    y = gpu(x)
    np.testing.assert_array_equal(gpu(x), y)
    assert_close_to_reference(y, x, w, bias)
    np.testing.assert_allclose(y, cpu(x), rtol=1e-4, atol=1e-4)


def test_accuracy_level_4_keeps_float_activations_on_the_gpu() -> None:
    """The int8-activation mode is a CPU speed trade; the CUDA kernel computes in float32 either way."""
    rng = np.random.default_rng(4)
    packed, w = make_weight(rng, 48, 256, 4, 32)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    y = QMatMulRunner(packed, accuracy_level=4, cuda=True)(x)
    np.testing.assert_array_equal(y, QMatMulRunner(packed, cuda=True)(x))
    assert_close_to_reference(y, x, w, None)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_non_finite_row_stays_in_its_row(bad: float) -> None:
    rng = np.random.default_rng(2)
    packed, _ = make_weight(rng, 16, 64, 4, 32)
    run = QMatMulRunner(packed, cuda=True)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    x[1, 37] = bad
    y = run(x)
    assert not np.isfinite(y[1]).all()
    np.testing.assert_array_equal(y[[0, 2]], np.concatenate([run(x[:1]), run(x[2:])]))


def test_device_cache_keep_moves_a_tree_path_like_numpy() -> None:
    """KVCache.keep on GPU memory (edge_cache_keep): the accepted rows move into place, nothing else changes."""
    from types import SimpleNamespace

    import onnxruntime as ort

    from edge.kv_cache import KVCache

    config = SimpleNamespace(num_kv_heads=3, head_dim=64, num_layers=2)
    cache = KVCache(config, 40, device="cuda")
    rng = np.random.default_rng(8)
    data = [rng.standard_normal(cache.shape).astype(np.float32) for _ in cache.values]
    for value, array in zip(cache.values, data):
        value.update_inplace(array)
    cache.length = 30
    cache.keep(20, [0, 2, 3, 7, 9])
    assert cache.length == 25
    src = [20, 22, 23, 27, 29]
    for value, array in zip(cache.values, data):
        want = array.copy()
        want[:, :, 20:25] = array[:, :, src]
        np.testing.assert_array_equal(value.numpy(), want)
    assert isinstance(cache.values[0], ort.OrtValue)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_float16_activations_are_the_float32_kernel_rounded_once(bits: int) -> None:
    rng = np.random.default_rng(50 + bits)
    packed, w = make_weight(rng, 45, 200, bits, 32, outliers=15)
    bias = rng.standard_normal(45).astype(np.float32)
    half, full = QMatMulRunner(packed, bias, float16=True, cuda=True), QMatMulRunner(packed, bias, cuda=True)
    x = rng.standard_normal((9, 200)).astype(np.float16)
    y = half(x)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, full(x.astype(np.float32)).astype(np.float16))
    np.testing.assert_array_equal(np.concatenate([half(x[i : i + 1]) for i in range(9)]), y)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_swiglu_activation(bits: int) -> None:
    from edge.kernels.pack import interleave_swiglu

    import edge.kernels as ek

    rng = np.random.default_rng(70 + bits)
    n, k = 48, 160
    arrays = [rng.integers(0, 1 << bits, size=(2, n, k)).astype(np.uint8),
              rng.uniform(0.01, 0.1, size=(2, n, k // 32)).astype(np.float32),
              rng.integers(0, 1 << bits, size=(2, n, k // 32)).astype(np.uint8)]
    packed = ek.pack(*[interleave_swiglu(a[0], a[1]) for a in arrays], bits=bits, group_size=32)
    bias = rng.standard_normal(2 * n).astype(np.float32)
    run = QMatMulRunner(packed, bias, swiglu=True, cuda=True)
    x = rng.standard_normal((9, k)).astype(np.float32)
    y = run(x)
    both = QMatMulRunner(packed, bias, cuda=True)(x).reshape(9, n // 4, 2, 4)
    gate, up = both[:, :, 0].reshape(9, n), both[:, :, 1].reshape(9, n)
    np.testing.assert_allclose(y, gate / (np.float32(1) + np.exp(-gate)) * up, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.concatenate([run(x[i : i + 1]) for i in range(9)]), y)
    half = QMatMulRunner(packed, bias, swiglu=True, float16=True, cuda=True)
    x16 = x.astype(np.float16)
    np.testing.assert_array_equal(half(x16), run(x16.astype(np.float32)).astype(np.float16))
