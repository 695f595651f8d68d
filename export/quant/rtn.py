"""Round-to-nearest: per-block min/max grid, no calibration. The baseline every other method must beat."""

from __future__ import annotations

import numpy as np

from edge.export.quant import QuantizationError
from edge.export.quant.grid import check_bits, lattice_params, minmax_params, quantize
from edge.export.quant.packing import num_blocks
from edge.export.quant.qlinear import QuantizedLinear

__all__ = ["QuantizedLinear", "quantize_rtn", "check_weight"]


def check_weight(w: np.ndarray) -> np.ndarray:
    """A finite 2-D float weight (out_features, in_features) as float32, or a clear error."""
    w = np.asarray(w)
    if w.ndim != 2 or w.shape[0] == 0 or w.shape[1] == 0:
        raise QuantizationError(f"expected a non-empty 2-D weight (out_features, in_features), got shape {w.shape}")
    w = w.astype(np.float32, copy=False)
    if not np.isfinite(w).all():
        raise QuantizationError("the weight contains NaN or infinity; the source model is corrupt")
    return w


# Rows quantized at a time: every row's blocks are independent, and the float temporaries of a whole matrix at once
# (a division, a sum, a rounding and a clip, each the matrix's size; float64 with float zeros) took Gemma 3's
# 262,144 x 640 embedding to a 3.5 GB peak for a 671 MB weight.
CHUNK_ROWS = 8192


def quantize_rtn(
    w: np.ndarray, bits: int, block_size: int, float_zero: bool = False, lattice: bool = False
) -> QuantizedLinear:
    """Asymmetric round-to-nearest in blocks of `block_size` input columns (block_size >= K: one per channel).

    Default: min/max grid widened to contain 0, integer zero points (MatMulNBits' uint8), the classic baseline.
    float_zero: the grid spans each block's own values, zero points are fractional (-> integer zero + group offset);
    blocks already on a grid of 2**bits levels (a Q4_1/Q4_K GGUF source at bits=4) are reproduced exactly.
    lattice (integer zeros only): blocks on a grid through 0 (a Q8_0 source at bits=8) are reproduced exactly.
    """
    w = check_weight(w)
    check_bits(bits)
    if block_size < 1:
        raise QuantizationError(f"block_size must be positive, got {block_size}")
    k = w.shape[1]
    block_size = min(block_size, k) if block_size >= k else block_size
    parts = [_grid(w[r:r + CHUNK_ROWS], bits, block_size, float_zero, lattice) for r in range(0, len(w), CHUNK_ROWS)]
    codes, scale, zero = (np.concatenate([p[i] for p in parts]) for i in range(3))
    if float_zero:
        return QuantizedLinear.from_float_zeros(codes, scale, zero, bits, block_size, method="rtn")
    return QuantizedLinear(
        codes=codes,
        scales=scale.astype(np.float32),
        zeros=zero.astype(np.uint8),
        bits=bits,
        block_size=block_size,
        method="rtn",
    )


def _grid(w: np.ndarray, bits: int, block_size: int, float_zero: bool, lattice: bool) -> tuple[np.ndarray, ...]:
    """Codes (uint8), scales and zeros of some rows: quantize_rtn's grid, row by row the same whatever the chunk."""
    n, k = w.shape
    kb = num_blocks(k, block_size)
    padded = np.zeros((n, kb * block_size), dtype=np.float32)
    padded[:, :k] = w
    blocks = padded.reshape(n, kb, block_size)
    if float_zero or lattice:
        # a short last block is padded with zeros, which must not count as values of the block
        blocks = blocks.astype(np.float64)
        if kb * block_size != k:
            blocks[:, -1, k - (kb - 1) * block_size :] = blocks[:, -1, :1]
        scale, zero, _ = lattice_params(blocks, bits, through_zero=not float_zero)
    else:
        scale, zero = minmax_params(blocks, bits)
    codes = quantize(blocks, scale[..., None], zero[..., None], bits).reshape(n, kb * block_size)[:, :k]
    return codes.astype(np.uint8), scale, zero
