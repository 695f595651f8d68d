"""Outlier weights kept outside the low-bit grid, as a compressed-sparse-row (CSR) correction.

The values are *added* to the dense dequantized weight (W = dense + S), so a stock-op graph computes
y = MatMulNBits(x) + x S^T with a sparse add, and the dense codes at outlier positions may hold anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge.export.quant import QuantizationError


@dataclass
class SparseOutliers:
    row_ptr: np.ndarray  # int32 (N+1,)
    col: np.ndarray  # int32 (nnz,)
    values: np.ndarray  # float16 (nnz,)
    shape: tuple[int, int]  # (N, K)

    def __post_init__(self) -> None:
        n, _ = self.shape
        if self.row_ptr.shape != (n + 1,) or self.col.shape != self.values.shape:
            raise QuantizationError(
                f"malformed CSR outliers: row_ptr {self.row_ptr.shape} for {n} rows, "
                f"col {self.col.shape}, values {self.values.shape}"
            )

    @classmethod
    def from_dense(cls, mask: np.ndarray, delta: np.ndarray) -> "SparseOutliers":
        """Keep delta where mask is set; row-major order, so the CSR arrays come straight from np.nonzero."""
        rows, cols = np.nonzero(mask)
        counts = np.bincount(rows, minlength=mask.shape[0])
        row_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        return cls(row_ptr, cols.astype(np.int32), delta[rows, cols].astype(np.float16), tuple(mask.shape))

    @property
    def nnz(self) -> int:
        return int(self.col.shape[0])

    def rows(self) -> np.ndarray:
        """Row index of every stored value (COO form, which ScatterElements/GatherND-style graphs want)."""
        return np.repeat(np.arange(self.shape[0], dtype=np.int32), np.diff(self.row_ptr))

    def take_rows(self, order: np.ndarray) -> "SparseOutliers":
        """The same outliers with row order[i] moved to row i (order a permutation of the rows)."""
        new_row = np.empty(len(order), dtype=np.int64)
        new_row[np.asarray(order)] = np.arange(len(order))
        rows = new_row[self.rows()]
        idx = np.lexsort((self.col, rows))
        row_ptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=self.shape[0]))]).astype(np.int32)
        return SparseOutliers(row_ptr, self.col[idx], self.values[idx], self.shape)

    def to_dense(self) -> np.ndarray:
        dense = np.zeros(self.shape, dtype=np.float32)
        dense[self.rows(), self.col] = self.values.astype(np.float32)
        return dense

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """Reference x @ S^T for x (..., K): the sparse term's contribution to the layer output."""
        x = np.asarray(x, dtype=np.float32)
        contrib = x[..., self.col] * self.values.astype(np.float32)  # (..., nnz)
        out = np.zeros((*x.shape[:-1], self.shape[0]), dtype=np.float32)
        np.add.at(out.reshape(-1, self.shape[0]).T, self.rows(), contrib.reshape(-1, self.nnz).T)
        return out
