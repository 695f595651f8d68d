"""The output head, quantized with GPTQ on the float model's own final hidden states.

Why the head gets its own treatment: on SmolLM2-135M (a Q4_1 GGUF whose linears edge.QMatMul keeps bit for bit) all
of the int4 default's perplexity loss came from the 4-bit head re-quantized from the Q8_0 table: +8.8% with
round-to-nearest, +0.9% with an 8-bit head, and the 4-bit embedding rows the gather reads cost only 0.4%. An 8-bit
head costs a memory-bound decode step its extra bytes (measured 0.88x), while GPTQ keeps 4 bits and the kernel's cost
and brings the loss down to about +2% (benchmarks/RESULTS.md, quantized exports). The logits' error is what counts,
so the head's input covariance H = E[h h^T] weights it; collecting H takes one numpy forward pass of the float model
over the calibration text (~30 s for SmolLM2-135M on 2 cores).

Scales are rounded to float16 inside GPTQ (the error feedback sees the grid the kernel holds) and zero points are
integers: edge.QMatMul then stores 3 bytes per group instead of 5.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edge.export.quant.calibrate import CALIBRATORS
from edge.export.quant.calibration_text import token_sequences
from edge.export.quant.gptq import quantize_gptq
from edge.export.quant.qlinear import QuantizedLinear, concat_rows
from edge.export.source import ImportedModel

HEAD_METHODS = ("rtn", "gptq")
SEQUENCES, SEQ_LEN = 32, 256  # 8,192 tokens: 16 sequences gave +2.4% perplexity, 32 and 64 both +2.0%
BITS, GROUP = 4, 32
# GPTQ treats each output row on its own, so a large vocabulary goes through it in blocks of rows: in one piece,
# Gemma 3's 262,144 x 640 head would need ~3.5 GB of float64 working arrays, in blocks ~0.2 GB
ROWS_PER_BLOCK = 16384


def supports_calibrated_head(model: ImportedModel) -> bool:
    """Whether the calibration forward pass knows this architecture (export/quant/calibrate.py: Llama-style and
    Gemma 3)."""
    return model.config.architecture in CALIBRATORS


def head_hessian(model: ImportedModel, tokens: np.ndarray, batch: int = 8,
                 progress: Callable[[int], None] = lambda n: None) -> np.ndarray:
    """E[h h^T] of the head's inputs (the final norm's output) over `tokens` (sequences, length), float weights;
    progress(1) after each layer."""
    captured: dict[str, np.ndarray] = {}

    def keep(name: str, w: np.ndarray, h: np.ndarray | None) -> None:
        captured["h"] = h  # only the head is asked with a Hessian; every layer stays in float

    calibrator = CALIBRATORS[model.config.architecture](model, tokens, keep, batch, hessians=False)
    for i in range(model.config.num_layers):
        calibrator.layer(i)
        progress(1)
    calibrator.hessians = True
    calibrator.head()
    return captured["h"]


def revive_dead_inputs(h: np.ndarray) -> np.ndarray:
    """GPTQ zeroes the weight columns of inputs the calibration never activated; a head must not lose them (text
    unlike the calibration's may use them), so they get the mean activation and no correlation: round-to-nearest
    for those columns, and plain RTN for a degenerate calibration."""
    h = np.array(h, dtype=np.float64)
    diag = np.diag(h)
    dead = diag <= 0
    h[dead, dead] = diag[~dead].mean() if (~dead).any() else 1.0
    return h


def gptq_head(model: ImportedModel, encode: Callable[[str], Sequence[int]], sequences: int = SEQUENCES,
              progress: Callable[[int], None] = lambda n: None
              ) -> tuple[Callable[[np.ndarray], QuantizedLinear], dict[str, Any]]:
    """A quantizer for the head's weight (vocab, hidden), calibrated once here, and the manifest's record of it.
    `encode` tokenizes without special tokens. Architectures of supports_calibrated_head only."""
    start = time.time()
    tokens, _ = token_sequences(encode, "calibration", sequences, SEQ_LEN)
    h = revive_dead_inputs(head_hessian(model, tokens, progress=progress))

    def quantize(w: np.ndarray) -> QuantizedLinear:
        blocks = [quantize_gptq(w[r:r + ROWS_PER_BLOCK], h, BITS, GROUP, half_scales=True)
                  for r in range(0, len(w), ROWS_PER_BLOCK)]
        return concat_rows(blocks) if len(blocks) > 1 else blocks[0]

    record = {"method": "gptq", "bits": BITS, "block_size": GROUP, "calibration_tokens": int(tokens.size),
              "scales": "float16", "calibrate_seconds": round(time.time() - start, 1)}
    return quantize, record
