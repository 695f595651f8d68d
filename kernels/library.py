"""Finding and registering edge's custom-op library with an onnxruntime SessionOptions.

The library is optional: it is built by the package's install step when a C++ compiler exists (kernels/build.py).
Graphs exported with stock ops never need it; a graph that uses edge.QMatMul calls register() and gets a clear
error naming what to install when the library is missing or does not match the runtime.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from pathlib import Path
from typing import Any

from edge.errors import EdgeError

HERE = Path(__file__).resolve().parent
CPU_LIBRARY = "libedge_kernels.so"
CUDA_LIBRARY = "libedge_kernels_cuda.so"
DOMAIN = "edge"
OP_TYPE = "QMatMul"
ENV_LIBRARY = "EDGE_KERNELS_LIBRARY"  # override: an explicit path (tests use a missing one)


class KernelLibraryError(EdgeError):
    """edge's custom-op library is missing or could not be registered with onnxruntime."""


def library_path(cuda: bool = False) -> Path | None:
    """The built library, or None when it was not built (no compiler at install time).

    cuda=True asks for the CUDA build (which also carries the CPU op); it falls back to the CPU library when the CUDA
    one was not built, since a model must load anywhere.
    """
    override = os.environ.get(ENV_LIBRARY)
    if override:
        path = Path(override)
        return path if path.is_file() else None
    names = (CUDA_LIBRARY, CPU_LIBRARY) if cuda else (CPU_LIBRARY,)
    return next((HERE / name for name in names if (HERE / name).is_file()), None)


def register(session_options: Any, cuda: bool = False) -> Path:
    """Register edge's ops (domain "edge") with an onnxruntime.SessionOptions; returns the library used.

    Pass cuda=True for sessions on CUDAExecutionProvider (needs onnxruntime-gpu, whose CUDA 13 runtime libraries
    must be loaded first: onnxruntime.preload_dlls()).
    """
    path = library_path(cuda)
    if path is None:
        raise KernelLibraryError(
            "this model uses edge's custom kernels (edge.QMatMul, edge.Attention) but the kernel library is not "
            "built. Install a C++ compiler (Debian/Ubuntu: `apt-get install g++`) and reinstall edge (`pip install "
            "-e .`), or build it in place with `python -m edge.kernels.build`; alternatively export the model with "
            "stock ops (--kernels stock).")
    try:
        session_options.register_custom_ops_library(str(path))
    except Exception as exc:  # onnxruntime raises its own Fail/RuntimeException types
        raise KernelLibraryError(
            f"onnxruntime could not register edge's kernel library {path}: {exc}. Rebuild it against the installed "
            "onnxruntime (`python -m edge.kernels.build`; onnxruntime>=1.28 is required), or export with "
            "--kernels stock.") from exc
    return path


def start_team(path: Path, threads: int, spin_us: int) -> int | None:
    """Start the library's own threads (kernels/cpu/team.h) for `threads` in all, the caller included: its ops then
    split their work over them instead of onnxruntime's. Returns the threads in use, or None for a library built
    before the team (its ops use onnxruntime's threads)."""
    try:
        fn = ctypes.CDLL(str(path)).EdgeTeamStart
    except AttributeError:
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_int]
    return fn(threads, spin_us)


def team_stats(path: Path | None = None) -> dict[str, int] | None:
    """This process's team (kernels/cpu/team.h) in the library at `path` (default: library_path()): threads in use
    (1: off) and jobs it has run; None without a library, or with one built before the team."""
    path = path or library_path()
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(str(path)).EdgeTeamStats
    except AttributeError:
        return None
    out = (ctypes.c_int64 * 2)()
    fn.restype, fn.argtypes = None, [ctypes.POINTER(ctypes.c_int64)]
    fn(out)
    return {"threads": out[0], "jobs": out[1]}


def kernel_isa(bits: int = 4, accuracy_level: int = 0) -> str | None:
    """The CPU kernel edge.QMatMul uses in this process for `bits` and accuracy_level ("avx512vnni", "avx512",
    "avxvnni", "avx2-int8", "avx2", "portable"), or None without a library. Honours EDGE_KERNELS_ISA like the op."""
    path = library_path()
    if path is None:
        return None
    fn = ctypes.CDLL(str(path)).EdgeKernelsIsa
    fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_int, ctypes.c_int]
    return fn(bits, accuracy_level).decode()


def huge_pages_enabled() -> bool:
    """Whether edge.QMatMul's CPU kernels copy their constant weights into 2 MB pages when a session is created
    (kernels/cpu/huge_pages.h): on Linux with transparent huge pages not "never", unless EDGE_HUGE_PAGES=0. The
    weights are then resident from the session's creation rather than from the first step (memory.budget)."""
    if not sys.platform.startswith("linux") or os.environ.get("EDGE_HUGE_PAGES") == "0":
        return False
    try:
        return "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


def huge_copy_stats() -> dict[str, int] | None:
    """What this process's edge.QMatMul kernels read from weight copies in 2 MB pages (kernels/cpu/huge_pages.h):
    distinct copies, their bytes, the kernels' references to them, and blocks; None without a library."""
    path = library_path()
    if path is None:
        return None
    fn = ctypes.CDLL(str(path)).EdgeHugeCopyStats
    out = (ctypes.c_int64 * 4)()
    fn.restype, fn.argtypes = None, [ctypes.POINTER(ctypes.c_int64)]
    fn(out)
    return dict(zip(("copies", "bytes", "references", "blocks"), out))


@functools.cache
def _cache_keep_fn() -> Any:
    path = library_path(cuda=True)
    if path is None or path.name != CUDA_LIBRARY:
        raise KernelLibraryError("compacting a KV cache in GPU memory needs the CUDA build of edge's kernels "
                                 "(nvcc at install time), or a chain drafter such as prompt-lookup")
    fn = ctypes.CDLL(str(path)).edge_cache_keep
    fn.restype = ctypes.c_char_p
    i64 = ctypes.c_int64
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), i64, i64, i64, i64, i64, ctypes.POINTER(i64), i64]
    return fn


def cuda_cache_keep(pointers: list[int], kv_heads: int, capacity: int, head_dim: int, start: int,
                    src: list[int]) -> None:
    """Move rows src (increasing, each at or after its destination) of every device cache buffer (float32, (1,
    kv_heads, capacity, head_dim)) to rows start, start+1, ...: a draft tree's accepted path, compacted on the GPU."""
    buffers = (ctypes.c_void_p * len(pointers))(*pointers)
    rows = (ctypes.c_int64 * len(src))(*src)
    err = _cache_keep_fn()(buffers, len(pointers), kv_heads, capacity, head_dim, start, rows, len(src))
    if err:
        raise KernelLibraryError(err.decode())
