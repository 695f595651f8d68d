"""edge.QMatMul's pre-projection (attribute pre_K, inputs 14-17) and the exporter's pass that uses it
(kernels/graph.py: fuse_pre_projections): the matmul before a residual add runs inside the norm-mode node after it.

On the CPU; test_the_cuda_kernel_passes_the_same_tests runs the file again with EDGE_TEST_DEVICE=cuda on a GPU.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edge.kernels as ek
from edge.kernels.graph import fuse_pre_projections, qmatmul_node, qmatmul_tensors
from edge.kernels.library import DOMAIN
from kernels_util import (DEVICE, cuda_available, device_session, ensure_library, export_and_decode, make_weight,
                          run_test_file)

EPS = 1e-5
ROWS = 21  # more than the CUDA kernel normalises inside its matmul pass (16)
K0, K, N = 96, 200, 48  # the projection's input width, the residual's width, the node's columns


def two_nodes(projection: ek.PackedWeight, packed: ek.PackedWeight, accuracy_level: int, gated: int
              ) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """H = X W_pre^T, then Y = RMSNorm(H + S) W^T and R = H + S: the plain node and the norm-mode node after it."""
    first = qmatmul_node("X", "H", projection, "p", accuracy_level=accuracy_level)
    node = qmatmul_node("H", "Y", packed, "w", accuracy_level=accuracy_level, gated=gated)
    inputs = list(node.input) + [""] * (12 - len(node.input)) + ["S", "gamma"]
    second = helper.make_node("QMatMul", inputs, ["Y", "R"], domain=DOMAIN, norm_epsilon=EPS)
    second.attribute.extend(node.attribute)
    return [first, second], {**qmatmul_tensors(projection, "p"), **qmatmul_tensors(packed, "w")}


class Runner:
    """A session of the nodes on DEVICE; weights as initializers or as inputs (weight paging's case)."""

    def __init__(self, nodes: list[onnx.NodeProto], weights: dict[str, np.ndarray], gamma: np.ndarray,
                 weights_as_inputs: bool = False):
        ensure_library()
        constants = {"gamma": gamma, **({} if weights_as_inputs else weights)}
        self.feeds = weights if weights_as_inputs else {}
        inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["M", K0]),
                  helper.make_tensor_value_info("S", TensorProto.FLOAT, ["M", K])]
        inputs += [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                   for n, a in self.feeds.items()]
        outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "R")]
        self.sess = device_session(helper.make_graph(nodes, "projection", inputs, outputs,
                                                     [numpy_helper.from_array(a, n) for n, a in constants.items()]))

    def __call__(self, x: np.ndarray, s: np.ndarray) -> list[np.ndarray]:
        return self.sess.run(["Y", "R"], {"X": x, "S": s, **self.feeds})


def case(seed: int, zeros: str = "mins16", gated: int = 0):
    rng = np.random.default_rng(seed)
    projection, _ = make_weight(rng, K, K0, 4, 32, zeros=zeros)
    packed, _ = make_weight(rng, 2 * N if gated else N, K, 4, 32, zeros="mins16")
    gamma = rng.uniform(0.5, 1.5, K).astype(np.float32)
    x = rng.standard_normal((ROWS, K0)).astype(np.float32)
    s = rng.standard_normal((ROWS, K)).astype(np.float32)
    return projection, packed, gamma, x, s


@pytest.mark.parametrize("weights_as_inputs", [False, True])
@pytest.mark.parametrize("gated", [0, 1])
@pytest.mark.parametrize("accuracy_level", [0, 4])
@pytest.mark.parametrize("zeros", ["mins16", "uint8", "float32"])
def test_the_fused_node_gives_the_two_nodes_bits(zeros: str, accuracy_level: int, gated: int,
                                                  weights_as_inputs: bool) -> None:
    """Y and R of one node with the pre-projection equal, bitwise, those of the projection and the norm-mode node
    run as two: the same kernels in the same order. K0 = 96 and K = 200 leave partial groups and lane blocks."""
    projection, packed, gamma, x, s = case(11 + accuracy_level + gated, zeros, gated)
    nodes, weights = two_nodes(projection, packed, accuracy_level, gated)
    fused = fuse_pre_projections(nodes, {"Y", "R"})
    assert len(fused) == 1
    apart = Runner(nodes, weights, gamma, weights_as_inputs)(x, s)
    together = Runner(fused, weights, gamma, weights_as_inputs)(x, s)
    for got, want in zip(together, apart):
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_the_fused_node_is_batch_invariant(accuracy_level: int) -> None:
    """Each row alone gives bitwise what it gives among 21 (on CUDA: past the one-pass norm's 16 rows)."""
    projection, packed, gamma, x, s = case(3, gated=1)
    nodes, weights = two_nodes(projection, packed, accuracy_level, 1)
    run = Runner(fuse_pre_projections(nodes, {"Y", "R"}), weights, gamma)
    together = run(x, s)
    for i in range(len(x)):
        for got, want in zip(run(x[i:i + 1], s[i:i + 1]), together):
            np.testing.assert_array_equal(got, want[i:i + 1])


