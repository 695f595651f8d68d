"""ONNX nodes and single-op models for edge.QMatMul and edge.Attention (used by the exporter, tests and benchmarks)."""

from __future__ import annotations

from collections import defaultdict

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


# onnxruntime's RMSNorm ops and whether they take a skip (the residual stream: normed(x + skip), output 3 x + skip)
NORM_OPS = {"SimplifiedLayerNormalization": False, "SkipSimplifiedLayerNormalization": True}
NORM_INPUTS = 12  # edge.QMatMul's inputs before its norm's skip and norm_weight


def fuse_norms(nodes: list[onnx.NodeProto], graph_outputs: set[str]) -> list[onnx.NodeProto]:
    """The node list with each RMSNorm whose normed rows only an edge.QMatMul reads moved into that QMatMul (its
    norm_epsilon mode: inputs skip and norm_weight, output 1 the residual x + skip).

    Why: nearly every matmul of a decoder layer reads a norm of the residual stream, and each node costs onnxruntime's
    dispatch: on the CPU SmolLM2's steps ran 2.5-5.5% faster without its 60 norm nodes, on an H200 decoding 4.4%
    (kernels/README.md).
    The fused node takes the norm's place in the list: its other inputs are weights, and what reads the residual
    comes after the norm.
    Norms whose mean or inverse deviation is read, with a bias, or over another axis stay as they are."""
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for node in nodes:
        for index, name in enumerate(node.input):
            if name:
                readers[name].append((node, index))
    replace: dict[int, onnx.NodeProto | None] = {}  # id(norm) -> the fused QMatMul; id(its QMatMul) -> None
    for norm in nodes:
        user = _fusable_user(norm, readers, graph_outputs)
        if user is not None:
            replace[id(norm)] = _fused(norm, user)
            replace[id(user)] = None
    return [replace.get(id(n), n) for n in nodes if replace.get(id(n), n) is not None]


def _fusable_user(norm: onnx.NodeProto, readers, graph_outputs: set[str]) -> onnx.NodeProto | None:
    skip = NORM_OPS.get(norm.op_type)
    if skip is None or norm.domain not in ("", "com.microsoft"):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in norm.attribute}
    if attrs.get("axis", -1) != -1 or (skip and len(norm.input) > 3 and norm.input[3]):
        return None
    if any(name and (readers[name] or name in graph_outputs) for name in norm.output[1:3]):
        return None
    users = readers[norm.output[0]]
    if norm.output[0] in graph_outputs or len(users) != 1:
        return None
    user, index = users[0]
    if index != 0 or user.op_type != OP_TYPE or user.domain != DOMAIN or len(user.input) > NORM_INPUTS:
        return None
    return user


def _fused(norm: onnx.NodeProto, user: onnx.NodeProto) -> onnx.NodeProto:
    skip = NORM_OPS[norm.op_type]
    inputs = [norm.input[0], *user.input[1:]] + [""] * (NORM_INPUTS - len(user.input))
    inputs += [norm.input[1], norm.input[2]] if skip else ["", norm.input[1]]
    outputs = [user.output[0]]
    if skip:  # the kernel writes x + skip whenever it has a skip: an unread residual still gets a name
        outputs.append(norm.output[3] if len(norm.output) > 3 and norm.output[3] else f"{user.name}/residual")
    epsilon = next((helper.get_attribute_value(a) for a in norm.attribute if a.name == "epsilon"), 1e-5)
    node = helper.make_node(OP_TYPE, inputs, outputs, name=user.name, domain=DOMAIN, norm_epsilon=float(epsilon))
    node.attribute.extend(user.attribute)
    return node


PRE_INPUTS = (1, 2, 3, 8)  # a plain QMatMul's codes, scales, zeros, mins: a pre-projection's inputs 14-17
PRE_ATTRIBUTES = ("bits", "group_size", "accuracy_level")  # what the projection shares with the node it enters
QMATMUL_INPUTS = 14  # edge.QMatMul's inputs before the pre-projection's


