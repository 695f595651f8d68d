"""The paged package layout: one decoder layer's graph serves every layer, its weights fed as graph inputs.

Weight paging (edge/paging.py) keeps only a window of layers in memory and reads the others from disk while the
current ones compute. onnxruntime cannot swap an initializer under a live session, so the layers' weights become
inputs of one small layer graph, bound per layer (IOBinding, by pointer) to the slot that holds that layer's weights.
Paged packages are float32: MatMulNBits with weights as inputs loses its prepacked fast path on the CPU (10-80x
slower), while float MatMul with its weight as an input runs at normal speed.

    layer.onnx         one layer: hidden (1,S,H), position_ids, seqlens_k, total_sequence_length,
                       [attention_bias], past_key, past_value and the layer's weights as inputs ->
                       hidden_out (1,S,H), present_key, present_value (in place, as in the resident graph)
    layers.onnx.data   every layer's weights, layer after layer, each layer and each tensor page-aligned, in the
                       same order and relative offsets for every layer
    model.onnx         the head: hidden (1,S,H), logits_index (R,) -> final RMSNorm -> logits (R, vocab), with its
                       weights resident (constant initializers in model.onnx.data)
    model.onnx.data    the head's weights and the token embedding table (the runtime gathers embedding rows from it
                       through a memory map; a tied head reads the same table)

The manifest's `paging` section indexes all of it (see `paging_manifest`), so the runtime and the memory planner
never parse the layer data.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge import __version__
from edge.config import ModelConfig
from edge.errors import ModelFormatError
from edge.export.builder import DATA_ALIGN, IR_VERSION, OPSET, BuildOptions, DecoderBuilder, ExternalData
from edge.export.source import ImportedModel
from edge.package import atomic_package_dir, write_manifest

LAYER_GRAPH, LAYER_DATA = "layer.onnx", "layers.onnx.data"
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
        cfg, i, p = self.cfg, self.layer, self.prefix
        rope = self.rope_caches()[cfg.rope_theta]
        hidden = self.rms_norm("hidden", f"{p}input_layernorm.weight")
        attn = self.attention(i, hidden, rope)
        hidden, residual = self.skip_rms_norm(attn, "hidden", f"{p}post_attention_layernorm.weight")
        self.g.node("Add", [self.mlp(i, hidden), residual], outputs=["hidden_out"], name="residual")
        self._rename({f"past_key.{i}": "past_key", f"past_value.{i}": "past_value",
                      f"present_key.{i}": "present_key", f"present_value.{i}": "present_value"})
        return self._layer_model()

    def _rename(self, names: dict[str, str]) -> None:
        for node in self.g.nodes:
            node.input[:] = [names.get(n, n) for n in node.input]
            node.output[:] = [names.get(n, n) for n in node.output]

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
        return _model(graph)


class HeadBuilder(DecoderBuilder):
    """Final RMSNorm and the output head over the hidden rows asked for; also stores the embedding table."""

    def build_head(self) -> tuple[onnx.ModelProto, dict[str, Any]]:
        cfg = self.cfg
        table = self.weight("model.embed_tokens.weight", self.tensors["model.embed_tokens.weight"].astype(np.float32))
        embedding = _external_entry(self.g.initializers[-1])
        hidden = self.rms_norm("hidden", "model.norm.weight")
        rows = self.g.node("Reshape", [hidden, self.const("hidden.flat", [-1, cfg.hidden_size])])[0]
        picked = self.g.node("Gather", [rows, "logits_index"], axis=0)[0]
        if cfg.tie_word_embeddings:
            logits = self.g.node("Gemm", [picked, table], transB=1, name="lm_head")[0]
        else:
            self.g.initializers.pop(0)  # the table is only gathered from (by the runtime), not a graph weight
            logits = self.linear(picked, "lm_head", self.tensors["lm_head.weight"])
        self.g.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits"))
        inputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, "seq", cfg.hidden_size]),
                  helper.make_tensor_value_info("logits_index", TensorProto.INT64, ["rows"])]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["rows", cfg.vocab_size])]
        graph = helper.make_graph(self.g.nodes, "edge_head", inputs, outputs, self.g.initializers)
        return _model(graph), embedding


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                   helper.make_opsetid("com.microsoft", 1)],
                             producer_name="edge", ir_version=IR_VERSION)


def _external_entry(t: TensorProto) -> dict[str, Any]:
    info = {e.key: e.value for e in t.external_data}
    return {"file": info["location"], "offset": int(info["offset"]), "shape": list(t.dims), "dtype": "float32"}


def check_pageable(config: ModelConfig, options: BuildOptions) -> None:
    """One layer graph must fit every layer, and weights fed as inputs must be float (see the module docstring)."""
    if any(config.is_sliding_layer(i) for i in range(config.num_layers)) or config.architecture != "llama":
        raise ModelFormatError(f"weight paging needs a model whose layers are all alike (Llama-style); "
                               f"{config.architecture} mixes sliding-window and global layers: export it resident")
    if options.quantizer is not None:
        raise ModelFormatError("a paged package is float32: quantized weights fed as graph inputs lose "
                               "MatMulNBits' fast path; export with quant='fp32' for paging")


def build_paged(config: ModelConfig, tensors, out_dir: Path, options: BuildOptions | None = None,
                progress: Callable[[int], None] = lambda n: None) -> dict[str, Any]:
    """Write the four files of the module docstring into out_dir; return the manifest's `paging` section."""
    options = options or BuildOptions()
    check_pageable(config, options)
    out_dir = Path(out_dir)
    writer = LayerWriter(out_dir / LAYER_DATA)
    layout: list[dict[str, Any]] | None = None
    try:
        for i in range(config.num_layers):
            writer.begin_layer()
            builder = LayerBuilder(config, tensors, writer, options, i)
            graph = builder.build_layer()
            if layout is None:
                layout, layer_graph = writer.tensors, graph
            elif writer.tensors != layout:
                raise ModelFormatError(f"layer {i}'s weights differ in shape or order from layer 0's; "
                                       f"this model cannot be paged with one layer graph")
            progress(1)
    finally:
        data_bytes = writer.close()
    onnx.save_model(layer_graph, out_dir / LAYER_GRAPH)
    data = ExternalData(out_dir / HEAD_DATA)
    try:
        head, embedding = HeadBuilder(config, tensors, data, options).build_head()
    finally:
        data.close()
    onnx.save_model(head, out_dir / HEAD_GRAPH)
    progress(1)
    offsets = writer.layer_offsets
    stride = offsets[1] - offsets[0] if len(offsets) > 1 else data_bytes
    return {"layer_graph": LAYER_GRAPH, "layer_data": LAYER_DATA, "layer_offsets": offsets, "layer_bytes": stride,
            "tensors": layout, "embedding": embedding}


