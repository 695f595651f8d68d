"""The paged package layout: one decoder layer's graph serves every layer (of its kind), its weights fed as inputs.

Weight paging (edge/paging.py) keeps only a window of layers in memory and reads the others from disk while the
current ones compute. onnxruntime cannot swap an initializer under a live session, so the layers' weights become
inputs of one small layer graph, bound per layer (IOBinding, by pointer) to the slot that holds that layer's weights.
Weights are float32 or low-bit for edge.QMatMul (kernels/): MatMulNBits with weights as inputs loses its prepacked
fast path on the CPU (10-80x slower), while float MatMul and edge.QMatMul take their weights as inputs at full speed
(QMatMul has no prepack: within 1.03x of constant weights, kernels/README.md).

    layer.onnx         one layer: hidden (1,S,H), position_ids, seqlens_k, total_sequence_length,
                       [attention_bias], past_key, past_value and the layer's weights as inputs ->
                       hidden_out (1,S,H), present_key, present_value (in place, as in the resident graph)
    layer_sliding.onnx the same for sliding-window layers, when a model has both kinds (Gemma 3: its own window
                       size and rope base; the manifest lists those layers)
    layers.onnx.data   every layer's weights, layer after layer, each layer and each tensor page-aligned, in the
                       same order and relative offsets for every layer
    model.onnx         the head: hidden (1,S,H), logits_index (R,) -> final RMSNorm -> logits (R, vocab), with its
                       weights resident (constant initializers in model.onnx.data)
    model.onnx.data    the head's weights and the token embedding table (the runtime gathers embedding rows from it
                       through a memory map; a tied float head reads the same table, a tied low-bit head has its
                       own QMatMul copy). A low-bit table is stored in MatMulNBits' layout (B, scales, zero points),
                       the resident package's GatherBlockQuantized layout, and dequantized row by row.

The manifest's `paging` section indexes all of it (see `build_paged`), so the runtime and the memory planner
never parse the layer data.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge import __version__
from edge.config import ModelConfig
from edge.errors import ModelFormatError
from edge.export.builder import (DATA_ALIGN, IR_VERSION, OPSET, BuildOptions, DecoderBuilder, ExternalData,
                                 fuse_for_kernels)
from edge.export.source import ImportedModel
from edge.package import atomic_package_dir, write_manifest

LAYER_GRAPH, LAYER_DATA = "layer.onnx", "layers.onnx.data"
SLIDING_LAYER_GRAPH = "layer_sliding.onnx"  # Gemma 3's local layers: their own window and rope base
HEAD_GRAPH, HEAD_DATA = "model.onnx", "model.onnx.data"


class LayerWriter:
    """Appends layers' weights to the layer data file, page-aligned, and records where each tensor went."""

    def __init__(self, path: Path):
        self._file = open(path, "wb")
        self.layer_offsets: list[int] = []
        self.tensors: list[dict[str, Any]] = []  # the current layer's index: name, offset in the layer, shape, dtype

    def begin_layer(self) -> None:
        self._pad()
        self.layer_offsets.append(self._file.tell())
        self.tensors = []

    def write(self, name: str, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        self._pad()
        self.tensors.append({"name": name, "offset": self._file.tell() - self.layer_offsets[-1],
                             "shape": list(array.shape), "dtype": str(array.dtype), "bytes": array.nbytes})
        self._file.write(array.tobytes())

    def _pad(self) -> None:
        pad = (-self._file.tell()) % DATA_ALIGN
        if pad:
            self._file.write(b"\0" * pad)

    def close(self) -> int:
        """Pad the last layer and return the file's size."""
        self._pad()
        size = self._file.tell()
        self._file.close()
        return size


class LayerBuilder(DecoderBuilder):
    """DecoderBuilder's attention and MLP blocks for one layer, with the layer's weights turned into graph inputs.

    Weight names lose their `model.layers.{i}.` prefix, so every layer's graph has the same input names; weights of
    anything else (the rotary caches) stay constant initializers of the layer graph.
    """

    def __init__(self, config: ModelConfig, tensors, writer: LayerWriter, options: BuildOptions, layer: int):
        super().__init__(config, tensors, data=None, options=options)
        self.writer, self.layer, self.prefix = writer, layer, f"model.layers.{layer}."
        self.weight_inputs: list[onnx.ValueInfoProto] = []

    def weight(self, name: str, array: np.ndarray) -> str:
        if not name.startswith(self.prefix):
            self.g.initializers.append(onnx.numpy_helper.from_array(np.ascontiguousarray(array), name))
            return name
        name = name[len(self.prefix):]
        self.writer.write(name, array)
        dtype = helper.np_dtype_to_tensor_dtype(array.dtype)
        self.weight_inputs.append(helper.make_tensor_value_info(name, dtype, list(array.shape)))
        return name

    def build_layer(self) -> onnx.ModelProto:
        """The resident graph's layer body (DecoderBuilder.build), closed by the residual add that the resident
        graph fuses into the next layer's norm."""
        cfg, i, p = self.cfg, self.layer, self.prefix
        local = cfg.is_sliding_layer(i) and cfg.rope_local_theta
        rope = self.rope_caches()[cfg.rope_local_theta if local else cfg.rope_theta]
        hidden = self.rms_norm("hidden", f"{p}input_layernorm.weight")
        attn = self.attention(i, hidden, rope)
        if cfg.architecture == "gemma3":
            attn = self.rms_norm(attn, f"{p}post_attention_layernorm.weight")
            hidden, residual = self.skip_rms_norm(attn, "hidden", f"{p}pre_feedforward_layernorm.weight")
            out = self.rms_norm(self.mlp(i, hidden), f"{p}post_feedforward_layernorm.weight")
        else:
            hidden, residual = self.skip_rms_norm(attn, "hidden", f"{p}post_attention_layernorm.weight")
            out = self.mlp(i, hidden)
        self.g.node("Add", [out, residual], outputs=["hidden_out"], name="residual")
        self.g.nodes = fuse_for_kernels(self.g.nodes, self.opt, {"hidden_out"})  # as the resident graph's
        used = {n for node in self.g.nodes for n in node.input}
        self.g.initializers = [t for t in self.g.initializers if t.name in used]  # the other rope base's caches
        names = {f"past_key.{i}": "past_key", f"past_value.{i}": "past_value",
                 f"present_key.{i}": "present_key", f"present_value.{i}": "present_value"}
        # edge.QMatMul nodes name their weight inputs themselves (kernels.graph.qmatmul_node), with the layer prefix
        names |= {n: n[len(p):] for node in self.g.nodes for n in node.input if n.startswith(p)}
        self._rename(names)
        return self._layer_model()

    def _rename(self, names: dict[str, str]) -> None:
        for node in self.g.nodes:
            node.input[:] = [names.get(n, n) for n in node.input]
            node.output[:] = [names.get(n, n) for n in node.output]
        for t in self.g.initializers:  # constants named after the layer (split sizes, head-norm shapes)
            t.name = names.get(t.name, t.name)

    def _layer_model(self) -> onnx.ModelProto:
        cfg, f32 = self.cfg, TensorProto.FLOAT
        cache = [1, cfg.num_kv_heads, "cache_len", cfg.head_dim]
        inputs = [
            helper.make_tensor_value_info("hidden", f32, [1, "seq", cfg.hidden_size]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "seq"]),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
        ]
        if self.opt.tree_attention:
            inputs.append(helper.make_tensor_value_info("attention_bias", f32, [1, 1, "seq", "total"]))
        inputs += [helper.make_tensor_value_info("past_key", f32, cache),
                   helper.make_tensor_value_info("past_value", f32, cache)] + self.weight_inputs
        outputs = [helper.make_tensor_value_info("hidden_out", f32, [1, "seq", cfg.hidden_size]),
                   helper.make_tensor_value_info("present_key", f32, cache),
                   helper.make_tensor_value_info("present_value", f32, cache)]
        graph = helper.make_graph(self.g.nodes, "edge_layer", inputs, outputs, self.g.initializers)
        return _model(graph, self.opt.kernels == "edge")