def fused_node(**change) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray], np.ndarray]:
    projection, packed, gamma, _, _ = case(5)
    nodes, weights = two_nodes(projection, packed, 0, 0)
    node = fuse_pre_projections(nodes, {"Y", "R"})[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute} | change.pop("attrs", {})
    inputs = change.pop("inputs", list(node.input))
    broken = helper.make_node("QMatMul", inputs, list(node.output), domain=DOMAIN,
                              **{k: v for k, v in attrs.items() if v is not None})
    return [broken], weights, gamma


@pytest.mark.parametrize("change, message", [
    (dict(attrs={"norm_epsilon": None}), "pre_K must be positive and comes with norm_epsilon"),
    (dict(attrs={"pre_K": K0 + 32}), "pre-projection .inputs 14-17.: input 'X' must have last dimension"),
    (dict(inputs="drop 14"), "pre_K needs inputs 14 and 15"),
])
def test_a_broken_pre_projection_is_a_clear_error(change: dict, message: str) -> None:
    if change.get("inputs") == "drop 14":
        node = fused_node()[0][0]
        change["inputs"] = list(node.input)[:14] + ["", *list(node.input)[15:]]
    nodes, weights, gamma = fused_node(**change)
    _, _, _, x, s = case(5)
    with pytest.raises(Exception, match=message):
        Runner(nodes, weights, gamma)(x, s)


def plain(x: str, y: str, **attrs) -> onnx.NodeProto:
    inputs = [x, "codes", "scales", *attrs.pop("extra", [])]
    return helper.make_node("QMatMul", inputs, [y], domain=DOMAIN, **{"K": 64, "N": 64, "bits": 4, "group_size": 32,
                                                                         "accuracy_level": 4, **attrs})


def normed(x: str, y: str) -> onnx.NodeProto:
    inputs = [x, "codes2", "scales2"] + [""] * 9 + ["res", "g"]
    return helper.make_node("QMatMul", inputs, [y, "r"], domain=DOMAIN, K=64, N=32, bits=4, group_size=32,
                            accuracy_level=4, norm_epsilon=EPS)


def test_fuse_pre_projections_moves_the_matmul_into_its_reader() -> None:
    nodes = [plain("a", "h", extra=["", "", "", "", "", "mins"]), normed("h", "y")]
    fused = fuse_pre_projections(nodes, {"y"})
    assert len(fused) == 1
    node = fused[0]
    assert list(node.input)[0] == "a" and list(node.input)[12:] == ["res", "g", "codes", "scales", "", "mins"]
    assert list(node.output) == ["y", "r"]
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute}["pre_K"] == 64


@pytest.mark.parametrize("why", ["bias", "other bits", "two readers", "graph output", "reader without a norm",
                                 "already fused"])
def test_fuse_pre_projections_leaves_what_it_cannot_fuse(why: str) -> None:
    first = plain("a", "h", extra=["", "bias"]) if why == "bias" else plain("a", "h", bits=3 if why == "other bits"
                                                                             else 4)
    second = normed("h", "y")
    if why == "reader without a norm":
        second = plain("h", "y")
    if why == "already fused":
        second.attribute.extend([helper.make_attribute("pre_K", 64)])
    nodes = [first, second] + ([helper.make_node("Relu", ["h"], ["z"])] if why == "two readers" else [])
    outputs = {"y", "h"} if why == "graph output" else {"y"}
    assert fuse_pre_projections(nodes, outputs) == nodes


def test_the_exported_decoder_runs_its_projections_inside_the_next_matmul(tmp_path) -> None:
    """A tiny Llama on edge's kernels: o_proj and all but the last down_proj fused, and the logits of a prompt and of
    decode steps bitwise those of the graph without the pass."""
    pytest.importorskip("transformers")
    from tiny_models import tiny_llama

    _, imported = tiny_llama(seed=7, num_hidden_layers=3)
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 96, 16)]
    logits, counts = [], []
    for fuse in (True, False):
        graph, rows = export_and_decode(tmp_path / str(fuse), imported, ids, accuracy_level=4,
                                        fuse_pre_projections=fuse)
        counts.append(sum(n.op_type == "QMatMul" for n in graph.node))
        logits.append(rows)
    assert counts == [3 * 4 + 1 - 5, 3 * 4 + 1]  # qkv, o, gate_up, down per layer and the head; 3 o + 2 down fused
    np.testing.assert_array_equal(logits[0], logits[1])


@pytest.mark.skipif(DEVICE != "cpu" or not cuda_available(), reason="needs onnxruntime-gpu, a GPU and the CUDA build")
def test_the_cuda_kernel_passes_the_same_tests() -> None:
    run_test_file(__file__, EDGE_TEST_DEVICE="cuda")
