"""One quantized linear layer, whatever method produced it, and its mapping onto onnxruntime's MatMulNBits.

W (N, K) ~ scale[n, g] * (code[n, k] - zero[n, g]) + offset[n, g] + outliers[n, k], with g = k // block_size.
`offset` is only present when a method solved for float zero points (decoupleQ): the integer zero goes to
MatMulNBits' uint8 zero points, which keeps its CPU fast path, and the remainder is a per-group constant that a graph
adds as (sum of x over each block) @ offset^T. Outliers are a sparse additive term (see outliers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edge.export.quant import QuantizationError
from edge.export.quant.grid import check_bits, max_code
from edge.export.quant.outliers import SparseOutliers
from edge.export.quant.packing import SUPPORTED_BLOCK_SIZES, num_blocks, pack_weights, pack_zero_points
from edge.export.quant.second_level import SecondLevelStats


@dataclass
class QuantizedLinear:
    codes: np.ndarray  # uint8 (N, K), unpacked
    scales: np.ndarray  # float32 (N, k_blocks): the effective scales (second level already applied)
    zeros: np.ndarray  # uint8 (N, k_blocks)
    bits: int
    block_size: int  # quantization group along K; == K means per output channel
    offsets: np.ndarray | None = None  # float32 (N, k_blocks), see module doc
    outliers: SparseOutliers | None = None
    second_level: SecondLevelStats | None = None  # compact storage form of scales/zeros (SpQR)
    method: str = "rtn"

    def __post_init__(self) -> None:
        check_bits(self.bits)
        n, k = self.codes.shape
        kb = num_blocks(k, self.block_size)
        for name in ("scales", "zeros", "offsets"):
            arr = getattr(self, name)
            if arr is not None and arr.shape != (n, kb):
                raise QuantizationError(f"{name} has shape {arr.shape}, expected {(n, kb)} for K={k}")
        if self.codes.size and int(self.codes.max()) > max_code(self.bits):
            raise QuantizationError(f"a code exceeds {self.bits} bits")
        if self.zeros.size and int(self.zeros.max()) > max_code(self.bits):
            raise QuantizationError(f"a zero point exceeds {self.bits} bits")

    @classmethod
    def from_float_zeros(
        cls, codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray, bits: int, block_size: int, **extra: Any
    ) -> "QuantizedLinear":
        """w = scale * (code - zero) with a fractional zero -> integer zero (nearest, in range) + per-group offset.

        scale * (code - z) = scale * (code - round(z)) + scale * (round(z) - z): exact, and the offset is dropped
        when every zero was already an integer.
        """
        zint = np.clip(np.round(zeros), 0, max_code(bits))
        offsets = (scales * (zint - zeros)).astype(np.float32)
        exact = np.abs(offsets) <= 1e-7 * np.abs(scales)
        return cls(
            codes=codes.astype(np.uint8),
            scales=scales.astype(np.float32),
            zeros=zint.astype(np.uint8),
            bits=bits,
            block_size=block_size,
            offsets=None if exact.all() else offsets,
            **extra,
        )

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    @property
    def k_blocks(self) -> int:
        return self.scales.shape[1]

    def _per_column(self, stat: np.ndarray) -> np.ndarray:
        return np.repeat(stat, self.block_size, axis=1)[:, : self.codes.shape[1]]

    def low_bit(self) -> np.ndarray:
        """scale * (code - zero): exactly what MatMulNBits multiplies with, float32 (N, K)."""
        w = self._per_column(self.scales) * (self.codes.astype(np.float32) - self._per_column(self.zeros))
        return w.astype(np.float32)

    def dense(self) -> np.ndarray:
        """The grid part of the weight: low_bit plus the group offsets."""
        if self.offsets is None:
            return self.low_bit()
        return (self.low_bit() + self._per_column(self.offsets)).astype(np.float32)

    def dequantize(self) -> np.ndarray:
        w = self.dense()
        if self.outliers is not None:
            w = w + self.outliers.to_dense()
        return w

    def take_rows(self, order: np.ndarray) -> "QuantizedLinear":
        """The layer with its output rows in `order` (a permutation): kernels that pair rows (edge.QMatMul's gated
        MLP) want them in their own order. Second-level statistics keep each row's own (base, step) row."""
        order = np.asarray(order, dtype=np.int64)
        if sorted(order.tolist()) != list(range(self.codes.shape[0])):
            raise QuantizationError("take_rows needs a permutation of the layer's rows")
        outliers = None if self.outliers is None else self.outliers.take_rows(order)
        return QuantizedLinear(codes=self.codes[order], scales=self.scales[order], zeros=self.zeros[order],
                               bits=self.bits, block_size=self.block_size,
                               offsets=None if self.offsets is None else self.offsets[order],
                               outliers=outliers, method=self.method,
                               second_level=None if self.second_level is None else self.second_level.take_rows(order))

    def reference_matmul(self, x: np.ndarray) -> np.ndarray:
        """y = x W^T term by term as the stock-op graph computes it: low-bit matmul + group offsets + sparse outliers."""
        x = np.asarray(x, dtype=np.float32)
        y = x @ self.low_bit().T
        if self.offsets is not None:
            y = y + block_sums(x, self.block_size) @ self.offsets.T
        if self.outliers is not None:
            y = y + self.outliers.matmul(x)
        return y

    def to_matmulnbits(self, block_size: int | None = None) -> dict[str, Any]:
        """Inputs and attributes of a MatMulNBits node (plus the extra terms a graph adds beside it).

        3-bit codes go in 4-bit slots (MatMulNBits has no 3-bit kernel; exact). A per-channel or wide group is
        re-blocked by repeating its statistics, which is exact. Extra keys: `group_offsets` (N, k_blocks float32 or
        None, for blocks of the *returned* block_size), `outliers` (SparseOutliers or None).
        """
        n, k = self.codes.shape
        target = block_size or self._default_block_size()
        if target not in SUPPORTED_BLOCK_SIZES:
            raise QuantizationError(f"MatMulNBits block_size {target} not in {SUPPORTED_BLOCK_SIZES}")
        per_channel = self.block_size >= k
        if not per_channel and self.block_size % target:
            raise QuantizationError(
                f"cannot re-block groups of {self.block_size} into MatMulNBits blocks of {target}; "
                "pick a block size that divides the group size"
            )
        kb = num_blocks(k, target)
        group_of_block = np.zeros(kb, dtype=np.int64) if per_channel else (np.arange(kb) * target) // self.block_size
        stored_bits = 4 if self.bits == 3 else self.bits
        offsets = None if self.offsets is None else np.ascontiguousarray(self.offsets[:, group_of_block], np.float32)
        return {
            "B": pack_weights(self.codes, stored_bits, target),
            "scales": np.ascontiguousarray(self.scales[:, group_of_block], dtype=np.float32),
            "zero_points": pack_zero_points(self.zeros[:, group_of_block], stored_bits),
            "K": k,
            "N": n,
            "bits": stored_bits,
            "block_size": target,
            "group_offsets": offsets,
            "outliers": self.outliers,
        }

    def _default_block_size(self) -> int:
        """The group size itself when MatMulNBits takes it, else the largest supported size it splits into."""
        if self.block_size in SUPPORTED_BLOCK_SIZES:
            return self.block_size
        k = self.codes.shape[1]
        if self.block_size >= k:
            fitting = [s for s in SUPPORTED_BLOCK_SIZES if s <= k]
            return max(fitting) if fitting else min(SUPPORTED_BLOCK_SIZES)
        dividing = [s for s in SUPPORTED_BLOCK_SIZES if self.block_size % s == 0]
        if not dividing:
            raise QuantizationError(f"no MatMulNBits block size divides groups of {self.block_size} columns")
        return max(dividing)


