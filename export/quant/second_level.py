"""SpQR's second level: the first-level scales and zeros, themselves quantized to a few bits.

Groups run along the output axis (N): for each first-level column block, `group_size` consecutive rows share one
16-bit (base, step) pair, value = base + step * code. The range is the plain min..max (no forced 0): scales are
positive, and the zero points never need an exact 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge.export.quant import QuantizationError


@dataclass
class QuantizedStat:
    codes: np.ndarray  # uint8 (N, k_blocks)
    base: np.ndarray  # float16 (ceil(N/group_size), k_blocks)
    step: np.ndarray  # float16 (ceil(N/group_size), k_blocks)
    bits: int
    group_size: int
    # row n's (base, step) row; None: n // group_size. Stacked or reordered layers (q/k/v, edge's gated gate/up)
    # keep each row's own statistics this way, exactly.
    rows: np.ndarray | None = None

    def row_of(self) -> np.ndarray:
        return np.arange(self.codes.shape[0]) // self.group_size if self.rows is None else self.rows

    def dequantize(self) -> np.ndarray:
        rows = self.row_of()
        return self.base.astype(np.float32)[rows] + self.step.astype(np.float32)[rows] * self.codes.astype(np.float32)

    def take_rows(self, order: np.ndarray) -> "QuantizedStat":
        return QuantizedStat(self.codes[order], self.base, self.step, self.bits, self.group_size, self.row_of()[order])

    def storage_bits(self) -> int:
        return self.codes.size * self.bits + (self.base.size + self.step.size) * 16


def concat_stats(parts: list[QuantizedStat]) -> QuantizedStat:
    """The statistics of layers stacked along N: each part's rows keep their own (base, step) rows."""
    rows, offset = [], 0
    for p in parts:
        rows.append(p.row_of() + offset)
        offset += p.base.shape[0]
    first = parts[0]
    return QuantizedStat(np.concatenate([p.codes for p in parts]), np.concatenate([p.base for p in parts]),
                         np.concatenate([p.step for p in parts]), first.bits, first.group_size, np.concatenate(rows))


def quantize_stat(values: np.ndarray, bits: int = 3, group_size: int = 16) -> QuantizedStat:
    """Quantize a (N, k_blocks) statistic along N; the 16-bit base/step are what dequantization uses."""
    if values.ndim != 2:
        raise QuantizationError(f"expected a (N, k_blocks) statistic, got shape {values.shape}")
    if not 1 <= bits <= 8 or group_size < 1:
        raise QuantizationError(f"second-level bits {bits} / group size {group_size} out of range")
    n, kb = values.shape
    groups = -(-n // group_size)
    padded = np.concatenate([values, np.repeat(values[-1:], groups * group_size - n, axis=0)], axis=0)
    grouped = padded.reshape(groups, group_size, kb).astype(np.float32)
    lo, hi = grouped.min(axis=1), grouped.max(axis=1)
    qmax = (1 << bits) - 1
    base = lo.astype(np.float16)
    step = ((hi - base.astype(np.float32)) / qmax).astype(np.float16)
    step32 = np.where(step.astype(np.float32) > 0, step.astype(np.float32), 1.0)
    codes = np.clip(np.round((grouped - base.astype(np.float32)[:, None]) / step32[:, None]), 0, qmax)
    codes = codes.reshape(groups * group_size, kb)[:n].astype(np.uint8)
    return QuantizedStat(codes, base, step, bits, group_size)


@dataclass
class SecondLevelStats:
    scales: QuantizedStat
    zeros: QuantizedStat

    def storage_bits(self) -> int:
        return self.scales.storage_bits() + self.zeros.storage_bits()

    def take_rows(self, order: np.ndarray) -> "SecondLevelStats":
        return SecondLevelStats(self.scales.take_rows(order), self.zeros.take_rows(order))

    @staticmethod
    def concat(parts: list["SecondLevelStats | None"]) -> "SecondLevelStats | None":
        """Stacked layers' statistics, or None unless every part has them at the same widths."""
        if any(p is None for p in parts) or len({(p.scales.bits, p.zeros.bits) for p in parts}) != 1:
            return None
        return SecondLevelStats(concat_stats([p.scales for p in parts]), concat_stats([p.zeros for p in parts]))
