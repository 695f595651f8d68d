import numpy as np
import pytest

from edge.kv_cache import KVCache
from tiny_models import tiny_llama


def test_buffers_are_allocated_once_at_capacity_and_trim_is_a_length():
    _, imported = tiny_llama()
    cache = KVCache(imported.config, capacity=32)
    assert cache.nbytes == 32 * imported.config.kv_bytes_per_token()
    cache.length = 10
    cache.trim(4)
    assert cache.length == 4
    with pytest.raises(ValueError):
        cache.trim(5)
    half = KVCache(imported.config, capacity=32, dtype="float16")  # a package exported with kv_dtype float16
    assert half.arrays[0].dtype == np.float16 and half.nbytes * 2 == cache.nbytes


def test_keep_compacts_accepted_tree_nodes_in_order():
    _, imported = tiny_llama()
    cache = KVCache(imported.config, capacity=16)
    for a in cache.arrays:
        a[:] = np.arange(16, dtype=np.float32)[None, None, :, None]
    cache.length = 10
    cache.keep(start=5, offsets=[0, 2, 4])
    assert cache.length == 8
    for a in cache.arrays:
        assert list(a[0, 0, 5:8, 0]) == [5.0, 7.0, 9.0]
        assert list(a[0, 0, :5, 0]) == [0, 1, 2, 3, 4]
