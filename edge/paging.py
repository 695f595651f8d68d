"""Weight paging (TPI-LLM's sliding window): only W layers' weights are in memory; the others stay on disk.

A forward pass visits the paged layers in order, pass after pass, so the layer needed next is always known. A reader
thread walks that endless visit sequence ahead of the compute: visit k (layer k mod n) goes into slot k mod W as soon
as visit k - W has released that slot, so while layer i computes, layers i+1 .. i+W-1 are being read or are ready,
and the reads of the next pass start during the end of this one. Each layer's compute waits only for its own slot.
The slots are one buffer allocated up front; nothing is allocated per token.

A package exported by export/paged.py has one layer graph for all layers (weights as graph inputs); PagedDecoder
binds it per layer to that layer's KV cache and to the slot holding its weights, and has Decoder's step() interface.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edge.errors import DeviceError, PackageError
from edge.kv_cache import KVCache
from edge.model import DEFAULT_PREFILL_CHUNK, Decoder, logits_index, step_inputs
from edge.package import Package
from edge.session import create_session

READ_CHUNK = 32 << 20  # bytes per read call: big enough for the disk's full speed, small enough to stop promptly

Reader = Callable[[int, memoryview, int], None]


def read_into(fd: int, buffer: memoryview, offset: int) -> None:
    """Fill `buffer` from the file at `offset` with plain positioned reads (no memory map: the bytes land in the
    slot, not in pages the kernel may keep mapped into this process)."""
    done, size = 0, len(buffer)
    while done < size:
        n = os.preadv(fd, [buffer[done:done + READ_CHUNK]], offset + done)
        if n <= 0:
            raise PackageError(f"the layer data file ended at byte {offset + done}: the package is truncated; "
                               f"re-export it")
        done += n


class WeightWindow:
    """W slots, each holding one layer's weights, filled by a background reader in visit order.

    `acquire(layer)` returns the slot's bytes once that layer is in it; `release(layer)` gives the slot back to the
    reader. Layers must be acquired in the order of `layers`, cyclically (one forward pass after another).
    """

    def __init__(self, path: Path, offsets: list[int], layer_bytes: int, layers: list[int], window: int,
                 drop_behind: bool = False, reader: Reader = read_into, trace: bool = False):
        if window < 1:
            raise ValueError(f"the paging window needs at least one slot, got {window}")
        self.layers, self.offsets, self.layer_bytes = list(layers), offsets, layer_bytes
        self.window = min(window, len(self.layers))  # more slots than paged layers would only re-read them
        self.slots = np.empty((self.window, layer_bytes), np.uint8)  # pages are committed by the first read
        self.drop_behind, self.reader = drop_behind, reader
        self.trace: list[tuple[str, int, float, float]] | None = [] if trace else None
        self.bytes_read = 0
        self.read_seconds = 0.0
        self.wait_seconds = 0.0  # compute time lost waiting for reads
        self.max_in_use = 0  # most slots ever holding a layer that was loading, ready or computing at once
        self._slot_layer = [-1] * self.window  # which layer each slot holds (a slot that already has it skips the read)
        self._loaded = [-1] * self.window  # the visit each slot is ready for
        self._released = 0  # visits released so far, so also the next visit to acquire; visit k loads after k - W
        self._error: BaseException | None = None
        self._stop = False
        self._cond = threading.Condition()
        self._fd = os.open(path, os.O_RDONLY)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        self._thread = threading.Thread(target=self._read_loop, name="edge-weight-reader", daemon=True)
        self._thread.start()

    # -- reader thread --------------------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        visit = 0
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stop or visit - self.window < self._released)
                    if self._stop:
                        return
                    self.max_in_use = max(self.max_in_use, visit - self._released + 1)
                slot, layer = visit % self.window, self.layers[visit % len(self.layers)]
                if self._slot_layer[slot] != layer:
                    self._slot_layer[slot] = -1
                    self._read(layer, slot, next_layer=self.layers[(visit + 1) % len(self.layers)])
                    self._slot_layer[slot] = layer
                with self._cond:
                    self._loaded[slot] = visit
                    self._cond.notify_all()
                visit += 1
        except BaseException as exc:  # surfaced to the compute side by acquire()
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _read(self, layer: int, slot: int, next_layer: int) -> None:
        start = time.perf_counter()
        offset = self.offsets[layer]
        if hasattr(os, "posix_fadvise") and next_layer != layer:  # the disk starts on the next layer meanwhile
            os.posix_fadvise(self._fd, self.offsets[next_layer], self.layer_bytes, os.POSIX_FADV_WILLNEED)
        self.reader(self._fd, memoryview(self.slots[slot]), offset)
        if self.drop_behind:  # a device without spare memory: the next pass must read the disk again
            os.posix_fadvise(self._fd, offset, self.layer_bytes, os.POSIX_FADV_DONTNEED)
        end = time.perf_counter()
        self.read_seconds += end - start
        self.bytes_read += self.layer_bytes
        if self.trace is not None:
            self.trace.append(("read", layer, start, end))

    # -- compute side ---------------------------------------------------------------------------------------------
    def acquire(self, layer: int) -> np.ndarray:
        visit, slot = self._released, self._released % self.window
        expected = self.layers[visit % len(self.layers)]
        if layer != expected:
            raise RuntimeError(f"paged layers must run in order: asked for layer {layer}, next is {expected}")
        start = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: self._loaded[slot] == visit or self._error is not None)
            if self._error is not None:
                raise self._error
        self.wait_seconds += time.perf_counter() - start
        return self.slots[slot]

    def release(self, layer: int) -> None:
        with self._cond:
            self._released += 1
            self._cond.notify_all()

    def finish_pass(self) -> None:
        """Skip the rest of an interrupted pass, so the next pass starts at its first layer again."""
        if self._error is not None:
            return  # the reader is dead; acquire() reports its error
        while self._released % len(self.layers):
            layer = self.layers[self._released % len(self.layers)]
            self.acquire(layer)
            self.release(layer)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        os.close(self._fd)


def _package_file(package: Package, name: str) -> Path:
    """A file the paging section names: only one the manifest lists (load_package checked those stay inside the
    package folder and have the recorded size)."""
    if name not in package.manifest["files"]:
        raise PackageError(f"{package.root}: the manifest's paging section names {name!r}, which is not one of the "
                           f"package's files; re-export the package")
    return package.root / name


class PagedDecoder:
    """Decoder's step() on a paged package: `pinned` layers stay in memory, the rest stream through `window` slots.

    `max_tokens` bounds the tokens of one step (the prefill chunk): the activation buffers are sized for it once.
    `drop_behind` evicts each layer's file pages after reading it, as a device without spare memory would.
    """

    prefill = Decoder.prefill  # chunked prompt feeding and reset work unchanged on top of step()
    reset = Decoder.reset

    def __init__(self, package: Package, context_length: int | None = None, device: str = "cpu",
                 threads: int | None = None, max_rows: int = 64, window: int = 2, pinned: int = 0,
                 max_tokens: int = DEFAULT_PREFILL_CHUNK, drop_behind: bool = False, reader: Reader = read_into,
                 trace: bool = False):
        paging = package.manifest.get("paging")
        if not paging:
            raise PackageError(f"{package.root} is not a paged package; export it with edge.export.paged "
                               f"(export_paged) to run it with weight paging")
        if device != "cpu":
            raise DeviceError("weight paging runs on the CPU for now (its slots are host memory); use device='cpu'")
        self.package, self.config, self.device = package, package.config, device
        cfg = self.config
        if not 0 <= pinned <= cfg.num_layers:
            raise ValueError(f"pinned layers must be between 0 and {cfg.num_layers}, got {pinned}")
        self.context_length = min(context_length or cfg.max_context, cfg.max_context)
        self.tree_attention = package.tree_attention
        self.max_rows, self.max_tokens = max_rows, max_tokens
        self.layer_session = create_session(_package_file(package, paging["layer_graph"]), device, threads)
        self.head_session = create_session(package.graph_path, device, threads)
        self.cache = KVCache(cfg, self.context_length, device)
        self.tensors = [(t["name"], np.dtype(t["dtype"]), t["shape"], t["offset"]) for t in paging["tensors"]]
        emb = paging["embedding"]
        self.embedding = np.memmap(_package_file(package, emb["file"]), np.dtype(emb["dtype"]), "r", emb["offset"],
                                   tuple(emb["shape"]))  # a token reads one row; the table is never loaded whole
        data = _package_file(package, paging["layer_data"])
        offsets, layer_bytes = paging["layer_offsets"], paging["layer_bytes"]
        if len(offsets) != cfg.num_layers:
            raise PackageError(f"{package.root}: the paging index has {len(offsets)} layers, the model "
                               f"{cfg.num_layers}; re-export the package")
        self.pinned = np.empty((pinned, layer_bytes), np.uint8)
        with open(data, "rb") as f:
            for i in range(pinned):
                read_into(f.fileno(), memoryview(self.pinned[i]), offsets[i])
        self.window = (WeightWindow(data, offsets, layer_bytes, list(range(pinned, cfg.num_layers)), window,
                                    drop_behind, reader, trace) if pinned < cfg.num_layers else None)
        self.trace = self.window.trace if self.window else None
        self._close = weakref.finalize(self, self.window.close) if self.window else lambda: None  # stops the reader
        self._hidden = np.zeros((2, max_tokens, cfg.hidden_size), np.float32)  # ping-pong between layers
        self._logits = np.empty((max_rows, cfg.vocab_size), np.float32)
        self._layer = self.layer_session.io_binding()
        self._head = self.head_session.io_binding()

    @property
    def resident_layers(self) -> int:
        return len(self.pinned) + (self.window.window if self.window else 0)

    def step(self, tokens, positions=None, logits_rows=None, attention_bias: np.ndarray | None = None) -> np.ndarray:
        """Decoder.step: append `tokens` to the cache, return logits rows (a view the next step overwrites)."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = len(tokens)
        if n > self.max_tokens:
            raise ValueError(f"at most {self.max_tokens} tokens per step (the paged decoder's max_tokens), got {n}")
        inputs = step_inputs(self.cache.length, n, self.cache.capacity, positions, attention_bias,
                             self.tree_attention, self.package.root)
        rows = logits_index(n, logits_rows, self.max_rows)
        for name, value in inputs.items():
            self._layer.bind_cpu_input(name, value)
        hidden = self._hidden[0, :n]
        np.take(self.embedding, tokens, axis=0, out=hidden)
        if self.config.embedding_scale != 1.0:
            hidden *= np.float32(self.config.embedding_scale)
        try:
            for layer in range(self.config.num_layers):
                self._run_layer(layer, n)
        except BaseException:
            if self.window is not None:
                self.window.finish_pass()  # keep the reader's visit order aligned with the next pass
            raise
        self.cache.length += n
        return self._run_head(n, rows)

    def _run_layer(self, layer: int, n: int) -> None:
        paged = layer >= len(self.pinned)
        weights = self.window.acquire(layer) if paged else self.pinned[layer]
        try:
            start = time.perf_counter()
            self._bind_layer(layer, n, weights.ctypes.data)
            self.layer_session.run_with_iobinding(self._layer)
            if self.trace is not None:
                self.trace.append(("compute", layer, start, time.perf_counter()))
        finally:
            if paged:
                self.window.release(layer)

    def _bind_layer(self, layer: int, n: int, weights: int) -> None:
        """Point the one layer session at this layer's weights (by address in their slot) and KV cache."""
        b, shape = self._layer, [1, n, self.config.hidden_size]
        for name, dtype, tensor_shape, offset in self.tensors:
            b.bind_input(name, "cpu", 0, dtype, tensor_shape, weights + offset)
        b.bind_input("hidden", "cpu", 0, np.float32, shape, self._hidden[layer % 2].ctypes.data)
        b.bind_output("hidden_out", "cpu", 0, np.float32, shape, self._hidden[(layer + 1) % 2].ctypes.data)
        for j, kind in enumerate(("key", "value")):
            value = self.cache.values[2 * layer + j]
            b.bind_ortvalue_input(f"past_{kind}", value)
            b.bind_ortvalue_output(f"present_{kind}", value)

    def _run_head(self, n: int, rows: np.ndarray) -> np.ndarray:
        b, hidden = self._head, self._hidden[self.config.num_layers % 2]
        b.bind_input("hidden", "cpu", 0, np.float32, [1, n, self.config.hidden_size], hidden.ctypes.data)
        b.bind_cpu_input("logits_index", rows)
        out = self._logits[: len(rows)]
        b.bind_output("logits", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        self.head_session.run_with_iobinding(b)
        return out

    def stats(self) -> dict[str, Any]:
        w = self.window
        return {"window": w.window if w else 0, "pinned": len(self.pinned), "bytes_read": w.bytes_read if w else 0,
                "read_seconds": w.read_seconds if w else 0.0, "wait_seconds": w.wait_seconds if w else 0.0,
                "max_in_use": w.max_in_use if w else 0}

    def close(self) -> None:
        """Stop the reader thread and close the layer file (also done when the decoder is garbage-collected)."""
        self._close()
