"""A smaller (or lower-bit) model with the same tokenizer drafts a chain, token by token, in its own KV cache.

The draft cache follows the target's context lazily: each proposal first trims it to the longest prefix it shares
with the context (dropping whatever was rejected last time) and feeds the rest, then drafts. Drafting stops early
when the draft model itself is unsure (its top probability under `min_confidence`, SpecDec++'s observation that a
low-confidence token is likely rejected).
"""

from __future__ import annotations

import time

import numpy as np

from edge.errors import EdgeError
from edge.model import Decoder
from edge.package import Package
from edge.prefix_store import common_prefix
from edge.sampling import SamplingParams, draw, probabilities
from edge.speculative.drafter import Draft, Drafter


FOLLOW = 2  # tokens a draft model reads after a step it drafted: its last draft token and the target's next


def check_compatible(target: Package, draft: Package) -> None:
    """Refuse a draft model whose token ids mean something else: its drafts would be rejected or, worse, garbage."""
    problems = []
    if target.config.vocab_size != draft.config.vocab_size:
        problems.append(f"vocabulary size {draft.config.vocab_size} != target's {target.config.vocab_size}")
    for key in ("bos_token_id", "eos_token_ids", "pad_token_id"):
        if target.special_tokens.get(key) != draft.special_tokens.get(key):
            problems.append(f"{key} {draft.special_tokens.get(key)!r} != target's {target.special_tokens.get(key)!r}")
    if target.tokenizer_path.read_bytes() != draft.tokenizer_path.read_bytes():
        problems.append("tokenizer.json differs")
    if problems:
        raise EdgeError(f"draft model {draft.root} does not share the target's tokenizer ({'; '.join(problems)}); "
                        f"use a draft exported from the same model family, or a model-free drafter "
                        f"(--draft prompt-lookup)")


def confidence(logits: np.ndarray) -> float:
    """The draft's top softmax probability (temperature 1)."""
    return float(1.0 / np.exp(logits - logits.max()).sum())


class DraftModel(Drafter):
    name = "draft-model"

    def __init__(self, package: Package, context_length: int, threads: int | None = None,
                 params: SamplingParams | None = None, min_confidence: float = 0.0, seed: int | None = None):
        """The draft session never spins: after each draft its idle workers would spin on the cores the target's
        verify call needs. Measured (fp32 target, int4 draft, 2 threads, 2 cores): a 1-token target step right
        after 3 draft steps took 48 ms with a spinning draft session, 23 ms without (23 ms with no draft at all),
        and the draft steps themselves were no slower. A draft on edge's kernels shares the target's team of
        threads instead (kernels/README.md, Threads)."""
        self.decoder = Decoder(package, context_length=context_length, threads=threads, spin=False)
        self.package = package
        self.params = params or SamplingParams()
        self.min_confidence = min_confidence
        self.rng = np.random.default_rng(seed)
        self.tokens: list[int] = []  # exactly what the draft cache holds

    def _sync(self, context: list[int]) -> np.ndarray:
        """Make the cache hold context[:-1] plus the last token, returning the logits after the last token.

        After a step it drafted, at most FOLLOW tokens are new (its last draft token and the target's next one);
        anything before those is catch-up, fed and timed separately (catch_up_seconds).
        """
        common = min(common_prefix(self.tokens, context), len(context) - 1)  # the last token is always fed
        self.decoder.cache.trim(common)
        start, follow = time.perf_counter(), max(common, len(context) - FOLLOW)
        if follow > common:
            self.decoder.prefill(context[common:follow])
        self.catch_up_seconds = time.perf_counter() - start if follow > common else 0.0
        logits = self.decoder.prefill(context[follow:])
        self.tokens = list(context)
        return logits

    def propose(self, context: list[int], depth: int) -> Draft:
        depth = min(depth, self.decoder.cache.capacity - len(context))
        if depth <= 0:
            return Draft()
        logits = self._sync(context)
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        for i in range(depth):
            if i > 0 and self.min_confidence and confidence(logits) < self.min_confidence:
                break
            if self.params.greedy:
                token = int(np.argmax(logits))
            else:
                rows.append(probabilities(logits, self.params))
                token = draw(rows[-1], self.rng)
            tokens.append(token)
            if i + 1 < depth:
                logits = self.decoder.step([token])[0]
                self.tokens.append(token)
        return Draft.chain(tokens, None if self.params.greedy else rows)

    def begin(self, context: list[int]) -> None:
        if context:
            self._sync(context)

    def prepare(self, params: SamplingParams) -> None:
        self.params = params
        if params.seed is not None:
            self.rng = np.random.default_rng(params.seed + 1)

    def reset(self) -> None:
        self.decoder.reset()
        self.tokens = []