def fuse_pre_projections(nodes: list[onnx.NodeProto], graph_outputs: set[str]) -> list[onnx.NodeProto]:
    """The node list with each plain edge.QMatMul whose output only a norm-mode edge.QMatMul reads as X moved into
    that node as its pre-projection (attribute pre_K, inputs 14-17): X W_pre^T, then the norm of it plus the
    residual, then the node's own matmul.

    Why: in a decoder layer the matmuls before the residual adds (o_proj, down_proj) feed the norm of the matmul after
    them, and each node costs onnxruntime's dispatch and edge's binding: SmolLM2's 59 fewer nodes made its steps
    1-2.5% faster on a Zen 4 (~1.6 us a node; nothing measurable on an H200, whose steps wait on kernel launches).
    The fused node's results are bitwise the two nodes': the same kernels run in the same order. Run after
    fuse_norms. Projections with a bias, outliers, two-level statistics or other bits than the node's stay nodes of
    their own."""
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in nodes:
        for name in node.input:
            if name:
                readers[name].append(node)
    makers = {out: node for node in nodes for out in node.output if out}
    replace: dict[int, onnx.NodeProto | None] = {}  # id(user) -> the fused node; id(projection) -> None
    for user in nodes:
        projection = makers.get(user.input[0]) if user.input else None
        if projection is not None and _fusable_projection(projection, user, readers, graph_outputs):
            replace[id(user)] = _with_projection(projection, user)
            replace[id(projection)] = None
    return [replace.get(id(n), n) for n in nodes if replace.get(id(n), n) is not None]


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _fusable_projection(projection: onnx.NodeProto, user: onnx.NodeProto, readers, graph_outputs: set[str]) -> bool:
    if any(n.op_type != OP_TYPE or n.domain != DOMAIN for n in (projection, user)):
        return False
    p, u = _attributes(projection), _attributes(user)
    if "norm_epsilon" not in u or "pre_K" in u or len(user.input) > QMATMUL_INPUTS:
        return False
    if any(key in p for key in ("norm_epsilon", "activation", "pre_K")) or len(projection.output) != 1:
        return False
    if any(p.get(key, 0) != u.get(key, 0) for key in PRE_ATTRIBUTES) or p["N"] != u["K"]:
        return False
    if any(name for i, name in enumerate(projection.input) if i and i not in PRE_INPUTS):
        return False  # bias, outliers, two-level statistics
    out = projection.output[0]
    return out not in graph_outputs and len(readers[out]) == 1 and list(user.input).count(out) == 1


def _with_projection(projection: onnx.NodeProto, user: onnx.NodeProto) -> onnx.NodeProto:
    inputs = [projection.input[0], *user.input[1:]] + [""] * (QMATMUL_INPUTS - len(user.input))
    weights = list(projection.input) + [""] * (QMATMUL_INPUTS - len(projection.input))
    inputs += [weights[i] for i in PRE_INPUTS]
    while inputs[-1] == "":
        inputs.pop()
    node = helper.make_node(OP_TYPE, inputs, list(user.output), name=user.name, domain=DOMAIN,
                            pre_K=_attributes(projection)["K"])
    node.attribute.extend(user.attribute)
    return node


TOP = "logits_top"  # the graph output with each logits row's argmax and maximum


def with_top(nodes: list[onnx.NodeProto], logits: str) -> bool:
    """Give the edge.QMatMul that computes `logits` its output 2, TOP: (rows, 2) floats, each row's first argmax
    and its value, found as each chunk of columns is computed (kernels/cpu/row_top.h), so that greedy decoding and
    verification need not read the logits back. False where no such node makes them (stock ops, a gated head)."""
    for node in nodes:
        if node.domain == DOMAIN and node.op_type == OP_TYPE and node.output and node.output[0] == logits:
            if any(a.name == "activation" for a in node.attribute):
                return False
            outputs = list(node.output) + [""] * (2 - len(node.output))
            del node.output[:]
            node.output.extend(outputs[:2] + [TOP])
            node.attribute.append(helper.make_attribute("top", 1))
            return True
    return False


