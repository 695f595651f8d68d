import numpy as np
import pytest

from edge.export.quant import QuantizationError
from edge.export.quant.packing import (
    pack_bits,
    pack_weights,
    pack_zero_points,
    unpack_bits,
    unpack_weights,
    unpack_zero_points,
)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("k", [16, 200, 576])
def test_weights_round_trip(bits, block_size, k):
    rng = np.random.default_rng(bits * 1000 + block_size + k)
    codes = rng.integers(0, 1 << bits, size=(7, k), dtype=np.uint8)
    b = pack_weights(codes, bits, block_size)
    kb = -(-k // block_size)
    assert b.shape == (7, kb, block_size * bits // 8) and b.dtype == np.uint8
    np.testing.assert_array_equal(unpack_weights(b, bits, block_size, k), codes)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("k_blocks", [1, 3, 9, 36])
def test_zero_points_round_trip(bits, k_blocks):
    rng = np.random.default_rng(k_blocks)
    zeros = rng.integers(0, 1 << bits, size=(5, k_blocks), dtype=np.uint8)
    packed = pack_zero_points(zeros, bits)
    assert packed.shape == (5, -(-k_blocks * bits // 8))
    np.testing.assert_array_equal(unpack_zero_points(packed, bits, k_blocks), zeros)


def test_low_bits_first():
    assert pack_bits(np.array([1, 2]), 4).tolist() == [0x21]
    assert pack_bits(np.array([1, 2, 3, 0]), 2).tolist() == [0b00111001]
    assert unpack_bits(np.array([0x21], dtype=np.uint8), 4, 2).tolist() == [1, 2]


def test_rejects_what_matmulnbits_cannot_run():
    codes = np.zeros((2, 32), dtype=np.uint8)
    with pytest.raises(QuantizationError, match="3-bit"):
        pack_weights(codes, 3, 32)
    with pytest.raises(QuantizationError, match="block_size"):
        pack_weights(codes, 4, 24)
    with pytest.raises(QuantizationError, match="exceeds"):
        pack_bits(np.array([4]), 2)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_weights_packed_in_chunks_of_rows_equal_all_at_once(monkeypatch, bits):
    """pack_weights packs CHUNK_ROWS rows at a time: the same bytes as all rows at once (a short last block and a
    partial last chunk included)."""
    import edge.export.quant.packing as packing

    codes = np.random.default_rng(bits).integers(0, 1 << bits, (203, 70)).astype(np.uint8)
    whole = packing.pack_weights(codes, bits, 32)
    monkeypatch.setattr(packing, "CHUNK_ROWS", 16)
    chunked = packing.pack_weights(codes, bits, 32)
    assert chunked.dtype == whole.dtype and np.array_equal(chunked, whole)
    np.testing.assert_array_equal(packing.unpack_weights(chunked, bits, 32, 70), codes)
