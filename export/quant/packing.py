"""Bit packing in the layout onnxruntime's MatMulNBits reads.

B is (N, k_blocks, block_size*bits/8) uint8: row n is output channel n, values run along K and sit low bits first
inside each byte. Zero points are packed the same way along the block axis, each row padded to whole bytes. K is
padded up to a block multiple with code 0; the padded weights never meet an activation, so their value is irrelevant.
"""

from __future__ import annotations

import numpy as np

from edge.export.quant import QuantizationError

SUPPORTED_BITS = (2, 4, 8)
SUPPORTED_BLOCK_SIZES = (16, 32, 64, 128, 256)


def check_format(bits: int, block_size: int) -> None:
    """Reject what the MatMulNBits CPU kernel rejects, before a package is written that cannot load."""
    if bits not in SUPPORTED_BITS:
        raise QuantizationError(
            f"MatMulNBits stores {bits}-bit codes nowhere; use bits in {SUPPORTED_BITS} "
            "(3-bit codes go into 4-bit slots)"
        )
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise QuantizationError(f"block_size {block_size} is not one of {SUPPORTED_BLOCK_SIZES}")


def num_blocks(k: int, block_size: int) -> int:
    return -(-k // block_size)


def pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack the last axis of `codes` (values < 2**bits), low bits first; the last axis is zero-padded to whole bytes."""
    if bits not in SUPPORTED_BITS:
        raise QuantizationError(f"cannot pack {bits}-bit values; supported: {SUPPORTED_BITS}")
    codes = np.asarray(codes)
    if codes.size and int(codes.max()) >= (1 << bits):
        raise QuantizationError(f"a code exceeds {bits} bits (max {int(codes.max())})")
    per_byte = 8 // bits
    n = codes.shape[-1]
    padded = -(-n // per_byte) * per_byte
    if padded != n:
        pad = [(0, 0)] * (codes.ndim - 1) + [(0, padded - n)]
        codes = np.pad(codes, pad)
    grouped = codes.astype(np.uint8).reshape(*codes.shape[:-1], padded // per_byte, per_byte)
    shifts = (np.arange(per_byte, dtype=np.uint8) * bits).astype(np.uint8)
    return np.bitwise_or.reduce(np.left_shift(grouped, shifts), axis=-1).astype(np.uint8)


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Inverse of `pack_bits`: the first `count` values of the last axis."""
    if bits not in SUPPORTED_BITS:
        raise QuantizationError(f"cannot unpack {bits}-bit values; supported: {SUPPORTED_BITS}")
    per_byte = 8 // bits
    shifts = (np.arange(per_byte, dtype=np.uint8) * bits).astype(np.uint8)
    mask = np.uint8((1 << bits) - 1)
    values = np.right_shift(packed[..., None], shifts) & mask
    values = values.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)
    if count > values.shape[-1]:
        raise QuantizationError(f"asked for {count} values but only {values.shape[-1]} are packed")
    return values[..., :count]


# Rows packed at a time: pack_bits' copies and shifts are each the size of the codes (Gemma 3's 168M-code embedding:
# 0.7 GB of temporaries at once).
CHUNK_ROWS = 8192


def pack_weights(codes: np.ndarray, bits: int, block_size: int) -> np.ndarray:
    """Codes (N, K) -> MatMulNBits B (N, k_blocks, block_size*bits/8)."""
    check_format(bits, block_size)
    n, k = codes.shape
    kb = num_blocks(k, block_size)
    out = np.empty((n, kb, block_size * bits // 8), dtype=np.uint8)
    for r in range(0, n, CHUNK_ROWS):
        rows = codes[r:r + CHUNK_ROWS]
        padded = np.zeros((len(rows), kb * block_size), dtype=np.uint8)
        padded[:, :k] = rows
        out[r:r + CHUNK_ROWS] = pack_bits(padded.reshape(len(rows), kb, block_size), bits)
    return out


def unpack_weights(b: np.ndarray, bits: int, block_size: int, k: int) -> np.ndarray:
    """MatMulNBits B -> codes (N, K)."""
    check_format(bits, block_size)
    n, kb, _ = b.shape
    return unpack_bits(b, bits, block_size).reshape(n, kb * block_size)[:, :k]


def pack_zero_points(zeros: np.ndarray, bits: int) -> np.ndarray:
    """Zero points (N, k_blocks) -> packed uint8 (N, ceil(k_blocks*bits/8))."""
    return np.ascontiguousarray(pack_bits(zeros, bits))


def unpack_zero_points(packed: np.ndarray, bits: int, k_blocks: int) -> np.ndarray:
    return unpack_bits(packed, bits, k_blocks)
