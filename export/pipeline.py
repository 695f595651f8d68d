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

from edge import __version__
from edge.export.builder import BuildOptions, build_decoder, build_steps
from edge.export.source import ImportedModel
from edge.package import atomic_package_dir, write_manifest

QUANT_METHODS = ("fp32", "int4", "spqr", "decoupleq")
CALIBRATED = ("spqr", "decoupleq")
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def rtn_quantizer(bits: int, block_size: int) -> Callable[[str, np.ndarray], Any]:
    """Round-to-nearest for every linear layer and the embedding: the baseline the quantization issue improves on."""
    from edge.export.quant.rtn import quantize_rtn

    def quantize(name: str, w: np.ndarray):
        return quantize_rtn(np.asarray(w, dtype=np.float32), bits=bits, block_size=block_size)

    return quantize


def calibrated_quantizer(imported: ImportedModel, method: str, bits: int | None, group_size: int | None,
                         progress: bool) -> tuple[Callable[[str, np.ndarray], Any], dict[str, Any]]:
    """SpQR or decoupleQ for every decoder linear (calibrated layer by layer on text that ships with Python), and
    RTN int4 for the embedding and tied head, which GatherBlockQuantized reads and which has no room for offsets or
    outliers."""
    from edge.export.quant.methods import QuantSpec, quantize_model
    from edge.export.quant.qlinear import concat_rows
    from edge.tokenizer import Tokenizer

    spec = QuantSpec(method=method, bits=bits or (4 if method == "spqr" else 2), group_size=group_size)
    encode = Tokenizer(imported.tokenizer_json).encode
    bar = _progress_bar(imported.config.num_layers, f"calibrating {method} {spec.bits}-bit", progress)
    layers, record = quantize_model(imported, spec, lambda text: encode(text, add_special_tokens=False),
                                    progress=bar.update)
    bar.close()
    embedding = rtn_quantizer(4, 32)

    def quantize(name: str, w: np.ndarray):
        prefix, _, leaf = name.rpartition(".")
        parts = [f"{prefix}.{part}.weight" for part in FUSED.get(leaf, (leaf,))]
        if all(p in layers for p in parts):
            return concat_rows([layers[p] for p in parts]) if len(parts) > 1 else layers[parts[0]]
        return embedding(name, w)

    return quantize, {**record, "method": method, "embedding": "rtn int4 block 32 (GatherBlockQuantized)"}


def build_options(quant: str, tree_attention: bool) -> tuple[BuildOptions, dict[str, Any]]:
    if quant == "fp32":
        return BuildOptions(tree_attention=tree_attention), {"method": "fp32", "bits": 32}
    if quant == "int4":
        opts = BuildOptions(quantizer=rtn_quantizer(4, 32), tree_attention=tree_attention)
        return opts, {"method": "rtn", "bits": 4, "block_size": 32, "accuracy_level": opts.accuracy_level,
                      "zero_points": "uint8", "embedding": "GatherBlockQuantized"}
    raise ValueError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANT_METHODS)}")


def export_model(source: str | os.PathLike, out_dir: str | os.PathLike, quant: str = "int4",
                 tree_attention: bool = True, overwrite: bool = False, progress: bool = False,
                 model: ImportedModel | None = None, bits: int | None = None, group_size: int | None = None,
                 **build_overrides: Any) -> Path:
    """Export `source` (a GGUF file or a Hugging Face folder) into the package folder `out_dir`.

    bits/group_size apply to the calibrated methods (spqr: 3 or 4 bits, groups of 16; decoupleq: 2-4 bits, groups
    of 64). build_overrides replace BuildOptions fields (e.g. fuse_projections=False) for experiments and benchmarks.
    """
    if model is None:
        from edge.export.load import load_model

        model = load_model(source)
    imported = model
    if quant in CALIBRATED:
        quantizer, quant_info = calibrated_quantizer(imported, quant, bits, group_size, progress)
        options = BuildOptions(quantizer=quantizer, tree_attention=tree_attention)
    else:
        options, quant_info = build_options(quant, tree_attention)
    options = dataclasses.replace(options, **build_overrides)
    cfg = imported.config
    bar = _progress_bar(build_steps(cfg), f"exporting {Path(source).name} ({quant})", progress)
    with atomic_package_dir(Path(out_dir), overwrite=overwrite) as tmp:
        build_decoder(cfg, imported.tensors, tmp, options, progress=bar.update)
        (tmp / "tokenizer.json").write_text(imported.tokenizer_json, encoding="utf-8")
        write_manifest(tmp, {
            "name": imported.source.get("name") or Path(source).stem,
            "config": cfg.to_dict(),
            "graph": {"file": "model.onnx", "data": "model.onnx.data", "tree_attention": tree_attention,
                      "kv_dtype": "float32", "custom_ops": ["edge"] if options.kernels == "edge" else []},
            "quantization": quant_info,
            "tokenizer": {"file": "tokenizer.json", **vars(imported.special_tokens)},
            "chat_template": imported.chat_template,
            "source": {**imported.source, "exported_by": f"edge {__version__}",
                       "exported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
        })
    bar.close()
    return Path(out_dir)


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="layer", disable=not enabled, leave=False)
