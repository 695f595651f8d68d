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


def probabilities(logits: np.ndarray, params: SamplingParams, out: np.ndarray | None = None) -> np.ndarray:
    """The sampling distribution over the vocabulary (float64, sums to 1). Greedy is a point mass on the argmax.

    out: a float64 array of the vocabulary's size to write into (a Sampler's workspace); None: a new one. Each call
    used to allocate half a dozen vocabulary-sized arrays, gather and scatter the whole vocabulary and argsort it for
    top-p: 1.3-1.6 ms a token for SmolLM2's 49,152 logits without top-p and 6.9 ms with top_p 0.9, against a ~4.5 ms
    decode step on 2 cores (session 43). Without top-k the values are bit for bit those of that version (the same
    operations on the same float64 numbers, in place); with it, within rounding (the k kept are softmaxed in index
    order now).
    """
    logits = np.asarray(logits)
    probs = np.empty(logits.shape[-1], np.float64) if out is None else out
    if params.greedy:
        probs.fill(0.0)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    candidates = None  # None: the whole vocabulary, its weights in `probs`
    if 0 < params.top_k < probs.size:
        candidates = top_k(logits, params.top_k)
        weights = _softmax(logits[candidates], params.temperature)
    else:
        weights = _softmax(logits, params.temperature, probs)
    if params.top_p < 1.0:
        keep = nucleus(weights, params.top_p)
        candidates = keep if candidates is None else candidates[keep]
        weights = weights[keep] / weights[keep].sum()
    if candidates is not None:
        probs.fill(0.0)
        probs[candidates] = weights
    return probs


def top_k(logits: np.ndarray, k: int, spread: float = 8.0) -> np.ndarray:
    """Indices of the k largest logits, in index order; ties at the k-th value go to the lower indices.

    Runs once a sampled token (top-k sampling) and once a verify row (token recycling's successors), after a step has
    left the caches cold, so it reads the whole row once: the k largest are nearly always among the few within
    `spread` of the maximum (doubled while fewer than k are), and when at least k are there they are exactly
    the k largest. np.argpartition over all of SmolLM2's 49,152 logits took ~0.45 ms (session 43; ~0.2 ms in the
    loop, session 21) and left ties to its own order."""
    top = float(logits.max())
    for _ in range(16):
        head = np.flatnonzero(logits >= top - spread)
        if head.size >= k:
            break
        spread *= 2.0
    else:  # flat, or non-finite: the whole vocabulary
        head = np.arange(logits.size)
    if head.size > k:
        values = logits[head]
        kth = np.partition(values, head.size - k)[head.size - k]
        above = values > kth
        ties = np.flatnonzero(values == kth)[:k - int(above.sum())]
        head = np.sort(np.concatenate([head[above], head[ties]]))
    if head.size != k:  # NaN among them: compare nothing, so sort everything
        head = np.sort(np.argsort(-logits, kind="stable")[:k])
    return head


def _softmax(logits: np.ndarray, temperature: float, out: np.ndarray | None = None) -> np.ndarray:
    """exp(x / t - max) normalised, in float64 (into `out` where given): a pass fewer than copying first."""
    scaled = np.divide(logits, temperature, out=out, dtype=np.float64)
    np.subtract(scaled, scaled.max(), out=scaled)
    np.exp(scaled, out=scaled)
    scaled /= scaled.sum()
    return scaled


def nucleus(weights: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the smallest set of weights reaching top_p, largest first (ties: lower index first).

    What a stable argsort of the whole vocabulary gives, found among the largest weights only: those at or above
    a bound, sorted alone, come first in the full order and in the same order, and their running sums are the full
    order's first ones. The bound starts 2^10 below the largest weight (a real model's nucleus is a few hundred
    tokens) and falls 2^10-fold until the set reaches top_p; a flat distribution ends in the full sort."""
    bound = float(weights.max())
    for _ in range(3):
        bound *= 2.0 ** -10
        head = np.flatnonzero(weights >= bound)
        order = head[np.argsort(-weights[head], kind="stable")]
        needed = int(np.searchsorted(np.cumsum(weights[order]), top_p))
        if needed < order.size:
            return order[:needed + 1]
    order = np.argsort(-weights, kind="stable")
    return order[:int(np.searchsorted(np.cumsum(weights[order]), top_p)) + 1]


BLOCK = 1024  # probabilities summed per block by draw()


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One index drawn from `probs` by inverting their running sum at one uniform double: the draw rng.choice(
    probs.size, p=probs) makes from the same generator state, up to rounding where u falls within ~1e-16 of an
    interval's edge (never onto a zero probability).

    The running sum is found in two levels, blocks of BLOCK and then within the one block u falls in: rng.choice
    validates p and takes the whole sequential running sum, ~0.35 ms over SmolLM2's 49,152 probabilities, and a
    sequential np.cumsum alone ~0.2 ms (session 43)."""
    blocks = np.add.reduceat(probs, np.arange(0, probs.size, BLOCK))
    running = np.cumsum(blocks)
    total = running[-1]
    if not (np.isfinite(total) and total > 0):
        raise ValueError(f"cannot sample: the probabilities sum to {total} (non-finite logits from the model?)")
    target = rng.random() * total
    b = min(int(np.searchsorted(running, target, side="right")), blocks.size - 1)
    while blocks[b] <= 0:  # only past the end, by rounding: the last block with any mass
        b -= 1
    start = b * BLOCK
    block = probs[start:start + BLOCK]
    local = np.cumsum(block)
    local += running[b - 1] if b else 0.0
    i = int(np.searchsorted(local, target, side="right"))
    if i == block.size:  # rounding again: the block's last token with any mass
        i = int(np.flatnonzero(block)[-1])
    return start + i


class Sampler:
    """Draws tokens with its own seeded generator, so a seed reproduces a whole generation; its float64 workspace
    is allocated once, at the first sampled token."""

    def __init__(self, params: SamplingParams, rng: np.random.Generator | None = None):
        self.params = params
        self.rng = np.random.default_rng(params.seed) if rng is None else rng
        self._probs: np.ndarray | None = None

    def __call__(self, logits: np.ndarray) -> int:
        if self.params.greedy:
            return int(np.argmax(logits))
        return self.draw(self.probabilities(logits))

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """probabilities() in this sampler's workspace: valid until its next call."""
        size = np.shape(logits)[-1]
        if self._probs is None or self._probs.size != size:
            self._probs = np.empty(size, np.float64)
        return probabilities(logits, self.params, self._probs)

    def draw(self, probs: np.ndarray) -> int:
        return draw(probs, self.rng)