class HeadBuilder(DecoderBuilder):
    """Final RMSNorm and the output head over the hidden rows asked for; also stores the embedding table."""

    def build_head(self) -> tuple[onnx.ModelProto, dict[str, Any]]:
        cfg = self.cfg
        emb = self.tensors["model.embed_tokens.weight"]
        q = self.opt.quantizer("model.embed_tokens", emb) if self.opt.quantizer else None
        if q is None:
            table = self.weight("model.embed_tokens.weight", emb.astype(np.float32))
            embedding = _external_entry(self.g.initializers[-1])
        else:
            embedding, table = self.quantized_table(q), ""
        hidden = self.rms_norm("hidden", "model.norm.weight")
        rows = self.g.node("Reshape", [hidden, self.const("hidden.flat", [-1, cfg.hidden_size])])[0]
        picked = self.g.node("Gather", [rows, "logits_index"], axis=0)[0]
        if cfg.tie_word_embeddings and q is not None:  # the head's own QMatMul copy of the table, or its own weights
            own = self.head_weights(emb)
            logits = self.qmatmul(picked, "lm_head", q if own is None else own, None)
        elif cfg.tie_word_embeddings:
            logits = self.g.node("Gemm", [picked, table], transB=1, name="lm_head")[0]
        else:
            if q is None:
                self.g.initializers.pop(0)  # the table is only gathered from (by the runtime), not a graph weight
            w = self.tensors["lm_head.weight"]
            logits = self.linear(picked, "lm_head", w, q=self.head_weights(w))
        self.g.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits"))
        inputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, "seq", cfg.hidden_size]),
                  helper.make_tensor_value_info("logits_index", TensorProto.INT64, ["rows"])]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["rows", cfg.vocab_size])]
        graph = helper.make_graph(self.g.nodes, "edge_head", inputs, outputs, self.g.initializers)
        return _model(graph, self.opt.kernels == "edge"), embedding

    def quantized_table(self, q) -> dict[str, Any]:
        """Store the low-bit table in MatMulNBits' layout, outside the graph: only the runtime reads it (a row at a
        time, through a memory map), so it never becomes resident."""
        p = q.to_matmulnbits()
        if p.get("group_offsets") is not None or p.get("outliers") is not None or p["bits"] != 4:
            raise ModelFormatError("a paged embedding table must be 4-bit with integer zero points (no offsets or "
                                   "outliers): quantize it with RTN int4")
        entry: dict[str, Any] = {"file": HEAD_DATA, "format": "matmulnbits", "bits": p["bits"],
                                 "block_size": p["block_size"], "shape": [p["N"], p["K"]], "dtype": "float32"}
        for key, array in (("qweight", p["B"]), ("scales", p["scales"].astype(np.float32)),
                           ("zero_points", p["zero_points"])):
            entry[key] = _external_entry(self.data.tensor(f"model.embed_tokens.{key}", array))
        return entry


