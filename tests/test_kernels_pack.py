"""edge.kernels.pack: the tile-major layout decoded independently, padding, quantize, outliers, bad input."""

from __future__ import annotations

import numpy as np
import pytest

import edge.kernels as ek
from edge.errors import EdgeError
from edge.kernels.pack import unit_bytes, unit_k


def _decode(packed: ek.PackedWeight) -> np.ndarray:
    """Read codes back element by element, following the layout as documented (independent of pack_codes)."""
    bits, n, k = packed.bits, packed.n, packed.k
    uk, ub = unit_k(bits), unit_bytes(bits)
    k_pad = -(-k // packed.group_size) * packed.group_size
    tile_bytes = k_pad // uk * ub
    raw = packed.codes.tobytes()
    out = np.zeros((n, k), dtype=np.uint8)
    for col in range(n):
        t, j = divmod(col, 8)
        for kk in range(k):
            u, i = divmod(kk, uk)
            base = t * tile_bytes + u * ub
            word = int.from_bytes(raw[base + 4 * j : base + 4 * j + 4], "little")
            if bits in (4, 8):
                code = (word >> (bits * i)) & ((1 << bits) - 1)
            else:
                code = (word >> (2 * i)) & 3
                if bits == 3:
                    hi = int.from_bytes(raw[base + 32 + 2 * j : base + 34 + 2 * j], "little")
                    code |= ((hi >> i) & 1) << 2
            out[col, kk] = code
    return out


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("n, k, group", [(8, 32, 16), (13, 50, 16), (20, 100, 32)])
def test_layout_round_trip(bits: int, n: int, k: int, group: int) -> None:
    rng = np.random.default_rng(bits * 100 + n)
    codes = rng.integers(0, 1 << bits, size=(n, k)).astype(np.uint8)
    groups = -(-k // group)
    packed = ek.pack(codes, np.ones((n, groups), np.float32), None, bits=bits, group_size=group)
    tiles = -(-n // 8)
    assert packed.codes.nbytes == tiles * (-(-k // group) * group) * bits  # exactly `bits` bits per padded weight
    assert packed.scales.shape == (tiles, groups, 8)
    np.testing.assert_array_equal(_decode(packed), codes)


def test_scales_and_zeros_are_tiled() -> None:
    scales = np.arange(10 * 2, dtype=np.float32).reshape(10, 2)
    zeros = np.arange(10 * 2, dtype=np.uint8).reshape(10, 2)
    packed = ek.pack(np.zeros((10, 64), np.uint8), scales, zeros, bits=4, group_size=32)
    assert packed.scales[1, 1, 0] == scales[8, 1] and packed.zeros[0, 0, 3] == zeros[3, 0]
    assert packed.scales[1, 0, 2] == 0  # padded column


def test_dequantize_and_reference() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 64))
    codes, scales, zeros = ek.quantize(w, 4, 32)
    packed = ek.pack(codes, scales, zeros, bits=4, group_size=32)
    wq = ek.dequantize(packed, codes)
    assert np.abs(wq - w).max() <= scales.max() / 2 + 1e-6  # round to nearest: at most half a step
    x = rng.standard_normal((3, 64))
    np.testing.assert_allclose(ek.reference(x, wq, np.ones(16)), x @ wq.T + 1)


def test_float_zero_quantize() -> None:
    w = np.random.default_rng(1).standard_normal((8, 32))
    codes, scales, zeros = ek.quantize(w, 3, 16, float_zeros=True)
    assert zeros.dtype == np.float32
    wq = ek.dequantize(ek.pack(codes, scales, zeros, bits=3, group_size=16), codes)
    assert np.abs(wq - w).max() <= scales.max() / 2 + 1e-6


def test_outliers_csr() -> None:
    o = ek.make_outliers(4, 10, rows=[2, 0, 2], cols=[5, 1, 3], values=[1.0, 2.0, 3.0])
    np.testing.assert_array_equal(o.rowptr, [0, 1, 1, 3, 3])
    np.testing.assert_array_equal(o.cols, [1, 3, 5])
    np.testing.assert_array_equal(o.values, np.array([2.0, 3.0, 1.0], np.float16))
    packed = ek.pack(np.zeros((4, 10), np.uint8), np.ones((4, 1), np.float32), np.zeros((4, 1), np.uint8), bits=2,
                     group_size=16, outliers=o)
    w = ek.dequantize(packed, np.zeros((4, 10), np.uint8))
    assert w[2, 5] == 1.0 and w[0, 1] == 2.0 and w.sum() == 6.0


@pytest.mark.parametrize("kwargs, match", [
    ({"bits": 5, "group_size": 32}, "2-, 3-, 4- or 8-bit"),
    ({"bits": 4, "group_size": 24}, "multiple of 16"),
    ({"bits": 4, "group_size": 256}, "multiple of 16"),
    ({"bits": 2, "group_size": 32}, r"codes must lie in \[0, 4\)"),
])
def test_bad_input(kwargs: dict, match: str) -> None:
    codes = np.full((8, 64), 7, np.uint8)
    groups = -(-64 // kwargs["group_size"])
    with pytest.raises(EdgeError, match=match):
        ek.pack(codes, np.ones((8, groups), np.float32), **kwargs)


def test_wrong_scales_shape() -> None:
    with pytest.raises(EdgeError, match="scales must have shape"):
        ek.pack(np.zeros((8, 64), np.uint8), np.ones((8, 3), np.float32), bits=4, group_size=32)
    with pytest.raises(EdgeError, match="outlier coordinates"):
        ek.make_outliers(4, 10, rows=[4], cols=[0], values=[1.0])


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_codes_packed_in_chunks_of_tiles_equal_all_at_once(monkeypatch, bits):
    """pack_codes packs CHUNK_TILES tiles at a time (its shifted words stay small): the same bytes as all tiles at
    once, a partial last chunk and padded columns included."""
    import importlib

    pack = importlib.import_module("edge.kernels.pack")  # the module: edge.kernels.pack is also a function's name
    codes = np.random.default_rng(bits).integers(0, 1 << bits, (203, 96)).astype(np.uint8)
    whole = pack.pack_codes(codes, bits, 32)
    monkeypatch.setattr(pack, "CHUNK_TILES", 3)
    np.testing.assert_array_equal(pack.pack_codes(codes, bits, 32), whole)
