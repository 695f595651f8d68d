"""The edge model package: a folder with the graph, its weights, the tokenizer and a manifest.

    model.onnx           the decoder graph (export/builder.py documents its inputs and outputs)
    model.onnx.data      its weights (external data; the only location the graph may reference)
    tokenizer.json       a `tokenizers` document
    draft_skip.onnx      optional: the skip-layer self-draft, a graph over some of the layers that reads the same
                         model.onnx.data (no second copy of the weights; export/self_draft.py writes it)
    manifest.json        what the runtime needs to know without parsing the graph, and sha256 of every file

The manifest is the contract between the exporter, the runtime and the memory planner. Loading checks it strictly
and says which file is wrong, because a package is often copied between machines by hand.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.config import ModelConfig
from edge.default_model import sha256_file
from edge.errors import PackageError

FORMAT = "edge-package"
FORMAT_VERSION = 1
KV_DTYPES = ("float32", "float16")  # the manifest's graph.kv_dtype
MANIFEST = "manifest.json"


@dataclass
class Package:
    root: Path
    manifest: dict[str, Any]

    @property
    def config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.manifest["config"])

    @property
    def graph_path(self) -> Path:
        return self.root / self.manifest["graph"]["file"]

    @property
    def tokenizer_path(self) -> Path:
        return self.root / self.manifest["tokenizer"]["file"]

    @property
    def chat_template(self) -> str | None:
        return self.manifest.get("chat_template")

    @property
    def special_tokens(self) -> dict[str, Any]:
        return self.manifest["tokenizer"]

    @property
    def weight_bytes(self) -> int:
        return sum(f["bytes"] for f in self.manifest["files"].values())

    @property
    def tree_attention(self) -> bool:
        return bool(self.manifest["graph"].get("tree_attention", False))

    @property
    def kv_dtype(self) -> str:
        """The KV cache's element type, "float32" or "float16" (the graph's past/present inputs)."""
        return str(self.manifest["graph"].get("kv_dtype", "float32"))

    @property
    def graph_kv_dtype(self) -> str:
        """The cache type the graph file declares: kv_dtype, unless with_kv_dtype chose another to run with."""
        return str(self.manifest["graph"].get("file_kv_dtype", self.kv_dtype))

    @property
    def custom_ops(self) -> list[str]:
        return list(self.manifest["graph"].get("custom_ops", []))

    @property
    def self_draft(self) -> dict[str, Any] | None:
        """The skip-layer self-draft's record (file, kept layers, how they were chosen), if the package has one."""
        return self.manifest["graph"].get("self_draft")

    @property
    def draft_head(self) -> dict[str, Any] | None:
        """The trained draft head's record (file, depth, vocabulary size, training), if the package has one."""
        return self.manifest["graph"].get("draft_head")

    def graph_view(self, file: str, layers: int) -> Package:
        """Another graph of this folder, over the same weights and tokenizer, with `layers` cache layers: the
        runtime's Decoder runs it as a model of its own."""
        manifest = copy.deepcopy(self.manifest)
        manifest["graph"]["file"] = file
        manifest["config"]["num_layers"] = layers
        return Package(self.root, manifest)

    def with_kv_dtype(self, dtype: str) -> Package:
        """This package with its KV cache kept in `dtype` ("float32" or "float16"), whatever it was exported with.

        edge.Attention takes either cache type and registers both, so the graph's past and present are retyped as
        it is loaded (edge.session), over the same weights: a long chat on the CPU picks the half cache (1-token
        steps 25% faster at a 2,000-token past, half the KV memory, +0.35% perplexity: kernels/README.md) without
        a second export, and a package exported with a half cache can run float32 on a GPU (not yet run on one)."""
        if dtype not in KV_DTYPES:
            raise PackageError(f"unknown KV cache type {dtype!r}; choose one of {', '.join(KV_DTYPES)}")
        if dtype == self.kv_dtype:
            return self
        if "edge" not in self.custom_ops:
            raise PackageError(f"{self.root} runs on onnxruntime's stock ops, whose GroupQueryAttention keeps its "
                               f"cache in the query's type; a {dtype} KV cache needs a package exported with "
                               f"edge's kernels (edge-export ... --kernels edge)")
        if self.manifest.get("paging"):
            raise PackageError(f"{self.root} pages its layers from disk, whose graphs keep a float32 KV cache; "
                               f"run it without --kv-dtype")
        manifest = copy.deepcopy(self.manifest)
        manifest["graph"]["file_kv_dtype"] = self.graph_kv_dtype
        manifest["graph"]["kv_dtype"] = dtype
        return Package(self.root, manifest)

    def skip_draft(self) -> Package:
        """The self-draft as a package view, or a PackageError that says how to add one."""
        record = self.self_draft
        if record is None:
            raise PackageError(f"{self.root} has no skip-layer self-draft; add one with `edge-export SOURCE -o DIR "
                               f"--self-draft skip` (SOURCE: the GGUF or Hugging Face model it was exported from), "
                               f"or choose another drafter (--draft prompt-lookup)")
        return self.graph_view(record["file"], len(record["layers"]))