def _model(graph: onnx.GraphProto, edge_ops: bool = False) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    if edge_ops:
        from edge.kernels.library import DOMAIN

        opsets.append(helper.make_opsetid(DOMAIN, 1))
    return helper.make_model(graph, opset_imports=opsets, producer_name="edge", ir_version=IR_VERSION)


def _external_entry(t: TensorProto) -> dict[str, Any]:
    info = {e.key: e.value for e in t.external_data}
    dtype = helper.tensor_dtype_to_np_dtype(t.data_type).name
    return {"file": info["location"], "offset": int(info["offset"]), "shape": list(t.dims), "dtype": dtype}


PAGEABLE = ("llama", "gemma3")


def check_pageable(config: ModelConfig, options: BuildOptions) -> None:
    """Every layer's weights must have one layout (checked again as they are written), and weights fed as inputs
    must be float or edge.QMatMul's (see the module docstring)."""
    if config.architecture not in PAGEABLE:
        raise ModelFormatError(f"weight paging supports {', '.join(PAGEABLE)} layers, not {config.architecture}: "
                               f"export it resident")
    if options.quantizer is not None and options.kernels != "edge":
        raise ModelFormatError("quantized weights fed as graph inputs lose MatMulNBits' fast path (10-80x slower): "
                               "export a paged low-bit package with kernels='edge' (edge-export --kernels edge), or "
                               "use quant='fp32'")


def build_paged(config: ModelConfig, tensors, out_dir: Path, options: BuildOptions | None = None,
                progress: Callable[[int], None] = lambda n: None) -> dict[str, Any]:
    """Write the four files of the module docstring into out_dir; return the manifest's `paging` section."""
    options = options or BuildOptions()
    check_pageable(config, options)
    out_dir = Path(out_dir)
    writer = LayerWriter(out_dir / LAYER_DATA)
    layout: list[dict[str, Any]] | None = None
    graphs: dict[bool, onnx.ModelProto] = {}  # sliding or not -> its layer graph (Gemma 3 has both kinds)
    try:
        for i in range(config.num_layers):
            writer.begin_layer()
            graph = LayerBuilder(config, tensors, writer, options, i).build_layer()
            graphs.setdefault(config.is_sliding_layer(i), graph)
            if layout is None:
                layout = writer.tensors
            elif writer.tensors != layout:
                raise ModelFormatError(f"layer {i}'s weights differ in shape or order from layer 0's; "
                                       f"this model cannot be paged with one weight layout")
            progress(1)
    finally:
        data_bytes = writer.close()
    names = {False: LAYER_GRAPH, True: SLIDING_LAYER_GRAPH}
    for sliding, graph in graphs.items():
        onnx.save_model(graph, out_dir / names[sliding])
    data = ExternalData(out_dir / HEAD_DATA)
    try:
        head, embedding = HeadBuilder(config, tensors, data, options).build_head()
    finally:
        data.close()
    onnx.save_model(head, out_dir / HEAD_GRAPH)
    progress(1)
    offsets = writer.layer_offsets
    stride = offsets[1] - offsets[0] if len(offsets) > 1 else data_bytes
    section = {"layer_graph": names[next(iter(graphs))] if len(graphs) == 1 else LAYER_GRAPH,
               "layer_data": LAYER_DATA, "layer_offsets": offsets, "layer_bytes": stride, "tensors": layout,
               "embedding": embedding}
    if len(graphs) > 1:  # which layers run the sliding-window graph
        section["sliding_layer_graph"] = SLIDING_LAYER_GRAPH
        section["sliding_layers"] = [i for i in range(config.num_layers) if config.is_sliding_layer(i)]
    return section


