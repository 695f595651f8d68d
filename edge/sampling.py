"""Turning logits into the next token.

`probabilities` returns the exact distribution a sampled token follows (temperature, then top-k, then top-p), so
speculative decoding's rejection step can compare target and draft distributions under the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k cut
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # written so that NaN fails too
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and self.seed < 0:  # numpy's generators take non-negative seeds only
            raise ValueError(f"seed must be a non-negative integer or None, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The sampling distribution over the vocabulary (float64, sums to 1). Greedy is a point mass on the argmax."""
    logits = np.asarray(logits, dtype=np.float64)
    probs = np.zeros_like(logits)
    if params.greedy:
        probs[int(np.argmax(logits))] = 1.0
        return probs
    candidates = np.arange(logits.size)
    if 0 < params.top_k < logits.size:
        candidates = np.argpartition(logits, -params.top_k)[-params.top_k:]
    scaled = logits[candidates] / params.temperature
    weights = np.exp(scaled - scaled.max())
    weights /= weights.sum()
    if params.top_p < 1.0:
        order = np.argsort(-weights, kind="stable")
        cumulative = np.cumsum(weights[order])
        keep = order[: int(np.searchsorted(cumulative, params.top_p)) + 1]  # smallest set reaching top_p
        candidates, weights = candidates[keep], weights[keep] / weights[keep].sum()
    probs[candidates] = weights
    return probs


class Sampler:
    """Draws tokens with its own seeded generator, so a seed reproduces a whole generation."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        if self.params.greedy:
            return int(np.argmax(logits))
        return self.draw(probabilities(logits, self.params))

    def draw(self, probs: np.ndarray) -> int:
        return int(self.rng.choice(probs.size, p=probs))
