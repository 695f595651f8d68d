"""Packing low-bit weights into edge.QMatMul's layout, and the float64 reference of what the op computes.

The layout is designed for the kernel, not for storage compatibility with MatMulNBits:

* Output columns (rows n of W, shape (N, K)) come in **tiles of 8**; N is padded to a multiple of 8 and K to a multiple
  of group_size, both with code 0 (padded columns are never written, padded k meet zero activations).
* ``codes`` (uint8, 1-D) is tile-major: tile t, then k-units in order, then the unit's bytes. A unit covers
  ``unit_k`` consecutive k for all 8 columns of the tile:

  - 4-bit: unit_k = 8, 32 bytes = 8 little-endian uint32 words, word j for column 8t+j, code of k0+i at bits 4i..4i+3;
  - 8-bit: unit_k = 4, 32 bytes, word j holds the 4 codes of column 8t+j, code of k0+i at bits 8i..8i+7 (a Q8_0
    table kept exactly; the fp32 kernels compute it);
  - 2-bit: unit_k = 16, 32 bytes, word j holds the 16 codes of column 8t+j, code of k0+i at bits 2i..2i+1;
  - 3-bit: unit_k = 16, 48 bytes: the low two bits of each code as a 2-bit unit (32 bytes), then 8 little-endian
    uint16, the one for column 8t+j holding the high bit of the code of k0+i at bit i.

  So one 256-bit load gives the codes of 8 columns, and each k costs a shift and a mask for all 8 (exactly
  ``bits`` bits per weight, no padding).
* ``scales`` (float32 or float16) and either ``zeros`` (uint8 or float32, optional, default 2^(bits-1)) or ``mins``
  (float32 or float16) are (tiles, groups, 8): the 8 columns of a tile side by side, one vector load per group.
* Dequantised weight: W[n, k] = (code - zero) * scale, or code * scale + min (GGUF Q4_1's form: a model stored
  that way keeps its own numbers), of the group k // group_size, plus the optional CSR outliers (float16 values,
  int32 column indices, int32 row pointer of N+1 entries; duplicates add up). float16 statistics cost a 4-bit
  weight in groups of 32 5 bits instead of 6 in memory and in every 1-token step's reads.
* SpQR's two levels (``TwoLevel``): scales, and optionally float zero points, as uint8 codes in the same
  (tiles, groups, 8) layout, each value base + step * code (float32: the product rounded, then the sum) with float16
  (base, step) per stat row and group, (R, groups, 2); ``stat_rows`` (int32, 2 per tile) names the row of each 4
  columns. A byte per statistic instead of four, the format SpQR stores.

Group sizes are multiples of 16 from 16 to 128 (a multiple of every unit_k).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from edge.errors import EdgeError

SUPPORTED_BITS = (2, 3, 4, 8)
TILE = 8


def unit_k(bits: int) -> int:
    """Consecutive k covered by one unit of the packed codes."""
    return {4: 8, 8: 4}.get(bits, 16)


def unit_bytes(bits: int) -> int:
    """Bytes of one unit (8 columns x unit_k codes)."""
    return 48 if bits == 3 else 32


@dataclass(frozen=True)
class Outliers:
    """W's sparse outliers in CSR form over the N output rows.

    W[n, cols[e]] += values[e] for rowptr[n] <= e < rowptr[n + 1].
    """

    values: np.ndarray  # float16 (nnz,)
    cols: np.ndarray  # int32 (nnz,)
    rowptr: np.ndarray  # int32 (N + 1,)


@dataclass(frozen=True)
class TwoLevel:
    """SpQR's second level for W of shape (N, K): first-level statistics as codes on a per-row-group grid.

    The stat row of output column n is ``rows[n]``; the 4 columns of each half tile must share one (edge.QMatMul
    reads one per 4 columns), which SpQR's row groups of 16 and stacking at multiples of 4 give."""

    scale_codes: np.ndarray  # uint8 (N, groups)
    scale_stats: np.ndarray  # float16 (R, groups, 2): base, step
    rows: np.ndarray  # int (N,)
    zero_codes: np.ndarray | None = None  # uint8 (N, groups): float zero points
    zero_stats: np.ndarray | None = None  # float16 (R, groups, 2)

    def values(self, codes: np.ndarray, stats: np.ndarray) -> np.ndarray:
        """float32 (N, groups): base + step * code as the kernels compute it."""
        base, step = (stats[self.rows, :, i].astype(np.float32) for i in (0, 1))
        return base + step * codes.astype(np.float32)

    def scales(self) -> np.ndarray:
        return self.values(self.scale_codes, self.scale_stats)

    def zeros(self) -> np.ndarray | None:
        return None if self.zero_codes is None else self.values(self.zero_codes, self.zero_stats)


