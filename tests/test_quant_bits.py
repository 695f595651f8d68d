import numpy as np
import pytest

from edge.export.quant.bits import runtime_bits_per_weight, storage_bits_per_weight
from edge.export.quant.qlinear import QuantizedLinear
from edge.export.quant.rtn import quantize_rtn


def test_rtn_int4_block32():
    q = quantize_rtn(np.random.default_rng(0).normal(size=(8, 128)).astype(np.float32), 4, 32)
    assert storage_bits_per_weight(q) == pytest.approx(4 + (16 + 4) / 32)  # fp16 scale + 4-bit zero per block
    assert runtime_bits_per_weight(q) == pytest.approx(4 + (32 + 4) / 32)  # float32 scales in the stock-op form


def test_three_bit_codes_cost_four_at_run_time_and_offsets_count():
    codes = np.zeros((4, 64), np.uint8)
    ones = np.ones((4, 2), np.float32)
    q = QuantizedLinear(codes, ones, np.zeros((4, 2), np.uint8), 3, 32, offsets=ones)
    assert storage_bits_per_weight(q) == pytest.approx(3 + (16 + 3 + 16) / 32)
    assert runtime_bits_per_weight(q) == pytest.approx(4 + (32 + 4 + 32) / 32)


def test_per_channel_is_reblocked_for_run_time():
    q = quantize_rtn(np.random.default_rng(1).normal(size=(4, 256)).astype(np.float32), 2, 10_000)
    assert storage_bits_per_weight(q) == pytest.approx(2 + 18 / 256)
    assert runtime_bits_per_weight(q, block_size=64) == pytest.approx(2 + 4 * (32 + 2) / 256)
