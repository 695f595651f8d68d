"""Our own ONNX graph builder for decoder-only transformers with an in-place KV cache.

The graph takes any number S of new tokens on top of a past of P tokens, so one graph serves prompt prefill (in
chunks), plain decoding (S=1) and verification of drafted chains or trees (S=k+1 with an attention bias). Its
interface, which the runtime (edge/model.py) relies on:

inputs   input_ids (1,S) int64; position_ids (1,S) int64; seqlens_k (1,) int32 = P+S-1;
         total_sequence_length () int32 = P+S; logits_index (R,) int64 rows of the S whose logits are wanted;
         attention_bias (1,1,S,P+S) float32, only in graphs built with tree_attention=True;
         past_key.{i}, past_value.{i} (1, kv_heads, L, head_dim) float32 (float16: BuildOptions.kv_dtype) for
         each layer i.
outputs  logits (R, vocab) float32; present_key.{i}, present_value.{i}: the same buffers as past (bound to the same
         OrtValue, GroupQueryAttention writes the new rows at P..P+S-1 in place).

Only R logits rows are computed: a 200-token prefill needs one row, not 200 x vocab.

Ops are ONNX Runtime's fused contrib ops: GroupQueryAttention (rotary inside, KV in place, tree bias),
SkipSimplifiedLayerNormalization (residual add + RMSNorm in one pass), MatMulNBits for low-bit weights and
GatherBlockQuantized for a quantized (tied) embedding. q/k/v and gate/up projections are fused into one matmul each.
On edge's kernels (BuildOptions.kernels="edge") the norms that feed a matmul run inside its edge.QMatMul node.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge.config import ModelConfig

OPSET = 21
IR_VERSION = 10  # onnxruntime 1.31 rejects the IR 14 that onnx 1.23 writes by default
DATA_ALIGN = 4096  # page-aligned tensors let onnxruntime memory-map the external data
EDGE_QMATMUL_BITS = (2, 3, 4, 8)  # code widths edge.QMatMul (kernels/) runs
GATED_ACTIVATIONS = {"silu": 1, "gelu_tanh": 2}  # edge.QMatMul's activation attribute for the MLP's gate


def two_level_stats(q):
    """SpQR's two-level statistics of q as edge.QMatMul takes them (edge.kernels.pack.TwoLevel), when they give
    q's scales bit for bit (a group whose 16-bit scale underflowed kept a float one: then None) and rows share
    them 4 at a time; zero points go along when q's are float ones (else q's uint8 zeros stay)."""
    from edge.kernels.pack import TwoLevel

    s = q.second_level
    if s is None or q.block_size % 16 or not 16 <= q.block_size <= 128 or len(q.codes) % 4:
        return None
    rows = s.scales.row_of()
    if not np.array_equal(rows, s.zeros.row_of()) or (rows.reshape(-1, 4) != rows.reshape(-1, 4)[:, :1]).any():
        return None
    stats = [np.stack([st.base, st.step], axis=-1).astype(np.float16) for st in (s.scales, s.zeros)]
    two = TwoLevel(scale_codes=s.scales.codes.astype(np.uint8), scale_stats=stats[0], rows=rows,
                   zero_codes=s.zeros.codes.astype(np.uint8), zero_stats=stats[1])
    if not np.array_equal(two.scales(), q.scales):
        return None
    if q.offsets is None:  # integer zero points
        return replace(two, zero_codes=None, zero_stats=None)
    float_zeros = q.zeros.astype(np.float32) - q.offsets / q.scales
    return two if np.allclose(two.zeros(), float_zeros, rtol=1e-5, atol=1e-4) else None


# Rows float16_statistics compares at a time: whole-matrix float32 copies of Gemma 3's 262,144 x 640 head (the weights
# both ways, each scale and min spread over K) took its export to a 3.7 GB peak.
STATS_CHUNK_ROWS = 8192


def float16_statistics(q, source: np.ndarray | None = None) -> dict[str, np.ndarray] | None:
    """q's statistics in float16 where that loses nothing, as pack's keyword arguments: a float16 scale with q's
    uint8 zero points when its scales are float16 values (a Q8_0 table); else a float16 (scale, min) pair, W = code
    * scale + min, when it gives every weight bitwise (in float32) as q's own form does or as the float source
    weights are (Q4_1 stores exactly this); else None. A 4-bit Q4_1 weight then costs 5 bits at run time, against 6
    with float32 scales and float zero points."""
    s16 = q.scales.astype(np.float16)
    if q.offsets is None and np.array_equal(s16.astype(np.float32), q.scales):
        return {"scales": s16, "zeros": q.zeros}
    m16 = (-q.scales * q.zeros.astype(np.float32) + (0 if q.offsets is None else q.offsets)).astype(np.float16)
    if not (np.isfinite(s16).all() and np.isfinite(m16).all()):
        return None
    per_k = np.arange(q.codes.shape[1]) // q.block_size

    def weights16(r: int) -> np.ndarray:  # rows r .. r + STATS_CHUNK_ROWS as the float16 pair gives them
        rows = slice(r, r + STATS_CHUNK_ROWS)
        return q.codes[rows].astype(np.float32) * s16[rows].astype(np.float32)[:, per_k] + \
            m16[rows].astype(np.float32)[:, per_k]

    def own_rows(r: int) -> np.ndarray:  # the same rows as q's own form gives them
        rows = slice(r, r + STATS_CHUNK_ROWS)
        part = replace(q, codes=q.codes[rows], scales=q.scales[rows], zeros=q.zeros[rows], outliers=None,
                       offsets=None if q.offsets is None else q.offsets[rows], second_level=None)
        return part.dense()

    starts = range(0, len(q.codes), STATS_CHUNK_ROWS)
    exact = all(np.array_equal(weights16(r), own_rows(r)) for r in starts) or (
        source is not None and all(np.array_equal(weights16(r), source[r:r + STATS_CHUNK_ROWS]) for r in starts))
    return {"scales": s16, "mins": m16} if exact else None


class MatMulNBitsWeights(Protocol):
    """What a quantizer returns for one linear layer (see export/quant)."""

    def to_matmulnbits(self) -> dict[str, Any]: ...


Quantizer = Callable[[str, np.ndarray], MatMulNBitsWeights | None]


class ExternalData:
    """Streams initializers to one external-data file as they are created, so the graph proto stays small and a
    multi-GB model is never serialised in memory."""

    def __init__(self, path: Path):
        self.path = path
        self.location = path.name
        self._file = open(path, "wb")

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        array = np.ascontiguousarray(array)
        offset = self._file.seek(0, os.SEEK_END)
        pad = (-offset) % DATA_ALIGN
        if pad:
            self._file.write(b"\0" * pad)
            offset += pad
        self._file.write(array.tobytes())
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(array.nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        return t

    def close(self) -> None:
        self._file.close()


class SharedExternalData:
    """The initializers an earlier build already wrote: a second graph over a subset of the layers (the skip-layer
    self-draft) references the same bytes of the same file instead of writing a second copy of its weights."""

    def __init__(self, written: dict[str, TensorProto]):
        self.written = written

    @classmethod
    def from_graph(cls, graph: Path) -> SharedExternalData:
        """The external initializers of a saved graph (its weights file is not read)."""
        model = onnx.load(str(graph), load_external_data=False)
        return cls({t.name: t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL})

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        t = self.written.get(name)
        if t is None:
            raise ValueError(f"{name} is not in the shared weights file: build the full graph first, with the same "
                             f"options")
        if tuple(t.dims) != tuple(array.shape) or t.data_type != helper.np_dtype_to_tensor_dtype(array.dtype):
            raise ValueError(f"{name}: the shared weights file holds shape {tuple(t.dims)}, this build made "
                             f"{tuple(array.shape)} ({array.dtype}); build both graphs with the same options")
        shared = TensorProto()
        shared.CopyFrom(t)
        return shared

    def close(self) -> None:
        pass


@dataclass
class BuildOptions:
    quantizer: Quantizer | None = None  # None: float32 weights
    tree_attention: bool = False  # add the attention_bias input (needed to verify draft trees)
    # 4: int8 activations (MatMulNBits' fast CPU path; edge.QMatMul's faster 4-bit mode); 0: float activations
    # (edge.QMatMul keeps x to 23 bits, error under 1e-5; export_model makes 0 the default for kernels="edge")
    accuracy_level: int = 4
    rope_cache_len: int | None = None  # rows of the cos/sin cache; default: the model's max context
    fuse_projections: bool = True  # one matmul for q/k/v and one for gate/up (benchmarks/graph_ops.py measures it)
    # "edge": quantized linears run edge.QMatMul and attention edge.Attention (kernels/), both batch-invariant
    kernels: str = "stock"
    # The output head's own quantization (export/quant/head.py: GPTQ on the final hidden states), used where the head
    # has weights of its own at run time (untied, or tied on edge.QMatMul); None: the quantizer's (tied: the table's).
    head_quantizer: Callable[[np.ndarray], Any] | None = None
    # Kept layer indices (ascending) for a graph over a subset of the layers (the skip-layer self-draft); None: all.
    # The kept layers' cache inputs/outputs are numbered 0..len-1 in order, so the runtime runs it like any model.
    layers: tuple[int, ...] | None = None
    # kernels="edge": RMSNorms that feed an edge.QMatMul run inside it (kernels/graph.py: fuse_norms); 60 fewer nodes
    # for SmolLM2 (kernels/README.md: measured with benchmarks/step_ab.py on two exports)
    fuse_norms: bool = True
    # and then the plain matmul before each such node (o_proj, down_proj) runs inside it as its pre-projection
    # (kernels/graph.py: fuse_pre_projections); 59 fewer nodes again for SmolLM2
    fuse_pre_projections: bool = True
    # kernels="edge": the head's edge.QMatMul also outputs each row's argmax and maximum (graph output
    # "logits_top", kernels/graph.py: with_top), so greedy steps and verify calls need not read the logits back
    head_top: bool = True
    # The KV cache's element type: "float16" (kernels="edge" only) halves what a step reads of a long context
    # (edge.Attention widens each row as it reads it); "float32" is GroupQueryAttention's with float32 activations.
    kv_dtype: str = "float32"


@dataclass
class _Graph:
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[TensorProto] = field(default_factory=list)
    counter: int = 0

    def node(self, op: str, inputs: list[str], n_out: int = 1, domain: str = "", name: str = "",
             outputs: list[str] | None = None, **attrs) -> list[str]:
        self.counter += 1
        base = name or f"{op}_{self.counter}"
        outputs = outputs or [f"{base}/out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=base, domain=domain or None, **attrs))
        return outputs


class DecoderBuilder:
    """Turns an architecture-neutral weight mapping into the decoder graph described in the module docstring."""

    def __init__(self, config: ModelConfig, tensors, data: ExternalData, options: BuildOptions):
        self.cfg = config
        self.tensors = tensors
        self.data = data
        self.opt = options
        self.g = _Graph()
        self.top = False  # the graph outputs "logits_top" (head_top)

    # -- initializers -------------------------------------------------------------------------------------------
    def weight(self, name: str, array: np.ndarray) -> str:
        self.g.initializers.append(self.data.tensor(name, array))
        return name

    def const(self, name: str, values, dtype=np.int64) -> str:
        self.g.initializers.append(onnx.numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    # -- building blocks ----------------------------------------------------------------------------------------
    def linear(self, x: str, name: str, w: np.ndarray, bias: np.ndarray | None = None, q=None) -> str:
        """y = x w^T (+ bias) for w of shape (out, in), quantized if the quantizer accepts this layer (or as `q`, a
        quantization made elsewhere)."""
        if q is None and self.opt.quantizer:
            q = self.opt.quantizer(name, w)
        if q is None:
            y = self.g.node("MatMul", [x, self.weight(f"{name}.weight_t", w.T.astype(np.float32))], name=name)[0]
            if bias is not None:
                y = self.g.node("Add", [y, self.weight(f"{name}.bias", bias.astype(np.float32))])[0]
            return y
        if self.opt.kernels == "edge":
            return self.qmatmul(x, name, q, bias, source=w)
        p = q.to_matmulnbits()
        inputs = [
            x,
            self.weight(f"{name}.qweight", p["B"]),
            self.weight(f"{name}.scales", p["scales"].astype(np.float32)),
            self.weight(f"{name}.zero_points", p["zero_points"]) if p.get("zero_points") is not None else "",
            "",
            self.weight(f"{name}.bias", bias.astype(np.float32)) if bias is not None else "",
        ]
        while inputs[-1] == "":
            inputs.pop()
        y = self.g.node(
            "MatMulNBits", inputs, domain="com.microsoft", name=name, K=p["K"], N=p["N"], bits=p["bits"],
            block_size=p["block_size"], accuracy_level=self.opt.accuracy_level,
        )[0]
        if p.get("group_offsets") is not None:
            y = self.g.node("Add", [y, self.offset_term(x, name, p)])[0]
        if p.get("outliers") is not None and p["outliers"].nnz:
            y = self.sparse_term(x, y, name, p["outliers"])
        return y

    def qmatmul(self, x: str, name: str, q, bias: np.ndarray | None, gated: int = 0,
                source: np.ndarray | None = None) -> str:
        """edge.QMatMul: one op for any bits, float offsets folded into float zero points, outliers inside (gated:
        the MLP's gated activation too, over rows from interleave_gated)."""
        from edge.kernels.graph import qmatmul_node, qmatmul_tensors
        from edge.kernels.pack import make_outliers, pack, pack_two_level

        outliers = None
        if q.outliers is not None and q.outliers.nnz:
            o = q.outliers
            outliers = make_outliers(o.shape[0], o.shape[1], o.rows(), o.col, o.values)
        if (two := two_level_stats(q)) is not None:
            packed = pack_two_level(q.codes, two, None if two.zero_codes is not None else q.zeros, bits=q.bits,
                                    group_size=q.block_size, outliers=outliers)
        elif (stats := float16_statistics(q, source)) is not None:
            packed = pack(q.codes, bits=q.bits, group_size=q.block_size, outliers=outliers, **stats)
        else:
            zeros = q.zeros if q.offsets is None else q.zeros.astype(np.float32) - q.offsets / q.scales
            packed = pack(q.codes, q.scales, zeros, bits=q.bits, group_size=q.block_size, outliers=outliers)
        for tensor_name, array in qmatmul_tensors(packed, name, bias).items():
            self.weight(tensor_name, array)
        self.g.nodes.append(qmatmul_node(x, f"{name}/y", packed, name, has_bias=bias is not None,
                                         accuracy_level=self.opt.accuracy_level, gated=gated))
        return f"{name}/y"

    def offset_term(self, x: str, name: str, p: dict[str, Any]) -> str:
        """(sum of x over each block) @ offsets^T: the float part of decoupleQ's zero points, kept out of
        MatMulNBits so that its uint8 zero points keep the fast CPU path."""
        if p["K"] % p["block_size"]:
            raise ValueError(f"{name}: float group offsets need K ({p['K']}) to be a multiple of the block size")
        blocks = self.g.node("Reshape", [x, self.const(f"{name}.blocks", [0, 0, -1, p["block_size"]])])[0]
        sums = self.g.node("ReduceSum", [blocks, self.const(f"{name}.axis", [-1])], keepdims=0)[0]
        offsets_t = self.weight(f"{name}.offsets_t", np.ascontiguousarray(p["group_offsets"].T, np.float32))
        return self.g.node("MatMul", [sums, offsets_t])[0]

    def sparse_term(self, x: str, y: str, name: str, outliers) -> str:
        """y[..., r] += v * x[..., c] for each outlier (r, c, v): SpQR's 16-bit outliers in stock ops."""
        cols = self.weight(f"{name}.outlier_cols", outliers.col.astype(np.int64))
        rows = self.weight(f"{name}.outlier_rows", outliers.rows().astype(np.int64))
        values = self.g.node("Cast", [self.weight(f"{name}.outlier_values", outliers.values.astype(np.float16))],
                             to=TensorProto.FLOAT)[0]
        picked = self.g.node("Gather", [x, cols], axis=-1)[0]
        contrib = self.g.node("Mul", [picked, values])[0]
        index = self.g.node("Expand", [rows, self.g.node("Shape", [contrib])[0]])[0]
        return self.g.node("ScatterElements", [y, index, contrib], axis=-1, reduction="add")[0]

    def rms_norm(self, x: str, weight_name: str) -> str:
        w = self.weight(weight_name, self.tensors[weight_name].astype(np.float32))
        return self.g.node("SimplifiedLayerNormalization", [x, w], epsilon=self.cfg.rms_norm_eps, axis=-1)[0]

    def skip_rms_norm(self, x: str, residual: str, weight_name: str) -> tuple[str, str]:
        """RMSNorm(x + residual) and the new residual stream, in one fused op."""
        w = self.weight(weight_name, self.tensors[weight_name].astype(np.float32))
        out = self.g.node("SkipSimplifiedLayerNormalization", [x, residual, w], n_out=4, domain="com.microsoft",
                          epsilon=self.cfg.rms_norm_eps)
        return out[0], out[3]

    def rope_caches(self) -> dict[float, tuple[str, str]]:
        """cos/sin tables for GroupQueryAttention, one pair per distinct rope base (Gemma 3 has two)."""
        bases = {self.cfg.rope_theta}
        if self.cfg.rope_local_theta and self.cfg.sliding_window:
            bases.add(self.cfg.rope_local_theta)
        n = self.opt.rope_cache_len or self.cfg.max_context
        caches = {}
        for i, base in enumerate(sorted(bases)):
            inv_freq = rope_inv_freq(self.cfg, base, is_global=base == self.cfg.rope_theta)
            angles = np.outer(np.arange(n, dtype=np.float64), inv_freq)
            caches[base] = (self.weight(f"rope.{i}.cos", np.cos(angles).astype(np.float32)),
                            self.weight(f"rope.{i}.sin", np.sin(angles).astype(np.float32)))
        return caches

    def attention(self, i: int, x: str, rope: tuple[str, str], slot: int | None = None) -> str:
        """Layer i's attention; `slot` numbers its cache inputs/outputs (default i; differs in a layer subset)."""
        cfg, p = self.cfg, f"model.layers.{i}.self_attn"
        slot = i if slot is None else slot
        edge = self.opt.kernels == "edge"  # edge.Attention: rows independent of the call's size (kernels/)
        qkv_inputs = self.qkv(x, p, norms_inside=edge)
        inputs = qkv_inputs + [f"past_key.{slot}", f"past_value.{slot}", "seqlens_k", "total_sequence_length",
                               rope[0], rope[1], "position_ids"]
        inputs.append("attention_bias" if self.opt.tree_attention else "")
        attrs: dict[str, Any] = dict(num_heads=cfg.num_heads, kv_num_heads=cfg.num_kv_heads, do_rotary=1,
                                     scale=cfg.query_scale or 1.0 / math.sqrt(cfg.head_dim))
        if cfg.is_sliding_layer(i):
            attrs["local_window_size"] = cfg.sliding_window
        op, domain = "GroupQueryAttention", "com.microsoft"
        if edge:
            op, domain = "Attention", "edge"
            if cfg.qk_norm:  # inputs 11 and 12: each head's q and k normalised inside the op
                inputs += [self.weight(f"{p}.{n}_norm.weight", self.tensors[f"{p}.{n}_norm.weight"].astype(np.float32))
                           for n in "qk"]
                attrs["qk_norm_epsilon"] = cfg.rms_norm_eps
        while inputs[-1] == "":
            inputs.pop()
        out = self.g.node(op, inputs, domain=domain, name=f"{p}.gqa",
                          outputs=[f"{p}.gqa/out0", f"present_key.{slot}", f"present_value.{slot}"], **attrs)
        return self.linear(out[0], f"{p}.o_proj", self.tensors[f"{p}.o_proj.weight"],
                           self.tensors.get(f"{p}.o_proj.bias"))  # Llama with attention_bias=True

    def qkv(self, x: str, p: str, norms_inside: bool = False) -> list[str]:
        """GroupQueryAttention's query/key/value inputs: packed in one tensor when fused and not normalised here.
        norms_inside: q/k norms (Gemma 3) are the attention op's to apply (edge.Attention), not nodes of their own."""
        cfg = self.cfg
        if not self.opt.fuse_projections:
            q, k, v = (self.linear(x, f"{p}.{n}_proj", self.tensors[f"{p}.{n}_proj.weight"],
                                   self.tensors[f"{p}.{n}_proj.bias"] if cfg.qkv_bias else None) for n in "qkv")
        else:
            w = np.concatenate([self.tensors[f"{p}.{n}_proj.weight"] for n in "qkv"], axis=0)
            bias = np.concatenate([self.tensors[f"{p}.{n}_proj.bias"] for n in "qkv"]) if cfg.qkv_bias else None
            packed = self.linear(x, f"{p}.qkv_proj", w, bias)
            if not cfg.qk_norm or norms_inside:
                return [packed, "", ""]
            q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
            q, k, v = self.g.node("Split", [packed, self.const(f"{p}.split", [q_dim, kv_dim, kv_dim])], n_out=3,
                                  axis=-1)
        if cfg.qk_norm and not norms_inside:
            q, k = self.head_norm(q, f"{p}.q_norm.weight"), self.head_norm(k, f"{p}.k_norm.weight")
        return [q, k, v]

    def head_norm(self, x: str, weight_name: str) -> str:
        """Per-head RMSNorm (Gemma 3's q_norm/k_norm): normalise each head_dim slice."""
        shape = self.const(f"{weight_name}.shape", [0, 0, -1, self.cfg.head_dim])
        heads = self.g.node("Reshape", [x, shape])[0]
        normed = self.rms_norm(heads, weight_name)
        return self.g.node("Reshape", [normed, self.const(f"{weight_name}.flat", [0, 0, -1])])[0]

    def mlp(self, i: int, x: str) -> str:
        p = f"model.layers.{i}.mlp"
        down = self.tensors[f"{p}.down_proj.weight"]
        if (fused := self.fused_gated(x, p)) is not None:
            return self.linear(fused, f"{p}.down_proj", down)
        if self.opt.fuse_projections:
            w = np.concatenate([self.tensors[f"{p}.gate_proj.weight"], self.tensors[f"{p}.up_proj.weight"]], axis=0)
            gate, up = self.g.node("Split", [self.linear(x, f"{p}.gate_up_proj", w)], n_out=2, axis=-1, num_outputs=2)
        else:
            gate, up = (self.linear(x, f"{p}.{n}_proj", self.tensors[f"{p}.{n}_proj.weight"]) for n in ("gate", "up"))
        if self.cfg.hidden_act == "silu":
            act = self.g.node("Mul", [gate, self.g.node("Sigmoid", [gate])[0]])[0]
        elif self.cfg.hidden_act == "gelu_tanh":
            act = self.g.node("FastGelu", [gate], domain="com.microsoft")[0]
        else:
            raise ValueError(f"unsupported activation {self.cfg.hidden_act!r}")
        return self.linear(self.g.node("Mul", [act, up])[0], f"{p}.down_proj", down)

    def fused_gated(self, x: str, p: str) -> str | None:
        """act(gate) * up as one edge.QMatMul (activation 1: silu, 2: gelu_tanh) when the layer runs on edge's
        kernels: 3-4 fewer nodes per layer than MatMul, Split, the activation and Mul; None when it does not apply."""
        gate, up = self.tensors[f"{p}.gate_proj.weight"], self.tensors[f"{p}.up_proj.weight"]
        gated = GATED_ACTIVATIONS.get(self.cfg.hidden_act, 0)
        if not (self.opt.kernels == "edge" and self.opt.fuse_projections and gated
                and self.opt.quantizer is not None and gate.shape[0] % 4 == 0):
            return None
        from edge.export.quant.qlinear import concat_rows
        from edge.kernels.pack import gated_row_order, interleave_gated

        # gate and up quantized as themselves (calibrated methods look layers up by name), then rows interleaved
        parts = [self.opt.quantizer(f"{p}.{n}_proj", w) for n, w in (("gate", gate), ("up", up))]
        if None in parts:
            return None
        q = concat_rows(parts).take_rows(gated_row_order(gate.shape[0]))
        return self.qmatmul(x, f"{p}.gate_up_proj", q, None, gated=gated, source=interleave_gated(gate, up))

    def embedding(self) -> tuple[str, Callable[[str], str]]:
        """Token embedding, and a function that applies the output head to hidden rows (tied or not)."""
        cfg, emb = self.cfg, self.tensors["model.embed_tokens.weight"]
        q = self.opt.quantizer("model.embed_tokens", emb) if self.opt.quantizer else None
        if q is None:
            table = self.weight("model.embed_tokens.weight", emb.astype(np.float32))
            x = self.g.node("Gather", [table, "input_ids"], axis=0)[0]
        else:
            # The packed table is stored in MatMulNBits' layout: only a constant initializer gets MatMulNBits'
            # prepacked fast path, which matters for the (largest) output head; the gather reads a reshaped view.
            p = q.to_matmulnbits()
            if p.get("group_offsets") is not None or p.get("outliers") is not None:
                raise ValueError("the embedding must be quantized without float offsets or outliers "
                                 "(GatherBlockQuantized has no place for them)")
            table = self.weight("model.embed_tokens.qweight", p["B"])
            scales = self.weight("model.embed_tokens.scales", p["scales"].astype(np.float32))
            zeros = self.weight("model.embed_tokens.zero_points", p["zero_points"])
            rows = self.g.node("Reshape", [table, self.const("embed_tokens.rows", [p["N"], -1])])[0]
            x = self.g.node("GatherBlockQuantized", [rows, "input_ids", scales, zeros], domain="com.microsoft",
                            bits=p["bits"], block_size=p["block_size"], gather_axis=0, quantize_axis=1)[0]
        if cfg.embedding_scale != 1.0:
            x = self.g.node("Mul", [x, self.const("embedding_scale", np.float32(cfg.embedding_scale), np.float32)])[0]

        def head(h: str) -> str:
            if not cfg.tie_word_embeddings:
                w = self.tensors["lm_head.weight"]
                return self.linear(h, "lm_head", w, q=self.head_weights(w))
            if q is None:
                return self.g.node("Gemm", [h, table], transB=1, name="lm_head")[0]
            # the head in the batch-invariant kernel too (its own copy of the table, or its own quantization; an
            # 8-bit table, lossless for a Q8_0 source, in the fp32 kernels). Stock ops read the table itself (at
            # accuracy_level 0 an 8-bit one takes MatMulNBits' unpacked slow path: 3.4 vs 26 tok/s for the model)
            if self.opt.kernels == "edge" and q.bits in EDGE_QMATMUL_BITS:
                own = self.head_weights(emb)
                return self.qmatmul(h, "lm_head", q if own is None else own, None, source=emb)
            return self.g.node("MatMulNBits", [h, table, scales, zeros], domain="com.microsoft", name="lm_head",
                               K=p["K"], N=p["N"], bits=p["bits"], block_size=p["block_size"],
                               accuracy_level=self.opt.accuracy_level)[0]

        return x, head

    def head_weights(self, w: np.ndarray):
        """The head's own quantization of w (BuildOptions.head_quantizer), or None."""
        return self.opt.head_quantizer(w) if self.opt.head_quantizer else None

    # -- whole model --------------------------------------------------------------------------------------------
    def kept_layers(self) -> list[int]:
        """The layers this graph runs, in order: all of them, or BuildOptions.layers."""
        if self.opt.layers is None:
            return list(range(self.cfg.num_layers))
        kept = list(self.opt.layers)
        if not kept or kept != sorted(set(kept)) or kept[0] < 0 or kept[-1] >= self.cfg.num_layers:
            raise ValueError(f"layers must be distinct ascending indices in 0..{self.cfg.num_layers - 1}, got {kept}")
        return kept

    def build(self, progress: Callable[[int], None] = lambda n: None) -> onnx.ModelProto:
        cfg = self.cfg
        kept = self.kept_layers()
        x, head = self.embedding()
        progress(1)
        ropes = self.rope_caches()
        residual, hidden = x, self.rms_norm(x, f"model.layers.{kept[0]}.input_layernorm.weight")
        for slot, i in enumerate(kept):
            p = f"model.layers.{i}"
            rope = ropes[cfg.rope_local_theta if cfg.is_sliding_layer(i) and cfg.rope_local_theta else cfg.rope_theta]
            attn = self.attention(i, hidden, rope, slot)
            if cfg.architecture == "gemma3":
                attn = self.rms_norm(attn, f"{p}.post_attention_layernorm.weight")
                hidden, residual = self.skip_rms_norm(attn, residual, f"{p}.pre_feedforward_layernorm.weight")
                out = self.rms_norm(self.mlp(i, hidden), f"{p}.post_feedforward_layernorm.weight")
            else:
                hidden, residual = self.skip_rms_norm(attn, residual, f"{p}.post_attention_layernorm.weight")
                out = self.mlp(i, hidden)
            next_norm = (f"model.layers.{kept[slot + 1]}.input_layernorm.weight" if slot + 1 < len(kept)
                         else "model.norm.weight")
            hidden, residual = self.skip_rms_norm(out, residual, next_norm)
            progress(1)
        rows = self.g.node("Reshape", [hidden, self.const("hidden.flat", [-1, cfg.hidden_size])])[0]
        picked = self.g.node("Gather", [rows, "logits_index"], axis=0)[0]
        self.g.nodes.append(helper.make_node("Identity", [head(picked)], ["logits"], name="logits"))
        # the rows the head read: what a draft head (export/draft_head.py) continues from
        self.g.nodes.append(helper.make_node("Identity", [picked], ["hidden"], name="hidden"))
        self.g.nodes = fuse_for_kernels(self.g.nodes, self.opt, {"logits", "hidden"})
        self.top = self.opt.kernels == "edge" and self.opt.head_top and head_top(self.g.nodes)
        progress(1)
        return self.model()

    def model(self) -> onnx.ModelProto:
        cfg = self.cfg
        f32, cache = TensorProto.FLOAT, ["batch", cfg.num_kv_heads, "cache_len", cfg.head_dim]
        from edge.kernels.graph import KV_TYPES

        kv = KV_TYPES[self.opt.kv_dtype]
        inputs = [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "seq"]),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
            helper.make_tensor_value_info("logits_index", TensorProto.INT64, ["rows"]),
        ]
        if self.opt.tree_attention:
            inputs.append(helper.make_tensor_value_info("attention_bias", f32, [1, 1, "seq", "total"]))
        outputs = [helper.make_tensor_value_info("logits", f32, ["rows", cfg.vocab_size]),
                   helper.make_tensor_value_info("hidden", f32, ["rows", cfg.hidden_size])]
        if self.top:
            from edge.kernels.graph import TOP

            outputs.append(helper.make_tensor_value_info(TOP, f32, ["rows", 2]))
        for i in range(len(self.kept_layers())):
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(f"past_{kind}.{i}", kv, cache))
                outputs.append(helper.make_tensor_value_info(f"present_{kind}.{i}", kv, cache))
        graph = helper.make_graph(self.g.nodes, "edge_decoder", inputs, outputs, self.g.initializers)
        opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
        if self.opt.kernels == "edge":
            opsets.append(helper.make_opsetid("edge", 1))
        model = helper.make_model(graph, opset_imports=opsets, producer_name="edge", ir_version=IR_VERSION)
        return model


