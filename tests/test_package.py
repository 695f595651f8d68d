"""Package writing is atomic and loading refuses every kind of damaged or foreign folder with a clear message."""

from __future__ import annotations

import json
import sys

import onnx
import pytest

from edge.errors import PackageError
from edge.export.pipeline import export_model
from edge.package import MANIFEST, atomic_package_dir, load_package, resolve_package_dir
from tiny_models import tiny_llama


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory):
    _, imported = tiny_llama()
    return export_model("tiny", tmp_path_factory.mktemp("p") / "pkg", quant="fp32", model=imported)


@pytest.fixture
def copy(package_dir, tmp_path):
    import shutil

    return shutil.copytree(package_dir, tmp_path / "copy")


def test_manifest_describes_the_package(package_dir):
    package = load_package(package_dir)
    m = package.manifest
    assert set(m["files"]) == {"model.onnx", "model.onnx.data", "tokenizer.json"}
    assert package.config.num_layers == 3 and package.config.num_kv_heads == 2
    assert m["quantization"]["method"] == "fp32" and m["source"]["exported_by"].startswith("edge ")
    assert package.tree_attention


def test_graph_path_and_manifest_path_resolve_to_the_folder(package_dir):
    assert resolve_package_dir(package_dir / "model.onnx") == package_dir
    assert resolve_package_dir(package_dir / MANIFEST) == package_dir


def test_corrupt_weights_fail_the_checksum(copy):
    data = copy / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(PackageError, match="sha256"):
        load_package(copy)


def test_truncated_weights_are_named(copy):
    data = copy / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(PackageError, match="truncated"):
        load_package(copy)


def test_missing_file_and_missing_manifest(copy):
    (copy / "tokenizer.json").unlink()
    with pytest.raises(PackageError, match="missing tokenizer.json"):
        load_package(copy)
    (copy / MANIFEST).unlink()
    with pytest.raises(PackageError, match="not an edge package"):
        load_package(copy)


def test_foreign_file_is_not_a_package(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF....")
    with pytest.raises(PackageError, match="edge-export"):
        load_package(f)


def test_a_gguf_name_on_another_format_says_so(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"\x00\x01junk")
    with pytest.raises(PackageError, match="not a GGUF file .*download it again"):
        load_package(f)


def test_external_data_outside_the_folder_is_refused(copy):
    graph = onnx.load(str(copy / "model.onnx"), load_external_data=False)
    tensor = next(t for t in graph.graph.initializer if t.external_data)
    next(e for e in tensor.external_data if e.key == "location").value = "../../etc/passwd"
    onnx.save(graph, str(copy / "model.onnx"))
    manifest = json.loads((copy / MANIFEST).read_text())
    from edge.package import file_entry

    manifest["files"]["model.onnx"] = file_entry(copy / "model.onnx")
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match="outside the model folder"):
        load_package(copy)


def test_failed_export_leaves_nothing_behind(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_package_dir(target) as tmp:
            (tmp / "model.onnx").write_bytes(b"partial")
            raise RuntimeError("crash mid-export")
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_overwrite(package_dir):
    with pytest.raises(PackageError, match="--force"):
        with atomic_package_dir(package_dir):
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names an fd through /proc")
def test_manifest_is_written_after_every_file_is_on_disk(tmp_path, monkeypatch):
    """write_manifest flushes each file (fsync) before the manifest names it: a crash cannot leave a manifest over
    bytes still in the page cache, and a fresh export's pages are clean, so the kernels' copy of the weights can hand
    onnxruntime's map back (benchmarks/RESULTS.md, memory, session 45)."""
    import os

    from edge.package import write_manifest

    (tmp_path / "model.onnx").write_bytes(b"graph")
    (tmp_path / "model.onnx.data").write_bytes(b"weights")
    synced, order = set(), []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.add(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        order.append((os.path.basename(dst), set(synced)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_manifest(tmp_path, {"name": "t"})
    assert order == [(MANIFEST, {"model.onnx", "model.onnx.data", f".{MANIFEST}.tmp"})]
    assert set(json.loads((tmp_path / MANIFEST).read_text())["files"]) == {"model.onnx", "model.onnx.data"}
