"""source file -> ImportedModel -> graph + weights -> package folder, atomically.

`export_model` is what `edge-export` and the default-model cache call; it owns the manifest's content.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edge import __version__
from edge.export.builder import BuildOptions, build_decoder, build_steps
from edge.export.quant import QuantizationError
from edge.export.source import ImportedModel
from edge.package import atomic_package_dir, write_manifest

QUANT_METHODS = ("fp32", "int4", "spqr", "decoupleq")
ZERO_POINTS = ("integer", "float")
CALIBRATED = ("spqr", "decoupleq")
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def rtn_quantizer(bits: int, block_size: int, float_zero: bool = False,
                  embedding_bits: int | None = None) -> Callable[[str, np.ndarray], Any]:
    """Round-to-nearest for every linear layer and the embedding: the baseline the quantization issue improves on.

    float_zero: fractional zero points (MatMulNBits' integer zeros + a group-offset term, or edge.QMatMul's float
    zeros), so weights already on a 4-bit block grid (Q4_1/Q4_K GGUF sources) come through unchanged.
    embedding_bits: the gathered embedding / tied head, which can hold integer zeros only; with float_zero or an
    explicit width it is fitted to its own grid (a Q8_0 table is exact at 8 bits).
    """
    from edge.export.quant.bits import BitTally
    from edge.export.quant.rtn import quantize_rtn

    tally = BitTally()  # bits per weight of the linear layers (not the embedding), as the calibrated methods count

    def quantize(name: str, w: np.ndarray):
        w = np.asarray(w, dtype=np.float32)
        if name == "model.embed_tokens":
            if float_zero or embedding_bits:
                return quantize_rtn(w, embedding_bits or bits, block_size, lattice=True)
            return quantize_rtn(w, bits=bits, block_size=block_size)
        q = quantize_rtn(w, bits=bits, block_size=block_size, float_zero=float_zero)
        tally.add(q)
        return q

    quantize.tally = tally
    return quantize


def embedding_quantizer(bits: int | None) -> Callable[[str, np.ndarray], Any]:
    """The embedding (and tied head) of the calibrated methods: RTN with integer zeros, which GatherBlockQuantized
    reads; 4-bit by default (the historical choice), 8-bit reproduces a Q8_0 GGUF table exactly."""
    return rtn_quantizer(bits, 32, embedding_bits=bits) if bits and bits != 4 else rtn_quantizer(4, 32)


def calibrated_quantizer(imported: ImportedModel, method: str, bits: int | None, group_size: int | None,
                         progress: bool, zeros: str | None = None, embedding_bits: int | None = None,
                         **spec_overrides: Any) -> tuple[Callable[[str, np.ndarray], Any], dict[str, Any]]:
    """SpQR or decoupleQ for every decoder linear (calibrated layer by layer on text that ships with Python), and
    RTN for the embedding and tied head, which GatherBlockQuantized reads and which has no room for offsets or
    outliers.

    Defaults: float zero points for both methods (SpQR's come from its quantized second-level zeros; measured on
    SmolLM2 they cut SpQR-4's perplexity loss from +17% to +3%), and an 8-bit embedding for SpQR, the near-lossless
    method (a 4-bit embedding alone costs ~8% perplexity on SmolLM2, whose GGUF table is Q8_0); 4-bit for decoupleQ.
    """
    from edge.export.quant.methods import QuantSpec, quantize_model
    from edge.export.quant.qlinear import concat_rows
    from edge.tokenizer import Tokenizer

    zeros = zeros or "float"
    spec_overrides.setdefault("float_zero" if method != "decoupleq" else "integer_zeros",
                              (zeros == "float") == (method != "decoupleq"))
    if embedding_bits is None:
        embedding_bits = 8 if method == "spqr" else 4
    spec = QuantSpec(method=method, bits=bits or (4 if method == "spqr" else 2), group_size=group_size,
                     **spec_overrides)
    encode = Tokenizer(imported.tokenizer_json).encode
    bar = _progress_bar(imported.config.num_layers, f"calibrating {method} {spec.bits}-bit", progress)
    layers, record = quantize_model(imported, spec, lambda text: encode(text, add_special_tokens=False),
                                    progress=bar.update)
    bar.close()
    embedding = embedding_quantizer(embedding_bits)

    def quantize(name: str, w: np.ndarray):
        prefix, _, leaf = name.rpartition(".")
        parts = [f"{prefix}.{part}.weight" for part in FUSED.get(leaf, (leaf,))]
        if all(p in layers for p in parts):
            return concat_rows([layers[p] for p in parts]) if len(parts) > 1 else layers[parts[0]]
        return embedding(name, w)

    return quantize, {**record, "method": method,
                      "embedding": f"rtn int{embedding_bits or 4} block 32 (GatherBlockQuantized)"}


def build_options(quant: str, tree_attention: bool, zeros: str | None = None,
                  embedding_bits: int | None = None) -> tuple[BuildOptions, dict[str, Any]]:
    """zeros="float" (int4): float zero points and, unless embedding_bits says otherwise, an 8-bit embedding, so a
    Q4_1 GGUF source (Q8_0 embedding) is reproduced exactly; the stock form pays an extra small matmul per layer."""
    if quant == "fp32":
        return BuildOptions(tree_attention=tree_attention), {"method": "fp32", "bits": 32}
    if quant == "int4":
        float_zero = zeros == "float"
        emb_bits = embedding_bits or (8 if float_zero else 4)
        opts = BuildOptions(quantizer=rtn_quantizer(4, 32, float_zero, emb_bits if emb_bits != 4 else None),
                            tree_attention=tree_attention)
        return opts, {"method": "rtn", "bits": 4, "block_size": 32, "accuracy_level": opts.accuracy_level,
                      "zero_points": "float (uint8 + group offsets)" if float_zero else "uint8",
                      "embedding": f"GatherBlockQuantized int{emb_bits}"}
    raise ValueError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANT_METHODS)}")


def check_kv_dtype(options: BuildOptions) -> None:
    """A float16 cache needs edge.Attention: GroupQueryAttention keeps its cache in the query's type (float32)."""
    from edge.kernels.graph import KV_TYPES

    if options.kv_dtype not in KV_TYPES:
        raise QuantizationError(f"unknown KV cache type {options.kv_dtype!r}; choose one of {', '.join(KV_TYPES)}")
    if options.kv_dtype != "float32" and options.kernels != "edge":
        raise QuantizationError(f"--kv-dtype {options.kv_dtype} needs --kernels edge: onnxruntime's "
                                "GroupQueryAttention keeps the cache in float32 with float32 activations")


def table_bits(quant: str, zeros: str | None, embedding_bits: int | None) -> int:
    """Width of the quantized embedding table (and of a tied head that reads it): build_options' and
    calibrated_quantizer's defaults."""
    if embedding_bits:
        return embedding_bits
    return 8 if (quant == "int4" and zeros == "float") or quant == "spqr" else 4


def choose_head(head: str | None, imported: ImportedModel, quant: str, kernels: str, width: int) -> str:
    """How the output head is quantized: "gptq" (its own weights, calibrated: export/quant/head.py) or "rtn" (tied:
    it reads the table; untied: as a linear layer). Checked before any calibration runs.

    head=None picks GPTQ wherever it applies and pays: a quantized Llama-style or Gemma 3 model whose head holds
    weights of its own at run time (untied, or tied on edge.QMatMul) at fewer than 8 bits (an 8-bit table is already lossless
    for a Q8_0 source). "gptq" where it cannot apply is an error that says why."""
    from edge.export.quant.head import HEAD_METHODS, supports_calibrated_head

    if head is not None and head not in HEAD_METHODS:
        raise QuantizationError(f"unknown head quantization {head!r}; choose one of {', '.join(HEAD_METHODS)}")
    own = not imported.config.tie_word_embeddings or kernels == "edge"
    if head is None:
        return "gptq" if quant != "fp32" and own and width < 8 and supports_calibrated_head(imported) else "rtn"
    if head == "gptq" and quant == "fp32":
        raise QuantizationError("--head gptq applies to quantized exports, not fp32")
    if head == "gptq" and not own:
        raise QuantizationError("a tied head on stock ops reads the embedding table itself, so it cannot be quantized "
                                "on its own: add --kernels edge, or use --head rtn")
    if head == "gptq" and not supports_calibrated_head(imported):
        raise QuantizationError(f"a calibrated (gptq) head needs a Llama-style or Gemma 3 model, not "
                                f"{imported.config.architecture!r}; export with --head rtn")
    return head


def calibrated_head(imported: ImportedModel, options: BuildOptions, quant_info: dict[str, Any],
                    progress: bool) -> BuildOptions:
    """Calibrate the head's GPTQ quantizer (one forward pass of the float model), record it in quant_info and
    return the options that use it."""
    from edge.export.quant.head import gptq_head
    from edge.tokenizer import Tokenizer

    encode = Tokenizer(imported.tokenizer_json).encode
    bar = _progress_bar(imported.config.num_layers, "calibrating the output head", progress)
    quantize, quant_info["head"] = gptq_head(imported, lambda text: encode(text, add_special_tokens=False),
                                             progress=bar.update)
    bar.close()
    return dataclasses.replace(options, head_quantizer=quantize)


def export_model(source: str | os.PathLike, out_dir: str | os.PathLike, quant: str = "int4",
                 tree_attention: bool = True, overwrite: bool = False, progress: bool = False,
                 model: ImportedModel | None = None, bits: int | None = None, group_size: int | None = None,
                 zeros: str | None = None, embedding_bits: int | None = None, stat_bits: int | None = None,
                 head: str | None = None, draft_head: str | os.PathLike | None = None,
                 **build_overrides: Any) -> Path:
    """Export `source` (a GGUF file or a Hugging Face folder) into the package folder `out_dir`.

    bits/group_size apply to the calibrated methods (spqr: 3 or 4 bits, groups of 16; decoupleq: 2-4 bits, groups
    of 64; stat_bits: the width of SpQR's quantized scales and zeros, default 3). zeros ("integer" | "float")
    picks the zero points (int4 default integer; see build_options), embedding_bits (4 or 8) the width of the
    gathered embedding / tied head, head ("rtn" | "gptq"; default: gptq where it applies, see choose_head) the
    output head's own quantization, draft_head a trained draft head's weights (.npz, export/draft_head.py) to
    build beside the model. build_overrides replace BuildOptions fields (e.g. fuse_projections=False) for
    experiments and benchmarks.
    """
    if zeros is not None and zeros not in ZERO_POINTS:
        raise QuantizationError(f"unknown zero points {zeros!r}; choose one of {', '.join(ZERO_POINTS)}")
    if embedding_bits is not None and embedding_bits not in (4, 8):
        raise QuantizationError(f"embedding_bits must be 4 or 8, not {embedding_bits}")
    if stat_bits is not None and quant != "spqr":
        raise QuantizationError("--stat-bits applies to --quant spqr (the width of its quantized statistics)")
    if zeros is not None and quant == "fp32":
        raise QuantizationError("--zeros applies to quantized exports, not fp32")
    if model is None:
        from edge.export.load import load_model

        model = load_model(source)
    imported = model
    head_weights = None
    if draft_head is not None:
        from edge.export.draft_head import DraftHeadWeights

        head_weights = DraftHeadWeights.load(draft_head)
        head_weights.check(imported.config, imported.tokenizer_json)
    head = choose_head(head, imported, quant, build_overrides.get("kernels", "stock"),
                       table_bits(quant, zeros, embedding_bits))
    if quant in CALIBRATED:
        overrides = {} if stat_bits is None else {"stat_bits": stat_bits}
        quantizer, quant_info = calibrated_quantizer(imported, quant, bits, group_size, progress, zeros,
                                                     embedding_bits, **overrides)
        options = BuildOptions(quantizer=quantizer, tree_attention=tree_attention)
    else:
        options, quant_info = build_options(quant, tree_attention, zeros, embedding_bits)
    if build_overrides.get("kernels") == "edge" and "accuracy_level" not in build_overrides:
        build_overrides = {**build_overrides, "accuracy_level": 0}  # edge kernels: exact unless asked
    options = dataclasses.replace(options, **build_overrides)
    check_kv_dtype(options)
    if head == "gptq":
        options = calibrated_head(imported, options, quant_info, progress)
    cfg = imported.config
    bar = _progress_bar(build_steps(cfg), f"exporting {Path(source).name} ({quant})", progress)
    with atomic_package_dir(Path(out_dir), overwrite=overwrite) as tmp:
        build_decoder(cfg, imported.tensors, tmp, options, progress=bar.update)
        graph_extras = {}
        if head_weights is not None:
            from edge.export.draft_head import build_draft_head, manifest_entry

            # round-to-nearest in the package's weight form, kept out of the model's bits-per-weight tally (a
            # calibrated method has no statistics for the head's layers)
            rtn = None if options.quantizer is None else rtn_quantizer(4, 32, float_zero=options.kernels == "edge")
            build_draft_head(cfg, imported.tensors, head_weights, tmp,
                             dataclasses.replace(options, quantizer=rtn, layers=None))
            graph_extras["draft_head"] = manifest_entry(head_weights)
        if quant == "int4" and hasattr(options.quantizer, "tally"):
            quant_info.update(options.quantizer.tally.record())
        if options.kernels == "edge" and "runtime_bits_per_weight" in quant_info:
            quant_info["runtime_bits_per_weight"], mins = qmatmul_runtime_bits(tmp / "model.onnx")
            if str(quant_info.get("zero_points", "")).startswith("float"):
                quant_info["zero_points"] = "float16 scale and min (edge.QMatMul)" if mins else "float32 (edge.QMatMul)"
        (tmp / "tokenizer.json").write_text(imported.tokenizer_json, encoding="utf-8")
        write_manifest(tmp, {
            "name": imported.source.get("name") or Path(source).stem,
            "config": cfg.to_dict(),
            "graph": {"file": "model.onnx", "data": "model.onnx.data", "tree_attention": tree_attention,
                      "kv_dtype": options.kv_dtype, "custom_ops": ["edge"] if options.kernels == "edge" else [],
                      "accuracy_level": options.accuracy_level, **kernel_features(tmp / "model.onnx"), **graph_extras},
            "quantization": quant_info,
            "tokenizer": {"file": "tokenizer.json", **vars(imported.special_tokens)},
            "chat_template": imported.chat_template,
            "source": {**imported.source, "exported_by": f"edge {__version__}",
                       "exported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
        })
    bar.close()
    return Path(out_dir)


def qmatmul_runtime_bits(graph: Path) -> tuple[float, bool]:
    """Bits per weight the decoder's edge.QMatMul layers hold at run time (codes, statistics, outliers; not the
    output head, as the other methods' counts), from the graph itself: the form differs from the stock one. And
    whether any layer stores (scale, min) pairs rather than zero points."""
    model = onnx.load(str(graph), load_external_data=False)
    sizes = {i.name: i for i in model.graph.initializer}
    bits = weights = 0
    mins = False
    for node in model.graph.node:
        if node.op_type != "QMatMul" or node.name.startswith("lm_head"):
            continue
        attrs = {a.name: a.i for a in node.attribute}
        weights += attrs["K"] * attrs["N"]
        mins = mins or (len(node.input) > 8 and node.input[8] != "")
        for name in node.input[1:12]:  # the weight's tensors: not the norm's skip and weight (inputs 12, 13)
            if name in sizes and not name.endswith(".bias"):
                t = sizes[name]
                count = int(np.prod(t.dims)) if t.dims else 1
                bits += count * 8 * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return (round(bits / weights, 4) if weights else 0.0), mins


def kernel_features(graph: Path) -> dict[str, bool]:
    """What edge.QMatMul nodes do beyond a matmul that changes which buffers a step keeps live, for the memory model:
    fused_mlp, the MLP's gated activation inside (attribute activation); pre_projections, o_proj and down_proj
    inside the node after them (attribute pre_K)."""
    model = onnx.load(str(graph), load_external_data=False)
    used = {a.name for n in model.graph.node if n.op_type == "QMatMul" for a in n.attribute if a.i > 0}
    return {"fused_mlp": "activation" in used, "pre_projections": "pre_K" in used}


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="layer", disable=not enabled, leave=False)