@dataclass(frozen=True)
class PackedWeight:
    """Everything an edge.QMatMul node needs for one weight matrix W of shape (N, K)."""

    n: int
    k: int
    bits: int
    group_size: int
    codes: np.ndarray  # uint8 1-D
    scales: np.ndarray  # float32 or float16 (tiles, groups, 8)
    zeros: np.ndarray | None  # uint8 or float32 (tiles, groups, 8)
    outliers: Outliers | None = None
    mins: np.ndarray | None = None  # float32 or float16 (tiles, groups, 8), instead of zeros
    # two levels: scales (and zeros) are uint8 codes; stats float16 (R, groups, 2); stat_rows int32 (2 * tiles)
    scale_stats: np.ndarray | None = None
    zero_stats: np.ndarray | None = None
    stat_rows: np.ndarray | None = None

    def attributes(self) -> dict[str, int]:
        """The node attributes."""
        return {"K": self.k, "N": self.n, "bits": self.bits, "group_size": self.group_size}

    def inputs(self) -> list[np.ndarray | None]:
        """Inputs 1..11 of the node (codes, scales, zeros, bias slot left None, outlier values, cols, row_ptr, mins,
        scale_stats, zero_stats, stat_rows)."""
        o = self.outliers
        return [self.codes, self.scales, self.zeros, None,
                None if o is None else o.values, None if o is None else o.cols, None if o is None else o.rowptr,
                self.mins, self.scale_stats, self.zero_stats, self.stat_rows]

    @property
    def nbytes(self) -> int:
        """Bytes at run time (codes, every statistic, outliers)."""
        extra = (self.zeros, self.mins, self.scale_stats, self.zero_stats, self.stat_rows)
        total = self.codes.nbytes + self.scales.nbytes + sum(0 if a is None else a.nbytes for a in extra)
        if self.outliers is not None:
            total += self.outliers.values.nbytes + self.outliers.cols.nbytes + self.outliers.rowptr.nbytes
        return total


