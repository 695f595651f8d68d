"""One entry point for the exporter: a quantization spec -> every linear layer of a model quantized, plus the facts the
manifest should record (method, settings, calibration text, bits per weight)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edge.export.quant import QuantizationError
from edge.export.quant.bits import runtime_bits_per_weight, storage_bits_per_weight
from edge.export.quant.calibrate import LinearQuantizer, calibrate_and_quantize
from edge.export.quant.calibration_text import token_sequences
from edge.export.quant.decoupleq import DecoupleQConfig, quantize_decoupleq
from edge.export.quant.gptq import quantize_gptq
from edge.export.quant.qlinear import QuantizedLinear
from edge.export.quant.rtn import quantize_rtn
from edge.export.quant.spqr import SpqrConfig, quantize_spqr
from edge.export.source import ImportedModel

DEFAULT_GROUP = {"rtn": 32, "gptq": 32, "spqr": 16, "decoupleq": 64}
ALLOWED_BITS = {"rtn": (2, 3, 4, 8), "gptq": (2, 3, 4, 8), "spqr": (3, 4), "decoupleq": (2, 3, 4)}


@dataclass
class QuantSpec:
    method: str  # rtn | gptq | spqr | decoupleq
    bits: int
    group_size: int | None = None  # None: the method's default; >= K: per output channel
    outlier_threshold: float | None = None  # spqr; None: the per-bits default of SpqrConfig
    rounds: int = 4  # decoupleq
    integer_zeros: bool = False  # decoupleq: True avoids the group-offset term at some accuracy cost
    float_zero: bool = False  # gptq/spqr: min..max grids with fractional zeros (-> group offsets)
    stat_bits: int = 3  # spqr: width of the quantized first-level scales and zeros
    stat_search: bool = True  # spqr: pick the quantized (scale, zero) of each row by weighted error (see spqr.py)
    damp: float = 0.01
    num_sequences: int = 64  # x seq_len tokens of calibration text; 32 gave clearly worse SpQR-3 perplexity
    seq_len: int = 256

    def check(self) -> None:
        if self.method not in ALLOWED_BITS:
            raise QuantizationError(f"unknown quantization method {self.method!r}; choose one of {sorted(ALLOWED_BITS)}")
        if self.bits not in ALLOWED_BITS[self.method]:
            raise QuantizationError(f"{self.method} supports bits {ALLOWED_BITS[self.method]}, not {self.bits}")
        if self.method == "spqr":  # before calibration, not at the first layer
            SpqrConfig(bits=self.bits, stat_bits=self.stat_bits).check()

    @property
    def group(self) -> int:
        return self.group_size or DEFAULT_GROUP[self.method]

    @property
    def calibrated(self) -> bool:
        return self.method != "rtn"


def make_quantizer(spec: QuantSpec) -> LinearQuantizer:
    spec.check()
    if spec.method == "rtn":
        return lambda name, w, h: quantize_rtn(w, spec.bits, spec.group)
    if spec.method == "gptq":
        return lambda name, w, h: quantize_gptq(w, h, spec.bits, spec.group, spec.damp, float_zero=spec.float_zero)
    if spec.method == "spqr":
        cfg = SpqrConfig(bits=spec.bits, group_size=spec.group, outlier_threshold=spec.outlier_threshold,
                         damp=spec.damp, float_zero=spec.float_zero, stat_bits=spec.stat_bits,
                         stat_search=spec.stat_search)
        return lambda name, w, h: quantize_spqr(w, h, cfg)
    cfg = DecoupleQConfig(bits=spec.bits, group_size=spec.group, rounds=spec.rounds, damp=spec.damp,
                          integer_zeros=spec.integer_zeros)
    return lambda name, w, h: quantize_decoupleq(w, h, cfg)


def quantize_model(
    model: ImportedModel,
    spec: QuantSpec,
    encode: Callable[[str], list[int]],
    include_head: bool = False,
    progress: Callable[[int], None] = lambda n: None,
) -> tuple[dict[str, QuantizedLinear], dict[str, Any]]:
    """Quantize every linear layer (and the output head if asked); `encode` tokenizes without special tokens.

    `progress(1)` is called once per decoder layer. Returns the layers by tensor name and the manifest record.
    """
    spec.check()
    start = time.time()
    if spec.calibrated:
        tokens, text_meta = token_sequences(encode, "calibration", spec.num_sequences, spec.seq_len)
        text_meta.pop("window_starts", None)
        layers = calibrate_and_quantize(model, tokens, make_quantizer(spec), include_head, progress)
    else:
        layers, text_meta = _rtn_all(model, spec, include_head, progress), None
    weights = sum(q.codes.size for q in layers.values())
    record = {
        **asdict(spec),
        "group_size": spec.group,
        "calibration": text_meta,
        "storage_bits_per_weight": _weighted(layers, storage_bits_per_weight, weights),
        "runtime_bits_per_weight": _weighted(layers, runtime_bits_per_weight, weights),
        "outlier_fraction": sum(q.outliers.nnz for q in layers.values() if q.outliers) / max(weights, 1),
        "quantize_seconds": round(time.time() - start, 1),
    }
    return layers, record


def _rtn_all(
    model: ImportedModel, spec: QuantSpec, include_head: bool, progress: Callable[[int], None]
) -> dict[str, QuantizedLinear]:
    """No calibration needed: quantize the same tensors the calibrated path does, without a forward pass."""
    quantize = make_quantizer(spec)
    layers = {}
    for i in range(model.config.num_layers):
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            name = f"model.layers.{i}.{part}.weight"
            layers[name] = quantize(name, np.asarray(model.tensors[name], np.float32), None)
        progress(1)
    if include_head:
        name = "lm_head.weight" if "lm_head.weight" in model.tensors else "model.embed_tokens.weight"
        layers[name] = quantize(name, np.asarray(model.tensors[name], np.float32), None)
    return layers


def _weighted(layers: dict[str, QuantizedLinear], fn: Callable[[QuantizedLinear], float], total: int) -> float:
    return float(np.sum([fn(q) * q.codes.size for q in layers.values()]) / max(total, 1))
