"""What an importer hands to the builder: one in-memory view of a model, whatever file it came from.

Tensor names follow Hugging Face's Llama/Gemma naming (`model.layers.{i}.self_attn.q_proj.weight`, ...), weights are
float32 numpy arrays shaped like torch Linear weights (out_features, in_features), and they are already in the
convention the builder expects: rotary in the half-split (HF) layout, and norm weights as the effective multiplier
(Gemma's `1 + w` already added). That way the builder has no per-format special cases.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge.config import ModelConfig


class LazyTensors(Mapping[str, np.ndarray]):
    """Tensors produced on first access, so a multi-GB model is never held twice in memory."""

    def __init__(self, loaders: dict[str, Callable[[], np.ndarray]]):
        self._loaders = loaders

    def __getitem__(self, name: str) -> np.ndarray:
        return self._loaders[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)


@dataclass
class SpecialTokens:
    bos_token_id: int | None
    eos_token_ids: list[int]
    pad_token_id: int | None = None
    add_bos: bool = False  # prepend BOS when encoding a prompt


@dataclass
class ImportedModel:
    config: ModelConfig
    tensors: Mapping[str, np.ndarray]
    tokenizer_json: str  # a `tokenizers` JSON document
    special_tokens: SpecialTokens
    chat_template: str | None
    source: dict[str, Any] = field(default_factory=dict)  # {"format": "gguf", "path": ..., "sha256": ..., ...}
