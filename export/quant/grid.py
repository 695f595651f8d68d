"""The uniform asymmetric grid every method here shares: w ~ scale * (code - zero), code in [0, 2**bits - 1].

The range always contains 0 so the zero point is an integer inside the code range, which is what MatMulNBits' uint8
zero points can hold.
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


def quantize(w: np.ndarray, scale: np.ndarray, zero: np.ndarray, bits: int) -> np.ndarray:
    """Nearest code on the grid (broadcasting scale/zero against w); float array of integer values.

    The zero may be fractional (decoupleQ solves for it), so it is added before rounding.
    """
    return np.clip(np.round(w / scale + zero), 0, max_code(bits))


def dequantize(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    return scale * (codes - zero)