def without_top(model: onnx.ModelProto) -> bool:
    """Drop output 2 from a graph (for a GPU, whose kernel does not compute it); False where there was none."""
    for node in model.graph.node:
        if node.domain == DOMAIN and len(node.output) > 2 and node.output[2] == TOP:
            del node.output[2:]
            kept = [a for a in node.attribute if a.name != "top"]
            del node.attribute[:]
            node.attribute.extend(kept)
            outputs = [o for o in model.graph.output if o.name != TOP]
            del model.graph.output[:]
            model.graph.output.extend(outputs)
            return True
    return False


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
# A package's manifest kv_dtype -> the cache's ONNX element type. float16 needs edge.Attention (the CPU kernel):
# GroupQueryAttention keeps its cache in the query's type.
KV_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
ATTENTION_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
                    "cos_cache", "sin_cache", "position_ids", "attention_bias")


def attention_model(num_heads: int, kv_heads: int, head_dim: int, packed: bool = True, bias: bool = True,
                    stock: bool = False, scale: float = 0.0, window: int = 0, qk_norm: bool = False,
                    kv_dtype: str = "float32") -> onnx.ModelProto:
    """A one-node model of edge.Attention (stock=True: ORT's GroupQueryAttention, same wiring) with every input fed,
    for tests and the benchmark. Past and present share the names' shapes, so IOBinding can alias them. qk_norm:
    inputs q_norm and k_norm (edge.Attention only), each head's query and key RMS-normalised inside the op.
    kv_dtype "float16": past and present in half (edge.Attention only)."""
    f32, i32, i64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
    kv = KV_TYPES[kv_dtype]
    width = (num_heads + 2 * kv_heads) * head_dim if packed else num_heads * head_dim
    cache = [1, kv_heads, "L", head_dim]
    shapes = {"query": (f32, [1, "S", width]), "key": (f32, [1, "S", kv_heads * head_dim]),
              "value": (f32, [1, "S", kv_heads * head_dim]), "past_key": (kv, cache), "past_value": (kv, cache),
              "seqlens_k": (i32, [1]), "total_sequence_length": (i32, []), "cos_cache": (f32, ["R", head_dim // 2]),
              "sin_cache": (f32, ["R", head_dim // 2]), "position_ids": (i64, [1, "S"]),
              "attention_bias": (f32, [1, 1, "S", "T"]), "q_norm": (f32, [head_dim]), "k_norm": (f32, [head_dim])}
    absent = ({"key", "value"} if packed else set()) | (set() if bias else {"attention_bias"})
    names = ["" if n in absent else n for n in ATTENTION_INPUTS] + (["q_norm", "k_norm"] if qk_norm else [])
    while names[-1] == "":
        names.pop()
    attrs = dict(num_heads=num_heads, kv_num_heads=kv_heads, do_rotary=1, scale=scale or head_dim ** -0.5)
    if qk_norm:
        attrs["qk_norm_epsilon"] = 1e-6
    if window:
        attrs["local_window_size"] = window
    node = (helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                             domain="com.microsoft", **attrs) if stock else
            helper.make_node(ATTENTION_OP, names, ["output", "present_key", "present_value"], domain=DOMAIN, **attrs))
    inputs = [helper.make_tensor_value_info(n, *shapes[n]) for n in names if n]
    outputs = [helper.make_tensor_value_info("output", f32, [1, "S", num_heads * head_dim]),
               helper.make_tensor_value_info("present_key", kv, cache),
               helper.make_tensor_value_info("present_value", kv, cache)]
    graph = helper.make_graph([node], "edge_attention", inputs, outputs)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)
