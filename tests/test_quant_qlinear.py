"""The stock-op form of a quantized layer (MatMulNBits + group-offset term + sparse outlier add) run in onnxruntime
must equal x @ dequantize().T."""

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.export.quant import QuantizationError
from edge.export.quant.decoupleq import DecoupleQConfig, quantize_decoupleq
from edge.export.quant.qlinear import QuantizedLinear, block_sums
from edge.export.quant.spqr import SpqrConfig, quantize_spqr
from quant_util import correlated_hessian


def stock_op_session(form: dict, m: int) -> ort.InferenceSession:
    """y = MatMulNBits(x) [+ blocksum(x) @ offsets^T] [+ scatter-add of x[:, col] * value into y[:, row]]."""
    k, n, bs = form["K"], form["N"], form["block_size"]
    inits = [numpy_helper.from_array(form["B"], "B"), numpy_helper.from_array(form["scales"], "scales"),
             numpy_helper.from_array(form["zero_points"], "zp")]
    nodes = [helper.make_node("MatMulNBits", ["x", "B", "scales", "zp"], ["y0"], domain="com.microsoft",
                              K=k, N=n, bits=form["bits"], block_size=bs, accuracy_level=0)]
    last = "y0"
    if form["group_offsets"] is not None:
        kb = form["scales"].shape[1]
        inits += [numpy_helper.from_array(np.array([0, 0, 0, kb * bs - k], np.int64), "pad"),
                  numpy_helper.from_array(np.array([m, kb, bs], np.int64), "shape3"),
                  numpy_helper.from_array(np.array([-1], np.int64), "last"),
                  numpy_helper.from_array(np.ascontiguousarray(form["group_offsets"].T), "offT")]
        nodes += [helper.make_node("Pad", ["x", "pad"], ["xp"]),
                  helper.make_node("Reshape", ["xp", "shape3"], ["x3"]),
                  helper.make_node("ReduceSum", ["x3", "last"], ["xs"], keepdims=0),
                  helper.make_node("MatMul", ["xs", "offT"], ["corr"]),
                  helper.make_node("Add", [last, "corr"], ["y1"])]
        last = "y1"
    if form["outliers"] is not None:
        sp = form["outliers"]
        inits += [numpy_helper.from_array(sp.col.astype(np.int64), "ocol"),
                  numpy_helper.from_array(sp.values.astype(np.float32), "oval"),
                  numpy_helper.from_array(np.tile(sp.rows().astype(np.int64), (m, 1)), "orow")]
        nodes += [helper.make_node("Gather", ["x", "ocol"], ["xg"], axis=1),
                  helper.make_node("Mul", ["xg", "oval"], ["contrib"]),
                  helper.make_node("ScatterElements", [last, "orow", "contrib"], ["y"], axis=1, reduction="add")]
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def check_layer(q: QuantizedLinear, k: int, block_size: int | None = None) -> None:
    x = np.random.default_rng(9).normal(size=(4, k)).astype(np.float32)
    ref = x @ q.dequantize().T
    np.testing.assert_allclose(q.reference_matmul(x), ref, atol=1e-4, rtol=1e-4)
    y = stock_op_session(q.to_matmulnbits(block_size), 4).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, ref, atol=1e-4 * np.abs(ref).max(), rtol=0)


@pytest.mark.parametrize("bits", [3, 4])
@pytest.mark.parametrize("float_zero", [False, True])
def test_spqr_layer_runs_exactly_in_stock_ops(bits, float_zero):
    rng = np.random.default_rng(bits)
    w = (rng.normal(size=(48, 112)) * 0.05).astype(np.float32)
    w.flat[rng.choice(w.size, 20, replace=False)] += 1.0
    q = quantize_spqr(w, correlated_hessian(112, 2, samples=1024), SpqrConfig(bits=bits, float_zero=float_zero))
    assert q.outliers is not None and q.outliers.nnz >= 15
    assert (q.offsets is not None) == float_zero
    check_layer(q, 112)


