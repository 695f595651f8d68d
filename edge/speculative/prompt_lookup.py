"""Prompt lookup: the answer often copies the conversation (rewrites, summaries, code edits, repeated answers).

Match the last n tokens (n from `max_ngram` down to 1) at their most recent earlier occurrence anywhere in the
context, and propose what followed it there. Costs microseconds and no model.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from edge.speculative.drafter import Draft, Drafter


class PromptLookup(Drafter):
    name = "prompt-lookup"
    cheap = True

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, context: list[int], depth: int) -> Draft:
        if depth <= 0 or len(context) < 2:
            return Draft()
        ids = np.asarray(context, dtype=np.int64)
        for n in range(min(self.max_ngram, len(ids) - 1), self.min_ngram - 1, -1):
            # Windows start at 0..len-n-1: every occurrence except the suffix itself, each followed by >= 1 token.
            windows = sliding_window_view(ids[:-1], n)
            hits = np.flatnonzero((windows == ids[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                draft = Draft.chain(ids[start:start + depth].tolist())
                draft.kind = f"{n}-gram"
                return draft
        return Draft()
