"""Quality of an exported package: perplexity on a token sequence, run through edge's own runtime.

Windows do not overlap and each starts from an empty cache (the convention of the peers' numbers in
shared/notes/peers.md: windows of 1,024 tokens), so a package's perplexity depends only on its weights and graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edge.model import Decoder
from edge.package import Package


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log p(target) for each row, with a numerically stable log-softmax in float64."""
    logits = logits.astype(np.float64)
    top = logits.max(axis=-1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=-1))
    return log_z - logits[np.arange(len(targets)), targets]


def perplexity(package: Package, ids: Sequence[int], window: int = 1024, rows_per_step: int = 64,
               threads: int | None = None) -> float:
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) < 2:
        raise ValueError("perplexity needs at least two tokens")
    decoder = Decoder(package, context_length=window, threads=threads, max_rows=rows_per_step)
    nll: list[np.ndarray] = []
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window]
        decoder.reset()
        for s in range(0, len(chunk) - 1, rows_per_step):
            step = chunk[s:s + rows_per_step]
            logits = decoder.step(step, logits_rows=list(range(len(step))))
            targets = chunk[s + 1:s + 1 + len(step)]
            nll.append(token_nll(logits[: len(targets)], targets))
    return float(np.exp(np.concatenate(nll).mean()))
