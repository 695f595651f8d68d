"""What only the CUDA kernels need checking for, beyond tests/test_kernels.py (which re-runs itself on the CUDA EP):
odd and long K (the lanes' split of K), every launch shape of the row blocks, agreement with the CPU op, the
device KV cache's compaction, and the Decoder on the CUDA EP against the CPU's. Skipped without onnxruntime-gpu and
a GPU (CI); benchmarks/gpu/run.sh runs them. Each session refuses a CPU fallback, so a pass means the CUDA kernel
computed every output.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels_util import QMatMulRunner, assert_close_to_reference, cuda_available, make_weight

pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs onnxruntime-gpu, a GPU and the CUDA kernel build")


@pytest.mark.parametrize("k", [45, 130, 1536, 4100])
def test_odd_and_long_k(k: int) -> None:
    """K not a multiple of 4 (scalar x loads, partial last unit) and K long enough for every warp of a block."""
    rng = np.random.default_rng(k)
    packed, w = make_weight(rng, 70, k, 4, 32)
    run = QMatMulRunner(packed, cuda=True)
    for m in (1, 8, 11):
        x = rng.standard_normal((m, k)).astype(np.float32)
        assert_close_to_reference(run(x), x, w, None, rtol=2e-5 if k > 2000 else 1e-5)


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("k", [192, 1536])
def test_batch_invariance(bits: int, k: int) -> None:
    """Row i of an M-row call is bitwise the M=1 result: every launch shape (4-row blocks, 1/2/3-row tails)."""
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
    gpu, cpu = QMatMulRunner(packed, bias, cuda=True), QMatMulRunner(packed, bias, cuda=False)
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


def test_decoder_on_the_gpu_follows_the_cpu_step_by_step(tmp_path) -> None:
    """The runtime on the CUDA EP (IOBinding, the device KV cache, a binding per step shape): steps whose size,
    logits rows, positions and tree bias change from one to the next, shapes revisited, give the CPU decoder's
    logits. Session 24 found the GPU's greedy tokens wrong from the first: inputs written in place after binding,
    which onnxruntime had copied to the GPU when they were bound."""
    pytest.importorskip("transformers")
    from tiny_models import tiny_llama

    from edge.export.pipeline import export_model
    from edge.model import MASKED, Decoder
    from edge.package import load_package

    _, imported = tiny_llama(seed=6)
    export_model("tiny", tmp_path / "pkg", quant="int4", model=imported, tree_attention=True, kernels="edge",
                 head="rtn")
    package = load_package(tmp_path / "pkg")
    gpu, cpu = Decoder(package, context_length=64, device="cuda"), Decoder(package, context_length=64, threads=1)
    rng = np.random.default_rng(6)
    past = 0
    for size, rows in [(4, None), (1, None), (1, None), (3, [0, 2]), (1, None), (2, [0, 1]), (1, None), (5, [4]),
                       (3, [0, 2]), (2, [0, 1]), (1, None), (18, None), (2, [0, 1]), (1, None)]:
        new = [int(t) for t in rng.integers(0, 96, size)]
        explicit = size == 2  # a causal step given as explicit positions and bias
        bias = np.where(np.arange(past + size) <= past + np.arange(size)[:, None], 0.0, MASKED)[None, None]
        kwargs = dict(positions=list(range(past, past + size)), attention_bias=bias.astype(np.float32)) \
            if explicit else {}
        want = cpu.step(new, logits_rows=rows, **kwargs).copy()
        got = gpu.step(new, logits_rows=rows, **kwargs).copy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * np.abs(want).max(), err_msg=f"past {past}")
        past += size