def block_sums(x: np.ndarray, block_size: int) -> np.ndarray:
    """Sum of x over each block of `block_size` columns (last block may be short): the input of the offset term."""
    k = x.shape[-1]
    kb = num_blocks(k, block_size)
    padded = np.zeros((*x.shape[:-1], kb * block_size), dtype=np.float32)
    padded[..., :k] = x
    return padded.reshape(*x.shape[:-1], kb, block_size).sum(axis=-1)


def concat_rows(layers: list[QuantizedLinear]) -> QuantizedLinear:
    """Stack layers that share an input (q/k/v, gate/up) into one, so the graph runs one matmul for all of them.

    Rows are independent in every method here (GPTQ/SpQR/decoupleQ quantize rows against the same Hessian), so
    stacking is exact, second-level statistics included (bits are counted before stacking).
    """
    first = layers[0]
    if any(q.bits != first.bits or q.block_size != first.block_size or q.codes.shape[1] != first.codes.shape[1]
           for q in layers):
        raise QuantizationError("only layers with the same bits, group size and input width can be stacked")
    offsets = None
    if any(q.offsets is not None for q in layers):
        offsets = np.concatenate([np.zeros_like(q.scales) if q.offsets is None else q.offsets for q in layers])
    outliers = None
    if any(q.outliers is not None and q.outliers.nnz for q in layers):
        n, k = sum(q.codes.shape[0] for q in layers), first.codes.shape[1]
        mask, delta = np.zeros((n, k), bool), np.zeros((n, k), np.float32)
        row = 0
        for q in layers:
            if q.outliers is not None and q.outliers.nnz:
                rows = q.outliers.rows() + row
                mask[rows, q.outliers.col] = True
                delta[rows, q.outliers.col] = q.outliers.values.astype(np.float32)
            row += q.codes.shape[0]
        outliers = SparseOutliers.from_dense(mask, delta)
    return QuantizedLinear(codes=np.concatenate([q.codes for q in layers]),
                           scales=np.concatenate([q.scales for q in layers]),
                           zeros=np.concatenate([q.zeros for q in layers]), bits=first.bits,
                           block_size=first.block_size, offsets=offsets, outliers=outliers, method=first.method,
                           second_level=SecondLevelStats.concat([q.second_level for q in layers]))
