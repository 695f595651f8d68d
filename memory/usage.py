"""Measured memory of this process.

Peak RSS comes from the kernel's high-water mark (VmHWM), which starts fresh when a process execs. getrusage's
ru_maxrss does not: a child forked from a large parent (a benchmark driver that just exported a model) would report
the parent's peak.

Measured term by term in fresh processes (`measure_resident`, `measure_paged`; `python -m edge.memory.usage`), for
the checks of the memory model in tests/test_budget.py and tests/test_paging.py and `benchmarks/memory.py --terms`:

- resident package (edge.model.Decoder, IOBinding, KV in place): RSS after the session is created (weights, prepack
  and runtime), after every page of the KV cache and one logits row is written (session and buffers together: the
  caches may reuse heap pages that session creation freed), and what each of a series of growing steps of S tokens
  at a full context (P = L - S) adds over the buffers (the activation term);
- paged package (edge.paging.PagedDecoder): the high-water mark (VmHWM) of a 16-token prefill and 4 decode steps,
  which includes the sessions' creation.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import psutil


def rss_bytes() -> int:
    return psutil.Process().memory_info().rss


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def anon_bytes() -> int:
    """Anonymous resident memory (heap, arenas, buffers): RSS without the mapped files (code, memory-mapped
    weights), whose share depends on the page cache's state (see budget.FRESH_INSTALL_FILE_BYTES)."""
    anon = _status_bytes("RssAnon")
    return rss_bytes() if anon is None else anon


def release_free_heap() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing).

    Loading a tokenizer parses its JSON into a tree of small allocations that are freed as soon as the tokenizer is
    built, but glibc keeps the pages: Gemma 3's tokenizer.json (262,144 entries, 514,906 merges) left RSS 290 MB
    higher, of which 95 MB is the tokenizer itself; SmolLM2's 38 MB for 14 MB."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        pass


def peak_rss_bytes() -> int:
    peak = _status_bytes("VmHWM")
    if peak is not None:
        return peak
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


THREADS = 2
TIMEOUT_S = 300


def _run(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "edge.memory.usage", *args], capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    if out.returncode:
        raise RuntimeError(f"measuring {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_resident(package: str | Path, context: int, steps: list[int]) -> dict:
    """{'session': RSS after the session, 'buffers': after the caches and a logits row are written, 'steps': RSS
    each step of `steps` tokens added over 'buffers', in order, 'steps_anon': the anonymous part of that (the
    arena's activations, without the kernels' code pages the first step touches)}, all in bytes."""
    return _run("resident", str(package), str(context), ",".join(map(str, steps)))


def measure_paged(package: str | Path, pinned: int, window: int) -> int:
    """Peak RSS (VmHWM) in bytes of streaming a paged package with `pinned` layers and `window` slots: a 16-token
    prefill and 4 decode steps at a 256-token context."""
    return _run("paged", str(package), str(pinned), str(window))["peak"]


def _resident(package: str, context: int, steps: list[int]) -> dict:
    import numpy as np

    from edge.model import Decoder
    from edge.package import load_package

    decoder = Decoder(load_package(package, verify=False), context_length=context, threads=THREADS)
    session = rss_bytes()
    for array in decoder.cache.arrays:
        array.fill(1.0)  # every page written, as at a full context
    decoder._logits[:1].fill(0.0)
    buffers, anon, added, added_anon = rss_bytes(), anon_bytes(), [], []
    for tokens in steps:
        decoder.cache.length = context - tokens
        decoder.step((np.arange(tokens) + 100) % decoder.config.vocab_size)
        added.append(rss_bytes() - buffers)
        added_anon.append(anon_bytes() - anon)
    return {"session": session, "buffers": buffers, "steps": added, "steps_anon": added_anon}


def _paged(package: str, pinned: int, window: int) -> dict:
    import numpy as np

    from edge.package import load_package
    from edge.paging import PagedDecoder

    decoder = PagedDecoder(load_package(package, verify=False), context_length=256, threads=THREADS, window=window,
                           pinned=pinned, max_tokens=16)
    logits = decoder.prefill([t % decoder.config.vocab_size for t in range(100, 116)], chunk=16)
    for _ in range(4):
        logits = decoder.step([int(np.argmax(logits))])[0]
    decoder.close()
    return {"peak": peak_rss_bytes()}


def main(argv: list[str]) -> None:
    kind, package, *rest = argv
    if kind == "resident":
        result = _resident(package, int(rest[0]), [int(s) for s in rest[1].split(",")])
    elif kind == "paged":
        result = _paged(package, int(rest[0]), int(rest[1]))
    else:
        raise SystemExit(f"unknown measurement {kind!r}: resident or paged")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
