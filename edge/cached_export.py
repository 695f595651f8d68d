"""A model given as a GGUF file or a Hugging Face folder: exported once into the cache, then run from there.

`edge-run model.gguf`, `edge-serve model.gguf` and `Engine("model.gguf")` work as a llama.cpp user expects, rather
than asking for an `edge-export` first. The export is the default model's (int4 on edge's kernels where their
library is built, else int4 on onnxruntime's stock ops; see edge.default_model), without its draft head, which is
trained for SmolLM2 alone. SmolLM2-135M takes ~35 s on 2 cores, once. `edge-export` gives every other choice.

The cache entry is named by the source's path, size and modification time, so a changed file is exported again;
an entry is complete when its manifest exists (export_model writes the folder under a temporary name and renames
it at the end), so an interrupted export is redone, never half used.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

from edge.default_model import EXPORT_REVISIONS, EXPORTS, cache_dir, default_quant, remove_stale_exports
from edge.memory.usage import release_free_heap
from edge.package import MANIFEST

GGUF_MAGIC = b"GGUF"


def is_source(path: str | os.PathLike) -> bool:
    """A GGUF file (by its magic) or a Hugging Face folder (config.json, not an edge package)."""
    p = Path(path).expanduser()
    if p.is_dir():
        return (p / "config.json").is_file() and not (p / MANIFEST).exists()
    if p.is_file() and p.suffix != ".onnx":
        with open(p, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    return False


def _fingerprint(source: Path) -> str:
    """Path, size and modification time of the source's files: a new or edited model gets a new entry."""
    files = [source] if source.is_file() else sorted(f for f in source.iterdir() if f.is_file())
    digest = hashlib.sha256()
    for f in files:
        stat = f.stat()
        digest.update(f"{f.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:12]


def cached_dir(source: str | os.PathLike, quant: str) -> Path:
    source = Path(source).expanduser()
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", source.stem if source.is_file() else source.name).strip("-").lower()
    revision = EXPORT_REVISIONS.get(quant)
    suffix = f"{quant}-r{revision}" if revision else quant
    return cache_dir() / "models" / "exports" / f"{stem or 'model'}-{_fingerprint(source)}-{suffix}"


def cached_export(source: str | os.PathLike, device: str = "cpu") -> Path:
    """The package of `source` for `device`, exported into the cache the first time."""
    quant = default_quant(device)
    target = cached_dir(source, quant)
    if (target / MANIFEST).exists():
        return target
    from edge.export.pipeline import export_model

    options = {k: v for k, v in EXPORTS.get(quant, {"quant": quant}).items() if k != "draft_head"}
    print(f"edge: exporting {source} once ({quant}) into {target}", file=sys.stderr, flush=True)
    export_model(source, target, overwrite=True, progress=True, **options)
    remove_stale_exports(quant)
    release_free_heap()  # the export's freed temporaries (Gemma 3 270M: 383 -> 70 MiB anonymous) before the model runs
    return target


def resolve(path: str | os.PathLike, device: str = "cpu") -> str | os.PathLike:
    """`path` itself, unless it is a source: then its cached export (made now if need be)."""
    return cached_export(path, device) if is_source(path) else path
