"""The uniform asymmetric grid every method here shares: w ~ scale * (code - zero), code in [0, 2**bits - 1].

By default the range contains 0 so the zero point is an integer inside the code range, which is what MatMulNBits'
uint8 zero points can hold; `float_zero` grids and `lattice_params` (weights that are already on a grid, as a GGUF
source's are) have fractional zeros or grids through 0 found from the data.
"""

from __future__ import annotations

import numpy as np

from edge.export.quant import QuantizationError

QUANT_BITS = (2, 3, 4, 8)


def check_bits(bits: int) -> None:
    if bits not in QUANT_BITS:
        raise QuantizationError(f"bits={bits} is not supported; choose one of {QUANT_BITS}")


def max_code(bits: int) -> int:
    return (1 << bits) - 1


def minmax_params(
    w: np.ndarray, bits: int, mask: np.ndarray | None = None, axis: int = -1, float_zero: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero of each group along `axis`; entries where mask is False are ignored.

    Default: the range is widened to contain 0 and the zero is an integer code (what uint8 zero points hold).
    float_zero: the grid spans exactly min..max and the zero is fractional; it reaches MatMulNBits as an integer
    zero plus a per-group offset (see qlinear.py). Weights already on a min/max grid (a dequantized Q4_1 model)
    are then representable exactly.
    """
    qmax = max_code(bits)
    if mask is None:
        lo, hi = w.min(axis=axis), w.max(axis=axis)
    else:
        lo = np.where(mask, w, np.inf).min(axis=axis)
        hi = np.where(mask, w, -np.inf).max(axis=axis)
        lo = np.where(np.isfinite(lo), lo, 0.0)
        hi = np.where(np.isfinite(hi), hi, 0.0)
    if not float_zero:
        lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    scale = (hi - lo) / qmax
    if float_zero:  # a constant group: any positive scale, zero chosen so the constant is code 0
        scale = np.where(scale > 0, scale, np.maximum(np.abs(lo), 1e-12))
        return scale, -lo / scale
    scale = np.where(scale > 0, scale, 1.0)
    zero = np.clip(np.round(-lo / scale), 0, qmax)
    return scale, zero


def lattice_params(
    w: np.ndarray, bits: int, through_zero: bool = False, max_divisor: int = 8, tol: float = 1e-3
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scale, zero and `exact` of each group along the last axis: where a group's values already lie on a uniform grid
    of at most 2**bits levels, that grid (so quantizing is lossless), else the min/max grid.

    Why: a model imported from a GGUF file is itself quantized. Q4_1 blocks are min + scale * q with q in 0..15 and
    both extremes used (min/max finds them too); Q4_K sub-blocks often leave q=0 or q=15 unused, so their step is
    found here as a divisor of the smallest gap between distinct values; Q8_0 blocks are d * q, a grid through 0.
    through_zero: the grid must contain 0 (integer zero points, for GatherBlockQuantized); otherwise it is anchored
    at the group's minimum and the zero is fractional (float zero points / group offsets).
    `tol` is the largest distance from the grid, in steps, that still counts as on it (float32 rounding is ~1e-6).
    """
    x = np.asarray(w, dtype=np.float64)
    flat = x.reshape(-1, x.shape[-1])
    scale, zero, exact = np.empty(len(flat)), np.empty(len(flat)), np.empty(len(flat), dtype=bool)
    for s in range(0, len(flat), LATTICE_CHUNK):  # bounded temporaries for a 100M-weight embedding
        part = slice(s, s + LATTICE_CHUNK)
        scale[part], zero[part], exact[part] = _lattice_rows(flat[part], bits, through_zero, max_divisor, tol)
    return scale.reshape(x.shape[:-1]), zero.reshape(x.shape[:-1]), exact.reshape(x.shape[:-1])


LATTICE_CHUNK = 1 << 16


def _lattice_rows(
    x: np.ndarray, bits: int, through_zero: bool, max_divisor: int, tol: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    qmax = max_code(bits)
    points = np.concatenate([x, np.zeros((len(x), 1))], axis=-1) if through_zero else x
    ordered = np.sort(points, axis=-1)
    lo, hi = ordered[:, 0], ordered[:, -1]
    gaps = np.diff(ordered, axis=-1)
    duplicate = 1e-6 * np.maximum(np.abs(lo), np.abs(hi))[:, None]
    min_gap = np.where(gaps > duplicate, gaps, np.inf).min(axis=-1)
    constant = ~np.isfinite(min_gap)  # every value equal (and 0 if through_zero): min/max is already exact
    scale = np.zeros_like(lo)
    open_rows = np.flatnonzero(~constant)
    for divisor in range(1, max_divisor + 1):
        step = min_gap[open_rows] / divisor
        fits = np.round((hi[open_rows] - lo[open_rows]) / step) <= qmax
        rows, step = open_rows[fits], step[fits]
        rel = x[rows] - lo[rows, None]
        codes = np.round(rel / step[:, None])
        # the gap is a difference of two rounded values: refit the step to all of them (least squares through lo),
        # or its relative error, times a span of up to 255 steps, would exceed tol
        step = (codes * rel).sum(axis=-1) / np.maximum(np.square(codes).sum(axis=-1), 1.0)
        hit = np.abs(rel / step[:, None] - codes).max(axis=-1) <= tol
        scale[rows[hit]] = step[hit]
        open_rows = np.setdiff1d(open_rows, rows[hit], assume_unique=True)
        if not len(open_rows):
            break
    exact = scale > 0
    fallback_scale, fallback_zero = minmax_params(x, bits, float_zero=not through_zero)
    zero = -lo / np.where(exact, scale, 1.0)
    if through_zero:
        zero = np.clip(np.round(zero), 0, qmax)
    return np.where(exact, scale, fallback_scale), np.where(exact, zero, fallback_zero), exact | constant


def quantize(w: np.ndarray, scale: np.ndarray, zero: np.ndarray, bits: int) -> np.ndarray:
    """Nearest code on the grid (broadcasting scale/zero against w); float array of integer values.

    The zero may be fractional (decoupleQ solves for it), so it is added before rounding.
    """
    return np.clip(np.round(w / scale + zero), 0, max_code(bits))


def dequantize(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    return scale * (codes - zero)