def test_from_float_zeros_is_exact():
    rng = np.random.default_rng(4)
    codes = rng.integers(0, 4, size=(6, 64)).astype(np.float64)
    scales, zeros = rng.uniform(0.1, 1, size=(6, 2)), rng.uniform(-1, 4, size=(6, 2))
    q = QuantizedLinear.from_float_zeros(codes, scales, zeros, 2, 32)
    ref = np.repeat(scales, 32, axis=1) * (codes - np.repeat(zeros, 32, axis=1))
    np.testing.assert_allclose(q.dequantize(), ref, atol=1e-6)
    assert q.zeros.max() <= 3
    assert QuantizedLinear.from_float_zeros(codes, scales, np.round(zeros).clip(0, 3), 2, 32).offsets is None


@pytest.mark.parametrize("bits,group_size,block_size", [(2, 64, None), (2, 10_000, 32), (3, 32, 16), (4, 128, 64)])
def test_decoupleq_layer_with_float_zeros_runs_exactly(bits, group_size, block_size):
    w = (np.random.default_rng(7).normal(size=(40, 200)) * 0.05).astype(np.float32)
    h = correlated_hessian(200, 3, samples=1024)
    q = quantize_decoupleq(w, h, DecoupleQConfig(bits=bits, group_size=group_size, rounds=2))
    assert q.offsets is not None
    check_layer(q, 200, block_size)


def test_block_sums_pads_the_last_block():
    x = np.arange(10, dtype=np.float32)[None]
    np.testing.assert_array_equal(block_sums(x, 4), [[6, 22, 17]])


def test_reblocking_must_divide_the_group():
    q = QuantizedLinear(np.zeros((2, 64), np.uint8), np.ones((2, 2), np.float32), np.zeros((2, 2), np.uint8), 4, 32)
    with pytest.raises(QuantizationError, match="re-block"):
        q.to_matmulnbits(64)
    assert q.to_matmulnbits(16)["scales"].shape == (2, 4)
    with pytest.raises(QuantizationError, match="shape"):
        QuantizedLinear(np.zeros((2, 64), np.uint8), np.ones((2, 3), np.float32), np.zeros((2, 2), np.uint8), 4, 32)


def test_concat_rows_dequantizes_to_the_stacked_weights():
    from edge.export.quant.outliers import SparseOutliers
    from edge.export.quant.qlinear import concat_rows
    from edge.export.quant.rtn import quantize_rtn

    rng = np.random.default_rng(0)
    parts = [quantize_rtn(rng.normal(size=(n, 64)).astype(np.float32), 4, 32) for n in (8, 4, 4)]
    mask = rng.random((4, 64)) < 0.1
    parts[1] = dataclasses.replace(parts[1], offsets=rng.normal(0, 0.01, parts[1].scales.shape).astype(np.float32),
                                   outliers=SparseOutliers.from_dense(mask, rng.normal(size=(4, 64))))
    stacked = concat_rows(parts)
    np.testing.assert_array_equal(stacked.dequantize(), np.concatenate([p.dequantize() for p in parts]))


def test_take_rows_moves_every_term_with_its_row():
    """Codes, statistics, offsets and outliers follow the permutation (edge.QMatMul's gated order needs it)."""
    from edge.export.quant.outliers import SparseOutliers
    from edge.export.quant.rtn import quantize_rtn
    from edge.kernels.pack import gated_row_order

    rng = np.random.default_rng(1)
    q = quantize_rtn(rng.normal(size=(16, 64)).astype(np.float32), 4, 32)
    mask = rng.random((16, 64)) < 0.1
    q = dataclasses.replace(q, offsets=rng.normal(0, 0.01, q.scales.shape).astype(np.float32),
                            outliers=SparseOutliers.from_dense(mask, rng.normal(size=(16, 64))))
    order = gated_row_order(8)
    moved = q.take_rows(order)
    np.testing.assert_array_equal(moved.dequantize(), q.dequantize()[order])
    assert moved.outliers.nnz == q.outliers.nnz
    with pytest.raises(QuantizationError, match="permutation"):
        q.take_rows(np.zeros(16, dtype=np.int64))
