"""Bits per weight, counted two ways.

storage: the compact form a package can keep on disk: codes at their true width, statistics (fp16 scale + zero at
code width per group, or SpQR's two-level statistics), fp16 group offsets (not for SpQR, whose fractional zeros are
recomputed from the zero codes), outliers at 32 bits each (fp16 value + 16-bit column, SpQR's convention).
runtime: what the stock-op form holds in memory: MatMulNBits codes in their slot width (3-bit in 4-bit slots) over the
block-padded K, float32 scales, packed zero points, float32 group offsets, and outliers as the graph keeps them
(`outlier_bits` each; default int32 row + int32 column + float32 value).
"""

from __future__ import annotations

from edge.export.quant.qlinear import QuantizedLinear


def storage_bits_per_weight(q: QuantizedLinear, stat_bits: int = 16) -> float:
    n, k = q.shape
    total = n * k * q.bits
    if q.second_level is not None:
        total += q.second_level.storage_bits()
    else:
        total += q.scales.size * (stat_bits + q.bits)
    if q.offsets is not None and q.second_level is None:  # SpQR's offsets follow from its zero codes
        total += q.offsets.size * 16
    if q.outliers is not None:
        total += q.outliers.nnz * 32
    return total / (n * k)


def runtime_bits_per_weight(q: QuantizedLinear, block_size: int | None = None, outlier_bits: int = 96) -> float:
    n, k = q.shape
    form = q.to_matmulnbits(block_size)
    total = form["B"].size * 8 + form["scales"].size * 32 + form["zero_points"].size * 8
    if form["group_offsets"] is not None:
        total += form["group_offsets"].size * 32
    if q.outliers is not None:
        total += q.outliers.nnz * outlier_bits
    return total / (n * k)


class BitTally:
    """Weighted average bits per weight over the layers a quantizer produced, for the package manifest."""

    def __init__(self) -> None:
        self.weights = 0
        self.storage = 0.0
        self.runtime = 0.0

    def add(self, q: QuantizedLinear) -> None:
        n = q.codes.size
        self.weights += n
        self.storage += storage_bits_per_weight(q) * n
        self.runtime += runtime_bits_per_weight(q) * n

    def record(self) -> dict[str, float]:
        if not self.weights:
            return {}
        return {"storage_bits_per_weight": round(self.storage / self.weights, 4),
                "runtime_bits_per_weight": round(self.runtime / self.weights, 4)}
