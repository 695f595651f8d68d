"""Weight paging (TPI-LLM's sliding window): only W layers' weights are in memory; the others stay on disk.

A forward pass visits the paged layers in order, pass after pass, so the layer needed next is always known. A reader
thread walks that endless visit sequence ahead of the compute: visit k (layer k mod n) goes into slot k mod W as soon
as visit k - W has released that slot, so while layer i computes, layers i+1 .. i+W-1 are being read or are ready,
and the reads of the next pass start during the end of this one. Each layer's compute waits only for its own slot.
The slots are one buffer allocated up front; nothing is allocated per token.

A package exported by export/paged.py has one layer graph for all layers (weights as graph inputs: float32 MatMul
or edge.QMatMul's packed low-bit codes); PagedDecoder binds it per layer to that layer's KV cache and to the slot
holding its weights, and has Decoder's step() interface.
"""

from __future__ import annotations

import errno
import mmap
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
from edge.model import DEFAULT_PREFILL_CHUNK, BoundInputs, Decoder
from edge.package import Package
from edge.session import create_session

READ_CHUNK = 32 << 20  # bytes per read call: big enough for the disk's full speed, small enough to stop promptly
DIRECT_ALIGN = 4096  # O_DIRECT needs buffer, offset and length aligned to the device's block; the exporter pages them

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


def _page_aligned(shape: tuple[int, int]) -> np.ndarray:
    """Zeroed uint8 slots starting on a page boundary (an anonymous mapping), so O_DIRECT can read into them."""
    size = max(1, shape[0] * shape[1])
    return np.frombuffer(mmap.mmap(-1, size), np.uint8, shape[0] * shape[1]).reshape(shape)


def _open_direct(path: Path) -> int | None:
    """An O_DIRECT descriptor of `path`, or None where the OS or file system has none (macOS, tmpfs)."""
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return None


class WeightWindow:
    """W slots, each holding one layer's weights, filled by a background reader in visit order.

    `acquire(layer)` returns the slot's bytes once that layer is in it; `release(layer)` gives the slot back to the
    reader. Layers must be acquired in the order of `layers`, cyclically (one forward pass after another).
    """

    def __init__(self, path: Path, offsets: list[int], layer_bytes: int, layers: list[int], window: int,
                 drop_behind: bool = False, reader: Reader = read_into, trace: bool = False, hint_next: bool = False):
        """`drop_behind`: a device without spare memory, where every pass must read the disk again. The reader then
        reads with O_DIRECT where the file system allows it (the disk writes straight into the slot: no page-cache
        copy to make and drop, half the reader's CPU, which a busy machine does not give it), else buffered with
        each layer's pages dropped after the read. Measured on this machine's virtio disk (28 MiB int4 layers, 6
        decode steps, load ~5 on 2 cores): 1.29 and 1.13 tok/s direct against 0.99 and 0.92 buffered, 1.2-1.4 s
        of CPU against 2.6-3.1 s.

        `hint_next` asks the kernel for the next layer (POSIX_FADV_WILLNEED) before reading this one. Off by
        default: the hint starts the next layer's I/O in this thread, ahead of the read it waits for, and the
        file's sequential readahead (POSIX_FADV_SEQUENTIAL) already keeps the disk busy. Measured with buffered
        drop-behind reads, 4 decode steps twice each: the reader moved 1055 and 1112 MB/s without the hint, 703 and
        680 MB/s with it."""
        if window < 1:
            raise ValueError(f"the paging window needs at least one slot, got {window}")
        self.layers, self.offsets, self.layer_bytes = list(layers), offsets, layer_bytes
        self.window = min(window, len(self.layers))  # more slots than paged layers would only re-read them
        self.slots = _page_aligned((self.window, layer_bytes))  # pages are committed by the first read
        self.drop_behind, self.reader = drop_behind, reader
        self.hint_next = hint_next and hasattr(os, "posix_fadvise")
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
        aligned = layer_bytes % DIRECT_ALIGN == 0 and all(offsets[i] % DIRECT_ALIGN == 0 for i in self.layers)
        self._direct_fd = _open_direct(path) if drop_behind and aligned else None
        self.direct = self._direct_fd is not None
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
        if self.hint_next and next_layer != layer:
            os.posix_fadvise(self._fd, self.offsets[next_layer], self.layer_bytes, os.POSIX_FADV_WILLNEED)
        if self._direct_fd is not None:
            try:
                self.reader(self._direct_fd, memoryview(self.slots[slot]), offset)
            except OSError as exc:  # a file system that opens O_DIRECT but refuses the reads: read buffered
                if exc.errno != errno.EINVAL:
                    raise
                os.close(self._direct_fd)
                self._direct_fd, self.direct = None, False
        if self._direct_fd is None:
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
        if self._direct_fd is not None:
            os.close(self._direct_fd)


