"""The KV cache: one K and one V buffer per layer, allocated once at the planned context length.

GroupQueryAttention reads the past from and writes the new rows into the same buffer, so nothing is copied per token.
The valid prefix is `length`; rolling back rejected tokens is lowering it (their rows are overwritten later), and
accepted entries of a draft tree are compacted into place with `keep`.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from edge.config import ModelConfig


class KVCache:
    def __init__(self, config: ModelConfig, capacity: int, device: str = "cpu", dtype: str = "float32"):
        """dtype: the package's kv_dtype, "float32" or "float16" (edge.Attention on the CPU)."""
        self.capacity = capacity
        self.length = 0
        self.dtype = np.dtype(dtype)
        self.shape = shape = (1, config.num_kv_heads, capacity, config.head_dim)
        if device == "cpu":
            # numpy owns the memory (pages are committed only when written) and the OrtValues alias it, so the
            # runtime can compact entries with numpy and tests can read the cache directly.
            self.arrays = [np.zeros(shape, self.dtype) for _ in range(2 * config.num_layers)]
            self.values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self.arrays]
        else:
            self.arrays = []
            self.values = [ort.OrtValue.ortvalue_from_shape_and_type(shape, self.dtype, device, 0)
                           for _ in range(2 * config.num_layers)]

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(v.shape())) * self.dtype.itemsize for v in self.values)

    def trim(self, length: int) -> None:
        """Forget everything after the first `length` tokens."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot trim a cache of {self.length} tokens to {length}")
        self.length = length

    def keep(self, start: int, offsets: list[int]) -> None:
        """Keep, in order, the entries at start+offsets (accepted draft-tree nodes) and drop the rest after start."""
        src = [start + o for o in offsets]
        if src != list(range(start, start + len(src))):  # a chain's accepted prefix is already in place
            if not self.arrays:
                from edge.kernels.library import cuda_cache_keep

                _, kv_heads, capacity, head_dim = self.shape
                cuda_cache_keep([v.data_ptr() for v in self.values], kv_heads, capacity, head_dim, start, src)
            for a in self.arrays:
                a[:, :, start:start + len(src)] = a[:, :, src]
        self.length = start + len(src)
