"""GPTQ: quantize one input column at a time and push its error onto the columns not yet quantized.

The error of column i, divided by U[i, i] (U the upper Cholesky factor of H^-1), is spread over the later columns with
row i of U; the updates are applied lazily in batches of columns so most of the work is one GEMM per batch. Groups are
contiguous (no act-order), so the result maps to MatMulNBits blocks without a g_idx, which would cost the CPU prepack.

The per-group grid is chosen by a pluggable `fit` so SpQR (outlier-aware fit, second-level statistics) and decoupleQ
(fixed grid) reuse the same loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edge.export.quant import QuantizationError
from edge.export.quant.grid import check_bits, minmax_params, quantize
from edge.export.quant.hessian import check_hessian, damped, inverse_cholesky
from edge.export.quant.packing import num_blocks
from edge.export.quant.qlinear import QuantizedLinear
from edge.export.quant.rtn import check_weight


@dataclass
class GroupGrid:
    scale: np.ndarray  # (N,)
    zero: np.ndarray  # (N,) float; integer-valued unless the method allows float zeros
    outlier_threshold: float | None = None  # weighted squared error above which a weight stays in float


# (current weights of the group (N, g), U diagonal of its columns (g,), group index) -> grid
GroupFit = Callable[[np.ndarray, np.ndarray, int], GroupGrid]


@dataclass
class GptqResult:
    codes: np.ndarray  # float (N, K), integer-valued
    scales: np.ndarray  # (N, k_blocks)
    zeros: np.ndarray  # (N, k_blocks) float
    outliers: np.ndarray  # bool (N, K): weights kept in float
    updated: np.ndarray  # (N, K) the error-compensated weights; at outliers this is the value to keep


def minmax_fit(bits: int, float_zero: bool = False, half_scales: bool = False) -> GroupFit:
    """half_scales: each scale rounded to float16 before the group is quantized, so a kernel storing float16 scales
    holds the grid the error feedback was computed on (it would be 2^-11 off otherwise)."""
    def fit(w: np.ndarray, d: np.ndarray, g: int) -> GroupGrid:
        scale, zero = minmax_params(w, bits, float_zero=float_zero)
        if half_scales:
            scale = np.maximum(scale.astype(np.float16), np.float16(6e-8)).astype(np.float64)
        return GroupGrid(scale, zero)

    return fit


def gptq_core(
    w: np.ndarray, u: np.ndarray, bits: int, group_size: int, fit: GroupFit, lazy_block: int = 32
) -> GptqResult:
    """The column loop. `u` is the upper Cholesky factor of the damped H^-1.

    Works on W^T so that a column of W is a contiguous row; within a batch of `lazy_block` columns the updates are
    rank-1, and the rest of the matrix gets them as one GEMM per batch.
    """
    wt = np.array(w, dtype=np.float64).T.copy()  # (K, N)
    k, n = wt.shape
    group_size = min(group_size, k)
    kb = num_blocks(k, group_size)
    if group_size < k:
        lazy_block = max(group_size, lazy_block // group_size * group_size)  # groups never straddle two batches
    codes = np.zeros((k, n))
    scales, zeros = np.zeros((kb, n)), np.zeros((kb, n))
    outliers = np.zeros((k, n), dtype=bool)
    diag = np.diag(u)
    grid = None
    for i1 in range(0, k, lazy_block):
        i2 = min(i1 + lazy_block, k)
        block, errors, ub = wt[i1:i2], np.zeros((i2 - i1, n)), u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % group_size == 0:
                g = col // group_size
                rows = slice(col, min(col + group_size, k))
                grid = fit(wt[rows].T, diag[rows], g)
                scales[g], zeros[g] = grid.scale, grid.zero
            q = quantize(block[i], grid.scale, grid.zero, bits)
            err = (block[i] - grid.scale * (q - grid.zero)) / ub[i, i]
            if grid.outlier_threshold is not None:
                keep = np.square(err) > grid.outlier_threshold
                err[keep] = 0.0
                outliers[col] = keep
            codes[col] = q
            block[i + 1 :] -= np.outer(ub[i, i + 1 :], err)
            errors[i] = err
        if i2 < k:
            wt[i2:] -= u[i1:i2, i2:].T @ errors
    return GptqResult(codes.T, scales.T, zeros.T, outliers.T, wt.T)


_last_factor: tuple[np.ndarray, float, np.ndarray, np.ndarray] | None = None  # (h, damp, dead, u)


def factor(h: np.ndarray, damp: float) -> tuple[np.ndarray, np.ndarray]:
    """(dead columns, U) of a Hessian; q/k/v (and gate/up) share one Hessian object, so the last one is reused.

    Hessians are treated as immutable: the cache is keyed on the array's identity.
    """
    global _last_factor
    if _last_factor is not None and _last_factor[0] is h and _last_factor[1] == damp:
        return _last_factor[2], _last_factor[3]
    hd, dead = damped(h, damp)
    u = inverse_cholesky(hd)
    _last_factor = (h, damp, dead, u)
    return dead, u


def prepare(w: np.ndarray, h: np.ndarray, damp: float) -> tuple[np.ndarray, np.ndarray]:
    """Checked float32 weight with never-activated columns zeroed, and the inverse Cholesky factor."""
    w = check_weight(w).copy()
    h = check_hessian(h, w.shape[1])
    if not 0 < damp < 1:
        raise QuantizationError(f"damp must be in (0, 1), got {damp}")
    dead, u = factor(h, damp)
    w[:, dead] = 0.0
    return w, u


def quantize_gptq(
    w: np.ndarray,
    h: np.ndarray,
    bits: int,
    block_size: int,
    damp: float = 0.01,
    lazy_block: int = 32,
    float_zero: bool = False,
    half_scales: bool = False,
) -> QuantizedLinear:
    """Plain GPTQ with a min/max grid per block (fixed before the block's columns are quantized)."""
    check_bits(bits)
    w, u = prepare(w, h, damp)
    result = gptq_core(w, u, bits, block_size, minmax_fit(bits, float_zero, half_scales), lazy_block)
    return QuantizedLinear.from_float_zeros(
        result.codes, result.scales, result.zeros, bits, min(block_size, w.shape[1]), method="gptq"
    )