def _package_file(package: Package, name: str) -> Path:
    """A file the paging section names: only one the manifest lists (load_package checked those stay inside the
    package folder and have the recorded size)."""
    if name not in package.manifest["files"]:
        raise PackageError(f"{package.root}: the manifest's paging section names {name!r}, which is not one of the "
                           f"package's files; re-export the package")
    return package.root / name


def _memmap(package: Package, entry: dict[str, Any]) -> np.memmap:
    return np.memmap(_package_file(package, entry["file"]), np.dtype(entry["dtype"]), "r", entry["offset"],
                     tuple(entry["shape"]))


class FloatRows:
    """A float32 embedding table read through a memory map: a token touches one row, the table is never loaded."""

    def __init__(self, table: np.ndarray):
        self.table = table

    def gather(self, tokens: np.ndarray, out: np.ndarray) -> None:
        np.take(self.table, tokens, axis=0, out=out)


class Int4Rows:
    """A 4-bit table in MatMulNBits' layout (what the resident graph's GatherBlockQuantized reads), dequantized one
    row at a time as that op does: (code - zero point) * scale in float32, codes and zero points low nibble first."""

    def __init__(self, qweight: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, n: int, k: int):
        self.qweight, self.scales, self.zero_points, self.k = qweight, scales, zero_points, k
        if qweight.ndim != 3 or qweight.shape[0] != n or scales.shape != qweight.shape[:2]:
            raise PackageError(f"the paged int4 embedding table has inconsistent shapes {qweight.shape} and "
                               f"{scales.shape}; re-export the package")

    def gather(self, tokens: np.ndarray, out: np.ndarray) -> None:
        packed = np.asarray(self.qweight[tokens])  # (n, blocks, block/2)
        codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(len(tokens), packed.shape[1], -1)
        zp = np.asarray(self.zero_points[tokens])
        zeros = np.stack([zp & 0xF, zp >> 4], axis=-1).reshape(len(tokens), -1)[:, :packed.shape[1]]
        values = (codes.astype(np.float32) - zeros.astype(np.float32)[..., None]) * self.scales[tokens][..., None]
        out[:] = values.reshape(len(tokens), -1)[:, :self.k]


def embedding_table(package: Package, entry: dict[str, Any]) -> FloatRows | Int4Rows:
    """The token embedding table the manifest's paging section describes (float32, or 4-bit MatMulNBits layout)."""
    if entry.get("format", "float32") != "matmulnbits":
        return FloatRows(_memmap(package, entry))
    if entry.get("bits") != 4:
        raise PackageError(f"{package.root}: the paged embedding table has {entry.get('bits')}-bit codes; only 4-bit "
                           f"tables are supported, re-export the package")
    n, k = entry["shape"]
    return Int4Rows(_memmap(package, entry["qweight"]), _memmap(package, entry["scales"]),
                    _memmap(package, entry["zero_points"]), n, k)


