"""edge.QMatMul's norm mode (kernels/cpu/rms_norm.h) and the exporter's pass that uses it (kernels/graph.py:
fuse_norms): Y = RMSNorm(X + skip) W^T and X + skip from one node.

On the CPU; test_the_cuda_kernel_passes_the_same_tests runs the file again with EDGE_TEST_DEVICE=cuda on a GPU.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edge.kernels as ek
from edge.kernels.graph import fuse_norms, qmatmul_node, qmatmul_tensors
from edge.kernels.library import DOMAIN
from kernels_util import (DEVICE, QMatMulRunner, cuda_available, device_session, ensure_library, export_and_decode,
                          make_weight, run_test_file)

EPS = 1e-5
cpu_only = pytest.mark.skipif(DEVICE != "cpu", reason="bitwise against the CPU kernels' documented sum order")


def rms_norm(h: np.ndarray, w: np.ndarray, eps: float = EPS) -> np.ndarray:
    """The CPU kernel's arithmetic in numpy, float32 throughout: squares summed over 16 lanes in order, lanes folded
    8, 4, 2, 1 apart, then (h * r) * w."""
    out = np.empty_like(h)
    for m, row in enumerate(h):
        squares = row * row
        lanes = np.zeros(16, np.float32)
        for i in range(0, len(row), 16):
            chunk = squares[i:i + 16]
            lanes[:len(chunk)] += chunk
        width = 8
        while width:
            lanes[:width] += lanes[width:2 * width]
            width //= 2
        r = np.float32(1) / np.sqrt(lanes[0] / np.float32(len(row)) + np.float32(eps))
        out[m] = (row * r) * w
    return out


class NormRunner:
    """A one-node model: QMatMul in norm mode (with or without skip), run on DEVICE."""

    def __init__(self, packed: ek.PackedWeight, weight: np.ndarray, skip: bool, accuracy_level: int = 0,
                 sum_output: bool = True, epsilon: float | None = EPS, weight_input: bool = True):
        """epsilon None (no norm_epsilon attribute) and weight_input False (no norm_weight input): broken nodes."""
        ensure_library()
        node = qmatmul_node("X", "Y", packed, "w", accuracy_level=accuracy_level)
        norm = ["S" if skip else "", "gamma" if weight_input else ""]
        inputs = list(node.input) + [""] * (12 - len(node.input)) + norm
        outputs = ["Y", "R"] if skip and sum_output else ["Y"]
        attrs = {} if epsilon is None else {"norm_epsilon": epsilon}
        fused = helper.make_node("QMatMul", inputs, outputs, domain=DOMAIN, **attrs)
        fused.attribute.extend(node.attribute)
        x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["M", packed.k])
        graph_inputs = [x] + ([helper.make_tensor_value_info("S", TensorProto.FLOAT, ["M", packed.k])] if skip else [])
        graph_outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
        tensors = {**qmatmul_tensors(packed, "w"), "gamma": weight}
        self.sess = device_session(helper.make_graph([fused], "norm", graph_inputs, graph_outputs,
                                                     [numpy_helper.from_array(a, n) for n, a in tensors.items()]))
        self.outputs = outputs

    def __call__(self, x: np.ndarray, s: np.ndarray | None = None) -> list[np.ndarray]:
        feeds = {"X": x} if s is None else {"X": x, "S": s}
        return self.sess.run(self.outputs, feeds)


# More rows than the CUDA kernel normalises inside its matmul pass (16): there a kernel of its own does it first.
ROWS = 21


def case(rng: np.random.Generator, k: int = 200, n: int = 48, bits: int = 4, zeros: str = "mins16", outliers: int = 0):
    packed, w = make_weight(rng, n, k, bits, 32, zeros=zeros, outliers=outliers)
    gamma = rng.uniform(0.5, 1.5, k).astype(np.float32)
    x = rng.standard_normal((ROWS, k)).astype(np.float32)
    skip = rng.standard_normal((ROWS, k)).astype(np.float32)
    return packed, w, gamma, x, skip


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("accuracy_level", [0, 4])
@pytest.mark.parametrize("k", [200, 203])
def test_norm_then_matmul_is_the_plain_op_on_the_normalised_rows(skip: bool, accuracy_level: int, k: int) -> None:
    """Y equals the plain op run on RMSNorm(X + skip) (bitwise on the CPU, whose sum order rms_norm reproduces), and
    output 1 is X + skip bitwise. K = 200 leaves a partial lane block and a partial group, 203 also a partial 8
    (the AVX2 norm's vectors)."""
    rng = np.random.default_rng(5 + skip + 2 * accuracy_level + k)
    packed, _, gamma, x, s = case(rng, k=k)
    run = NormRunner(packed, gamma, skip, accuracy_level)
    plain = QMatMulRunner(packed, accuracy_level=accuracy_level)
    out = run(x, s if skip else None)
    h = x + s if skip else x
    if skip:
        np.testing.assert_array_equal(out[1], h)
    want = plain(rms_norm(h, gamma))
    if DEVICE == "cpu":
        np.testing.assert_array_equal(out[0], want)
    elif accuracy_level == 0:  # the GPU sums the squares in another order: the norm's rounding differs
        np.testing.assert_allclose(out[0], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# The weight forms the norm meets: the default's, and 3-bit with outliers (read at the normalised x's columns) with
# plain or SpQR's two-level statistics.
FORMS = [(4, "mins16", 0), (3, "uint8", 40), (3, "two-level", 40)]


@pytest.mark.parametrize("bits, zeros, outliers", FORMS)
def test_norm_matches_float64(bits: int, zeros: str, outliers: int) -> None:
    rng = np.random.default_rng(8)
    packed, w, gamma, x, s = case(rng, bits=bits, zeros=zeros, outliers=outliers)
    h = x.astype(np.float64) + s
    normed = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + EPS) * gamma
    y = NormRunner(packed, gamma, True)(x, s)[0]
    ref = ek.reference(normed, w)
    bound = np.abs(normed) @ np.abs(w).T
    assert (np.abs(y - ref) / bound).max() < 1e-5


@pytest.mark.parametrize("accuracy_level", [0, 4])
@pytest.mark.parametrize("bits, zeros, outliers", FORMS)
def test_norm_is_batch_invariant(accuracy_level: int, bits: int, zeros: str, outliers: int) -> None:
    """Each row alone gives bitwise what it gives among 9 or among 21 (the norm is per row, like the matmul; on CUDA
    the first two are the one-pass kernel, the last a norm kernel ahead of the plain one)."""
    rng = np.random.default_rng(13)
    packed, _, gamma, x, s = case(rng, bits=bits, zeros=zeros, outliers=outliers)
    run = NormRunner(packed, gamma, True, accuracy_level)
    together = run(x, s)
    for got, want in zip(run(x[:9], s[:9]), together):
        np.testing.assert_array_equal(got, want[:9])
    for i in range(len(x)):
        alone = run(x[i:i + 1], s[i:i + 1])
        np.testing.assert_array_equal(alone[0], together[0][i:i + 1])
        np.testing.assert_array_equal(alone[1], together[1][i:i + 1])


def test_skip_without_its_output_is_a_clear_error() -> None:
    packed, _, gamma, x, s = case(np.random.default_rng(2))
    run = NormRunner(packed, gamma, True, sum_output=False)
    with pytest.raises(Exception, match="needs output 1"):
        run(x, s)


@pytest.mark.parametrize("drop, message", [("gamma", "needs input 'norm_weight'"),
                                           ("epsilon", "need the attribute norm_epsilon")])
def test_incomplete_norm_is_a_clear_error(drop: str, message: str) -> None:
    packed, _, gamma, x, _ = case(np.random.default_rng(3))
    broken = {"epsilon": None} if drop == "epsilon" else {"weight_input": False}
    with pytest.raises(Exception, match=message):
        NormRunner(packed, gamma, False, **broken)(x)


def norm_node(op: str, inputs: list[str], outputs: list[str]) -> onnx.NodeProto:
    domain = "com.microsoft" if op.startswith("Skip") else ""
    return helper.make_node(op, inputs, outputs, domain=domain, epsilon=EPS)


def qmatmul(x: str, y: str) -> onnx.NodeProto:
    return helper.make_node("QMatMul", [x, "codes", "scales"], [y], domain=DOMAIN, K=64, N=64, bits=4, group_size=32)


def test_fuse_norms_moves_a_norm_into_its_only_reader() -> None:
    nodes = [norm_node("SimplifiedLayerNormalization", ["x", "g0"], ["n0"]),
             qmatmul("n0", "a"),
             norm_node("SkipSimplifiedLayerNormalization", ["a", "x", "g1"], ["n1", "", "", "r1"]),
             qmatmul("n1", "b"),
             helper.make_node("Add", ["b", "r1"], ["out"])]
    fused = fuse_norms(nodes, {"out"})
    assert [n.op_type for n in fused] == ["QMatMul", "QMatMul", "Add"]
    first, second = fused[0], fused[1]
    assert list(first.input) == ["x", "codes", "scales"] + [""] * 9 + ["", "g0"] and list(first.output) == ["a"]
    assert list(second.input)[12:] == ["x", "g1"] and list(second.input)[0] == "a"
    assert list(second.output) == ["b", "r1"]  # the residual now comes from the matmul's node
    assert {a.name: helper.get_attribute_value(a) for a in second.attribute}["norm_epsilon"] == pytest.approx(EPS)


@pytest.mark.parametrize("why", ["two readers", "graph output", "not the matmul's x", "mean read"])
def test_fuse_norms_leaves_a_norm_others_read(why: str) -> None:
    outputs = ["n0", "", "", "r0"] if why != "mean read" else ["n0", "mean", "", "r0"]
    nodes = [norm_node("SkipSimplifiedLayerNormalization", ["a", "x", "g"], outputs)]
    if why == "not the matmul's x":
        nodes.append(helper.make_node("QMatMul", ["y", "n0", "scales"], ["b"], domain=DOMAIN))
    else:
        nodes.append(qmatmul("n0", "b"))
    if why == "two readers":
        nodes.append(helper.make_node("Relu", ["n0"], ["c"]))
    if why == "mean read":
        nodes.append(helper.make_node("Relu", ["mean"], ["c"]))
    graph_outputs = {"b", "n0"} if why == "graph output" else {"b"}
    assert [n.op_type for n in fuse_norms(nodes, graph_outputs)] == [n.op_type for n in nodes]


def test_fused_export_computes_what_the_unfused_one_does(tmp_path) -> None:
    """A tiny Llama on edge's kernels: every norm but the last (which the head reads through a Gather) inside a
    QMatMul, and the logits of a prompt and of decode steps those of the unfused graph within float rounding."""
    pytest.importorskip("transformers")
    from tiny_models import max_rel_error, tiny_llama

    _, imported = tiny_llama(seed=7, num_hidden_layers=3)
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 96, 16)]
    logits, counts = [], []
    for fuse in (True, False):
        graph, rows = export_and_decode(tmp_path / str(fuse), imported, ids, accuracy_level=0, fuse_norms=fuse)
        counts.append(sum(n.op_type.endswith("SimplifiedLayerNormalization") for n in graph.node))
        logits.append(rows)
    assert counts == [1, 7]
    assert max_rel_error(logits[0], logits[1]) < 2e-6


@pytest.mark.skipif("EDGE_KERNELS_ISA" in os.environ or DEVICE != "cpu", reason="a kernel was chosen, or on CUDA")
def test_the_portable_norm_passes_the_same_tests() -> None:
    """The portable norm (CPUs without AVX2) against the same numpy order; this process ran the AVX2 one."""
    run_test_file(__file__, EDGE_KERNELS_ISA="portable")


@pytest.mark.skipif(DEVICE != "cpu" or not cuda_available(), reason="needs onnxruntime-gpu, a GPU and the CUDA build")
def test_the_cuda_kernel_passes_the_same_tests() -> None:
    run_test_file(__file__, EDGE_TEST_DEVICE="cuda")
