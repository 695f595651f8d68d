"""One decoder step on ONNX Runtime: S new tokens on top of the cached past, logits for the rows asked for.

Everything that persists across steps is bound once with IOBinding (the KV buffers, in and out, and the logits
buffer); per step only the small index inputs are rebound. This is the interface speculative decoding builds on:
`step` with explicit positions, a tree attention bias and several logits rows, then `cache.trim`/`cache.keep`.
"""

from __future__ import annotations


import numpy as np
import onnxruntime as ort

from edge.errors import ContextOverflowError
from edge.kv_cache import KVCache
from edge.package import Package
from edge.session import create_session

DEFAULT_PREFILL_CHUNK = 512
MASKED = np.float32(-1e9)  # what GroupQueryAttention's tree bias uses for "not an ancestor"


class Decoder:
    def __init__(self, package: Package, context_length: int | None = None, device: str = "cpu",
                 threads: int | None = None, max_rows: int = 64):
        self.package = package
        self.config = package.config
        self.device = device
        self.context_length = min(context_length or self.config.max_context, self.config.max_context)
        self.session = create_session(package.graph_path, device, threads, package.custom_ops)
        self.cache = KVCache(self.config, self.context_length, device)
        self.tree_attention = package.tree_attention
        self.max_rows = max_rows
        self._logits = np.empty((max_rows, self.config.vocab_size), np.float32)
        self._binding = self.session.io_binding()
        for i in range(self.config.num_layers):
            for j, kind in enumerate(("key", "value")):
                value = self.cache.values[2 * i + j]
                self._binding.bind_ortvalue_input(f"past_{kind}.{i}", value)
                self._binding.bind_ortvalue_output(f"present_{kind}.{i}", value)

    def step(self, tokens, positions=None, logits_rows=None, attention_bias: np.ndarray | None = None) -> np.ndarray:
        """Append `tokens` to the cache and return logits (len(logits_rows), vocab); default: the last row only.

        The returned array is a view of a buffer the next step overwrites: copy it to keep it.
        """
        tokens = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
        past, n = self.cache.length, tokens.shape[1]
        total = past + n
        if total > self.cache.capacity:
            raise ContextOverflowError(f"{total} tokens do not fit in the context of {self.cache.capacity}")
        if positions is None:
            positions = np.arange(past, total, dtype=np.int64)
        rows = np.asarray([n - 1] if logits_rows is None else logits_rows, dtype=np.int64)
        if len(rows) > self.max_rows:
            raise ValueError(f"at most {self.max_rows} logits rows per step, asked for {len(rows)}")
        b = self._binding
        b.bind_cpu_input("input_ids", tokens)
        b.bind_cpu_input("position_ids", np.asarray(positions, dtype=np.int64).reshape(1, n))
        b.bind_cpu_input("seqlens_k", np.array([total - 1], dtype=np.int32))
        b.bind_cpu_input("total_sequence_length", np.array(total, dtype=np.int32))
        b.bind_cpu_input("logits_index", rows)
        if self.tree_attention:
            if attention_bias is None:
                attention_bias = np.zeros((1, 1, n, total), np.float32)  # plain causal attention
            b.bind_cpu_input("attention_bias", np.ascontiguousarray(attention_bias, dtype=np.float32))
        elif attention_bias is not None:
            raise ValueError(f"{self.package.root} was exported without tree attention; re-export it")
        out = self._logits[: len(rows)]
        b.bind_output("logits", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        self.session.run_with_iobinding(b)
        self.cache.length = total
        return out

    def prefill(self, tokens, chunk: int = DEFAULT_PREFILL_CHUNK) -> np.ndarray:
        """Feed a prompt in chunks (bounded activation memory) and return the last token's logits."""
        tokens = list(tokens)
        if not tokens:
            raise ValueError("empty prompt")
        for start in range(0, len(tokens), chunk):
            logits = self.step(tokens[start:start + chunk])
        return logits[0]

    def reset(self) -> None:
        self.cache.trim(0)