class PagedDecoder:
    """Decoder's step() on a paged package: `pinned` layers stay in memory, the rest stream through `window` slots.

    `max_tokens` bounds the tokens of one step (the prefill chunk): the activation buffers are sized for it once.
    `drop_behind` evicts each layer's file pages after reading it, as a device without spare memory would.
    """

    prefill = Decoder.prefill  # chunked prompt feeding and reset work unchanged on top of step()
    reset = Decoder.reset
    top = None  # its head graph has no row tops (Decoder.top): greedy steps read the logits

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
        ops = package.custom_ops
        self.layer_session = create_session(_package_file(package, paging["layer_graph"]), device, threads, ops)
        self.head_session = create_session(package.graph_path, device, threads, ops)
        # (session, binding) per layer: Gemma 3's sliding-window layers run their own graph (its window size and
        # rope base differ) over the same weight layout
        self._runs = [(self.layer_session, self.layer_session.io_binding())] * cfg.num_layers
        if paging.get("sliding_layer_graph"):
            sliding = create_session(_package_file(package, paging["sliding_layer_graph"]), device, threads, ops)
            run = (sliding, sliding.io_binding())
            for i in paging["sliding_layers"]:
                self._runs[i] = run
        self.cache = KVCache(cfg, self.context_length, device)
        self.tensors = [(t["name"], np.dtype(t["dtype"]), t["shape"], t["offset"]) for t in paging["tensors"]]
        self.embedding = embedding_table(package, paging["embedding"])  # rows are read on demand, never the table
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
        self._head = self.head_session.io_binding()
        layer_inputs = ("position_ids", "seqlens_k", "total_sequence_length", "attention_bias")
        layer_bindings = {id(b): b for _, b in self._runs}.values()  # each graph's binding once
        self._inputs = BoundInputs([(b, layer_inputs) for b in layer_bindings] + [(self._head, ("logits_index",))],
                                   self.cache.capacity, max_rows, self.tree_attention, package.root)

    @property
    def resident_layers(self) -> int:
        return len(self.pinned) + (self.window.window if self.window else 0)

    def step(self, tokens, positions=None, logits_rows=None, attention_bias: np.ndarray | None = None) -> np.ndarray:
        """Decoder.step: append `tokens` to the cache, return logits rows (a view the next step overwrites)."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = len(tokens)
        if n > self.max_tokens:
            raise ValueError(f"at most {self.max_tokens} tokens per step (the paged decoder's max_tokens), got {n}")
        rows = self._inputs.write(self.cache.length, tokens, positions, logits_rows, attention_bias)
        hidden = self._hidden[0, :n]
        self.embedding.gather(tokens, hidden)
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
            binding = self._bind_layer(layer, n, weights.ctypes.data)
            self._runs[layer][0].run_with_iobinding(binding)
            if self.trace is not None:
                self.trace.append(("compute", layer, start, time.perf_counter()))
        finally:
            if paged:
                self.window.release(layer)

    def _bind_layer(self, layer: int, n: int, weights: int) -> Any:
        """Point this layer's session at its weights (by address in their slot) and KV cache; return the binding."""
        b, shape = self._runs[layer][1], [1, n, self.config.hidden_size]
        for name, dtype, tensor_shape, offset in self.tensors:
            b.bind_input(name, "cpu", 0, dtype, tensor_shape, weights + offset)
        b.bind_input("hidden", "cpu", 0, np.float32, shape, self._hidden[layer % 2].ctypes.data)
        b.bind_output("hidden_out", "cpu", 0, np.float32, shape, self._hidden[(layer + 1) % 2].ctypes.data)
        for j, kind in enumerate(("key", "value")):
            value = self.cache.values[2 * layer + j]
            b.bind_ortvalue_input(f"past_{kind}", value)
            b.bind_ortvalue_output(f"present_{kind}", value)
        return b

    def _run_head(self, n: int, rows: int) -> np.ndarray:
        b, hidden = self._head, self._hidden[self.config.num_layers % 2]
        b.bind_input("hidden", "cpu", 0, np.float32, [1, n, self.config.hidden_size], hidden.ctypes.data)
        out = self._logits[:rows]
        b.bind_output("logits", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        self.head_session.run_with_iobinding(b)
        return out

    def stats(self) -> dict[str, Any]:
        w = self.window
        return {"window": w.window if w else 0, "pinned": len(self.pinned), "bytes_read": w.bytes_read if w else 0,
                "read_seconds": w.read_seconds if w else 0.0, "wait_seconds": w.wait_seconds if w else 0.0,
                "max_in_use": w.max_in_use if w else 0, "direct": w.direct if w else False}

    def close(self) -> None:
        """Stop the reader thread and close the layer file (also done when the decoder is garbage-collected)."""
        self._close()
