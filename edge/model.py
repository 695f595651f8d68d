"""One decoder step on ONNX Runtime: S new tokens on top of the cached past, logits for the rows asked for.

Everything that persists across steps is bound once with IOBinding (the KV buffers, in and out, and the logits
buffer); the small per-step inputs are written in place and, on the CPU, bound again only when their shape
changes. This is the interface speculative decoding builds on: `step` with explicit positions, a tree attention bias
and several logits rows, then `cache.trim`/`cache.keep`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from edge.errors import ContextOverflowError, PackageError
from edge.kernels.graph import TOP
from edge.kv_cache import KVCache
from edge.package import Package
from edge.session import create_session

DEFAULT_PREFILL_CHUNK = 512
MASKED = np.float32(-1e9)  # what GroupQueryAttention's tree bias uses for "not an ancestor"


def logits_index(n: int, rows, max_rows: int) -> np.ndarray:
    """Which of the n new tokens get logits (default: the last)."""
    index = np.asarray([n - 1] if rows is None else rows, dtype=np.int64)
    if len(index) > max_rows:
        raise ValueError(f"at most {max_rows} logits rows per step, asked for {len(index)}")
    return index


STEP_INPUTS = ("input_ids", "position_ids", "logits_index", "seqlens_k", "total_sequence_length", "attention_bias")
KEPT_ROWS = 17  # steps of up to this many tokens (a draft of 16 and its root) keep a binding per shape (Decoder)


class BoundInputs:
    """The small per-step inputs of the decoder graphs (tokens, positions, lengths, logits rows, tree bias), written
    in place into buffers that stay bound to the graphs' IOBindings; shared by Decoder and edge.paging.PagedDecoder
    (whose layer graphs take some of them and whose head graph another).

    After a step has streamed the weights through the caches, whatever runs between two steps runs cold: binding the
    seven per-step tensors afresh took ~110 us a step, 3% of an int4 SmolLM2 step (Zen 5, 2 threads; 14 us warm).
    A tensor is bound again only when its shape changes: plain decoding rebinds only the attention bias, which
    grows by a column each step. That needs a session that reads the bound buffers where they are (the CPU's):
    onnxruntime copies an input bound for a GPU's nodes when it is bound, so there (`in_place=False`) every input
    is bound every step, or the graph would read the values of the step that last bound them (session 24: on an
    H100 the greedy tokens went wrong from the first, and so did every drafter's).
    """

    def __init__(self, targets: list[tuple[Any, tuple[str, ...]]], capacity: int, max_rows: int,
                 tree_attention: bool, package_root, zeros: CausalBias | None = None, step_tokens: int | None = None,
                 in_place: bool = True):
        """targets: (binding, the input names its graph takes) pairs; zeros: a causal bias shared with other
        BoundInputs (None: one of its own); step_tokens: the most tokens a step brings (None: the capacity);
        in_place: the session reads bound inputs in place (False: it copies them at binding, as for a GPU)."""
        self.targets, self.capacity, self.max_rows, self.in_place = targets, capacity, max_rows, in_place
        self.tree_attention, self.root = tree_attention, package_root
        self.ids = np.zeros((1, step_tokens or capacity), np.int64)
        self.positions = np.zeros((1, step_tokens or capacity), np.int64)
        self.rows = np.zeros(max_rows, np.int64)
        self.seqlens = np.zeros(1, np.int32)
        self.total = np.zeros((), np.int32)
        self.zeros = zeros or CausalBias()
        self.bound: dict[tuple[int, str], tuple[int, ...]] = {}  # (target, input name) -> the shape bound

    def write(self, past: int, tokens: np.ndarray, positions, logits_rows, attention_bias) -> int:
        """Put one step's inputs in place and bind what changed; returns the number of logits rows."""
        n = len(tokens)
        total = past + n
        if total > self.capacity:
            raise ContextOverflowError(f"{total} tokens do not fit in the context of {self.capacity}")
        if attention_bias is not None and not self.tree_attention:
            raise ValueError(f"{self.root} was exported without tree attention; re-export it")
        rows = logits_index(n, logits_rows, self.max_rows)
        self.ids[0, :n] = tokens
        self.positions[0, :n] = np.arange(past, total) if positions is None else positions
        self.rows[:len(rows)] = rows
        self.seqlens[0], self.total[()] = total - 1, total
        shapes = {"input_ids": (self.ids, (1, n)), "position_ids": (self.positions, (1, n)),
                  "logits_index": (self.rows, (len(rows),)), "seqlens_k": (self.seqlens, (1,)),
                  "total_sequence_length": (self.total, ())}
        bias = None
        if self.tree_attention:  # its shape changes every step: bound every step
            bias = (self.zeros.view(n, total) if attention_bias is None
                    else np.ascontiguousarray(attention_bias, dtype=np.float32))
        for i, (binding, names) in enumerate(self.targets):
            for name in names:
                if name == "attention_bias":
                    if bias is not None:
                        binding.bind_cpu_input(name, bias)
                    continue
                buffer, shape = shapes[name]
                if not self.in_place or self.bound.get((i, name)) != shape:  # `shape`: the buffer's leading part
                    binding.bind_cpu_input(name, buffer.reshape(-1)[:math.prod(shape)].reshape(shape))
                    self.bound[(i, name)] = shape
        return len(rows)


class CausalBias:
    """A causal step's attention bias: zeros, grown as steps need and never written."""

    def __init__(self):
        self.zeros = np.zeros(0, np.float32)

    def view(self, n: int, total: int) -> np.ndarray:
        if self.zeros.size < n * total:
            self.zeros = np.zeros(max(n * total, 2 * self.zeros.size), np.float32)
        return self.zeros[:n * total].reshape(1, 1, n, total)


class StepBinding:
    """One IOBinding of the decoder graph with the KV cache bound in place, its per-step inputs (BoundInputs) and the
    shapes of the outputs bound to it."""

    def __init__(self, session, cache: KVCache, num_layers: int, inputs: Callable[[Any], BoundInputs]):
        self.binding = session.io_binding()
        self.inputs = inputs(self.binding)
        self.outputs: dict[str, tuple[int, ...]] = {}  # output name -> the shape bound
        for i in range(num_layers):
            for j, kind in enumerate(("key", "value")):
                value = cache.values[2 * i + j]
                self.binding.bind_ortvalue_input(f"past_{kind}.{i}", value)
                self.binding.bind_ortvalue_output(f"present_{kind}.{i}", value)

    def bind_output(self, name: str, buffer: np.ndarray) -> None:
        """Bind a persistent output buffer's first rows, unless they are bound already."""
        if self.outputs.get(name) != buffer.shape:
            self.binding.bind_output(name, "cpu", 0, np.float32, list(buffer.shape), buffer.ctypes.data)
            self.outputs[name] = buffer.shape


class Decoder:
    def __init__(self, package: Package, context_length: int | None = None, device: str = "cpu",
                 threads: int | None = None, max_rows: int = 64, spin: bool | None = None):
        self.package = package
        self.config = package.config
        self.device = device
        self.context_length = min(context_length or self.config.max_context, self.config.max_context)
        if package.kv_dtype != "float32" and device != "cpu":
            raise PackageError(f"{package.root} keeps its KV cache in {package.kv_dtype}, which edge.Attention "
                               f"runs on the CPU only; use --device cpu, or run it with --kv-dtype float32")
        retype = package.kv_dtype if package.kv_dtype != package.graph_kv_dtype else None  # Package.with_kv_dtype
        self.session = create_session(package.graph_path, device, threads, package.custom_ops, spin, retype)
        self.cache = KVCache(self.config, self.context_length, device, package.kv_dtype)
        self.tree_attention = package.tree_attention
        self.max_rows = max_rows
        self._logits = np.empty((max_rows, self.config.vocab_size), np.float32)
        # The final hidden rows behind the logits, for a draft head; graphs exported before it have none.
        has_hidden = any(o.name == "hidden" for o in self.session.get_outputs())
        self._hidden = np.empty((max_rows, self.config.hidden_size), np.float32) if has_hidden else None
        self.hidden: np.ndarray | None = None  # the last step's rows of _hidden
        # Each logits row's argmax and maximum, from the head's kernel (kernels/graph.py: with_top); None
        # for graphs without it (stock ops, a GPU, older exports). Read them instead of the logits where they do.
        has_top = any(o.name == TOP for o in self.session.get_outputs())
        self._top = np.empty((max_rows, 2), np.float32) if has_top else None
        self.top: np.ndarray | None = None  # the last step's rows of _top: (rows, 2), index -1 where none
        self._zeros = CausalBias()
        self._bindings: dict[tuple[int, int], StepBinding] = {}  # (tokens, logits rows) -> its binding

    def _binding(self, tokens: int, rows: int) -> StepBinding:
        """The binding for steps of this shape. Speculation changes the step's size from one call to the next, and
        each change rebound the tokens, positions, logits rows and outputs: ~80-100 us a verify call after the step
        before had left the caches cold, against ~50 us for plain decoding's bias alone (session 23, in the loop). So
        each shape of up to KEPT_ROWS tokens keeps a binding of its own (the KV cache bound into each once); larger
        steps (prompt chunks) share one."""
        small = tokens <= KEPT_ROWS
        key = (tokens, rows) if small else (0, 0)
        entry = self._bindings.get(key)
        if entry is None:
            entry = self._bindings[key] = StepBinding(
                self.session, self.cache, self.config.num_layers,
                lambda b: BoundInputs([(b, STEP_INPUTS)], self.cache.capacity, self.max_rows, self.tree_attention,
                                      self.package.root, self._zeros, KEPT_ROWS if small else None,
                                      in_place=self.device == "cpu"))
        return entry

    def step(self, tokens, positions=None, logits_rows=None, attention_bias: np.ndarray | None = None) -> np.ndarray:
        """Append `tokens` to the cache and return logits (len(logits_rows), vocab); default: the last row only.

        The returned array is a view of a buffer the next step overwrites: copy it to keep it.
        """
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        bound = self._binding(len(tokens), 1 if logits_rows is None else len(logits_rows))
        rows = bound.inputs.write(self.cache.length, tokens, positions, logits_rows, attention_bias)
        out = self._logits[:rows]
        bound.bind_output("logits", out)
        if self._hidden is not None:
            self.hidden = self._hidden[:rows]
            bound.bind_output("hidden", self.hidden)
        if self._top is not None:
            self.top = self._top[:rows]
            bound.bind_output(TOP, self.top)
        self.session.run_with_iobinding(bound.binding)
        self.cache.length += len(tokens)
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