def export_paged(model: ImportedModel, out_dir: str | os.PathLike, tree_attention: bool = True,
                 overwrite: bool = False, rope_cache_len: int | None = None,
                 progress: Callable[[int], None] = lambda n: None) -> Path:
    """Export an imported model as a paged float32 package (atomically, like export_model)."""
    cfg = model.config
    options = BuildOptions(tree_attention=tree_attention, rope_cache_len=rope_cache_len)
    with atomic_package_dir(Path(out_dir), overwrite=overwrite) as tmp:
        paging = build_paged(cfg, model.tensors, tmp, options, progress)
        (tmp / "tokenizer.json").write_text(model.tokenizer_json, encoding="utf-8")
        write_manifest(tmp, {
            "name": model.source.get("name") or Path(out_dir).name,
            "config": cfg.to_dict(),
            "graph": {"file": HEAD_GRAPH, "data": HEAD_DATA, "tree_attention": tree_attention,
                      "kv_dtype": "float32", "custom_ops": []},
            "paging": paging,
            "quantization": {"method": "fp32", "bits": 32},
            "tokenizer": {"file": "tokenizer.json", **vars(model.special_tokens)},
            "chat_template": model.chat_template,
            "source": {**model.source, "exported_by": f"edge {__version__}",
                       "exported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
        })
    return Path(out_dir)
