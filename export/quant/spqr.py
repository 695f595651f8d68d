"""SpQR-style quantization: GPTQ with small groups, quantized statistics and float outliers.

Per group of `group_size` input columns (all rows at once, when GPTQ reaches the group):
1. Outlier candidates: for every weight, how much the group's Hessian-weighted error drops when that weight is left
   out of the min/max fit (leave-one-out). Weights whose drop exceeds the threshold are excluded from the fit.
2. The group's scales and zeros (one per row) are quantized to `stat_bits` in runs of `stat_group_size` rows with
   16-bit (base, step) statistics; the dequantized scale, and the dequantized zero rounded to an integer, are the grid
   the columns are quantized on (float_zero: the dequantized zero as it is, carried at run time by the group-offset
   term or edge.QMatMul's float zeros). So the effective grid is exactly what the compact format reproduces.
3. While GPTQ walks the columns, a weight whose weighted error (err / U_ii)^2 exceeds the threshold stays in float
   (error 0, nothing fed forward) and becomes a CSR outlier.
The threshold is `outlier_threshold` times the mean weighted squared error of the group under a plain min/max grid,
and never less than that times a uniform grid's expected error (step^2 / 12): a group already on a grid (a GGUF
source) has no error at all, and a threshold of zero would turn every weight into an outlier.
With `stat_search`, step 2 ends with each row choosing, among the combinations of its quantized scale and zero codes
(all of them for 3-bit statistics, those near the rounded codes for wider ones), the one whose grid gives the
group's current weights the least weighted error (the codes are stored anyway; only
which ones are picked changes), so the quantized statistics are fitted to the weights, not to the float statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge.export.quant import QuantizationError
from edge.export.quant.gptq import GroupGrid, gptq_core, prepare
from edge.export.quant.grid import dequantize, max_code, minmax_params, quantize
from edge.export.quant.outliers import SparseOutliers
from edge.export.quant.qlinear import QuantizedLinear
from edge.export.quant.second_level import QuantizedStat, SecondLevelStats, quantize_stat


DEFAULT_THRESHOLD = {2: 16.0, 3: 16.0, 4: 48.0}
SEARCH_RADIUS = 2  # codes either side of the rounded one that the statistics search tries for wide statistics


@dataclass
class SpqrConfig:
    bits: int = 3
    group_size: int = 16
    stat_bits: int = 3
    stat_group_size: int = 16
    outlier_threshold: float | None = None  # relative to the group's mean weighted squared error; None: by bits
    damp: float = 0.01
    lazy_block: int = 32
    float_zero: bool = False  # first-level grid spans min..max exactly; zeros stay fractional (-> group offsets)
    stat_search: bool = False  # each row picks its (scale, zero) among its quantized statistics by the group's
    # weighted error, instead of rounding each statistic to its nearest code

    def threshold(self) -> float:
        """Measured on SmolLM2-135M with integer zeros: 16 keeps ~0.8% outliers at 3 bits, 48 ~0.15% at 4 bits;
        with float zeros and searched statistics (the export default) 0.54% and 0.02%."""
        if self.outlier_threshold is not None:
            return self.outlier_threshold
        return DEFAULT_THRESHOLD[self.bits]

    def check(self) -> None:
        if self.bits not in (2, 3, 4):
            raise QuantizationError(f"SpQR bits must be 2, 3 or 4, got {self.bits}")
        if self.group_size < 2:
            raise QuantizationError(f"SpQR group_size must be at least 2, got {self.group_size}")
        if not 2 <= self.stat_bits <= 8:
            raise QuantizationError(f"SpQR statistics take 2 to 8 bits, got {self.stat_bits}")
        if self.outlier_threshold is not None and self.outlier_threshold <= 0:
            raise QuantizationError("outlier_threshold must be positive (use a huge value to disable outliers)")


def weighted_sq_error(w: np.ndarray, scale: np.ndarray, zero: np.ndarray, d: np.ndarray, bits: int) -> np.ndarray:
    """((w - deq(w)) / d)^2 elementwise, the grid broadcast over the last axis."""
    deq = dequantize(quantize(w, scale[..., None], zero[..., None], bits), scale[..., None], zero[..., None])
    return np.square((w - deq) / d)


def leave_one_out_gain(w: np.ndarray, d: np.ndarray, bits: int, float_zero: bool = False) -> np.ndarray:
    """(N, g): the drop in a row-group's weighted error when weight j is left out of the fit (and of the sum)."""
    g = w.shape[1]
    keep = ~np.eye(g, dtype=bool)  # keep[j] = all but j
    stacked = np.broadcast_to(w[:, None, :], (w.shape[0], g, g))
    scale, zero = minmax_params(stacked, bits, mask=keep[None], float_zero=float_zero)
    loo = (weighted_sq_error(stacked, scale, zero, d, bits) * keep).sum(axis=-1)
    scale0, zero0 = minmax_params(w, bits, float_zero=float_zero)
    baseline = weighted_sq_error(w, scale0, zero0, d, bits).sum(axis=-1, keepdims=True)
    return baseline - loo