def resolve_package_dir(path: str | os.PathLike) -> Path:
    """Accept the folder, its manifest, or its .onnx graph (what `edge-run path/to/model.onnx` passes)."""
    p = Path(path).expanduser()
    if p.is_dir():
        return p
    if p.is_file() and (p.suffix == ".onnx" or p.name == MANIFEST):
        return p.parent
    if not p.exists():
        raise PackageError(f"{p}: no such file or folder")
    if p.suffix.lower() == ".gguf":  # a real GGUF would have been exported (edge.cached_export), not passed here
        with p.open("rb") as f:
            head = f.read(4)
        if head != b"GGUF":
            raise PackageError(f"{p} is not a GGUF file (starts with {head!r}, expected b'GGUF'): it is corrupt or "
                               f"another format; download it again")
    raise PackageError(f"{p} is not an edge package: pass the package folder or its model.onnx "
                       f"(a GGUF or Hugging Face model must be exported first with `edge-export`)")


def load_package(path: str | os.PathLike, verify: bool = True) -> Package:
    """Read and check a package. verify=False skips the sha256 of the weights (sizes are always checked)."""
    root = resolve_package_dir(path)
    manifest_path = root / MANIFEST
    if not manifest_path.exists():
        raise PackageError(f"{root} has no {MANIFEST}: it is not an edge package. Export a model with "
                           f"`edge-export SOURCE -o DIR`.")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PackageError(f"{manifest_path} is not valid JSON ({e}); re-export the package") from e
    if manifest.get("format") != FORMAT:
        raise PackageError(f"{manifest_path} is not an edge manifest (format={manifest.get('format')!r})")
    if manifest.get("format_version", 0) > FORMAT_VERSION:
        raise PackageError(f"{root} was written by a newer edge (format {manifest['format_version']}); upgrade edge")
    for name, info in manifest["files"].items():
        _check_file(root, name, info, verify)
    package = Package(root, manifest)
    if package.kv_dtype not in KV_DTYPES:
        raise PackageError(f"{manifest_path} asks for a {package.kv_dtype!r} KV cache, which this edge does not know "
                           f"(only {', '.join(KV_DTYPES)}); upgrade edge or re-export the package")
    _check_external_data(package)
    return package


def _check_file(root: Path, name: str, info: dict[str, Any], verify: bool) -> None:
    path = (root / name).resolve()
    if root.resolve() not in path.parents:
        raise PackageError(f"manifest of {root} names {name!r}, which is outside the package folder")
    if not path.exists():
        raise PackageError(f"{root} is missing {name}; copy the whole package folder or re-export it")
    size = path.stat().st_size
    if size != info["bytes"]:
        raise PackageError(f"{path} has {size} bytes, the manifest says {info['bytes']}: the file is truncated "
                           f"or was replaced; re-export the package")
    if (verify or size < (1 << 24)) and sha256_file(path) != info["sha256"]:
        raise PackageError(f"{path} does not match its sha256 in the manifest: the file is corrupt; re-export")


def _check_external_data(package: Package) -> None:
    """External-data paths are file names chosen by whoever wrote the graph: they must stay inside the folder.
    Every graph is checked: the model's and the self-draft's."""
    import onnx

    graphs = [package.graph_path]
    for what, record in (("self-draft", package.self_draft), ("draft head", package.draft_head)):
        if record is None:
            continue
        if record["file"] not in package.manifest["files"]:
            raise PackageError(f"the manifest of {package.root} names the {what} {record['file']!r} but has no "
                               f"size and sha256 for it; re-export the package")
        graphs.append(package.root / record["file"])
    root = package.root.resolve()
    for graph in graphs:
        try:
            model = onnx.load(str(graph), load_external_data=False)
        except Exception as e:  # onnx raises DecodeError and others for a corrupt protobuf
            raise PackageError(f"{graph} is not a readable ONNX graph ({e}); re-export the package") from e
        for t in model.graph.initializer:
            for entry in t.external_data:
                if entry.key == "location" and root not in (root / entry.value).resolve().parents:
                    raise PackageError(f"{graph}: initializer {t.name} reads external data from "
                                       f"{entry.value!r}, outside the model folder; refusing to load it")


def file_entry(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


@contextmanager
def atomic_package_dir(target: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside `target`; on success it replaces `target` in one rename, on failure it is
    removed, so a crash or Ctrl-C never leaves a half-written package under the final name."""
    target = Path(target)
    if target.exists() and not overwrite:
        raise PackageError(f"{target} already exists; choose another output folder or pass --force")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Add the files table (sizes and sha256 of every visible file in the folder) and write manifest.json under a
    temporary name, renamed into place: a package that gains a file later is never left with half a manifest.

    Every file is flushed to disk first (`sync_files`), the manifest last, so a manifest never names bytes that a
    crash could still lose."""
    manifest = dict(manifest, format=FORMAT, format_version=FORMAT_VERSION)
    files = [p for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")]
    sync_files(files)
    manifest["files"] = {p.name: file_entry(p) for p in files}
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False))
    sync_files([tmp])
    os.replace(tmp, folder / MANIFEST)


def sync_files(files: list[Path]) -> None:
    """Write the files' pages to disk now. Besides durability this matters for memory: until the kernel writes a
    fresh file back, its page-cache pages are dirty, and the pages of onnxruntime's memory map that edge's kernels
    copy into 2 MB pages and hand back (kernels/cpu/huge_pages.cc) stay resident while dirty: the first run after
    an export held ~18-25 MiB more than the memory model predicts (tests/test_budget.py, session 45)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