def paged_build_options(quant: str, kernels: str, tree_attention: bool, rope_cache_len: int | None,
                        accuracy_level: int | None = None) -> tuple[BuildOptions, dict[str, Any]]:
    """Build options and the manifest's quantization entry: fp32, or int4 RTN (block 32, integer zero points, 4-bit
    embedding) on edge.QMatMul, with export_model's choices, so a paged package computes what the resident one does.

    accuracy_level: edge.QMatMul's activations, 0 (the default, as in export_model: x kept to 23 bits) or 4 (int8
    per group, faster, ~0.5% matmul error)."""
    from edge.export.pipeline import build_options

    if quant not in ("fp32", "int4"):
        raise ModelFormatError(f"a paged package is fp32 or int4, not {quant!r}")
    if quant == "int4" and kernels != "edge":
        raise ModelFormatError("a paged int4 package needs kernels='edge' (edge-export --quant int4 --kernels edge "
                               "--paged): MatMulNBits is 10-80x slower with its weights fed as inputs")
    options, info = build_options(quant, tree_attention)
    options = replace(options, rope_cache_len=rope_cache_len)
    if quant == "int4":
        level = 0 if accuracy_level is None else accuracy_level
        options = replace(options, kernels="edge", accuracy_level=level)
        info = {**info, "accuracy_level": level, "kernels": "edge",
                "embedding": "int4, MatMulNBits layout, gathered by the runtime"}
    return options, info


def export_paged(model: ImportedModel, out_dir: str | os.PathLike, tree_attention: bool = True,
                 overwrite: bool = False, rope_cache_len: int | None = None,
                 progress: Callable[[int], None] = lambda n: None, quant: str = "fp32",
                 kernels: str = "stock", accuracy_level: int | None = None, head: str | None = None) -> Path:
    """Export an imported model as a paged package (atomically, like export_model): fp32, or int4 with
    kernels='edge' (edge.QMatMul takes its packed weights as inputs at full speed; see paged_build_options).
    head: the output head's quantization, as export_model's (a calibrated GPTQ head by default where it applies)."""
    from edge.export.pipeline import calibrated_head, choose_head, table_bits

    cfg = model.config
    options, quant_info = paged_build_options(quant, kernels, tree_attention, rope_cache_len, accuracy_level)
    if choose_head(head, model, quant, options.kernels, table_bits(quant, None, None)) == "gptq":
        options = calibrated_head(model, options, quant_info, progress=False)
    with atomic_package_dir(Path(out_dir), overwrite=overwrite) as tmp:
        paging = build_paged(cfg, model.tensors, tmp, options, progress)
        (tmp / "tokenizer.json").write_text(model.tokenizer_json, encoding="utf-8")
        write_manifest(tmp, {
            "name": model.source.get("name") or Path(out_dir).name,
            "config": cfg.to_dict(),
            "graph": {"file": HEAD_GRAPH, "data": HEAD_DATA, "tree_attention": tree_attention,
                      "kv_dtype": "float32", "custom_ops": ["edge"] if options.kernels == "edge" else [],
                      "accuracy_level": options.accuracy_level},
            "paging": paging,
            "quantization": quant_info,
            "tokenizer": {"file": "tokenizer.json", **vars(model.special_tokens)},
            "chat_template": model.chat_template,
            "source": {**model.source, "exported_by": f"edge {__version__}",
                       "exported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
        })
    return Path(out_dir)