def _check_args(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, mins: np.ndarray | None, bits: int,
                group_size: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise EdgeError(f"edge.QMatMul packs 2-, 3-, 4- or 8-bit codes, not {bits}-bit")
    if group_size % 16 or not 16 <= group_size <= 128:
        raise EdgeError(f"group_size must be a multiple of 16 in 16..128, got {group_size}")
    if codes.ndim != 2:
        raise EdgeError(f"codes must be a 2-D (N, K) array, got shape {codes.shape}")
    n, k = codes.shape
    groups = -(-k // group_size)
    if scales.shape != (n, groups):
        raise EdgeError(f"scales must have shape (N, ceil(K/group_size)) = {(n, groups)}, got {scales.shape}")
    if zeros is not None and zeros.shape != (n, groups):
        raise EdgeError(f"zeros must have shape {(n, groups)}, got {zeros.shape}")
    if zeros is not None and zeros.dtype not in (np.uint8, np.float32):
        raise EdgeError(f"zeros must be uint8 or float32, got {zeros.dtype}")
    if scales.dtype not in (np.float32, np.float16):
        raise EdgeError(f"scales must be float32 or float16, got {scales.dtype}")
    if mins is not None:
        if zeros is not None:
            raise EdgeError("give zeros or mins, not both: W = (code - zero) * scale or code * scale + min")
        if mins.shape != (n, groups) or mins.dtype not in (np.float32, np.float16):
            raise EdgeError(f"mins must be float32 or float16 of shape {(n, groups)}, got {mins.dtype} {mins.shape}")
    if codes.size and (codes.min() < 0 or codes.max() >= 1 << bits):
        raise EdgeError(f"codes must lie in [0, {1 << bits}) for {bits}-bit weights")


def _tile_groups(a: np.ndarray, n_pad: int) -> np.ndarray:
    """(N, G) -> (tiles, G, 8), padded columns zero."""
    padded = np.zeros((n_pad, a.shape[1]), dtype=a.dtype)
    padded[: a.shape[0]] = a
    return np.ascontiguousarray(padded.reshape(n_pad // TILE, TILE, a.shape[1]).transpose(0, 2, 1))


# Tiles packed at a time: the shifted codes are 4-byte words, so a whole 262,144-row head (Gemma 3) at once made
# gigabytes of temporaries.
CHUNK_TILES = 2048


def _pack_words(c: np.ndarray, width: int, per_word: int, dtype: type) -> np.ndarray:
    """(tiles, 8, units, per_word) codes -> (tiles, units, 8) words with code i at bits width*i (at most 32 bits)."""
    shifts = (np.arange(per_word, dtype=np.uint32) * width).astype(np.uint32)
    words = np.empty((c.shape[0], c.shape[2], c.shape[1]), dtype=dtype)
    for t in range(0, c.shape[0], CHUNK_TILES):
        part = (c[t:t + CHUNK_TILES].astype(np.uint32) << shifts).sum(axis=-1, dtype=np.uint32).astype(dtype)
        words[t:t + CHUNK_TILES] = part.transpose(0, 2, 1)
    return words


def pack_codes(codes: np.ndarray, bits: int, group_size: int) -> np.ndarray:
    """Pack integer codes of W, shape (N, K), into the tile-major byte layout (see the module docstring)."""
    n, k = codes.shape
    n_pad = -(-n // TILE) * TILE
    k_pad = -(-k // group_size) * group_size
    full = np.zeros((n_pad, k_pad), dtype=np.uint8)
    full[:n, :k] = codes
    uk = unit_k(bits)
    c = full.reshape(n_pad // TILE, TILE, k_pad // uk, uk)
    if bits in (4, 8):
        body = _pack_words(c, bits, 32 // bits, np.dtype("<u4"))
        return np.ascontiguousarray(body).view(np.uint8).reshape(-1)
    lo = _pack_words(c & 3, 2, 16, np.dtype("<u4"))
    if bits == 2:
        return np.ascontiguousarray(lo).view(np.uint8).reshape(-1)
    hi = _pack_words((c >> 2) & 1, 1, 16, np.dtype("<u2"))
    lo_bytes = np.ascontiguousarray(lo).view(np.uint8).reshape(lo.shape[0], lo.shape[1], 32)
    hi_bytes = np.ascontiguousarray(hi).view(np.uint8).reshape(hi.shape[0], hi.shape[1], 16)
    return np.ascontiguousarray(np.concatenate([lo_bytes, hi_bytes], axis=2)).reshape(-1)


def gated_row_order(n: int) -> np.ndarray:
    """Rows of the stacked [gate; up] (n rows each) in edge.QMatMul's gated order: 4 gate rows, then the same 4 up
    rows, and so on, so that each tile of 8 output columns holds 4 complete pairs."""
    if n % 4:
        raise EdgeError(f"a gated weight needs gate rows in a multiple of 4, got {n}")
    rows = np.arange(n).reshape(n // 4, 4)
    return np.stack([rows, rows + n], axis=1).reshape(-1)


def interleave_gated(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The fused gate/up weight for edge.QMatMul's gated activations (act(gate) * up), rows in gated_row_order."""
    if up.shape != gate.shape:
        raise EdgeError(f"gate and up must have the same shape, got {gate.shape}, {up.shape}")
    return np.concatenate([gate, up])[gated_row_order(gate.shape[0])]


def make_outliers(n: int, k: int, rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> Outliers:
    """CSR outliers from coordinate lists (rows, cols index W of shape (N, K)); values are stored as float16."""
    rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    if rows.shape != cols.shape or rows.shape != np.shape(values):
        raise EdgeError("outlier rows, cols and values must have the same length")
    if rows.size and (rows.min() < 0 or rows.max() >= n or cols.min() < 0 or cols.max() >= k):
        raise EdgeError(f"outlier coordinates must lie inside W's shape ({n}, {k})")
    order = np.lexsort((cols, rows))
    rowptr = np.zeros(n + 1, dtype=np.int32)
    np.add.at(rowptr, rows + 1, 1)
    return Outliers(values=np.asarray(values, dtype=np.float16)[order], cols=cols[order].astype(np.int32),
                    rowptr=np.cumsum(rowptr).astype(np.int32))


def pack(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None = None, *, bits: int, group_size: int,
         outliers: Outliers | None = None, mins: np.ndarray | None = None) -> PackedWeight:
    """Pack W = (codes - zeros) * scales, or codes * scales + mins (+ outliers), for edge.QMatMul.

    codes: integer (N, K) in [0, 2^bits); scales: (N, ceil(K/group_size)), float16 kept as such, any other float
    as float32; zeros: same shape, uint8 or float32, or None for the midpoint 2^(bits-1); mins: instead of zeros,
    same shape, float32 or float16.
    """
    codes = np.asarray(codes)
    scales = np.asarray(scales)
    scales = scales if scales.dtype == np.float16 else scales.astype(np.float32)
    mins = None if mins is None else np.asarray(mins)
    _check_args(codes, scales, zeros, mins, bits, group_size)
    n, k = codes.shape
    if outliers is not None and outliers.rowptr.shape != (n + 1,):
        raise EdgeError(f"outlier row_ptr must have N+1 = {n + 1} entries, got {outliers.rowptr.shape}")
    n_pad = -(-n // TILE) * TILE
    return PackedWeight(n=n, k=k, bits=bits, group_size=group_size, codes=pack_codes(codes, bits, group_size),
                        scales=_tile_groups(scales, n_pad),
                        zeros=None if zeros is None else _tile_groups(np.asarray(zeros), n_pad), outliers=outliers,
                        mins=None if mins is None else _tile_groups(mins, n_pad))


def pack_two_level(codes: np.ndarray, two: TwoLevel, zeros: np.ndarray | None = None, *, bits: int,
                   group_size: int, outliers: Outliers | None = None) -> PackedWeight:
    """Pack W = (codes - zero) * scale with SpQR's two-level statistics: scales (and, with two.zero_codes, float
    zero points) from `two`; otherwise uint8 or float32 `zeros` as in pack."""
    scale_codes = np.asarray(two.scale_codes)
    plain = pack(codes, two.scales(), zeros if two.zero_codes is None else two.zeros(), bits=bits,
                 group_size=group_size, outliers=outliers)  # checks shapes; its float statistics are replaced
    n = plain.n
    rows = np.asarray(two.rows, dtype=np.int64)
    if scale_codes.dtype != np.uint8 or rows.shape != (n,):
        raise EdgeError(f"two-level scale codes must be uint8 and rows one per output column ({n})")
    stats = [np.asarray(s) for s in (two.scale_stats, two.zero_stats) if s is not None]
    if any(s.dtype != np.float16 or s.ndim != 3 or s.shape[1:] != (scale_codes.shape[1], 2) or s.shape != stats[0].shape
           for s in stats) or rows.min() < 0 or rows.max() >= stats[0].shape[0]:
        raise EdgeError("two-level statistics must be float16 (rows, groups, 2), rows indexing them")
    n_pad = -(-n // TILE) * TILE
    halves = np.zeros(n_pad // 4, dtype=np.int32)  # padded columns: row 0 (never written)
    shared = rows[: n - n % 4].reshape(-1, 4)
    if (shared != shared[:, :1]).any():
        raise EdgeError("the 4 columns of each half tile must share their stat row (SpQR row groups of 4k)")
    halves[: -(-n // 4)] = rows[::4]
    return dataclasses.replace(
        plain, scales=_tile_groups(scale_codes, n_pad),
        zeros=plain.zeros if two.zero_codes is None else _tile_groups(np.asarray(two.zero_codes, np.uint8), n_pad),
        scale_stats=np.ascontiguousarray(stats[0]), zero_stats=None if two.zero_codes is None else stats[1],
        stat_rows=halves)


def quantize(w: np.ndarray, bits: int, group_size: int, float_zeros: bool = False
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest min-max quantisation of W (N, K) per group: (codes uint8, scales float32, zeros).

    A convenience for tests and benchmarks; real models arrive already quantised (GGUF, SpQR).
    """
    n, k = w.shape
    k_pad = -(-k // group_size) * group_size
    wp = np.zeros((n, k_pad), dtype=np.float64)
    wp[:, :k] = w
    wp[:, k:] = wp[:, :1] if k_pad > k else 0.0
    g = wp.reshape(n, -1, group_size)
    lo, hi = g.min(axis=2), g.max(axis=2)
    levels = (1 << bits) - 1
    scale = np.where(hi > lo, (hi - lo) / levels, 1.0)
    zero = -lo / scale
    zero = zero if float_zeros else np.clip(np.round(zero), 0, levels)
    codes = np.clip(np.round(g / scale[..., None] + zero[..., None]), 0, levels).astype(np.uint8)
    zeros = zero.astype(np.float32) if float_zeros else zero.astype(np.uint8)
    return codes.reshape(n, k_pad)[:, :k], scale.astype(np.float32), zeros


def dequantize(p: PackedWeight, codes: np.ndarray) -> np.ndarray:
    """W (N, K) in float64 from the logical codes and p's scales/zeros/outliers (the reference of the kernel)."""
    n, k = p.n, p.k
    groups, per_k = -(-k // p.group_size), np.arange(k) // p.group_size

    def per_column(a: np.ndarray) -> np.ndarray:  # (tiles, groups, 8) -> (N, groups)
        return a.transpose(0, 2, 1).reshape(-1, groups)[:n]

    scales, zeros = per_column(p.scales), None if p.zeros is None else per_column(p.zeros)
    if p.scale_stats is not None:  # two levels: the statistics from their codes
        two = TwoLevel(scales, p.scale_stats, np.repeat(p.stat_rows, 4)[:n],
                       zeros if p.zero_stats is not None else None, p.zero_stats)
        scales, zeros = two.scales(), (zeros if p.zero_stats is None else two.zeros())
    scales = scales.astype(np.float64)[:, per_k]
    if p.mins is not None:
        w = codes.astype(np.float64) * scales + per_column(p.mins).astype(np.float64)[:, per_k]
    else:
        z = float(1 << (p.bits - 1)) if zeros is None else zeros.astype(np.float64)[:, per_k]
        w = (codes.astype(np.float64) - z) * scales
    if p.outliers is not None:
        o = p.outliers
        rows = np.repeat(np.arange(n), np.diff(o.rowptr))
        np.add.at(w, (rows, o.cols.astype(np.int64)), o.values.astype(np.float64))
    return w


def reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """y = x W^T (+ bias) in float64, for x of shape (..., K)."""
    y = np.asarray(x, dtype=np.float64) @ w.T
    return y if bias is None else y + np.asarray(bias, dtype=np.float64)
