"""One decoder step on ONNX Runtime: S new tokens on top of the cached past, logits for the rows asked for.

Everything that persists across steps is bound once with IOBinding (the KV buffers, in and out, and the logits
buffer); per step only the small index inputs are rebound. This is the interface speculative decoding builds on:
`step` with explicit positions, a tree attention bias and several logits rows, then `cache.trim`/`cache.keep`.
"""

from __future__ import annotations


import numpy as np

from edge.errors import ContextOverflowError
from edge.kv_cache import KVCache
from edge.package import Package
from edge.session import create_session

DEFAULT_PREFILL_CHUNK = 512
MASKED = np.float32(-1e9)  # what GroupQueryAttention's tree bias uses for "not an ancestor"


def step_inputs(past: int, n: int, capacity: int, positions, attention_bias, tree_attention: bool,
                package_root) -> dict[str, np.ndarray]:
    """The per-step inputs of GroupQueryAttention (lengths, positions, tree bias) for n new tokens after `past`:
    shared by every decoder graph, whole (Decoder) or one layer at a time (edge.paging.PagedDecoder)."""
    total = past + n
    if total > capacity:
        raise ContextOverflowError(f"{total} tokens do not fit in the context of {capacity}")
    if positions is None:
        positions = np.arange(past, total, dtype=np.int64)
    inputs = {"position_ids": np.asarray(positions, dtype=np.int64).reshape(1, n),
              "seqlens_k": np.array([total - 1], dtype=np.int32),
              "total_sequence_length": np.array(total, dtype=np.int32)}
    if tree_attention:
        bias = np.zeros((1, 1, n, total), np.float32) if attention_bias is None else attention_bias  # causal
        inputs["attention_bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    elif attention_bias is not None:
        raise ValueError(f"{package_root} was exported without tree attention; re-export it")
    return inputs


def logits_index(n: int, rows, max_rows: int) -> np.ndarray:
    """Which of the n new tokens get logits (default: the last)."""
    index = np.asarray([n - 1] if rows is None else rows, dtype=np.int64)
    if len(index) > max_rows:
        raise ValueError(f"at most {max_rows} logits rows per step, asked for {len(index)}")
    return index


class Decoder:
    def __init__(self, package: Package, context_length: int | None = None, device: str = "cpu",
                 threads: int | None = None, max_rows: int = 64, spin: bool | None = None):
        self.package = package
        self.config = package.config
        self.device = device
        self.context_length = min(context_length or self.config.max_context, self.config.max_context)
        self.session = create_session(package.graph_path, device, threads, package.custom_ops, spin)
        self.cache = KVCache(self.config, self.context_length, device)
        self.tree_attention = package.tree_attention
        self.max_rows = max_rows
        self._logits = np.empty((max_rows, self.config.vocab_size), np.float32)
        # The final hidden rows behind the logits, for a draft head; graphs exported before it have none.
        has_hidden = any(o.name == "hidden" for o in self.session.get_outputs())
        self._hidden = np.empty((max_rows, self.config.hidden_size), np.float32) if has_hidden else None
        self.hidden: np.ndarray | None = None  # the last step's rows of _hidden
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
        n = tokens.shape[1]
        inputs = step_inputs(self.cache.length, n, self.cache.capacity, positions, attention_bias,
                             self.tree_attention, self.package.root)
        rows = logits_index(n, logits_rows, self.max_rows)
        b = self._binding
        for name, value in (("input_ids", tokens), ("logits_index", rows), *inputs.items()):
            b.bind_cpu_input(name, value)
        out = self._logits[: len(rows)]
        b.bind_output("logits", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        if self._hidden is not None:
            self.hidden = self._hidden[: len(rows)]
            b.bind_output("hidden", "cpu", 0, np.float32, list(self.hidden.shape), self.hidden.ctypes.data)
        self.session.run_with_iobinding(b)
        self.cache.length += n
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
