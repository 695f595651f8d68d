"""The architecture-neutral description of a decoder-only transformer.

One dataclass serves the importers (which fill it from GGUF metadata or config.json), the graph builder (which reads
the shapes), the manifest (which stores it) and the memory planner (which sizes weights and caches from it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "gemma3")


@dataclass
class ModelConfig:
    architecture: str  # "llama" (Llama 2/3, Mistral, SmolLM2, Qwen2) or "gemma3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # HF-style, e.g. {"rope_type": "llama3", "factor": 8.0, ...}
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2
    hidden_act: str = "silu"  # "silu" or "gelu_tanh"
    # Gemma 3 specifics (ignored by llama):
    embedding_scale: float = 1.0  # Gemma multiplies embeddings by sqrt(hidden_size)
    query_scale: float | None = None  # attention scale; None means 1/sqrt(head_dim)
    sliding_window: int | None = None  # local attention window of the sliding layers
    sliding_window_pattern: int = 0  # every n-th layer is global (Gemma 3: 6); 0 means all layers global
    rope_local_theta: float | None = None  # rope base of the sliding layers
    qk_norm: bool = False  # per-head RMSNorm of q and k (Gemma 3)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    def is_sliding_layer(self, layer: int) -> bool:
        """Gemma 3 alternates five local (sliding-window) layers with one global layer."""
        if not self.sliding_window or not self.sliding_window_pattern:
            return False
        return (layer + 1) % self.sliding_window_pattern != 0

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Bytes of K and V, all layers, for one token: the unit the KV cache and the memory planner count in."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}")
        return cls(**data)
