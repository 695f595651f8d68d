"""A GGUF file or a Hugging Face folder given where a package is expected: exported once into the cache."""

from __future__ import annotations

import os

import pytest

from edge.cached_export import cached_dir, is_source
from edge.default_model import default_quant
from edge.engine import Engine
from edge.export.pipeline import export_model
from tiny_models import tiny_gguf, tiny_llama


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def gguf(tmp_path):
    path = tmp_path / "Tiny Model.gguf"
    tiny_gguf(path, "llama", bias=False, tied=True)
    return path


def test_what_counts_as_a_source(tmp_path, gguf):
    assert is_source(gguf)
    renamed = tmp_path / "weights.bin"
    renamed.write_bytes(gguf.read_bytes())
    assert is_source(renamed)  # by its magic, whatever its name
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert is_source(hf)
    _, imported = tiny_llama()
    package = export_model("tiny", tmp_path / "pkg", quant="fp32", model=imported)
    assert not is_source(package) and not is_source(package / "model.onnx")
    (tmp_path / "notes.txt").write_text("GGUX")
    assert not is_source(tmp_path / "notes.txt") and not is_source(tmp_path / "missing.gguf")


def test_a_gguf_is_exported_once_and_reused(cache, gguf):
    first = Engine(gguf, context_length=32, threads=1)
    target = cached_dir(gguf, default_quant())
    assert first.package.root == target and target.is_relative_to(cache)
    assert target.name.startswith("tiny-model-")
    stamp = (target / "manifest.json").stat().st_mtime_ns
    text = first.generate(" t th", max_tokens=6, temperature=0)
    second = Engine(gguf, context_length=32, threads=1)
    assert (target / "manifest.json").stat().st_mtime_ns == stamp  # not exported again
    assert second.generate(" t th", max_tokens=6, temperature=0) == text
    assert second.package.draft_head is None  # the default model's trained head is SmolLM2's alone


def test_a_changed_file_gets_a_new_export(cache, gguf):
    before = cached_dir(gguf, default_quant())
    os.utime(gguf, ns=(0, gguf.stat().st_mtime_ns + 10**9))
    assert cached_dir(gguf, default_quant()) != before


def test_a_gguf_draft_model_is_exported_too(cache, gguf):
    """`--draft model.gguf`: the draft package comes from the same cache (here the target drafts for itself)."""
    engine = Engine(gguf, context_length=32, threads=1, speculator=str(gguf))
    assert engine.speculator.drafters[-1].package.root == engine.package.root
    plain = Engine(gguf, context_length=32, threads=1)
    assert engine.generate(" t th", max_tokens=6, temperature=0) == plain.generate(" t th", max_tokens=6,
                                                                                   temperature=0)
