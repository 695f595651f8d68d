"""ONNX nodes and single-op models for edge.QMatMul and edge.Attention (used by the exporter, tests and benchmarks)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edge.kernels.library import DOMAIN, OP_TYPE
from edge.kernels.pack import PackedWeight

IR_VERSION = 10  # onnxruntime 1.31 rejects the IR 14 that onnx 1.23 writes by default
OPSET = 21
INPUT_SUFFIXES = ("codes", "scales", "zeros", "bias", "outlier_values", "outlier_cols", "outlier_row_ptr", "mins",
                  "scale_stats", "zero_stats", "stat_rows")


def qmatmul_node(x: str, y: str, packed: PackedWeight, prefix: str, has_bias: bool = False,
                 accuracy_level: int = 0, gated: int = 0) -> onnx.NodeProto:
    """An edge.QMatMul node reading tensors named f"{prefix}.{suffix}" (absent optional inputs become "").

    accuracy_level 4 lets the 4-bit integer kernels round x to int8 per row and group (a third of their work, like
    MatMulNBits' level 4, still batch-invariant); 0 keeps x to 23 bits (error under 1e-5). gated (1: silu, 2:
    gelu_tanh): the weight's rows come from pack.interleave_gated and the node outputs act(gate) * up (N / 2)."""
    present = [a is not None for a in packed.inputs()]
    present[3] = has_bias
    names = [f"{prefix}.{s}" if p else "" for s, p in zip(INPUT_SUFFIXES, present)]
    while names and names[-1] == "":
        names.pop()
    attributes = packed.attributes()
    if accuracy_level:
        attributes["accuracy_level"] = accuracy_level
    if gated:
        attributes["activation"] = gated
    return helper.make_node(OP_TYPE, [x, *names], [y], domain=DOMAIN, name=f"{prefix}.qmatmul", **attributes)


def qmatmul_tensors(packed: PackedWeight, prefix: str, bias: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The node's weight tensors by name (to store as initializers or feed as inputs)."""
    arrays = packed.inputs()
    arrays[3] = None if bias is None else np.asarray(bias, dtype=np.float32)
    return {f"{prefix}.{s}": a for s, a in zip(INPUT_SUFFIXES, arrays) if a is not None}


def _value_info(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape))


def qmatmul_model(packed: PackedWeight, x_shape: list[int | str], bias: np.ndarray | None = None,
                  weights_as_inputs: bool = False, accuracy_level: int = 0, float16: bool = False,
                  gated: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model Y = QMatMul(X), X and Y float32 (or float16); returns it and the weight feeds (empty when
    weights are initializers)."""
    tensors = qmatmul_tensors(packed, "w", bias)
    node = qmatmul_node("X", "Y", packed, "w", has_bias=bias is not None, accuracy_level=accuracy_level,
                        gated=gated)
    dtype = TensorProto.FLOAT16 if float16 else TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("X", dtype, x_shape)]
    out_shape = [*x_shape[:-1], packed.n // 2 if gated else packed.n]
    initializers = []
    if weights_as_inputs:
        inputs += [_value_info(name, a) for name, a in tensors.items()]
    else:
        initializers = [numpy_helper.from_array(a, name) for name, a in tensors.items()]
    graph = helper.make_graph([node], "edge_qmatmul", inputs,
                              [helper.make_tensor_value_info("Y", dtype, out_shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)],
                              ir_version=IR_VERSION)
    return model, (tensors if weights_as_inputs else {})


ATTENTION_OP = "Attention"
ATTENTION_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
                    "cos_cache", "sin_cache", "position_ids", "attention_bias")


def attention_model(num_heads: int, kv_heads: int, head_dim: int, packed: bool = True, bias: bool = True,
                    stock: bool = False, scale: float = 0.0, window: int = 0) -> onnx.ModelProto:
    """A one-node model of edge.Attention (stock=True: ORT's GroupQueryAttention, same wiring) with every input fed,
    for tests and the benchmark. Past and present share the names' shapes, so IOBinding can alias them."""
    f32, i32, i64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
    width = (num_heads + 2 * kv_heads) * head_dim if packed else num_heads * head_dim
    cache = [1, kv_heads, "L", head_dim]
    shapes = {"query": (f32, [1, "S", width]), "key": (f32, [1, "S", kv_heads * head_dim]),
              "value": (f32, [1, "S", kv_heads * head_dim]), "past_key": (f32, cache), "past_value": (f32, cache),
              "seqlens_k": (i32, [1]), "total_sequence_length": (i32, []), "cos_cache": (f32, ["R", head_dim // 2]),
              "sin_cache": (f32, ["R", head_dim // 2]), "position_ids": (i64, [1, "S"]),
              "attention_bias": (f32, [1, 1, "S", "T"])}
    absent = ({"key", "value"} if packed else set()) | (set() if bias else {"attention_bias"})
    names = ["" if n in absent else n for n in ATTENTION_INPUTS]
    while names[-1] == "":
        names.pop()
    attrs = dict(num_heads=num_heads, kv_num_heads=kv_heads, do_rotary=1, scale=scale or head_dim ** -0.5)
    if window:
        attrs["local_window_size"] = window
    node = (helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                             domain="com.microsoft", **attrs) if stock else
            helper.make_node(ATTENTION_OP, names, ["output", "present_key", "present_value"], domain=DOMAIN, **attrs))
    inputs = [helper.make_tensor_value_info(n, *shapes[n]) for n in names if n]
    outputs = [helper.make_tensor_value_info("output", f32, [1, "S", num_heads * head_dim]),
               helper.make_tensor_value_info("present_key", f32, cache),
               helper.make_tensor_value_info("present_value", f32, cache)]
    graph = helper.make_graph([node], "edge_attention", inputs, outputs)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)