class SpqrFit:
    """The per-group grid of SpQR; remembers the compact statistics of every group it fitted."""

    def __init__(self, cfg: SpqrConfig, n: int, k_blocks: int):
        self.cfg = cfg
        self.scale_codes = np.zeros((n, k_blocks), np.uint8)
        self.zero_codes = np.zeros((n, k_blocks), np.uint8)
        groups = -(-n // cfg.stat_group_size)
        self.stat_arrays = {name: np.zeros((groups, k_blocks), np.float16) for name in ("sb", "ss", "zb", "zs")}

    def __call__(self, w: np.ndarray, d: np.ndarray, g: int) -> GroupGrid:
        bits, float_zero = self.cfg.bits, self.cfg.float_zero
        scale0, zero0 = minmax_params(w, bits, float_zero=float_zero)
        measured = float(weighted_sq_error(w, scale0, zero0, d, bits).mean())
        uniform = float(np.mean(np.square(scale0)[:, None] / 12 / np.square(d)[None, :]))
        tau = self.cfg.threshold() * max(measured, uniform)
        candidates = leave_one_out_gain(w, d, bits, float_zero) > tau
        scale, zero = minmax_params(w, bits, mask=~candidates, float_zero=float_zero)
        qs = quantize_stat(scale[:, None], self.cfg.stat_bits, self.cfg.stat_group_size)
        qz = quantize_stat(zero[:, None], self.cfg.stat_bits, self.cfg.stat_group_size)
        self.scale_codes[:, g], self.zero_codes[:, g] = qs.codes[:, 0], qz.codes[:, 0]
        for name, arr in (("sb", qs.base), ("ss", qs.step), ("zb", qz.base), ("zs", qz.step)):
            self.stat_arrays[name][:, g] = arr[:, 0]
        if self.cfg.stat_search:
            self._search(w, d, ~candidates, qs, qz)
            self.scale_codes[:, g], self.zero_codes[:, g] = qs.codes[:, 0], qz.codes[:, 0]
        scale_eff = self._effective_scale(qs, scale)[:, 0]
        zero_eff = self._effective_zero(qz)[:, 0]
        return GroupGrid(scale_eff, zero_eff, tau)

    def _effective_scale(self, qs: QuantizedStat, fallback: np.ndarray) -> np.ndarray:
        scale = qs.dequantize()
        return np.where(scale > 0, scale, fallback.reshape(-1, 1))  # a 16-bit underflow must not zero a group

    def _effective_zero(self, qz: QuantizedStat) -> np.ndarray:
        zero = qz.dequantize()
        return zero if self.cfg.float_zero else np.clip(np.round(zero), 0, max_code(self.cfg.bits))

    def _search(self, w: np.ndarray, d: np.ndarray, keep: np.ndarray, qs: QuantizedStat, qz: QuantizedStat) -> None:
        """Per row, the (scale code, zero code) pair with the least weighted error over the group's non-outliers;
        writes the chosen codes into qs/qz (their 16-bit base/step stay). Up to 3-bit statistics every pair is
        tried; wider ones (each code a small step) try the SEARCH_RADIUS codes around each rounded code."""
        n = w.shape[0]
        scale_codes = self._candidates(qs.codes[:, 0])  # (n, C)
        zero_codes = self._candidates(qz.codes[:, 0])
        scales = np.empty(scale_codes.shape)
        for c in range(scale_codes.shape[1]):
            qs.codes[:, 0] = scale_codes[:, c]
            scales[:, c] = self._effective_scale(qs, np.ones(n))[:, 0]
        best_err, best_s, best_z = np.full(n, np.inf), np.zeros(n, np.uint8), np.zeros(n, np.uint8)
        wk, dk, rows = w[:, None, :], d[None, None, :], np.arange(n)
        for j in range(zero_codes.shape[1]):
            qz.codes[:, 0] = zero_codes[:, j]
            zero = self._effective_zero(qz)  # (n, 1)
            err = (weighted_sq_error(wk, scales, np.broadcast_to(zero, scales.shape), dk, self.cfg.bits)
                   * keep[:, None, :]).sum(axis=-1)  # (n, C)
            cs = err.argmin(axis=1)
            err = err[rows, cs]
            better = err < best_err
            best_err[better], best_s[better], best_z[better] = err[better], scale_codes[rows, cs][better], \
                zero_codes[better, j]
        qs.codes[:, 0], qz.codes[:, 0] = best_s, best_z

    def _candidates(self, rounded: np.ndarray) -> np.ndarray:
        """(n, C) codes to try per row: all of them for narrow statistics, else a window around the rounded one
        (clipped at the ends, where it repeats a code: harmless)."""
        levels = 1 << self.cfg.stat_bits
        if levels <= 8:
            return np.broadcast_to(np.arange(levels, dtype=np.int64), (rounded.size, levels))
        offsets = np.arange(-SEARCH_RADIUS, SEARCH_RADIUS + 1)
        return np.clip(rounded.astype(np.int64)[:, None] + offsets, 0, levels - 1)

    def second_level(self) -> SecondLevelStats:
        c, a = self.cfg, self.stat_arrays
        return SecondLevelStats(
            scales=QuantizedStat(self.scale_codes, a["sb"], a["ss"], c.stat_bits, c.stat_group_size),
            zeros=QuantizedStat(self.zero_codes, a["zb"], a["zs"], c.stat_bits, c.stat_group_size),
        )


def quantize_spqr(w: np.ndarray, h: np.ndarray, cfg: SpqrConfig | None = None) -> QuantizedLinear:
    cfg = cfg or SpqrConfig()
    cfg.check()
    w, u = prepare(w, h, cfg.damp)
    n, k = w.shape
    group_size = min(cfg.group_size, k)
    fit = SpqrFit(cfg, n, -(-k // group_size))
    result = gptq_core(w, u, cfg.bits, group_size, fit, cfg.lazy_block)
    scales = np.repeat(result.scales, group_size, axis=1)[:, :k]
    zeros = np.repeat(result.zeros, group_size, axis=1)[:, :k]
    dense = scales * (result.codes - zeros)
    delta = np.where(result.outliers, result.updated - dense, 0.0)
    outliers = SparseOutliers.from_dense(result.outliers, delta) if result.outliers.any() else None
    return QuantizedLinear.from_float_zeros(
        result.codes,
        result.scales,
        result.zeros,
        cfg.bits,
        group_size,
        outliers=outliers,
        second_level=fit.second_level(),
        method="spqr",
    )