def head_top(nodes: list[onnx.NodeProto]) -> bool:
    """Output 2 on the edge.QMatMul whose result is the graph's logits (kernels/graph.py: with_top)."""
    from edge.kernels.graph import with_top

    source = next((n.input[0] for n in nodes if n.op_type == "Identity" and list(n.output) == ["logits"]), None)
    return source is not None and with_top(nodes, source)


def fuse_for_kernels(nodes: list[onnx.NodeProto], opt: BuildOptions, outputs: set[str]) -> list[onnx.NodeProto]:
    """The node list with the passes that move nodes into edge's kernels (kernels/graph.py), as opt asks."""
    if opt.kernels != "edge" or not opt.fuse_norms:
        return nodes
    from edge.kernels.graph import fuse_norms, fuse_pre_projections

    nodes = fuse_norms(nodes, outputs)
    return fuse_pre_projections(nodes, outputs) if opt.fuse_pre_projections else nodes


def rope_inv_freq(cfg: ModelConfig, base: float, is_global: bool = True) -> np.ndarray:
    """Rotary frequencies, with Llama 3's frequency-dependent scaling and linear scaling when configured."""
    dim = cfg.head_dim
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    scaling = cfg.rope_scaling if is_global else None
    if not scaling:
        return inv_freq
    if "freq_factors" in scaling:  # GGUF stores Llama 3.1's scaling as precomputed per-frequency divisors
        return inv_freq / np.asarray(scaling["freq_factors"], dtype=np.float64)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_ctx = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = np.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
        return np.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    if kind in (None, "default"):
        return inv_freq
    raise ValueError(f"unsupported rope scaling {kind!r}")


def build_decoder(config: ModelConfig, tensors, out_dir: Path, options: BuildOptions | None = None,
                  progress: Callable[[int], None] = lambda n: None) -> list[str]:
    """Write model.onnx and model.onnx.data into out_dir; returns the file names written."""
    out_dir = Path(out_dir)
    data = ExternalData(out_dir / "model.onnx.data")
    try:
        model = DecoderBuilder(config, tensors, data, options or BuildOptions()).build(progress)
    finally:
        data.close()
    onnx.save_model(model, out_dir / "model.onnx")
    return ["model.onnx", "model.onnx.data"]


def build_steps(config: ModelConfig) -> int:
    """Number of progress units build() reports, for a progress bar."""
    return config.num_layers + 2


def iter_external_locations(model: onnx.ModelProto) -> Iterable[str]:
    for t in model.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            yield next(e.value for e in t.external_data if e.key == "location")
