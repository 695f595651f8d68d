import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.export.quant import QuantizationError
from edge.export.quant.rtn import quantize_rtn


def matmulnbits_session(q: dict, accuracy_level: int) -> ort.InferenceSession:
    """A one-node graph with B/scales/zero points as constant initializers (the layout the CPU kernel prepacks)."""
    inits = [
        numpy_helper.from_array(q["B"], "B"),
        numpy_helper.from_array(q["scales"], "scales"),
        numpy_helper.from_array(q["zero_points"], "zp"),
    ]
    node = helper.make_node(
        "MatMulNBits", ["x", "B", "scales", "zp"], ["y"], domain="com.microsoft",
        K=q["K"], N=q["N"], bits=q["bits"], block_size=q["block_size"], accuracy_level=accuracy_level,
    )
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", q["K"]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", q["N"]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def test_rtn_error_is_within_half_a_step():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(24, 100)).astype(np.float32)
    q = quantize_rtn(w, 4, 32)
    step = np.repeat(q.scales, 32, axis=1)[:, :100]
    assert np.all(np.abs(q.dequantize() - w) <= step / 2 + 1e-6)
    assert q.codes.shape == (24, 100) and q.scales.shape == (24, 4) and q.zeros.dtype == np.uint8


def test_more_bits_less_error():
    w = np.random.default_rng(1).normal(size=(16, 64)).astype(np.float32)
    errs = [np.square(quantize_rtn(w, b, 32).dequantize() - w).mean() for b in (2, 3, 4, 8)]
    assert errs == sorted(errs, reverse=True) and errs[-1] < 1e-4


def test_zero_rows_and_bad_input():
    q = quantize_rtn(np.zeros((2, 32), np.float32), 4, 16)
    np.testing.assert_array_equal(q.dequantize(), 0)
    with pytest.raises(QuantizationError):
        quantize_rtn(np.full((2, 32), np.nan, np.float32), 4, 16)
    with pytest.raises(QuantizationError):
        quantize_rtn(np.zeros((2, 32), np.float32), 5, 16)
    with pytest.raises(QuantizationError):
        quantize_rtn(np.zeros(32, np.float32), 4, 16)


@pytest.mark.parametrize("bits,block_size,k", [(4, 32, 96), (4, 16, 200), (2, 64, 128), (8, 32, 64), (3, 16, 64)])
@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_matmulnbits_reproduces_dequantized_matmul(bits, block_size, k, accuracy_level):
    rng = np.random.default_rng(bits + k)
    w = rng.normal(size=(40, k)).astype(np.float32)
    x = rng.normal(size=(3, k)).astype(np.float32)
    q = quantize_rtn(w, bits, block_size)
    y = matmulnbits_session(q.to_matmulnbits(), accuracy_level).run(None, {"x": x})[0]
    ref = x @ q.dequantize().T
    # accuracy_level 4 quantizes x to int8 per block, so it is close rather than exact
    tol = 1e-4 if accuracy_level == 0 else 0.01 * np.abs(ref).max()
    np.testing.assert_allclose(y, ref, atol=tol, rtol=0)
    np.testing.assert_allclose(q.reference_matmul(x), ref, atol=1e-4)


def test_per_channel_is_reblocked_exactly():
    rng = np.random.default_rng(5)
    w = rng.normal(size=(8, 96)).astype(np.float32)
    x = rng.normal(size=(2, 96)).astype(np.float32)
    q = quantize_rtn(w, 4, 10_000)
    assert q.scales.shape == (8, 1)
    packed = q.to_matmulnbits(block_size=32)
    assert packed["scales"].shape == (8, 3)
    y = matmulnbits_session(packed, 0).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x @ q.dequantize().T, atol=1e-4)


def q4_1_lattice(w: np.ndarray) -> np.ndarray:
    """w snapped the way a Q4_1 GGUF stores it: per row and block of 32, min + (max - min) / 15 * q."""
    n, k = w.shape
    b = w.reshape(n, k // 32, 32)
    lo, hi = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
    step = (hi - lo) / 15
    return (lo + step * np.round((b - lo) / step)).reshape(n, k).astype(np.float32)


def test_float_zeros_reproduce_a_block_lattice_weight_exactly():
    rng = np.random.default_rng(7)
    w = q4_1_lattice(rng.normal(size=(48, 96)).astype(np.float32))
    exact = quantize_rtn(w, 4, 32, float_zero=True)
    assert exact.offsets is not None  # fractional zeros: an integer part plus a per-block offset
    np.testing.assert_allclose(exact.dequantize(), w, rtol=0, atol=1e-6 * np.abs(w).max())
    plain = quantize_rtn(w, 4, 32)  # integer zeros shift each block by up to half a step
    assert np.abs(plain.dequantize() - w).max() > 100 * np.abs(exact.dequantize() - w).max()
    # the stock-op form (MatMulNBits with uint8 zeros + block sums @ offsets) computes x @ w^T
    x = rng.normal(size=(3, 96)).astype(np.float32)
    p = exact.to_matmulnbits()
    from edge.export.quant.qlinear import block_sums

    y = matmulnbits_session(p, 0).run(None, {"x": x})[0] + block_sums(x, 32) @ p["group_offsets"].T
    np.testing.assert_allclose(y, x @ w.T, atol=1e-4)


def test_lattice_integer_zeros_reproduce_a_q8_0_table():
    rng = np.random.default_rng(8)
    w = rng.normal(size=(20, 64)).astype(np.float32)
    d = np.abs(w.reshape(20, 2, 32)).max(-1, keepdims=True) / 127
    w = (d * np.round(w.reshape(20, 2, 32) / d)).reshape(20, 64).astype(np.float32)
    q = quantize_rtn(w, 8, 32, lattice=True)
    assert q.offsets is None  # integer zeros only: what GatherBlockQuantized holds
    np.testing.assert_allclose(q.dequantize(), w, rtol=0, atol=1e-6 * np.abs(w).max())
    assert np.abs(quantize_rtn(w, 8, 32).dequantize() - w).max() > 1e-4


def test_float_zeros_on_a_short_last_block():
    w = np.random.default_rng(9).normal(size=(4, 40)).astype(np.float32)  # K=40: the last block has 8 columns
    q = quantize_rtn(w, 4, 32, float_zero=True)
    step = np.repeat(q.scales, 32, axis=1)[:, :40]
    assert np.all(np.abs(q.dequantize() - w) <= step / 2 + 1e-6)
    tail = w[:, 32:]
    np.testing.assert_allclose(q.scales[:, 1], (tail.max(1) - tail.min(1)) / 15, rtol=1e-5)  # padding left out


@pytest.mark.parametrize("options", [{}, {"float_zero": True}, {"lattice": True}])
def test_rows_quantized_in_chunks_equal_the_whole_matrix_at_once(monkeypatch, options):
    """quantize_rtn works through a large matrix CHUNK_ROWS rows at a time (its float temporaries stay small): every
    output is what the whole matrix at once gives, a short last block and a partial last chunk included."""
    import edge.export.quant.rtn as rtn

    w = np.random.default_rng(3).standard_normal((203, 70)).astype(np.float32)
    w[5] = 0.0  # a constant row
    whole = quantize_rtn(w, bits=4, block_size=32, **options)
    monkeypatch.setattr(rtn, "CHUNK_ROWS", 16)
    chunked = quantize_rtn(w, bits=4, block_size=32, **options)
    for field in ("codes", "scales", "zeros", "offsets"):
        a, b = getattr(whole, field), getattr(chunked, field)
        assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b)), field
